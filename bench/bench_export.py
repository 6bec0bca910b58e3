"""DPO export throughput: ``factory.export.export`` to JSONL and Parquet against a plain-Python baseline, in one run.

Goal (issue): export 1,000,000 DPO pairs from the store and write them at
least 5x faster (rows/s) than a plain-Python exporter that builds dicts and
``json.dumps`` them, measured in the same run.

1. ``load``: a synthetic store (a real DuckDB file, ``Store.open``) with one
   run of N tasks x 4 branches, written as Arrow tables through
   ``Store._write`` in one transaction per chunk (as ``bench_memory`` does);
   timed on its own, not part of any export figure. The pair strategy is
   ``all-pairs``, the realistic heavy case: every task has 4 ranked branches
   with distinct rewards, so each yields 4*3/2 = 6 pairs and
   ceil(pairs / 6) tasks give the pairs asked for (166,667 tasks, 666,668
   branches, 1,000,002 pairs by default).

   Rows look like a real fork (``tests/export/golden/dpo.jsonl``):
   ``runs`` (dataset and config hash), ``tasks`` (prompt, verifiers, spec),
   ``branches`` whose ``trajectory`` is system + user + assistant messages of
   varied lengths (seeded); a quarter of the tasks run in tool mode, where
   the assistant first makes a ``write_file`` tool call (``function.arguments``
   a JSON object), then a ``tool`` message answers, then the final assistant
   reply. ``verdicts``: one ``answer@1`` verdict per branch (pass/fail, score
   1/0, ``details.hack_detected`` false). ``rankings``: rank 1..4 with
   distinct rewards, strengths and their intervals (stored, so the export
   reads them and ranks nothing). ``events``: only the one ``run_start``
   event per branch (it carries the ``mode`` that fills the ``tools``
   column); a real fork also stores model/tool events, which the export's
   query filters out by ``kind``, so they are left out here.

2. ``export``: ``factory.export.export(store, "dpo", [run], FILE,
   ExportOptions(pairs=PairOptions(strategy="all-pairs")))`` to ``.jsonl``
   and to ``.parquet``, wall time end to end (the DuckDB query, ranking
   statistics, the Polars pair join, writing, the manifest with the file's
   sha256, the dataset card).

3. ``baseline``: plain Python over the same store, also end to end: one
   ``SELECT`` of the branches joined with their verdict, ranking and
   ``run_start`` mode (``fetchall``), then Python loops: ``json.loads`` of
   every trajectory and verdict detail, messages normalised to the exported
   shape (every key present, tool-call arguments as JSON text), per task
   every ordered pair with reward difference > 0 whose chosen side is not
   hacked, each row a dict with the same columns as ours written as
   ``json.dumps(row) + "\\n"``. Ratios are ours rows/s over the baseline's,
   for both of our files against the same baseline.

4. ``check`` (untimed): the three files hold the same number of rows and
   the same (task, chosen, rejected) triples (the Parquet's against the
   baseline's); for a few sampled tasks the rows of all three agree column
   by column.

5. ``breakdown`` (untimed against the goal): the steps of ``export()`` run
   one by one with the library's own functions, each with its wall time and
   peak RSS (the process peak is reset between steps through
   ``/proc/self/clear_refs``, where the kernel allows it).

Each measurement runs once (``--repeat`` for more; the best is kept). The
machine may be shared: other processes competing for the CPU slow every
figure, ours (multi-threaded DuckDB and Polars) more than the single-threaded
baseline; the load average at start and end is printed.

Usage: python bench/bench_export.py [--pairs 1000000] [--repeat 1] [--seed 0] [--workdir DIR] [--skip-breakdown]
       [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from _results import loadavg, print_table, record  # bench/ is on sys.path

from factory.export import ExportOptions, PairOptions, export
from factory.rollouts._agent import ANSWER_SYSTEM_PROMPT, TOOL_SYSTEM_PROMPT
from factory.store import Store

RUN = "bench-export"
BRANCHES = 4
PAIRS_PER_TASK = BRANCHES * (BRANCHES - 1) // 2
CHUNK_TASKS = 25_000
GOAL = 5.0
WORDS = ["sort", "parse", "list", "string", "file", "number", "date", "csv", "json", "http", "count", "sum", "reverse",
         "merge", "split", "filter", "map", "tree", "graph", "path", "queue", "stack", "cache", "retry", "timeout",
         "error", "log", "config", "table", "row", "column", "index", "key", "value", "token", "batch", "stream",
         "socket", "thread", "lock", "async", "test", "mock", "fixture", "the", "a", "of", "and", "then", "so",
         "because", "we", "it", "is", "returns", "first", "next", "carry", "one", "two", "seven", "twelve."]
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
    tool_task = np.arange(first, first + n) % 4 == 0
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
    reply = text.cut(text.lengths(m, 260, 8, 4000))
    is_tool = tool_task[task_of]
    tool_args = text.cut(text.lengths(m, 300, 20, 2000))
    tool_out = text.cut(text.lengths(m, 120, 10, 800))
    trajectories, finals = [], []
    for j in range(m):
        t = task_of[j]
        answer = answers[t] if passed[j] else str(int(answers[t]) + 1 + j % 7)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": TOOL_SYSTEM_PROMPT if is_tool[j] else ANSWER_SYSTEM_PROMPT},
            {"role": "user", "content": prompts[t] + ("\n\nWorkspace files: solution.py" if is_tool[j] else "")}]
        if is_tool[j]:
            call = {"id": "call_0", "type": "function",
                    "function": {"name": "write_file", "arguments": {"path": "solution.py", "content": tool_args[j]}}}
            messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "call_0", "name": "write_file", "content": tool_out[j]}]
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
    rows = store._con.execute(BASELINE_SQL, [RUN]).fetchall()
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


# ------------------------------------------------------------------ measurement


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
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


def breakdown(store: Store, out: Path, options: ExportOptions) -> None:
    """The steps of ``export()`` one by one, each with its wall time and peak RSS."""
    from factory.export import _exporter, _formats, _source
    from factory.export._files import write_rows
    from factory.export._pairs import build_pairs
    from factory.provenance import git_sha

    can_reset = reset_peak()
    print(f"\nbreakdown (the steps of export(), run one by one{'' if can_reset else '; peak RSS not resettable'})",
          flush=True)
    steps: list[tuple[str, float, float]] = []

    def step(name: str, fn: Callable[[], Any]) -> Any:
        reset_peak()
        start = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - start
        steps.append((name, elapsed, peak_rss_mb()))
        print(f"  {name:<44} {elapsed:8.2f} s   peak RSS {peak_rss_mb():9,.0f} MiB", flush=True)
        return result

    branches = step("load_source: branches query (DuckDB -> Polars)",
                    lambda: store.query(_source._BRANCHES_SQL, {"runs": [RUN]}))
    runs = {RUN: store.run(RUN)}
    src = _source.ExportSource(branches, runs)
    step("load_source: _rank (stored ranking stats)", lambda: _source._rank(store, src, 100))
    held: dict[str, pl.DataFrame] = {}  # dropped once used, as DPOFormat.build drops its pairs before the write
    held["pairs"] = step("build_pairs (Polars self-join, sort)", lambda: build_pairs(src.branches, options.pairs))
    stats: dict[str, Any] = {}
    held["pairs"] = step("_filter_pairs (length bias stats)",
                         lambda: _formats._filter_pairs(held["pairs"], options, stats))
    rows = step("select output columns (+ tools)", lambda: held.pop("pairs").select(
        *_formats._pair_columns(options), pl.col("margin"), *_formats._pair_provenance()))
    jsonl, parquet = out / "breakdown.jsonl", out / "breakdown.parquet"
    step("write_rows .jsonl (write_ndjson)", lambda: write_rows(rows, jsonl))
    step("write_rows .parquet (zstd)", lambda: write_rows(rows, parquet))
    step("manifest: sha256 of the .jsonl", lambda: _exporter._sha256(jsonl))
    step("manifest: sha256 of the .parquet", lambda: _exporter._sha256(parquet))
    step("manifest: tasks count (unique)", lambda: src.branches.select("run_id", "task_id").unique().height)
    step("manifest: judge_objective_agreement", lambda: _exporter.judge_objective_agreement(src.branches))
    step("manifest: git_sha", lambda: git_sha(Path(_exporter.__file__).resolve().parent))
    for name, seconds, peak in steps:
        record("breakdown", name, f"{seconds:.2f} s", ratio=f"peak {peak:,.0f} MiB")
    for path in (jsonl, parquet):
        path.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1_000_000, help="DPO pairs to export (6 per task)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measurement (best kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="where the store and exported files go (default: a temp dir)")
    parser.add_argument("--skip-breakdown", action="store_true", help="skip the step-by-step breakdown")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10,000 pairs")
    args = parser.parse_args()
    if args.quick:
        args.pairs = 10_000
    n_tasks = math.ceil(args.pairs / PAIRS_PER_TASK)
    n_pairs = n_tasks * PAIRS_PER_TASK

    from factory.export._formats import tool_schemas_json

    started = time.perf_counter()
    print(f"cpus {os.cpu_count()}, load average at start {loadavg()}", flush=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp_name:
        tmp = Path(tmp_name)
        print(f"\nload: {n_tasks:,} tasks x {BRANCHES} branches = {n_tasks * BRANCHES:,} branches "
              f"-> {n_pairs:,} all-pairs DPO pairs", flush=True)
        store, load_s = build_store(tmp / "bench.duckdb", n_tasks, args.seed)
        size = (tmp / "bench.duckdb").stat().st_size
        print(f"  load {load_s:7.1f} s  ({n_tasks * BRANCHES / load_s:,.0f} branches/s, Arrow through Store._write; "
              f"store {size / 2**20:,.0f} MiB)   peak RSS {peak_rss_mb():,.0f} MiB", flush=True)
        record("load", f"store of {n_tasks * BRANCHES:,} branches (not measured)", f"{load_s:.1f} s",
               ratio=f"{size / 2**20:,.0f} MiB on disk")

        options = ExportOptions(pairs=PairOptions(strategy="all-pairs"))
        out = tmp / "out"
        out.mkdir()
        ours: dict[str, tuple[float, int, Path]] = {}
        print(f"\nexport: factory.export.export(store, 'dpo', ['{RUN}'], FILE, all-pairs)", flush=True)
        for ext in ("jsonl", "parquet"):
            path = out / f"dpo.{ext}"
            reset_peak()
            seconds, result = timed(lambda p=path: export(store, "dpo", [RUN], p, options), args.repeat)
            n = result.manifest["rows"]
            ours[ext] = (seconds, n, path)
            print(f"  ours .{ext:<8} {seconds:7.1f} s  {rate(n, seconds):>16}  ({n:,} rows, "
                  f"{path.stat().st_size / 2**20:,.0f} MiB)   peak RSS {peak_rss_mb():,.0f} MiB", flush=True)

        base_path = tmp / "baseline.jsonl"
        tools_json = tool_schemas_json()
        reset_peak()
        base_s, n_base = timed(lambda: baseline_export(store, base_path, tools_json), args.repeat)
        print(f"  baseline       {base_s:7.1f} s  {rate(n_base, base_s):>16}  ({n_base:,} rows, "
              f"{base_path.stat().st_size / 2**20:,.0f} MiB)   peak RSS {peak_rss_mb():,.0f} MiB", flush=True)
        for ext, (seconds, n, _) in ours.items():
            ratio = (n / seconds) / (n_base / base_s)
            print(f"  ours .{ext:<8} = {ratio:5.2f}x the baseline's rows/s", flush=True)
            record("export", f"dpo all-pairs -> .{ext} ({n:,} rows)", rate(n, seconds), rate(n_base, base_s),
                   f"{ratio:.2f}x", f">= {GOAL:g}x", ratio >= GOAL)
        record("export", f"baseline python json.dumps -> .jsonl ({n_base:,} rows)", f"{base_s:.1f} s")
        for ext, (seconds, _, _) in ours.items():
            record("export", f"ours .{ext} wall time", f"{seconds:.1f} s")

        check(ours["jsonl"][2], ours["parquet"][2], base_path, n_base, args.seed)
        for path in (ours["jsonl"][2], ours["parquet"][2], base_path):
            path.unlink()
        if not args.skip_breakdown:
            breakdown(store, out, options)
        store.close()

    peak = whole_run_peak_mb()
    print(f"\npeak RSS of the whole run {peak:,.0f} MiB; load average at end {loadavg()}")
    record("process", "peak RSS (whole run; getrusage + VmHWM)", f"{peak:,.0f} MiB")
    print(f"total {time.perf_counter() - started:.0f} s")
    print_table()


if __name__ == "__main__":
    main()
