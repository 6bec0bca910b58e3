"""``openai:MODEL``: the official ``openai`` SDK (async), for OpenAI or any compatible server.

``--base-url`` points it at vLLM's, llama.cpp's or Ollama's OpenAI-compatible
endpoint; without an API key there, a placeholder is sent. The SDK's own
retries are off: :class:`~factory.models.ResilientModel` retries.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from factory.errors import MalformedResponseError, ModelConfigError
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
        with sdk_errors(self._openai, "openai"):
            completion = await within_timeout(self._client.chat.completions.create(**request), self.timeout_s, "openai")
        return self._parse(completion)

    def _parse(self, completion: Any) -> ChatResponse:
        try:
            choice = completion.choices[0]
            message = choice.message
            calls = []
            for call in message.tool_calls or ():
                arguments, error = _parse_arguments(call.function.arguments)
                calls.append(ToolCall(call.id, call.function.name, arguments, error))
            usage = completion.usage
            tokens_in = int(usage.prompt_tokens) if usage else 0
            tokens_out = int(usage.completion_tokens) if usage else 0
            text = message.content or ""
            if not isinstance(text, str):
                raise TypeError(f"message content is {type(text).__name__}, not a string")
        except (AttributeError, IndexError, TypeError, ValueError) as exc:
            raise MalformedResponseError(f"openai: response lacks choices/message: {exc}") from exc
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
