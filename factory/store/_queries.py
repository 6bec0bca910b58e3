"""The SQL behind the store's named reads and writes: the one place the stages' queries are written.

Other packages never write SQL; they call :class:`~factory.store.Store`
methods, which run these statements and return Polars frames or plain
values. The derived columns every stage must agree on (a branch's objective
pass, its judge score, whether a hack was detected) are defined once here,
in :func:`verdict_summary_sql`.
"""

from __future__ import annotations

__all__: list[str] = []  # internal: other packages reach these statements through Store methods

#: The typed shape of one stored message (DuckDB ``json_transform`` structure).
MESSAGE_JSON_SHAPE = (
    '{"role": "VARCHAR", "content": "VARCHAR", "name": "VARCHAR", "tool_call_id": "VARCHAR", '
    '"tool_calls": [{"id": "VARCHAR", "type": "VARCHAR", "function": {"name": "VARCHAR", "arguments": "JSON"}}]}'
)


def verdict_summary_sql(run_filter: str) -> str:
    """SQL: one row per verified branch, from each verifier's latest verdict (the one definition of these columns).

    Columns: ``run_id, task_id, branch_index``; ``objective_pass`` (every latest non-judge verdict passed;
    NULL when one of them is an ``error``: a verifier that crashed or could not run is the infrastructure's
    failure, not an outcome), ``objective_score`` (their mean score, NULL likewise), ``judge_score`` (the
    latest judge score, pass or fail only), ``hack_detected`` (any verifier caught tampering),
    ``hack_suspected`` (the behaviour monitor saw a hack attempt), ``boundary_limited`` (a latest verdict lists
    tests that failed only because something could not cross the isolation boundary: ``details.boundary``),
    ``verifier_versions`` (sorted ``name@version``).

    Args:
        run_filter: A SQL condition on the ``verdicts`` table selecting the runs (e.g. ``run_id = $run``).

    ``$opinions`` (a parameter) lists the verifiers whose verdicts are opinions, not checks (those whose
    ``objective`` attribute is false: the LLM judge): the store does not know verifier classes, so the
    caller says which, from the one definition in :mod:`factory.verifiers`.
    """
    return f"""
        SELECT run_id, task_id, branch_index,
               CASE WHEN bool_or(status = 'error') FILTER (WHERE NOT list_contains($opinions, verifier)) THEN NULL
                    ELSE bool_and(status = 'pass') FILTER (WHERE NOT list_contains($opinions, verifier))
               END AS objective_pass,
               CASE WHEN bool_or(status = 'error') FILTER (WHERE NOT list_contains($opinions, verifier)) THEN NULL
                    ELSE avg(score) FILTER (WHERE NOT list_contains($opinions, verifier)) END AS objective_score,
               max(score) FILTER (WHERE verifier = 'judge' AND status IN ('pass', 'fail')) AS judge_score,
               bool_or(coalesce(TRY_CAST(json_extract(details, '$.hack_detected') AS BOOLEAN), false))
                   AS hack_detected,
               bool_or(coalesce(TRY_CAST(json_extract(details, '$.hack_suspected') AS BOOLEAN), false))
                   AS hack_suspected,
               bool_or(coalesce(json_array_length(details, '$.boundary'), 0) > 0) AS boundary_limited,
               list_sort(list(verifier || '@' || version)) AS verifier_versions
        FROM (SELECT * FROM verdicts WHERE {run_filter}
              QUALIFY row_number() OVER (PARTITION BY run_id, task_id, branch_index, verifier
                                         ORDER BY created_at DESC, version DESC) = 1)
        GROUP BY ALL"""


# ------------------------------------------------------------------ runs and branches

#: Row count of one table (the name is quoted by the caller from the store's own table list).
TABLE_COUNT = 'SELECT count(*) AS n FROM "{table}"'

#: Branch statuses that are not outcomes of the policy (``BranchStatus.NOT_OUTCOMES``): never ranked,
#: exported or counted in a pass rate; counted apart instead.
NOT_OUTCOMES = "('infra_error', 'error')"

#: $run: every branch that is an outcome, with its arm fields and its verdict summary (null where unverified).
BRANCH_RECORDS = f"""
    WITH v AS ({verdict_summary_sql("run_id = $run")})
    SELECT b.task_id, b.branch_index, b.temperature, b.seed, b.model, b.status,
           v.objective_pass, v.objective_score, v.judge_score, coalesce(v.hack_detected, false) AS hack,
           coalesce(v.hack_suspected, false) AS suspected, coalesce(v.boundary_limited, false) AS boundary_limited
    FROM branches b LEFT JOIN v USING (run_id, task_id, branch_index)
    WHERE b.run_id = $run AND b.status NOT IN {NOT_OUTCOMES}
    ORDER BY b.task_id, b.branch_index
    """

#: ?: a run's branches that are not outcomes, by status and reason.
EXCLUDED_BRANCHES = f"""
    SELECT status, count(*) AS branches, list(DISTINCT split_part(coalesce(error, ''), ':', 1)) AS reasons
    FROM branches WHERE run_id = ? AND status IN {NOT_OUTCOMES} GROUP BY status ORDER BY status
    """

#: ?: a run's branches that are not outcomes, one row each, with the fields arms are split by.
EXCLUDED_BRANCH_ROWS = f"""
    SELECT task_id, branch_index, temperature, seed, model, status, split_part(coalesce(error, ''), ':', 1) AS reason
    FROM branches WHERE run_id = ? AND status IN {NOT_OUTCOMES} ORDER BY task_id, branch_index
    """

#: ?: a run's pairwise judge samples, both orders of a comparison next to each other.
PAIRWISE_JUDGMENTS = """
    SELECT task_id, judge, branch_a, branch_b, sample_index, swapped, preference, status FROM judgments
    WHERE run_id = ? AND kind = 'pairwise' ORDER BY task_id, branch_a, branch_b, swapped, judge, sample_index
    """

#: ?: the latest verdict of each verifier per branch (newest ``created_at``, highest version breaking a tie).
LATEST_VERDICTS = """
    SELECT task_id, branch_index, verifier, status, score, details
    FROM verdicts WHERE run_id = ?
    QUALIFY row_number() OVER (PARTITION BY task_id, branch_index, verifier
                               ORDER BY created_at DESC, version DESC) = 1
    ORDER BY task_id, branch_index, verifier
    """

#: $run, $opinions: per task: branch counts by status, tokens, cost, objective passes, hacks and branches
#: limited by the isolation boundary (a test failed only because something could not cross).
TASK_SUMMARIES = f"""
    WITH per_branch AS ({verdict_summary_sql("run_id = $run")})
    SELECT b.task_id, count(*) AS branches,
           count_if(status = 'ok')::BIGINT AS ok,
           count_if(status = 'max_turns')::BIGINT AS max_turns,
           count_if(status IN ('infra_error', 'error'))::BIGINT AS errors,
           coalesce(sum(input_tokens), 0)::BIGINT AS input_tokens,
           coalesce(sum(output_tokens), 0)::BIGINT AS output_tokens,
           sum(cost_usd) AS cost_usd,
           count(v.objective_pass)::BIGINT AS verified,
           -- count_if over no verdicts at all (a --no-verify run) is NULL, not 0
           coalesce(count_if(v.objective_pass), 0)::BIGINT AS passed,
           coalesce(count_if(v.hack_detected), 0)::BIGINT AS hacks,
           coalesce(count_if(v.boundary_limited), 0)::BIGINT AS boundary_limited
    FROM branches b LEFT JOIN per_branch v USING (task_id, branch_index)
    WHERE b.run_id = $run GROUP BY b.task_id ORDER BY b.task_id
    """

#: ?: a list of run ids; what an export's manifest records of each.
RUN_PROVENANCE = """
    SELECT run_id, dataset_hash, config_hash, model, created_at FROM runs WHERE list_contains(?, run_id)
    """


def export_branches_sql(where: str, *, ordered: bool = True) -> str:
    """SQL: one row per branch with verdicts, ranking, task and typed messages, for the branches ``where`` selects.

    Args:
        where: A SQL condition on ``run_id`` (and ``task_id``) that every table read is filtered by, so a
            bounded slice of tasks reads only its own rows (DuckDB prunes the others by their zone maps).
        ordered: Ordered by run, task and branch. Unordered, the caller sorts: DuckDB's sort carries the
            message lists along (about a sixth of a slice's query time), a Polars sort after it gathers them once.
    """
    return f"""
WITH verdict AS ({verdict_summary_sql(where)}),
modes AS (
    SELECT run_id, task_id, branch_index, json_extract_string(payload, '$.mode') AS mode FROM events
    WHERE kind = 'run_start' AND {where}
    QUALIFY row_number() OVER (PARTITION BY run_id, task_id, branch_index ORDER BY seq) = 1),
parsed AS (
    SELECT b.*, json_transform(b.trajectory, '[{MESSAGE_JSON_SHAPE}]') AS messages FROM branches b
    WHERE {where})
SELECT p.run_id, p.task_id, p.branch_index, p.status, p.final_answer, p.model, p.temperature, p.seed,
       list_slice(p.messages, 1, 2) AS prompt_messages,
       list_slice(p.messages, 3, len(p.messages)) AS completion_messages,
       coalesce(list_sum([length(coalesce(m.content, '')) + coalesce(list_sum([
           length(c.function.name) + length(c.function.arguments::VARCHAR) for c in m.tool_calls]), 0)
           for m in list_slice(p.messages, 3, len(p.messages))]), 0)::BIGINT AS completion_chars,
       coalesce(mo.mode, 'single-turn') AS mode,
       v.objective_pass, coalesce(v.objective_score, 0.0) AS objective_score, v.judge_score,
       coalesce(v.hack_detected, false) AS hack_detected, coalesce(v.hack_suspected, false) AS hack_suspected,
       coalesce(v.verifier_versions, []) AS verifier_versions,
       r.rank, r.reward, r.strength, r.ci_low, r.ci_high,
       t.prompt AS task_prompt, t.verifiers AS task_verifiers, t.spec AS task_spec
FROM parsed p
LEFT JOIN modes mo USING (run_id, task_id, branch_index)
LEFT JOIN verdict v USING (run_id, task_id, branch_index)
LEFT JOIN (SELECT * FROM rankings WHERE {where}) r USING (run_id, task_id, branch_index)
LEFT JOIN (SELECT * FROM tasks WHERE {where}) t USING (run_id, task_id)
WHERE p.status NOT IN {NOT_OUTCOMES}
{"ORDER BY p.run_id, p.task_id, p.branch_index" if ordered else ""}
"""


#: $runs: a list of run ids; one row per branch with verdicts, ranking, task and typed messages.
EXPORT_BRANCHES = export_branches_sql("list_contains($runs, run_id)")

#: $run, $first, $last: the rows of :data:`EXPORT_BRANCHES` for one run's tasks ``$first`` .. ``$last``
#: (an export streams a run in such slices: what it holds at once is bounded by the slice).
#: Unordered: :meth:`~factory.store.Store.export_branch_slice` sorts it.
EXPORT_BRANCH_SLICE = export_branches_sql("run_id = $run AND task_id >= $first AND task_id <= $last", ordered=False)

#: $runs: the tasks an export reads, in its order (run, task), with how many branches of each are outcomes.
EXPORT_TASKS = f"""
    SELECT run_id, task_id, count(*)::BIGINT AS branches FROM branches
    WHERE list_contains($runs, run_id) AND status NOT IN {NOT_OUTCOMES}
    GROUP BY run_id, task_id ORDER BY run_id, task_id
    """

#: $runs, $size: the slices an export streams, in its order: consecutive whole tasks of one run, a slice closing
#: at the first task that takes it to $size outcome branches or more ($size NULL: one slice per run). One row
#: per slice (``run_id, first_task, last_task, branches, tasks, most``: branches, tasks and the most branches
#: of one task in it), so what an export holds of its task list does not grow with the run.
EXPORT_SLICES = f"""
    WITH t AS (SELECT run_id, task_id, count(*)::BIGINT AS branches FROM branches
               WHERE list_contains($runs, run_id) AND status NOT IN {NOT_OUTCOMES} GROUP BY run_id, task_id),
    s AS (SELECT *, CASE WHEN $size IS NULL THEN 0 ELSE
                 (sum(branches) OVER (PARTITION BY run_id ORDER BY task_id ROWS UNBOUNDED PRECEDING) - branches)
                 // $size END AS slice FROM t)
    SELECT run_id, min(task_id) AS first_task, max(task_id) AS last_task, sum(branches)::BIGINT AS branches,
           count(*)::BIGINT AS tasks, max(branches)::BIGINT AS most
    FROM s GROUP BY run_id, slice ORDER BY run_id, slice
    """

#: $run, $opinions: one row per task of a run (by task id) with an outcome branch: ``verified`` and ``passed``
#: (objective verdicts), ``unverified``, and how many branches have a ``judge_score`` / ``objective_score``
#: (what the ranker's signal reads): the run's ranking statistics when no branch has a signal, without
#: reading one row per branch.
RUN_OUTCOME_COUNTS = f"""
    WITH v AS ({verdict_summary_sql("run_id = $run")})
    SELECT count(v.objective_pass)::INTEGER AS verified,
           count(*) FILTER (WHERE v.objective_pass)::INTEGER AS passed,
           (count(*) - count(v.objective_pass))::INTEGER AS unverified,
           count(v.judge_score)::INTEGER AS judge_scores, count(v.objective_score)::INTEGER AS objective_scores
    FROM branches b LEFT JOIN v USING (run_id, task_id, branch_index)
    WHERE b.run_id = $run AND b.status NOT IN {NOT_OUTCOMES}
    GROUP BY b.task_id ORDER BY b.task_id
    """

#: $runs: per run, how many of its outcome branches have a stored rank.
RANKED_BRANCH_COUNTS = f"""
    SELECT b.run_id, count(r.rank)::BIGINT AS ranked FROM branches b
    LEFT JOIN (SELECT * FROM rankings WHERE list_contains($runs, run_id)) r USING (run_id, task_id, branch_index)
    WHERE list_contains($runs, b.run_id) AND b.status NOT IN {NOT_OUTCOMES} GROUP BY b.run_id
    """

#: $runs, $opinions: per branch with both, the judge's score and the objective verdict (what an export's
#: manifest compares: light columns only).
EXPORT_JUDGE_OBJECTIVE = f"""
    WITH v AS ({verdict_summary_sql("list_contains($runs, run_id)")})
    SELECT v.judge_score, v.objective_pass FROM v JOIN branches b USING (run_id, task_id, branch_index)
    WHERE b.status NOT IN {NOT_OUTCOMES} AND v.judge_score IS NOT NULL AND v.objective_pass IS NOT NULL
    ORDER BY run_id, task_id, branch_index
    """

#: ?: delete a run's stored ranking (before writing its new one).
DELETE_RANKINGS = "DELETE FROM rankings WHERE run_id = ?"

# ------------------------------------------------------------------ feedback

#: Order of feedback rows: by branch, then by where they sit in the trajectory (a turn before a span).
_FEEDBACK_ORDER = "run_id, task_id, branch_index, coalesce(turn, -1), coalesce(span_start, -1), source, feedback_id"

#: $run, $task, $status (each NULL for any): a run's feedback rows.
FEEDBACK = f"""
    SELECT * FROM feedback WHERE run_id = $run AND ($task IS NULL OR task_id = $task)
                                 AND ($status IS NULL OR status = $status)
    ORDER BY {_FEEDBACK_ORDER}
    """

#: ?: a list of feedback ids; those rows.
FEEDBACK_BY_IDS = f"SELECT * FROM feedback WHERE list_contains(?, feedback_id) ORDER BY {_FEEDBACK_ORDER}"

#: ?: a list of run ids; their accepted feedback (what the hints and spans exports read).
ACCEPTED_FEEDBACK = f"""
    SELECT * FROM feedback WHERE list_contains(?, run_id) AND status = 'accepted' ORDER BY {_FEEDBACK_ORDER}
    """

#: ?, ?: a status and a list of feedback ids; set their status.
SET_FEEDBACK_STATUS = "UPDATE feedback SET status = ? WHERE list_contains(?, feedback_id)"

# ------------------------------------------------------------------ memory

#: Row count and newest ``created_at``: changes whenever any writer adds or clears memories.
MEMORY_STATE = "SELECT count(*), max(created_at) FROM memory"

MEMORY_COUNT = "SELECT count(*) FROM memory"

#: ?: a list of memory ids; those already stored.
#: A semi-join on the unnested list: one hash probe per stored id, where ``list_contains`` scanned the list per row.
STORED_MEMORY_IDS = "SELECT memory_id FROM memory WHERE memory_id IN (SELECT unnest(?::VARCHAR[]))"

MEMORY_SPACES = "SELECT DISTINCT embedder, dim FROM memory"

#: ?, ?: embedder and dim; every memory of that space, vectors included, in id order.
MEMORY_SPACE = """
    SELECT memory_id, run_id, task_id, branch_index, task_text, key_steps, final_answer, embedder, dim, embedding
    FROM memory WHERE embedder = ? AND dim = ? ORDER BY memory_id
    """

#: ?, ?: embedder and dim; the metadata of every memory of that space, no vectors, in id order, with each row's
#: DuckDB ``rowid`` (``_row``: how :data:`MEMORY_VECTORS` batches are matched to these rows).
MEMORY_SPACE_META = """
    SELECT memory_id, run_id, task_id, branch_index, task_text, key_steps, final_answer, embedder, dim, rowid AS _row
    FROM memory WHERE embedder = ? AND dim = ? ORDER BY memory_id
    """

#: ?, ?, ?: embedder, dim and the lowest rowid wanted; ``rowid`` and vector of those rows, in storage order (no sort:
#: at 1M rows a sort would hold the 1.5 GB of vectors; the ``rowid`` bound skips the row groups below it).
MEMORY_VECTORS = "SELECT rowid AS _row, embedding FROM memory WHERE embedder = ? AND dim = ? AND rowid >= ?"

DELETE_MEMORIES = "DELETE FROM memory"

MEMORY_DISCARD_COUNTS = "SELECT reason, count(*) FROM memory_discards GROUP BY 1 ORDER BY 1"

DELETE_MEMORY_DISCARDS = "DELETE FROM memory_discards"
