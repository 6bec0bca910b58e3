"""``tests`` verifier throughput: branches/s for a 10-test pytest suite, against a bare pytest loop.

One task (a small ``solution.py`` and a ``test_solution.py`` of 10 passing
tests), N branches. Each branch starts a sandbox seeded with the task's files
(tests read-only), runs ``TestsVerifier`` on it (the task's ``tests``
criterion, ``BranchOutput("done")``) and closes it; every verdict must be
``pass``. One verifier instance is reused and warmed up once, so the
verifier's one-off reference run of the pristine task is not timed.

Baselines, measured in the same run, sequential and with 2 workers (the
verifier runs the same way, with an ``asyncio.Semaphore``):

- ``bare pytest``: ``python -m pytest -q`` through ``subprocess.run`` in a
  temp dir holding the same two files, the venv's interpreter, plugins
  autoloaded as installed, in a session of its own as sandboxed commands
  are (Linux autogroup scheduling gives each session its own share of the
  CPUs, which would favour the sandboxes whenever anything else runs);
- ``bare pytest, like-for-like``: the same with what the guard does to pytest
  anyway (``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``, ``-p no:cacheprovider``), so
  the comparison charges the verifier only for the sandbox and the guard, not
  credits it for skipping installed plugins. The goal is judged against this
  one.

Contenders take turns in chunks of ``--chunk`` branches (round-robin), so
drifts in machine load hit all of them alike; beside each ratio of totals is
the median over rounds of the paired ratio (each turn against the bare turn
of the same round), which shrugs off bursts of other load on a shared
machine. The goal is judged on the ratio of totals. Per-branch CPU is printed
too (bwrap's sandboxed processes are not reaped by this process, so their
CPU is not visible here).

Goal: verifier (bwrap) >= 80% of the matching bare loop's branches/s.

A breakdown then times the parts of one verification (median of ``--runs``):
sandbox start/close, a no-op command in the sandbox, plain pytest in the
sandbox, the guarded run on the host and in the sandbox, the workspace scans.

Usage: python bench/bench_verify.py [--branches 40] [--concurrency 2] [--chunk 4] [--runs 10]
       [--backends bwrap,none] [--no-installed] [--no-breakdown]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from _results import print_table, record, verdict  # bench/ is on sys.path

from factory.sandbox import NoSandboxWarning, Sandbox, SandboxSpec, create_sandbox
from factory.tasks import Task
from factory.verifiers import BranchOutput, TestsVerifier, Verdict, VerifyContext, criteria_for, run_verifier
from factory.verifiers._pytest_guard import GUARD_SOURCE
from factory.verifiers._tests import _pytest_args, scan_workspace

SOLUTION = '''\
"""A few small functions for the benchmark's tests."""


def add(a, b):
    return a + b


def factorial(n):
    result = 1
    for i in range(2, n + 1):
        result *= i
    return result


def is_palindrome(text):
    cleaned = [c.lower() for c in text if c.isalnum()]
    return cleaned == cleaned[::-1]


def fizzbuzz(n):
    return "FizzBuzz" if n % 15 == 0 else "Fizz" if n % 3 == 0 else "Buzz" if n % 5 == 0 else str(n)


def word_count(text):
    counts = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return counts
'''

TESTS = '''\
from solution import add, factorial, fizzbuzz, is_palindrome, word_count


def test_add():
    assert add(2, 3) == 5


def test_add_negative():
    assert add(-2, -3) == -5


def test_factorial_zero():
    assert factorial(0) == 1


def test_factorial_five():
    assert factorial(5) == 120


def test_palindrome():
    assert is_palindrome("A man, a plan, a canal: Panama")


def test_not_palindrome():
    assert not is_palindrome("benchmark")


def test_fizz():
    assert fizzbuzz(9) == "Fizz"


def test_buzz():
    assert fizzbuzz(10) == "Buzz"


def test_fizzbuzz():
    assert fizzbuzz(30) == "FizzBuzz"


def test_word_count():
    assert word_count("a b a") == {"a": 2, "b": 1}
'''

N_TESTS = TESTS.count("\ndef test_")
TASK = Task(id="bench-verify", prompt="Implement the functions in solution.py.",
            files={"solution.py": SOLUTION}, tests={"test_solution.py": TESTS})
PYTEST = [sys.executable, "-m", "pytest", "-q"]
LIKE_FOR_LIKE = ["-p", "no:cacheprovider"]  # plus PYTEST_DISABLE_PLUGIN_AUTOLOAD=1, as the guard runs pytest
GOAL = 0.8




def seed_dir(path: Path) -> Path:
    for rel, text in {**TASK.files, **TASK.tests}.items():
        (path / rel).write_text(text)
    return path


def bare_env(like_for_like: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # as in the sandboxes: no cached rewritten tests from one run to the next
    if like_for_like:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    else:
        env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    return env


def bare_pytest(cwd: Path, like_for_like: bool) -> None:
    argv = PYTEST + (LIKE_FOR_LIKE if like_for_like else [])
    # In a session of its own, as every sandboxed command is: with Linux autogroup scheduling each session is a
    # scheduling group, so children left in this process's session would get less CPU than the sandboxes' whenever
    # anything else on the machine competes for it.
    result = subprocess.run(argv, cwd=cwd, env=bare_env(like_for_like), capture_output=True, text=True,
                            start_new_session=True)
    if result.returncode != 0 or f"{N_TESTS} passed" not in result.stdout:
        raise SystemExit(f"error: bare pytest failed (rc {result.returncode}):\n{result.stdout}{result.stderr}")


def cpu_now() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat (0, 0 where there is none)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


@dataclass
class Branch:
    setup_s: float  # sandbox create + start
    verify_s: float
    close_s: float
    verdict: Verdict | None = None


@dataclass
class Tally:
    """One contender's totals over all its timed chunks."""

    name: str
    seconds: float = 0.0
    done: int = 0
    cpu_self_s: float = 0.0
    cpu_children_s: float = 0.0
    branches: list[Branch] | None = None
    error: str | None = None
    chunks: list[float] = field(default_factory=list)  # seconds of each round-robin turn

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds else 0.0


async def one_branch(backend: str, verifier: TestsVerifier) -> Branch:
    criterion = next(c for c in criteria_for(TASK) if c.id == "tests")
    t0 = time.perf_counter()
    sandbox = create_sandbox(backend, SandboxSpec(files=TASK.files, readonly_files=TASK.tests))
    await sandbox.start()
    t1 = time.perf_counter()
    try:
        result = await run_verifier(verifier, VerifyContext(TASK, BranchOutput("done"), criterion, sandbox))
        t2 = time.perf_counter()
    finally:
        await sandbox.close()
    return Branch(t1 - t0, t2 - t1, time.perf_counter() - t2, result)


def check(branches: Sequence[Branch], label: str) -> str | None:
    """None if every verdict passed all the tests against a reference; else what went wrong."""
    verdicts = [b.verdict for b in branches if b.verdict is not None]
    bad = [v for v in verdicts if v.status != "pass"]
    if bad:
        return (f"{label}: {len(bad)}/{len(verdicts)} verdicts not 'pass'; first: {bad[0].status} "
                f"{json.dumps(bad[0].details, default=str)[:1000]}")
    wrong = [v for v in verdicts if v.details.get("passed") != N_TESTS or not v.details.get("reference")]
    if wrong:
        return f"{label}: expected {N_TESTS} passed with a reference, got {wrong[0].details}"
    return None


async def measure(n: int, workers: int, chunk: int, backends: Sequence[str], installed: bool,
                  verifiers: dict[str, TestsVerifier], dirs: Sequence[Path]) -> list[Tally]:
    """Every contender, ``n`` branches each, in round-robin chunks (machine-load drift hits all alike)."""

    async def bare(like: bool, k: int) -> list[Branch]:
        if workers == 1:
            for _ in range(k):
                bare_pytest(dirs[0], like)
        else:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(lambda i: bare_pytest(dirs[i % workers], like), range(k)))
        return []

    async def verify(backend: str, k: int) -> list[Branch]:
        gate = asyncio.Semaphore(workers)

        async def gated() -> Branch:
            async with gate:
                return await one_branch(backend, verifiers[backend])

        return list(await asyncio.gather(*(gated() for _ in range(k))))

    contenders: dict[str, Callable[[int], Awaitable[list[Branch]]]] = {}
    if installed:
        contenders["bare pytest, as installed"] = lambda k: bare(False, k)
    contenders["bare pytest, like-for-like"] = lambda k: bare(True, k)
    for backend in backends:
        contenders[f"verifier {backend}"] = lambda k, backend=backend: verify(backend, k)
    tallies = {name: Tally(name, branches=[] if name.startswith("verifier") else None) for name in contenders}
    left = n
    while left > 0:
        k = min(chunk, left)
        left -= k
        for name, run in contenders.items():
            tally = tallies[name]
            cpu = cpu_now()
            start = time.perf_counter()
            branches = await run(k)
            tally.chunks.append(time.perf_counter() - start)
            tally.seconds += tally.chunks[-1]
            after = cpu_now()
            tally.cpu_self_s += after[0] - cpu[0]
            tally.cpu_children_s += after[1] - cpu[1]
            tally.done += k
            if tally.branches is not None:
                tally.branches += branches
    for tally in tallies.values():
        if tally.branches is not None:
            tally.error = check(tally.branches, f"{tally.name} x{workers}")
    return list(tallies.values())


async def throughput(n: int, concurrency: int, chunk: int, backends: Sequence[str],
                     installed: bool) -> dict[int, list[Tally]]:
    """All timed loops in one event loop (the verifier caches its reference run per loop)."""
    verifiers = {backend: TestsVerifier(reference_sandbox=backend) for backend in backends}
    for backend in backends:
        await one_branch(backend, verifiers[backend])  # runs (and caches) the reference; not timed
    busy0 = machine_busy()
    start = time.perf_counter()
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        dirs = []
        for i in range(concurrency):  # one temp dir per bare worker
            (Path(tmp) / f"w{i}").mkdir()
            dirs.append(seed_dir(Path(tmp) / f"w{i}"))
        bare_pytest(dirs[0], True)  # warm-up, not timed
        for workers in sorted({1, concurrency}):
            out[workers] = await measure(n, workers, chunk, backends, installed, verifiers, dirs)
    busy1 = machine_busy()
    own = sum(t.cpu_self_s + t.cpu_children_s for tallies in out.values() for t in tallies)
    total_jiffies = busy1[1] - busy0[1]
    busy_share = (busy1[0] - busy0[0]) / total_jiffies if total_jiffies else float("nan")
    print(f"    machine CPU busy during the timed loops: {busy_share:.0%} of {os.cpu_count()} cores over "
          f"{time.perf_counter() - start:.0f} s (this bench's own CPU, bwrap sandboxes not counted: {own:.0f} s)")
    return out


# ------------------------------------------------------------------ breakdown


Probe = Callable[[], Awaitable["dict[str, float] | None"]]


async def breakdown(backends: Sequence[str], runs: int) -> dict[str, float]:
    """Median ms of each part of one verification, on the host and per backend, timed round-robin.

    Diagnostic: it calls the verifier's private ``_guarded_run`` to time the guarded pytest alone.
    """
    args = _pytest_args(TASK.effective_test_command or "", TASK)
    assert args is not None
    verifier = TestsVerifier(reference_sandbox=None)
    spec = SandboxSpec(files=TASK.files, readonly_files=TASK.tests)
    probes: dict[str, Probe] = {}
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        (Path(tmp) / "ws").mkdir()
        (Path(tmp) / "scratch").mkdir()
        cwd = seed_dir(Path(tmp) / "ws")
        # The guard leaves its JUnit temp dir behind; keep it in here, not in the host's /tmp.
        env = {**bare_env(True), "TMPDIR": str(Path(tmp) / "scratch")}

        def host(argv: list[str], stdin: bool = False) -> Probe:
            async def probe() -> None:
                settings = json.dumps({"nonce": secrets.token_hex(16), "args": args,
                                       "test_files": sorted(TASK.tests), "allow_conftest": False})
                result = subprocess.run(argv, cwd=cwd, env=env, input=settings if stdin else None,
                                        capture_output=True, text=True, start_new_session=True)
                if result.returncode != 0:
                    raise SystemExit(f"error: host {argv[:4]} failed:\n{result.stdout}{result.stderr}")
            return probe

        probes["host   python -c pass"] = host([sys.executable, "-c", "pass"])
        probes["host   python -c 'import pytest'"] = host([sys.executable, "-c", "import pytest"])
        probes["host   pytest -q (like-for-like)"] = host(PYTEST + LIKE_FOR_LIKE)
        probes["host   guard program (python -I -c GUARD)"] = host([sys.executable, "-I", "-c", GUARD_SOURCE], True)

        sandboxes: list[Sandbox] = []
        try:
            for backend in backends:
                sandbox = create_sandbox(backend, spec)
                await sandbox.start()
                sandboxes.append(sandbox)
                tag = f"{backend:6} "

                async def start_close(backend: str = backend) -> dict[str, float]:
                    fresh = create_sandbox(backend, spec)
                    t0 = time.perf_counter()
                    await fresh.start()
                    t1 = time.perf_counter()
                    await fresh.close()
                    return {"sandbox start (seed workspace)": t1 - t0, "sandbox close": time.perf_counter() - t1}

                def run(command: list[str], sandbox: Sandbox = sandbox) -> Probe:
                    async def probe() -> None:
                        result = await sandbox.exec(command)
                        if not result.ok:
                            tail = result.describe()[-1500:]
                            raise SystemExit(f"error: {sandbox.name}: {command[:4]} failed: {tail}")
                    return probe

                async def guarded(sandbox: Sandbox = sandbox) -> None:
                    payload = await verifier._guarded_run(sandbox, TASK, args)
                    if payload.get("unreported") or payload.get("exit") != 0:
                        raise SystemExit(f"error: {sandbox.name}: guarded run failed: {payload}")

                async def scan(sandbox: Sandbox = sandbox) -> None:
                    await scan_workspace(sandbox, TASK)

                async def whole(sandbox: Sandbox = sandbox) -> None:
                    await verifier(VerifyContext(TASK, BranchOutput("done"), criteria_for(TASK)[0], sandbox))

                probes[tag + "sandbox start + close"] = start_close
                probes[tag + "exec `python -c pass`"] = run(["python", "-c", "pass"])
                probes[tag + "exec `python -c 'import pytest'`"] = run(["python", "-c", "import pytest"])
                probes[tag + "exec plain pytest -q (like-for-like)"] = run(
                    ["env", "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", "python", "-m", "pytest", "-q", *LIKE_FOR_LIKE])
                probes[tag + "exec guarded pytest (_guarded_run)"] = guarded
                probes[tag + "scan_workspace (runs twice per call)"] = scan
                probes[tag + "whole verifier call (no reference)"] = whole

            times: dict[str, list[float]] = {}
            for attempt in range(runs + 1):  # the first round warms up
                for name, probe in probes.items():
                    start = time.perf_counter()
                    parts = await probe()
                    elapsed = time.perf_counter() - start
                    if not attempt:
                        continue
                    if parts:
                        for part, seconds in parts.items():
                            times.setdefault(name.split(" ", 1)[0].ljust(7) + part, []).append(seconds)
                    else:
                        times.setdefault(name, []).append(elapsed)
        finally:
            for sandbox in sandboxes:
                await sandbox.close()
    return {name: statistics.median(values) * 1000 for name, values in times.items()}


# ------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--branches", type=int, default=40, help="branches (and bare runs) per timed loop")
    parser.add_argument("--concurrency", type=int, default=2, help="workers of the concurrent loops")
    parser.add_argument("--runs", type=int, default=10, help="breakdown: runs per part (median)")
    parser.add_argument("--backends", default="bwrap,none", help="comma list of sandbox backends")
    parser.add_argument("--chunk", type=int, default=4, help="branches per contender per round-robin turn")
    parser.add_argument("--no-installed", action="store_true",
                        help="skip the as-installed bare baseline (slow where heavy pytest plugins are installed)")
    parser.add_argument("--no-breakdown", action="store_true", help="skip the per-part breakdown")
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if "bwrap" in backends and shutil.which("bwrap") is None:
        print("bwrap: not installed, skipped")
        backends.remove("bwrap")
    n, conc = args.branches, args.concurrency
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, uid {os.geteuid()}; task: {N_TESTS} tests; "
          f"python = {sys.executable}")

    print(f"\n[1] {n} branches per contender, sequential and x{conc}, timed in round-robin chunks of {args.chunk}:")
    print("    bare pytest: subprocess.run(python -m pytest -q) in a temp dir; verifier: sandbox start + "
          "TestsVerifier + close (reference run warmed up, not timed)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoSandboxWarning)
        loops = asyncio.run(throughput(n, conc, args.chunk, backends, not args.no_installed))
    errors: list[str] = []
    for w, tallies in loops.items():
        by_name = {t.name: t for t in tallies}
        fair_base = by_name["bare pytest, like-for-like"]
        loose_base = by_name.get("bare pytest, as installed")
        print(f"\n    x{w} {'':28} {'seconds':>8} {'branches/s':>11} {'ms/branch':>10}  vs like-for-like bare")
        for t in tallies:
            ratio = t.rate / fair_base.rate
            # Paired: this contender's turn against the like-for-like bare turn of the same round (robust to drift).
            paired = statistics.median(b / c for b, c in zip(fair_base.chunks, t.chunks))
            goal = ""
            if t.name == "verifier bwrap":
                goal = f"  (goal >= {GOAL:.0%}: {verdict(ratio >= GOAL and not t.error)})"
            if t is not fair_base:
                goal += f"  [median of paired rounds: {paired:.1%}]"
            hidden = " (bwrap hides its own)" if "bwrap" in t.name else ""
            cpu = (f"CPU/branch: this process {t.cpu_self_s / t.done * 1000:5.1f} ms, "
                   f"children {t.cpu_children_s / t.done * 1000:6.1f} ms{hidden}")
            print(f"    {t.name:32} {t.seconds:8.2f} {t.rate:11.2f} {t.seconds / t.done * 1000:10.1f}  {ratio:7.1%}"
                  f"{goal}{'  [VERDICTS NOT PASS]' if t.error else ''}")
            print(f"    {'':32} {cpu}")
            if t.branches:
                setup, verify, close = (statistics.mean(getattr(b, f) for b in t.branches) * 1000
                                        for f in ("setup_s", "verify_s", "close_s"))
                total = setup + verify + close
                print(f"    {'':32} per branch (mean, each branch's own wall time): sandbox start {setup:.1f} ms + "
                      f"verify {verify:.1f} ms + close {close:.1f} ms = {total:.1f} ms "
                      f"(start+close {(setup + close) / total:.1%})")
            if t.name.startswith("verifier"):
                backend = t.name.split()[-1]
                ok = (ratio >= GOAL and not t.error) if backend == "bwrap" else None
                record(f"verify {backend}", f"branches/s x{w}", f"{t.rate:.2f}", f"{fair_base.rate:.2f}",
                       f"{ratio:.1%}", f">= {GOAL:.0%} bare" if backend == "bwrap" else "", ok)
                record(f"verify {backend}", f"paired-round median x{w}", "", "", f"{paired:.1%}")
                if loose_base is not None:
                    record(f"verify {backend}", f"vs as-installed bare x{w}", f"{t.rate:.2f}",
                           f"{loose_base.rate:.2f}", f"{t.rate / loose_base.rate:.1%}")
                if t.error:
                    errors.append(t.error)
                    record(f"verify {backend}", f"verdicts x{w}", "not all pass", "", "", "all pass", False)
        if w != 1 and 1 in loops:
            print(f"    scaling x{w} / x1: " + ", ".join(
                f"{t.name} {t.rate / {u.name: u for u in loops[1]}[t.name].rate:.2f}x" for t in tallies))
    for error in errors:
        print(f"    error: {error}", file=sys.stderr)

    # ---- breakdown
    if not args.no_breakdown:
        print(f"\n[2] where one verification's time goes (median of {args.runs}, sequential, round-robin)")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NoSandboxWarning)
            parts = asyncio.run(breakdown(backends, args.runs))
        ref = parts["host   pytest -q (like-for-like)"]
        for name, ms in parts.items():
            print(f"    {name:50} {ms:8.1f} ms  ({ms / ref:5.2f}x host like-for-like pytest)")
        for backend in backends:
            tag = f"{backend:6} "
            sandbox_cost = parts[tag + "exec `python -c pass`"] - parts["host   python -c pass"]
            guard_cost = (parts[tag + "exec guarded pytest (_guarded_run)"]
                          - parts[tag + "exec plain pytest -q (like-for-like)"])
            print(f"    {backend}: sandbox cost per command (exec `python -c pass` - host) {sandbox_cost:+.1f} ms; "
                  f"guard cost (guarded - plain pytest, both in {backend}) {guard_cost:+.1f} ms")
            record(f"parts {backend}", "sandbox ms per command", f"{sandbox_cost:+.1f}")
            record(f"parts {backend}", "guard ms (vs plain pytest)", f"{guard_cost:+.1f}")
    print_table()
    if errors:
        print(f"\nerror: {len(errors)} loop(s) had verdicts other than pass:", file=sys.stderr)
        for error in errors:
            print(f"    {error}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
