"""Store throughput and query speed against a JSON-lines baseline, in one run.

Persists N event rows and M branch rows through the store API (batched
``Store.write_branches`` calls, as the fork runner makes them) and appends the
same rows as JSON lines to a file; then runs a grouped query over the events
in DuckDB and the same aggregation by scanning the JSONL with ``json``.

Goals (issue 2): store rows/s >= baseline rows/s; grouped query >= 10x faster.

Each store write is a committed (durable) transaction; the JSONL baseline
never fsyncs, so small store batches pay a per-commit cost the baseline does
not. Both batch sizes are reported.

Usage: python bench/bench_store.py [--events 1000000] [--branches 100000] [--batch 1000,10000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path

from factory.store import Store

KINDS = ("run_start", "model_call", "tool_call", "tool_result", "final_answer")


def make_rows(n_events: int, n_branches: int) -> tuple[list[dict], list[dict]]:
    per_branch = n_events // n_branches
    start = datetime(2026, 1, 1)
    branches, events = [], []
    for b in range(n_branches):
        task, index = f"task-{b // 8:06d}", b % 8
        branches.append({
            "run_id": "bench", "task_id": task, "branch_index": index, "session_id": f"bench-b{index}-{b:08x}",
            "temperature": 0.5 + 0.1 * index, "seed": b, "model": "replay:bench", "status": "ok",
            "final_answer": str(b % 97), "usage": {"input_tokens": 120, "output_tokens": 40},
            "input_tokens": 120, "output_tokens": 40, "started_at": start, "finished_at": start,
        })
        for seq in range(per_branch):
            events.append({
                "run_id": "bench", "task_id": task, "branch_index": index, "seq": seq,
                "ts": start + timedelta(milliseconds=seq), "kind": KINDS[seq % len(KINDS)],
                "payload": {"tool": "run", "text": f"step {seq} of branch {b}", "tokens": seq * 7},
            })
    return branches, events


def bench_store(path: Path, branches: list[dict], events: list[dict], batch: int) -> float:
    per_branch = len(events) // len(branches)
    start = time.perf_counter()
    with Store.open(path) as store:
        for i in range(0, len(branches), batch):
            store.write_branches(branches[i:i + batch], events[i * per_branch:(i + batch) * per_branch])
    return time.perf_counter() - start


def bench_jsonl(path: Path, branches: list[dict], events: list[dict]) -> float:
    start = time.perf_counter()
    with open(path / "branches.jsonl", "w") as fb, open(path / "events.jsonl", "w") as fe:
        for row in branches:
            fb.write(json.dumps(row, default=str) + "\n")
        for row in events:
            fe.write(json.dumps(row, default=str) + "\n")
    return time.perf_counter() - start


def query_store(path: Path) -> tuple[float, dict]:
    start = time.perf_counter()
    with Store.open(path, read_only=True) as store:
        frame = store.query(
            "SELECT kind, count(*) AS n, sum(CAST(payload->>'tokens' AS BIGINT)) AS tokens "
            "FROM events GROUP BY kind ORDER BY kind"
        )
    elapsed = time.perf_counter() - start
    return elapsed, {row[0]: (row[1], row[2]) for row in frame.iter_rows()}


def query_jsonl(path: Path) -> tuple[float, dict]:
    start = time.perf_counter()
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    with open(path / "events.jsonl") as f:
        for line in f:
            row = json.loads(line)
            entry = counts[row["kind"]]
            entry[0] += 1
            entry[1] += row["payload"]["tokens"]
    elapsed = time.perf_counter() - start
    return elapsed, {kind: tuple(v) for kind, v in sorted(counts.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--branches", type=int, default=100_000)
    parser.add_argument("--batch", default="1000,10000", help="branches per write_branches call (comma list)")
    args = parser.parse_args()

    branches, events = make_rows(args.events, args.branches)
    total = len(branches) + len(events)
    batches = [int(b) for b in args.batch.split(",")]
    print(f"rows: {len(events):,} events + {len(branches):,} branches")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        jsonl_s = bench_jsonl(tmp_path, branches, events)
        print(f"persist  baseline (JSONL append)          {jsonl_s:7.2f} s  {total / jsonl_s:12,.0f} rows/s")
        for batch in batches:
            db = tmp_path / f"bench-{batch}.duckdb"
            store_s = bench_store(db, branches, events, batch)
            print(f"persist  store, {batch:>6} branches/commit  {store_s:7.2f} s  {total / store_s:12,.0f} rows/s"
                  f"  = {jsonl_s / store_s:4.2f}x baseline (goal >= 1.0x)")
        q_store_s, store_result = query_store(db)
        q_jsonl_s, jsonl_result = query_jsonl(tmp_path)
        if store_result != jsonl_result:
            raise SystemExit(f"results differ: {store_result} vs {jsonl_result}")

    print(f"query    store (grouped SQL)       {q_store_s * 1000:7.1f} ms")
    print(f"query    baseline (json scan)      {q_jsonl_s * 1000:7.1f} ms")
    print(f"query    speed-up                  {q_jsonl_s / q_store_s:7.1f}x  (goal >= 10x)")


if __name__ == "__main__":
    main()
