"""``anthropic:MODEL``: the official ``anthropic`` SDK (async), Messages API.

System turns become the ``system`` parameter, assistant tool calls become
``tool_use`` blocks and tool results become ``tool_result`` blocks in a user
turn (consecutive results merged), as the API requires.
"""

from __future__ import annotations

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

__all__ = ["AnthropicChatModel", "to_anthropic_messages"]


def _anthropic_part(part: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI-shaped content part as a Messages API block (a ``data:`` image URL becomes a base64 image)."""
    if part.get("type") == "image_url":
        url = str(part.get("image_url", {}).get("url", ""))
        header, _, data = url.partition(",")
        if header.startswith("data:") and header.endswith(";base64"):
            return {"type": "image", "source": {"type": "base64", "media_type": header[5:-7], "data": data}}
        return {"type": "image", "source": {"type": "url", "url": url}}
    return {"type": "text", "text": str(part.get("text") or "(empty)")}


def to_anthropic_messages(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """Split off the system text and convert the turns to Messages API blocks."""
    system: list[str] = []
    wire: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "system":
            system.append(content)
        elif role == "user" and isinstance(content, list):  # multimodal: OpenAI-shaped text and image parts
            wire.append({"role": "user", "content": [_anthropic_part(part) for part in content]})
        elif role == "user":
            # The Messages API rejects empty text blocks.
            wire.append({"role": "user", "content": [{"type": "text", "text": content or "(empty)"}]})
        elif role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
            for call in message.get("tool_calls") or ():
                blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                               "input": call["function"]["arguments"]})
            wire.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "(no reply)"}]})
        elif role == "tool":
            block = {"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": content}
            if wire and wire[-1]["role"] == "user" and all(b["type"] == "tool_result" for b in wire[-1]["content"]):
                wire[-1]["content"].append(block)
            else:
                wire.append({"role": "user", "content": [block]})
    return "\n\n".join(system), wire


class AnthropicChatModel:
    """Messages through ``anthropic.AsyncAnthropic``."""

    def __init__(self, model: str, options: ModelOptions):
        try:
            import anthropic
        except ImportError as exc:
            raise ModelConfigError(
                "the anthropic SDK is not installed: pip install 'factory-rlaif[anthropic]'") from exc
        if not model:
            raise ModelConfigError("anthropic: needs a model name, e.g. anthropic:claude-3-5-haiku-latest")
        api_key = options.api_key or os.environ.get("ANTHROPIC_API_KEY")
        if api_key is None and options.base_url is None:
            raise ModelConfigError("anthropic: set ANTHROPIC_API_KEY, or pass --base-url")
        self._anthropic = anthropic
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key or "not-needed", base_url=options.base_url, max_retries=0, timeout=options.timeout_s)
        self.model = model
        self.spec = f"anthropic:{model}"
        self.timeout_s = options.timeout_s

    async def chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        *,
        temperature: float = 0.7,
        seed: int | None = None,  # the Messages API has no seed
        max_tokens: int = 1024,
    ) -> ChatResponse:
        system, wire = to_anthropic_messages(messages)
        request: dict[str, Any] = {"model": self.model, "messages": wire, "max_tokens": max_tokens,
                                   "extra_body": {"temperature": temperature}}
        if system:
            request["system"] = system
        if tools:
            request["tools"] = [{"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
                                for t in tools]
        with sdk_errors(self._anthropic, "anthropic"):
            reply = await within_timeout(self._client.messages.create(**request), self.timeout_s, "anthropic")
        return self._parse(reply)

    def _parse(self, reply: Any) -> ChatResponse:
        try:
            texts, calls = [], []
            for block in reply.content:
                if block.type == "text":
                    texts.append(block.text)
                elif block.type == "tool_use":
                    arguments = block.input if isinstance(block.input, dict) else {}
                    error = None if isinstance(block.input, dict) else "input must be a JSON object"
                    calls.append(ToolCall(block.id, block.name, arguments, error))
            tokens_in, tokens_out = int(reply.usage.input_tokens), int(reply.usage.output_tokens)
            text = "".join(texts)
        except (AttributeError, TypeError, ValueError) as exc:
            raise MalformedResponseError(f"anthropic: response lacks content/usage: {exc}") from exc
        return ChatResponse(
            text=text, tool_calls=tuple(calls),
            usage=Usage(tokens_in, tokens_out, cost_usd("anthropic", self.model, tokens_in, tokens_out)),
            finish_reason=reply.stop_reason,
        )

    async def aclose(self) -> None:
        await self._client.close()


@register_model("anthropic")
def _create(name: str, options: ModelOptions) -> AnthropicChatModel:
    return AnthropicChatModel(name, options)
