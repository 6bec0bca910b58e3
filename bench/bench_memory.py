"""Memory retrieval latency and write throughput: the DuckDB and LanceDB backends against NumPy, in one run.

1. ``search``: top-10 retrieval at 100,000 and 1,000,000 memories (384-dim
   random unit vectors, float32, seeded) through ``backend.search`` of each
   backend, against a NumPy brute force over the same matrix
   (``matrix @ query``, ``argpartition``, sort of the top 10) in the same run.
   Median and p90 over ``--queries`` queries (after one untimed warm-up
   query; a backend stops early once it has spent ``--budget`` seconds, and
   the table says how many queries it ran), ratio of medians to NumPy's, and
   recall@10 against NumPy's exact top 10.

   Loading: the DuckDB rows are written through the store in one
   transaction as an Arrow table (``Store._write``, as
   ``DuckDBMemoryBackend.add`` does, without its per-id duplicate check). The
   DuckDB backend searches a NumPy mirror of the stored vectors: its one-off
   load (on the first search of a process) is timed on its own, and the same
   search in SQL (``array_cosine_similarity`` over the stored rows) is timed
   as a reference. LanceDB
   rows go through ``LanceMemoryBackend.add`` in one call; its ANN index
   (built at ``index_threshold`` rows, 100,000 by default) is timed on its own.

   Random vectors have no cluster structure, the worst case for an ANN index:
   there an index's recall is roughly the share of the data it probes. Real
   embeddings cluster; the LanceDB recall here is a floor, not a typical value.

2. ``upsert``: ``RolloutMemoryStore.upsert`` of ``--upserts`` clean winners
   (distinct tasks, in batches of ``--upsert-batch``, as finished runs offer
   them) with the hashing embedder, against embedding the same texts alone
   (the floor: an upsert embeds every new text); then the raw
   ``backend.add`` rate of the same memories with their vectors already
   computed, against writing the same rows to a Parquet file with pyarrow.

Usage: python bench/bench_memory.py [--sizes 100000,1000000] [--queries 50] [--budget 30] [--upserts 20000]
       [--only search,upsert] [--seed 0] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _results import print_table, record  # bench/ is on sys.path

from factory.memory import (
    DuckDBMemoryBackend,
    HashingEmbedder,
    Memory,
    MemoryBackend,
    MemoryCandidate,
    RolloutMemoryStore,
)
from factory.store import Store, utc_now

DIM = 384
K = 10
EMBEDDER = "random"
HAVE_LANCE = importlib.util.find_spec("lancedb") is not None
WORDS = ["sort", "parse", "list", "string", "file", "number", "date", "csv", "json", "http", "count", "sum", "reverse",
         "merge", "split", "filter", "map", "tree", "graph", "path", "queue", "stack", "cache", "retry", "timeout",
         "error", "log", "config", "table", "row", "column", "index", "key", "value", "token", "batch", "stream",
         "socket", "thread", "lock", "async", "test", "mock", "fixture"]


def unit_vectors(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    """``n`` random unit rows, float32 (drawn in chunks to keep the float64 scratch small)."""
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 100_000):
        block = rng.standard_normal((min(100_000, n - start), dim), dtype=np.float32)
        out[start:start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def memory_ids(n: int) -> list[str]:
    return [f"m{i:08d}" for i in range(n)]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def time_queries(search: Callable[[np.ndarray], list[str]], queries: np.ndarray,
                 budget_s: float) -> tuple[list[float], list[list[str]]]:
    """Per-query seconds and result ids; stops once ``budget_s`` is spent (at least 5 queries)."""
    search(queries[0])  # warm-up: caches, lazily opened index files
    times, results = [], []
    spent = 0.0
    for q in queries:
        start = time.perf_counter()
        ids = search(q)
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        results.append(ids)
        spent += elapsed
        if spent > budget_s and len(times) >= 5:
            break
    return times, results


def p90(times: list[float]) -> float:
    return float(np.percentile(times, 90))


def recall(results: list[list[str]], truth: list[list[str]]) -> float:
    return float(np.mean([len(set(r) & set(t)) / K for r, t in zip(results, truth)]))


def load_duckdb(path: Path, vectors: np.ndarray, ids: list[str]) -> tuple[Store, float]:
    """A store whose memory table holds ``vectors``, written as one Arrow table."""
    n = len(ids)
    start = time.perf_counter()
    offsets = pa.array(np.arange(0, (n + 1) * DIM, DIM, dtype=np.int32))
    rows = pa.table({
        "memory_id": pa.array(ids), "run_id": pa.array(["bench"] * n), "task_id": pa.array(ids),
        "branch_index": pa.array(np.zeros(n, dtype=np.int32)), "task_text": pa.array(ids),
        "key_steps": pa.array([[]] * n, pa.list_(pa.string())), "final_answer": pa.array(["ok"] * n),
        "embedder": pa.array([EMBEDDER] * n), "dim": pa.array(np.full(n, DIM, dtype=np.int32)),
        "embedding": pa.ListArray.from_arrays(offsets, pa.array(vectors.reshape(-1))),
        "created_at": pa.array([utc_now()] * n, pa.timestamp("us")),
    })
    store = Store.open(path)
    with store.transaction():
        store._write("memory", rows)
    return store, time.perf_counter() - start


def as_memories(ids: list[str], embedder: str = EMBEDDER, dim: int = DIM) -> list[Memory]:
    return [Memory(i, "bench", i, 0, i, [], "ok", embedder, dim) for i in ids]


def bench_search(n: int, args: argparse.Namespace, tmp: Path) -> None:
    from factory.memory._lance import LanceMemoryBackend

    rng = np.random.default_rng(args.seed)
    vectors = unit_vectors(rng, n)
    queries = unit_vectors(rng, args.queries)
    ids = memory_ids(n)
    label = f"{n:,}"
    print(f"\nsearch: {label} memories x {DIM} dims, {args.queries} queries, top {K}", flush=True)

    def numpy_search(q: np.ndarray) -> list[str]:
        sims = vectors @ q
        top = np.argpartition(-sims, K)[:K]
        return [ids[i] for i in top[np.argsort(-sims[top], kind="stable")]]

    np_times, truth = time_queries(numpy_search, queries, budget_s=float("inf"))
    base = statistics.median(np_times)
    print(f"  numpy brute force   median {ms(base):>10}  p90 {ms(p90(np_times)):>10}", flush=True)
    record("search", f"numpy top-{K} @ {label}", f"{ms(base)} (p90 {ms(p90(np_times))})")

    def measure(name: str, backend: MemoryBackend) -> None:
        def run(q: np.ndarray) -> list[str]:
            return [m.memory_id for m in backend.search(q, K, EMBEDDER, DIM)]

        times, found = time_queries(run, queries, args.budget)
        med, hit = statistics.median(times), recall(found, truth[:len(found)])
        print(f"  {name:<19} median {ms(med):>10}  p90 {ms(p90(times)):>10}  {med / base:7.1f}x numpy  "
              f"recall@{K} {hit:.3f}  ({len(times)} queries)", flush=True)
        goal, ok = "", None
        if name == "duckdb" and n == 100_000:
            goal, ok = "<= 2x numpy", med / base <= 2.0
        elif name.startswith("lance") and n == 1_000_000:
            goal, ok = "< 20 ms", med < 0.020
        record("search", f"{name} top-{K} @ {label} (recall@{K} {hit:.3f})", f"{ms(med)} (p90 {ms(p90(times))})",
               ms(base), f"{med / base:.1f}x numpy time", goal, ok)

    def overhead(name: str, backend: MemoryBackend) -> None:
        # What RolloutMemoryStore.retrieve asks the backend before each search.
        times = []
        for _ in range(5):
            start = time.perf_counter()
            backend.count()
            backend.spaces()
            times.append(time.perf_counter() - start)
        print(f"  {name:<19} retrieve() checks (count + spaces) median {ms(statistics.median(times))}", flush=True)
        record("search", f"{name} count+spaces @ {label}", ms(statistics.median(times)))

    store, load_s = load_duckdb(tmp / f"duckdb-{n}.duckdb", vectors, ids)
    print(f"  duckdb load         {load_s:7.1f} s  ({n / load_s:,.0f} rows/s, Arrow through Store._write)", flush=True)
    record("search", f"duckdb load @ {label}", f"{load_s:.1f} s", ratio=f"{n / load_s:,.0f} rows/s")
    backend = DuckDBMemoryBackend(store)
    start = time.perf_counter()
    backend.search(queries[0], K, EMBEDDER, DIM)
    mirror_s = time.perf_counter() - start
    print(f"  duckdb mirror load  {mirror_s:7.2f} s  (first search of a process)", flush=True)
    record("search", f"duckdb mirror load @ {label}", f"{mirror_s:.2f} s", ratio="once per process")
    measure("duckdb", backend)

    def sql_search(q: np.ndarray) -> list[str]:
        return store.query(f"SELECT memory_id, array_cosine_similarity(embedding::FLOAT[{DIM}], ?::FLOAT[{DIM}]) AS s "
                           "FROM memory ORDER BY s DESC LIMIT 10", [q.tolist()])["memory_id"].to_list()

    sql_times, _ = time_queries(sql_search, queries, args.budget / 2)
    sql_med = statistics.median(sql_times)
    print(f"  duckdb SQL cosine   median {ms(sql_med):>10}  {sql_med / base:7.1f}x numpy  "
          f"(array_cosine_similarity, {len(sql_times)} queries)", flush=True)
    record("search", f"duckdb SQL array_cosine_similarity @ {label}", ms(sql_med), ms(base),
           f"{sql_med / base:.1f}x numpy time")
    exact = recall([[m.memory_id for m in backend.search(q, K, EMBEDDER, DIM)] for q in queries[:3]], truth[:3])
    record("search", f"duckdb = numpy top-{K} @ {label}", f"recall@{K} {exact:.3f}", goal="1.000", ok=exact == 1.0)
    overhead("duckdb", backend)
    store.close()
    (tmp / f"duckdb-{n}.duckdb").unlink()

    if not HAVE_LANCE:
        print("  lancedb             not installed (pip install 'factory-rlaif[memory-ann]'): skipped")
        return
    lance = LanceMemoryBackend(tmp / f"lance-{n}", index_threshold=n + 1)  # load first, index after: timed apart
    start = time.perf_counter()
    lance.add(as_memories(ids), vectors)
    load_s = time.perf_counter() - start
    print(f"  lance load          {load_s:7.1f} s  ({n / load_s:,.0f} rows/s, LanceMemoryBackend.add)", flush=True)
    record("search", f"lance load @ {label}", f"{load_s:.1f} s", ratio=f"{n / load_s:,.0f} rows/s")
    lance.index_threshold = args.index_threshold
    start = time.perf_counter()
    lance.optimize()
    index_s = time.perf_counter() - start
    state = f"indexed (built in {index_s:.1f} s)" if lance.indexed() else "exact (below the index threshold)"
    print(f"  lance               {state}", flush=True)
    record("search", f"lance index @ {label}", f"{index_s:.1f} s" if lance.indexed() else "none (exact)")
    measure("lance (ANN)" if lance.indexed() else "lance (exact)", lance)
    overhead("lance", lance)


def candidates(n: int, seed: int) -> list[MemoryCandidate]:
    """``n`` clean winners of distinct tasks, texts of 12 words drawn from a small vocabulary."""
    rng = np.random.default_rng(seed)
    words = rng.integers(0, len(WORDS), (n, 12))
    return [MemoryCandidate("bench", f"task-{i:07d}", 0, " ".join(WORDS[w] for w in row), f"answer {i}",
                            ["read_file", "write_file", "submit"], 1.0, False)
            for i, row in enumerate(words)]


def bench_upsert(args: argparse.Namespace, tmp: Path) -> None:
    from factory.memory._lance import LanceMemoryBackend

    n, batch = args.upserts, args.upsert_batch
    offered = candidates(n, args.seed)
    embedder = HashingEmbedder(DIM)
    print(f"\nupsert: {n:,} clean winners in batches of {batch:,}, hashing embedder ({DIM} dims)", flush=True)
    start = time.perf_counter()
    vectors = embedder.embed([c.task_text for c in offered])
    embed_s = time.perf_counter() - start
    print(f"  embedding alone     {n / embed_s:12,.0f} memories/s", flush=True)
    record("upsert", f"embed {n:,} texts (hashing)", f"{n / embed_s:,.0f} /s")

    memories = [Memory(RolloutMemoryStore.memory_id(c.task_id, c.final_answer), c.run_id, c.task_id, 0, c.task_text,
                       list(c.key_steps), c.final_answer, embedder.name, DIM) for c in offered]
    rows = pa.table({"memory_id": [m.memory_id for m in memories], "task_text": [m.task_text for m in memories],
                     "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), DIM)})
    start = time.perf_counter()
    pq.write_table(rows, tmp / "baseline.parquet")
    parquet_s = time.perf_counter() - start
    print(f"  parquet write       {n / parquet_s:12,.0f} rows/s", flush=True)
    record("upsert", f"parquet write {n:,} rows", f"{n / parquet_s:,.0f} /s")

    def backends() -> list[tuple[str, Callable[[str], tuple[MemoryBackend, Store | None]]]]:
        def duckdb(tag: str) -> tuple[MemoryBackend, Store | None]:
            store = Store.open(tmp / f"upsert-{tag}.duckdb")
            return DuckDBMemoryBackend(store), store

        def lance(tag: str) -> tuple[MemoryBackend, Store | None]:
            return LanceMemoryBackend(tmp / f"upsert-{tag}"), None

        return [("duckdb", duckdb)] + ([("lance", lance)] if HAVE_LANCE else [])

    for name, make in backends():
        backend, store = make(f"{name}-upsert")
        memory = RolloutMemoryStore(backend, embedder)
        start = time.perf_counter()
        stored = sum(memory.upsert(offered[i:i + batch]).stored for i in range(0, n, batch))
        upsert_s = time.perf_counter() - start
        assert stored == n, (name, stored)
        print(f"  {name:<6} upsert       {n / upsert_s:12,.0f} memories/s  "
              f"= {embed_s / upsert_s:4.2f}x the embedding-only rate", flush=True)
        record("upsert", f"{name} RolloutMemoryStore.upsert", f"{n / upsert_s:,.0f} /s",
               f"{n / embed_s:,.0f} /s", f"{embed_s / upsert_s:.2f}x embed-only")
        if store is not None:
            store.close()

        backend, store = make(f"{name}-add")
        start = time.perf_counter()
        added = sum(backend.add(memories[i:i + batch], vectors[i:i + batch]) for i in range(0, n, batch))
        add_s = time.perf_counter() - start
        assert added == n, (name, added)
        print(f"  {name:<6} backend.add  {n / add_s:12,.0f} memories/s  = {parquet_s / add_s:4.2f}x parquet",
              flush=True)
        record("upsert", f"{name} backend.add", f"{n / add_s:,.0f} /s", f"{n / parquet_s:,.0f} /s",
               f"{parquet_s / add_s:.2f}x parquet")
        if store is not None:
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="memories per search benchmark (comma list)")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--budget", type=float, default=30.0, help="seconds of queries per backend and size")
    parser.add_argument("--index-threshold", type=int, default=100_000, help="LanceDB rows at which to index")
    parser.add_argument("--upserts", type=int, default=20_000)
    parser.add_argument("--upsert-batch", type=int, default=1_000)
    parser.add_argument("--only", default="search,upsert")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 20,000 memories, 10 queries, 2,000 upserts")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.queries, args.upserts, args.budget = "20000", 10, 2_000, 5.0
        args.index_threshold = 10_000
    only = set(args.only.split(","))

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if "search" in only:
            for n in (int(s) for s in args.sizes.split(",")):
                bench_search(n, args, Path(tmp))
        if "upsert" in only:
            bench_upsert(args, Path(tmp))
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    print_table()


if __name__ == "__main__":
    main()
