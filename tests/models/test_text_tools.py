"""The pure text tool-call parser and chat-template renderer, without llama.cpp or any engine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from factory.errors import ModelConfigError
from factory.models import ToolCall, ToolSpec, parse_text_tool_calls, render_chat_template

KNOWN = frozenset({"read_file", "run", "submit"})
NO_JINJA = "jinja2 comes with the in-process engines (local / vllm / train extras)"


def test_parsing_needs_no_engine():
    """The parser is importable and usable on a core install: no llama.cpp, vLLM or jinja2 behind it."""
    code = ("import sys\n"
            "from factory.models import parse_text_tool_calls\n"
            "prose, calls = parse_text_tool_calls('<tool_call>{\"name\": \"run\", \"arguments\": {}}</tool_call>')\n"
            "assert calls[0].name == 'run', calls\n"
            "heavy = [m for m in ('llama_cpp', 'vllm', 'jinja2', 'torch') if m in sys.modules]\n"
            "print(' '.join(heavy))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"parsing imported {result.stdout.strip()}"


def test_one_well_formed_call_is_split_from_the_prose():
    text = 'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
    prose, calls = parse_text_tool_calls(text)
    assert prose == "Let me look."
    assert calls == (ToolCall("call_0", "read_file", {"path": "a.py"}),)


def test_multiple_calls_keep_their_order_and_get_numbered_ids():
    text = ('A <tool_call>{"name": "read_file", "arguments": {"path": "x"}}</tool_call> B '
            '<tool_call>{"name": "run", "arguments": {"command": "ls"}}</tool_call> C')
    prose, calls = parse_text_tool_calls(text, id_prefix="turn3")
    assert prose == "A  B  C"
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("turn3_0", "read_file", {"path": "x"}), ("turn3_1", "run", {"command": "ls"})]


def test_nested_arguments_survive_intact():
    arguments = {"path": "cfg.json", "content": json.dumps({"k": [1, {"x": None}]}), "opts": {"deep": {"n": [1, 2]}}}
    text = f"<tool_call>{json.dumps({'name': 'write_file', 'arguments': arguments})}</tool_call>"
    _, calls = parse_text_tool_calls(text)
    assert calls[0].arguments == arguments and calls[0].error is None


def test_missing_arguments_mean_an_empty_object():
    _, calls = parse_text_tool_calls('<tool_call>{"name": "submit"}</tool_call>')
    assert calls == (ToolCall("call_0", "submit", {}),)


def test_double_encoded_arguments_are_decoded():
    text = '<tool_call>{"name": "run", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>'
    assert parse_text_tool_calls(text)[1][0].arguments == {"command": "ls"}


@pytest.mark.parametrize(("body", "name", "error"), [
    ("{not json}", "", "tool call is not valid JSON"),
    ("[1, 2]", "", 'tool call must be {"name": ..., "arguments": {...}}'),
    ('{"arguments": {}}', "", 'tool call must be {"name": ..., "arguments": {...}}'),
    ('{"name": 7, "arguments": {}}', "", 'tool call must be {"name": ..., "arguments": {...}}'),
    ('{"name": "run", "arguments": [1]}', "run", "arguments must be a JSON object"),
    ('{"name": "run", "arguments": "not json"}', "run", "arguments must be a JSON object"),
])
def test_malformed_calls_are_kept_with_their_error(body, name, error):
    """A bad call is never dropped silently: the agent can tell the model what went wrong."""
    prose, calls = parse_text_tool_calls(f"thinking <tool_call>{body}</tool_call>")
    assert prose == "thinking"
    assert len(calls) == 1
    assert calls[0].name == name and calls[0].arguments == {}
    assert calls[0].error is not None and calls[0].error.startswith(error)


def test_good_and_bad_calls_in_one_turn_are_all_reported():
    text = ('<tool_call>{"name": "read_file", "arguments": {"path": "a"}}</tool_call>'
            '<tool_call>{oops</tool_call>'
            '<tool_call>{"name": "submit", "arguments": {"answer": "1"}}</tool_call>')
    _, calls = parse_text_tool_calls(text)
    assert [(c.name, c.error is None) for c in calls] == [("read_file", True), ("", False), ("submit", True)]


def test_an_unclosed_call_at_the_end_of_a_truncated_output_still_parses():
    prose, calls = parse_text_tool_calls('Running it.\n<tool_call>\n{"name": "run", "arguments": {"command": "ls"}}')
    assert prose == "Running it." and calls == (ToolCall("call_0", "run", {"command": "ls"}),)
    _, cut = parse_text_tool_calls('<tool_call>\n{"name": "run", "arguments": {"command": "l')
    assert cut[0].error is not None and "not valid JSON" in cut[0].error


def test_a_closing_tag_inside_an_argument_is_reported_not_misparsed():
    """The tags are found textually, so ``</tool_call>`` inside a string ends the call: that yields an error."""
    text = '<tool_call>{"name": "run", "arguments": {"command": "echo </tool_call>"}}</tool_call>'
    _, calls = parse_text_tool_calls(text)
    assert len(calls) == 1 and calls[0].error is not None and calls[0].name == ""


def test_text_without_calls_is_all_prose():
    assert parse_text_tool_calls("  The answer is 42.\n") == ("The answer is 42.", ())
    assert parse_text_tool_calls("") == ("", ())


def test_untagged_fenced_and_bare_calls_count_when_they_name_offered_tools():
    fenced = 'I will read it.\n```json\n{"name": "read_file", "arguments": {"path": "solution.py"}}\n```'
    prose, calls = parse_text_tool_calls(fenced, known_tools=KNOWN)
    assert prose == "I will read it." and [(c.name, c.arguments) for c in calls] == [
        ("read_file", {"path": "solution.py"})]
    bare = '{"name": "submit", "arguments": {"answer": "42"}}'
    assert parse_text_tool_calls(bare, known_tools=KNOWN) == ("", (ToolCall("call_0", "submit", {"answer": "42"}),))
    two = ('```json\n{"name": "run", "arguments": {}}\n``` and '
           '```\n{"name": "submit", "arguments": {"answer": "1"}}\n```')
    prose, calls = parse_text_tool_calls(two, known_tools=KNOWN)
    assert prose == "and" and [c.name for c in calls] == ["run", "submit"]


@pytest.mark.parametrize("text", [
    '```json\n{"name": "factorial", "arguments": {"n": 0}}\n```',  # names no offered tool
    '```json\n{"name": "run", "arguments": {}}\n``` and ```\n{"name": "other", "arguments": {}}\n```',  # one does not
    '{"name": "run"}',  # no arguments key: an answer, not a call
    '```json\n{"name": "run", "arguments": {}\n```',  # not JSON
    '```json\n["run"]\n```',  # not an object
])
def test_untagged_json_that_is_not_a_call_stays_text(text):
    assert parse_text_tool_calls(text, known_tools=KNOWN) == (text.strip(), ())


def test_untagged_json_is_never_a_call_when_no_tools_are_offered():
    bare = '{"name": "submit", "arguments": {"answer": "42"}}'
    assert parse_text_tool_calls(bare) == (bare, ())
    assert parse_text_tool_calls(bare, known_tools=frozenset()) == (bare, ())


def test_tagged_calls_win_over_untagged_json():
    text = ('```json\n{"name": "submit", "arguments": {"answer": "x"}}\n```\n'
            '<tool_call>{"name": "run", "arguments": {}}</tool_call>')
    prose, calls = parse_text_tool_calls(text, known_tools=KNOWN)
    assert [c.name for c in calls] == ["run"] and '"submit"' in prose


# ------------------------------------------------------------------ templates

TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role not in ['system', 'user', 'assistant', 'tool'] %}{{ raise_exception('bad role ' + m.role) }}"
    "{% endif %}<{{ m.role }}>{{ m.content }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_template_renders_messages_tools_and_the_generation_prompt():
    pytest.importorskip("jinja2", reason=NO_JINJA)
    tool = ToolSpec("run", "Run a shell command.", {"type": "object", "properties": {"command": {"type": "string"}}})
    text = render_chat_template(TEMPLATE, [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "héllo"}],
                                [tool], bos_token="<s>", eos_token="</s>")
    first, *rest = text.split("\n")
    assert first.startswith("<s>TOOLS ")
    assert json.loads(first.removeprefix("<s>TOOLS ")) == [tool.openai_schema()]
    assert rest == ["<system>Be brief.</s>", "<user>héllo</s>", "<assistant>"]  # tojson keeps non-ASCII


def test_without_tools_the_template_sees_none():
    pytest.importorskip("jinja2", reason=NO_JINJA)
    text = render_chat_template(TEMPLATE, [{"role": "user", "content": "hi"}], None)
    assert text == "<user>hi\n<assistant>"


def test_raise_exception_in_a_template_is_a_model_config_error():
    pytest.importorskip("jinja2", reason=NO_JINJA)
    with pytest.raises(ModelConfigError, match="chat template error: bad role robot"):
        render_chat_template(TEMPLATE, [{"role": "robot", "content": "beep"}], None)


def test_templates_run_sandboxed():
    """A GGUF's template is data from a file: it cannot reach Python internals."""
    jinja2_sandbox = pytest.importorskip("jinja2.sandbox", reason=NO_JINJA)
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(jinja2_sandbox.SecurityError):
        render_chat_template(evil, [{"role": "user", "content": "x"}], None)
