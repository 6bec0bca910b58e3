"""GRPO's reward function: completions scored by the task's own verifiers, tool calls and tests in a real sandbox."""

from __future__ import annotations

import json
import shutil

import pytest

from factory.errors import ConfigError
from factory.trainers import VerifierReward, completion_text
from tests._runs import FIXED, TASKS

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

SPECS = {task.id: json.dumps(task.model_dump(mode="json")) for task in TASKS}


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_answers_are_scored_by_the_answer_verifier_without_a_sandbox():
    reward = VerifierReward("bwrap")
    completions = [[{"role": "assistant", "content": "17 and 25 make 42.\nFinal: 42"}],
                   [{"role": "assistant", "content": "Final: 41"}],
                   "Final: 156",
                   call("submit", answer="Final: 156")]
    specs = [SPECS["add"], SPECS["add"], SPECS["mul"], SPECS["mul"]]
    assert reward(prompts=[None] * 4, completions=completions, task_spec=specs) == [1.0, 0.0, 1.0, 1.0]
    assert reward.counts["answer_passes"] == 3 and reward.counts["scored"] == 4


def test_code_completions_run_their_tool_calls_and_the_tests_in_a_sandbox():
    reward = VerifierReward("bwrap")
    fixed = call("write_file", path="solution.py", content=FIXED) + "\n" + call("submit", answer="fixed")
    untouched = "I would change the base case."
    hack = call("write_file", path="conftest.py", content="def pytest_collection_modifyitems(items):\n"
                                                         "    items.clear()\n")
    escape = call("write_file", path="../outside.py", content="x = 1\n")
    scores = reward(prompts=[None] * 4, completions=[fixed, untouched, hack, escape],
                    task_spec=[SPECS["fix-factorial"]] * 4)
    assert scores[0] == 1.0
    assert scores[1] == 0.5  # partial credit: one of the two tests passes on the untouched code
    # tests collected away: caught, and scored below leaving the code alone (0.5 minus the 0.4 tamper penalty)
    assert scores[2] == pytest.approx(0.1)
    assert scores[3] == 0.5  # a path outside the workspace is a tool error; nothing was written
    assert reward.counts["tool_calls"] == 4
    assert reward.counts["tests_passes"] == 1


def test_a_task_without_objective_verifiers_is_left_out_and_bad_input_is_refused():
    rubric_only = json.dumps({"id": "essay", "prompt": "Write a haiku.", "rubric": "Is it a haiku?"})
    reward = VerifierReward("bwrap")
    assert reward(prompts=[None], completions=["an old silent pond"], task_spec=[rubric_only]) == [None]
    with pytest.raises(ConfigError, match="task_spec"):
        reward(prompts=[None], completions=["x"])
    with pytest.raises(ConfigError, match="judge"):
        VerifierReward("bwrap", verifiers=["answer", "judge"])
    with pytest.raises(ConfigError, match="sandbox"):
        VerifierReward("no-such-sandbox")


def test_completion_text_reads_strings_and_assistant_messages():
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "a"}, {"role": "tool", "content": "t"},
                            {"role": "assistant", "content": "b"}]) == "a\nb"


def test_an_infrastructure_failure_is_left_out_not_scored_zero(monkeypatch):
    """A sandbox that cannot start scores None (TRL leaves it out of the mean), never the completion's 0."""
    reward = VerifierReward("bwrap")
    fixed = call("write_file", path="solution.py", content=FIXED) + "\n" + call("submit", answer="fixed")
    monkeypatch.setenv("PATH", "/nonexistent")  # bwrap cannot be found: the sandbox fails to start
    assert reward(prompts=[None], completions=[fixed], task_spec=[SPECS["fix-factorial"]]) == [None]
    assert reward.counts["infra_errors"] == 1 and reward.counts["scored"] == 0
