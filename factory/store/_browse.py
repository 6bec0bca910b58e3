"""Paged reads for browsing a store (``factory view``): runs, a run's task grid, a task's branches side by side.

Every read here is bounded: a page of runs, a page of tasks (with the grid
cells of those tasks only), the chosen branches of one task, a capped list of
search hits. Nothing loads a whole run, so a run of 100,000 branches opens as
fast as a run of ten. Counts over a whole run are aggregates computed inside
DuckDB, never rows brought into Python.

The statements live here beside :class:`RunBrowser` (not in
:mod:`factory.store._queries`) because they serve one reader; they reuse the
one definition of a branch's outcome, :func:`~factory.store._queries.verdict_summary_sql`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from factory.store import _queries as queries
from factory.store._store import Store

__all__ = ["RunBrowser"]

#: The branch columns a grid cell or a count needs (never the trajectory).
_RUN_COUNTS = f"""
    WITH v AS ({queries.verdict_summary_sql("run_id = $run")})
    SELECT count(*)::BIGINT AS branches,
           count(DISTINCT b.task_id)::BIGINT AS tasks_with_branches,
           count_if(b.status IN {queries.NOT_OUTCOMES})::BIGINT AS infra_failures,
           count_if(b.status = 'max_turns')::BIGINT AS max_turns,
           count_if(b.status NOT IN {queries.NOT_OUTCOMES} AND v.objective_pass IS NOT NULL)::BIGINT AS verified,
           count_if(b.status NOT IN {queries.NOT_OUTCOMES} AND v.objective_pass)::BIGINT AS passed,
           count_if(b.status NOT IN {queries.NOT_OUTCOMES} AND v.run_id IS NOT NULL
                    AND v.objective_pass IS NULL)::BIGINT AS verifier_errors,
           count_if(b.status NOT IN {queries.NOT_OUTCOMES} AND v.run_id IS NULL)::BIGINT AS unverified,
           coalesce(count_if(v.hack_detected), 0)::BIGINT AS hacks,
           coalesce(count_if(v.hack_suspected AND NOT v.hack_detected), 0)::BIGINT AS suspected,
           coalesce(count_if(v.boundary_limited), 0)::BIGINT AS boundary_limited,
           coalesce(sum(b.input_tokens), 0)::BIGINT AS input_tokens,
           coalesce(sum(b.output_tokens), 0)::BIGINT AS output_tokens,
           sum(b.cost_usd) AS cost_usd
    FROM branches b LEFT JOIN v USING (run_id, task_id, branch_index)
    WHERE b.run_id = $run
    """

#: $run: what changes whenever a run's status, branches, verdicts or ranking are written.
_RUN_FINGERPRINT = """
    SELECT (SELECT status FROM runs WHERE run_id = $run) AS status,
           (SELECT (count(*), max(finished_at)) FROM branches WHERE run_id = $run) AS branches,
           (SELECT (count(*), max(created_at)) FROM verdicts WHERE run_id = $run) AS verdicts,
           (SELECT (count(*), max(created_at)) FROM rankings WHERE run_id = $run) AS rankings
    """

_RUN_COUNTS_BY_STATUS = """
    SELECT status, count(*)::BIGINT AS branches FROM branches WHERE run_id = ? GROUP BY status ORDER BY status
    """

_RUNS_PAGE = """
    SELECT r.run_id, r.created_at, r.finished_at, r.status, r.model, r.sandbox, r.n_branches, r.task_file,
           r.dataset_hash, r.config_hash, count(*) OVER () AS total
    FROM runs r
    WHERE ($status IS NULL OR r.status = $status)
      AND ($model IS NULL OR r.model ILIKE '%' || $model || '%')
      AND ($text IS NULL OR r.run_id ILIKE '%' || $text || '%' OR r.task_file ILIKE '%' || $text || '%')
    ORDER BY r.created_at DESC, r.run_id
    LIMIT $limit OFFSET $offset
    """

_RUN_FILTER_VALUES = "SELECT list(DISTINCT status ORDER BY status) AS statuses, list(DISTINCT model ORDER BY model) " \
                     "FILTER (WHERE model IS NOT NULL) AS models FROM runs"

#: $runs: per run (a page of them), counts from each verifier's latest verdict.
_RUNS_COUNTS = f"""
    WITH v AS ({queries.verdict_summary_sql("list_contains($runs, run_id)")})
    SELECT b.run_id, count(*)::BIGINT AS branches,
           count_if(b.status IN {queries.NOT_OUTCOMES})::BIGINT AS infra_failures,
           count_if(b.status NOT IN {queries.NOT_OUTCOMES} AND v.objective_pass IS NOT NULL)::BIGINT AS verified,
           count_if(b.status NOT IN {queries.NOT_OUTCOMES} AND v.objective_pass)::BIGINT AS passed,
           coalesce(count_if(v.hack_detected), 0)::BIGINT AS hacks,
           coalesce(count_if(v.boundary_limited), 0)::BIGINT AS boundary_limited,
           sum(b.cost_usd) AS cost_usd
    FROM branches b LEFT JOIN v USING (run_id, task_id, branch_index)
    WHERE list_contains($runs, b.run_id) GROUP BY b.run_id
    """

#: $run, $text, $limit, $offset: one page of a run's tasks (by id), filtered by id or prompt.
_TASKS_PAGE = """
    SELECT task_id, left(prompt, 300) AS prompt, verifiers, count(*) OVER () AS total FROM tasks
    WHERE run_id = $run AND ($text IS NULL OR task_id ILIKE '%' || $text || '%' OR prompt ILIKE '%' || $text || '%')
    ORDER BY task_id LIMIT $limit OFFSET $offset
    """

#: A page's tasks: the range lets DuckDB skip the row groups outside it (rows are written in task order), the
#: list keeps only the page's tasks when a filter left gaps in the range.
_IN_PAGE = "run_id = $run AND task_id BETWEEN $first AND $last AND list_contains($tasks, task_id)"

#: $run, $tasks, $first, $last, $opinions: the grid cells of a page of tasks: one per branch, its outcome and marks.
_GRID_CELLS = f"""
    WITH v AS ({queries.verdict_summary_sql(_IN_PAGE)})
    SELECT b.task_id, b.branch_index, b.status, v.objective_pass, v.objective_score, v.judge_score,
           coalesce(v.hack_detected, false) AS hack_detected, coalesce(v.hack_suspected, false) AS hack_suspected,
           coalesce(v.boundary_limited, false) AS boundary_limited, v.run_id IS NOT NULL AS has_verdict,
           r.rank, b.cost_usd
    FROM branches b LEFT JOIN v USING (run_id, task_id, branch_index)
    LEFT JOIN (SELECT * FROM rankings WHERE {_IN_PAGE}) r USING (run_id, task_id, branch_index)
    WHERE b.run_id = $run AND b.task_id BETWEEN $first AND $last AND list_contains($tasks, b.task_id)
    ORDER BY b.task_id, b.branch_index
    """

_TASK = "SELECT task_id, task_hash, prompt, verifiers, spec FROM tasks WHERE run_id = ? AND task_id = ?"

_BRANCH_INDEXES = "SELECT list(branch_index ORDER BY branch_index) FROM branches WHERE run_id = ? AND task_id = ?"

#: ?, ?, ?: chosen branches of one task (their final workspace too; never their trajectory JSON: events serve it).
_BRANCHES = """
    SELECT b.branch_index, b.session_id, b.rollout_id, b.temperature, b.seed, b.model, b.status, b.final_answer,
           b.input_tokens, b.output_tokens, b.cost_usd, b.started_at, b.finished_at, b.error, b.workspace,
           r.rank, r.strength, r.ci_low, r.ci_high, r.reward, r.components
    FROM branches b LEFT JOIN rankings r USING (run_id, task_id, branch_index)
    WHERE b.run_id = ? AND b.task_id = ? AND list_contains(?, b.branch_index) ORDER BY b.branch_index
    """

#: ?, ?, ?, ?: the events of chosen branches, the first N of each (verdict events left out: verdicts serve them).
_EVENTS = """
    SELECT branch_index, seq, ts, kind, payload FROM events
    WHERE run_id = ? AND task_id = ? AND list_contains(?, branch_index) AND kind != 'verdict'
    QUALIFY row_number() OVER (PARTITION BY branch_index ORDER BY seq) <= ?
    ORDER BY branch_index, seq
    """

_EVENT_COUNTS = """
    SELECT branch_index, count(*)::BIGINT AS events FROM events
    WHERE run_id = ? AND task_id = ? AND list_contains(?, branch_index) AND kind != 'verdict' GROUP BY 1
    """

#: ?, ?, ?: the latest verdict of each verifier on chosen branches, with its version and time.
_VERDICTS = """
    SELECT branch_index, verifier, version, ok, status, score, details, created_at FROM verdicts
    WHERE run_id = ? AND task_id = ? AND list_contains(?, branch_index)
    QUALIFY row_number() OVER (PARTITION BY branch_index, verifier ORDER BY created_at DESC, version DESC) = 1
    ORDER BY branch_index, verifier
    """

_JUDGMENTS = """
    SELECT judge, kind, branch_a, branch_b, sample_index, swapped, score, preference, status, left(raw, 2000) AS raw
    FROM judgments WHERE run_id = ? AND task_id = ?
      AND (list_contains(?, branch_a) OR list_contains(?, branch_b))
    ORDER BY kind, branch_a, branch_b, swapped, judge, sample_index
    LIMIT 500
    """

_WORKSPACE = "SELECT workspace FROM branches WHERE run_id = ? AND task_id = ? AND branch_index = ?"

_TASK_FILES = "SELECT spec FROM tasks WHERE run_id = ? AND task_id = ?"

#: $run, $text, $limit: hits in final answers and in tool outputs (summarised results), capped.
_SEARCH = """
    (SELECT task_id, branch_index, 'final_answer' AS place, NULL::INTEGER AS seq, final_answer AS text
     FROM branches WHERE run_id = $run AND final_answer ILIKE '%' || $text || '%'
     ORDER BY task_id, branch_index LIMIT $limit)
    UNION ALL
    (SELECT task_id, branch_index, 'tool_output' AS place, seq, json_extract_string(payload, '$.output') AS text
     FROM events WHERE run_id = $run AND kind = 'tool_result'
       AND json_extract_string(payload, '$.output') ILIKE '%' || $text || '%'
     ORDER BY task_id, branch_index, seq LIMIT $limit)
    ORDER BY place, task_id, branch_index, seq
    """

_RANKINGS_PAGE = """
    SELECT task_id, branch_index, rank, strength, ci_low, ci_high, reward, components, created_at,
           count(*) OVER () AS total
    FROM rankings WHERE run_id = ? ORDER BY task_id, rank, branch_index LIMIT ? OFFSET ?
    """

#: ?, ?, ?, ?: one page of a run's recorded artifacts (``?`` kind or NULL for any), newest first.
_ARTIFACTS_PAGE = """
    SELECT artifact_id, run_id, kind, path, sha256, meta, created_at, count(*) OVER () AS total
    FROM artifacts WHERE run_id = ? AND (?::VARCHAR IS NULL OR kind = ?)
    ORDER BY created_at DESC, artifact_id LIMIT ? OFFSET ?
    """

_ARTIFACT = "SELECT artifact_id, run_id, kind, path, sha256, meta, created_at FROM artifacts WHERE artifact_id = ?"


class RunBrowser:
    """Bounded, paged reads of one store for a browser: what ``factory view`` serves.

    Args:
        store: An open store (``factory view`` opens it read-only).
        opinions: Verifiers whose verdicts are opinions, not checks
            (:func:`factory.verifiers.opinion_verifiers`): left out of a branch's objective outcome.
    """

    def __init__(self, store: Store, *, opinions: Sequence[str]):
        self.store = store
        self.opinions = list(opinions)

    def _read(self, sql: str, params: Sequence[Any] | dict[str, Any]) -> pl.DataFrame:
        return self.store._read(sql, params)

    def runs_page(self, *, limit: int, offset: int = 0, status: str | None = None, model: str | None = None,
                  text: str | None = None, with_counts: bool = True) -> tuple[list[dict[str, Any]], int]:
        """One page of runs, newest first, each with its branch counts.

        Args:
            limit: Runs per page.
            offset: Runs skipped.
            status: Only runs with this status.
            model: Only runs whose model contains this text (any case).
            text: Only runs whose id or task file contains this text.
            with_counts: Count each run's branches (False: the ``runs`` rows only, for a caller that keeps
                counts of its own, see :meth:`run_counts`).

        Returns:
            ``(rows, total)``: the page's runs (counts: ``branches, infra_failures, verified, passed, hacks,
            boundary_limited, cost_usd``) and how many runs match.
        """
        page = self._read(_RUNS_PAGE, {"status": status or None, "model": model or None, "text": text or None,
                                       "limit": int(limit), "offset": int(offset)})
        total = int(page["total"][0]) if page.height else 0
        rows = page.drop("total").to_dicts()
        if rows and with_counts:
            counts = {row["run_id"]: row for row in self._read(
                _RUNS_COUNTS, {"runs": [r["run_id"] for r in rows], "opinions": self.opinions}).to_dicts()}
            empty = {"branches": 0, "infra_failures": 0, "verified": 0, "passed": 0, "hacks": 0,
                     "boundary_limited": 0, "cost_usd": None}
            for row in rows:
                found = counts.get(row["run_id"], empty)
                row.update({key: found[key] for key in empty})
        return rows, total

    def run_filter_values(self) -> dict[str, list[str]]:
        """The statuses and models seen among all runs (what the runs page offers as filters)."""
        statuses, models = self._read(_RUN_FILTER_VALUES, []).row(0)
        return {"statuses": list(statuses or []), "models": list(models or [])}

    def run_counts(self, run_id: str) -> dict[str, Any] | None:
        """One run's row and its counts over all its branches (aggregated in DuckDB), or None if unknown.

        Keys: the ``runs`` row, plus ``tasks``, ``branches``, ``infra_failures`` (branches that are not outcomes),
        ``max_turns``, ``verified``, ``passed``, ``verifier_errors`` (an objective verifier errored: no
        outcome), ``unverified``, ``hacks`` (detected), ``suspected`` (the monitor's suspicion, not detected),
        ``boundary_limited``, tokens, ``cost_usd`` and ``by_status`` (branches per status).
        """
        run = self.store.run(run_id)
        if run is None:
            return None
        counts = self._read(_RUN_COUNTS, {"run": run_id, "opinions": self.opinions}).row(0, named=True)
        tasks = int(self._read("SELECT count(*) FROM tasks WHERE run_id = ?", [run_id]).item())
        by_status = {s: int(n) for s, n in self._read(_RUN_COUNTS_BY_STATUS, [run_id]).iter_rows()}
        return {**run, **counts, "tasks": tasks, "by_status": by_status}

    def run_fingerprint(self, run_id: str) -> tuple[Any, ...]:
        """Cheap to read, and different whenever the run's status, branches, verdicts or ranking were written.

        Branches, verdicts and rankings are counted and their newest time taken (a rewritten branch gets a
        new ``finished_at``, a new verdict a new ``created_at``), so a viewer can keep a run's counts until
        this changes.
        """
        return tuple(self._read(_RUN_FINGERPRINT, {"run": run_id}).row(0))

    def tasks_page(self, run_id: str, *, limit: int, offset: int = 0,
                   text: str | None = None) -> tuple[list[dict[str, Any]], int]:
        """One page of a run's tasks, each with its grid: one cell per branch (outcome, hack marks, rank).

        Args:
            run_id: The run.
            limit: Tasks per page.
            offset: Tasks skipped.
            text: Only tasks whose id or prompt contains this text (any case).

        Returns:
            ``(rows, total)``: tasks with ``cells`` (``branch_index, status, objective_pass, objective_score,
            judge_score, hack_detected, hack_suspected, boundary_limited, has_verdict, rank, cost_usd``) and
            how many tasks match.
        """
        page = self._read(_TASKS_PAGE, {"run": run_id, "text": text or None, "limit": int(limit),
                                        "offset": int(offset)})
        total = int(page["total"][0]) if page.height else 0
        rows = page.drop("total").to_dicts()
        if not rows:
            return rows, total
        cells: dict[str, list[dict[str, Any]]] = {row["task_id"]: [] for row in rows}
        grid = self._read(_GRID_CELLS, {"run": run_id, "tasks": list(cells), "first": min(cells), "last": max(cells),
                                        "opinions": self.opinions})
        for cell in grid.to_dicts():
            cells[cell.pop("task_id")].append(cell)
        for row in rows:
            row["cells"] = cells[row["task_id"]]
        return rows, total

    def task(self, run_id: str, task_id: str) -> dict[str, Any] | None:
        """One task of a run (``spec`` as stored JSON text) with its branch indexes, or None if unknown."""
        frame = self._read(_TASK, [run_id, task_id])
        if not frame.height:
            return None
        task = frame.row(0, named=True)
        indexes = self._read(_BRANCH_INDEXES, [run_id, task_id]).item()
        task["branch_indexes"] = [] if indexes is None else [int(i) for i in indexes]
        return task

    def branches(self, run_id: str, task_id: str, branch_indexes: Sequence[int], *,
                 max_events: int) -> list[dict[str, Any]]:
        """Chosen branches of one task, each with its first ``max_events`` events, latest verdicts and ranking.

        Returns:
            One dict per stored branch among ``branch_indexes``, in index order: the ``branches`` columns
            (not the trajectory JSON), ``rank, strength, ci_low, ci_high, reward, components``,
            ``events`` (``seq, ts, kind, payload``), ``events_total`` and ``verdicts``
            (``verifier, version, ok, status, score, details, created_at``).
        """
        indexes = [int(i) for i in branch_indexes]
        rows = self._read(_BRANCHES, [run_id, task_id, indexes]).to_dicts()
        events = self._read(_EVENTS, [run_id, task_id, indexes, int(max_events)])
        totals = dict(self._read(_EVENT_COUNTS, [run_id, task_id, indexes]).iter_rows())
        verdicts = self._read(_VERDICTS, [run_id, task_id, indexes])
        by_branch: dict[int, dict[str, Any]] = {}
        for row in rows:
            row.update(events=[], events_total=int(totals.get(row["branch_index"], 0)), verdicts=[])
            by_branch[row["branch_index"]] = row
        for event in events.to_dicts():
            by_branch[event.pop("branch_index")]["events"].append(event)
        for verdict in verdicts.to_dicts():
            by_branch[verdict.pop("branch_index")]["verdicts"].append(verdict)
        return rows

    def judgments(self, run_id: str, task_id: str, branch_indexes: Sequence[int]) -> list[dict[str, Any]]:
        """Judge samples (scalar and pairwise) on chosen branches of one task, at most 500."""
        indexes = [int(i) for i in branch_indexes]
        return self._read(_JUDGMENTS, [run_id, task_id, indexes, indexes]).to_dicts()

    def workspace(self, run_id: str, task_id: str, branch_index: int) -> tuple[str | None, str | None] | None:
        """A branch's stored final workspace (change set JSON) and its task's spec JSON; None if no such branch."""
        frame = self._read(_WORKSPACE, [run_id, task_id, int(branch_index)])
        if not frame.height:
            return None
        spec = self._read(_TASK_FILES, [run_id, task_id])
        return frame.item(), (spec.item() if spec.height else None)

    def search(self, run_id: str, text: str, *, limit: int) -> list[dict[str, Any]]:
        """Branches whose final answer or a tool output contains ``text`` (any case); at most ``limit`` per place."""
        return self._read(_SEARCH, {"run": run_id, "text": text, "limit": int(limit)}).to_dicts()

    def rankings_page(self, run_id: str, *, limit: int, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """One page of a run's stored ranking (by task, then rank), and how many rows it has."""
        page = self._read(_RANKINGS_PAGE, [run_id, int(limit), int(offset)])
        total = int(page["total"][0]) if page.height else 0
        return page.drop("total").to_dicts(), total

    def artifacts_page(self, run_id: str, *, limit: int, offset: int = 0,
                       kind: str | None = None) -> tuple[list[dict[str, Any]], int]:
        """One page of the files recorded as made from a run (``meta`` as stored JSON text), newest first.

        Args:
            run_id: The run.
            limit: Artifacts per page.
            offset: Artifacts skipped.
            kind: Only this kind (``rank_plot``, ``power``, ``export``, ``model``).

        Returns:
            ``(rows, total)``: ``artifact_id, run_id, kind, path, sha256, meta, created_at``, and how many match.
        """
        page = self._read(_ARTIFACTS_PAGE, [run_id, kind, kind, int(limit), int(offset)])
        total = int(page["total"][0]) if page.height else 0
        return page.drop("total").to_dicts(), total

    def artifact(self, artifact_id: str) -> dict[str, Any] | None:
        """One recorded artifact by its id (``meta`` as stored JSON text), or None if there is none."""
        frame = self._read(_ARTIFACT, [artifact_id])
        return frame.row(0, named=True) if frame.height else None
