"""``tests`` verifier throughput: branches/s for a 10-test pytest suite, isolated and in-process, against bare pytest.

One task (a small ``solution.py`` and a ``test_solution.py`` of 10 passing
tests), N branches. Contenders, per sandbox backend (``--backends``):

- ``verifier <backend>, isolated (default)``: ``TestsVerifier`` in the
  default ``test_isolation="process"`` mode, fed the branch's final workspace
  as ``VerifyContext(..., workspace=...)`` (so no agent sandbox is started
  only to be read back). The verifier starts a fresh solution sandbox running
  ``_solution_server`` (serves the agent's modules over a Unix socket) and
  runs pytest and the tests (``_trusted_runner``) in a child forked from a
  warm trusted runner (``_warm``/``_zygote``: a trusted sandbox holding no
  task or agent file, whose process imported pytest once); the tests import
  the solution across the import boundary. Where the backend has no warm
  runner (docker) the trusted side is a fresh sandbox too. As many warm
  runners as workers are started in the untimed warm-up (a fork run keeps
  them between verifications); the breakdown shows a fresh trusted side's
  total beside the warm one. No reference run in this mode.
- ``verifier <backend>, in-process guarded``: the old mode
  (``test_isolation="in-process"``), measured as before: each branch starts
  an agent sandbox seeded with the task's files (tests read-only), the
  verifier reads the workspace back from it, runs the guarded pytest
  (pytest and the solution in one guarded process) in a fresh sandbox, and
  the agent sandbox is closed. Its one-off reference run of the pristine
  task is warmed up once and not timed.

Every verdict must be ``pass`` with all 10 tests passed (and, in-process,
checked against a reference). One verifier instance per backend is reused
and warmed up once in each mode.

Baselines, measured in the same run, sequential and with 2 workers (the
verifiers run the same way, with an ``asyncio.Semaphore``):

- ``bare pytest``: ``python -m pytest -q`` through ``subprocess.run`` in a
  temp dir holding the same two files, the venv's interpreter, plugins
  autoloaded as installed, in a session of its own as sandboxed commands
  are (Linux autogroup scheduling gives each session its own share of the
  CPUs, which would favour the sandboxes whenever anything else runs);
- ``bare pytest, like-for-like``: the same with what both verifier modes do
  to pytest anyway (``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``, ``-p
  no:cacheprovider``), so the comparison charges the verifier only for the
  sandboxes, the guard or the isolation boundary, not credits it for
  skipping installed plugins. The goal is judged against this one.

Contenders take turns in chunks of ``--chunk`` branches (round-robin), so
drifts in machine load hit all of them alike; beside each ratio of totals is
the median over rounds of the paired ratio (each turn against the bare turn
of the same round), which shrugs off bursts of other load on a shared
machine. The goal is judged on the ratio of totals. The whole machine's CPU
use during the timed loops is printed, so a run on a machine other work
loads can be told apart. Per-branch CPU is printed too (bwrap's sandboxed
processes are not reaped by this process, so their CPU is not visible here).

Other kinds of task (``--kinds``, default all), each with the same ten
tests as a ``unittest.TestCase`` and timed in the same round-robin:

- ``unittest``: test command ``python -m unittest``, which the verifier
  collects with pytest in the trusted runner (``method:
  isolated-unittest``); bare baseline ``python -m unittest -q``;
- ``make``: a ``Makefile`` whose ``test`` target runs ``python -m unittest
  -q``, test command ``make test``, run unchanged by the trusted launcher,
  every Python process it starts loading the boundary's bootstrap (``method:
  exit_code``); bare baseline ``make test``.

Each is shown against like-for-like bare pytest (the goal's baseline) and
against its own command run bare.

Goal (issue 27): the isolated verifier (bwrap, the default backend; the
first backend where bwrap is not run) >= 100% of like-for-like bare
pytest's branches/s, for the pytest task and for the unittest and make
tasks. Issue 14's goal (>= 60%, pytest task) is still shown.

A breakdown then times the parts of one isolated verification with a fresh
trusted sandbox (median of ``--runs``, sequential): each of the two sandbox
starts, the solution server's start-up until its socket is listening (it
listens before its imports), the trusted pytest run
(launch to report, the server already listening), stopping the server, the
two closes; then the whole ``run_isolated`` and the whole verifier calls of
both modes and of the other kinds, against host references (``python -c
pass``, ``import pytest``, like-for-like pytest, the other kinds' bare
commands). It replays ``run_isolated``'s steps with its own scripts and
bootstrap (the module's helpers), so the parts can be timed one by one.

Usage: python bench/bench_verify.py [--branches 40] [--concurrency 2] [--chunk 4] [--runs 10]
       [--backends bwrap,none] [--kinds pytest,unittest,make] [--no-installed] [--no-breakdown]
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

from factory.sandbox import NoSandboxWarning, Sandbox, SandboxLimits, SandboxSpec, create_sandbox
from factory.tasks import Task
from factory.verifiers import BranchOutput, TestsVerifier, Verdict, VerifyContext, criteria_for, run_verifier
from factory.verifiers._isolation import (
    RUNNER_NAME,
    SCRATCH_NAME,
    SOCKET_NAME,
    WARM_BACKENDS,
    bootstrap_files,
    module_names,
    place_server,
    run_isolated,
    server_command,
    solution_files,
    test_data_files,
    trusted_command,
    trusted_files,
)
from factory.verifiers._tests import _pytest_args
from factory.verifiers._warm import close_warm_runners

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
# The same ten tests as a unittest suite, for the `python -m unittest` and `make test` tasks.
UNITTEST_TESTS = '''\
import unittest

from solution import add, factorial, fizzbuzz, is_palindrome, word_count


class TestSolution(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_add_negative(self):
        self.assertEqual(add(-2, -3), -5)

    def test_factorial_zero(self):
        self.assertEqual(factorial(0), 1)

    def test_factorial_five(self):
        self.assertEqual(factorial(5), 120)

    def test_palindrome(self):
        self.assertTrue(is_palindrome("A man, a plan, a canal: Panama"))

    def test_not_palindrome(self):
        self.assertFalse(is_palindrome("benchmark"))

    def test_fizz(self):
        self.assertEqual(fizzbuzz(9), "Fizz")

    def test_buzz(self):
        self.assertEqual(fizzbuzz(10), "Buzz")

    def test_fizzbuzz(self):
        self.assertEqual(fizzbuzz(30), "FizzBuzz")

    def test_word_count(self):
        self.assertEqual(word_count("a b a"), {"a": 2, "b": 1})
'''
MAKEFILE = "test:\n\tpython -m unittest -q\n"
TASK = Task(id="bench-verify", prompt="Implement the functions in solution.py.",
            files={"solution.py": SOLUTION}, tests={"test_solution.py": TESTS})  # test_isolation: "process"
TASK_IN_PROCESS = TASK.model_copy(update={"test_isolation": "in-process"})
WORKSPACE: dict[str, str | bytes] = {**TASK.files, **TASK.tests}  # the final workspace: the agent changed nothing
PYTEST = [sys.executable, "-m", "pytest", "-q"]
LIKE_FOR_LIKE = ["-p", "no:cacheprovider"]  # plus PYTEST_DISABLE_PLUGIN_AUTOLOAD=1, as both verifier modes run pytest
GOAL = 1.0  # issue 27: isolated verifier >= like-for-like bare pytest's branches/s, for each kind of task
OLD_GOAL = 0.6  # issue 14's goal, pytest tasks
ISOLATED, IN_PROCESS = "isolated (default)", "in-process guarded"
MODES = (ISOLATED, IN_PROCESS)


@dataclass(frozen=True)
class Kind:
    """A kind of task the bench times: its task, the command run bare, and what a passing verdict says."""

    name: str
    task: Task
    bare: list[str]  # argv of the bare run ("python" is this interpreter)
    bare_ok: str  # what the bare run's output holds when every test passed
    method: str  # the isolated verdict's details.method
    passed: int  # the isolated verdict's details.passed (and total)

    @property
    def workspace(self) -> dict[str, str | bytes]:
        return {**self.task.files, **self.task.tests}


KINDS = {
    "pytest": Kind("pytest", TASK, PYTEST + LIKE_FOR_LIKE, f"{N_TESTS} passed", "isolated", N_TESTS),
    # Collected by pytest in the trusted runner (the command is rewritten to pytest arguments).
    "unittest": Kind("unittest", Task(id="bench-verify-unittest", prompt=TASK.prompt, files={"solution.py": SOLUTION},
                                      tests={"test_solution.py": UNITTEST_TESTS}, test_command="python -m unittest"),
                     [sys.executable, "-m", "unittest", "-q"], f"Ran {N_TESTS} tests", "isolated-unittest", N_TESTS),
    # Run unchanged by the trusted launcher: make, then python -m unittest, judged by the exit status.
    "make": Kind("make", Task(id="bench-verify-make", prompt=TASK.prompt,
                              files={"solution.py": SOLUTION, "Makefile": MAKEFILE},
                              tests={"test_solution.py": UNITTEST_TESTS}, test_command="make test"),
                 ["make", "test"], f"Ran {N_TESTS} tests", "exit_code", 1),
}


def seed_dir(path: Path, kind: Kind | None = None) -> Path:
    for rel, text in (kind.workspace if kind is not None else WORKSPACE).items():
        (path / rel).write_text(str(text))
    return path


def bare_env(like_for_like: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # as in the sandboxes: no cached rewritten tests from one run to the next
    if like_for_like:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    else:
        env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # `python` in a Makefile
    return env


def bare_command(cwd: Path, kind: Kind) -> None:
    """The kind's own command, bare (like-for-like environment), as :func:`bare_pytest`."""
    result = subprocess.run(kind.bare, cwd=cwd, env=bare_env(True), capture_output=True, text=True,
                            start_new_session=True)
    if result.returncode != 0 or kind.bare_ok not in result.stdout + result.stderr:
        raise SystemExit(f"error: bare {kind.bare} failed (rc {result.returncode}):\n{result.stdout}{result.stderr}")


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
    setup_s: float  # agent sandbox create + start (in-process mode; 0 when the workspace is handed over)
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
    mode: str | None = None  # verifier contenders: ISOLATED or IN_PROCESS
    backend: str | None = None
    kind: str = "pytest"  # which task (KINDS)
    bare: bool = False  # a bare run of the kind's own command

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds else 0.0


def contender(backend: str, mode: str, kind: str = "pytest") -> str:
    return f"verifier {backend}, {mode}" + ("" if kind == "pytest" else f", {kind} task")


def bare_name(kind: str) -> str:
    if kind == "pytest":
        return "bare pytest, like-for-like"
    return "bare " + " ".join("python" if arg == sys.executable else arg for arg in KINDS[kind].bare)


async def one_branch(backend: str, mode: str, verifier: TestsVerifier, kind: Kind = KINDS["pytest"]) -> Branch:
    criterion = next(c for c in criteria_for(kind.task) if c.id == "tests")
    if mode == ISOLATED:
        # The final workspace handed over: the verifier starts its two sandboxes, and no agent sandbox is needed.
        t0 = time.perf_counter()
        result = await run_verifier(verifier, VerifyContext(kind.task, BranchOutput("done"), criterion,
                                                            workspace=kind.workspace))
        return Branch(0.0, time.perf_counter() - t0, 0.0, result)
    t0 = time.perf_counter()
    sandbox = create_sandbox(backend, SandboxSpec(files=TASK_IN_PROCESS.files,
                                                  readonly_files=TASK_IN_PROCESS.tests))
    await sandbox.start()
    t1 = time.perf_counter()
    try:
        result = await run_verifier(verifier, VerifyContext(TASK_IN_PROCESS, BranchOutput("done"), criterion,
                                                            sandbox))
        t2 = time.perf_counter()
    finally:
        await sandbox.close()
    return Branch(t1 - t0, t2 - t1, time.perf_counter() - t2, result)


def check(branches: Sequence[Branch], label: str, mode: str, kind: Kind = KINDS["pytest"]) -> str | None:
    """None if every verdict passed all the tests in the expected mode; else what went wrong."""
    verdicts = [b.verdict for b in branches if b.verdict is not None]
    bad = [v for v in verdicts if v.status != "pass"]
    if bad:
        return (f"{label}: {len(bad)}/{len(verdicts)} verdicts not 'pass'; first: {bad[0].status} "
                f"{json.dumps(bad[0].details, default=str)[:1000]}")

    def right(d: dict) -> bool:
        if d.get("passed") != kind.passed or d.get("total") != kind.passed:
            return False
        if mode == ISOLATED:  # no reference run in isolated mode
            return d.get("method") == kind.method and d.get("isolation") == "process" and "reference" not in d
        return d.get("method") == "junit" and d.get("isolation") == "in-process" and d.get("reference") is True

    wrong = [v for v in verdicts if not right(v.details)]
    if wrong:
        expected = (f"method {kind.method}, isolation process, no reference" if mode == ISOLATED
                    else "method junit, isolation in-process, with a reference")
        return f"{label}: expected {kind.passed}/{kind.passed} passed, {expected}; got {wrong[0].details}"
    return None


async def measure(n: int, workers: int, chunk: int, backends: Sequence[str], installed: bool,
                  verifiers: dict[str, TestsVerifier], dirs: Sequence[Path], kinds: Sequence[str],
                  kind_dirs: dict[str, Sequence[Path]]) -> list[Tally]:
    """Every contender, ``n`` branches each, in round-robin chunks (machine-load drift hits all alike)."""

    async def bare(like: bool, k: int) -> list[Branch]:
        if workers == 1:
            for _ in range(k):
                bare_pytest(dirs[0], like)
        else:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(lambda i: bare_pytest(dirs[i % workers], like), range(k)))
        return []

    async def bare_kind(kind: str, k: int) -> list[Branch]:
        where = kind_dirs[kind]
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda i: bare_command(where[i % workers], KINDS[kind]), range(k)))
        return []

    async def verify(backend: str, mode: str, k: int, kind: str = "pytest") -> list[Branch]:
        gate = asyncio.Semaphore(workers)

        async def gated() -> Branch:
            async with gate:
                return await one_branch(backend, mode, verifiers[backend], KINDS[kind])

        return list(await asyncio.gather(*(gated() for _ in range(k))))

    contenders: dict[str, Callable[[int], Awaitable[list[Branch]]]] = {}
    tallies: dict[str, Tally] = {}
    if installed:
        contenders["bare pytest, as installed"] = lambda k: bare(False, k)
    contenders["bare pytest, like-for-like"] = lambda k: bare(True, k)
    for name in contenders:
        tallies[name] = Tally(name)
    for backend in backends:
        for mode in MODES:
            name = contender(backend, mode)
            contenders[name] = lambda k, backend=backend, mode=mode: verify(backend, mode, k)
            tallies[name] = Tally(name, branches=[], mode=mode, backend=backend)
    for kind in kinds:  # the other kinds: their own command bare, and the isolated verifier
        if kind == "pytest":
            continue
        contenders[bare_name(kind)] = lambda k, kind=kind: bare_kind(kind, k)
        tallies[bare_name(kind)] = Tally(bare_name(kind), kind=kind, bare=True)
        for backend in backends:
            name = contender(backend, ISOLATED, kind)
            contenders[name] = lambda k, backend=backend, kind=kind: verify(backend, ISOLATED, k, kind)
            tallies[name] = Tally(name, branches=[], mode=ISOLATED, backend=backend, kind=kind)
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
        if tally.branches is not None and tally.mode is not None:
            tally.error = check(tally.branches, f"{tally.name} x{workers}", tally.mode, KINDS[tally.kind])
    return list(tallies.values())


async def throughput(n: int, concurrency: int, chunk: int, backends: Sequence[str],
                     installed: bool, kinds: Sequence[str]) -> dict[int, list[Tally]]:
    """All timed loops in one event loop (the verifier caches its in-process reference run per loop)."""
    verifiers = {backend: TestsVerifier(reference_sandbox=backend) for backend in backends}
    for backend in backends:
        for mode in MODES:  # in-process: runs (and caches) the reference; isolated: warms caches. Not timed.
            await one_branch(backend, mode, verifiers[backend])
        # As many warm trusted runners as workers, started before the timed loops (a long fork run keeps them).
        await asyncio.gather(*(one_branch(backend, ISOLATED, verifiers[backend]) for _ in range(concurrency)))
        for kind in kinds:
            await one_branch(backend, ISOLATED, verifiers[backend], KINDS[kind])
    busy0 = machine_busy()
    start = time.perf_counter()
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        dirs = []
        for i in range(concurrency):  # one temp dir per bare worker
            (Path(tmp) / f"w{i}").mkdir()
            dirs.append(seed_dir(Path(tmp) / f"w{i}"))
        bare_pytest(dirs[0], True)  # warm-up, not timed
        kind_dirs: dict[str, list[Path]] = {}
        for kind in kinds:
            kind_dirs[kind] = []
            for i in range(concurrency):
                (Path(tmp) / f"{kind}-w{i}").mkdir()
                kind_dirs[kind].append(seed_dir(Path(tmp) / f"{kind}-w{i}", KINDS[kind]))
            bare_command(kind_dirs[kind][0], KINDS[kind])  # warm-up, not timed
        for workers in sorted({1, concurrency}):
            out[workers] = await measure(n, workers, chunk, backends, installed, verifiers, dirs, kinds, kind_dirs)
    for verifier in verifiers.values():
        await verifier.aclose()
    busy1 = machine_busy()
    own = sum(t.cpu_self_s + t.cpu_children_s for tallies in out.values() for t in tallies)
    total_jiffies = busy1[1] - busy0[1]
    busy_share = (busy1[0] - busy0[0]) / total_jiffies if total_jiffies else float("nan")
    print(f"    machine CPU busy during the timed loops: {busy_share:.0%} of {os.cpu_count()} cores over "
          f"{time.perf_counter() - start:.0f} s (this bench's own CPU, bwrap sandboxes not counted: {own:.0f} s); "
          f"load average at the end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    return out


# ------------------------------------------------------------------ breakdown


Probe = Callable[[], Awaitable["dict[str, float] | None"]]
PART_ORDER = ("solution sandbox start", "trusted sandbox start", "solution server start-up to listening",
              "trusted pytest run (launch to report)", "server stop", "sandbox close x2",
              "sum of the parts")


async def isolated_parts(backend: str, limits: SandboxLimits, timeout_s: float) -> dict[str, float]:
    """One isolated run of the pytest task, ``run_isolated``'s steps one after another, each timed.

    Unlike ``run_isolated`` (which starts the two sandboxes at once, and
    launches the server and the trusted runner together, so the server's
    start-up overlaps the runner's), each step here waits for the one before:
    the trusted runner is launched only once the server listens, so its time
    is its own (interpreter start, connect, pytest import and run, report).
    The sandboxes, scripts and settings are ``run_isolated``'s own.
    """
    solution = solution_files(TASK, WORKSPACE)
    data, tests = trusted_files(TASK)
    modules = module_names(solution, {**data, **tests})
    args = _pytest_args(TASK.effective_test_command or "", TASK)
    assert args is not None
    shared = tempfile.mkdtemp(prefix="bench-verify-channel-")
    os.chmod(shared, 0o1777)
    os.mkdir(os.path.join(shared, SCRATCH_NAME), 0o1777)
    os.chmod(os.path.join(shared, SCRATCH_NAME), 0o1777)
    socket_path = Path(shared) / SOCKET_NAME
    group = f"bench-{secrets.token_hex(6)}"
    parts: dict[str, float] = {}
    try:
        shared_path = create_sandbox(backend, SandboxSpec(shared_dir=shared)).shared_path
        scratch = f"{shared_path}/{SCRATCH_NAME}"
        boundary = {"socket": f"{shared_path}/{SOCKET_NAME}", "modules": modules,
                    "programs": sorted(p for p in solution if p not in data and p not in tests),
                    "scratch": scratch, "call_timeout": timeout_s / 2, "connect_timeout": min(30.0, timeout_s)}
        t0 = time.perf_counter()
        solution_box = create_sandbox(backend, SandboxSpec(files=solution, readonly_files=test_data_files(TASK),
                                                           limits=limits, shared_dir=shared, user_group=group))
        await solution_box.start()
        t1 = time.perf_counter()
        trusted_box = create_sandbox(backend, SandboxSpec(files=data, readonly_files={**tests,
                                                                                      **bootstrap_files(boundary)},
                                                          limits=limits, shared_dir=shared, user_group=group))
        try:
            await trusted_box.start()
            t2 = time.perf_counter()
            parts["solution sandbox start"], parts["trusted sandbox start"] = t1 - t0, t2 - t1
            server_settings = {"socket": boundary["socket"], "scratch": scratch, "paths": ["."]}
            place_server(shared)
            server = asyncio.ensure_future(solution_box.exec(
                server_command(shared_path or ""), timeout=timeout_s + 5, stdin=json.dumps(server_settings)))
            try:
                while not socket_path.exists():  # bound, chmod-ed and listening a moment later
                    if server.done():
                        raise SystemExit(f"error: {backend}: solution server exited: {server.result().describe()}")
                    await asyncio.sleep(0.0005)
                t3 = time.perf_counter()
                parts["solution server start-up to listening"] = t3 - t2
                nonce = secrets.token_hex(16)
                runner_settings = {"socket": boundary["socket"], "modules": modules,
                                   "args": [*args, f"--basetemp={scratch}/pytest"], "nonce": nonce,
                                   "call_timeout": boundary["call_timeout"],
                                   "connect_timeout": boundary["connect_timeout"]}
                result = await trusted_box.exec(trusted_command(RUNNER_NAME), timeout=timeout_s,
                                                stdin=json.dumps(runner_settings))
                t4 = time.perf_counter()
                if f"{nonce} " not in result.stdout or not result.ok:
                    raise SystemExit(f"error: {backend}: trusted runner failed: {result.describe()[-1500:]}")
                parts["trusted pytest run (launch to report)"] = t4 - t3
            finally:
                server.cancel()  # as run_isolated: the front door serves until the trusted side is done
                await asyncio.gather(server, return_exceptions=True)
            parts["server stop"] = time.perf_counter() - t4
        finally:
            t5 = time.perf_counter()
            await trusted_box.close()
            await solution_box.close()
        parts["sandbox close x2"] = time.perf_counter() - t5
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    parts["sum of the parts"] = sum(parts.values())
    return parts


async def breakdown(backends: Sequence[str], runs: int, kinds: Sequence[str] = ()) -> dict[str, float]:
    """Median ms of each part of one verification, on the host and per backend, timed round-robin.

    Diagnostic: it replays ``run_isolated`` with the isolation module's private helpers.
    """
    args = _pytest_args(TASK.effective_test_command or "", TASK)
    assert args is not None
    criterion = criteria_for(TASK)[0]
    spec = SandboxSpec(files=TASK.files, readonly_files=TASK.tests)
    probes: dict[str, Probe] = {}
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        (Path(tmp) / "ws").mkdir()
        cwd = seed_dir(Path(tmp) / "ws")
        env = bare_env(True)

        def host(argv: list[str]) -> Probe:
            async def probe() -> None:
                result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                                        start_new_session=True)
                if result.returncode != 0:
                    raise SystemExit(f"error: host {argv[:4]} failed:\n{result.stdout}{result.stderr}")
            return probe

        probes["host   python -c pass"] = host([sys.executable, "-c", "pass"])
        probes["host   python -c 'import pytest'"] = host([sys.executable, "-c", "import pytest"])
        probes["host   pytest -q (like-for-like)"] = host(PYTEST + LIKE_FOR_LIKE)
        for kind in kinds:
            (Path(tmp) / kind).mkdir()
            where = seed_dir(Path(tmp) / kind, KINDS[kind])

            async def bare_probe(kind: str = kind, where: Path = where) -> None:
                bare_command(where, KINDS[kind])

            probes[f"host   {bare_name(kind)}"] = bare_probe

        sandboxes: list[Sandbox] = []
        try:
            for backend in backends:
                verifier = TestsVerifier(reference_sandbox=backend)  # in-process reference: cached in warm-up
                sandbox = create_sandbox(backend, spec)
                await sandbox.start()
                sandboxes.append(sandbox)
                tag = f"{backend:6} "

                def run(command: list[str], sandbox: Sandbox = sandbox) -> Probe:
                    async def probe() -> None:
                        result = await sandbox.exec(command)
                        if not result.ok:
                            tail = result.describe()[-1500:]
                            raise SystemExit(f"error: {sandbox.name}: {command[:4]} failed: {tail}")
                    return probe

                async def parts(backend: str = backend, verifier: TestsVerifier = verifier) -> dict[str, float]:
                    return await isolated_parts(backend, verifier.limits, verifier.timeout_s)

                def isolated_whole(warm: bool, backend: str = backend, verifier: TestsVerifier = verifier) -> Probe:
                    async def probe() -> None:
                        run = await run_isolated(TASK, solution_files(TASK, WORKSPACE), args, sandbox=backend,
                                                 limits=verifier.limits, timeout_s=verifier.timeout_s, warm=warm)
                        if run.payload is None or run.payload.get("exit") != 0:
                            raise SystemExit(f"error: {backend}: run_isolated failed: {run}")
                    return probe

                def whole(mode: str, verifier: TestsVerifier = verifier, sandbox: Sandbox = sandbox,
                          backend: str = backend) -> Probe:
                    async def probe() -> None:
                        ctx = (VerifyContext(TASK, BranchOutput("done"), criterion, workspace=WORKSPACE)
                               if mode == ISOLATED else
                               VerifyContext(TASK_IN_PROCESS, BranchOutput("done"), criterion, sandbox))
                        result = await verifier(ctx)
                        if result.status != "pass":
                            raise SystemExit(f"error: {backend}: {mode} verifier call: {result.details}")
                    return probe

                probes[tag + "exec `python -c pass`"] = run(["python", "-c", "pass"])
                probes[tag + "exec `python -c 'import pytest'`"] = run(["python", "-c", "import pytest"])
                probes[tag + "exec plain pytest -q (like-for-like)"] = run(
                    ["env", "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", "python", "-m", "pytest", "-q", *LIKE_FOR_LIKE])
                probes[tag + "isolated, part by part"] = parts
                probes[tag + "isolated total (run_isolated)"] = isolated_whole(True)
                if backend in WARM_BACKENDS:
                    probes[tag + "isolated total, fresh trusted sandbox"] = isolated_whole(False)
                for kind in kinds:
                    async def kind_whole(backend: str = backend, verifier: TestsVerifier = verifier,
                                         kind: Kind = KINDS[kind]) -> None:
                        result = await one_branch(backend, ISOLATED, verifier, kind)
                        if check([result], kind.name, ISOLATED, kind):
                            raise SystemExit(f"error: {check([result], kind.name, ISOLATED, kind)}")

                    probes[tag + f"verifier call, isolated, {kind} task"] = kind_whole
                probes[tag + "verifier call, isolated (workspace given)"] = whole(ISOLATED)
                probes[tag + "verifier call, in-process (agent sandbox)"] = whole(IN_PROCESS)

            times: dict[str, list[float]] = {}
            for attempt in range(runs + 1):  # the first round warms up
                for name, probe in probes.items():
                    start = time.perf_counter()
                    split = await probe()
                    elapsed = time.perf_counter() - start
                    if not attempt:
                        continue
                    if split:
                        for part, seconds in split.items():
                            times.setdefault(name.split(" ", 1)[0].ljust(7) + "isolated: " + part, []).append(
                                seconds)
                    else:
                        times.setdefault(name, []).append(elapsed)
        finally:
            for sandbox in sandboxes:
                await sandbox.close()
            await close_warm_runners()
    return {name: statistics.median(values) * 1000 for name, values in times.items()}


# ------------------------------------------------------------------ main


def goal_backend(backends: Sequence[str]) -> str | None:
    """The backend the goal is judged on: bwrap, the verifier's default, else the first one run."""
    return "bwrap" if "bwrap" in backends else (backends[0] if backends else None)


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
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma list of task kinds timed against bare pytest ({', '.join(KINDS)}); "
                             "pytest is always timed")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip() and k.strip() != "pytest"]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds: {', '.join(sorted(unknown))}")
    if "make" in kinds and shutil.which("make") is None:
        print("make: not installed, the make task skipped")
        kinds.remove("make")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if "bwrap" in backends and shutil.which("bwrap") is None:
        print("bwrap: not installed, skipped")
        backends.remove("bwrap")
    judged = goal_backend(backends)
    n, conc = args.branches, args.concurrency
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, uid {os.geteuid()}; task: {N_TESTS} tests; "
          f"python = {sys.executable}; load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")

    print(f"\n[1] {n} branches per contender, sequential and x{conc}, timed in round-robin chunks of {args.chunk}:")
    print("    bare pytest: subprocess.run(python -m pytest -q) in a temp dir; verifier, isolated (default): "
          "TestsVerifier on the handed-over workspace (a fresh solution sandbox + trusted pytest forked from a warm "
          "runner where the backend has one); "
          "verifier, in-process guarded: agent sandbox start + TestsVerifier (reads it, guarded pytest in a fresh "
          "sandbox; reference warmed up, not timed) + close")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoSandboxWarning)
        loops = asyncio.run(throughput(n, conc, args.chunk, backends, not args.no_installed, kinds))
    errors: list[str] = []
    for w, tallies in loops.items():
        by_name = {t.name: t for t in tallies}
        fair_base = by_name["bare pytest, like-for-like"]
        loose_base = by_name.get("bare pytest, as installed")
        print(f"\n    x{w} {'':36} {'seconds':>8} {'branches/s':>11} {'ms/branch':>10}  vs like-for-like bare pytest")
        for t in tallies:
            ratio = t.rate / fair_base.rate
            # Paired: this contender's turn against the like-for-like bare turn of the same round (robust to drift).
            paired = statistics.median(b / c for b, c in zip(fair_base.chunks, t.chunks))
            goal = ""
            judged_here = t.mode == ISOLATED and t.backend == judged
            if judged_here:
                goal = f"  (goal >= {GOAL:.0%}: {verdict(ratio >= GOAL and not t.error)})"
            if t is not fair_base:
                goal += f"  [median of paired rounds: {paired:.1%}]"
            own = by_name.get(bare_name(t.kind)) if t.kind != "pytest" and not t.bare else None
            if own is not None:
                own_paired = statistics.median(b / c for b, c in zip(own.chunks, t.chunks))
                goal += (f"  [vs its own command bare ({own.name}): {t.rate / own.rate:.1%}, "
                         f"paired median {own_paired:.1%}]")
            hidden = " (bwrap hides its own)" if t.backend == "bwrap" else ""
            cpu = (f"CPU/branch: this process {t.cpu_self_s / t.done * 1000:5.1f} ms, "
                   f"children {t.cpu_children_s / t.done * 1000:6.1f} ms{hidden}")
            print(f"    {t.name:40} {t.seconds:8.2f} {t.rate:11.2f} {t.seconds / t.done * 1000:10.1f}  {ratio:7.1%}"
                  f"{goal}{'  [VERDICTS NOT PASS]' if t.error else ''}")
            print(f"    {'':40} {cpu}")
            if t.branches and t.mode == ISOLATED:
                verify = statistics.mean(b.verify_s for b in t.branches) * 1000
                print(f"    {'':40} per branch (mean, each branch's own wall time): verifier call {verify:.1f} ms "
                      "(its two sandboxes' start and close included)")
            elif t.branches:
                setup, verify, close = (statistics.mean(getattr(b, f) for b in t.branches) * 1000
                                        for f in ("setup_s", "verify_s", "close_s"))
                total = setup + verify + close
                print(f"    {'':40} per branch (mean, each branch's own wall time): agent sandbox start "
                      f"{setup:.1f} ms + verify {verify:.1f} ms + close {close:.1f} ms = {total:.1f} ms")
            if t.bare and t.kind != "pytest":
                record(f"bare {t.kind}", f"branches/s x{w}", f"{t.rate:.2f}", f"{fair_base.rate:.2f}", f"{ratio:.1%}",
                       "(baseline: bare pytest)")
            if t.mode is None:
                continue
            bench = f"verify {t.backend}, {'isolated' if t.mode == ISOLATED else 'in-process'}" + (
                "" if t.kind == "pytest" else f", {t.kind}")
            ok = (ratio >= GOAL and not t.error) if judged_here else None
            record(bench, f"branches/s x{w}", f"{t.rate:.2f}", f"{fair_base.rate:.2f}", f"{ratio:.1%}",
                   f">= {GOAL:.0%} bare pytest" if judged_here else "", ok)
            if judged_here and t.kind == "pytest":
                record(bench, f"issue 14 goal x{w}", f"{t.rate:.2f}", f"{fair_base.rate:.2f}", f"{ratio:.1%}",
                       f">= {OLD_GOAL:.0%} bare pytest", ratio >= OLD_GOAL and not t.error)
            record(bench, f"paired-round median x{w}", "", "", f"{paired:.1%}")
            if own is not None:
                record(bench, f"vs {own.name} x{w}", f"{t.rate:.2f}", f"{own.rate:.2f}", f"{t.rate / own.rate:.1%}")
            if loose_base is not None:
                record(bench, f"vs as-installed bare x{w}", f"{t.rate:.2f}", f"{loose_base.rate:.2f}",
                       f"{t.rate / loose_base.rate:.1%}")
            if t.mode == ISOLATED and t.kind == "pytest":
                other = by_name[contender(t.backend or "", IN_PROCESS)]
                record(bench, f"vs in-process guarded x{w}", f"{t.rate:.2f}", f"{other.rate:.2f}",
                       f"{t.rate / other.rate:.1%}")
            if t.error:
                errors.append(t.error)
                record(bench, f"verdicts x{w}", "not all pass", "", "", "all pass", False)
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
            parts = asyncio.run(breakdown(backends, args.runs, kinds))
        ref = parts["host   pytest -q (like-for-like)"]
        order = [name for name in parts if not name.split(" ", 1)[-1].lstrip().startswith("isolated: ")]
        for backend in backends:  # the isolated run's parts in their order, after the backend's exec probes
            tag = f"{backend:6} "
            at = order.index(tag + "isolated total (run_isolated)")
            order[at:at] = [tag + "isolated: " + part for part in PART_ORDER]
        for name in order:
            ms = parts[name]
            print(f"    {name:52} {ms:8.1f} ms  ({ms / ref:5.2f}x host like-for-like pytest)")
        print("    (median of each part on its own: the sum of medians need not equal the median of the sum)")
        for backend in backends:
            tag = f"{backend:6} "
            part = {p: parts[tag + "isolated: " + p] for p in PART_ORDER}
            starts = part["solution sandbox start"] + part["trusted sandbox start"]
            sandbox_cost = parts[tag + "exec `python -c pass`"] - parts["host   python -c pass"]
            trusted_vs_plain = (part["trusted pytest run (launch to report)"]
                                - parts[tag + "exec plain pytest -q (like-for-like)"])
            total = parts[tag + "isolated total (run_isolated)"]
            print(f"    {backend}: sandbox start x2 {starts:.1f} ms, server start-up to listening "
                  f"{part['solution server start-up to listening']:.1f} ms, trusted pytest run "
                  f"{part['trusted pytest run (launch to report)']:.1f} ms ({trusted_vs_plain:+.1f} ms vs plain "
                  f"pytest in {backend}), close x2 {part['sandbox close x2']:.1f} ms; run_isolated total "
                  f"{total:.1f} ms = {total / ref:.2f}x host pytest; sandbox cost per command {sandbox_cost:+.1f} ms")
            bench = f"parts {backend}"
            record(bench, "sandbox start x2 ms", f"{starts:.1f}")
            record(bench, "server start-up to listening ms", f"{part['solution server start-up to listening']:.1f}")
            record(bench, "trusted pytest run ms", f"{part['trusted pytest run (launch to report)']:.1f}",
                   f"{parts[tag + 'exec plain pytest -q (like-for-like)']:.1f}", "", "baseline: plain pytest there")
            record(bench, "sandbox close x2 ms", f"{part['sandbox close x2']:.1f}")
            record(bench, "isolated total ms (run_isolated)", f"{total:.1f}", f"{ref:.1f}", f"{total / ref:.2f}x",
                   "baseline: host pytest")
            fresh = parts.get(tag + "isolated total, fresh trusted sandbox")
            if fresh is not None:
                record(bench, "isolated total ms, fresh trusted side", f"{fresh:.1f}", f"{ref:.1f}",
                       f"{fresh / ref:.2f}x", "baseline: host pytest")
            record(bench, "verifier call ms, isolated",
                   f"{parts[tag + 'verifier call, isolated (workspace given)']:.1f}")
            record(bench, "verifier call ms, in-process",
                   f"{parts[tag + 'verifier call, in-process (agent sandbox)']:.1f}")
    print_table()
    if errors:
        print(f"\nerror: {len(errors)} loop(s) had verdicts other than pass:", file=sys.stderr)
        for error in errors:
            print(f"    {error}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
