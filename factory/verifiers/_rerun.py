"""Re-verifying stored branches and running golden sets, outside of a fork.

Both rebuild each branch's final workspace in a fresh sandbox from a change
set (the stored snapshot, or a golden case's files) and run the pipeline on
it. Verdicts of a new verifier version are added beside the old ones.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from factory.errors import ConfigError, TaskFileError, TaskProblem
from factory.sandbox import Sandbox
from factory.store import Store, WorkspaceSnapshot
from factory.tasks import Task
from factory.verifiers._base import BranchOutput, Verdict
from factory.verifiers._pipeline import VerificationPipeline, objective_pass, verify_in_fresh_sandbox

__all__ = ["GoldenCase", "GoldenReport", "load_golden", "run_golden", "verify_stored_run"]


async def verify_stored_run(store: Store, run_id: str, pipeline: VerificationPipeline, sandbox_name: str,
                            on_branch: Callable[[str, int, list[Verdict]], None] | None = None) -> dict[str, Any]:
    """Verify every stored branch of a run again and store the verdicts.

    Returns:
        Counts: branches verified, verdicts written, objective passes.
    """
    run = store.run(run_id)
    if run is None:
        raise ConfigError(f"no run {run_id} in {store.path}")
    tasks = {row["task_id"]: Task.model_validate(json.loads(row["spec"]))
             for row in store.tasks(run_id).iter_rows(named=True)}
    written = passes = verified = 0
    for row in store.branches(run_id).iter_rows(named=True):
        task = tasks[row["task_id"]]
        output = BranchOutput(row["final_answer"], json.loads(row["trajectory"] or "[]"), row["status"])
        workspace = WorkspaceSnapshot.from_stored(row["workspace"]) if row.get("workspace") else None
        verdicts = await verify_in_fresh_sandbox(pipeline, task, output, sandbox_name, workspace)
        VerificationPipeline.store(store, run_id, row["task_id"], row["branch_index"], verdicts)
        written += len(verdicts)
        passed = objective_pass(verdicts)
        if passed is not None:
            verified += 1
            passes += passed
        if on_branch is not None:
            on_branch(row["task_id"], row["branch_index"], verdicts)
    return {"run_id": run_id, "branches": store.branches(run_id).height, "verdicts": written,
            "verified": verified, "passed": passes}


@dataclass(frozen=True)
class GoldenCase:
    """A known answer to a verifier's question: should this output pass?

    Attributes:
        id: The case's id.
        task: The task.
        final_answer: The branch's answer.
        workspace: Files the branch left, as a snapshot (changed files, deleted ones).
        line: Where the case is in its file.
        commands: Shell commands the branch ran, replayed in the sandbox before verifying.
    """

    id: str
    task: Task
    final_answer: str | None
    workspace: WorkspaceSnapshot
    line: int
    commands: tuple[str, ...] = ()


def load_golden(path: Path) -> list[GoldenCase]:
    """Read a golden set (JSONL: ``{id, task, final_answer?, files?, deleted?, commands?}``).

    Raises:
        TaskFileError: With file, line and field of every problem.
    """
    problems: list[TaskProblem] = []
    cases = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TaskFileError([TaskProblem(str(path), None, None, f"cannot read file: {exc.strerror}")]) from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            task = Task.model_validate(data["task"])
            workspace = WorkspaceSnapshot(files=data.get("files") or {}, deleted=data.get("deleted") or [])
            cases.append(GoldenCase(str(data["id"]), task, data.get("final_answer"), workspace, number,
                                    tuple(data.get("commands") or ())))
        except KeyError as exc:
            problems.append(TaskProblem(str(path), number, str(exc.args[0]), "required field is missing"))
        except (ValueError, TypeError) as exc:
            problems.append(TaskProblem(str(path), number, None, " ".join(str(exc).split())[:300]))
    if problems:
        raise TaskFileError(problems)
    return cases


@dataclass
class GoldenReport:
    """False negatives (correct cases that did not pass) and false positives (exploits that passed)."""

    verifier: str
    correct: int = 0
    exploits: int = 0
    false_negatives: list[dict[str, Any]] = field(default_factory=list)
    false_positives: list[dict[str, Any]] = field(default_factory=list)
    caught: list[dict[str, Any]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.false_negatives and not self.false_positives

    def to_dict(self) -> dict[str, Any]:
        return {"verifier": self.verifier, "correct": self.correct, "exploits": self.exploits,
                "false_negatives": self.false_negatives, "false_positives": self.false_positives,
                "caught": self.caught, "clean": self.clean}


async def run_golden(verifier_name: str, pipeline: VerificationPipeline, correct: list[GoldenCase],
                     exploits: list[GoldenCase], sandbox_name: str) -> GoldenReport:
    """Run one verifier over the golden sets."""
    report = GoldenReport(verifier_name, len(correct), len(exploits))
    restricted = VerificationPipeline(pipeline.verifiers, only=frozenset({verifier_name}))
    for expect_pass, cases in ((True, correct), (False, exploits)):
        for case in cases:
            # The commands only matter to a verifier that looks inside the sandbox.
            replay = _commands(case.commands) if case.commands and restricted.needs_sandbox(case.task) else None
            verdicts = await verify_in_fresh_sandbox(restricted, case.task, BranchOutput(case.final_answer),
                                                     sandbox_name, case.workspace, replay=replay)
            mine = [v for v in verdicts if v.verifier == verifier_name]
            verdict = mine[0] if mine else None
            entry = {"id": case.id, "line": case.line, "status": verdict.status if verdict else "not_applicable",
                     "details": verdict.details if verdict else {}}
            passed = bool(verdict and verdict.ok)
            if expect_pass and not passed:
                report.false_negatives.append(entry)
            elif not expect_pass and passed:
                report.false_positives.append(entry)
            elif not expect_pass:
                report.caught.append({"id": case.id, "status": entry["status"],
                                      "why": _why(verdict) if verdict else "not applicable"})
    return report


def _commands(commands: tuple[str, ...]) -> Callable[[Sandbox], Awaitable[None]]:
    """Replays a golden case's shell commands (what its branch ran during its turns)."""

    async def replay(sandbox: Sandbox) -> None:
        for command in commands:
            await sandbox.exec(command)

    return replay


def _why(verdict: Verdict) -> str:
    hacks = verdict.details.get("hacks")
    if hacks:
        return ", ".join(sorted({h["code"] for h in hacks}))
    return str(verdict.details.get("code") or verdict.details.get("reason") or verdict.status)
