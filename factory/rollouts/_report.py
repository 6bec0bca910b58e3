"""The end-of-run summary a fork prints (and ``--json`` emits)."""

from __future__ import annotations

from typing import Any

from factory.store import Store
from factory.verifiers import opinion_verifiers

__all__ = ["fork_summary"]


def fork_summary(store: Store, run_id: str, elapsed_s: float | None = None) -> dict[str, Any]:
    """Per-task and total branch counts, objective passes, detected hacks, tokens and cost of a run.

    A branch passes objectively when its latest verdict of every non-judge
    verifier is ``pass``. ``boundary_limited`` counts the branches (per task
    and in all) with a test that failed only because something could not
    cross the isolation boundary (``details.boundary``): a fail that may be
    the boundary's, not the policy's.
    """
    run = store.run(run_id) or {}
    per_task = store.task_summaries(run_id, opinions=opinion_verifiers()).to_dicts()
    totals = {key: sum(row[key] for row in per_task) for key in
              ("branches", "ok", "max_turns", "errors", "input_tokens", "output_tokens", "verified", "passed",
               "hacks", "boundary_limited")}
    costs = [row["cost_usd"] for row in per_task if row["cost_usd"] is not None]
    summary: dict[str, Any] = {
        "run_id": run_id,
        "db": str(store.path),
        "status": run.get("status"),
        "model": run.get("model"),
        "sandbox": run.get("sandbox"),
        "dataset_hash": run.get("dataset_hash"),
        "config_hash": run.get("config_hash"),
        "tasks": len(per_task),
        **totals,
        "cost_usd": sum(costs) if costs else None,
        "per_task": per_task,
    }
    if elapsed_s is not None:
        summary["elapsed_s"] = round(elapsed_s, 3)
        summary["branches_per_s"] = round(totals["branches"] / elapsed_s, 2) if elapsed_s > 0 else None
    return summary
