"""ToolCallingAgent on a replay model and a real bwrap sandbox."""

from __future__ import annotations

import asyncio
import json

from factory.models import create_model
from factory.rollouts import AgentConfig, BranchStatus, ToolCallingAgent
from factory.sandbox import SandboxSpec, create_sandbox
from factory.tasks import Task
from tests.rollouts.conftest import FIX_FACTORIAL

FACTORIAL = Task(
    id="fix-factorial", prompt="factorial(0) returns 0. Fix solution.py so the tests pass.",
    files={"solution.py": "def factorial(n):\n    if n <= 1:\n        return n\n    return n * factorial(n - 1)\n"},
    tests={"test_solution.py": "from solution import factorial\n\ndef test_zero():\n    assert factorial(0) == 1\n"},
)
ADD = Task(id="add", prompt="What is 17 + 25?", answer="42")


def run_agent(task, entries, replay_file, config=None, seed=0):
    model = create_model(f"replay:{replay_file(entries)}")
    agent = ToolCallingAgent(model, config)

    async def go():
        spec = SandboxSpec(files=task.files, readonly_files=task.tests)
        async with create_sandbox("bwrap", spec) as sandbox:
            result = await agent.run(task, sandbox, temperature=0.7, seed=seed, primer="Past winner: X")
            files = await sandbox.read_file("solution.py") if task.files else None
            return result, files

    return asyncio.run(go())


def test_tool_loop_fixes_code_and_records_every_step(replay_file):
    result, solution = run_agent(FACTORIAL, FIX_FACTORIAL, replay_file)
    assert result.status == BranchStatus.OK and result.final_answer == "base case fixed"
    assert "return 1" in solution
    kinds = [e.kind for e in result.events]
    assert kinds[0] == "run_start" and kinds[-1] == "final_answer"
    assert kinds.count("model_call") == 4 and kinds.count("tool_call") == 4 and kinds.count("tool_result") == 4
    assert [e.seq for e in result.events] == list(range(len(result.events)))
    assert [c["name"] for c in result.tool_call_sequence] == ["read_file", "write_file", "run", "submit"]
    pytest_result = result.tool_call_sequence[2]
    assert pytest_result["ok"] and "1 passed" in pytest_result["result"]
    # the summarized text stored is exactly what the model was shown
    tool_messages = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert tool_messages == [c["result"] for c in result.tool_call_sequence]
    assert result.events[0].primer == "Past winner: X"
    assert "Past winner: X" in result.messages[0]["content"]
    first_call = result.messages[2]["tool_calls"][0]["function"]
    assert first_call == {"name": "read_file", "arguments": {"path": "solution.py"}}
    json.dumps(result.messages)  # the trajectory is plain JSON


def test_single_turn_answer_task_uses_reply_as_answer(replay_file):
    entries = [{"prompt_contains": "17 + 25", "response": {"text": "17+25=42\nFinal: 42",
                                                           "usage": {"input_tokens": 12, "output_tokens": 7}}}]
    result, _ = run_agent(ADD, entries, replay_file)
    assert result.status == BranchStatus.OK and result.final_answer == "17+25=42\nFinal: 42"
    assert result.usage.input_tokens == 12 and result.usage.output_tokens == 7
    assert result.events[0].mode == "single-turn"
    assert "Final: <answer>" in result.messages[0]["content"]


def test_turn_cap_ends_with_max_turns(replay_file):
    entries = [{"prompt_contains": "factorial", "response": {"text": "", "tool_calls": [
        {"name": "list_files", "arguments": {}}]}}]
    result, _ = run_agent(FACTORIAL, entries, replay_file, AgentConfig(max_turns=3))
    assert result.status == BranchStatus.MAX_TURNS and result.final_answer is None
    assert [e.kind for e in result.events].count("model_call") == 3
    assert result.events[-1].kind == "error"


def test_bad_tool_calls_are_reported_to_the_model_not_fatal(replay_file):
    entries = [
        {"prompt_contains": "factorial", "turn": 0, "response": {"text": "", "tool_calls": [
            {"name": "delete_everything", "arguments": {}},
            {"name": "read_file", "arguments": {}},
            {"name": "read_file", "arguments": {"path": "../../etc/shadow"}},
            {"name": "write_file", "arguments": {"path": "test_solution.py", "content": "x"}}]}},
        {"prompt_contains": "factorial", "turn": 1, "response": {"text": "giving up"}},
    ]
    result, _ = run_agent(FACTORIAL, entries, replay_file)
    outputs = [c["result"] for c in result.tool_call_sequence]
    assert outputs[0].startswith("error: unknown tool 'delete_everything'")
    assert outputs[1] == "error: read_file needs argument(s): path"
    assert "outside the workspace" in outputs[2]
    assert "read-only" in outputs[3]
    assert not any(c["ok"] for c in result.tool_call_sequence)
    assert result.status == BranchStatus.OK and result.final_answer == "giving up"


def test_model_failure_is_an_error_result_not_an_exception(replay_file):
    entries = [{"prompt_contains": "something else entirely", "response": {"text": "x"}}]
    result, _ = run_agent(ADD, entries, replay_file)
    assert result.status == BranchStatus.INFRA_ERROR and "ReplayMissError" in result.error
    assert result.events[-1].kind == "error"


def _agent_over_the_wire(server):
    """The agent on the real openai SDK against the fake server, retrying fast (3 attempts) with a 1 s request bound."""
    from factory.models import ModelOptions, ResilientModel, RetryPolicy

    inner = create_model("openai:test-model", ModelOptions(base_url=f"{server.url}/v1", api_key="test", timeout_s=1.0))
    return ToolCallingAgent(ResilientModel(inner, RetryPolicy(max_attempts=3, base_s=0.01, cap_s=0.05)))


def _answer(agent):
    async def go():
        try:
            return await agent.run(ADD, None, temperature=0.7, seed=0)
        finally:
            await agent.model.aclose()

    return asyncio.run(go())


def test_a_provider_that_keeps_failing_ends_the_branch_as_an_infrastructure_failure():
    from tests.rollouts.wire_server import Reply, WireServer

    with WireServer() as server:
        server.set_default(Reply.raw('{"choices": ['))  # a 200 whose JSON is cut off, every time
        result = _answer(_agent_over_the_wire(server))
        sent = len(server.requests)

    assert result.status == BranchStatus.INFRA_ERROR  # never an agent outcome, so never scored as a fail
    assert result.error.startswith("ProviderExhaustedError: openai:test-model: gave up after 3 attempts; "
                                   "last: MalformedResponseError: openai: malformed response")
    assert sent == 3


def test_cut_off_and_hung_replies_are_retried_and_the_branch_answers():
    from dataclasses import replace

    from tests.rollouts.wire_server import Reply, WireServer

    with WireServer() as server:
        server.push(Reply.raw('{"choices": ['), replace(Reply.ok("Final: 41"), delay_s=5.0), Reply.ok("Final: 42"))
        result = _answer(_agent_over_the_wire(server))

    assert result.status == BranchStatus.OK and result.final_answer == "Final: 42"
