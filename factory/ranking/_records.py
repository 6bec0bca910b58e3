"""What the ranker and the power check read of a run: one record per branch, from the store."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from factory.store import Store
from factory.verifiers import opinion_verifiers

__all__ = ["BranchRecord", "PairwiseOutcome", "boundary_limited", "excluded_branches", "load_pairwise",
           "load_records", "merge_excluded", "records_of"]


@dataclass(frozen=True)
class BranchRecord:
    """A verified branch, as the ranker sees it.

    Attributes:
        task_id: The task.
        branch_index: The branch.
        objective_pass: Every latest non-judge verdict passed (None: no objective verdict).
        objective_score: Mean score of the latest non-judge verdicts (0 when none).
        judge_score: The latest judge verdict's score in [0, 1] (median/10), if judged.
        hack_detected: Any verifier caught tampering.
        fields: Branch columns (temperature, seed, model, status, ...) for splitting arms.
    """

    task_id: str
    branch_index: int
    objective_pass: bool | None
    objective_score: float
    judge_score: float | None
    hack_detected: bool
    fields: dict[str, Any] = field(default_factory=dict)
    #: The behaviour monitor saw a hack attempt (a pass stays a pass; the branch is never a winner).
    hack_suspected: bool = False
    #: A test failed only because something could not cross the isolation boundary (``details.boundary``).
    boundary_limited: bool = False


@dataclass(frozen=True)
class PairwiseOutcome:
    """One pairwise judge comparison within a task: ``a`` beat ``b`` (1), lost (0) or tied (0.5)."""

    task_id: str
    a: int
    b: int
    outcome: float


def load_records(store: Store, run_id: str) -> list[BranchRecord]:
    """One record per stored branch of ``run_id`` that is an outcome, using each verifier's latest verdict.

    Infrastructure failures (``infra_error``) are not outcomes: they are left out here, so out of every
    ranking, power check and pass rate built on these records; :func:`excluded_branches` counts them.
    """
    return records_of(store.branch_records(run_id, opinions=opinion_verifiers()))


def records_of(frame: Any) -> list[BranchRecord]:
    """The records of rows of :meth:`~factory.store.Store.branch_records` (a Polars frame), in their order."""
    return [
        BranchRecord(
            task_id=row["task_id"], branch_index=int(row["branch_index"]), objective_pass=row["objective_pass"],
            objective_score=float(row["objective_score"] or 0.0), judge_score=row["judge_score"],
            hack_detected=bool(row["hack"]), hack_suspected=bool(row["suspected"]),
            boundary_limited=bool(row["boundary_limited"]),
            fields={k: row[k] for k in ("temperature", "seed", "model", "status")},
        )
        for row in frame.iter_rows(named=True)
    ]


_EXCLUDED_RULE = ("branches whose provider gave up, whose sandbox failed or whose verifier crashed are not "
                  "outcomes of the policy: excluded from rankings, power checks, pass rates and exports, "
                  "and counted here")


def excluded_branches(store: Store, run_id: str,
                      keep: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
    """The branches of ``run_id`` left out of every rate as infrastructure failures: a count and the reasons.

    Args:
        store: The store.
        run_id: The run.
        keep: Counts only the excluded branches (rows of ``task_id, branch_index, temperature, seed, model,
            status, reason``) it accepts: those a comparison would have used (default: every one).
    """
    rows = [row for row in store.excluded_branch_rows(run_id).iter_rows(named=True) if keep is None or keep(row)]
    return {"infra_failures": len(rows), "reasons": sorted({row["reason"] for row in rows if row["reason"]}),
            "rule": _EXCLUDED_RULE}


def merge_excluded(per_run: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Several runs' :func:`excluded_branches` as one count, with each run's count under ``runs``."""
    return {"infra_failures": sum(int(e["infra_failures"]) for e in per_run.values()),
            "reasons": sorted({r for e in per_run.values() for r in e["reasons"]}), "rule": _EXCLUDED_RULE,
            "runs": {run_id: int(e["infra_failures"]) for run_id, e in per_run.items()}}


#: What :func:`boundary_limited` counts, said wherever the count is shown.
BOUNDARY_RULE = ("branches with a test that failed only because something could not cross the isolation "
                 "boundary (details.boundary of the tests verdict): the fail may be the boundary's, not the "
                 "policy's; `factory tasks check TASKS` shows which tasks differ isolated and bare")


def boundary_limited(records: Sequence[BranchRecord]) -> dict[str, Any]:
    """How many of ``records`` are boundary-limited, in all and per task (every task listed, zeros too)."""
    per_task: dict[str, int] = {}
    for record in records:
        per_task[record.task_id] = per_task.get(record.task_id, 0) + int(record.boundary_limited)
    return {"branches": sum(per_task.values()), "per_task": dict(sorted(per_task.items())), "rule": BOUNDARY_RULE}


def load_pairwise(store: Store, run_id: str) -> list[PairwiseOutcome]:
    """Pairwise judgments of a run, one outcome per comparison (both orders merged; disagreement is a tie)."""
    frame = store.pairwise_judgments(run_id)
    grouped: dict[tuple[str, int, int], list[str | None]] = {}
    for row in frame.iter_rows(named=True):
        key = (row["task_id"], int(row["branch_a"]), int(row["branch_b"]))
        grouped.setdefault(key, []).append(row["preference"] if row["status"] == "ok" else None)
    outcomes = []
    for (task_id, a, b), preferences in grouped.items():
        valid = [p for p in preferences if p in ("a", "b", "tie")]
        if not valid:
            continue
        agreed = valid[0] if len(set(valid)) == 1 and len(valid) == len(preferences) else "tie"
        outcomes.append(PairwiseOutcome(task_id, a, b, {"a": 1.0, "b": 0.0, "tie": 0.5}[agreed]))
    return outcomes
