"""What an export reads of the store: one row per branch, ranked and verified, with its conversation.

The store does the heavy lifting, in one DuckDB query per export
(:meth:`~factory.store.Store.export_branches`): the latest verdict of each
verifier per branch, the stored ranking, the task's spec, and the branch's
trajectory parsed into a typed message list, split into the opening (system
+ user: the prompt) and the rest (the completion). A run that was never
ranked is ranked here with :class:`~factory.ranking.RolloutRanker` (not
stored: an export only reads), and the manifest says so.

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
from factory.store import Store
from factory.verifiers import opinion_verifiers

__all__ = ["ExportSource", "load_source"]


@dataclass
class ExportSource:
    """The branches an export draws from, and what they depend on.

    Attributes:
        branches: One row per branch (the columns of :meth:`~factory.store.Store.export_branches`).
        runs: Per run: ``dataset_hash``, ``config_hash``, ``model``, ``created_at``.
        ranked_here: Runs with no stored ranking, ranked for this export.
        ranking_stats: Per run, the ranker's power statistics (``powered``, ``mcnemar_p``, ...).
        excluded: Per run, the branches left out as infrastructure failures (count and reasons).
    """

    branches: pl.DataFrame
    runs: dict[str, dict[str, Any]]
    ranked_here: list[str] = field(default_factory=list)
    ranking_stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    excluded: dict[str, dict[str, Any]] = field(default_factory=dict)


def load_source(store: Store, run_ids: Sequence[str], *, bootstrap_rounds: int = 100) -> ExportSource:
    """Every branch of ``run_ids`` with its verdicts, ranking and messages.

    Raises:
        ExportError: A run is not in the store.
    """
    run_ids = list(dict.fromkeys(run_ids))
    runs_frame = store.run_provenance(run_ids)
    runs = {row["run_id"]: row for row in runs_frame.iter_rows(named=True)}
    missing = [r for r in run_ids if r not in runs]
    if missing:
        raise ExportError(f"no run {', '.join(missing)} in {store.path} (see: factory runs)")
    branches = store.export_branches(run_ids, opinions=opinion_verifiers())
    from factory.ranking import excluded_branches

    # Infrastructure failures are not in `branches` (not outcomes): counted here, for the manifest.
    source = ExportSource(branches, runs, excluded={run_id: excluded_branches(store, run_id) for run_id in run_ids})
    _rank(store, source, bootstrap_rounds)
    return source


def _rank(store: Store, source: ExportSource, bootstrap_rounds: int) -> None:
    """Fill in rankings for runs without stored ones, and every run's power statistics."""
    from factory.ranking import RolloutRanker, load_pairwise, load_records

    ranker = RolloutRanker(bootstrap_rounds=bootstrap_rounds)
    updates = []
    for run_id in source.runs:
        frame = source.branches.filter(pl.col("run_id") == run_id)
        if frame.is_empty():
            source.ranking_stats[run_id] = ranker.stats_of([])
            continue
        if frame["rank"].null_count() == 0:  # stored by `factory rank`: keep its order
            # The evidence statistics depend on the signals and outcomes, never on the order: recomputed.
            source.ranking_stats[run_id] = ranker.evidence_of(load_records(store, run_id),
                                                              load_pairwise(store, run_id))
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
