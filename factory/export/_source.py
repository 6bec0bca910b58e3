"""What an export reads of the store: one row per branch, ranked and verified, with its conversation.

The store does the heavy lifting in DuckDB
(:meth:`~factory.store.Store.export_branch_slice`): the latest verdict of
each verifier per branch, the stored ranking, the task's spec, and the
branch's trajectory parsed into a typed message list, split into the opening
(system + user: the prompt) and the rest (the completion). A source streams
them in slices of whole tasks (:meth:`ExportSource.batches`, at most
:data:`BATCH_BRANCHES` branches each unless one task has more), so an export
holds one slice at a time whatever the size of the store; ``branches`` (every
row at once) is there for formats that need the whole frame. A run that was
never ranked is ranked here with :class:`~factory.ranking.RolloutRanker` (not
stored: an export only reads), and the manifest says so.

Tool-call ``arguments`` leave as JSON text, not objects: a JSONL file loaded
through Arrow (``datasets.load_dataset("json")``) unifies the struct keys of
every row, so object arguments would come back carrying every other tool's
argument names as nulls, and the chat template would render them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import polars as pl

from factory.errors import ExportError
from factory.store import Store
from factory.verifiers import opinion_verifiers

__all__ = ["BATCH_BRANCHES", "ExportSource", "load_source"]

#: Branches per slice a source streams (whole tasks: a slice ends at the first task boundary past this).
#: At about 3 KiB of messages a branch, a slice and the rows built from it stay within a few hundred MiB.
BATCH_BRANCHES = 8192

_RANKING_COLUMNS = ("rank", "reward", "strength", "ci_low", "ci_high")
_RANKING_SCHEMA = {"run_id": pl.String, "task_id": pl.String, "branch_index": pl.Int32, "rank": pl.Int32,
                   "reward": pl.Float64, "strength": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64}


class ExportSource:
    """The branches an export draws from, and what they depend on.

    Attributes:
        runs: Per run: ``dataset_hash``, ``config_hash``, ``model``, ``created_at``.
        ranked_here: Runs with no stored ranking, ranked for this export.
        ranking_stats: Per run, the ranker's power statistics (``powered``, ``mcnemar_p``, ...).
        excluded: Per run, the branches left out as infrastructure failures (count and reasons).
        batch_branches: Branches per slice :meth:`batches` yields (whole tasks; None: one slice).

    A source reading a store holds one row per slice (its bounds and counts, from DuckDB), never one per
    task or per branch: :attr:`tasks` (one row per task) is read only when asked for.
    """

    def __init__(self, branches: pl.DataFrame | None = None, runs: dict[str, dict[str, Any]] | None = None,
                 ranked_here: list[str] | None = None, ranking_stats: dict[str, dict[str, Any]] | None = None,
                 excluded: dict[str, dict[str, Any]] | None = None, *, store: Store | None = None,
                 opinions: Sequence[str] = (), tasks: pl.DataFrame | None = None,
                 batch_branches: int | None = BATCH_BRANCHES):
        if branches is None and store is None:
            raise ValueError("an ExportSource reads its branches from a frame or a store")
        self._branches = branches
        self.runs = runs or {}
        self.ranked_here = ranked_here if ranked_here is not None else []
        self.ranking_stats = ranking_stats if ranking_stats is not None else {}
        self.excluded = excluded if excluded is not None else {}
        self.store = store
        self.opinions = list(opinions)
        if tasks is None and branches is not None:
            tasks = (branches.group_by("run_id", "task_id", maintain_order=True).len("branches")
                     .with_columns(pl.col("branches").cast(pl.Int64)))
        self._tasks = tasks
        self.batch_branches = batch_branches
        # One row per slice: ``run_id, first_task, last_task, branches, tasks, most`` (see Store.export_slices).
        self._slice_rows = self._slice_rows_of(batch_branches)
        self._rankings: dict[str, pl.DataFrame] = {}  # rankings made here, by run: merged into every slice

    def _slice_rows_of(self, size: int | None) -> pl.DataFrame:
        """The slices of ``size`` branches: from the task list when one is held, else from DuckDB."""
        if self._tasks is None:
            return self.store.export_slices(list(self.runs), size)
        return _slice_rows(self._tasks, size)

    @property
    def tasks(self) -> pl.DataFrame:
        """The tasks read, in export order: ``run_id, task_id, branches`` (outcomes per task).

        One row per task: read from the store when asked for (an export itself does not need it).
        """
        if self._tasks is None:
            self._tasks = self.store.export_tasks(list(self.runs))
        return self._tasks

    @property
    def n_tasks(self) -> int:
        """Tasks read (with at least one outcome branch)."""
        return int(self._slice_rows["tasks"].sum()) if self._slice_rows.height else 0

    def branches_per_run(self) -> dict[str, int]:
        """Outcome branches read, per run (runs with none: absent)."""
        return {run_id: int(n) for run_id, n in
                self._slice_rows.group_by("run_id").agg(pl.col("branches").sum()).iter_rows()}

    @property
    def branches(self) -> pl.DataFrame:
        """Every branch at once (one row each, the columns of :meth:`~factory.store.Store.export_branches`).

        For formats that need the whole frame; the built-in ones stream :meth:`batches` instead.
        """
        if self._branches is None:
            self._branches = pl.concat(list(self._slices(None)), how="vertical") if self.n_tasks else \
                self._with_rankings(self.store.export_branches(list(self.runs), opinions=self.opinions))
        return self._branches

    @branches.setter
    def branches(self, frame: pl.DataFrame) -> None:
        self._branches = frame

    @property
    def n_branches(self) -> int:
        """Branches read (outcomes), counted without reading their messages."""
        return int(self._slice_rows["branches"].sum()) if self._slice_rows.height else 0

    @property
    def max_branches_per_task(self) -> int:
        """The most branches any one task has."""
        return int(self._slice_rows["most"].max()) if self._slice_rows.height else 0

    def judge_objective(self) -> pl.DataFrame:
        """``judge_score, objective_pass`` of every branch (light: what the manifest's agreement compares)."""
        if self._branches is not None or self.store is None:
            return self.branches.select("judge_score", "objective_pass")
        return self.store.export_judge_objective(list(self.runs), opinions=self.opinions)

    def batches(self) -> Iterator[pl.DataFrame]:
        """The branches in slices of whole tasks, in export order (run, task, branch).

        Concatenated, the slices are :attr:`branches` row for row; each holds about
        :attr:`batch_branches` branches (more only when one task has more).
        """
        if self._branches is not None:
            yield from _frame_slices(self._branches, self.tasks, self.batch_branches)
            return
        yield from self._slices(self.batch_branches)

    def _slices(self, size: int | None) -> Iterator[pl.DataFrame]:
        """Each slice from the store, the next one read (in DuckDB, off the GIL) while this one is used.

        At most two slices are held: the one yielded and the one being read.
        """
        rows = self._slice_rows if size == self.batch_branches else self._slice_rows_of(size)
        bounds = list(rows.select("run_id", "first_task", "last_task").iter_rows())
        if not bounds:
            return

        def read(run_id: str, first: str, last: str) -> pl.DataFrame:
            return self._with_rankings(self.store.export_branch_slice(run_id, first, last, opinions=self.opinions))

        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="export-slice")
        try:
            pending = pool.submit(read, *bounds[0][:3])
            for following in [*bounds[1:], None]:
                frame = pending.result()
                pending = pool.submit(read, *following[:3]) if following is not None else None
                yield frame
                del frame
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _with_rankings(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Merge the rankings made here into a slice (runs ranked by ``factory rank`` keep their stored one)."""
        if not self._rankings:
            return frame
        runs = frame["run_id"].unique().to_list()
        ranked = [self._rankings[r] for r in runs if r in self._rankings]
        frame = frame.with_columns(pl.col("branch_index").cast(pl.Int32))
        if ranked:
            ranked_frame = pl.concat(ranked) if len(ranked) > 1 else ranked[0]
            if frame.height:
                first, last = frame["task_id"].min(), frame["task_id"].max()
                ranked_frame = ranked_frame.filter(pl.col("task_id").is_between(pl.lit(first), pl.lit(last)))
            frame = frame.update(ranked_frame, on=["run_id", "task_id", "branch_index"], how="left")
        return frame.with_columns(pl.col(c).cast(_RANKING_SCHEMA[c]) for c in _RANKING_COLUMNS)


def task_slices(tasks: pl.DataFrame, size: int | None) -> list[tuple[str, str, str, int]]:
    """``(run, first task, last task, branches)`` of consecutive whole tasks of one run, about ``size`` branches.

    A slice closes at the first task that takes it to ``size`` branches or more (None: one slice per run):
    the slices :meth:`~factory.store.Store.export_slices` gives from the store.
    """
    return [(run_id, first, last, int(n)) for run_id, first, last, n in
            _slice_rows(tasks, size).select("run_id", "first_task", "last_task", "branches").iter_rows()]


def _slice_rows(tasks: pl.DataFrame, size: int | None) -> pl.DataFrame:
    """:meth:`~factory.store.Store.export_slices`'s rows from a task list held in memory."""
    if tasks.is_empty():
        return pl.DataFrame(schema={"run_id": pl.String, "first_task": pl.String, "last_task": pl.String,
                                    "branches": pl.Int64, "tasks": pl.Int64, "most": pl.Int64})
    before = pl.col("branches").cum_sum().over("run_id") - pl.col("branches")  # branches of the run before it
    frame = tasks.with_columns((pl.lit(0) if size is None else before // size).alias("_slice"))
    return (frame.group_by("run_id", "_slice", maintain_order=True)
            .agg(pl.col("task_id").first().alias("first_task"), pl.col("task_id").last().alias("last_task"),
                 pl.col("branches").sum().cast(pl.Int64), pl.len().cast(pl.Int64).alias("tasks"),
                 pl.col("branches").max().cast(pl.Int64).alias("most"))
            .drop("_slice"))


def _frame_slices(frame: pl.DataFrame, tasks: pl.DataFrame, size: int | None) -> Iterator[pl.DataFrame]:
    """A frame already in memory, in the slices :func:`task_slices` gives (rows ordered by run and task)."""
    offset = 0
    for _run, _first, _last, n in task_slices(tasks, size):
        yield frame.slice(offset, n)
        offset += n


def load_source(store: Store, run_ids: Sequence[str], *, bootstrap_rounds: int = 100,
                batch_branches: int | None = BATCH_BRANCHES) -> ExportSource:
    """The branches of ``run_ids`` with their verdicts, ranking and messages, read slice by slice.

    Nothing heavy is read here: the source reads its slices as a format iterates over them
    (:meth:`ExportSource.batches`). Runs without a stored ranking are ranked now (light columns only).

    Args:
        store: The store.
        run_ids: The runs.
        bootstrap_rounds: Bootstrap rounds of the ranking made here.
        batch_branches: Branches per slice (None: the whole export in one).

    Raises:
        ExportError: A run is not in the store.
    """
    run_ids = list(dict.fromkeys(run_ids))
    runs_frame = store.run_provenance(run_ids)
    runs = {row["run_id"]: row for row in runs_frame.iter_rows(named=True)}
    missing = [r for r in run_ids if r not in runs]
    if missing:
        raise ExportError(f"no run {', '.join(missing)} in {store.path} (see: factory runs)")
    from factory.ranking import excluded_branches

    # Infrastructure failures are not in the branches (not outcomes): counted here, for the manifest.
    source = ExportSource(runs=runs,
                          excluded={run_id: excluded_branches(store, run_id) for run_id in run_ids},
                          store=store, opinions=opinion_verifiers(), batch_branches=batch_branches)
    _rank(store, source, bootstrap_rounds)
    return source


def _rank(store: Store, source: ExportSource, bootstrap_rounds: int) -> None:
    """Rank the runs without a stored ranking, and compute every run's power statistics."""
    from factory.ranking import RolloutRanker, load_pairwise, load_records

    ranker = RolloutRanker(bootstrap_rounds=bootstrap_rounds)
    stored = store.stored_ranking_counts(list(source.runs))
    counts = source.branches_per_run()
    for run_id in source.runs:
        if not counts.get(run_id):
            source.ranking_stats[run_id] = ranker.stats_of([])
            source.ranking_stats[run_id]["outcomes"].pop("tasks", None)
            continue
        if stored.get(run_id, 0) >= counts[run_id]:  # stored by `factory rank`: keep its order
            # The evidence statistics depend on the signals and outcomes, never on the order: recomputed.
            # No per-task list in the manifest (a million tasks would make it hundreds of MB; `factory rank`
            # gives it). With no signal to test (no judge score, no pairwise judgment), per-task counts from
            # DuckDB give the statistics exactly, without a row per branch; else vectorised over the branches.
            pairwise = load_pairwise(store, run_id)
            stats = None if pairwise else ranker.evidence_of_task_counts(
                store.run_outcome_counts(run_id, opinions=source.opinions))
            source.ranking_stats[run_id] = stats if stats is not None else ranker.evidence_of_frame(
                store.branch_records(run_id, opinions=source.opinions), pairwise, per_task=False)
            continue
        result = ranker.rank(load_records(store, run_id), load_pairwise(store, run_id))
        source.ranked_here.append(run_id)
        source.ranking_stats[run_id] = result.stats
        result.stats["outcomes"].pop("tasks", None)  # as above: the run's figures, not one per task
        ranked = result.ranked
        source._rankings[run_id] = pl.DataFrame(
            {"run_id": [run_id] * len(ranked), "task_id": [r.task_id for r in ranked],
             "branch_index": [r.branch_index for r in ranked], "rank": [r.rank for r in ranked],
             "reward": [r.reward for r in ranked], "strength": [r.strength for r in ranked],
             "ci_low": [r.ci_low for r in ranked], "ci_high": [r.ci_high for r in ranked]},
            schema=_RANKING_SCHEMA).sort("task_id", "branch_index")
