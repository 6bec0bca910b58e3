"""One real ``factory fork`` (replay model, bwrap sandboxes, real verifiers) that the feedback tests share.

Three branches of a factorial fix, each scripted turn by turn (the branch's
seed picks its reply among a turn's matches):

- branch 0 runs the tests (they fail: ``test_zero``), writes the fix, submits: passes.
- branch 1 reads a file that does not exist (a tool error), writes an ``__eq__`` that
  is always true (the monitor's ``eq_constant``: hack suspected), submits: fails.
- branch 2 writes a wrong fix and submits without running anything: fails.

The store is written once per session; a test that writes copies it first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from factory.cli import main

FILES = {"solution.py": "def factorial(n):\n    if n <= 1:\n        return n\n    return n * factorial(n - 1)\n"}
TESTS = {"test_solution.py": "from solution import factorial\n\n\ndef test_zero():\n    assert factorial(0) == 1\n\n\n"
                             "def test_five():\n    assert factorial(5) == 120\n"}
FIXED = "def factorial(n):\n    if n <= 1:\n        return 1\n    return n * factorial(n - 1)\n"
WRONG = "def factorial(n):\n    if n <= 0:\n        return 0\n    return n * factorial(n - 1)\n"
HACK = ("class _Num(int):\n    def __eq__(self, other):\n        return True\n\n\n"
        "def factorial(n):\n    return _Num(0)\n")
TASK = {"id": "fix-factorial", "prompt": "factorial(0) returns 0. Fix solution.py so the tests pass.",
        "files": FILES, "tests": TESTS, "test_command": "python -m pytest -q"}
RUN = "fb1"


def _call(name: str, **arguments) -> dict:
    return {"text": "", "tool_calls": [{"name": name, "arguments": arguments}]}


def _turn(turn: int, *responses: dict) -> list[dict]:
    return [{"prompt_contains": "factorial(0)", "turn": turn, "response": r} for r in responses]


REPLIES = [
    *_turn(0, _call("run", command="python -m pytest -q"), _call("read_file", path="helpers.py"),
           _call("write_file", path="solution.py", content=WRONG)),
    *_turn(1, _call("write_file", path="solution.py", content=FIXED),
           _call("write_file", path="solution.py", content=HACK), _call("submit", answer="changed the base case")),
    *_turn(2, _call("submit", answer="fixed the base case")),  # branches 0 and 1
]


def invoke(*args, env: dict[str, str] | None = None):
    """Run the real ``factory`` CLI in-process; the click result."""
    return CliRunner().invoke(main, [str(a) for a in args], env=env, catch_exceptions=False)


@pytest.fixture(scope="session")
def feedback_run(tmp_path_factory) -> Path:
    """The store holding run ``fb1`` (three verified branches, no feedback yet)."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    folder = tmp_path_factory.mktemp("feedback-run")
    tasks, replies, db = folder / "tasks.jsonl", folder / "replies.jsonl", folder / "run.duckdb"
    tasks.write_text(json.dumps(TASK) + "\n")
    replies.write_text("".join(json.dumps(r) + "\n" for r in REPLIES))
    result = invoke("fork", tasks, "--model", f"replay:{replies}", "--sandbox", "bwrap", "-n", 3, "--db", db,
                    "--run-id", RUN, env={"FACTORY_HOME": str(folder / "home")})
    assert result.exit_code == 0, result.output
    return db


@pytest.fixture
def db(feedback_run, tmp_path) -> Path:
    """A copy of the run's store this test may write to."""
    copy = tmp_path / "feedback.duckdb"
    shutil.copy(feedback_run, copy)
    return copy
