"""Policy and judge models, chosen by prefix: ``openai:``, ``anthropic:``, ``vllm:``, ``hf:``, ``local``, ``replay:``.

Engines that run native code (``local``, ``hf``, ``vllm``) run in a child
process (:class:`ChildEngineModel`): a crash there (SIGILL from an
instruction the CPU refuses, SIGSEGV, the OOM killer) ends the run with one
line naming the signal, never the fork's own process.

Providers import their SDKs only when a model is created, and translate SDK
errors into the :class:`~factory.errors.ModelError` tree.
"""

from factory.models import _anthropic, _hf, _local, _openai, _replay, _vllm  # noqa: F401  (registration)
from factory.models._base import (
    CHILD_ENGINES,
    DEFAULT_REQUEST_TIMEOUT_S,
    MODELS,
    ChatModel,
    ChatResponse,
    Message,
    ModelOptions,
    ToolCall,
    ToolSpec,
    Usage,
    check_base_url,
    create_model,
    model_prefixes,
    register_model,
)
from factory.models._child import ChildEngineModel, crash_message
from factory.models._gguf import read_gguf_metadata
from factory.models._http_errors import error_for_status, retry_after_seconds, sdk_errors
from factory.models._pricing import cost_usd
from factory.models._replay import RecordingModel, ReplayModel, request_key
from factory.models._resilience import AdaptiveLimiter, CircuitBreaker, ResilientModel, RetryPolicy
from factory.models._text_tools import parse_text_tool_calls, render_chat_template
from factory.models._weights import DEFAULT_WEIGHTS, GGUFWeights, ensure_weights

__all__ = [
    "CHILD_ENGINES",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_WEIGHTS",
    "MODELS",
    "AdaptiveLimiter",
    "ChatModel",
    "ChatResponse",
    "ChildEngineModel",
    "CircuitBreaker",
    "GGUFWeights",
    "Message",
    "ModelOptions",
    "RecordingModel",
    "ReplayModel",
    "ResilientModel",
    "RetryPolicy",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "check_base_url",
    "cost_usd",
    "crash_message",
    "create_model",
    "ensure_weights",
    "error_for_status",
    "model_prefixes",
    "parse_text_tool_calls",
    "read_gguf_metadata",
    "register_model",
    "render_chat_template",
    "request_key",
    "retry_after_seconds",
    "sdk_errors",
]
