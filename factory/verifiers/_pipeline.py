"""``VerificationPipeline``: the verifiers that apply to a branch, run totally, stored.

The pipeline maps each of a task's criteria to a registered verifier (the
judge only when a judge model is configured), runs sandbox verifiers in the
branch's still-open sandbox, and returns every verdict. Storing writes each
verdict keyed by (run, task, branch, verifier, version): re-verifying with a
new verifier version adds rows and keeps the old ones.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from factory.sandbox import Sandbox, SandboxLimits, create_sandbox, files_spec, workspace_spec
from factory.store import (
    BranchEvent,
    JudgeCallEvent,
    JudgeSample,
    PairwiseCall,
    Store,
    VerdictEvent,
    WorkspaceSnapshot,
    utc_now,
)
from factory.tasks import Task
from factory.verifiers._base import (
    VERIFIERS,
    BranchOutput,
    Criterion,
    Verdict,
    Verifier,
    VerifyContext,
    create_verifier,
    criteria_for,
    run_verifier,
)

__all__ = ["VerificationPipeline", "is_objective", "objective_pass", "opinion_verifiers", "verdict_events",
           "verify_in_fresh_sandbox"]


def is_objective(verifier: str) -> bool:
    """Whether verdicts of the verifier registered as ``verifier`` are objective (its :attr:`Verifier.objective`).

    A name that nothing registers here (a verdict a plugin made, read back
    without it) counts as objective, as every verifier but an opinion does.
    """
    return verifier not in VERIFIERS or bool(getattr(VERIFIERS.get(verifier), "objective", True))


def opinion_verifiers() -> list[str]:
    """The registered verifiers whose verdicts are opinions, not checks (``objective`` false: the LLM judge).

    What the store's SQL leaves out of a branch's objective outcome, so that the class attribute stays
    the one definition of "objective" in SQL too.
    """
    return [name for name in VERIFIERS.names() if not is_objective(name)]


def objective_pass(verdicts: Sequence[Verdict]) -> bool | None:
    """A branch's objective outcome: every objective verdict passes (None: no objective verdict)."""
    objective = [v for v in verdicts if is_objective(v.verifier)]
    if not objective:
        return None
    return all(v.ok for v in objective)


def verdict_events(verdicts: Sequence[Verdict], start_seq: int) -> list[BranchEvent]:
    """Events recording verdicts (and each judge call), numbered from ``start_seq``."""
    now = utc_now()
    events: list[BranchEvent] = []
    for verdict in verdicts:
        for sample in verdict.judge_samples:
            events.append(JudgeCallEvent(seq=start_seq + len(events), ts=now, verifier=verdict.verifier,
                                         version=verdict.version, **sample.model_dump(exclude={"schema_version"})))
        events.append(VerdictEvent(seq=start_seq + len(events), ts=now, verifier=verdict.verifier,
                                   version=verdict.version, status=verdict.status, score=verdict.score,
                                   hack_detected=verdict.hack_detected))
    return events


@dataclass
class VerificationPipeline:
    """Runs the verifiers that apply to a branch.

    Attributes:
        verifiers: Name -> verifier instance (defaults are created on demand).
        only: Restrict to these verifier names.
    """

    verifiers: dict[str, Verifier] = field(default_factory=dict)
    only: frozenset[str] | None = None

    def verifier(self, name: str) -> Verifier | None:
        """The instance used for ``name`` (None for an opinion, the judge, when none is configured)."""
        if name not in self.verifiers:
            # An opinion (the judge), or a check that asks a model (the browser verifier), needs its model,
            # which only a caller can give.
            if not is_objective(name) or getattr(VERIFIERS.get(name), "needs_model", False):
                return None
            self.verifiers[name] = create_verifier(name)
        return self.verifiers[name]

    def criteria(self, task: Task) -> list[Criterion]:
        """The criteria this pipeline checks for ``task``."""
        chosen = criteria_for(task)
        if self.only is not None:
            chosen = [c for c in chosen if c.verify_method in self.only]
        return [c for c in chosen if self.verifier(c.verify_method) is not None]

    def needs_sandbox(self, task: Task, *, have_files: bool = False) -> bool:
        """Whether any applicable verifier runs inside a sandbox holding the branch's workspace.

        Args:
            task: The task.
            have_files: The branch's final files are at hand (a verifier that builds
                sandboxes of its own from them, as the isolated tests run does, then needs none).
        """
        for criterion in self.criteria(task):
            verifier = self.verifier(criterion.verify_method)
            wants = getattr(verifier, "sandbox_needed", None)
            if wants(task, have_files) if wants is not None else getattr(verifier, "needs_sandbox", False):
                return True
        return False

    def sandbox_images(self, tasks: Iterable[Task]) -> dict[str, set[str | None]]:
        """Backend -> the images the applicable verifiers start their own sandboxes from for ``tasks`` (a
        verifier says so with a ``sandbox_images(task)`` method; the tests verifier uses the task's image on the
        branch's backend, which the fork checks anyway)."""
        wanted: dict[str, set[str | None]] = {}
        for task in tasks:
            for criterion in self.criteria(task):
                images = getattr(self.verifier(criterion.verify_method), "sandbox_images", None)
                for backend, image in images(task) if images is not None else ():
                    wanted.setdefault(backend, set()).add(image)
        return wanted

    async def verify(self, task: Task, branch: BranchOutput, sandbox: Sandbox | None,
                     workspace: Mapping[str, str | bytes] | None = None) -> list[Verdict]:
        """Every applicable verdict for one branch; never raises.

        Args:
            task: The task.
            branch: What the verifiers look at of the branch.
            sandbox: A sandbox holding the branch's workspace, where one is needed.
            workspace: The branch's final files, where the caller collected them.
        """
        verdicts = []
        for criterion in self.criteria(task):
            verifier = self.verifier(criterion.verify_method)
            assert verifier is not None
            verdicts.append(await run_verifier(verifier, VerifyContext(task, branch, criterion, sandbox, workspace)))
        return verdicts

    async def aclose(self) -> None:
        """Close the models of verifiers that hold one (the judge), and verifiers' own resources (warm runners)."""
        for verifier in self.verifiers.values():
            model = getattr(verifier, "model", None)
            if model is not None and hasattr(model, "aclose"):
                await model.aclose()
            if hasattr(verifier, "aclose"):
                await verifier.aclose()

    @staticmethod
    def store_pairwise(store: Store, run_id: str, task_id: str, branch_a: int, branch_b: int,
                       judgment: Any) -> None:
        """Write both orders of one pairwise comparison (a ``PairwiseJudgment``) as judgments rows."""
        calls: list[PairwiseCall] = judgment.calls
        store.write_judgments([
            {"run_id": run_id, "task_id": task_id, "judge": call.model, "kind": "pairwise",
             "branch_a": branch_a, "branch_b": branch_b, "sample_index": call.sample_index,
             "swapped": call.swapped, "score": None, "preference": call.preference,
             "status": call.status, "raw": call.raw, "created_at": utc_now()}
            for call in calls])

    @staticmethod
    def store(store: Store, run_id: str, task_id: str, branch_index: int, verdicts: Sequence[Verdict]) -> None:
        """Write verdicts and the judge samples they carry."""
        store.write_verdicts([v.row(run_id, task_id, branch_index) for v in verdicts])
        judgments = []
        for verdict in verdicts:
            for sample in verdict.judge_samples:
                judgments.append(_judgment_row(run_id, task_id, branch_index, verdict, sample))
        if judgments:
            store.write_judgments(judgments)


async def verify_in_fresh_sandbox(
    pipeline: VerificationPipeline,
    task: Task,
    output: BranchOutput,
    sandbox_name: str,
    workspace: WorkspaceSnapshot | None = None,
    *,
    replay: Callable[[Sandbox], Awaitable[BranchOutput | None]] | None = None,
    files: Mapping[str, bytes] | None = None,
    limits: SandboxLimits | None = None,
) -> list[Verdict]:
    """Verify a branch outside of its own run: in a new sandbox rebuilt from the task and the branch's changes.

    The one definition of verifying after the fact (re-verifying a stored
    branch, a golden case, a GRPO completion): the sandbox holds the task's
    files and read-only tests with ``workspace`` applied on top. No sandbox
    starts when no applicable verifier runs code and there is nothing to replay.

    Args:
        pipeline: The verifiers.
        task: The task the branch answered.
        output: What the verifiers look at of the branch.
        sandbox_name: The sandbox backend.
        workspace: The branch's changes (a snapshot), None for the task's own files.
        replay: What the branch did, carried out in the sandbox before verifying (its commands, its tool
            calls); it may return the output to verify instead of ``output`` (an answer it submitted).
        files: The branch's whole final workspace, collected before its sandbox closed (the fork
            runner has it; a stored branch has only its snapshot). The sandbox then holds these files
            with every test file, hidden ones too, restored read-only from the task, and the
            verifiers see the files as the branch left them (tamper checks included).
        limits: Limits of the new sandbox (default ones if None).

    Returns:
        Every applicable verdict (never raises for a verifier's failure; see :meth:`VerificationPipeline.verify`).
    """
    if replay is None and not pipeline.needs_sandbox(task, have_files=files is not None):
        return await pipeline.verify(task, output, None, files)
    spec = workspace_spec(task, workspace, limits) if files is None else files_spec(task, files, limits)
    async with create_sandbox(sandbox_name, spec) as sandbox:
        if replay is not None:
            output = await replay(sandbox) or output
        return await pipeline.verify(task, output, sandbox, files)


def _judgment_row(run_id: str, task_id: str, branch_index: int, verdict: Verdict,
                  sample: JudgeSample) -> dict[str, Any]:
    return {"run_id": run_id, "task_id": task_id, "judge": sample.model or str(verdict.details.get(
        "judge_model", "")), "kind": "scalar", "branch_a": branch_index, "branch_b": None,
        "sample_index": sample.sample_index, "swapped": False, "score": sample.score,
        "preference": None, "status": sample.status, "raw": sample.raw, "created_at": utc_now()}
