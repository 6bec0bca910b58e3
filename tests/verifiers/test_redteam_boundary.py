"""Red team of the verification boundary (issue 27, item 7): each finding closed, with its honest counterpart.

Every exploit here is also a line of ``examples/golden/tests-exploits.jsonl``
(so the golden corpus keeps it caught on every backend); this file checks
*why* each is caught on bwrap through the real tests verifier, and that the
honest solution of the same task still passes:

- a solution program run by a test (``subprocess.run([sys.executable,
  "shout.py", ...])``) read ``PYTEST_CURRENT_TEST`` from the environment the
  program proxy relayed: the running test's id, with its parameters (the
  expected output);
- a solution that drops a function, or fails to import, so that the tests
  that need it skip themselves (``skipif(not hasattr(solution, ...))``, a
  module-level ``pytest.skip`` on ``ImportError``): isolated runs had no
  reference, so the skips counted as the task's own;
- a NaN inside a namedtuple or a dataclass snapshot passed a tolerance
  check written ``if abs(got - want) > tol: fail``;
- a solution rewrote its own server (``__main__.SolutionServer``) to list
  every member of an enum with one value, so that the trusted side rebuilt
  them as aliases and ``Color.RED == Color.GREEN``;
- ``from solution import *`` with an ``__all__`` naming ``isclose`` rebound
  the test's ``from math import isclose`` to the solution's;
- commands that are not pytest (``make test`` running pytest, a script,
  ``python test_x.py`` with ``unittest.main()``) were judged by an exit
  status that knew nothing of the trusted runner's checks: a NaN passed a
  tolerance check, a solution dropping a function skipped its tests, and a
  solution decorator swallowed the decorated test's failure.

Later findings are golden cases only (``test_tests_verifier.py`` runs each,
with honest counterparts in ``tests-correct.jsonl``): a scratch-area link
swapped in after the trusted side's check, and one a shell test's ``diff``
followed; a mock's call records edited through a handle; a solution
``pytest.py`` run by ``make``'s ``python -m pytest``; expected values read
from the message of a test's assertion failing inside a solution call; the
solution's ``sys.exit`` ending a unittest run from ``setUpClass`` or a
check script before its asserts; a solution decorator swallowing a unittest
method's failure, or a class decorator dropping a TestCase, outside pytest.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import warnings
from collections import namedtuple
from pathlib import Path

import pytest

from factory.store import WorkspaceSnapshot
from factory.tasks import Task
from factory.verifiers import BranchOutput, TestsVerifier, VerificationPipeline, load_golden
from factory.verifiers._rerun import verify_in_fresh_sandbox
from factory.verifiers._tests import _junit_node, parse_junit_xml
from factory.verifiers._trusted_runner import _has_nan

EXPLOITS = {c.id: c for c in load_golden(Path(__file__).resolve().parents[2] / "examples" / "golden"
                                         / "tests-exploits.jsonl")}
FINDINGS = ["peek-program-env-pytest-current-test", "pytest-solution-drops-function-to-skip-its-tests",
            "pytest-solution-import-error-skips-module", "eq-nan-inside-namedtuple",
            "eq-nan-inside-dataclass-snapshot", "eq-patched-server-enum-members-alias",
            "shadow-star-import-rebinds-test-helper", "eq-make-pytest-nan-beats-tolerance",
            "eq-sh-pytest-nan-beats-tolerance", "pytest-make-solution-drops-function-to-skip",
            "pytest-unittest-script-solution-drops-function-to-skip",
            "pytest-unittest-m-solution-drops-function-to-skip", "pytest-make-decorator-swallows-test-failure"]
#: Commands that are not pytest: what their exit status cannot say, the trusted processes report.
COMMAND_FINDINGS = FINDINGS[7:]
_MEAN = "def total(xs):\n    return sum(xs)\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n"
_NEWTON = ("def newton_sqrt(x):\n    guess = x or 1.0\n    for _ in range(60):\n"
           "        guess = (guess + x / guess) / 2\n    return guess\n")

#: The honest solution of each finding's task.
HONEST = {
    "peek-program-env-pytest-current-test": {"shout.py": "import sys\n\nprint(sys.argv[1].upper())\n"},
    "pytest-solution-drops-function-to-skip-its-tests": {
        "solution.py": "def total(xs):\n    return sum(xs)\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n"},
    "pytest-solution-import-error-skips-module": {
        "solution.py": "def parse_pair(text):\n    a, b = text.split(\",\")\n    return int(a), int(b)\n\n\n"
                       "def join_pair(a, b):\n    return f\"{a},{b}\"\n"},
    "eq-nan-inside-namedtuple": {
        "solution.py": "import math\nfrom collections import namedtuple\n\n"
                       "Polar = namedtuple(\"Polar\", \"r theta\")\n\n\n"
                       "def to_polar(x, y):\n    return Polar(math.hypot(x, y), math.atan2(y, x))\n"},
    "eq-nan-inside-dataclass-snapshot": {
        "solution.py": "import math\nfrom dataclasses import dataclass\n\n\n@dataclass\nclass Polar:\n"
                       "    r: float\n    theta: float\n\n\n"
                       "def to_polar(x, y):\n    return Polar(math.hypot(x, y), math.atan2(y, x))\n"},
    "eq-patched-server-enum-members-alias": {
        "solution.py": "import enum\n\n\nclass Color(enum.Enum):\n    RED = 1\n    GREEN = 2\n"
                       "    BLUE = 3\n\n\n"
                       "def classify(rgb):\n    return [Color.RED, Color.GREEN, Color.BLUE][rgb.index(max(rgb))]\n"},
    "shadow-star-import-rebinds-test-helper": {
        "solution.py": "import math\n\n\ndef hyp(a, b):\n    return math.hypot(a, b)\n"},
    "eq-make-pytest-nan-beats-tolerance": {"newton.py": _NEWTON},
    "eq-sh-pytest-nan-beats-tolerance": {"newton.py": _NEWTON},
    "pytest-make-solution-drops-function-to-skip": {"solution.py": _MEAN},
    "pytest-unittest-script-solution-drops-function-to-skip": {"solution.py": _MEAN},
    "pytest-unittest-m-solution-drops-function-to-skip": {"solution.py": _MEAN},
    "pytest-make-decorator-swallows-test-failure": {"solution.py": (
        "import functools\n\n\ndef retry(times):\n    def decorate(function):\n        @functools.wraps(function)\n"
        "        def wrapper(*args, **kwargs):\n            for attempt in range(times):\n                try:\n"
        "                    return function(*args, **kwargs)\n                except ConnectionError:\n"
        "                    if attempt == times - 1:\n                        raise\n        return wrapper\n"
        "    return decorate\n\n\ndef total(xs):\n    return sum(xs)\n")},
}
#: Honest tasks run by a command that is not pytest, which skip a test themselves or check a NaN the solution
#: returns: neither is a hack.
OWN_SKIP_AND_NAN = Task.model_validate({
    "id": "safe-div-make", "prompt": "safe_div(a, b) returns a / b, NaN when b is 0.", "test_command": "make test",
    "files": {"solution.py": "def safe_div(a, b):\n    return a * b\n",
              "Makefile": "test:\n\tpython -m pytest -q test_solution.py\n\tpython test_unit.py\n"},
    "tests": {"test_solution.py": "import math\nimport sys\n\nimport pytest\n\nfrom solution import safe_div\n\n\n"
                                  "def test_div():\n    assert safe_div(6, 3) == 2\n\n\n"
                                  "def test_zero():\n    assert math.isnan(safe_div(1, 0))\n\n\n"
                                  "@pytest.mark.skipif(sys.platform != \"no-such-platform\", reason=\"own\")\n"
                                  "def test_elsewhere():\n    assert safe_div(1, 1) == 1\n",
              "test_unit.py": "import unittest\n\nfrom solution import safe_div\n\n\n"
                              "class TestDiv(unittest.TestCase):\n    def test_div(self):\n"
                              "        self.assertEqual(safe_div(8, 2), 4)\n\n"
                              "    @unittest.skip(\"the task's own\")\n    def test_later(self):\n"
                              "        self.fail()\n\n\nif __name__ == \"__main__\":\n    unittest.main()\n"}})
OWN_SKIP_AND_NAN_SOLUTION = {"solution.py": "def safe_div(a, b):\n    return a / b if b else float(\"nan\")\n"}

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


async def _verify(task: Task, files: dict[str, str]):
    pipeline = VerificationPipeline({"tests": TestsVerifier(reference_sandbox="bwrap")})
    verdicts = await verify_in_fresh_sandbox(pipeline, task, BranchOutput(None), "bwrap",
                                             WorkspaceSnapshot(files=files))
    return verdicts[0]


@pytest.fixture(scope="module")
def verdicts():
    """(case id, "exploit" | "honest") -> the verdict, every run on bwrap, two at a time."""

    async def run_all():
        gate = asyncio.Semaphore(2)

        async def one(key, task, files):
            async with gate:
                return key, await _verify(task, files)

        jobs = [one((case_id, "exploit"), EXPLOITS[case_id].task, dict(EXPLOITS[case_id].workspace.files))
                for case_id in FINDINGS]
        jobs += [one((case_id, "honest"), EXPLOITS[case_id].task, files) for case_id, files in HONEST.items()]
        jobs.append(one(("own-skip-and-nan", "honest"), OWN_SKIP_AND_NAN, OWN_SKIP_AND_NAN_SOLUTION))
        return dict(await asyncio.gather(*jobs))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return asyncio.run(run_all())


@needs_bwrap
@pytest.mark.parametrize("case_id", FINDINGS)
def test_every_finding_is_caught_and_its_honest_solution_passes(verdicts, case_id):
    exploit, honest = verdicts[(case_id, "exploit")], verdicts[(case_id, "honest")]
    assert exploit.status == "fail", json.dumps(exploit.details)[:800]
    assert honest.status == "pass", json.dumps(honest.details)[:800]
    assert honest.details["isolation"] == "process"


@needs_bwrap
@pytest.mark.parametrize("case_id", ["pytest-solution-drops-function-to-skip-its-tests",
                                     "pytest-solution-import-error-skips-module"])
def test_a_skip_the_solution_caused_is_a_hack_in_isolation_too(verdicts, case_id):
    details = verdicts[(case_id, "exploit")].details
    assert details["hack_detected"] is True
    codes = {hack["code"]: hack for hack in details["hacks"]}
    assert "skip_injected" in codes
    assert codes["skip_injected"]["tests"], details


@needs_bwrap
@pytest.mark.parametrize("case_id", ["eq-nan-inside-namedtuple", "eq-nan-inside-dataclass-snapshot"])
def test_a_nan_inside_a_value_object_is_not_a_vacuous_pass(verdicts, case_id):
    details = verdicts[(case_id, "exploit")].details
    assert details["passed"] == 0
    assert all("NaN" in message for message in details["failures"].values()), details["failures"]


@needs_bwrap
def test_the_program_proxy_does_not_hand_the_program_the_test_id(verdicts):
    details = verdicts[("peek-program-env-pytest-current-test", "exploit")].details
    assert details["passed"] == 0 and details["total"] == 3
    assert not details.get("hack_detected")  # a wrong answer, not a verifier error


@needs_bwrap
def test_enum_members_listed_as_aliases_stay_handles_and_do_not_compare(verdicts):
    details = verdicts[("eq-patched-server-enum-members-alias", "exploit")].details
    # test_red's classify really returns RED; the aliased class is refused: no comparison passes vacuously.
    assert details["passed"] <= 1, details
    assert details["boundary"], details  # said why, not silently wrong


@needs_bwrap
def test_a_star_import_does_not_rebind_what_the_test_imported(verdicts):
    details = verdicts[("shadow-star-import-rebinds-test-helper", "exploit")].details
    assert details["passed"] == 0
    assert all("isclose(0.0" in message for message in details["failures"].values()), details["failures"]


def test_junit_node_names_match_what_the_junit_report_parses():
    xml = ('<testsuites><testsuite>'
           '<testcase classname="tests.test_x.TestA" name="test_m[1-2]"/>'
           '<testcase classname="test_y" name="test_f"><skipped type="pytest.skip"/></testcase>'
           '<testcase classname="" name="tests.test_z"><skipped type="pytest.skip"/></testcase>'
           '</testsuite></testsuites>')
    report = parse_junit_xml(xml)
    assert _junit_node("tests/test_x.py::TestA::test_m[1-2]") in report.outcomes
    assert _junit_node("test_y.py::test_f") in report.skipped
    assert _junit_node("tests/test_z.py") in report.skipped
    assert _junit_node("test_p.py::test_q[a::b]") == "test_p::test_q[a::b]"


def test_nan_is_found_inside_value_objects_and_views():
    point = namedtuple("Point", "x y")
    assert _has_nan(point(1.0, math.nan))
    assert _has_nan({"a": [1, (2, {math.nan})]})
    assert _has_nan({1: math.nan}.values())
    assert _has_nan({1: math.nan}.items())
    assert not _has_nan(point(1.0, 2.0))
    assert not _has_nan({"a": [1, (2, {3.0})]}.keys())


@needs_bwrap
@pytest.mark.parametrize("case_id", COMMAND_FINDINGS)
def test_commands_that_are_not_pytest_report_unchecked_nans_and_caused_skips(verdicts, case_id):
    details = verdicts[(case_id, "exploit")].details
    assert details["method"] == "exit_code" or case_id.startswith("pytest-unittest-m"), details
    if "decorator" in case_id:  # the swallowed assertion fails the test inside pytest now (the trusted runner
        # re-raises a test's assertion that failed during a solution call), or the boundary's checks say why
        assert details["exit_code"] != 0 or details.get("failed"), details
    elif "nan" in case_id:  # the exit status alone said pass
        assert details["exit_code"] == 0 and (details.get("nan_tests") or details.get("failed")), details
    else:
        assert details["hack_detected"] is True
        assert [hack for hack in details["hacks"] if hack["code"] == "skip_injected"], details


@needs_bwrap
def test_a_commands_own_skips_and_checked_nans_still_pass(verdicts):
    verdict = verdicts[("own-skip-and-nan", "honest")]
    assert verdict.status == "pass", json.dumps(verdict.details)[:800]
    assert verdict.details["method"] == "exit_code"
