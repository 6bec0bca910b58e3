"""The chat-model extension point: a small protocol, providers registered by prefix.

Messages use the OpenAI chat shape, which is also what TRL's conversational
datasets hold: ``{"role": "system" | "user" | "assistant" | "tool",
"content": str}``; an assistant turn may carry ``tool_calls`` (``[{"id",
"type": "function", "function": {"name", "arguments": dict}}]``) and a tool
turn carries ``tool_call_id`` and ``name``. Providers translate to and from
their wire formats at the boundary.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from factory.errors import ModelConfigError
from factory.registry import Registry

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_S",
    "CHILD_ENGINES",
    "MODELS",
    "PLUGINS_ENV",
    "ChatModel",
    "ChatResponse",
    "Message",
    "ModelOptions",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "check_base_url",
    "create_model",
    "load_plugins",
    "model_prefixes",
    "register_model",
]

#: One chat turn in the OpenAI shape (see the module docstring): ``role``, ``content``, and tool fields.
Message = dict[str, Any]


@dataclass(frozen=True)
class ToolSpec:
    """A tool offered to the model.

    Attributes:
        name: The tool's name (a contract: clients call it by this name).
        description: What it does, for the model.
        parameters: JSON Schema of its arguments object.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]

    def openai_schema(self) -> dict[str, Any]:
        """The ``{"type": "function", "function": {...}}`` form."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": dict(self.parameters)}}


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model asked for.

    Attributes:
        id: Provider-assigned id (echoed back in the tool result).
        name: Tool name.
        arguments: Parsed arguments; empty when they did not parse.
        error: Why the arguments could not be parsed, if they could not.
        origin: How the call arrived: ``native`` (the server's structured tool
            calls) or ``text`` (written in the reply's text and read by
            :func:`~factory.models.parse_text_tool_calls`); bookkeeping, not part
            of the call, so it takes no part in comparisons.
    """

    id: str
    name: str
    arguments: dict[str, Any]
    error: str | None = None
    origin: str = field(default="native", compare=False)

    def as_message_part(self) -> dict[str, Any]:
        """The ``tool_calls`` entry of an assistant message."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Usage:
    """Tokens and cost of one call (cost is None where no price is known)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None

    def __add__(self, other: Usage) -> Usage:
        cost = None if self.cost_usd is None and other.cost_usd is None else \
            (self.cost_usd or 0.0) + (other.cost_usd or 0.0)
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens, cost)


@dataclass(frozen=True)
class ChatResponse:
    """One model reply.

    Attributes:
        text: The reply's text (may be empty when it only calls tools).
        tool_calls: Tool calls, in order.
        usage: Tokens and cost.
        finish_reason: Why generation stopped, as the provider said.
    """

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for replay files and events)."""
        return {
            "text": self.text,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments, "error": c.error,
                            "origin": c.origin} for c in self.tool_calls],
            "usage": {"input_tokens": self.usage.input_tokens, "output_tokens": self.usage.output_tokens,
                      "cost_usd": self.usage.cost_usd},
            "finish_reason": self.finish_reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChatResponse:
        """Inverse of :meth:`to_dict` (missing fields take defaults)."""
        calls = tuple(
            ToolCall(str(c.get("id") or f"call_{i}"), str(c["name"]), dict(c.get("arguments") or {}), c.get("error"),
                     "text" if c.get("origin") == "text" else "native")
            for i, c in enumerate(data.get("tool_calls") or ())
        )
        usage = data.get("usage") or {}
        return cls(
            text=str(data.get("text") or ""),
            tool_calls=calls,
            usage=Usage(int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0),
                        usage.get("cost_usd")),
            finish_reason=data.get("finish_reason"),
        )


@runtime_checkable
class ChatModel(Protocol):
    """A policy or judge model.

    Attributes:
        spec: The spec it was created from, e.g. ``openai:gpt-4o-mini``.
    """

    spec: str

    async def chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        *,
        temperature: float = 0.7,
        seed: int | None = None,
        max_tokens: int = 1024,
    ) -> ChatResponse:
        """Return the model's next turn.

        Raises:
            ModelError: A subclass that says whether a retry may help.
        """
        ...

    async def aclose(self) -> None:
        """Release clients, engines and threads."""
        ...


#: Seconds one call to a model server may take before it is abandoned (and retried): ``--request-timeout``.
DEFAULT_REQUEST_TIMEOUT_S = 60.0


def check_base_url(url: str) -> str:
    """``url`` if it is an ``http(s)://HOST[...]`` server URL.

    Without a scheme an SDK reads ``127.0.0.1:8000/v1`` as a relative path and
    every call fails as a connection error, retried for minutes; it is refused
    here instead.

    Raises:
        ModelConfigError: No ``http://`` or ``https://`` scheme, or no host.
    """
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ModelConfigError(f"base URL {url!r} is not an http(s) URL: write it with its scheme, "
                               "e.g. http://127.0.0.1:8000/v1")
    return url


@dataclass(frozen=True)
class ModelOptions:
    """Provider settings from the command line or config.

    Attributes:
        base_url: Server URL for OpenAI-compatible (or Anthropic) endpoints (``http(s)://...``).
        api_key: Key; default from the provider's usual environment variable.
        timeout_s: Seconds one call to a model server may take, whole; past it the
            call is abandoned as a retryable :class:`~factory.errors.ProviderTimeoutError`.
        threads: CPU threads for in-process engines.
        context: Context window for in-process engines.
        extra: Provider-specific settings.
        in_process: Run an engine that executes native code (``local``, ``hf``, ``vllm``) in this
            process instead of a child process: no crash isolation (for the engine's own child, and
            for tests that inspect the engine).

    Raises:
        ModelConfigError: A base URL without its scheme, or a timeout that is not a positive number.
    """

    base_url: str | None = None
    api_key: str | None = None
    timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    threads: int | None = None
    context: int = 4096
    extra: Mapping[str, Any] = field(default_factory=dict)
    in_process: bool = False

    def __post_init__(self) -> None:
        if self.base_url is not None:
            check_base_url(self.base_url)
        if not (isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ModelConfigError(f"request timeout must be a positive number of seconds, got {self.timeout_s!r}")


#: Model providers by prefix (``openai``, ``replay``, ...); :func:`register_model` adds one.
MODELS: Registry[Callable[[str, ModelOptions], ChatModel]] = Registry("model provider")
#: Prefixes whose engines run native code: :func:`create_model` runs them in a child process.
CHILD_ENGINES: set[str] = set()
#: Environment variable naming extra modules (comma-separated) that register providers; the
#: engine's child process imports them too.
PLUGINS_ENV = "FACTORY_PLUGINS"


def register_model(prefix: str, *, child_process: bool = False
                   ) -> Callable[[Callable[[str, ModelOptions], ChatModel]], Callable[..., ChatModel]]:
    """Register a provider factory ``(name, options) -> ChatModel`` under ``prefix``.

    Args:
        prefix: The spec prefix (``local``, ``openai``, ...).
        child_process: The engine runs native code in the process that loads it (llama.cpp,
            torch, vLLM): :func:`create_model` then starts it in a child process and talks to it
            over a pipe, so that a native crash is contained (``ModelOptions.in_process`` opts out).
    """
    if child_process:
        CHILD_ENGINES.add(prefix)
    return MODELS.register(prefix)


def load_plugins() -> list[str]:
    """Import the modules named in ``FACTORY_PLUGINS`` (providers registered outside the package).

    Raises:
        ModelConfigError: A named module cannot be imported.
    """
    names = [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ModelConfigError(f"{PLUGINS_ENV}: cannot import {name}: {exc}") from exc
    return names


def model_prefixes() -> list[str]:
    """Registered provider prefixes."""
    return MODELS.names()


def create_model(spec: str, options: ModelOptions | None = None) -> ChatModel:
    """Build a model from ``PREFIX:NAME`` (``local`` alone means the embedded default).

    Raises:
        ModelConfigError: Unknown prefix, or the provider cannot be set up.
    """
    prefix, _, name = spec.partition(":")
    if prefix not in MODELS:
        load_plugins()
    if prefix not in MODELS:  # a ModelConfigError naming the spec, not the registry's ConfigError
        raise ModelConfigError(
            f"unknown model provider '{prefix}' in '{spec}' "
            f"(use one of: {', '.join(p + ':' for p in model_prefixes())})"
        )
    options = options or ModelOptions()
    provider = MODELS.get(prefix)
    if prefix in CHILD_ENGINES and not options.in_process:
        from factory.models._child import ChildEngineModel

        precheck = getattr(provider, "precheck", None)  # what can be refused without starting the engine
        if precheck is not None:
            precheck(name)
        return ChildEngineModel(spec, options)
    return provider(name, options)

