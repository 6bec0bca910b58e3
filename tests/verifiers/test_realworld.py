"""The real-world check: small libraries' own test suites, judged isolated exactly as bare pytest judges them.

Each vendored library (``tests/data/realworld/<name>/``: its source, its
unmodified tests and its licence, with a ``manifest.json`` saying where they
came from and how they are run) becomes a task whose files are the library's
source, whose tests are its tests, and whose solution is the library's source
itself. An honest solution, so the default isolated ``tests`` verifier must
pass it with every test bare pytest runs, and must fail a copy with one
function broken.

The baseline is bare pytest on a plain copy of the same files, with the same
interpreter, recording each test's outcome the way the trusted runner does.
``bench/bench_realworld.py`` runs the same tasks and writes the per-library
report (counts and the causes of every isolated failure).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from factory.tasks import Task
from factory.verifiers import BranchOutput, Criterion, TestsVerifier, Verdict, VerifyContext, run_verifier
from tests import _verify_loop

A = TypeVar("A")
B = TypeVar("B")
REALWORLD = Path(__file__).resolve().parents[1] / "data" / "realworld"
#: Outcomes that count for or against a solution; skips and xfails are the suite's own.
JUDGED = ("passed", "failed")

# What the trusted runner records per test (``_trusted_runner._Outcomes``), as a plugin for a bare run.
OUTCOME_PLUGIN = textwrap.dedent('''
    import json
    import os

    OUTCOMES = {}


    def pytest_collectreport(report):
        if report.failed:
            OUTCOMES[report.nodeid or "<collection>"] = "failed"


    def pytest_runtest_logreport(report):
        node = report.nodeid
        if report.failed:
            OUTCOMES[node] = "failed"
        elif OUTCOMES.get(node) == "failed":
            return
        elif report.skipped:
            OUTCOMES[node] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        elif report.when == "call":
            OUTCOMES[node] = "xpassed" if hasattr(report, "wasxfail") else "passed"


    def pytest_sessionfinish(session, exitstatus):
        with open(os.environ["REALWORLD_OUTCOMES"], "w") as out:
            json.dump({"exit": int(exitstatus), "outcomes": OUTCOMES}, out)
''')


@dataclass(frozen=True)
class Library:
    """One vendored library and its own test suite.

    Attributes:
        name: The distribution's name.
        version: The vendored version.
        licence: SPDX identifier of its licence.
        source: The library's files (relative path -> text): the task's files and its honest solution.
        tests: The library's test files and test data (relative path -> text).
        test_command: How the suite is run, from the library's folder.
        patterns: What its tests do that a boundary has to carry.
    """

    name: str
    version: str
    licence: str
    source: dict[str, str]
    tests: dict[str, str]
    test_command: str
    patterns: str = ""

    def task(self, test_command: str | None = None) -> Task:
        """The library as a task: its source to write, its own tests to pass."""
        return Task(id=f"realworld-{self.name}", prompt=f"Implement {self.name} {self.version} so its tests pass.",
                    files=self.source, tests=self.tests, test_command=test_command or self.test_command,
                    metadata={"realworld": self.name, "version": self.version, "licence": self.licence})

    def broken(self, path: str, find: str, replace: str) -> dict[str, str]:
        """The library's source with ``find`` replaced by ``replace`` in ``path`` (``find`` must occur once)."""
        text = self.source[path]
        if text.count(find) != 1:
            raise AssertionError(f"{self.name}: {find!r} occurs {text.count(find)} times in {path}, not once")
        return {**self.source, path: text.replace(find, replace)}


def _read_tree(folder: Path, roots: list[str]) -> dict[str, str]:
    files = {}
    for root in roots:
        top = folder / root
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in paths:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            files[path.relative_to(folder).as_posix()] = path.read_text(encoding="utf-8")
    return files


def library_names() -> list[str]:
    """Names of the vendored libraries, sorted."""
    return sorted(p.parent.name for p in REALWORLD.glob("*/manifest.json"))


def load_library(name: str) -> Library:
    """Read a vendored library: its manifest, source and tests (tests win where a test folder is inside the source)."""
    folder = REALWORLD / name
    manifest = json.loads((folder / "manifest.json").read_text())
    tests = _read_tree(folder, manifest["tests"])
    source = {p: t for p, t in _read_tree(folder, manifest["source"]).items() if p not in tests}
    return Library(name=manifest["name"], version=manifest["version"], licence=manifest["licence"],
                   source=source, tests=tests, test_command=manifest["test_command"],
                   patterns=manifest.get("patterns", ""))


@dataclass(frozen=True)
class BareRun:
    """Bare pytest on a plain copy.

    Attributes:
        exit_code: pytest's exit status.
        outcomes: Node id -> ``passed``, ``failed``, ``skipped``, ``xfailed`` or ``xpassed``.
        seconds: Wall-clock time of the run.
        output_tail: The end of what pytest printed.
    """

    exit_code: int
    outcomes: dict[str, str]
    seconds: float
    output_tail: str

    @property
    def judged(self) -> set[str]:
        """Node ids that pass or fail (what a verdict counts)."""
        return {node for node, outcome in self.outcomes.items() if outcome in JUDGED}

    @property
    def passed(self) -> set[str]:
        """Node ids that passed."""
        return {node for node, outcome in self.outcomes.items() if outcome == "passed"}


def bare_pytest(files: Mapping[str, str], test_command: str, folder: Path, timeout_s: float = 300.0) -> BareRun:
    """Run ``test_command`` with bare pytest on a plain copy of ``files`` in ``folder`` (this interpreter).

    Like the trusted runner, plugins are not autoloaded, the cache is off and
    the hash seed is fixed; nothing else stands between the tests and the library.
    """
    tokens = shlex.split(test_command)
    if tokens[:3] != ["python", "-m", "pytest"]:
        raise ValueError(f"not a pytest command: {test_command!r}")
    copy = folder / "copy"
    for path, text in files.items():
        target = copy / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    plugin_dir = folder / "plugin"
    plugin_dir.mkdir(parents=True, exist_ok=True)
    (plugin_dir / "realworld_outcomes.py").write_text(OUTCOME_PLUGIN)
    report = folder / "outcomes.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON", "COV_", "COVERAGE"))}
    # The sandboxes fix the hash seed; so does this run, or a suite parametrized from a set (isodate's)
    # names its tests differently in each process.
    env.update(PYTHONPATH=str(plugin_dir), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONDONTWRITEBYTECODE="1",
               PYTHONHASHSEED="0", REALWORLD_OUTCOMES=str(report))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "realworld_outcomes", *tokens[3:]]
    # As the trusted side runs: a fixed address-space layout, or hash(None) (its address, before Python 3.12)
    # orders a set holding None differently in each process (isodate's parametrized ids).
    if shutil.which("setarch") and subprocess.run(["setarch", "-R", "true"], capture_output=True).returncode == 0:
        command = ["setarch", "-R", *command]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout_s,
                            stdin=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    tail = (result.stdout + result.stderr)[-2000:]
    if not report.exists():
        raise AssertionError(f"bare pytest did not report (exit {result.returncode}):\n{tail}")
    payload = json.loads(report.read_text())
    return BareRun(result.returncode, payload["outcomes"], seconds, tail)


def run_tests_verifier(task: Task, solution: Mapping[str, str]) -> Verdict:
    """The ``tests`` verifier with its defaults (bwrap, default limits; isolated unless the task says
    ``in-process``) on ``solution`` as the branch's final workspace."""
    verifier = TestsVerifier(reference_sandbox="bwrap")
    criterion = Criterion("tests", "tests pass", "tests", task.effective_test_command)
    ctx = VerifyContext(task, BranchOutput("done"), criterion, None, workspace={**task.tests, **solution})
    return _verify_loop.run(run_verifier(verifier, ctx))


def alongside(first: Callable[[], A], second: Callable[[], B]) -> tuple[A, B]:
    """Run two blocking calls at once (a bare run beside a verification: the latter mostly waits on sandboxes)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(first)
        other = second()
        return pending.result(), other


def describe(verdict: Verdict) -> str:
    """The verdict's gist for an assertion message."""
    keep = ("status", "isolation", "passed", "total", "exit_code", "timed_out", "limit", "quiet_s", "reason", "hacks",
            "boundary", "solution_error", "collection_errors", "failures", "output_tail")
    return json.dumps({k: verdict.details.get(k, verdict.status if k == "status" else None) for k in keep
                       if k == "status" or k in verdict.details}, indent=1, default=str)[:4000]


# Libraries whose isolated verdict does not yet equal bare pytest's, each with the cause quoted
# from its isolated failures (bench/bench_realworld.py prints them); strict, so a fix shows up.
KNOWN_FAILING: dict[str, str] = {
    "more-itertools": (
        "isolated 654/663 pass, bare 663/663: no longer cut off. Under the default limits (120 s inactivity "
        "window, 600 s ceiling) the isolated run took 287.5 s, its longest stretch without a test finishing 84.9 s "
        "(quiet_s), beside bare pytest's 18.8 s, at load 15.8-18.2, bwrap; the 180 s flat limit before stopped it "
        "(341 s with a 1200 s limit at load 16-20). Only 9 tests differ, none by a limit. "
        "The 9: the solution's objects compared or hashed (numeric_range == and hash, 2: refused, the "
        "solution's comparison would decide), the class of what always_reversible returns (a handle's class), "
        "isinstance(numeric_range, Iterator) (a handle has __next__), random seeding (SampleTests, 3: the test's "
        "random state never crosses), powerset_of_sets' hash count (the test's Str hashed across the boundary), "
        "and CallbackIterTests::test_abort (the test's callback, called from the solution's thread, runs to its "
        "end within one crossing, before the abort). Reviewed again: test_eq compares two objects the test got "
        "from numeric_range (a solution name, not a CapWords class the test names) and one with the test's own "
        "int, test_hash asks the solution's __hash__; letting the solution's own methods decide there would let "
        "an expected value made through a solution function be forged (the golden eq exploits), so they stay "
        "refused. "
        "The time is round trips, each a wake-up of the other end "
        "(ms at this load; ~190 us of CPU, both ends; per test as measured before, at load 16-20): the test's "
        "callbacks and held iterators "
        "(test_nested_remainder 106 s, ~72k round trips), generators consumed item by item "
        "(FactorTests::test_cross_check 59 s, DiscreteFourierTransformTests::test_roundtrip 51 s) and a test's "
        "iterator skipped 1M items (NthPermutationTests::test_long 27 s)"
    ),
}

# One function broken per library, and the part of its suite (pytest arguments) that must catch it.
BREAKS: dict[str, tuple[str, str, str, str]] = {
    "cachetools": ("cachetools/keys.py", "return _HashedTuple(args + sum(sorted(kwargs.items()), _kwmark))",
                   "return _HashedTuple(args)", "tests/test_keys.py"),
    "colorama": ("colorama/ansi.py", "return CSI + str(code) + 'm'", "return CSI + str(code) + 'n'",
                 "colorama/tests/ansi_test.py"),
    "configobj": ("configobj/__init__.py", "self.indent_type = options['indent_type']",
                  "self.indent_type = '  '", "tests/test_configobj.py -k 'Indentation or Writing'"),
    "decorator": ("decorator.py", "    ba.apply_defaults()  # needed for test_dan_schult", "    pass",
                  "tests/test.py -k 'not DocumentationTestCase'"),
    "inflection": ("inflection/__init__.py", "    for rule, replacement in PLURALS:\n"
                   "            if re.search(rule, word):\n                return re.sub(rule, replacement, word)",
                   "    for rule, replacement in PLURALS:\n            if re.search(rule, word):\n"
                   "                return word + 's'", "test_inflection.py -k pluralize"),
    "isodate": ("isodate/duration.py", "negduration = Duration(years=-self.years, months=-self.months)",
                "negduration = Duration(years=self.years, months=-self.months)",
                "tests/test_duration.py -k 'neg or format'"),
    "more-itertools": ("more_itertools/recipes.py", "return list(islice(iterable, n))",
                       "return list(islice(iterable, n + 1))", "tests/test_recipes.py -k TakeTests"),
    "parse": ("parse.py", "base = 16", "base = 15", "tests/test_parse.py"),
    "semver": ("semver/version.py", "return cls(self._major, self._minor, self._patch + 1)",
               "return cls(self._major, self._minor, self._patch + 2)", "tests/test_bump.py"),
    "tabulate": ("tabulate/__init__.py", 'fmt = "{0:>%ds}" % width', 'fmt = "{0:<%ds}" % width',
                 "test/test_output.py -k test_plain"),
    "termcolor": ("termcolor/termcolor.py", 'fmt_str = "\\033[%dm%s"', 'fmt_str = "\\033[%dm %s"',
                  "tests/test_termcolor.py"),
    "toolz": ("toolz/itertoolz.py", "d[item] += 1", "d[item] += 2", "toolz/tests/test_itertoolz.py -k frequencies"),
}

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


# Suites whose isolated run takes minutes (bare: seconds): opt in with -m slow.
HEAVY_ISOLATED = {"more-itertools"}


def _library_params(names: list[str]) -> list:
    params = []
    for name in names:
        marks = [pytest.mark.xfail(reason=KNOWN_FAILING[name], strict=True)] if name in KNOWN_FAILING else []
        if name in HEAVY_ISOLATED:
            marks.append(pytest.mark.slow)
        params.append(pytest.param(name, id=name, marks=marks))
    return params


def test_the_check_has_ten_libraries_vendored_with_licences_and_a_break_each():
    names = library_names()
    assert len(names) >= 10, names
    assert set(BREAKS) == set(names)
    for name in names:
        folder = REALWORLD / name
        manifest = json.loads((folder / "manifest.json").read_text())
        assert (folder / manifest["licence_file"]).read_text().strip(), name
        assert manifest["licence"].split("-")[0] in ("MIT", "BSD", "Apache", "PSF"), manifest["licence"]
        library = load_library(name)
        assert library.source and library.tests and not set(library.source) & set(library.tests), name


def test_the_vendored_libraries_are_not_installed_in_this_interpreter():
    """An installed copy would shadow the solution on the trusted side and the check would prove nothing."""
    modules = sorted({path.split("/")[0].removesuffix(".py") for name in library_names()
                      for path in load_library(name).source})
    probe = ("import importlib.util, json, sys\n"
             "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None]))")
    result = subprocess.run([sys.executable, "-I", "-c", probe, *modules], capture_output=True, text=True,
                            cwd=REALWORLD.parent, check=True)
    assert json.loads(result.stdout) == [], f"installed in {sys.executable}: {result.stdout}"


@needs_bwrap
@pytest.mark.parametrize("name", _library_params(library_names()))
def test_isolated_verdict_equals_bare_pytest_on_every_test(name, tmp_path):
    library = load_library(name)
    bare, verdict = alongside(lambda: bare_pytest({**library.source, **library.tests}, library.test_command, tmp_path),
                              lambda: run_tests_verifier(library.task(), library.source))
    failing = sorted(bare.judged - bare.passed)
    assert bare.judged and not failing, f"{name} does not pass under bare pytest here: {failing[:5]}\n" \
                                        f"{bare.output_tail}"
    assert verdict.details.get("isolation") == "process", describe(verdict)
    assert verdict.status == "pass", f"{name}: bare pytest passes {len(bare.passed)} tests\n{describe(verdict)}"
    assert verdict.details["passed"] == verdict.details["total"] == len(bare.judged), describe(verdict)


@needs_bwrap
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_a_copy_with_one_function_broken_fails(name, tmp_path):
    library = load_library(name)
    path, find, replace, selection = BREAKS[name]
    broken = library.broken(path, find, replace)
    command = f"python -m pytest -q {selection}"
    bare, verdict = alongside(lambda: bare_pytest({**broken, **library.tests}, command, tmp_path),
                              lambda: run_tests_verifier(library.task(command), broken))
    assert bare.judged - bare.passed, f"{name}: the break in {path} is not caught by {selection} under bare pytest"
    assert verdict.status == "fail", describe(verdict)
    assert not verdict.details.get("hack_detected"), describe(verdict)
