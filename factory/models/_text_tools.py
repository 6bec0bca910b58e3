"""Tool calls written as text, in the Hermes / Qwen convention.

In-process engines (llama.cpp, vLLM, transformers) produce plain text; chat
templates that support tools ask the model to write::

    <tool_call>
    {"name": "run", "arguments": {"command": "pytest -q"}}
    </tool_call>

:func:`parse_text_tool_calls` extracts those calls and the remaining text;
a call whose JSON does not parse is kept with its error, so the agent can
tell the model what went wrong instead of silently dropping it. The
``openai:`` provider reads a reply's text the same way when the server
returned no structured calls; every call read here is marked
``origin="text"``, so a trajectory shows which way each call arrived.
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
_LINE_OBJECT = re.compile(r"^[ \t]*\{", re.MULTILINE)

#: A call found in the text: where it starts and ends (the span left out of the prose) and its JSON body.
_Span = tuple[int, int, str]


def _line_objects(text: str) -> list[_Span]:
    """JSON objects that begin a line, however much prose stands around them."""
    decoder = json.JSONDecoder()
    spans: list[_Span] = []
    for match in _LINE_OBJECT.finditer(text):
        start = match.end() - 1
        if spans and start < spans[-1][1]:
            continue  # inside the previous object
        try:
            _, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        spans.append((start, end, text[start:end]))
    return spans


def _untagged_calls(text: str, known_tools: frozenset[str]) -> list[_Span]:
    """Small models, and servers that parse no calls, often give the call as a JSON object without the tags.

    Fenced objects if the text has any, else the objects that begin a line.
    Accepted only when every such object names a tool on offer and carries
    ``arguments``, so that JSON an answer merely contains is never mistaken
    for a call.
    """
    spans = [(m.start(), m.end(), m.group(1)) for m in _FENCED.finditer(text)] or _line_objects(text)
    for _, _, body in spans:
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            return []
        if not isinstance(data, dict) or data.get("name") not in known_tools or "arguments" not in data:
            return []
    return spans


def parse_text_tool_calls(
    text: str, id_prefix: str = "call", known_tools: frozenset[str] | None = None
) -> tuple[str, tuple[ToolCall, ...]]:
    """Split ``text`` into its prose and its tool calls.

    ``<tool_call>`` blocks win; without them, and with ``known_tools`` given,
    JSON objects naming an offered tool (fenced, or beginning a line) are
    calls too. Every call has ``origin="text"``.

    Args:
        text: Model output.
        id_prefix: Prefix of the generated call ids.
        known_tools: Names of the tools on offer; when given, untagged JSON
            calls that name one of them are accepted too.
    """
    spans = [(m.start(), m.end(), m.group(1)) for m in _CALL.finditer(text)]
    if not spans and known_tools:
        spans = _untagged_calls(text, known_tools)
    if not spans:
        return text.strip(), ()
    prose = "".join(text[begin:end] for begin, end in
                    zip([0] + [e for _, e, _ in spans], [s for s, _, _ in spans] + [len(text)])).strip()
    calls = []
    for index, (_, _, raw) in enumerate(spans):
        body = raw.strip()
        call_id = f"{id_prefix}_{index}"
        try:
            data: Any = json.loads(body)
        except json.JSONDecodeError as exc:
            calls.append(ToolCall(call_id, "", {}, f"tool call is not valid JSON: {exc.msg}", origin="text"))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            calls.append(ToolCall(call_id, "", {}, 'tool call must be {"name": ..., "arguments": {...}}',
                                  origin="text"))
            continue
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):  # some models double-encode
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            calls.append(ToolCall(call_id, data["name"], {}, "arguments must be a JSON object", origin="text"))
            continue
        calls.append(ToolCall(call_id, data["name"], arguments, origin="text"))
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
