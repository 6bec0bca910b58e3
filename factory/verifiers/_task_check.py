"""``factory tasks check``: does each task's reference solution get the same verdict isolated and bare?

A test the isolation boundary cannot carry fails an honest solution under the
default isolation and passes it bare (pytest and the solution in one
process). Such a task poisons labels silently: its correct branches become
the rejected side of DPO pairs. So before the first fork, each task's
reference solution is verified twice with the real ``tests`` verifier, in
real sandboxes:

- **isolated**: ``test_isolation: "process"``, the default a fork uses;
- **bare**: ``test_isolation: "in-process"``, pytest and the solution in one
  guarded process.

A task is reported when the two verdicts differ, or when the tests that
failed differ (with the tests named, and for an isolated failure the
boundary limit that caused it: ``details.boundary``), and when the reference
solution fails either way (the task or its solution is wrong). An
infrastructure failure of either run is reported as such, never as a
difference.

The reference solution is the task's own ``solution`` field (laid over its
``files``; never shown to the agent), or a line of a solutions file (JSONL,
``{"id": ..., "files": {path: text}}``), which takes precedence.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from factory.errors import TaskFileError, TaskProblem
from factory.sandbox import SANDBOXES, SandboxLimits
from factory.tasks import Task, decode_text, read_file_bytes
from factory.verifiers._base import BranchOutput, Criterion, Verdict, VerifyContext, run_verifier
from factory.verifiers._tests import TestsVerifier

__all__ = ["CHECK_KINDS", "CheckedRun", "TaskCheck", "TestDifference", "check_task", "check_tasks",
           "load_solutions"]

#: What :class:`TaskCheck` ``kind`` means, in the words the CLI prints.
CHECK_KINDS = {
    "same": "the reference solution passes isolated and bare",
    "differs": "isolated and bare verdicts differ",
    "fails": "the reference solution fails either way",
    "error": "a verification could not run (infrastructure)",
    "no_solution": "no reference solution",
    "no_tests": "no tests to run",
}


@dataclass(frozen=True)
class CheckedRun:
    """One verification of a reference solution (isolated or bare), as the check reports it.

    Attributes:
        status: The verdict's status (``pass``, ``fail``, ``error``).
        passed: Tests passed.
        total: Tests expected to pass.
        failed: Failed tests (pytest node ids; at most the verifier's first 20).
        hack_detected: The verifier saw tampering (an honest solution flagged as a cheat).
        hacks: The tampering codes.
        boundary: Tests that failed only because something could not cross the boundary.
        reason: Why it did not report, or what crashed, when it did not.
    """

    status: str
    passed: int
    total: int
    failed: list[str] = field(default_factory=list)
    hack_detected: bool = False
    hacks: list[str] = field(default_factory=list)
    boundary: list[dict[str, str]] = field(default_factory=list)
    reason: str | None = None

    @classmethod
    def from_verdict(cls, verdict: Verdict) -> CheckedRun:
        details = verdict.details
        reason = details.get("reason") or details.get("exception") or details.get("code")
        return cls(status=verdict.status, passed=int(details.get("passed") or 0),
                   total=int(details.get("total") or 0), failed=[str(t) for t in details.get("failed") or []],
                   hack_detected=bool(details.get("hack_detected")),
                   hacks=sorted({str(h.get("code")) for h in details.get("hacks") or []}),
                   boundary=[dict(b) for b in details.get("boundary") or []],
                   reason=None if reason is None else str(reason)[:300])

    @property
    def truncated(self) -> bool:
        """More tests failed than the verdict names."""
        return self.total - self.passed > len(self.failed)

    def describe(self) -> str:
        """``pass (5/5)``, ``fail (3/5)``, ``fail (hack: collection_changed)``, ``error (...)``."""
        if self.status == "error":
            return f"error ({self.reason or 'no reason given'})"
        counts = f"{self.passed}/{self.total}"
        if self.hack_detected:
            return f"{self.status} ({counts}, flagged as a hack: {', '.join(self.hacks)})"
        return f"{self.status} ({counts})"


@dataclass(frozen=True)
class TestDifference:
    """A test whose outcome differs isolated and bare.

    Attributes:
        test: The test (pytest node id as the isolated run names it, else the bare run's).
        isolated: ``passed`` or ``failed``.
        bare: ``passed`` or ``failed``.
        why: For an isolated failure, what could not cross the boundary, when that is known.
    """

    __test__ = False  # not a pytest test class, whatever its name
    test: str
    isolated: str
    bare: str
    why: str | None = None


@dataclass(frozen=True)
class TaskCheck:
    """A task's reference solution, verified isolated and bare.

    Attributes:
        task_id: The task.
        kind: ``same``, ``differs``, ``fails``, ``error``, ``no_solution`` or ``no_tests``
            (see :data:`CHECK_KINDS`).
        isolated: The isolated run (None when skipped).
        bare: The bare run (None when skipped).
        differences: Tests whose outcome differs (from the failures each verdict names).
        solution_source: ``task`` (its ``solution`` field) or the solutions file's name.
        starter: The task's starter files alone, verified isolated (only when asked for): a task whose
            starter already passes gives an agent the reward for doing nothing.
    """

    task_id: str
    kind: Literal["same", "differs", "fails", "error", "no_solution", "no_tests"]
    isolated: CheckedRun | None = None
    bare: CheckedRun | None = None
    differences: list[TestDifference] = field(default_factory=list)
    solution_source: str | None = None
    starter: CheckedRun | None = None

    @property
    def starter_passes(self) -> bool:
        """The starter files alone pass the tests."""
        return self.starter is not None and self.starter.status == "pass"

    @property
    def problem(self) -> bool:
        """The task needs its author's attention (a difference, a failing reference, a run that broke, or a
        starter that already passes)."""
        return self.kind in ("differs", "fails", "error") or self.starter_passes or (
            self.starter is not None and self.starter.status == "error")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _comparable(node: str) -> str:
    """A test id in one spelling for both runs: pytest's ``a/b.py::C::t`` and JUnit's ``a.b.C::t`` agree."""
    if "::" not in node:
        return node.removesuffix(".py").replace("/", ".")
    path, *rest = node.split("::")
    if path.endswith(".py"):
        path = path[:-3].replace("/", ".")
    return ".".join([path, *rest[:-1]]) + "::" + rest[-1]


def _differences(isolated: CheckedRun, bare: CheckedRun) -> list[TestDifference]:
    why = {_comparable(b["test"]): b["what"] for b in isolated.boundary}
    failed_isolated = {_comparable(t): t for t in isolated.failed}
    failed_bare = {_comparable(t): t for t in bare.failed}
    differences = []
    for key in sorted(set(failed_isolated) | set(failed_bare)):
        if key in failed_isolated and key in failed_bare:
            continue
        # A test named on one side only passed on the other, unless that side's list was cut off.
        if key in failed_isolated and not bare.truncated:
            differences.append(TestDifference(failed_isolated[key], "failed", "passed", why.get(key)))
        elif key in failed_bare and not isolated.truncated:
            differences.append(TestDifference(failed_bare[key], "passed", "failed"))
    return differences


def _kind(isolated: CheckedRun, bare: CheckedRun, differences: list[TestDifference]) -> str:
    if "error" in (isolated.status, bare.status):
        return "error"
    if (isolated.status != bare.status or differences or isolated.hack_detected != bare.hack_detected
            or (isolated.passed, isolated.total) != (bare.passed, bare.total)):
        return "differs"
    return "same" if isolated.status == "pass" else "fails"


async def _verify(task: Task, workspace: Mapping[str, str], isolation: str, sandbox: str,
                  timeout_s: float | None) -> CheckedRun:
    variant = task.model_copy(update={"test_isolation": isolation})
    # By default the limits a fork's tests verifier runs under (its ceiling and inactivity window), so a suite the
    # check passes is not cut off in a fork, and the reverse.
    verifier = (TestsVerifier(reference_sandbox=sandbox) if timeout_s is None else
                TestsVerifier(timeout_s=timeout_s, reference_sandbox=sandbox,
                              limits=SandboxLimits(timeout_s=timeout_s)))
    criterion = Criterion("tests", "the task's tests pass, untampered", "tests", variant.effective_test_command)
    context = VerifyContext(variant, BranchOutput("reference solution"), criterion, None, workspace=workspace)
    return CheckedRun.from_verdict(await run_verifier(verifier, context))


async def check_task(task: Task, solution: Mapping[str, str] | None = None, *, sandbox: str = "bwrap",
                     timeout_s: float | None = None, source: str = "task", starter: bool = False) -> TaskCheck:
    """Verify one task's reference solution isolated and bare, and compare.

    Args:
        task: The task.
        solution: The reference solution's files (default: the task's ``solution`` field).
        sandbox: Sandbox backend both verifications use.
        timeout_s: Ceiling of each test run (None: the tests verifier's own, as in a fork).
        source: Where the solution came from, for the report.
        starter: Also verify the starter files alone (isolated, as a fork would), which must fail.
    """
    files = dict(task.solution if solution is None else solution)
    if not task.all_tests:
        return TaskCheck(task.id, "no_tests")
    if not files:
        alone = await _verify(task, {**task.files, **task.tests}, "process", sandbox, timeout_s) if starter else None
        return TaskCheck(task.id, "no_solution", starter=alone)
    # The final workspace an agent that wrote the reference solution would leave: visible tests untouched.
    workspace = {**task.files, **files, **task.tests}
    runs = [_verify(task, workspace, "process", sandbox, timeout_s),
            _verify(task, workspace, "in-process", sandbox, timeout_s)]
    if starter:
        runs.append(_verify(task, {**task.files, **task.tests}, "process", sandbox, timeout_s))
    isolated, bare, *starter_run = await asyncio.gather(*runs)
    differences = _differences(isolated, bare)
    kind = _kind(isolated, bare, differences)
    return TaskCheck(task.id, kind, isolated, bare, differences, source,  # type: ignore[arg-type]
                     starter_run[0] if starter_run else None)


async def check_tasks(tasks: Iterable[Task], solutions: Mapping[str, Mapping[str, str]] | None = None, *,
                      sandbox: str = "bwrap", timeout_s: float | None = None, solutions_source: str = "--solutions",
                      jobs: int = 1, starter: bool = False,
                      on_done: Callable[[TaskCheck], None] | None = None) -> list[TaskCheck]:
    """:func:`check_task` for every task, in the tasks' order.

    Args:
        tasks: The tasks.
        solutions: Reference solutions by task id (a solutions file); they take precedence over
            the tasks' own ``solution`` fields.
        sandbox: Sandbox backend.
        timeout_s: Ceiling of each test run (None: the tests verifier's own, as in a fork).
        solutions_source: How to name ``solutions`` in the report (the file's path).
        jobs: Tasks checked at once.
        starter: Also verify each task's starter files alone (see :func:`check_task`).
        on_done: Called with each task's check as it finishes (a progress bar).

    Raises:
        ConfigError: No sandbox backend of that name.
        SandboxUnavailableError: The backend cannot start sandboxes here (before any task runs).
    """
    tasks = list(tasks)
    backend = SANDBOXES.get(sandbox)
    preflight = getattr(backend, "preflight", None)
    if preflight is not None:
        preflight({task.image for task in tasks})
    solutions = solutions or {}
    gate = asyncio.Semaphore(max(1, jobs))

    async def one(task: Task) -> TaskCheck:
        async with gate:
            if task.id in solutions:
                result = await check_task(task, solutions[task.id], sandbox=sandbox, timeout_s=timeout_s,
                                          source=solutions_source, starter=starter)
            else:
                result = await check_task(task, sandbox=sandbox, timeout_s=timeout_s, starter=starter)
        if on_done is not None:
            on_done(result)
        return result

    return list(await asyncio.gather(*(one(task) for task in tasks)))


_SOLUTION_KEYS = ("id", "files")


def load_solutions(path: str | Path, tasks: Sequence[Task]) -> dict[str, dict[str, str]]:
    """Read a solutions file: JSONL, one ``{"id": TASK_ID, "files": {path: text}}`` a line.

    Each line is checked against its task as the task's own ``solution`` field would be
    (relative paths inside the workspace, never a test path).

    Returns:
        Task id -> the solution's files.

    Raises:
        TaskFileError: With every problem found, each naming the file, line and field.
    """
    name = str(path)
    text = decode_text(read_file_bytes(path), name)
    by_id = {task.id: task for task in tasks}
    solutions: dict[str, dict[str, str]] = {}
    first_line: dict[str, int] = {}
    problems: list[TaskProblem] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        problem = _check_line(name, number, line, by_id, first_line, solutions)
        if problem is not None:
            problems.append(problem)
    if not solutions and not problems:
        problems.append(TaskProblem(name, None, None, "no solutions in file"))
    if problems:
        raise TaskFileError(problems)
    return solutions


def _check_line(name: str, number: int, line: str, by_id: Mapping[str, Task], first_line: dict[str, int],
                solutions: dict[str, dict[str, str]]) -> TaskProblem | None:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as exc:
        return TaskProblem(name, number, None, f"invalid JSON: {exc.msg} (column {exc.colno})")
    if not isinstance(entry, dict):
        return TaskProblem(name, number, None, f"expected an object with {' and '.join(_SOLUTION_KEYS)}")
    unknown = sorted(set(entry) - set(_SOLUTION_KEYS))
    if unknown:
        return TaskProblem(name, number, unknown[0], f"unknown key (allowed: {', '.join(_SOLUTION_KEYS)})")
    for key in _SOLUTION_KEYS:
        if key not in entry:
            return TaskProblem(name, number, key, "required field is missing")
    task_id, files = entry["id"], entry["files"]
    if not isinstance(task_id, str):
        return TaskProblem(name, number, "id", "expected a string")
    if task_id not in by_id:
        return TaskProblem(name, number, "id", f"no task {task_id!r} in the task file")
    if task_id in first_line:
        return TaskProblem(name, number, "id", f"duplicate id {task_id!r} (first on line {first_line[task_id]})")
    if not isinstance(files, dict) or not files:
        return TaskProblem(name, number, "files", "expected an object of at least one path -> text")
    for path, content in files.items():
        if not isinstance(content, str):
            return TaskProblem(name, number, f"files.{path}", "expected a string")
    task = by_id[task_id]
    try:  # the same rules as the task's own solution field
        checked = Task.model_validate({"id": task.id, "prompt": task.prompt, "files": task.files, "tests": task.tests,
                                       "hidden_tests": task.hidden_tests, "solution": files})
    except ValidationError as exc:
        return TaskProblem(name, number, "files", str(exc.errors()[0]["msg"]).removeprefix("Value error, "))
    first_line[task_id] = number
    solutions[task_id] = dict(checked.solution)
    return None
