"""Policy and judge models, chosen by prefix: ``openai:``, ``anthropic:``, ``vllm:``, ``hf:``, ``local``, ``replay:``.

Providers import their SDKs only when a model is created, and translate SDK
errors into the :class:`~factory.errors.ModelError` tree.
"""

from factory.models import _anthropic, _hf, _local, _openai, _replay, _vllm  # noqa: F401  (registration)
from factory.models._anthropic import AnthropicChatModel, to_anthropic_messages
from factory.models._base import (
    MODELS,
    ChatModel,
    ChatResponse,
    Message,
    ModelOptions,
    ToolCall,
    ToolSpec,
    Usage,
    create_model,
    model_prefixes,
    register_model,
)
from factory.models._gguf import read_gguf_metadata
from factory.models._hf import HFChatModel
from factory.models._http_errors import error_for_status, retry_after_seconds, sdk_errors
from factory.models._local import LocalChatModel
from factory.models._openai import OpenAIChatModel, to_openai_messages
from factory.models._pricing import PRICES_PER_MTOK, cost_usd
from factory.models._replay import RecordingModel, ReplayModel, request_key
from factory.models._resilience import AdaptiveLimiter, ResilientModel, RetryPolicy
from factory.models._text_tools import parse_text_tool_calls, render_chat_template
from factory.models._vllm import BatchRequest, MicroBatcher, VLLMChatModel
from factory.models._weights import DEFAULT_WEIGHTS, QWEN_NOTICE, GGUFWeights, ensure_weights

__all__ = [
    "DEFAULT_WEIGHTS",
    "MODELS",
    "PRICES_PER_MTOK",
    "QWEN_NOTICE",
    "AdaptiveLimiter",
    "AnthropicChatModel",
    "BatchRequest",
    "ChatModel",
    "ChatResponse",
    "GGUFWeights",
    "HFChatModel",
    "LocalChatModel",
    "Message",
    "MicroBatcher",
    "ModelOptions",
    "OpenAIChatModel",
    "RecordingModel",
    "ReplayModel",
    "ResilientModel",
    "RetryPolicy",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "VLLMChatModel",
    "cost_usd",
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
    "to_anthropic_messages",
    "to_openai_messages",
]
