"""Scale-out: ``--backend ray`` with 1, 2 and 4 worker processes against ``local``, in one run.

A real Ray cluster on loopback (:class:`factory.rollouts.LocalRayCluster`: a
head that only coordinates and two worker nodes of 2 CPUs each) serves every
Ray row; the driver is this process, as ``factory fork`` is.

1. ``io``: answer-only tasks, a replay model sleeping 200 ms per call, sandbox
   ``none``, 8 branches in flight per worker process. Ideal throughput is
   in-flight / 0.2 s. Goal: >= 90 % of ideal. ``local`` runs the same
   in-flight count on this event loop.
2. ``cpu``: a tool task per branch (write the fix, submit) in bwrap, verified
   isolated: its 10-test pytest suite runs in fresh bwrap sandboxes after the
   agent's is closed. One branch in flight per worker process; ``local`` with
   the same concurrency. Goal: >= 85 % of ``local``'s throughput per core
   used (cores used: min(workers, CPUs of this machine)).
3. Driver CPU per branch (ms of this process's CPU while the ``io`` rows
   stream), which bounds how many workers one driver can feed (the worker
   processes' own CPU per branch is printed beside it), and a written
   projection for 10,000 tasks x 8 branches on 50 nodes from it and the
   ``cpu`` rows.

Throughput is steady state: every branch over the time from when the first
one began (its arrival less its own duration, measured where it ran) to the
last arrival; worker start, node checks and imports before the first branch
are excluded and printed apart as ``start``.

Usage: python bench/bench_scale.py [--workers 1,2,4] [--io-seconds 6] [--cpu-branches 12] [--node-cores 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path

from _results import cpu_busy_seconds, loadavg, print_table, record, verdict  # bench/ is on sys.path

from factory.rollouts import BackendOptions, ForkConfig, LocalRayCluster, RolloutForkRunner, create_backend
from factory.sandbox import NoSandboxWarning
from factory.store import Store
from factory.tasks import Task
from factory.verifiers import build_pipeline

DELAY_S = 0.2
IN_FLIGHT_PER_WORKER = 8
SOLUTION = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = "from solution import add\n\n" + "".join(
    f"def test_add_{i}():\n    assert add({i}, {i + 1}) == {2 * i + 1}\n\n" for i in range(10))


def io_tasks(n: int) -> list[Task]:
    return [Task(id=f"io-{i:05d}", prompt=f"What is {i} + 17? Reply with `Final: <number>`.", answer=str(i + 17))
            for i in range(n)]


def cpu_tasks(n: int) -> list[Task]:
    return [Task(id=f"cpu-{i:04d}", prompt=f"[{i}] add() subtracts. Fix solution.py so the 10 tests pass.",
                 files={"solution.py": SOLUTION}, tests={"test_solution.py": TESTS}) for i in range(n)]


def write_replay(folder: Path) -> Path:
    lines = [
        {"prompt_contains": "What is", "turn": 0, "delay_s": DELAY_S,
         "response": {"text": "Final: 42", "usage": {"input_tokens": 60, "output_tokens": 8}}},
        {"prompt_contains": "add() subtracts", "turn": 0, "response": {"text": "", "tool_calls": [
            {"name": "write_file", "arguments": {"path": "solution.py", "content": FIXED}}]}},
        {"prompt_contains": "add() subtracts", "turn": 1, "response": {"text": "fixed", "tool_calls": [
            {"name": "submit", "arguments": {"answer": "add adds"}}]}},
    ]
    path = folder / "replay.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def process_cpu(pids: list[int]) -> float:
    """CPU seconds the processes ``pids`` have used (``/proc``: the workers are on this host)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def fork(folder: Path, name: str, tasks: list[Task], backend: str, *, address: str | None, workers: int | None,
         concurrency: int, sandbox: str, verify: bool, replay: Path) -> dict:
    """One run; its steady-state throughput, start time and this process's CPU while results streamed."""
    recipe = partial(build_pipeline, sandbox) if verify else None
    engine = create_backend(backend, BackendOptions(address=address, workers=workers, pipeline=recipe))
    model = engine.model(f"replay:{replay}")
    config = ForkConfig(branches=1, concurrency=concurrency, sandbox=sandbox)
    store = Store.open(folder / f"{name}.duckdb")
    runner = RolloutForkRunner(model, store, config, run_id=name, pipeline=recipe() if recipe else None,
                               backend=engine)

    async def go() -> dict:
        stamps: list[float] = []
        cpu: list[float] = []
        first_s = 0.0  # how long the first branch took where it ran
        pids: list[int] = []
        worker_cpu: list[tuple[int, float]] = []  # (results so far, the workers' CPU seconds then)
        begun = time.perf_counter()
        try:
            async for result in runner.run(tasks):
                assert result.status == "ok", (result.status, result.error)
                if result.verdicts:
                    assert result.objective_pass, result.verdicts
                stamps.append(time.perf_counter())
                if len(stamps) == 1:
                    cpu.append(cpu_now())
                    first_s = (result.finished_at - result.started_at).total_seconds()
                    up = engine.worker_processes() if backend == "ray" else []
                    # Workers that started late ran branches before this look: measured only when all are up.
                    pids = [pid for _, pid in up] if len(up) == workers else []
                # The workers' own CPU from the first result to 90 % of them (they end with the run).
                if pids and len(stamps) in (1, max(2, int(0.9 * len(tasks)))):
                    worker_cpu.append((len(stamps), process_cpu(pids)))
            cpu.append(cpu_now())
        finally:
            if runner.pipeline is not None:
                await runner.pipeline.aclose()
            await engine.aclose()
        steady = stamps[-1] - stamps[0] + first_s
        return {"branches": len(stamps), "start_s": stamps[0] - first_s - begun, "steady_s": steady,
                "per_s": len(stamps) / steady if steady > 0 else float("nan"),
                "driver_ms": 1000 * (cpu[-1] - cpu[0]) / max(1, len(stamps) - 1),
                "worker_ms": 1000 * (worker_cpu[-1][1] - worker_cpu[0][1]) / (worker_cpu[-1][0] - worker_cpu[0][0])
                if len(worker_cpu) == 2 else float("nan"),
                "nodes": dict(engine.node_counts)}

    try:
        return asyncio.run(go())
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--workers", default="1,2,4", help="Ray worker processes per row (comma-separated).")
    parser.add_argument("--io-seconds", type=float, default=6.0, help="Ideal seconds of each io row.")
    parser.add_argument("--cpu-branches", type=int, default=12, help="Branches of each cpu row per worker.")
    parser.add_argument("--node-cores", type=int, default=16, help="Cores per node in the projection.")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    warnings.simplefilter("ignore", NoSandboxWarning)
    cores = os.cpu_count() or 1
    print(f"python {sys.version.split()[0]}, {cores} CPUs, load average at start {loadavg()}", flush=True)
    busy0, wall0 = cpu_busy_seconds(), time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    replay = write_replay(folder)
    started = time.perf_counter()
    cluster = LocalRayCluster(workers=2, head_cpus=0, cpus_per_worker=2).start()
    print(f"cluster: head + 2 worker nodes (2 CPUs each) at {cluster.address}, up in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    io_rows: dict[int, dict] = {}
    cpu_rows: dict[tuple[str, int], dict] = {}
    try:
        for n in counts:
            in_flight = n * IN_FLIGHT_PER_WORKER
            ideal = in_flight / DELAY_S
            tasks = io_tasks(max(2 * in_flight, round(ideal * args.io_seconds)))
            for backend in ("local", "ray"):
                row = fork(folder, f"io-{backend}-{n}", tasks, backend, address=cluster.address, workers=n,
                           concurrency=in_flight, sandbox="none", verify=False, replay=replay)
                share = row["per_s"] / ideal
                label = f"{n} worker(s)" if backend == "ray" else f"local c={in_flight}"
                print(f"io  {label:>14}: {row['branches']} branches, {row['per_s']:.1f}/s steady "
                      f"({100 * share:.1f} % of ideal {ideal:.0f}/s), start {row['start_s']:.1f} s, "
                      f"driver {row['driver_ms']:.2f} ms CPU/branch, workers {row['worker_ms']:.2f} ms CPU/branch, "
                      f"nodes {row['nodes']}  (load {loadavg()})", flush=True)
                if backend == "ray":
                    io_rows[n] = row
                    record("scale io", f"ray {n} worker(s), {in_flight} in flight", f"{row['per_s']:.1f}/s",
                           f"ideal {ideal:.0f}/s", f"{100 * share:.1f} %", ">= 90 % of ideal", share >= 0.9)
                else:
                    record("scale io", f"local, {in_flight} in flight", f"{row['per_s']:.1f}/s",
                           f"ideal {ideal:.0f}/s", f"{100 * share:.1f} %", "(baseline)")
        for n in counts:
            tasks = cpu_tasks(args.cpu_branches * n)
            used = min(n, cores)
            for backend in ("local", "ray"):
                row = fork(folder, f"cpu-{backend}-{n}", tasks, backend, address=cluster.address, workers=n,
                           concurrency=n, sandbox="bwrap", verify=True, replay=replay)
                cpu_rows[(backend, n)] = row
                print(f"cpu {backend:>5} x{n}: {row['branches']} branches, {row['per_s']:.2f}/s steady, "
                      f"{row['per_s'] / used:.2f}/s per core used ({used}), start {row['start_s']:.1f} s, "
                      f"driver {row['driver_ms']:.2f} ms CPU/branch, workers {row['worker_ms']:.2f} ms CPU/branch "
                      f"(bwrap's and pytest's own not counted), nodes {row['nodes']}  (load {loadavg()})", flush=True)
            ray_core, local_core = cpu_rows[("ray", n)]["per_s"] / used, cpu_rows[("local", n)]["per_s"] / used
            share = ray_core / local_core
            record("scale cpu", f"ray {n} worker(s), per core used", f"{ray_core:.2f}/s",
                   f"local c={n} {local_core:.2f}/s", f"{100 * share:.1f} %", ">= 85 % of local", share >= 0.85)
    finally:
        cluster.stop()
    driver_ms = max(row["driver_ms"] for row in io_rows.values())
    record("scale driver", "driver CPU per branch (io rows, worst)", f"{driver_ms:.2f} ms")
    busy1, wall = cpu_busy_seconds(), time.perf_counter() - wall0
    print_table()
    # Projection: the driver's CPU caps what it can take in; the cluster's cores cap what it can run.
    best = max(counts)
    per_core = cpu_rows[("ray", best)]["per_s"] / min(best, cores)
    branches, nodes = 10_000 * 8, 50
    driver_cap = 1000 / driver_ms
    cluster_cap = per_core * nodes * args.node_cores
    rate = min(driver_cap, cluster_cap)
    print(f"\nprojection, 10,000 tasks x 8 branches = {branches:,} branches on {nodes} nodes of {args.node_cores} "
          f"cores, this branch mix (a 10-test pytest suite in bwrap, verified isolated):\n"
          f"  one driver takes in at most {driver_cap:,.0f} branches/s ({driver_ms:.2f} ms of its CPU each);\n"
          f"  the cluster runs about {per_core:.2f} branches/s per core here x {nodes * args.node_cores} cores "
          f"= {cluster_cap:,.0f}/s;\n"
          f"  so about {rate:,.0f} branches/s, {branches / rate / 60:,.1f} minutes "
          f"({'driver-bound' if driver_cap < cluster_cap else 'cluster-bound'}; the model endpoints' own "
          f"throughput, absent here, bounds a real run first: 80,000 branches x turns x their latency / "
          f"--concurrency).")
    if busy0 is not None and busy1 is not None:
        print(f"machine: {(busy1 - busy0) / wall / cores:.0%} of its CPUs busy over the run (all processes, this "
              f"bench's and everyone else's); load average at end {loadavg()}; results are noisy where it is high")
    print(f"goals: io >= 90 % of ideal {verdict(all(r.ok for r in _rows('scale io') if r.ok is not None))}, "
          f"cpu >= 85 % of local per core {verdict(all(r.ok for r in _rows('scale cpu')))}")


def _rows(bench: str) -> list:
    from _results import RESULTS

    return [row for row in RESULTS if row.bench == bench]


if __name__ == "__main__":
    main()
