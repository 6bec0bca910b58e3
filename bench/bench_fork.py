"""Fork-runner speed: orchestration overhead, sandbox start, concurrency, embedded model.

Four benchmarks, each against a baseline measured in the same run:

1. ``overhead``: answer-only tasks x 8 branches through ``RolloutForkRunner``
   with a zero-delay ``replay:`` model, sandbox ``none`` and a DuckDB store,
   against a bare ``asyncio.gather`` of the same replay ``chat`` calls.
   Goals: >= 1,000 branches/s and >= 50% of the baseline. ``--watch S``
   also runs a reader process opening the store read-only every S seconds
   while the fork writes it (``factory runs`` does the same), and says how
   many of its looks got in and what they cost the run.
2. ``sandbox``: median/p90 ms to start a branch sandbox, run
   ``python3 -c pass`` and close it (bwrap, none), against bare
   ``subprocess.run`` and bare ``unshare --net --pid --fork``.
   Goal: bwrap within 2x of bare unshare.
3. ``concurrency``: a replay model that sleeps 200 ms per call, concurrency
   64; ideal throughput is concurrency / delay. Goal: >= 80% of ideal.
4. ``local``: the embedded Qwen2.5-Coder 0.5B GGUF (llama.cpp, 2 threads) on
   ``examples/tasks.jsonl``, 1 branch per task, sandbox bwrap, concurrency 1,
   against bare ``model.chat`` calls on each task's first turn. The slowest
   (tens of seconds here; minutes with more tasks, tokens or tool turns).

By default each chosen benchmark runs in a fresh interpreter, so none inherits
another's memory, garbage or event-loop state (``--same-process`` to opt out);
``--quick`` shrinks every size (a smoke run: too small to judge goals by).

Every ``python3`` is the interpreter running this script (first on PATH), so
all sandbox-start rows start the same program.

Usage: python bench/bench_fork.py [--only overhead,sandbox,concurrency,local] [--quick] [--watch S]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _results import RESULTS, Row, print_table, record, verdict  # bench/ is on sys.path

from factory.models import ChatModel, ModelOptions, create_model
from factory.rollouts import AGENT_TOOLS, AgentConfig, ForkConfig, RolloutForkRunner, ToolCallingAgent
from factory.sandbox import NoSandboxWarning, SandboxSpec, create_sandbox
from factory.store import Store
from factory.tasks import Task, load_tasks

NAMES = ("overhead", "sandbox", "concurrency", "local")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "tasks.jsonl"
BIN = str(Path(sys.executable).parent)  # the venv's bin: its python3 is what the sandboxes run




def write_replay(path: Path, delay_s: float) -> Path:
    """A scripted replay file whose single entry matches every prompt at turn 0."""
    entry = {"turn": 0, "response": {"text": "Thinking briefly.\nFinal: 42",
                                     "usage": {"input_tokens": 60, "output_tokens": 8}}, "delay_s": delay_s}
    path.write_text(json.dumps(entry) + "\n")
    return path


def answer_tasks(n: int) -> list[Task]:
    return [Task(id=f"bench-{i:05d}", prompt=f"What is {i} + 17? Reply with `Final: <number>`.", answer=str(i + 17))
            for i in range(n)]


class TimedRunner(RolloutForkRunner):
    """The runner, timing its store writes (for the where-time-goes line)."""

    flush_s = 0.0
    flushes = 0

    def _flush(self, results: list) -> None:
        start = time.perf_counter()
        super()._flush(results)
        self.flush_s += time.perf_counter() - start
        self.flushes += 1


async def drive(runner: RolloutForkRunner, tasks: Sequence[Task]) -> tuple[float, list]:
    start = time.perf_counter()
    results = [result async for result in runner.run(tasks)]
    return time.perf_counter() - start, results


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# ------------------------------------------------------------------ 1. overhead


#: A reader in its own process: every ARGV[2] s, open the store ARGV[1] read-only, count branches, close.
WATCHER = """
import sys, time
from pathlib import Path
from factory.store import Store
db, every = Path(sys.argv[1]), float(sys.argv[2])
while True:
    time.sleep(every)
    start = time.perf_counter()
    try:
        with Store.open(db, read_only=True) as store:
            n = store.query("SELECT count(*) FROM branches").item()
        print(f"ok {n} {time.perf_counter() - start:.4f}", flush=True)
    except Exception as exc:
        print(f"fail {type(exc).__name__}", flush=True)
"""


def bench_overhead(n_tasks: int, branches: int, concurrency: int, watch_s: float | None = None) -> None:
    watched = f", a reader process every {watch_s:g} s" if watch_s else ""
    print(f"\n[1] orchestration overhead: {n_tasks:,} answer-only tasks x {branches} branches, "
          f"replay model (0 delay), sandbox none, concurrency {concurrency}, DuckDB store{watched}; "
          f"workspaces and store under {tempfile.gettempdir()}")
    tasks = answer_tasks(n_tasks)
    total = n_tasks * branches
    with tempfile.TemporaryDirectory(prefix="bench-fork-") as tmp:
        replay = write_replay(Path(tmp) / "replay.jsonl", 0.0)
        model = create_model(f"replay:{replay}")
        config = ForkConfig(branches=branches, concurrency=concurrency, sandbox="none")
        temperatures, seeds = config.sampling()

        # Baseline: the same chat calls, no sandboxes, no store.
        agent = ToolCallingAgent(model, config.agent)
        openings = [agent.opening(task) for task in tasks]

        async def bare() -> float:
            start = time.perf_counter()
            replies = await asyncio.gather(*(
                model.chat(messages, None, temperature=temperatures[b], seed=seeds[b],
                           max_tokens=config.agent.max_tokens)
                for messages in openings for b in range(branches)))
            elapsed = time.perf_counter() - start
            assert len(replies) == total
            return elapsed

        base_s = asyncio.run(bare())
        base_rate = total / base_s

        with Store.open(Path(tmp) / "bench.duckdb") as store:
            watcher = None
            if watch_s:
                watcher = subprocess.Popen([sys.executable, "-c", WATCHER, str(store.path), str(watch_s)],
                                           stdout=subprocess.PIPE, text=True)
                time.sleep(2.0)  # its imports, before the run starts
            runner = TimedRunner(model, store, config)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", NoSandboxWarning)
                run_s, results = asyncio.run(drive(runner, tasks))
            if watcher is not None:
                watcher.terminate()
                looks = [line.split() for line in watcher.communicate(timeout=60)[0].splitlines()]
            counts = store.query(
                "SELECT (SELECT count(*) FROM branches WHERE run_id = $r) AS branches, "
                "(SELECT count(*) FROM branches WHERE run_id = $r AND status = 'ok') AS ok, "
                "(SELECT count(*) FROM events WHERE run_id = $r) AS events", {"r": runner.run_id}).row(0)
    rate = total / run_s
    n_rows, n_ok, n_events = counts
    stored_ok = n_rows == total and n_ok == total and len(results) == total
    print(f"    baseline  asyncio.gather of {total:,} chat calls  {base_s:7.3f} s  {base_rate:10,.0f} branches/s")
    print(f"    runner    fork + sandbox none + store         {run_s:7.3f} s  {rate:10,.0f} branches/s"
          f"  (goal >= 1,000: {verdict(rate >= 1000)})")
    print(f"    ratio     runner / baseline                   {rate / base_rate:7.1%}"
          f"  (goal >= 50%: {verdict(rate / base_rate >= 0.5)})")
    print(f"    store     {n_rows:,} branch rows ({n_ok:,} ok), {n_events:,} events; "
          f"{runner.flushes} flushes took {runner.flush_s:.3f} s in a worker thread "
          f"({runner.flush_s / run_s:.0%} of the run)  [expect exactly {total:,} rows: {verdict(stored_ok)}]")
    if watch_s:
        got_in = [look for look in looks if look[0] == "ok"]
        waits = [float(look[2]) * 1000 for look in got_in]
        seen = sorted({int(look[1]) for look in got_in})
        timing = f" (open+read median {statistics.median(waits):.0f} ms, p90 {pct(waits, 0.9):.0f} ms)" if waits else ""
        print(f"    watched   {len(got_in)}/{len(looks)} reader looks got in{timing}, "
              f"{len(seen)} distinct branch counts seen")
        record("overhead", "reader looks that got in", f"{len(got_in)}/{len(looks)}", "", "", "all",
               bool(looks) and len(got_in) == len(looks))
    record("overhead", "branches/s (runner)", f"{rate:,.0f}", "", "", ">= 1,000/s", rate >= 1000)
    record("overhead", "runner / bare gather", f"{rate:,.0f}/s", f"{base_rate:,.0f}/s", f"{rate / base_rate:.1%}",
           ">= 50%", rate / base_rate >= 0.5)
    record("overhead", "branch rows stored", f"{n_rows:,}", f"{total:,}", "", f"== {total:,}", stored_ok)


# ------------------------------------------------------------------ 2. sandbox start


async def _sandbox_cycle(backend: str) -> tuple[float, float]:
    start = time.perf_counter()
    async with create_sandbox(backend, SandboxSpec()) as sandbox:
        exec_start = time.perf_counter()
        result = await sandbox.exec(["python3", "-c", "pass"])
        exec_s = time.perf_counter() - exec_start
    if not result.ok:
        raise SystemExit(f"{backend}: python3 -c pass failed: {result.describe()}")
    return time.perf_counter() - start, exec_s


def _run_sync(argv: list[str], cwd: str | None = None) -> float:
    env = {"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, check=True)
    return time.perf_counter() - start


async def _interleaved(contenders: dict[str, Callable[[], Any]], runs: int) -> dict[str, list[tuple[float, float]]]:
    """Time each contender ``runs`` times, round-robin (so drifts in machine load hit all alike)."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for attempt in range(runs + 1):  # the first round warms up
        for name, start in contenders.items():
            outcome = start()
            if asyncio.iscoroutine(outcome):
                outcome = await outcome
            if attempt:
                times[name].append(outcome if isinstance(outcome, tuple) else (outcome, float("nan")))
    return times


def bench_sandbox(runs: int, ballast_mb: int) -> None:
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\n[2] sandbox start: {runs} runs each (round-robin) of start + `python3 -c pass` + close "
          f"(python3 = {sys.executable}; peak RSS {rss_mb:.0f} MB)")
    python = ["python3", "-c", "pass"]
    has_bwrap, has_unshare = shutil.which("bwrap") is not None, shutil.which("unshare") is not None
    if not has_bwrap:
        print("    bwrap: not installed, skipped")

    async def measure() -> dict[str, list[tuple[float, float]]]:
        contenders: dict[str, Callable[[], Any]] = {}
        if has_bwrap:
            contenders["sandbox bwrap"] = lambda: _sandbox_cycle("bwrap")
        contenders["sandbox none"] = lambda: _sandbox_cycle("none")
        contenders["bare subprocess.run"] = lambda: _run_sync(python)
        if has_unshare:
            contenders["bare unshare --net --pid"] = lambda: _run_sync(["unshare", "--net", "--pid", "--fork", *python])
        async with contextlib.AsyncExitStack() as stack:
            if has_bwrap:
                # bwrap's own cost: the backend's exact command line, started by subprocess.run with
                # no rlimits and no asyncio (private attributes: this is a diagnostic).
                sandbox = await stack.enter_async_context(create_sandbox("bwrap", SandboxSpec()))
                argv, root = [*sandbox._prefix, *python], str(sandbox._workspace.root)
                contenders["bare bwrap, same argv"] = lambda: _run_sync(argv, cwd=root)
            times = await _interleaved(contenders, runs)
        if ballast_mb:
            # The same starts from a process holding more memory, as a long fork run does: a preexec_fn
            # makes subprocess fork() (copying page tables) where it would otherwise vfork().
            ballast = b"x" * (ballast_mb << 20)
            heavy = {f"{name} +{ballast_mb} MB": start for name, start in contenders.items()
                     if name in ("sandbox bwrap", "sandbox none", "bare subprocess.run")}
            times.update(await _interleaved(heavy, runs))
            del ballast
        return times

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoSandboxWarning)
        timings = asyncio.run(measure())
    reference = timings.get("bare unshare --net --pid")
    ref_median = statistics.median(t for t, _ in reference) if reference else None
    print(f"    {'':30} {'median ms':>10} {'p90 ms':>8} {'exec ms':>8} {'vs unshare':>11}")
    for name, pairs in timings.items():
        totals = [t for t, _ in pairs]
        median = statistics.median(totals)
        execs = [e for _, e in pairs if e == e]
        exec_ms = f"{statistics.median(execs) * 1000:8.1f}" if execs else f"{'':8}"
        ratio = f"{median / ref_median:10.2f}x" if ref_median else ""
        print(f"    {name:30} {median * 1000:10.1f} {pct(totals, 0.9) * 1000:8.1f} {exec_ms} {ratio}")
    if ref_median:
        for backend, goal in (("bwrap", 2.0), ("none", None)):
            pairs = timings.get(f"sandbox {backend}")
            if not pairs:
                continue
            median = statistics.median(t for t, _ in pairs)
            ok = None if goal is None else median <= goal * ref_median
            if ok is not None:
                print(f"    bwrap / bare unshare = {median / ref_median:.2f}x  (goal <= 2x: {verdict(ok)})")
            record("sandbox", f"{backend} start+exec+close ms (median)", f"{median * 1000:.1f}",
                   f"{ref_median * 1000:.1f}", f"{median / ref_median:.2f}x", "<= 2x unshare" if goal else "", ok)


# ------------------------------------------------------------------ 3. concurrency


def bench_concurrency(n_tasks: int, branches: int, concurrency: int, delay_s: float) -> None:
    total = n_tasks * branches
    ideal = concurrency / delay_s
    print(f"\n[3] concurrency: {n_tasks} tasks x {branches} branches, replay model sleeping {delay_s * 1000:.0f} ms "
          f"per call, concurrency {concurrency}, sandbox none; ideal {ideal:,.0f} branches/s")
    tasks = answer_tasks(n_tasks)
    with tempfile.TemporaryDirectory(prefix="bench-fork-") as tmp:
        replay = write_replay(Path(tmp) / "replay.jsonl", delay_s)
        model = create_model(f"replay:{replay}")
        config = ForkConfig(branches=branches, concurrency=concurrency, sandbox="none")
        temperatures, seeds = config.sampling()
        openings = [ToolCallingAgent(model, config.agent).opening(task) for task in tasks]

        async def bare() -> float:
            gate = asyncio.Semaphore(concurrency)

            async def one(messages: list, b: int) -> None:
                async with gate:
                    await model.chat(messages, None, temperature=temperatures[b], seed=seeds[b])

            start = time.perf_counter()
            await asyncio.gather(*(one(m, b) for m in openings for b in range(branches)))
            return time.perf_counter() - start

        base_s = asyncio.run(bare())
        with Store.open(Path(tmp) / "bench.duckdb") as store:
            runner = TimedRunner(model, store, config)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", NoSandboxWarning)
                run_s, results = asyncio.run(drive(runner, tasks))
    assert len(results) == total
    rate, base_rate = total / run_s, total / base_s
    ok = rate / ideal >= 0.8
    print(f"    baseline  semaphore({concurrency}) + gather        {base_s:7.3f} s  {base_rate:6,.0f} branches/s"
          f"  = {base_rate / ideal:6.1%} of ideal")
    print(f"    runner    fork + sandbox none + store      {run_s:7.3f} s  {rate:6,.0f} branches/s"
          f"  = {rate / ideal:6.1%} of ideal (goal >= 80%: {verdict(ok)})")
    print(f"    ratio     runner / baseline                {rate / base_rate:7.1%}")
    print(f"    store     {runner.flushes} flushes, {runner.flush_s:.3f} s in a worker thread")
    record("concurrency", "branches/s at 200 ms/call", f"{rate:,.0f}", f"{ideal:,.0f} ideal",
           f"{rate / ideal:.1%}", ">= 80% of ideal", ok)


# ------------------------------------------------------------------ 4. embedded model


def bench_local(tasks: Sequence[Task], max_tokens: int, threads: int) -> None:
    print(f"\n[4] embedded model: {len(tasks)} tasks from {EXAMPLES.name} x 1 branch, local GGUF "
          f"(llama.cpp, {threads} threads), max_tokens {max_tokens}, sandbox bwrap, concurrency 1")
    start = time.perf_counter()
    try:
        model: ChatModel = create_model("local", ModelOptions(threads=threads))
    except Exception as exc:  # missing llama-cpp-python or weights: report, do not crash the other benches
        print(f"    skipped: {type(exc).__name__}: {exc}")
        return
    load_s = time.perf_counter() - start
    print(f"    model load {load_s:.2f} s (not counted)")
    config = ForkConfig(branches=1, concurrency=1, sandbox="bwrap", temperatures=(0.7,),
                        agent=AgentConfig(max_tokens=max_tokens))
    temperatures, seeds = config.sampling()
    agent = ToolCallingAgent(model, config.agent)

    async def bare() -> tuple[float, int, int]:
        # First turn of every task, straight to the model: no runner, no sandbox, no store.
        out = inp = 0
        begin = time.perf_counter()
        for task in tasks:
            tools = None if agent.single_turn(task) else list(AGENT_TOOLS)
            reply = await model.chat(agent.opening(task), tools, temperature=temperatures[0], seed=seeds[0],
                                     max_tokens=max_tokens)
            out += reply.usage.output_tokens
            inp += reply.usage.input_tokens
        return time.perf_counter() - begin, inp, out

    async def main() -> tuple[tuple[float, int, int], tuple[float, list]]:
        try:
            # Warm-up, not timed: the last task's first turn, so that both timed passes start from the same
            # llama.cpp prompt cache (the cached prefix of whatever prompt ran last).
            last = tasks[-1]
            await model.chat(agent.opening(last), None if agent.single_turn(last) else list(AGENT_TOOLS),
                             temperature=temperatures[0], seed=seeds[0], max_tokens=max_tokens)
            before = await bare()
            with tempfile.TemporaryDirectory(prefix="bench-fork-") as tmp, \
                    Store.open(Path(tmp) / "bench.duckdb") as store:
                ran = await drive(RolloutForkRunner(model, store, config), tasks)
            after = await bare()  # the baseline is the faster of two passes, one on each side of the runner
            return min(before, after), ran
        finally:
            await model.aclose()

    (base_s, base_in, base_out), (run_s, results) = asyncio.run(main())
    out = sum(r.usage.output_tokens for r in results)
    inp = sum(r.usage.input_tokens for r in results)
    calls = [e for r in results for e in r.events if e["kind"] == "model_call"]
    model_s = sum(e["payload"]["latency_s"] for e in calls)
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    base_tps, tps = base_out / base_s, out / run_s
    base_label = f"{len(tasks)} first-turn model.chat calls (best of 2)"
    run_label = f"{len(results)} branches, {len(calls)} model calls"
    print(f"    baseline  {base_label:44} {base_s:7.1f} s  {base_out:6,} out tok  {base_tps:6.1f} out tok/s"
          f"  ({(base_in + base_out) / base_s:6.1f} in+out tok/s)")
    print(f"    runner    {run_label:44} {run_s:7.1f} s  {out:6,} out tok  {tps:6.1f} out tok/s"
          f"  ({(inp + out) / run_s:6.1f} in+out tok/s)  = {tps / base_tps:.1%} of baseline")
    print(f"    runner    {len(results) / run_s * 60:.2f} branches/min; statuses {statuses}; "
          f"model calls took {model_s:.1f} s = {model_s / run_s:.1%} of the run (rest: sandboxes, tools, store)")
    record("local", "output tokens/s", f"{tps:.1f}", f"{base_tps:.1f}", f"{tps / base_tps:.1%}", "", None)
    record("local", "branches/min", f"{len(results) / run_s * 60:.2f}", "", "", "", None)
    record("local", "model share of wall time", f"{model_s / run_s:.1%}", "", "", "", None)


# ------------------------------------------------------------------ main


def run_isolated(name: str, argv: list[str]) -> None:
    """Run one benchmark in a fresh interpreter (no memory, GC or event-loop state left by another)."""
    with tempfile.TemporaryDirectory(prefix="bench-fork-") as tmp:
        out = Path(tmp) / "rows.json"
        code = subprocess.run([sys.executable, __file__, *argv, "--only", name, "--rows-to", str(out)]).returncode
        if code != 0:
            record(name, "benchmark exited", f"rc {code}", ok=False)
        elif out.exists():
            RESULTS.extend(Row(**row) for row in json.loads(out.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(NAMES), help=f"comma list of: {', '.join(NAMES)}")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--tasks", type=int, default=None, help="overhead: answer-only tasks (default 1000)")
    parser.add_argument("--watch", type=float, default=None, metavar="S",
                        help="overhead: a reader process opens the store every S seconds during the run")
    parser.add_argument("--runs", type=int, default=None, help="sandbox: runs per backend (default 30)")
    parser.add_argument("--ballast-mb", type=int, default=300,
                        help="sandbox: also time starts with this much more memory held (0: skip)")
    parser.add_argument("--local-tasks", default=None,
                        help="local: comma list of example task ids (default all; --quick: 3 of them)")
    parser.add_argument("--max-tokens", type=int, default=128, help="local: tokens per model call")
    parser.add_argument("--threads", type=int, default=2, help="local: llama.cpp CPU threads")
    parser.add_argument("--same-process", action="store_true",
                        help="run the chosen benchmarks in this process (default: one fresh process each)")
    parser.add_argument("--rows-to", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in NAMES]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)} (choose from {', '.join(NAMES)})")
    example = list(load_tasks(EXAMPLES))
    if args.local_tasks:
        wanted = [t.strip() for t in args.local_tasks.split(",") if t.strip()]
        by_id = {t.id: t for t in example}
        missing = [t for t in wanted if t not in by_id]
        if missing:
            parser.error(f"no example task(s) {', '.join(missing)} in {EXAMPLES}")
        example = [by_id[t] for t in wanted]
    elif args.quick:
        example = [t for t in example if not t.files][:2] + [t for t in example if t.files][:1]

    if args.rows_to is None:
        quick = " (quick)" if args.quick else ""
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, uid {os.geteuid()}{quick}")
    if len(chosen) > 1 and not args.same_process:
        passed = sys.argv[1:]
        for i, arg in enumerate(sys.argv[1:]):  # drop --only and its value; each child gets its own
            if arg == "--only":
                passed = sys.argv[1:i + 1] + sys.argv[i + 3:]
            elif arg.startswith("--only="):
                passed = sys.argv[1:i + 1] + sys.argv[i + 2:]
        for name in chosen:
            run_isolated(name, passed)
    else:
        if "overhead" in chosen:
            bench_overhead(args.tasks or (100 if args.quick else 1000), 8, 64, args.watch)
        if "sandbox" in chosen:
            bench_sandbox(args.runs or (10 if args.quick else 30), args.ballast_mb)
        if "concurrency" in chosen:
            bench_concurrency(16 if args.quick else 64, 8, 64, 0.2)
        if "local" in chosen:
            bench_local(example, args.max_tokens, args.threads)
    if args.rows_to is not None:
        args.rows_to.write_text(json.dumps([vars(row) for row in RESULTS]))
    else:
        print_table()


if __name__ == "__main__":
    main()
