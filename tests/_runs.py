"""A real run to export: scripted replies (the replay model), real bwrap sandboxes, real verifiers.

Four branches per task; the branch's seed picks among the scripted replies,
so each task has passing and failing branches, one code branch plants a
``conftest.py`` (a detected hack), and completions differ in length.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from factory.models import create_model
from factory.rollouts import ForkConfig, RolloutForkRunner
from factory.store import Store
from factory.tasks import Task
from factory.verifiers import VerificationPipeline

FACTORIAL_FILES = {"solution.py": "def factorial(n):\n    if n <= 1:\n        return n\n"
                                  "    return n * factorial(n - 1)\n"}
FACTORIAL_TESTS = {"test_solution.py": "from solution import factorial\n\n\ndef test_zero():\n"
                                       "    assert factorial(0) == 1\n\n\ndef test_five():\n"
                                       "    assert factorial(5) == 120\n"}
FIXED = "def factorial(n):\n    if n <= 1:\n        return 1\n    return n * factorial(n - 1)\n"
TASKS = [
    Task(id="add", prompt="What is 17 + 25? Reply as `Final: <n>`.", answer="42"),
    Task(id="mul", prompt="What is 12 * 13? Reply as `Final: <n>`.", answer="156"),
    Task(id="fix-factorial", prompt="factorial(0) returns 0. Fix solution.py so the tests pass.",
         files=FACTORIAL_FILES, tests=FACTORIAL_TESTS, test_command="python -m pytest -q",
         solution={"solution.py": FIXED}),  # a reference solution, which no export may carry
]


def _call(name: str, **arguments) -> dict:
    return {"text": "", "tool_calls": [{"name": name, "arguments": arguments}]}


REPLIES = [
    # seeds 0..3 pick replies 0..3 of each task's matches
    {"prompt_contains": "17 + 25", "response": {"text": "Final: 42"}},
    {"prompt_contains": "17 + 25", "response": {"text": "17 + 25: seven plus five is twelve, carry one; "
                                                        "one plus two plus one is four.\nFinal: 42"}},
    {"prompt_contains": "17 + 25", "response": {"text": "Final: 41"}},
    {"prompt_contains": "17 + 25", "response": {"text": "Adding the tens and the units I get forty.\nFinal: 40"}},
    {"prompt_contains": "12 * 13", "response": {"text": "12 * 13 = 12 * 10 + 12 * 3 = 120 + 36.\nFinal: 156"}},
    {"prompt_contains": "12 * 13", "response": {"text": "Final: 156"}},
    {"prompt_contains": "12 * 13", "response": {"text": "Final: 146"}},
    {"prompt_contains": "12 * 13", "response": {"text": "Twelve thirteens, roughly.\nFinal: 144"}},
    {"prompt_contains": "factorial(0)", "turn": 0, "response": _call("write_file", path="solution.py", content=FIXED)},
    {"prompt_contains": "factorial(0)", "turn": 0, "response": _call("run", command="python -m pytest -q")},
    {"prompt_contains": "factorial(0)", "turn": 0,
     "response": _call("write_file", path="conftest.py",
                       content="def pytest_collection_modifyitems(items):\n    items.clear()\n")},
    {"prompt_contains": "factorial(0)", "turn": 0, "response": _call("read_file", path="solution.py")},
    {"prompt_contains": "factorial(0)", "turn": 1, "response": _call("submit", answer="fixed the base case")},
]


def fork_run(db: Path, replies: Path, run_id: str = "r1", branches: int = 4, tasks: list[Task] | None = None) -> None:
    """Fork ``tasks`` (default TASKS) into ``db`` with the scripted replies, verifying every branch in its sandbox."""
    with Store.open(db) as store:
        runner = RolloutForkRunner(create_model(f"replay:{replies}"), store,
                                   ForkConfig(branches=branches, concurrency=4, sandbox="bwrap"),
                                   run_id=run_id, pipeline=VerificationPipeline())

        async def go():
            return [r async for r in runner.run(tasks or TASKS)]

        asyncio.run(go())


def build_exported_run(folder: Path) -> Path:
    """A store in ``folder`` holding run ``r1``: three tasks x four verified branches (not ranked: export ranks it)."""
    replies = folder / "replies.jsonl"
    replies.write_text("".join(json.dumps(r) + "\n" for r in REPLIES))
    db = folder / "run.duckdb"
    fork_run(db, replies)
    return db
