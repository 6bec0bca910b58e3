"""Imported tasks verify before the first fork, and fork as their references say (real bwrap sandboxes).

- ``factory tasks import`` checks every reference solution (isolated and bare) and every starter;
- a reference that fails, or a starter that already passes, is reported with the verdict's reason;
- end to end: the imported HumanEval fixture forked with a scripted replay agent (the reference solutions
  pass, the stubs fail), and the SWE-style fixture (the fix passes; the unfixed snapshot fails on exactly
  FAIL_TO_PASS and passes PASS_TO_PASS).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from factory.store import Store
from factory.tasks import load_tasks

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

DATA = Path(__file__).parent / "data" / "imports"


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "factory.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=900)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# The suite checks part of each code fixture (the whole of each, and all 164 HumanEval rows, in the closing notes
# and bench/bench_import.py): each check is three verifications a task.
@pytest.mark.parametrize(("fmt", "source", "count"), [
    ("humaneval", DATA / "humaneval" / "HumanEval.jsonl", 6),
    ("mbpp", DATA / "mbpp" / "mbpp.jsonl", 3),
    ("swe", DATA / "swe" / "instances.jsonl", 1),
])
def test_import_checks_every_reference_passes_and_every_starter_fails(fmt, source, count, tmp_path):
    out = tmp_path / f"{fmt}.jsonl"
    result = cli("tasks", "import", fmt, source, "--out", out, "--json", "--jobs", 2, "--limit", count)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["imported"] == count and report["checked"]
    assert report["check"]["reference_pass"] == count and report["check"]["starter_fail"] == count, report["check"]
    for task in report["tasks"]:
        assert task["isolated"]["status"] == task["bare"]["status"] == "pass" and not task["problem"], task
    assert len(load_tasks(out)) == count


def test_a_failing_reference_and_a_passing_starter_are_reported_with_reasons(tmp_path):
    good, second, *_ = rows(DATA / "humaneval" / "HumanEval.jsonl")
    wrong = {**good, "task_id": "HumanEval/wrong", "canonical_solution": "    return False\n"}
    # a "stub" that already holds the whole solution: an agent that does nothing would be rewarded
    solved = {**second, "task_id": "HumanEval/solved", "prompt": second["prompt"] + second["canonical_solution"],
              "canonical_solution": "\n"}  # and no reference of its own: its starter is checked all the same
    source = tmp_path / "he.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in (good, wrong, solved)))
    out = tmp_path / "tasks.jsonl"
    result = cli("tasks", "import", "humaneval", source, "--out", out)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{out}: HumanEval-wrong  reference fails (isolated fail (" in result.stdout, result.stdout
    assert f"{out}: HumanEval-solved  starter pass (" in result.stdout and "already pass" in result.stdout
    assert "HumanEval-0 " not in result.stdout  # the good task is not listed
    assert "reference pass 1," in result.stdout and "reference fail 1," in result.stdout
    assert "no reference 1," in result.stdout and "starter pass 1," in result.stdout
    assert len(load_tasks(out)) == 3  # the file is written and kept: the report is about its tasks


def write_code_replay(path: Path, tasks, *, write_reference: bool) -> Path:
    """A scripted agent: per task, write the reference solution's files (or touch nothing), then finish."""
    lines = []
    for task in tasks:
        marker = task.prompt[:80]
        calls = [{"name": "write_file", "arguments": {"path": p, "content": text}}
                 for p, text in sorted(task.solution.items())] if write_reference else []
        lines.append({"prompt_contains": marker, "turn": 0,
                      "response": {"text": "" if calls else "I am done.", "tool_calls": calls}})
        lines.append({"prompt_contains": marker, "turn": 1, "response": {"text": "Done.", "tool_calls": []}})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def fork(tasks_file: Path, replay: Path, db: Path) -> dict:
    result = cli("fork", tasks_file, "--model", f"replay:{replay}", "--db", db, "-n", 1, "--max-turns", 3,
                 "--seed", 1, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def verdicts(db: Path, run_id: str) -> dict[str, dict]:
    with Store.open(db, read_only=True) as store:
        frame = store.query(f"SELECT task_id, status, details FROM verdicts WHERE run_id = '{run_id}' "
                            "AND verifier = 'tests'")
    return {row["task_id"]: {"status": row["status"], **json.loads(row["details"])} for row in frame.to_dicts()}


def test_imported_humaneval_forks_reference_passes_stub_fails(tmp_path):
    out = tmp_path / "he.jsonl"
    assert cli("tasks", "import", "humaneval", DATA / "humaneval" / "HumanEval.jsonl", "--out", out, "--limit", 3,
               "--no-check").returncode == 0
    tasks = list(load_tasks(out))
    db = tmp_path / "f.duckdb"
    solved = fork(out, write_code_replay(tmp_path / "ref.jsonl", tasks, write_reference=True), db)
    idle = fork(out, write_code_replay(tmp_path / "idle.jsonl", tasks, write_reference=False), db)
    assert solved["errors"] == idle["errors"] == 0
    passed = verdicts(db, solved["run_id"])
    stubbed = verdicts(db, idle["run_id"])
    assert {t: v["status"] for t, v in passed.items()} == {t.id: "pass" for t in tasks}, passed
    assert {t: v["status"] for t, v in stubbed.items()} == {t.id: "fail" for t in tasks}, stubbed
    assert not any(v.get("hack_detected") for v in [*passed.values(), *stubbed.values()])


def test_imported_swe_forks_fix_passes_unfixed_fails_exactly_fail_to_pass(tmp_path):
    out = tmp_path / "swe.jsonl"
    assert cli("tasks", "import", "swe", DATA / "swe" / "instances.jsonl", "--out", out, "--no-check").returncode == 0
    (task,) = load_tasks(out)
    db = tmp_path / "f.duckdb"
    fixed = fork(out, write_code_replay(tmp_path / "fix.jsonl", [task], write_reference=True), db)
    unfixed = fork(out, write_code_replay(tmp_path / "idle.jsonl", [task], write_reference=False), db)
    (passed,) = verdicts(db, fixed["run_id"]).values()
    (failed,) = verdicts(db, unfixed["run_id"]).values()
    fail_to_pass, pass_to_pass = task.metadata["FAIL_TO_PASS"], task.metadata["PASS_TO_PASS"]
    assert passed["status"] == "pass" and passed["passed"] == passed["total"] == len(fail_to_pass) + len(pass_to_pass)
    assert failed["status"] == "fail", failed
    assert sorted(failed["failed"]) == sorted(fail_to_pass), failed["failed"]
    assert failed["passed"] == len(pass_to_pass)
