"""``VerificationPipeline``: the verifiers that apply to a branch, run totally, stored.

The pipeline maps each of a task's criteria to a registered verifier (the
judge only when a judge model is configured), runs sandbox verifiers in the
branch's still-open sandbox, and returns every verdict. Storing writes each
verdict keyed by (run, task, branch, verifier, version): re-verifying with a
new verifier version adds rows and keeps the old ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from factory.store import Store, utc_now
from factory.tasks import Task
from factory.verifiers._base import (
    BranchOutput,
    Criterion,
    Verdict,
    Verifier,
    VerifyContext,
    create_verifier,
    criteria_for,
    run_verifier,
)

if TYPE_CHECKING:
    from factory.sandbox import Sandbox

__all__ = ["VerificationPipeline", "objective_pass", "verdict_events"]


def objective_pass(verdicts: Sequence[Verdict]) -> bool | None:
    """A branch's objective outcome: every non-judge verdict passes (None: no objective verdict)."""
    objective = [v for v in verdicts if v.verifier != "judge"]
    if not objective:
        return None
    return all(v.ok for v in objective)


def verdict_events(verdicts: Sequence[Verdict], start_seq: int) -> list[dict[str, Any]]:
    """Events recording verdicts (and each judge call), numbered from ``start_seq``."""
    events = []
    for verdict in verdicts:
        for sample in verdict.details.get("samples") or ():
            events.append({"kind": "judge_call", "payload": {"verifier": verdict.verifier,
                                                             "version": verdict.version, **sample}})
        events.append({"kind": "verdict", "payload": {
            "verifier": verdict.verifier, "version": verdict.version, "status": verdict.status,
            "score": verdict.score, "hack_detected": verdict.hack_detected}})
    now = utc_now()
    return [{"seq": start_seq + i, "ts": now, **event} for i, event in enumerate(events)]


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
        """The instance used for ``name`` (None for the judge when no judge model is set)."""
        if name not in self.verifiers:
            if name == "judge":
                return None
            self.verifiers[name] = create_verifier(name)
        return self.verifiers[name]

    def criteria(self, task: Task) -> list[Criterion]:
        """The criteria this pipeline checks for ``task``."""
        chosen = criteria_for(task)
        if self.only is not None:
            chosen = [c for c in chosen if c.verify_method in self.only]
        return [c for c in chosen if self.verifier(c.verify_method) is not None]

    def needs_sandbox(self, task: Task) -> bool:
        """Whether any applicable verifier runs inside the branch's sandbox."""
        return any(getattr(self.verifier(c.verify_method), "needs_sandbox", False) for c in self.criteria(task))

    async def verify(self, task: Task, branch: BranchOutput, sandbox: Sandbox | None) -> list[Verdict]:
        """Every applicable verdict for one branch; never raises."""
        verdicts = []
        for criterion in self.criteria(task):
            verifier = self.verifier(criterion.verify_method)
            assert verifier is not None
            verdicts.append(await run_verifier(verifier, VerifyContext(task, branch, criterion, sandbox)))
        return verdicts

    async def aclose(self) -> None:
        """Close the models of verifiers that hold one (the judge)."""
        for verifier in self.verifiers.values():
            model = getattr(verifier, "model", None)
            if model is not None and hasattr(model, "aclose"):
                await model.aclose()

    @staticmethod
    def store_pairwise(store: Store, run_id: str, task_id: str, branch_a: int, branch_b: int,
                       judgment: Any) -> None:
        """Write both orders of one pairwise comparison (a ``PairwiseJudgment``) as judgments rows."""
        store.write_judgments([
            {"run_id": run_id, "task_id": task_id, "judge": str(call.get("model")), "kind": "pairwise",
             "branch_a": branch_a, "branch_b": branch_b, "sample_index": int(call.get("sample_index", 0)),
             "swapped": bool(call.get("swapped")), "score": None, "preference": call.get("preference"),
             "status": str(call.get("status")), "raw": call.get("raw"), "created_at": utc_now()}
            for call in judgment.calls])

    @staticmethod
    def store(store: Store, run_id: str, task_id: str, branch_index: int, verdicts: Sequence[Verdict]) -> None:
        """Write verdicts and the judge samples they carry."""
        store.write_verdicts([v.row(run_id, task_id, branch_index) for v in verdicts])
        judgments = []
        for verdict in verdicts:
            for sample in verdict.details.get("samples") or ():
                judgments.append(_judgment_row(run_id, task_id, branch_index, verdict, sample))
        if judgments:
            store.write_judgments(judgments)


def _judgment_row(run_id: str, task_id: str, branch_index: int, verdict: Verdict,
                  sample: Mapping[str, Any]) -> dict[str, Any]:
    return {"run_id": run_id, "task_id": task_id, "judge": str(sample.get("model") or verdict.details.get(
        "judge_model", "")), "kind": "scalar", "branch_a": branch_index, "branch_b": None,
        "sample_index": int(sample.get("sample_index", 0)), "swapped": False, "score": sample.get("score"),
        "preference": None, "status": str(sample.get("status")), "raw": sample.get("raw"), "created_at": utc_now()}
