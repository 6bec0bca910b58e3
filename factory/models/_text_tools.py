"""Tool calls written as text, in the Hermes / Qwen convention.

In-process engines (llama.cpp, vLLM, transformers) produce plain text; chat
templates that support tools ask the model to write::

    <tool_call>
    {"name": "run", "arguments": {"command": "pytest -q"}}
    </tool_call>

:func:`parse_text_tool_calls` extracts those calls and the remaining text;
a call whose JSON does not parse is kept with its error, so the agent can
tell the model what went wrong instead of silently dropping it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from factory.errors import ModelConfigError
from factory.models._base import Message, ToolCall, ToolSpec

__all__ = ["parse_text_tool_calls", "render_chat_template"]

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCED = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)


def _untagged_calls(text: str, known_tools: frozenset[str]) -> list[re.Match[str]] | None:
    """Small models often write the call as a fenced or bare JSON object, without the tags.

    Accepted only when every such object names a tool on offer, so that JSON
    an answer merely contains is never mistaken for a call.
    """
    matches = list(_FENCED.finditer(text)) or list(re.finditer(r"^\s*(\{.*\})\s*$", text, re.DOTALL))
    if not matches:
        return None
    for match in matches:
        try:
            data = json.loads(match.group(1))
        except json.JSONDecodeError:
            return None
        if not isinstance(data, dict) or data.get("name") not in known_tools or "arguments" not in data:
            return None
    return matches


def parse_text_tool_calls(
    text: str, id_prefix: str = "call", known_tools: frozenset[str] | None = None
) -> tuple[str, tuple[ToolCall, ...]]:
    """Split ``text`` into its prose and its tool calls.

    Args:
        text: Model output.
        id_prefix: Prefix of the generated call ids.
        known_tools: Names of the tools on offer; when given, untagged JSON
            calls that name one of them are accepted too.
    """
    matches = list(_CALL.finditer(text))
    pattern = _CALL
    if not matches and known_tools:
        untagged = _untagged_calls(text, known_tools)
        if untagged:
            matches = untagged
            pattern = _FENCED if _FENCED.search(text) else re.compile(r"^\s*(\{.*\})\s*$", re.DOTALL)
    calls = []
    for index, match in enumerate(matches):
        body = match.group(1).strip()
        call_id = f"{id_prefix}_{index}"
        try:
            data: Any = json.loads(body)
        except json.JSONDecodeError as exc:
            calls.append(ToolCall(call_id, "", {}, f"tool call is not valid JSON: {exc.msg}"))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            calls.append(ToolCall(call_id, "", {}, 'tool call must be {"name": ..., "arguments": {...}}'))
            continue
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):  # some models double-encode
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            calls.append(ToolCall(call_id, data["name"], {}, "arguments must be a JSON object"))
            continue
        calls.append(ToolCall(call_id, data["name"], arguments))
    prose = pattern.sub("", text).strip()
    return prose, tuple(calls)


def _raise(message: str) -> None:
    raise ModelConfigError(f"chat template error: {message}")


def render_chat_template(
    template: str,
    messages: list[Message],
    tools: list[ToolSpec] | None,
    *,
    bos_token: str = "",
    eos_token: str = "",
) -> str:
    """Render a Hugging Face style Jinja chat template with a generation prompt."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # jinja2 comes with the in-process engines

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise
    compiled = env.from_string(template)
    return compiled.render(
        messages=messages,
        tools=[tool.openai_schema() for tool in tools] if tools else None,
        add_generation_prompt=True,
        bos_token=bos_token,
        eos_token=eos_token,
    )
