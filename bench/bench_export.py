"""DPO export throughput and peak memory: ``factory.export.export`` against a plain-Python exporter and DuckDB's COPY.

Goals (issue 33): export 1,000,000 DPO pairs with realistic multi-turn
trajectories (about 2.8 KiB each) at least 5x faster (rows/s) than a
plain-Python exporter and at least as fast as DuckDB's own ``COPY`` of the
same rows, at a peak RSS of at most 2 GiB, and the same peak at 5,000,000
pairs (``--pairs 5000000 --skip-baselines``).

1. ``load``: a synthetic store (a real DuckDB file, ``Store.open``) with one
   run of N tasks x 4 branches, written as Arrow tables through
   ``Store._write`` in one transaction per chunk; not part of any figure.
   The pair strategy is ``all-pairs``: 4 ranked branches with distinct
   rewards give 6 pairs a task (166,667 tasks, 666,668 branches, 1,000,002
   pairs by default). Three tasks in four run in tool mode, multi-turn: 1 to
   4 tool rounds (a thought, a ``write_file`` / ``run`` / ``read_file`` call
   with JSON-object arguments, the tool's result) before the final reply;
   the rest are single-turn. The mean trajectory is printed (about 2.8 KiB
   of JSON). ``verdicts``: one ``answer@1`` verdict per branch; ``rankings``
   stored (rank 1..4, distinct rewards, strengths and intervals);
   ``events``: the ``run_start`` event carrying the ``mode``.

2. ``export``: ``factory.export.export(store, "dpo", [run], FILE,
   all-pairs)`` to ``.jsonl`` and ``.parquet`` with the store opened
   read-only as ``factory export`` opens it, each in a fresh process (as
   the command runs): wall time of the ``export()`` call and the process's
   peak RSS (interpreter and imports included).

3. baselines, on the store opened writable (DuckDB's memory limit for them:
   ``--baseline-memory``, 3 GB, spilling past it): the plain-Python
   exporter (one ``SELECT`` of the branches joined with their verdict,
   ranking and mode, fetched 10,000 rows at a time; ``json.loads`` of every
   trajectory, messages normalised to the exported shape, every ordered pair
   of a task with reward difference > 0 whose sides are not hacked, each row
   ``json.dumps`` to a line), and DuckDB alone (``COPY (SELECT ...) TO`` the
   same pairs with the same columns, as JSON and as zstd Parquet: the
   self-join, ``json_transform`` of the messages and the writer all in
   DuckDB, in parallel). Ratios: ours rows/s over each baseline's.

4. ``check`` (untimed): the three files hold the same rows and triples; a
   few sampled tasks agree column by column.

5. ``breakdown``: the steps of a streaming export run one by one over the
   same slices (slice query, pairs, output columns, JSONL serialization,
   hashing and writing, Parquet), each summed, and the pass's peak RSS.

Each measurement runs once (``--repeat`` for more; the best is kept). The
machine may be shared: the load average at start and end is printed.

Usage: python bench/bench_export.py [--pairs 1000000] [--repeat 1] [--seed 0] [--workdir DIR] [--skip-breakdown]
       [--skip-baselines] [--formats jsonl,parquet] [--batch-branches 8192] [--baseline-memory 3GB] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from _results import RESULTS, loadavg, print_table, record  # bench/ is on sys.path

from factory.export import ExportOptions, PairOptions, export
from factory.export._source import BATCH_BRANCHES
from factory.rollouts._agent import ANSWER_SYSTEM_PROMPT, TOOL_SYSTEM_PROMPT
from factory.store import Store

RUN = "bench-export"
BRANCHES = 4
PAIRS_PER_TASK = BRANCHES * (BRANCHES - 1) // 2
CHUNK_TASKS = 25_000
GOAL = 5.0
PEAK_GOAL_MB = 2048
WORDS = ["sort", "parse", "list", "string", "file", "number", "date", "csv", "json", "http", "count", "sum", "reverse",
         "merge", "split", "filter", "map", "tree", "graph", "path", "queue", "stack", "cache", "retry", "timeout",
         "error", "log", "config", "table", "row", "column", "index", "key", "value", "token", "batch", "stream",
         "socket", "thread", "lock", "async", "test", "mock", "fixture", "the", "a", "of", "and", "then", "so",
         "because", "we", "it", "is", "returns", "first", "next", "carry", "one", "two", "seven", "twelve."]
#: The tool rounds of a multi-turn branch, in turn: tool name and its arguments from a slice of text.
TOOL_CALLS = (("write_file", lambda body: {"path": "solution.py", "content": body}),
              ("run", lambda body: {"command": "python -m pytest -q tests/ -k " + body[:40].split()[0]}),
              ("read_file", lambda body: {"path": "tests/test_solution.py"}),
              ("write_file", lambda body: {"path": "solution.py", "content": body}))
PROVENANCE = ("run_id", "task_id", "chosen_branch", "rejected_branch", "chosen_score", "rejected_score",
              "chosen_reward", "rejected_reward", "chosen_strength", "rejected_strength", "verifier_versions")


# ------------------------------------------------------------------ memory


_MAX_SEEN = [0.0]  # the highest peak read before any reset: the whole run's peak


def peak_rss_mb() -> float:
    """Peak RSS since start (or since the last :func:`reset_peak`), MiB: VmHWM, else getrusage."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    except OSError:
        pass
    _MAX_SEEN[0] = max(_MAX_SEEN[0], peak)
    return peak


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS; False where not allowed."""
    peak_rss_mb()  # remember the peak so far
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def whole_run_peak_mb() -> float:
    """The process's peak RSS over the whole run (the maximum of getrusage and every peak read before a reset)."""
    peak_rss_mb()
    return max(_MAX_SEEN[0], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)




def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f} rows/s"


# ------------------------------------------------------------------ the synthetic store


class Text:
    """Seeded filler text: slices of one long string of words (fast to cut, varied in length)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.corpus = " ".join(rng.choice(WORDS, 600_000))

    def cut(self, lengths: np.ndarray) -> list[str]:
        starts = self.rng.integers(0, len(self.corpus) - int(lengths.max()) - 1, len(lengths))
        corpus = self.corpus
        return [corpus[s:s + n].strip() or "ok" for s, n in zip(starts.tolist(), lengths.tolist())]

    def lengths(self, n: int, median: float, low: int, high: int) -> np.ndarray:
        return np.clip(self.rng.lognormal(math.log(median), 0.8, n), low, high).astype(np.int64)


def chunk_tables(first: int, n: int, text: Text, started: datetime) -> dict[str, pa.Table]:
    """Arrow tables of tasks ``first .. first + n - 1`` and their branches, verdicts, rankings, run_start events."""
    rng = text.rng
    task_ids = [f"task-{i:07d}" for i in range(first, first + n)]
    tool_task = np.arange(first, first + n) % 4 != 0  # three tasks in four run in tool mode
    prompts = text.cut(text.lengths(n, 220, 30, 1200))
    answers = [str(i % 997) for i in range(first, first + n)]
    specs = [json.dumps({"id": t, "prompt": p, "answer": a, "files": {}, "tests": {}, "test_command": None,
                         "verifiers": ["answer"]}, sort_keys=True) for t, p, a in zip(task_ids, prompts, answers)]
    tasks = pa.table({
        "run_id": [RUN] * n, "task_id": task_ids, "task_hash": [f"h{i:015x}" for i in range(first, first + n)],
        "prompt": prompts, "verifiers": pa.array([["answer"]] * n, pa.list_(pa.string())), "spec": specs})

    m = n * BRANCHES
    task_of = np.repeat(np.arange(n), BRANCHES)
    branch_index = np.tile(np.arange(BRANCHES, dtype=np.int32), n)
    # ranks: a random permutation of 1..4 per task; the best n_pass ranks pass (1..3 per task)
    ranks = np.argsort(rng.random((n, BRANCHES)), axis=1).reshape(-1).astype(np.int32) + 1
    n_pass = np.repeat(rng.integers(1, BRANCHES, n), BRANCHES)
    passed = ranks <= n_pass
    reward = passed.astype(np.float64) + 0.05 * (BRANCHES - ranks) + rng.random(m) * 0.01  # distinct per task
    strength = (BRANCHES + 1) / 2 - ranks + rng.normal(0, 0.1, m)
    half = rng.uniform(0.3, 1.2, m)
    reply = text.cut(text.lengths(m, 400, 8, 4000))
    is_tool = tool_task[task_of]
    # multi-turn: a tool-mode branch makes 1..4 tool rounds (a thought, a call, the tool's result) before its reply
    rounds = np.where(is_tool, rng.integers(1, 5, m), 0)
    n_calls = int(rounds.sum())
    thoughts = iter(text.cut(text.lengths(n_calls, 70, 5, 400)))
    tool_args = iter(text.cut(text.lengths(n_calls, 330, 20, 2000)))
    tool_out = iter(text.cut(text.lengths(n_calls, 220, 10, 1200)))
    trajectories, finals = [], []
    for j in range(m):
        t = task_of[j]
        answer = answers[t] if passed[j] else str(int(answers[t]) + 1 + j % 7)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": TOOL_SYSTEM_PROMPT if is_tool[j] else ANSWER_SYSTEM_PROMPT},
            {"role": "user", "content": prompts[t] + ("\n\nWorkspace files: solution.py" if is_tool[j] else "")}]
        for k in range(int(rounds[j])):
            name, arguments = TOOL_CALLS[k % len(TOOL_CALLS)]
            call = {"id": f"call_{k}", "type": "function",
                    "function": {"name": name, "arguments": arguments(next(tool_args))}}
            messages += [{"role": "assistant", "content": next(thoughts), "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": f"call_{k}", "name": name, "content": next(tool_out)}]
        messages.append({"role": "assistant", "content": f"{reply[j]}\nFinal: {answer}"})
        trajectories.append(json.dumps(messages))
        finals.append(answer)
    tids = [task_ids[t] for t in task_of.tolist()]
    stamps = pa.array([started] * m, pa.timestamp("us"))
    branches = pa.table({
        "run_id": [RUN] * m, "task_id": tids, "branch_index": branch_index,
        "session_id": [f"{tid}-b{b}-{first * BRANCHES + j:08x}" for j, (tid, b) in
                       enumerate(zip(tids, branch_index.tolist()))],
        "rollout_id": tids, "temperature": np.full(m, 0.8), "seed": np.arange(first * BRANCHES, first * BRANCHES + m),
        "model": ["replay:bench"] * m, "status": ["ok"] * m, "final_answer": finals, "trajectory": trajectories,
        "usage": ['{"input_tokens": 300, "output_tokens": 120}'] * m,
        "input_tokens": np.full(m, 300), "output_tokens": np.full(m, 120),
        "started_at": stamps, "finished_at": stamps})
    verdicts = pa.table({
        "run_id": [RUN] * m, "task_id": tids, "branch_index": branch_index, "verifier": ["answer"] * m,
        "version": ["1"] * m, "ok": passed, "score": passed.astype(np.float64),
        "status": np.where(passed, "pass", "fail").tolist(),
        "details": [json.dumps({"expected": answers[t], "got": f, "hack_detected": False})
                    for t, f in zip(task_of.tolist(), finals)],
        "created_at": stamps})
    rankings = pa.table({
        "run_id": [RUN] * m, "task_id": tids, "branch_index": branch_index, "rank": ranks, "strength": strength,
        "ci_low": strength - half, "ci_high": strength + half, "reward": reward,
        "components": [f'{{"objective": {float(p)}}}' for p in passed.tolist()], "created_at": stamps})
    events = pa.table({
        "run_id": [RUN] * m, "task_id": tids, "branch_index": branch_index, "seq": np.zeros(m, dtype=np.int32),
        "ts": stamps, "kind": ["run_start"] * m,
        "payload": [json.dumps({"task_id": tid, "model": "replay:bench", "temperature": 0.8, "seed": j,
                                "mode": "tools" if tool else "single-turn", "max_turns": 8})
                    for j, (tid, tool) in enumerate(zip(tids, is_tool.tolist()))]})
    return {"tasks": tasks, "branches": branches, "verdicts": verdicts, "rankings": rankings, "events": events}


def build_store(path: Path, n_tasks: int, seed: int) -> tuple[Store, float]:
    """The synthetic store (see the module docstring), and the seconds it took to write."""
    text = Text(np.random.default_rng(seed))
    started = datetime(2026, 1, 1)
    start = time.perf_counter()
    store = Store.open(path)
    with store.transaction():
        store._write("runs", pa.table({
            "run_id": [RUN], "created_at": pa.array([started], pa.timestamp("us")),
            "finished_at": pa.array([started + timedelta(hours=1)], pa.timestamp("us")), "status": ["finished"],
            "task_file": ["bench.jsonl"], "dataset_hash": ["sha256:bench-dataset"],
            "config_hash": ["sha256:bench-config"], "model": ["replay:bench"], "sandbox": ["none"],
            "n_branches": pa.array([BRANCHES], pa.int32()), "config": ['{"branches": 4}']}))
    for first in range(0, n_tasks, CHUNK_TASKS):
        tables = chunk_tables(first, min(CHUNK_TASKS, n_tasks - first), text, started)
        with store.transaction():
            for name, table in tables.items():
                store._write(name, table, replace=False)  # a fresh store: plain INSERT
    store._con.execute("CHECKPOINT")
    return store, time.perf_counter() - start


def reuse_store(path: Path, n_tasks: int) -> tuple[Store, float]:
    """A store kept by an earlier ``--store`` run: refused unless it holds exactly ``n_tasks`` tasks."""
    store = Store.open(path)
    held = store._con.execute("SELECT count(*) FROM tasks WHERE run_id = ?", [RUN]).fetchone()[0]
    if held != n_tasks:
        store.close()
        raise SystemExit(f"{path} holds {held:,} tasks, not {n_tasks:,}: give another --store or remove it")
    print(f"  reusing {path} (built by an earlier run)", flush=True)
    return store, 0.0


# ------------------------------------------------------------------ the plain-Python baseline

BASELINE_SQL = """
SELECT b.task_id, b.branch_index, b.trajectory, v.status, v.score, v.details, v.verifier, v.version,
       r.rank, r.reward, r.strength, json_extract_string(e.payload, '$.mode') AS mode
FROM branches b
JOIN verdicts v USING (run_id, task_id, branch_index)
JOIN rankings r USING (run_id, task_id, branch_index)
LEFT JOIN (SELECT * FROM events WHERE kind = 'run_start') e USING (run_id, task_id, branch_index)
WHERE b.run_id = ?
ORDER BY b.task_id, b.branch_index
"""


def _message(m: dict[str, Any]) -> dict[str, Any]:
    calls = m.get("tool_calls")
    if calls is not None:
        calls = [{"id": c.get("id"), "type": c.get("type"),
                  "function": {"name": c["function"].get("name"),
                               "arguments": json.dumps(c["function"].get("arguments"), separators=(",", ":"))}}
                 for c in calls]
    return {"role": m.get("role"), "content": m.get("content"), "name": m.get("name"),
            "tool_call_id": m.get("tool_call_id"), "tool_calls": calls}


def baseline_export(store: Store, path: Path, tools_json: str) -> int:
    """Plain Python: fetch rows, build all-pairs DPO dicts in loops, ``json.dumps`` each to a line. Returns rows."""
    cursor = store._con.execute(BASELINE_SQL, [RUN])
    rows = (row for chunk in iter(lambda: cursor.fetchmany(10_000), []) for row in chunk)  # streamed, not fetchall
    written = 0
    with path.open("w", encoding="utf-8") as out:

        def flush(task_id: str, group: list[dict[str, Any]]) -> int:
            count = 0
            for c in group:
                if c["hacked"]:
                    continue
                for r in group:
                    margin = c["reward"] - r["reward"]
                    if r is c or r["hacked"] or margin <= 1e-12:
                        continue
                    row = {"prompt": c["prompt"], "chosen": c["completion"], "rejected": r["completion"],
                           "tools": tools_json if c["mode"] == "tools" else None, "margin": margin,
                           "run_id": RUN, "task_id": task_id, "chosen_branch": c["branch"],
                           "rejected_branch": r["branch"], "chosen_score": c["score"], "rejected_score": r["score"],
                           "chosen_reward": c["reward"], "rejected_reward": r["reward"],
                           "chosen_strength": c["strength"], "rejected_strength": r["strength"],
                           "verifier_versions": sorted(set(c["versions"]) | set(r["versions"]))}
                    out.write(json.dumps(row) + "\n")
                    count += 1
            return count

        current, group = None, []
        for (task_id, branch, trajectory, status, score, details, verifier, version, rank, reward, strength,
             mode) in rows:
            if task_id != current:
                if group:
                    written += flush(current, group)
                current, group = task_id, []
            if rank is None or status not in ("pass", "fail"):
                continue
            messages = [_message(m) for m in json.loads(trajectory)]
            group.append({"branch": branch, "prompt": messages[:2], "completion": messages[2:],
                          "score": score or 0.0, "reward": reward, "strength": strength,
                          "hacked": bool(json.loads(details or "{}").get("hack_detected")),
                          "versions": [f"{verifier}@{version}"], "mode": mode or "single-turn"})
        if group:
            written += flush(current, group)
    return written


# ------------------------------------------------------------------ DuckDB's own COPY of the same rows

COPY_SQL = """
COPY (
WITH b AS (
    SELECT b.run_id, b.task_id, b.branch_index, json_transform(b.trajectory, '[{shape}]') AS messages,
           v.score, r.reward, r.strength, v.verifier || '@' || v.version AS version,
           coalesce(json_extract_string(e.payload, '$.mode'), 'single-turn') AS mode,
           coalesce(TRY_CAST(json_extract(v.details, '$.hack_detected') AS BOOLEAN), false) AS hacked
    FROM branches b
    JOIN verdicts v USING (run_id, task_id, branch_index)
    JOIN rankings r USING (run_id, task_id, branch_index)
    LEFT JOIN (SELECT * FROM events WHERE kind = 'run_start') e USING (run_id, task_id, branch_index)
    WHERE b.run_id = '{run}' AND v.status IN ('pass', 'fail'))
SELECT c.messages[1:2] AS prompt, c.messages[3:] AS chosen, r.messages[3:] AS rejected,
       CASE WHEN c.mode = 'tools' THEN '{tools}' END AS tools, c.reward - r.reward AS margin,
       c.run_id, c.task_id, c.branch_index AS chosen_branch, r.branch_index AS rejected_branch,
       c.score AS chosen_score, r.score AS rejected_score, c.reward AS chosen_reward, r.reward AS rejected_reward,
       c.strength AS chosen_strength, r.strength AS rejected_strength,
       list_sort(list_distinct([c.version, r.version])) AS verifier_versions
FROM b c JOIN b r ON c.run_id = r.run_id AND c.task_id = r.task_id AND c.branch_index <> r.branch_index
WHERE NOT c.hacked AND NOT r.hacked AND c.reward - r.reward > 1e-12
) TO '{path}' ({options})
"""


def copy_export(store: Store, path: Path, tools_json: str) -> int:
    """DuckDB alone: the same pairs, built and written by one ``COPY (SELECT ...) TO`` (JSON or zstd Parquet)."""
    from factory.store._queries import MESSAGE_JSON_SHAPE

    options = "FORMAT JSON" if path.suffix == ".jsonl" else "FORMAT PARQUET, COMPRESSION ZSTD"
    sql = COPY_SQL.format(shape=MESSAGE_JSON_SHAPE, run=RUN, tools=tools_json.replace("'", "''"),
                          path=str(path).replace("'", "''"), options=options)
    store._con.execute(sql)
    return pq.ParquetFile(path).metadata.num_rows if path.suffix == ".parquet" else count_lines(path)


# ------------------------------------------------------------------ measurement


LAST_CPU_S = [0.0]  # the process CPU seconds (every thread) of the best run of the last timed() call


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        if time.perf_counter() - start < best:
            best, LAST_CPU_S[0] = time.perf_counter() - start, time.process_time() - start_cpu
    return best, result


def count_lines(path: Path) -> int:
    n = 0
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            n += block.count(b"\n")
    return n


def triples(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.select("task_id", "chosen_branch", "rejected_branch").sort(pl.all())


def iter_sample(frame: pl.DataFrame) -> Iterator[dict[str, Any]]:
    yield from frame.sort("task_id", "chosen_branch", "rejected_branch").iter_rows(named=True)


def same_row(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Columns where two exported rows differ (floats to 1e-9, message lists with nulls as given)."""
    bad = []
    for key in ("prompt", "chosen", "rejected", "tools", "margin", *PROVENANCE):
        x, y = a.get(key), b.get(key)
        if isinstance(x, float) or isinstance(y, float):
            if x is None or y is None or abs(x - y) > 1e-9:
                bad.append(key)
        elif x != y:
            bad.append(key)
    return bad


def check(ours_jsonl: Path, ours_parquet: Path, base: Path, n_base: int, seed: int) -> None:
    """Row counts, every triple (Parquet vs baseline), and whole rows of a few sampled tasks in all three files."""
    print("\ncheck (untimed)", flush=True)
    n_jsonl, n_parquet = count_lines(ours_jsonl), pq.ParquetFile(ours_parquet).metadata.num_rows
    same_count = n_jsonl == n_parquet == n_base
    print(f"  rows: ours jsonl {n_jsonl:,}  ours parquet {n_parquet:,}  baseline {n_base:,}", flush=True)
    record("check", "rows ours jsonl / parquet / baseline", f"{n_jsonl:,} / {n_parquet:,} / {n_base:,}",
           goal="equal", ok=same_count)

    keys = ["task_id", "chosen_branch", "rejected_branch"]
    ours_t = triples(pl.read_parquet(ours_parquet, columns=keys))
    base_t = triples(pl.scan_ndjson(base, schema={k: pl.String if k == "task_id" else pl.Int64 for k in keys})
                     .select(keys).collect().with_columns(pl.col(keys[1:]).cast(ours_t[keys[1]].dtype)))
    same_triples = ours_t.equals(base_t)
    print(f"  (task, chosen, rejected) triples, parquet vs baseline: {'identical' if same_triples else 'DIFFER'}",
          flush=True)
    record("check", "all triples parquet = baseline", "identical" if same_triples else "differ", goal="identical",
           ok=same_triples)

    tasks = ours_t["task_id"].unique().sort()
    sample = tasks.sample(min(5, len(tasks)), seed=seed).to_list()
    want = pl.col("task_id").is_in(sample)
    ours_j = pl.scan_ndjson(ours_jsonl, infer_schema_length=None).filter(want).collect()
    ours_p = pl.read_parquet(ours_parquet).filter(want)
    with base.open(encoding="utf-8") as handle:
        base_rows = [r for line in handle if any(f'"{t}"' in line for t in sample) for r in [json.loads(line)]
                     if r["task_id"] in sample]
    base_rows.sort(key=lambda r: (r["task_id"], r["chosen_branch"], r["rejected_branch"]))
    problems = []
    rows_j, rows_p = list(iter_sample(ours_j)), list(iter_sample(ours_p))
    if not len(rows_j) == len(rows_p) == len(base_rows):
        problems.append(f"sampled rows: jsonl {len(rows_j)}, parquet {len(rows_p)}, baseline {len(base_rows)}")
    for rj, rp, rb in zip(rows_j, rows_p, base_rows):
        for name, other in (("parquet", rp), ("baseline", rb)):
            bad = same_row(rj, other)
            if bad:
                problems.append(f"{rj['task_id']} {rj['chosen_branch']}>{rj['rejected_branch']}: "
                                f"jsonl vs {name} differ in {', '.join(bad)}")
    for p in problems[:10]:
        print(f"  {p}", flush=True)
    print(f"  whole rows of {len(sample)} sampled tasks ({len(rows_j)} pairs): "
          f"{'jsonl = parquet = baseline' if not problems else f'{len(problems)} difference(s)'}", flush=True)
    record("check", f"whole rows, {len(sample)} sampled tasks ({len(rows_j)} pairs)",
           "all three agree" if not problems else f"{len(problems)} difference(s)", goal="agree", ok=not problems)


def breakdown(store: Store, out: Path, options: ExportOptions, batch_branches: int) -> None:
    """The steps of a streaming DPO export, each summed over the slices, with the peak RSS of the whole pass."""
    import hashlib

    from factory.export import _formats
    from factory.export._source import load_source
    from factory.export._writers import RowWriter
    from factory.provenance import git_sha

    reset_peak()
    print(f"\nbreakdown (the steps of a streaming export, run one by one, summed over slices of {batch_branches:,} "
          "branches)", flush=True)
    totals: dict[str, float] = {}
    cpu: dict[str, float] = {}  # the process's CPU seconds (every thread, DuckDB's too): what load does not inflate

    def step(name: str, fn: Callable[[], Any]) -> Any:
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        totals[name] = totals.get(name, 0.0) + time.perf_counter() - start
        cpu[name] = cpu.get(name, 0.0) + time.process_time() - start_cpu
        return result

    source = step("load_source: slice bounds + ranking statistics", lambda: load_source(store, [RUN]))
    parquet = RowWriter(out / "breakdown.parquet", "parquet")
    digest = hashlib.sha256()
    slices = list(store.export_slices([RUN], batch_branches)
                  .select("run_id", "first_task", "last_task", "branches").iter_rows())
    with (out / "breakdown.jsonl").open("wb") as jsonl:
        for run_id, first, last, _n in slices:
            batch = step("store: slice query (DuckDB -> Arrow -> Polars)",
                         lambda r=run_id, f=first, la=last: store.export_branch_slice(r, f, la,
                                                                                     opinions=source.opinions))
            pairs = step("build_pairs (Polars self-join, sort, Arrow take)",
                         lambda b=batch: _formats.build_pairs(b, options.pairs))
            step("length bias sums", lambda p=pairs: _formats.LengthBias().add(p))
            rows = step("select output columns (+ tools)", lambda p=pairs: p.select(
                *_formats._pair_columns(options), pl.col("margin"), *_formats._pair_provenance()))
            data = step("JSONL: write_ndjson of the slice", lambda r=rows: r.write_ndjson().encode())
            step("JSONL: sha256 + write", lambda d=data: (digest.update(d), jsonl.write(d)))
            step("Parquet: to_arrow + zstd row groups (+ sha256)", lambda r=rows: parquet.write(r))
            del batch, pairs, rows, data
    parquet.close()
    step("manifest: judge_objective_agreement", lambda: _exporter_agreement(source))
    step("manifest: git_sha", lambda: git_sha(Path(__file__).resolve().parent))
    peak = peak_rss_mb()
    for name, seconds in totals.items():
        print(f"  {name:<52} {seconds:8.2f} s wall {cpu[name]:8.2f} s CPU", flush=True)
        record("breakdown", name, f"{seconds:.2f} s", ratio=f"{cpu[name]:.2f} s CPU")
    print(f"  {len(slices)} slices; peak RSS of the whole pass {peak:,.0f} MiB", flush=True)
    record("breakdown", f"peak RSS of the pass ({len(slices)} slices)", f"{peak:,.0f} MiB")
    for path in (out / "breakdown.jsonl", out / "breakdown.parquet"):
        path.unlink(missing_ok=True)


def _exporter_agreement(source: Any) -> Any:
    from factory.export._exporter import judge_objective_agreement

    return judge_objective_agreement(source.judge_objective())


def child_export(db: Path, path: Path, repeat: int, batch_branches: int) -> None:
    """``--child-export``: one export in this fresh process; print seconds, rows and the process's peak RSS."""
    options = ExportOptions(pairs=PairOptions(strategy="all-pairs"))
    with Store.open(db, read_only=True) as store:
        before = peak_rss_mb()
        cpu_start = os.times()
        seconds, result = timed(lambda: export(store, "dpo", [RUN], path, options, batch_branches=batch_branches),
                                repeat)
        cpu_end = os.times()
    # VmHWM, not getrusage: Linux carries ru_maxrss across execve, so a child would report its parent's peak
    # CPU seconds (user + system, every thread): on a shared machine the wall time is mostly the load's
    print(json.dumps({"seconds": seconds, "rows": result.manifest.rows, "peak_mb": peak_rss_mb(),
                      "before_mb": before, "cpu_s": round(cpu_end.user - cpu_start.user
                                                          + cpu_end.system - cpu_start.system, 2)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child-export", nargs=2, metavar=("DB", "FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=int, default=1_000_000, help="DPO pairs to export (6 per task)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measurement (best kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="where the store and exported files go (default: a temp dir)")
    parser.add_argument("--skip-breakdown", action="store_true", help="skip the step-by-step breakdown")
    parser.add_argument("--skip-baselines", action="store_true",
                        help="ours only (peak RSS at a size where the baselines would not fit)")
    parser.add_argument("--formats", default="jsonl,parquet", help="which of our files to write")
    parser.add_argument("--batch-branches", type=int, default=BATCH_BRANCHES, help="branches per slice")
    parser.add_argument("--baseline-memory", default="3GB", help="DuckDB's memory limit for the two baselines")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10,000 pairs")
    parser.add_argument("--store", default=None,
                        help="keep the synthetic store here and reuse it when it already holds --pairs pairs "
                             "(building 1M pairs takes minutes; an export run then skips it)")
    parser.add_argument("--json", default=None, help="also write the results table (and the run's facts) here")
    args = parser.parse_args()
    if args.child_export:
        child_export(Path(args.child_export[0]), Path(args.child_export[1]), args.repeat, args.batch_branches)
        return
    if args.quick:
        args.pairs = 10_000
    n_tasks = math.ceil(args.pairs / PAIRS_PER_TASK)
    n_pairs = n_tasks * PAIRS_PER_TASK

    from factory.export._formats import tool_schemas_json

    started = time.perf_counter()
    load_start = loadavg()
    print(f"cpus {os.cpu_count()}, load average at start {load_start}", flush=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp_name:
        tmp = Path(tmp_name)
        db = Path(args.store) if args.store else tmp / "bench.duckdb"
        print(f"\nload: {n_tasks:,} tasks x {BRANCHES} branches = {n_tasks * BRANCHES:,} branches "
              f"-> {n_pairs:,} all-pairs DPO pairs", flush=True)
        store, load_s = reuse_store(db, n_tasks) if db.exists() else build_store(db, n_tasks, args.seed)
        mean_trajectory = store._con.execute("SELECT avg(strlen(trajectory)) FROM branches").fetchone()[0]
        store.close()
        size = db.stat().st_size
        speed = f"{n_tasks * BRANCHES / load_s:,.0f} branches/s" if load_s else "reused"
        print(f"  load {load_s:7.1f} s  ({speed}, Arrow through Store._write; "
              f"store {size / 2**20:,.0f} MiB; mean trajectory {mean_trajectory:,.0f} bytes of JSON)   "
              f"peak RSS {peak_rss_mb():,.0f} MiB", flush=True)
        record("load", f"store of {n_tasks * BRANCHES:,} branches (not measured)", f"{load_s:.1f} s",
               ratio=f"{size / 2**20:,.0f} MiB on disk, {mean_trajectory:,.0f} B/trajectory")

        options = ExportOptions(pairs=PairOptions(strategy="all-pairs"))
        out = tmp / "out"
        out.mkdir()
        ours: dict[str, tuple[float, int, Path]] = {}
        ours_cpu: dict[str, float] = {}
        print(f"\nexport: factory.export.export(store, 'dpo', ['{RUN}'], FILE, all-pairs), store opened read-only "
              "as `factory export` opens it", flush=True)
        for ext in args.formats.split(","):
            path = out / f"dpo.{ext}"
            # in a fresh process, as `factory export` runs: its peak RSS is the export's own
            child = subprocess.run([sys.executable, __file__, "--child-export", str(db), str(path), "--repeat",
                                    str(args.repeat), "--batch-branches", str(args.batch_branches)],
                                   capture_output=True, text=True, check=True)
            report = json.loads(child.stdout.strip().splitlines()[-1])
            seconds, n, peak, before = report["seconds"], report["rows"], report["peak_mb"], report["before_mb"]
            ours[ext] = (seconds, n, path)
            ours_cpu[ext] = report["cpu_s"]
            print(f"  ours .{ext:<8} {seconds:7.1f} s  {rate(n, seconds):>16}  ({n:,} rows, "
                  f"{path.stat().st_size / 2**20:,.0f} MiB)   peak RSS {peak:,.0f} MiB "
                  f"(the process before the export: {before:,.0f} MiB); {report['cpu_s']:,.1f} s CPU", flush=True)
            record("export", f"ours .{ext} peak RSS ({n:,} rows)", f"{peak:,.0f} MiB", goal=f"<= {PEAK_GOAL_MB:,} MiB",
                   ok=peak <= PEAK_GOAL_MB)
            record("export", f"ours .{ext} wall time (CPU)", f"{seconds:.1f} s ({report['cpu_s']:.1f} s CPU)",
                   ratio=rate(n, seconds))

        if not args.skip_baselines:
            store = Store.open(db)  # writable: COPY TO a file is refused on a read-only (sealed) store
            # the baselines sort and join every branch at once: DuckDB spills past this instead of taking the machine
            store._con.execute(f"SET memory_limit = '{args.baseline_memory}'")
            store._con.execute(f"SET temp_directory = '{tmp / 'spill'}'")
            tools_json = tool_schemas_json()
            base_path = tmp / "baseline.jsonl"
            reset_peak()
            base_s, n_base = timed(lambda: baseline_export(store, base_path, tools_json), args.repeat)
            base_cpu = LAST_CPU_S[0]
            print(f"  baseline       {base_s:7.1f} s  {rate(n_base, base_s):>16}  ({n_base:,} rows, "
                  f"{base_path.stat().st_size / 2**20:,.0f} MiB)   peak RSS {peak_rss_mb():,.0f} MiB; "
                  f"{base_cpu:,.1f} s CPU", flush=True)
            record("export", f"baseline python json.dumps -> .jsonl ({n_base:,} rows)", f"{base_s:.1f} s",
                   ratio=f"peak {peak_rss_mb():,.0f} MiB")
            copies: dict[str, tuple[float, int]] = {}
            for ext in ours:
                copy_path = tmp / f"copy.{ext}"
                reset_peak()
                try:
                    copy_s, n_copy = timed(lambda c=copy_path: copy_export(store, c, tools_json), args.repeat)
                except duckdb.OutOfMemoryException as exc:  # a result too: COPY needs more than --baseline-memory
                    print(f"  duckdb COPY .{ext:<4} out of memory at --baseline-memory {args.baseline_memory}: "
                          f"{str(exc).splitlines()[0]}", flush=True)
                    record("export", f"duckdb COPY -> .{ext}", "out of memory", ratio=args.baseline_memory)
                    copy_path.unlink(missing_ok=True)
                    continue
                copies[ext] = (copy_s, n_copy)
                print(f"  duckdb COPY .{ext:<4} {copy_s:7.1f} s  {rate(n_copy, copy_s):>16}  ({n_copy:,} rows, "
                      f"{copy_path.stat().st_size / 2**20:,.0f} MiB)   peak RSS {peak_rss_mb():,.0f} MiB; "
                  f"{LAST_CPU_S[0]:,.1f} s CPU", flush=True)
                record("export", f"duckdb COPY -> .{ext} ({n_copy:,} rows)", f"{copy_s:.1f} s",
                       ratio=f"peak {peak_rss_mb():,.0f} MiB")
                copy_path.unlink()
            for ext, (seconds, n, _) in ours.items():
                ratio = (n / seconds) / (n_base / base_s)
                print(f"  ours .{ext:<8} = {ratio:5.2f}x the baseline's rows/s; CPU seconds: the baseline's "
                      f"{base_cpu:,.1f} / ours {ours_cpu[ext]:,.1f} = {base_cpu / ours_cpu[ext]:.2f}x", flush=True)
                record("export", f"dpo all-pairs -> .{ext} vs plain Python ({n:,} rows)", rate(n, seconds),
                       rate(n_base, base_s), f"{ratio:.2f}x", f">= {GOAL:g}x", ratio >= GOAL)
                if ext not in copies:
                    continue
                copy_s, n_copy = copies[ext]
                vs_copy = (n / seconds) / (n_copy / copy_s)
                print(f"  ours .{ext:<8} = {vs_copy:5.2f}x DuckDB COPY's rows/s", flush=True)
                record("export", f"dpo all-pairs -> .{ext} vs DuckDB COPY .{ext}", rate(n, seconds),
                       rate(n_copy, copy_s), f"{vs_copy:.2f}x", ">= 1x", vs_copy >= 1)
            if "jsonl" in ours and "parquet" in ours:
                check(ours["jsonl"][2], ours["parquet"][2], base_path, n_base, args.seed)
            base_path.unlink()
            store.close()
        for _, _, path in ours.values():
            path.unlink()
        if not args.skip_breakdown:
            store = Store.open(db, read_only=True)
            breakdown(store, out, options, args.batch_branches)
            store.close()

    peak = whole_run_peak_mb()
    if args.json:
        facts = {"command": " ".join(sys.argv), "pairs": n_pairs, "cpus": os.cpu_count(), "load_start": load_start,
                 "load_end": loadavg(), "results": [vars(r) for r in RESULTS]}
        Path(args.json).write_text(json.dumps(facts, indent=1) + "\n")
    print(f"\npeak RSS of the whole run {peak:,.0f} MiB (the store's build included); load average at end {loadavg()}")
    record("process", "peak RSS (whole run, store build included; getrusage + VmHWM)", f"{peak:,.0f} MiB")
    print(f"total {time.perf_counter() - started:.0f} s")
    print_table()


if __name__ == "__main__":
    main()
