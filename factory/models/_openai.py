"""``openai:MODEL``: the official ``openai`` SDK (async), for OpenAI or any compatible server.

``--base-url`` points it at vLLM's, llama.cpp's or Ollama's OpenAI-compatible
endpoint; without an API key there, a placeholder is sent. The SDK's own
retries are off: :class:`~factory.models.ResilientModel` retries.

Compatible servers differ from OpenAI's API in ways checked against
llama-cpp-python's server (``tests/models/test_openai_real_server.py``):

* ``tool_choice`` is sent as ``"auto"`` whenever tools are offered. OpenAI
  defaults to it, but llama-cpp-python's function-calling chat format reads a
  missing ``tool_choice`` as ``"none"`` and leaves the tools out of the prompt.
* Servers that do not parse tool calls for a model family return the call
  written in the reply's text (a ``<tool_call>`` block, or a JSON object naming
  an offered tool, fenced or bare). When a reply has no structured tool calls,
  its text is read as the in-process engines read theirs
  (:func:`~factory.models.parse_text_tool_calls`); each call records which way
  it arrived in :attr:`~factory.models.ToolCall.origin` (``native`` / ``text``).
* A single call may come as the legacy ``function_call`` instead of
  ``tool_calls``, a call may lack an id, and ``usage`` may be absent (counted 0).
* llama-cpp-python answers a request body it cannot validate with HTTP 500
  (``internal_server_error``, the message naming the body's field); that is a
  request error, never retried: every retry would fail the same way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from factory.errors import MalformedResponseError, ModelConfigError, ProviderRequestError, ProviderServerError
from factory.models._base import (
    ChatResponse,
    Message,
    ModelOptions,
    ToolCall,
    ToolSpec,
    Usage,
    register_model,
)
from factory.models._http_errors import sdk_errors, within_timeout
from factory.models._pricing import cost_usd
from factory.models._text_tools import parse_text_tool_calls

__all__ = ["OpenAIChatModel", "to_openai_messages"]


def to_openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Our messages on the OpenAI wire: tool-call arguments become JSON text."""
    wire = []
    for message in messages:
        item = {k: v for k, v in message.items() if k in ("role", "content", "tool_call_id", "name")}
        if message.get("tool_calls"):
            item["tool_calls"] = [
                {"id": call["id"], "type": "function", "function": {
                    "name": call["function"]["name"],
                    "arguments": json.dumps(call["function"]["arguments"]),
                }}
                for call in message["tool_calls"]
            ]
        if item.get("content") is None:
            item["content"] = ""
        wire.append(item)
    return wire


def _parse_arguments(raw: str | dict[str, Any] | None) -> tuple[dict[str, Any], str | None]:
    if isinstance(raw, dict):  # some compatible servers send an object instead of JSON text
        return raw, None
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        return {}, f"arguments are not valid JSON: {exc.msg}"
    if not isinstance(value, dict):
        return {}, "arguments must be a JSON object"
    return value, None


def _rejects_the_request_body(error: BaseException | None) -> bool:
    """Whether a 5xx is a server's way of saying the request body did not validate (llama-cpp-python's)."""
    body = getattr(error, "body", None)
    message = body.get("message") if isinstance(body, dict) else None
    return isinstance(message, str) and "validation error" in message and "'loc': ('body'" in message


class OpenAIChatModel:
    """Chat completions through ``openai.AsyncOpenAI``."""

    def __init__(self, model: str, options: ModelOptions):
        try:
            import openai
        except ImportError as exc:
            raise ModelConfigError("the openai SDK is not installed: pip install 'factory-rlaif[openai]'") from exc
        if not model:
            raise ModelConfigError("openai: needs a model name, e.g. openai:gpt-4o-mini")
        api_key = options.api_key or os.environ.get("OPENAI_API_KEY")
        if api_key is None and options.base_url is None:
            raise ModelConfigError("openai: set OPENAI_API_KEY, or pass --base-url for a local server")
        self._openai = openai
        self._client = openai.AsyncOpenAI(
            api_key=api_key or "not-needed", base_url=options.base_url, max_retries=0, timeout=options.timeout_s)
        self.model = model
        self.spec = f"openai:{model}"
        self.timeout_s = options.timeout_s

    async def chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        *,
        temperature: float = 0.7,
        seed: int | None = None,
        max_tokens: int = 1024,
    ) -> ChatResponse:
        request: dict[str, Any] = {
            "model": self.model, "messages": to_openai_messages(messages),
            "temperature": temperature, "max_tokens": max_tokens,
        }
        if seed is not None:
            request["seed"] = seed
        if tools:
            request["tools"] = [tool.openai_schema() for tool in tools]
            request["tool_choice"] = "auto"  # explicit: some servers read a missing one as "none" (see above)
        try:
            with sdk_errors(self._openai, "openai"):
                completion = await within_timeout(self._client.chat.completions.create(**request), self.timeout_s,
                                                  "openai")
        except ProviderServerError as exc:
            if _rejects_the_request_body(exc.__cause__):
                raise ProviderRequestError(str(exc)) from exc
            raise
        return self._parse(completion, frozenset(tool.name for tool in tools or ()))

    def _parse(self, completion: Any, offered: frozenset[str] = frozenset()) -> ChatResponse:
        try:
            choice = completion.choices[0]
            message = choice.message
            serial = str(getattr(completion, "id", None) or "call")
            calls = []
            for index, call in enumerate(message.tool_calls or ()):
                arguments, error = _parse_arguments(call.function.arguments)
                calls.append(ToolCall(str(getattr(call, "id", None) or f"{serial}_{index}"), call.function.name,
                                      arguments, error))
            legacy = getattr(message, "function_call", None)
            if not calls and legacy is not None and legacy.name:
                arguments, error = _parse_arguments(legacy.arguments)
                calls.append(ToolCall(f"{serial}_0", legacy.name, arguments, error))
            usage = completion.usage
            tokens_in = int(usage.prompt_tokens or 0) if usage else 0
            tokens_out = int(usage.completion_tokens or 0) if usage else 0
            text = message.content or ""
            if not isinstance(text, str):
                raise TypeError(f"message content is {type(text).__name__}, not a string")
        except (AttributeError, IndexError, TypeError, ValueError) as exc:
            raise MalformedResponseError(f"openai: response lacks choices/message: {exc}") from exc
        if not calls and offered:
            # The server did not parse a call the model wrote: read it from the text, as local: does.
            prose, text_calls = parse_text_tool_calls(text, id_prefix=f"{serial}_text", known_tools=offered)
            if text_calls:
                text, calls = prose, list(text_calls)
        return ChatResponse(
            text=text,
            tool_calls=tuple(calls),
            usage=Usage(tokens_in, tokens_out, cost_usd("openai", self.model, tokens_in, tokens_out)),
            finish_reason=choice.finish_reason,
        )

    async def aclose(self) -> None:
        await self._client.close()


@register_model("openai")
def _create(name: str, options: ModelOptions) -> OpenAIChatModel:
    return OpenAIChatModel(name, options)
