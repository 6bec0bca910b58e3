"""What an export reads of the store: one row per branch, ranked and verified, with its conversation.

The heavy lifting is one DuckDB query per export: the latest verdict of each
verifier per branch, the stored ranking, the task's spec, and the branch's
trajectory parsed into a typed message list (``json_transform``), split into
the opening (system + user: the prompt) and the rest (the completion). A
run that was never ranked is ranked here with :class:`~factory.ranking.RolloutRanker`
(not stored: an export only reads), and the manifest says so.

Tool-call ``arguments`` leave as JSON text, not objects: a JSONL file loaded
through Arrow (``datasets.load_dataset("json")``) unifies the struct keys of
every row, so object arguments would come back carrying every other tool's
argument names as nulls, and the chat template would render them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from factory.errors import ExportError
from factory.ranking import verdict_summary_sql
from factory.store import Store

__all__ = ["ExportSource", "MESSAGE_JSON_SHAPE", "load_source"]

#: The typed shape of one stored message (DuckDB ``json_transform`` structure).
MESSAGE_JSON_SHAPE = (
    '{"role": "VARCHAR", "content": "VARCHAR", "name": "VARCHAR", "tool_call_id": "VARCHAR", '
    '"tool_calls": [{"id": "VARCHAR", "type": "VARCHAR", "function": {"name": "VARCHAR", "arguments": "JSON"}}]}'
)

_BRANCHES_SQL = f"""
WITH verdict AS ({verdict_summary_sql("list_contains($runs, run_id)")}),
modes AS (
    SELECT run_id, task_id, branch_index, json_extract_string(payload, '$.mode') AS mode FROM events
    WHERE kind = 'run_start' AND list_contains($runs, run_id)
    QUALIFY row_number() OVER (PARTITION BY run_id, task_id, branch_index ORDER BY seq) = 1),
parsed AS (
    SELECT b.*, json_transform(b.trajectory, '[{MESSAGE_JSON_SHAPE}]') AS messages FROM branches b
    WHERE list_contains($runs, b.run_id))
SELECT p.run_id, p.task_id, p.branch_index, p.status, p.final_answer, p.model, p.temperature, p.seed,
       list_slice(p.messages, 1, 2) AS prompt_messages,
       list_slice(p.messages, 3, len(p.messages)) AS completion_messages,
       coalesce(list_sum([length(coalesce(m.content, '')) + coalesce(list_sum([
           length(c.function.name) + length(c.function.arguments::VARCHAR) for c in m.tool_calls]), 0)
           for m in list_slice(p.messages, 3, len(p.messages))]), 0)::BIGINT AS completion_chars,
       coalesce(mo.mode, 'single-turn') AS mode,
       v.objective_pass, coalesce(v.objective_score, 0.0) AS objective_score, v.judge_score,
       coalesce(v.hack_detected, false) AS hack_detected, coalesce(v.verifier_versions, []) AS verifier_versions,
       r.rank, r.reward, r.strength, r.ci_low, r.ci_high,
       t.prompt AS task_prompt, t.verifiers AS task_verifiers, t.spec AS task_spec
FROM parsed p
LEFT JOIN modes mo USING (run_id, task_id, branch_index)
LEFT JOIN verdict v USING (run_id, task_id, branch_index)
LEFT JOIN rankings r USING (run_id, task_id, branch_index)
LEFT JOIN tasks t USING (run_id, task_id)
ORDER BY p.run_id, p.task_id, p.branch_index
"""


@dataclass
class ExportSource:
    """The branches an export draws from, and what they depend on.

    Attributes:
        branches: One row per branch (columns of the query above).
        runs: Per run: ``dataset_hash``, ``config_hash``, ``model``, ``created_at``.
        ranked_here: Runs with no stored ranking, ranked for this export.
        ranking_stats: Per run, the ranker's power statistics (``powered``, ``mcnemar_p``, ...).
    """

    branches: pl.DataFrame
    runs: dict[str, dict[str, Any]]
    ranked_here: list[str] = field(default_factory=list)
    ranking_stats: dict[str, dict[str, Any]] = field(default_factory=dict)


def load_source(store: Store, run_ids: Sequence[str], *, bootstrap_rounds: int = 100) -> ExportSource:
    """Every branch of ``run_ids`` with its verdicts, ranking and messages.

    Raises:
        ExportError: A run is not in the store.
    """
    run_ids = list(dict.fromkeys(run_ids))
    runs_frame = store.query(
        "SELECT run_id, dataset_hash, config_hash, model, created_at FROM runs WHERE list_contains(?, run_id)",
        [run_ids])
    runs = {row["run_id"]: row for row in runs_frame.iter_rows(named=True)}
    missing = [r for r in run_ids if r not in runs]
    if missing:
        raise ExportError(f"no run {', '.join(missing)} in {store.path} (see: factory runs)")
    branches = store.query(_BRANCHES_SQL, {"runs": run_ids})
    source = ExportSource(branches, runs)
    _rank(store, source, bootstrap_rounds)
    return source


def _rank(store: Store, source: ExportSource, bootstrap_rounds: int) -> None:
    """Fill in rankings for runs without stored ones, and every run's power statistics."""
    from factory.ranking import RankedBranch, RolloutRanker, load_pairwise, load_records

    ranker = RolloutRanker(bootstrap_rounds=bootstrap_rounds)
    updates = []
    for run_id in source.runs:
        frame = source.branches.filter(pl.col("run_id") == run_id)
        if frame.is_empty():
            source.ranking_stats[run_id] = ranker.stats_of([])
            continue
        if frame["rank"].null_count() == 0:  # stored by `factory rank`: read, don't recompute
            ordered = frame.sort(["task_id", "rank"])
            source.ranking_stats[run_id] = ranker.stats_of(
                [RankedBranch(row["task_id"], row["branch_index"], row["rank"], row["reward"], {}, row["strength"],
                              row["ci_low"], row["ci_high"], row["objective_pass"], row["hack_detected"])
                 for row in ordered.select("task_id", "branch_index", "rank", "reward", "strength", "ci_low",
                                           "ci_high", "objective_pass", "hack_detected").iter_rows(named=True)])
            continue
        result = ranker.rank(load_records(store, run_id), load_pairwise(store, run_id))
        source.ranked_here.append(run_id)
        source.ranking_stats[run_id] = result.stats
        updates.extend({"run_id": run_id, "task_id": r.task_id, "branch_index": r.branch_index, "rank": r.rank,
                        "reward": r.reward, "strength": r.strength, "ci_low": r.ci_low, "ci_high": r.ci_high}
                       for r in result.ranked)
    if updates:
        ranked = pl.DataFrame(updates, schema={"run_id": pl.String, "task_id": pl.String, "branch_index": pl.Int32,
                                               "rank": pl.Int32, "reward": pl.Float64, "strength": pl.Float64,
                                               "ci_low": pl.Float64, "ci_high": pl.Float64})
        columns = ["rank", "reward", "strength", "ci_low", "ci_high"]
        source.branches = (source.branches.with_columns(pl.col("branch_index").cast(pl.Int32))
                           .update(ranked, on=["run_id", "task_id", "branch_index"], how="left")
                           .with_columns(pl.col(c).cast(ranked.schema[c]) for c in columns))
