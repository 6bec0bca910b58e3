"""How fast `factory view` opens a large run: the API calls its pages make, on a run of 100,000 branches.

Builds a store through the store's own write API (``write_run``, ``write_tasks``,
``write_branches`` with events, ``write_verdicts``, ``write_rankings``, in
batches as the fork runner and ranker write them): ``--tasks`` tasks x
``--branches`` branches (default 1,000 x 100 = 100,000 branches, five events
and one verdict each, some failing, some infrastructure failures, some hacks).
Then, on the store opened read-only as `factory view` opens it, it times the
requests each page makes, the first call (cold) and the median of the next
five (warm):

- the run page: ``run`` (every count over the whole run) + ``tasks`` (the first
  page of 50 tasks with their 5,000 grid cells) — the goal is under a second;
- the runs page, a task's side-by-side view, a diff, a search, the ranking.

Usage: python bench/bench_view.py [--tasks 1000] [--branches 100] [--keep DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

from factory.store import Store
from factory.view import ViewData

RUN = "bench-view"


def build(db: Path, n_tasks: int, n_branches: int) -> float:
    """Write the synthetic run; return the seconds it took."""
    start = time.perf_counter()
    t0 = datetime(2026, 1, 1)
    with Store.open(db) as store:
        store.write_run({"run_id": RUN, "created_at": t0, "finished_at": t0, "status": "finished",
                         "model": "replay:bench", "sandbox": "none", "n_branches": n_branches,
                         "config": {"branches": n_branches}})
        store.write_tasks([{"run_id": RUN, "task_id": f"task-{t:05d}", "task_hash": f"h{t}",
                            "prompt": f"Fix solution.py of task {t} so its tests pass.", "verifiers": ["tests"],
                            "spec": {"id": f"task-{t:05d}", "files": {"solution.py": f"def f():\n    return {t}\n"}}}
                           for t in range(n_tasks)])
        batch = max(1, 20_000 // n_branches)  # tasks per write
        for first in range(0, n_tasks, batch):
            branches, events, verdicts, rankings = [], [], [], []
            for t in range(first, min(n_tasks, first + batch)):
                task = f"task-{t:05d}"
                for b in range(n_branches):
                    key = {"run_id": RUN, "task_id": task, "branch_index": b}
                    infra = (t * 7 + b) % 97 == 0
                    passed = (t + b) % 3 == 0
                    answer = f"fixed: return {t + (0 if passed else b)}"
                    branches.append({**key, "session_id": f"{task}-b{b}", "temperature": 0.7, "seed": b,
                                     "model": "replay:bench", "status": "infra_error" if infra else "ok",
                                     "final_answer": None if infra else answer, "input_tokens": 300,
                                     "output_tokens": 80, "cost_usd": 0.0004, "started_at": t0, "finished_at": t0,
                                     "error": "ProviderExhaustedError: gave up" if infra else None,
                                     "workspace": {"files": {"solution.py": f"def f():\n    return {answer}\n"}}})
                    call = {"name": "run", "arguments": {"command": "python -m pytest -q"}}
                    for seq, (kind, payload) in enumerate((
                            ("run_start", {"task_id": task, "mode": "tools", "seed": b}),
                            ("model_call", {"turn": 0, "text": "", "tool_calls": ["run"]}),
                            ("tool_call", {"id": "c0", **call, "error": None}),
                            ("tool_result", {"id": "c0", "name": "run", "ok": passed, "output":
                                             f"{'1 passed' if passed else 'FAILED test_f - assert'} {t}.{b}"}),
                            ("final_answer", {"answer": answer, "via": "submit"}))):
                        events.append({**key, "seq": seq, "ts": t0 + timedelta(milliseconds=seq), "kind": kind,
                                       "payload": payload})
                    if infra:
                        continue
                    hack = (t * 13 + b) % 211 == 0
                    verdicts.append({**key, "verifier": "tests", "version": "2", "ok": passed, "score": float(passed),
                                     "status": "pass" if passed else "fail", "created_at": t0,
                                     "details": {"hack_detected": hack, "hack_suspected": hack,
                                                 "failed": [] if passed else ["test_f"], "boundary": []}})
                    rankings.append({**key, "rank": 1 if passed else 2, "strength": 0.5, "ci_low": 0.1,
                                     "ci_high": 0.9, "reward": float(passed), "components": {"objective": passed},
                                     "created_at": t0})
            store.write_branches(branches, events)
            store.write_verdicts(verdicts)
            store.write_rankings(rankings)
    return time.perf_counter() - start


def timed(call, repeats: int = 5) -> tuple[float, float, float]:
    """(first call's wall seconds, its CPU seconds over all threads, median wall seconds of the next ``repeats``).

    The CPU figure is what the call costs on an idle machine at most (DuckDB spreads it over cores); the wall
    figure also counts waiting for a core, which on a shared machine can dwarf it.
    """
    start, cpu = time.perf_counter(), time.process_time()
    call()
    cold, cold_cpu = time.perf_counter() - start, time.process_time() - cpu
    warm = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        warm.append(time.perf_counter() - start)
    return cold, cold_cpu, statistics.median(warm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--branches", type=int, default=100)
    parser.add_argument("--keep", type=Path, default=None, help="build the store in this folder and keep it")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-view-"))
    db = folder / "view.duckdb"
    if not db.exists():
        seconds = build(db, args.tasks, args.branches)
        print(f"built {args.tasks * args.branches:,} branches ({args.tasks:,} tasks x {args.branches}), "
              f"{5 * args.tasks * args.branches:,} events through the store API in {seconds:.1f} s "
              f"({db.stat().st_size / 1e6:.0f} MB)")
    with Store.open(db, read_only=True) as store:
        data = ViewData(store)
        task = "task-00500" if args.tasks > 500 else "task-00000"
        calls = {
            "run page: run (counts over the whole run)": lambda: data.answer("run", {"run": RUN}),
            "run page: tasks (50 tasks, their grid cells)": lambda: data.answer("tasks", {"run": RUN}),
            "runs page: runs": lambda: data.answer("runs", {}),
            "task page: 4 branches side by side": lambda: data.answer("task", {"run": RUN, "task": task}),
            "diff of two final workspaces": lambda: data.answer("diff", {"run": RUN, "task": task, "a": 0, "b": 1}),
            "search tool outputs ('FAILED test_f - assert 999.')": lambda: data.answer(
                "search", {"run": RUN, "q": "FAILED test_f - assert 999."}),
            "ranking page (100 rows)": lambda: data.answer("rankings", {"run": RUN}),
        }
        results = {}
        print(f"{'request':55s} {'first wall (s)':>14s} {'first CPU (s)':>14s} {'again, median (s)':>18s}")
        for name, call in calls.items():
            results[name] = timed(call)
            print(f"{name:55s} {results[name][0]:14.3f} {results[name][1]:14.3f} {results[name][2]:18.3f}")
        run = data.answer("run", {"run": RUN})
        print(f"run counts: {run['branches']:,} branches, {run['passed']:,} passed of {run['verified']:,} verified, "
              f"{run['infra_failures']:,} infrastructure failures, {run['hacks']:,} hacks")
    page = [results["run page: run (counts over the whole run)"],
            results["run page: tasks (50 tasks, their grid cells)"]]
    wall, cpu, again = (sum(r[i] for r in page) for i in range(3))
    print(f"opening the run page ({args.tasks * args.branches:,} branches): first {wall:.3f} s wall "
          f"({cpu:.3f} s CPU), again {again:.3f} s (counts kept until the run changes); "
          f"goal < 1 s: {'met' if wall < 1 else 'met in CPU time' if cpu < 1 else 'NOT met'}")
    if args.keep is None:
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()


if __name__ == "__main__":
    main()
