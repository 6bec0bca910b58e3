"""Boundary limits and infrastructure failures are counted where a user reads results, never silent.

- the tests verdict says which tests failed only because something could not cross (``details.boundary``);
- ``factory rank`` and the fork summary count such branches per task (shown and in ``--json``);
- ``factory power --json`` says how many branches it left out as infrastructure failures, as ``rank`` does.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from datetime import datetime, timedelta, timezone

import pytest

from factory.ranking import boundary_limited, excluded_branches, load_records
from factory.rollouts import fork_summary
from factory.sandbox import SandboxLimits
from factory.store import Store
from factory.tasks import Task
from factory.verifiers import BranchOutput, Criterion, TestsVerifier, VerifyContext, opinion_verifiers, run_verifier

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

MONEY_TESTS = ("from money import total\n\n"
               "def test_total_equals():\n    assert total([1, 2]) == 3\n\n"
               "def test_total_cents():\n    assert total([1, 2]).cents == 3\n")
# Honest: but the test compares an object of a class it never names with its own value, so the comparison
# would be the solution's own code deciding against the test's expected value: the boundary refuses it (by
# design) and that test fails isolated.
MONEY = ("class Money:\n    def __init__(self, cents):\n        self.cents = cents\n\n"
         "    def __eq__(self, other):\n"
         "        return other == self.cents if isinstance(other, int) else (\n"
         "            isinstance(other, Money) and other.cents == self.cents)\n\n"
         "    def __hash__(self):\n        return hash(self.cents)\n\n\n"
         "def total(items):\n    return Money(sum(items))\n")
MONEY_WRONG = MONEY.replace("Money(sum(items))", "Money(0)")
MONEY_TASK = Task(id="money", prompt="Write Money and total(items) in money.py.",
                  files={"money.py": "class Money:\n    pass\n"}, tests={"test_money.py": MONEY_TESTS})


def verify(workspace: dict[str, str]):
    verifier = TestsVerifier(timeout_s=60, reference_sandbox="bwrap", limits=SandboxLimits(timeout_s=60))
    criterion = Criterion("tests", "tests pass", "tests", MONEY_TASK.effective_test_command)
    ctx = VerifyContext(MONEY_TASK, BranchOutput("done"), criterion, None,
                        workspace={**MONEY_TASK.tests, **workspace})
    return asyncio.run(run_verifier(verifier, ctx))


@needs_bwrap
def test_the_verdict_names_the_tests_that_failed_only_at_the_boundary():
    honest = verify({"money.py": MONEY})
    assert honest.status == "fail" and honest.details["isolation"] == "process"
    assert [b["test"] for b in honest.details["boundary"]] == ["test_money.py::test_total_equals"]
    assert "comparing it" in honest.details["boundary"][0]["what"]
    # a wrong answer is a wrong answer: its failing test_total_cents is not listed as a boundary limit
    wrong = verify({"money.py": MONEY_WRONG})
    assert sorted(wrong.details["failed"]) == ["test_money.py::test_total_cents", "test_money.py::test_total_equals"]
    assert [b["test"] for b in wrong.details["boundary"]] == ["test_money.py::test_total_equals"]


def _call(name: str, **arguments) -> dict:
    return {"text": "", "tool_calls": [{"name": name, "arguments": arguments}]}


@needs_bwrap
def test_fork_summary_and_rank_count_boundary_limited_branches_per_task(tmp_path, cli):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(MONEY_TASK.canonical()) + "\n" + json.dumps(
        {"id": "add", "prompt": "What is 17 + 25? Reply as `Final: <n>`.", "answer": "42"}) + "\n")
    replies = [
        # branches 0 and 1 write the honest solution (boundary-limited); branch 2 writes one that cannot import
        {"prompt_contains": "money.py", "turn": 0, "response": _call("write_file", path="money.py", content=MONEY)},
        {"prompt_contains": "money.py", "turn": 0, "response": _call("write_file", path="money.py", content=MONEY)},
        {"prompt_contains": "money.py", "turn": 0,
         "response": _call("write_file", path="money.py", content="class Money(:\n")},
        {"prompt_contains": "money.py", "turn": 1, "response": _call("submit", answer="done")},
        {"prompt_contains": "17 + 25", "response": {"text": "Final: 42"}},
    ]
    replay = tmp_path / "replies.jsonl"
    replay.write_text("".join(json.dumps(r) + "\n" for r in replies))
    db = tmp_path / "run.duckdb"
    forked = cli("fork", tasks, "--model", f"replay:{replay}", "--sandbox", "bwrap", "-n", "3", "--db", db,
                 "--run-id", "r1")
    assert forked.exit_code == 0, forked.output
    assert ("boundary-limited: 2 branch(es) failed a test only because something could not cross the isolation "
            "boundary (money 2)") in forked.output
    with Store.open(db, read_only=True) as store:
        summary = fork_summary(store, "r1")
    assert summary["boundary_limited"] == 2
    assert {row["task_id"]: row["boundary_limited"] for row in summary["per_task"]} == {"add": 0, "money": 2}

    ranked = cli("rank", "r1", "--db", db, "--json")
    assert ranked.exit_code == 0, ranked.output
    boundary = json.loads(ranked.output)["boundary_limited"]
    assert boundary["branches"] == 2 and boundary["per_task"] == {"add": 0, "money": 2}
    assert "details.boundary" in boundary["rule"]
    text = cli("rank", "r1", "--db", db)
    assert "boundary-limited: 2 branch(es) failed a test only because something could not cross the isolation " \
           "boundary (money 2)" in text.output


# ------------------------------------------------------------------ counts from stored rows

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def _branch(run_id: str, task: str, index: int, temperature: float, status: str = "ok", error: str | None = None):
    return {"run_id": run_id, "task_id": task, "branch_index": index, "session_id": f"{run_id}-b{index}-0",
            "status": status, "temperature": temperature, "seed": index, "model": "replay:x", "error": error,
            "trajectory": [{"role": "assistant", "content": "x"}], "usage": {"input_tokens": 1, "output_tokens": 1},
            "started_at": T0}


def _verdict(run_id: str, task: str, index: int, status: str, at: int = 0, details: dict | None = None,
             version: str = "1"):
    return {"run_id": run_id, "task_id": task, "branch_index": index, "verifier": "tests", "version": version,
            "ok": status == "pass", "score": 1.0 if status == "pass" else 0.0, "status": status,
            "details": details or {}, "created_at": T0 + timedelta(seconds=at)}


LIMIT = {"boundary": [{"test": "test_x.py::test_a", "what": "a module cannot be passed to the solution"}]}


@pytest.fixture
def stored(tmp_path):
    """Two runs: tasks t0..t5, branches at temperatures 0.5 and 1.0, and infrastructure failures in both."""
    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        for run_id in ("r1", "r2"):
            store.write_run({"run_id": run_id, "created_at": T0, "status": "done", "model": "replay:x"})
            branches, verdicts = [], []
            for t in range(6):
                for index, temperature in enumerate((0.5, 1.0)):
                    branches.append(_branch(run_id, f"t{t}", index, temperature))
                    verdicts.append(_verdict(run_id, f"t{t}", index, "pass" if (t + index) % 2 else "fail"))
            # infrastructure failures: two at an arm's temperature, one at a temperature no arm uses
            branches += [_branch(run_id, "t0", 2, 0.5, "infra_error", "ReplayMissError: no entry"),
                         _branch(run_id, "t1", 2, 1.0, "infra_error", "SandboxError: died"),
                         _branch(run_id, "t2", 2, 1.5, "infra_error", "ProviderExhaustedError: gave up")]
            store.write_branches(branches)
            store.write_verdicts(verdicts)
        # r1: t0's branch 0 is boundary-limited now; t1's branch 1 was, but its latest verdict is not
        store.write_verdicts([_verdict("r1", "t0", 0, "fail", at=5, details=LIMIT),
                              _verdict("r1", "t1", 1, "fail", at=1, details=LIMIT),
                              _verdict("r1", "t1", 1, "pass", at=9, details={"boundary": []}, version="2")])
    return db


def test_only_a_latest_verdict_with_boundary_entries_counts(stored):
    with Store.open(stored, read_only=True) as store:
        counts = boundary_limited(load_records(store, "r1"))
        summaries = store.task_summaries("r1", opinions=opinion_verifiers())
    assert counts["branches"] == 1
    assert counts["per_task"] == {"t0": 1, "t1": 0, "t2": 0, "t3": 0, "t4": 0, "t5": 0}
    assert dict(summaries.select("task_id", "boundary_limited").iter_rows()) == counts["per_task"]


def test_rank_json_says_how_many_infrastructure_failures_and_boundary_limits(stored, cli):
    result = cli("rank", "r1", "--db", stored, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["excluded"]["infra_failures"] == 3
    assert report["excluded"]["reasons"] == ["ProviderExhaustedError", "ReplayMissError", "SandboxError"]
    assert report["boundary_limited"]["branches"] == 1


def test_power_json_counts_the_infrastructure_failures_of_the_arms_it_compared(stored, cli):
    by_field = cli("power", "--db", stored, "--run", "r1", "--by", "temperature", "--a", "0.5", "--b", "1.0",
                   "--json")
    assert by_field.exit_code == 0, by_field.output
    excluded = json.loads(by_field.output)["excluded"]
    # the failure at temperature 1.5 was in neither arm: it was not left out of this comparison
    assert excluded["infra_failures"] == 2
    assert excluded["reasons"] == ["ReplayMissError", "SandboxError"]
    assert "not outcomes" in excluded["rule"]

    one_arm = json.loads(cli("power", "--db", stored, "--run", "r1", "--by", "temperature", "--a", "0.5",
                             "--b", "1", "--json").output)["excluded"]
    assert one_arm["infra_failures"] == 2  # "1" names the same arm as 1.0

    runs = cli("power", "--db", stored, "--runs", "r1", "r2", "--json")
    assert runs.exit_code == 0, runs.output
    excluded = json.loads(runs.output)["excluded"]
    assert excluded["infra_failures"] == 6 and excluded["runs"] == {"r1": 3, "r2": 3}

    selected = cli("power", "--db", stored, "--run", "r1", "--by", "temperature", "--select", "best-worst",
                   "--json")
    assert selected.exit_code == 0, selected.output
    assert json.loads(selected.output)["excluded"]["infra_failures"] == 3  # any temperature could have been chosen

    text = cli("power", "--db", stored, "--runs", "r1", "r2")
    assert "excluded: 6 branch(es) as infrastructure failures (ProviderExhaustedError, ReplayMissError, " \
           "SandboxError)" in text.output
    with Store.open(stored, read_only=True) as store:
        assert excluded_branches(store, "r2")["infra_failures"] == 3
