"""HumanEval-style tasks (function-level tests importing ``solution``) under the default isolation.

``examples/humaneval-style.jsonl`` ships each task with visible and hidden
tests. Correct solutions pass; wrong ones fail; a solution fitted to the
visible tests' values (what a policy that read them can write) fails on the
hidden ones.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from factory.tasks import load_tasks
from factory.verifiers import BranchOutput, TestsVerifier, VerifyContext, criteria_for, run_verifier
from tests import _verify_loop

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

TASKS = {t.id: t for t in load_tasks(Path(__file__).parents[2] / "examples" / "humaneval-style.jsonl")}

CORRECT = {
    "he-close-elements": (
        "def has_close_elements(numbers, threshold):\n"
        "    values = sorted(numbers)\n"
        "    return any(b - a < threshold for a, b in zip(values, values[1:]))\n"),
    "he-below-zero": (
        "def below_zero(operations):\n    balance = 0\n    for op in operations:\n        balance += op\n"
        "        if balance < 0:\n            return True\n    return False\n"),
    "he-mean-absolute-deviation": (
        "def mean_absolute_deviation(numbers):\n    mean = sum(numbers) / len(numbers)\n"
        "    return sum(abs(x - mean) for x in numbers) / len(numbers)\n"),
    "he-separate-parens": (
        "def separate_paren_groups(text):\n    groups, current, depth = [], [], 0\n"
        "    for ch in text:\n        if ch == '(':\n            depth += 1\n            current.append(ch)\n"
        "        elif ch == ')':\n            depth -= 1\n            current.append(ch)\n"
        "            if depth == 0:\n                groups.append(''.join(current))\n                current = []\n"
        "    return groups\n"),
    "he-rolling-max": (
        "def rolling_max(numbers):\n    out, best = [], None\n    for n in numbers:\n"
        "        best = n if best is None else max(best, n)\n        out.append(best)\n    return out\n"),
}
WRONG = {
    "he-close-elements": "def has_close_elements(numbers, threshold):\n    return len(numbers) > 3\n",
    "he-below-zero": "def below_zero(operations):\n    return sum(operations) < 0\n",
    "he-mean-absolute-deviation": (
        "def mean_absolute_deviation(numbers):\n    mean = sum(numbers) / len(numbers)\n"
        "    return max(abs(x - mean) for x in numbers)\n"),
    "he-separate-parens": "def separate_paren_groups(text):\n    return text.split()\n",
    "he-rolling-max": "def rolling_max(numbers):\n    return sorted(numbers)\n",
}
# What a policy that read only the visible tests can write: their values, and nothing else.
FITTED = {
    "he-close-elements": "def has_close_elements(numbers, threshold):\n    return 2.8 in numbers\n",
    "he-below-zero": "def below_zero(operations):\n    return -4 in operations\n",
    "he-mean-absolute-deviation": "def mean_absolute_deviation(numbers):\n    return 2.0 / 3.0\n",
    "he-separate-parens": "def separate_paren_groups(text):\n    return ['()', '(())', '(()())']\n",
    "he-rolling-max": "def rolling_max(numbers):\n    return [1, 2, 3, 3, 3, 4, 4]\n",
}


def verify(task_id: str, solution: str):
    task = TASKS[task_id]
    criterion = criteria_for(task)[0]
    workspace = {**task.tests, "solution.py": solution}
    return _verify_loop.run(run_verifier(TestsVerifier(reference_sandbox="bwrap"),
                                    VerifyContext(task, BranchOutput("done"), criterion, None, workspace=workspace)))


def test_every_task_has_an_answer_key():
    assert set(TASKS) == set(CORRECT) == set(WRONG) == set(FITTED)
    assert all(task.hidden_tests and task.test_isolation == "process" for task in TASKS.values())


@pytest.mark.parametrize("task_id", sorted(CORRECT))
def test_correct_solution_passes(task_id):
    verdict = verify(task_id, CORRECT[task_id])
    assert verdict.status == "pass", verdict.details
    assert verdict.details["isolation"] == "process"
    assert verdict.details["passed"] == verdict.details["total"] >= 2


@pytest.mark.parametrize("task_id", sorted(WRONG))
def test_wrong_solution_fails(task_id):
    verdict = verify(task_id, WRONG[task_id])
    assert verdict.status == "fail", verdict.details
    assert not verdict.hack_detected


@pytest.mark.parametrize("task_id", sorted(FITTED))
def test_solution_fitted_to_visible_tests_fails_on_hidden_ones(task_id):
    verdict = verify(task_id, FITTED[task_id])
    assert verdict.status == "fail", verdict.details
    assert any("test_hidden.py" in node for node in verdict.details["failed"]), verdict.details
