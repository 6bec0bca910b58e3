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
from factory.rollouts.models._base import Message, ToolCall, ToolSpec

__all__ = ["parse_text_tool_calls", "render_chat_template"]

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_text_tool_calls(text: str, id_prefix: str = "call") -> tuple[str, tuple[ToolCall, ...]]:
    """Split ``text`` into its prose and its ``<tool_call>`` blocks."""
    calls = []
    for index, match in enumerate(_CALL.finditer(text)):
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
    prose = _CALL.sub("", text).strip()
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
