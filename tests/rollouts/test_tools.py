"""The agent's tools, called directly against a real sandbox: the contract any client drives them by."""

from __future__ import annotations

import asyncio
import warnings

import jsonschema
import pytest

from factory.models import ToolCall
from factory.rollouts import AGENT_TOOLS, ToolOutcome, execute_tool
from factory.sandbox import NoSandboxWarning, SandboxLimits, SandboxSpec, create_sandbox

SPEC = SandboxSpec(files={"app.py": "print('hi')\n", "pkg/mod.py": "X = 1\n"},
                   readonly_files={"test_app.py": "def test(): pass\n"},
                   limits=SandboxLimits(timeout_s=20))


def call(name: str, **arguments) -> ToolCall:
    return ToolCall("c0", name, arguments)


def run_calls(*calls: ToolCall, max_timeout: float = 20.0) -> list[ToolOutcome]:
    async def main():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NoSandboxWarning)
            async with create_sandbox("none", SPEC) as sandbox:
                return [await execute_tool(c, sandbox, max_timeout) for c in calls]

    return asyncio.run(main())


def test_the_tool_names_and_schemas_are_the_contract():
    assert [tool.name for tool in AGENT_TOOLS] == ["read_file", "write_file", "list_files", "run", "submit"]
    for tool in AGENT_TOOLS:
        jsonschema.Draft202012Validator.check_schema(tool.parameters)
        assert tool.parameters["additionalProperties"] is False and tool.description


def test_write_read_and_list_files():
    written, read, listed, under = run_calls(call("write_file", path="new/note.txt", content="über"),
                                             call("read_file", path="new/note.txt"), call("list_files"),
                                             call("list_files", path="pkg"))
    assert written == ToolOutcome("wrote 5 bytes to new/note.txt", ok=True)
    assert read == ToolOutcome("über", ok=True)
    assert listed.ok and listed.output.splitlines() == ["app.py", "new/note.txt", "pkg/mod.py", "test_app.py"]
    assert under.output == "pkg/mod.py"


def test_run_reports_output_and_exit_status():
    passed, failed = run_calls(call("run", command="python app.py"), call("run", command="echo oops >&2; exit 3"))
    assert passed == ToolOutcome("hi\n[exit code 0]", ok=True)
    assert failed == ToolOutcome("oops\n[exit code 3]", ok=False)


def test_run_timeout_is_capped_by_the_sandbox_limit():
    (capped,) = run_calls(call("run", command="sleep 5", timeout=600), max_timeout=0.5)
    assert not capped.ok and "timed out after" in capped.output
    (bad_value,) = run_calls(call("run", command="echo fine", timeout="soon"))
    assert bad_value.ok  # an unusable timeout falls back to the cap
    for odd in ("nan", "-inf", "inf", -3, 0):  # nan slips through min(): never an exception (an infra error)
        (outcome,) = run_calls(call("run", command="echo fine", timeout=odd))
        assert outcome.ok and outcome.output.startswith("fine"), (odd, outcome)


def test_submit_ends_with_the_answer_as_text():
    text, number = run_calls(call("submit", answer="42"), call("submit", answer=42))
    assert text == ToolOutcome("submitted: 42", ok=True, submitted="42")
    assert number.submitted == "42"


@pytest.mark.parametrize(("tool_call", "message"), [
    (ToolCall("c0", "", {}, "tool call is not valid JSON: x"), "error: tool call is not valid JSON: x"),
    (call("delete_everything"), "error: unknown tool 'delete_everything' (tools: read_file, write_file, "
                                "list_files, run, submit)"),
    (call("write_file", path="a.txt"), "error: write_file needs argument(s): content"),
    (call("run"), "error: run needs argument(s): command"),
    (call("submit"), "error: submit needs argument(s): answer"),
])
def test_a_bad_call_is_an_error_text_not_an_exception(tool_call, message):
    (outcome,) = run_calls(tool_call)
    assert outcome == ToolOutcome(message, ok=False)


@pytest.mark.parametrize("tool_call", [
    call("read_file", path="../../etc/passwd"),
    call("write_file", path="/etc/evil", content="x"),
    call("write_file", path="test_app.py", content="def test(): assert True\n"),
    call("read_file", path="absent.py"),
    call("list_files", path="nowhere"),
])
def test_path_problems_are_reported_to_the_model(tool_call):
    (outcome,) = run_calls(tool_call)
    assert not outcome.ok and outcome.output.startswith("error: ") and outcome.submitted is None
