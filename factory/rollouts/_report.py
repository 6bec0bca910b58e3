"""The end-of-run summary a fork prints (and ``--json`` emits)."""

from __future__ import annotations

from typing import Any

from factory.store import Store

__all__ = ["fork_summary"]


def fork_summary(store: Store, run_id: str, elapsed_s: float | None = None) -> dict[str, Any]:
    """Per-task and total branch counts, objective passes, detected hacks, tokens and cost of a run.

    A branch passes objectively when its latest verdict of every non-judge
    verifier is ``pass``.
    """
    run = store.run(run_id) or {}
    per_task = store.query(
        """
        WITH latest AS (
            SELECT * FROM verdicts WHERE run_id = ?
            QUALIFY row_number() OVER (PARTITION BY task_id, branch_index, verifier ORDER BY created_at DESC) = 1),
        per_branch AS (
            SELECT task_id, branch_index,
                   bool_and(status = 'pass') FILTER (WHERE verifier <> 'judge') AS objective_pass,
                   bool_or(coalesce(TRY_CAST(json_extract(details, '$.hack_detected') AS BOOLEAN), false)) AS hack
            FROM latest GROUP BY ALL)
        SELECT b.task_id, count(*) AS branches,
               count_if(status = 'ok')::BIGINT AS ok,
               count_if(status = 'max_turns')::BIGINT AS max_turns,
               count_if(status = 'error')::BIGINT AS errors,
               coalesce(sum(input_tokens), 0)::BIGINT AS input_tokens,
               coalesce(sum(output_tokens), 0)::BIGINT AS output_tokens,
               sum(cost_usd) AS cost_usd,
               count(v.objective_pass)::BIGINT AS verified,
               -- count_if over no verdicts at all (a --no-verify run) is NULL, not 0
               coalesce(count_if(v.objective_pass), 0)::BIGINT AS passed,
               coalesce(count_if(v.hack), 0)::BIGINT AS hacks
        FROM branches b LEFT JOIN per_branch v USING (task_id, branch_index)
        WHERE b.run_id = ? GROUP BY b.task_id ORDER BY b.task_id
        """,
        [run_id, run_id],
    ).to_dicts()
    totals = {key: sum(row[key] for row in per_task) for key in
              ("branches", "ok", "max_turns", "errors", "input_tokens", "output_tokens", "verified", "passed",
               "hacks")}
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
