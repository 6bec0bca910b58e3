"""ANN candidates for the memory index, at a size that builds in minutes: build time, recall@10 and latency.

What chose the DuckDB backend's index (issue 33): each candidate is built
over the same seeded 384-dim unit rows as ``bench/bench_memory.py`` (uniform
or clustered), then searched one query at a time at each value of its
recall/latency knob, against the exact top 10 of a NumPy brute force over the
same rows (timed in the same run: the ratio column). A sweep stops at recall
0.99. Candidates (``--methods``, comma list):

- ``hnsw:M:EFC:STORAGE``: faiss ``IndexHNSWFlat`` (``flat``) or
  ``IndexHNSWSQ`` (``fp16``, ``sq8``), M links, efConstruction EFC; knob
  efSearch.
- ``usearch:CONN:EXPANSION:DTYPE``: usearch ``Index`` (``f32``, ``f16``,
  ``i8``; skipped when usearch is not installed); knob expansion_search.
- ``ivf:NLIST:CODE``: faiss ``IndexIVFFlat`` with a flat (``flat``) or HNSW
  (``hnswq``) coarse quantizer, or ``IndexIVFScalarQuantizer`` (``sq8``);
  knob nprobe.

Usage: python bench/bench_memory_ann.py [--n 50000] [--data uniform,clustered] [--queries 200]
       [--threads 2] [--methods ivf:1024:flat,hnsw:16:40:flat,usearch:16:64:f16] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from _results import loadavg, print_table, record  # bench/ is on sys.path
from bench_memory import DIM, K, clustered_vectors, unit_vectors

SWEEPS = {"hnsw": (32, 64, 128, 256, 512), "usearch": (32, 64, 128, 256, 512), "ivf": (8, 16, 32, 64, 128, 256)}


def build(method: str, vectors: np.ndarray, threads: int) -> tuple[Any, Callable[[Any, int], None], Callable]:
    """The index of ``method`` over ``vectors``, a setter for its knob, and a search returning row numbers."""
    import faiss

    kind, *params = method.split(":")
    if kind == "hnsw":
        links, ef_construction, storage = int(params[0]), int(params[1]), params[2]
        if storage == "flat":
            index = faiss.IndexHNSWFlat(DIM, links, faiss.METRIC_INNER_PRODUCT)
        else:
            codes = {"fp16": faiss.ScalarQuantizer.QT_fp16, "sq8": faiss.ScalarQuantizer.QT_8bit}[storage]
            index = faiss.IndexHNSWSQ(DIM, codes, links, faiss.METRIC_INNER_PRODUCT)
            index.train(vectors[:50_000])
        index.hnsw.efConstruction = ef_construction
        index.add(vectors)
        search_params = faiss.SearchParametersHNSW()

        def set_knob(_: Any, ef: int) -> None:
            search_params.efSearch = ef

        return index, set_knob, lambda q: index.search(q[None], K, params=search_params)[1][0]
    if kind == "usearch":
        from usearch.index import Index

        index = Index(ndim=DIM, metric="ip", dtype=params[2], connectivity=int(params[0]),
                      expansion_add=int(params[1]))
        index.add(np.arange(len(vectors)), vectors, threads=threads)
        return index, lambda i, ef: setattr(i, "expansion_search", ef), lambda q: index.search(q, K, threads=1).keys
    if kind == "ivf":
        lists, code = int(params[0]), params[1]
        quantizer = (faiss.IndexHNSWFlat(DIM, 32, faiss.METRIC_INNER_PRODUCT) if code == "hnswq"
                     else faiss.IndexFlatIP(DIM))
        if code == "sq8":
            index = faiss.IndexIVFScalarQuantizer(quantizer, DIM, lists, faiss.ScalarQuantizer.QT_8bit,
                                                  faiss.METRIC_INNER_PRODUCT)
        else:
            index = faiss.IndexIVFFlat(quantizer, DIM, lists, faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(0).choice(len(vectors), min(len(vectors), 40 * lists), replace=False)
        index.train(vectors[np.sort(sample)])
        index.add(vectors)
        # the search closure holds the quantizer too: the index does not own it
        return index, lambda i, probes: setattr(i, "nprobe", probes), lambda q, _q=quantizer: index.search(
            q[None], K)[1][0]
    raise SystemExit(f"unknown method {method!r}")


def timed(search: Callable[[np.ndarray], Any], queries: np.ndarray) -> tuple[float, list[list[int]]]:
    """Median seconds per query (after one warm-up) and the rows each query found."""
    search(queries[0])
    times, found = [], []
    for q in queries:
        start = time.perf_counter()
        rows = search(q)
        times.append(time.perf_counter() - start)
        found.append([int(r) for r in rows])
    return statistics.median(times), found


def data_sets(names: str, n: int, queries: int) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    for name in names.split(","):
        rng = np.random.default_rng(0)
        if name == "clustered":
            centres = unit_vectors(rng, 2_000)
            yield name, clustered_vectors(rng, n, centres), clustered_vectors(rng, queries, centres)
        else:
            yield name, unit_vectors(rng, n), unit_vectors(rng, queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--data", default="uniform,clustered")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2, help="OpenMP/usearch threads while building")
    parser.add_argument("--methods", default="ivf:1024:flat,hnsw:16:40:flat,hnsw:32:80:flat,usearch:16:64:f16")
    parser.add_argument("--json", type=Path, help="also write every measurement (one JSON object a line) here")
    args = parser.parse_args()
    import faiss

    faiss.omp_set_num_threads(args.threads)
    lines = []
    for data, vectors, queries in data_sets(args.data, args.n, args.queries):
        truth = np.argsort(-(queries @ vectors.T), axis=1)[:, :K]

        def numpy_search(q: np.ndarray, vectors: np.ndarray = vectors) -> np.ndarray:
            sims = vectors @ q
            top = np.argpartition(-sims, K)[:K]
            return top[np.argsort(-sims[top])]

        base, _ = timed(numpy_search, queries)
        print(f"\n{args.n:,} {data}: numpy brute force median {base * 1000:.2f} ms  (load {loadavg()})", flush=True)
        record(data, f"numpy top-{K} @ {args.n:,}", f"{base * 1000:.2f} ms")
        for method in args.methods.split(","):
            if method.startswith("usearch") and importlib.util.find_spec("usearch") is None:
                print(f"  {method}: skipped (usearch is not installed)")
                continue
            start = time.perf_counter()
            index, set_knob, search = build(method, vectors, args.threads)
            build_s = time.perf_counter() - start
            print(f"  {method:<24} build {build_s:7.1f} s  ({args.n / build_s:,.0f} rows/s, load {loadavg()})",
                  flush=True)
            record(data, f"{method} build", f"{build_s:.1f} s", ratio=f"{args.n / build_s:,.0f} rows/s")
            for knob in SWEEPS[method.split(":")[0]]:
                set_knob(index, knob)
                median, found = timed(search, queries)
                hit = float(np.mean([len(set(f) & set(t.tolist())) / K for f, t in zip(found, truth)]))
                print(f"  {method:<24} knob {knob:>4}  median {median * 1000:7.2f} ms  {median / base:6.3f}x numpy  "
                      f"recall@{K} {hit:.3f}", flush=True)
                record(data, f"{method} knob={knob} (recall@{K} {hit:.3f})", f"{median * 1000:.2f} ms",
                       f"{base * 1000:.2f} ms", f"{median / base:.3f}x numpy time")
                lines.append({"n": args.n, "data": data, "method": method, "build_s": round(build_s, 1),
                              "knob": knob, "median_ms": round(median * 1000, 3), "recall": round(hit, 3),
                              "numpy_ms": round(base * 1000, 3), "load": loadavg()})
                if hit >= 0.99:
                    break
            del index
    print_table()
    if args.json:
        args.json.write_text("".join(json.dumps(line) + "\n" for line in lines))


if __name__ == "__main__":
    main()
