"""Memory retrieval latency and write throughput: the DuckDB backend (exact and IVF) and LanceDB against NumPy.

1. ``search``: top-10 retrieval at 100,000 and 1,000,000 memories (384-dim
   unit vectors, float32, seeded), on ``uniform`` data (random directions: no
   cluster structure, the worst case for any index) and on ``clustered`` data
   (2,000 random centres, each row a centre plus noise of the same norm, the
   queries drawn the same way: closer to real embeddings), through
   ``backend.search`` of each backend, against a NumPy brute force over the
   same matrix (``matrix @ query``, ``argpartition``, sort of the top 10) in
   the same run. Median and p90 over ``--queries`` queries (after one untimed
   warm-up query; a backend stops early once it has spent ``--budget``
   seconds, and the table says how many queries it ran), ratio of medians to
   NumPy's, and recall@10 against NumPy's exact top 10.

   - ``duckdb load``: the rows written through
     ``Store.write_memories(new_only=True)`` (what ``DuckDBMemoryBackend.add``
     does: one plain ``INSERT``, buffer pool capped, rows uncompressed),
     time and the process's peak RSS above what it held before (sampled
     every 10 ms: DuckDB's own allocations included); goal 1M in <= 10 s and
     <= 2 GiB.
   - ``duckdb exact``: the backend below its index threshold (NumPy mirror).
   - ``duckdb ivf``: the backend with the faiss IVF index: ``reindex()``
     (mirror load + k-means + assignment of every row + atomic write of the
     file) timed as the build; then searches at each ``--probes`` (lists
     scanned: the recall/latency knob); goal <= 5 ms median at recall@10 >=
     0.95. Before the searches, the store is closed and a new process
     opens it and searches once (``first_search``): time to the first
     result and peak RSS with a current index file (only the metadata and
     the file are read); the build's peak RSS is the mirror's batched read
     of the vectors into one matrix plus the index's own copy. Then
     ``--index-upserts`` new memories added through
     ``backend.add`` (store write + list insert, searchable at once), as an
     upsert rate.
   - ``lance``: LanceMemoryBackend (``IVF_SQ``, ``--nprobes``,
     ``--refine``), when lancedb is installed and ``--lance`` is given.

2. ``upsert``: ``RolloutMemoryStore.upsert`` of ``--upserts`` clean winners
   (distinct tasks, in batches of ``--upsert-batch``, as finished runs offer
   them) with the hashing embedder, against embedding the same texts alone
   (the floor: an upsert embeds every new text); then the raw
   ``backend.add`` rate of the same memories with their vectors already
   computed, against writing the same rows to a Parquet file with pyarrow.

Usage: python bench/bench_memory.py [--sizes 100000,1000000] [--data uniform,clustered] [--probes 8,16,32,64]
       [--queries 50] [--budget 30] [--upserts 20000] [--lance] [--only search,upsert] [--seed 0] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _results import RESULTS, loadavg, print_table, record  # bench/ is on sys.path

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


def rss_bytes() -> int:
    """The process's resident set size now (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Peak RSS above the RSS at entry, sampled every 10 ms on a thread (sees DuckDB's and faiss's allocations)."""

    def __enter__(self) -> PeakRss:
        self.base = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def gib(self) -> float:
        return (self.peak - self.base) / 2**30


def clustered_vectors(rng: np.random.Generator, n: int, centres: np.ndarray) -> np.ndarray:
    """Unit rows near random centres: a centre plus isotropic noise of the same norm, renormalized."""
    out = unit_vectors(rng, n)
    for start in range(0, n, 100_000):
        block = out[start:start + 100_000]
        block += centres[rng.integers(0, len(centres), len(block))]
        block /= np.linalg.norm(block, axis=1, keepdims=True)
    return out


def memory_rows(vectors: np.ndarray, ids: list[str]) -> pa.Table:
    """The memory table's columns for ``ids`` (built column-wise, no per-row Python objects)."""
    n = len(ids)
    offsets = pa.array(np.arange(0, (n + 1) * DIM, DIM, dtype=np.int64))
    id_array = pa.array(ids)
    return pa.table({
        "memory_id": id_array, "run_id": pa.repeat(pa.scalar("bench"), n), "task_id": id_array,
        "branch_index": pa.array(np.zeros(n, dtype=np.int32)), "task_text": id_array,
        "key_steps": pa.repeat(pa.scalar([], pa.list_(pa.string())), n), "final_answer": pa.repeat(pa.scalar("ok"), n),
        "embedder": pa.repeat(pa.scalar(EMBEDDER), n), "dim": pa.array(np.full(n, DIM, dtype=np.int32)),
        "embedding": pa.LargeListArray.from_arrays(offsets, pa.array(vectors.reshape(-1))),
        "created_at": pa.repeat(pa.scalar(utc_now(), pa.timestamp("us")), n),
    })


def cpu_seconds() -> tuple[float, float]:
    """This process's user and system CPU seconds so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def load_duckdb(path: Path, vectors: np.ndarray, ids: list[str]) -> tuple[Store, float, float, str]:
    """A store whose memory table holds ``vectors``: seconds, peak GiB above the RSS before, and CPU seconds."""
    rows = memory_rows(vectors, ids)
    user, system = cpu_seconds()
    with PeakRss() as peak:
        start = time.perf_counter()
        store = Store.open(path)
        store.write_memories(rows, new_only=True)
        seconds = time.perf_counter() - start
    user, system = cpu_seconds()[0] - user, cpu_seconds()[1] - system
    return store, seconds, peak.gib, f"CPU {user + system:.1f} s ({user:.1f} user + {system:.1f} sys)"


def first_search(path: Path, query: np.ndarray, threshold: int) -> dict[str, float]:
    """In a new process: open the store, first search (mirror + index file load); seconds and peak RSS.

    The child reports its peak RSS above what it held after its imports (sampled every 10 ms, DuckDB's and
    faiss's allocations included; not ``ru_maxrss``, which keeps the forked parent's high-water mark).
    """
    query_file = path.with_name("first-search-query.npy")
    np.save(query_file, query)
    child = subprocess.run([sys.executable, __file__, "--first-search", str(path), str(query_file), str(threshold)],
                           capture_output=True, text=True, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


def first_search_child(path: str, query_file: str, threshold: str) -> None:
    query = np.load(query_file)
    with PeakRss() as peak:
        start = time.perf_counter()
        with Store.open(Path(path)) as store:
            backend = DuckDBMemoryBackend(store, index_threshold=int(threshold))
            found = backend.search(query, K, EMBEDDER, DIM)
            seconds = time.perf_counter() - start
            indexed, size = backend.indexed(EMBEDDER, DIM), len(backend._mirror[(EMBEDDER, DIM)].index)
    print(json.dumps({"seconds": seconds, "peak_gib": peak.gib, "found": len(found), "indexed": indexed,
                      "index_rows": size}))


def as_memories(ids: list[str], embedder: str = EMBEDDER, dim: int = DIM) -> list[Memory]:
    return [Memory(i, "bench", i, 0, i, [], "ok", embedder, dim) for i in ids]


def bench_search(n: int, data: str, args: argparse.Namespace, tmp: Path) -> None:
    rng = np.random.default_rng(args.seed)
    if data == "clustered":
        centres = unit_vectors(rng, 2_000)
        vectors, queries = clustered_vectors(rng, n, centres), clustered_vectors(rng, args.queries, centres)
    else:
        vectors, queries = unit_vectors(rng, n), unit_vectors(rng, args.queries)
    ids = memory_ids(n)
    label = f"{n:,} {data}"
    print(f"\nsearch: {label} memories x {DIM} dims, {args.queries} queries, top {K}  (load {loadavg()})",
          flush=True)

    def numpy_search(q: np.ndarray) -> list[str]:
        sims = vectors @ q
        top = np.argpartition(-sims, K)[:K]
        return [ids[i] for i in top[np.argsort(-sims[top], kind="stable")]]

    np_times, truth = time_queries(numpy_search, queries, budget_s=float("inf"))
    base = statistics.median(np_times)
    print(f"  numpy brute force   median {ms(base):>10}  p90 {ms(p90(np_times)):>10}", flush=True)
    record("search", f"numpy top-{K} @ {label}", f"{ms(base)} (p90 {ms(p90(np_times))})")

    def measure(name: str, backend: MemoryBackend, goal_ms: float | None = None) -> float:
        def run(q: np.ndarray) -> list[str]:
            return [m.memory_id for m in backend.search(q, K, EMBEDDER, DIM)]

        times, found = time_queries(run, queries, args.budget)
        med, hit = statistics.median(times), recall(found, truth[:len(found)])
        print(f"  {name:<19} median {ms(med):>10}  p90 {ms(p90(times)):>10}  {med / base:7.2f}x numpy  "
              f"recall@{K} {hit:.3f}  ({len(times)} queries)", flush=True)
        goal, ok = "", None
        if goal_ms is not None and n >= 1_000_000:
            goal, ok = f"<= {goal_ms:g} ms at recall >= 0.95", med <= goal_ms / 1000 and hit >= 0.95
        record("search", f"{name} top-{K} @ {label} (recall@{K} {hit:.3f})", f"{ms(med)} (p90 {ms(p90(times))})",
               ms(base), f"{med / base:.2f}x numpy time", goal, ok)
        return hit

    path = tmp / f"duckdb-{n}-{data}.duckdb"
    store, load_s, load_gib, load_cpu = load_duckdb(path, vectors, ids)
    print(f"  duckdb load         {load_s:7.1f} s  ({n / load_s:,.0f} rows/s)  peak +{load_gib:.2f} GiB RSS  "
          f"{load_cpu}  (Store.write_memories(new_only=True))", flush=True)
    goal_ok = load_s <= 10 and load_gib <= 2 if n >= 1_000_000 else None
    record("search", f"duckdb load @ {label}", f"{load_s:.1f} s, +{load_gib:.2f} GiB, {load_cpu}",
           ratio=f"{n / load_s:,.0f} rows/s", goal="<= 10 s, <= 2 GiB" if goal_ok is not None else "", ok=goal_ok)

    if args.exact:
        exact = DuckDBMemoryBackend(store, index_threshold=n + 1)
        start = time.perf_counter()
        exact.search(queries[0], K, EMBEDDER, DIM)
        mirror_s = time.perf_counter() - start
        print(f"  duckdb mirror load  {mirror_s:7.2f} s  (first search of a process)", flush=True)
        record("search", f"duckdb mirror load @ {label}", f"{mirror_s:.2f} s", ratio="once per process")
        measure("duckdb exact", exact)
        del exact

    ivf = DuckDBMemoryBackend(store, index_threshold=min(n, 100_000))
    with PeakRss() as peak:
        start = time.perf_counter()
        ivf.reindex()
        build_s = time.perf_counter() - start
    size = ivf.index_path(EMBEDDER, DIM).stat().st_size
    space = ivf._mirror[(EMBEDDER, DIM)]
    print(f"  duckdb ivf build    {build_s:7.1f} s  ({n / build_s:,.0f} rows/s; mirror load + faiss IVF "
          f"{space.index.nlist:,} lists (k-means + assignment) + write {size / 2**30:.2f} GiB)  "
          f"peak +{peak.gib:.2f} GiB RSS", flush=True)
    record("search", f"duckdb ivf build @ {label}", f"{build_s:.1f} s, peak +{peak.gib:.2f} GiB",
           ratio=f"{n / build_s:,.0f} rows/s", goal=f"index file {size / 2**30:.2f} GiB")
    store.close()  # the child opens the store as a new process would (one writer at a time)
    child = first_search(path, queries[0], min(n, 100_000))
    assert child["indexed"] and child["index_rows"] == n and child["found"] == K, child
    print(f"  duckdb ivf reopen   {child['seconds']:7.1f} s to the first result in a new process  peak "
          f"+{child['peak_gib']:.2f} GiB RSS (index file {size / 2**30:.2f} GiB)", flush=True)
    record("search", f"duckdb ivf first search, new process @ {label}",
           f"{child['seconds']:.1f} s, peak +{child['peak_gib']:.2f} GiB",
           ratio=f"index file {size / 2**30:.2f} GiB", goal="seconds; about the index's size",
           ok=child["seconds"] <= 10 and child["peak_gib"] <= 1.5 * size / 2**30 + 0.5)
    store = Store.open(path)
    ivf.store = store
    ivf._mirror_state = store.memory_state()  # the mirror stays: nothing was written meanwhile
    for probes in (int(e) for e in args.probes.split(",")):
        space.index.nprobe = probes
        hit = measure(f"duckdb ivf nprobe={probes}", ivf, goal_ms=5)
        if hit >= 0.99:
            break
    if args.index_upserts:
        extra = unit_vectors(rng, args.index_upserts)
        fresh = as_memories([f"u{i:08d}" for i in range(args.index_upserts)])
        batch = args.upsert_batch
        start = time.perf_counter()
        added = sum(ivf.add(fresh[i:i + batch], extra[i:i + batch]) for i in range(0, len(fresh), batch))
        add_s = time.perf_counter() - start
        assert added == len(fresh) and len(space.index) == n + added
        found = ivf.search(extra[-1], 1, EMBEDDER, DIM)[0].memory_id
        print(f"  duckdb ivf upsert   {added / add_s:12,.0f} memories/s  ({added:,} in batches of {batch:,}: "
              f"store write + list insert; the last found at once: {found == fresh[-1].memory_id})", flush=True)
        record("search", f"duckdb ivf backend.add @ {label}", f"{added / add_s:,.0f} /s")
    del ivf, space
    store.close()

    if args.lance and HAVE_LANCE:
        from factory.memory._lance import LanceMemoryBackend

        lance = LanceMemoryBackend(tmp / f"lance-{n}-{data}", index_threshold=n + 1, nprobes=args.nprobes,
                                   refine_factor=args.refine)
        lance.add(as_memories(ids), vectors)
        lance.index_threshold = min(n, 100_000)
        start = time.perf_counter()
        lance.optimize()
        print(f"  lance IVF_SQ build  {time.perf_counter() - start:7.1f} s", flush=True)
        measure(f"lance nprobes={args.nprobes} refine={args.refine}", lance, goal_ms=5)


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
    if len(sys.argv) == 5 and sys.argv[1] == "--first-search":  # the new process of first_search
        first_search_child(*sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="memories per search benchmark (comma list)")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--budget", type=float, default=30.0, help="seconds of queries per backend and size")
    parser.add_argument("--data", default="uniform,clustered", help="uniform and/or clustered vectors")
    parser.add_argument("--probes", default="8,16,32,64,128,256,512",
                        help="IVF lists scanned per search, swept (stops at recall 0.99)")
    parser.add_argument("--index-upserts", type=int, default=10_000, help="memories added to the built IVF index")
    parser.add_argument("--exact", action="store_true", help="also time the backend's exact (below-threshold) path")
    parser.add_argument("--lance", action="store_true", help="also time LanceMemoryBackend (IVF_SQ)")
    parser.add_argument("--nprobes", type=int, default=50)
    parser.add_argument("--refine", type=int, default=5)
    parser.add_argument("--upserts", type=int, default=20_000)
    parser.add_argument("--upsert-batch", type=int, default=1_000)
    parser.add_argument("--only", default="search,upsert")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 20,000 memories, 10 queries, 2,000 upserts")
    parser.add_argument("--json", type=Path, help="also write the results table, command, load and versions here")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.queries, args.upserts, args.budget = "20000", 10, 2_000, 5.0
        args.index_upserts = 1_000
    only = set(args.only.split(","))

    started, load_at_start = time.perf_counter(), loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        if "search" in only:
            for n in (int(s) for s in args.sizes.split(",")):
                for data in args.data.split(","):
                    bench_search(n, data, args, Path(tmp))
        if "upsert" in only:
            bench_upsert(args, Path(tmp))
    print(f"\ntotal {time.perf_counter() - started:.0f} s  (load {loadavg()})")
    print_table()
    if args.json:
        write_json(args.json, load_at_start, time.perf_counter() - started)


def write_json(path: Path, load_at_start: str, seconds: float) -> None:
    """The results table with what it depends on (command, load, versions, cores)."""
    import dataclasses

    versions = {}
    for module in ("numpy", "duckdb", "pyarrow", "faiss", "lancedb"):
        if importlib.util.find_spec(module) is not None:
            versions[module] = getattr(__import__(module), "__version__", "?")
    path.write_text(json.dumps({
        "command": "python " + " ".join(sys.argv), "load_at_start": load_at_start, "load_at_end": loadavg(),
        "seconds": round(seconds, 1), "cpus": os.cpu_count(), "versions": versions,
        "rows": [dataclasses.asdict(row) for row in RESULTS]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
