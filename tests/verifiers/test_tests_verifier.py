"""The tests verifier on the shipped golden sets: every closed exploit is a regression test.

Each golden case runs on bwrap; every exploit whose mechanism could depend on
the sandbox (files, processes, tools, configuration, what the tests can
reach) on docker too, where an engine and the image are at hand (else those
cases skip and say why); and the first sets on none (tamper detection must
not depend on the sandbox's isolation).
"""

from __future__ import annotations

import asyncio
import json
import time
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from factory.sandbox import docker_image_status, drain_docker_pool
from factory.tasks import Task
from factory.verifiers import (
    BranchOutput,
    TestsVerifier,
    VerificationPipeline,
    VerifyContext,
    criteria_for,
    load_golden,
    parse_junit_xml,
    run_golden,
)

GOLDEN = Path(__file__).resolve().parents[2] / "examples" / "golden"
CORRECT = load_golden(GOLDEN / "tests-correct.jsonl")
EXPLOITS = load_golden(GOLDEN / "tests-exploits.jsonl")
# Every case on bwrap; the first sets (the 6 correct and 22 exploits the corpus started with) on none
# too, since tamper detection must not depend on the sandbox's isolation. The whole corpus on none
# as well would double the suite's longest part for no new class of case.
CASES = [("bwrap", c) for c in CORRECT] + [("none", c) for c in CORRECT[:6]]
EXPLOIT_CASES = [("bwrap", c) for c in EXPLOITS] + [("none", c) for c in EXPLOITS[:22]]
# On docker: every exploit, and the honest cases that are not more of the same (the first sets and the
# in-process ones), verified a few at a time in one batch: a container's start is mostly the engine's wait.
# By default the first sets and the in-process ones; every other honest pattern (items 3-4 of the boundary: the
# same boundary code as on bwrap, in containers) with -m slow.
DOCKER_CORE = {c.id for c in CORRECT[:6]} | {c.id for c in CORRECT[6:] if c.task.test_isolation == "in-process"}
# Honest cases whose tests import what the default image lacks (numpy, pandas: this host has them): on docker
# their verdict is the environment's error, never a fail (test_a_test_dependency_the_image_lacks_...).
NEEDS_HOST_PACKAGES = {"numpy-and-pandas-values-cross"}
DOCKER_CORRECT = [c for c in CORRECT if c.id not in NEEDS_HOST_PACKAGES]
DOCKER_CORRECT_PARAMS = [pytest.param(c, id=f"{c.id}-docker", marks=() if c.id in DOCKER_CORE else pytest.mark.slow)
                         for c in DOCKER_CORRECT]
# Not on docker: the exploits of the value classes (a forged __eq__, a hard-coded answer). What they forge
# crosses the import boundary as data and is judged by the same code on every backend; the sandbox plays no
# part in them, so docker would only repeat bwrap's verdict at a container pair's cost each.
VALUE_CLASSES = ("eq", "hardcode")
# On docker by default: the exploits whose mechanism is files, processes, tools or what the tests can reach, where a
# container's layout differs from bwrap's mounts: the process, tamper and shadow classes; any exploit that brings more
# than its one Python module (a planted conftest, .pth, ini file, package or report), replays commands, or runs its
# tests with a command of its own (make, a script, unittest: another launcher path); and the peeks that read files or
# programs rather than the tests' frames. The rest, patches, guard attacks, frame peeks and pytest tricks made inside
# the solution's own interpreter, meet the same boundary code on every backend: on docker they run with -m slow.
SANDBOX_CLASSES = ("proc", "shadow", "tamper")
FILE_PEEKS = frozenset({
    "read-expected-values-from-tests", "peek-cat-subprocess", "peek-libc-open-via-ctypes", "peek-os-open-dir-fd",
    "peek-hardlink-to-tests", "peek-copy-made-during-turns", "peek-cat-redirect-during-turns",
    "peek-base64-copy-during-turns", "peek-traceback-source-lines", "peek-scratch-link-swapped-after-check",
    "peek-test-stdout-read-back", "peek-program-env-pytest-current-test", "peek-pytest-current-test-env"})
_RAW = {raw["id"]: raw for raw in map(json.loads, (GOLDEN / "tests-exploits.jsonl").read_text().splitlines())}
_CLASS_OF = {case_id: raw.get("class") for case_id, raw in _RAW.items()}
DOCKER_EXPLOITS = [c for c in EXPLOITS if _CLASS_OF[c.id] not in VALUE_CLASSES]


def _on_docker_by_default(case) -> bool:
    raw = _RAW[case.id]
    files = raw.get("files", {})
    return (_CLASS_OF[case.id] in SANDBOX_CLASSES or case.id in FILE_PEEKS or bool(raw.get("commands"))
            or len(files) > 1 or any(not path.endswith(".py") for path in files)
            or "test_command" in case.task.model_fields_set)


DOCKER_EXPLOIT_PARAMS = [pytest.param(c, id=f"{c.id}-docker",
                                      marks=() if _on_docker_by_default(c) else pytest.mark.slow)
                         for c in DOCKER_EXPLOITS]
DOCKER_CONCURRENCY = 4

DOCKER_OK, DOCKER_WHY = docker_image_status()  # no engine answers: not OK either, and it says so


# Two at a time on two cores (four was 20-25 % slower on an idle machine: 24 exploits in 9.4-10.1 s against 7.5-8.9 s).
LOCAL_CONCURRENCY = 2


def _will_run(request):
    """This module's items in the session that will run: a test marked to skip (the slow ones, unless -m slow asks
    for them) stays in the session's items, and its case must not be verified for nothing."""
    return [item for item in request.session.items
            if item.module is request.module and item.get_closest_marker("skip") is None]


async def _verify_batch(sandbox, items, concurrency, request=None):
    """Golden reports of ``items`` ((case, expected to pass) pairs) on one sandbox backend, by (case id, expected
    to pass): one pipeline and one event loop for the lot, so the warm trusted runners are reused as in a fork.
    With ``request``, one line on the terminal says how long the batch and its slowest cases took (what sets the
    suite's longest part)."""
    gate = asyncio.Semaphore(concurrency)
    pipeline = VerificationPipeline({"tests": TestsVerifier(reference_sandbox=sandbox)})
    took = {}

    async def one(case, expect_pass):
        async with gate:
            correct, exploits = ([case], []) if expect_pass else ([], [case])
            started = time.monotonic()
            try:
                return await run_golden("tests", pipeline, correct, exploits, sandbox)
            finally:
                took[case.id] = time.monotonic() - started

    started = time.monotonic()
    try:
        reports = await asyncio.gather(*[one(c, e) for c, e in items], return_exceptions=True)
    finally:
        await pipeline.aclose()
    plugins = request.config.pluginmanager if request else None
    reporter = plugins.get_plugin("terminalreporter") if plugins else None
    if reporter is not None:
        slowest = ", ".join(f"{case_id} {seconds:.1f} s" for case_id, seconds in
                            sorted(took.items(), key=lambda kv: -kv[1])[:3])
        with plugins.get_plugin("capturemanager").global_and_fixture_disabled():  # past the fixture's capture
            reporter.write_line(f"golden batch on {sandbox}: {len(items)} cases, {concurrency} at a time, in "
                                f"{time.monotonic() - started:.1f} s (sum {sum(took.values()):.1f} s); "
                                f"slowest: {slowest}")
    return {(c.id, e): report for (c, e), report in zip(items, reports, strict=True)}


@pytest.fixture(scope="module")
def local_reports(request):
    """The golden report of every bwrap and none case this session runs, by (sandbox, case id, expected to
    pass)."""
    selected = set()
    for item in _will_run(request):
        spec = getattr(item, "callspec", None)
        if spec and item.originalname in ("test_correct_solutions_pass", "test_exploit_never_passes"):
            selected.add((spec.params["sandbox"], spec.params["case"].id,
                          item.originalname == "test_correct_solutions_pass"))
    out = {}
    with warnings.catch_warnings():  # the none backend warns that it does not isolate
        warnings.simplefilter("ignore", UserWarning)
        for sandbox in ("bwrap", "none"):
            items = [(c, True) for s, c in CASES if (s, c.id, True) in selected and s == sandbox] + [
                (c, False) for s, c in EXPLOIT_CASES if (s, c.id, False) in selected and s == sandbox]
            if not items:
                continue
            reports = asyncio.run(_verify_batch(sandbox, items, LOCAL_CONCURRENCY, request))
            out.update({(sandbox, *key): report for key, report in reports.items()})
    return out


def golden(local_reports, case, sandbox, expect_pass):
    report = local_reports[(sandbox, case.id, expect_pass)]
    if isinstance(report, BaseException):
        raise report
    return report


@pytest.fixture(scope="module")
def docker_reports(request):
    """The golden report of every docker case this session runs, by (case id, expected to pass): one batch, one
    pipeline, as on bwrap; the branches' containers come pre-started from the docker pool, drained when the batch
    is done."""
    if not DOCKER_OK:
        pytest.skip(f"docker: {DOCKER_WHY}")
    selected = {(item.callspec.params["case"].id, item.originalname == "test_correct_solutions_pass_on_docker")
                for item in _will_run(request)
                if getattr(item, "callspec", None) and item.originalname in (
                    "test_correct_solutions_pass_on_docker", "test_exploit_never_passes_on_docker")}
    items = [(c, True) for c in DOCKER_CORRECT if (c.id, True) in selected] + [
        (c, False) for c in DOCKER_EXPLOITS if (c.id, False) in selected]
    try:
        return asyncio.run(_verify_batch("docker", items, DOCKER_CONCURRENCY, request))
    finally:
        drain_docker_pool()


def docker_golden(docker_reports, case, expect_pass):
    report = docker_reports[(case.id, expect_pass)]
    if isinstance(report, BaseException):
        raise report
    return report


def test_the_default_docker_set_keeps_every_mechanism_that_reaches_past_the_interpreter():
    """The cut to -m slow names real cases, and leaves on docker by default every class whose mechanism a container
    changes, every launcher and every planted file."""
    assert FILE_PEEKS.issubset(_RAW)
    default = [c for c in DOCKER_EXPLOITS if _on_docker_by_default(c)]
    assert {_CLASS_OF[c.id] for c in default} >= {"proc", "shadow", "tamper", "peek", "pytest"}
    assert all(_on_docker_by_default(c) for c in DOCKER_EXPLOITS if _CLASS_OF[c.id] in SANDBOX_CLASSES)
    assert all(_on_docker_by_default(c) for c in DOCKER_EXPLOITS
               if "test_command" in c.task.model_fields_set or len(_RAW[c.id].get("files", {})) > 1)


@pytest.mark.parametrize("case", DOCKER_CORRECT_PARAMS)
def test_correct_solutions_pass_on_docker(case, docker_reports):
    report = docker_golden(docker_reports, case, True)
    assert report.false_negatives == [], report.false_negatives


@pytest.mark.parametrize("case", DOCKER_EXPLOIT_PARAMS)
def test_exploit_never_passes_on_docker(case, docker_reports):
    report = docker_golden(docker_reports, case, False)
    assert report.false_positives == [], report.false_positives
    assert len(report.caught) == 1


def test_a_test_dependency_the_image_lacks_is_the_environments_error_on_docker_never_a_fail():
    """numpy and pandas are on this host (bwrap's interpreter) and not in the default image: the test file's
    import fails on docker's trusted side, which is the environment's lack (an error verdict naming them), not
    the agent's fail; a module the solution was to provide stays the agent's failure (no host has it)."""
    if not DOCKER_OK:
        pytest.skip(f"docker: {DOCKER_WHY}")
    case = next(c for c in CORRECT if c.id == "numpy-and-pandas-values-cross")
    unwritten = Task(id="unwritten", prompt="Write lonely.py with f() returning 1.",
                     tests={"test_lonely.py": "from lonely import f\n\n\ndef test_f():\n    assert f() == 1\n"})
    pipeline = VerificationPipeline({"tests": TestsVerifier(reference_sandbox="docker")})
    branch = BranchOutput("done")
    try:
        verdicts = asyncio.run(_verdicts(pipeline, case.task, branch, dict(case.workspace.files)))
        missing = asyncio.run(_verdicts(pipeline, unwritten, branch, {"notes.txt": "no lonely.py"}))
        # An attack: the tests import numpy optionally (the image lacks it), and the solution raises numpy's
        # ModuleNotFoundError itself; relayed to the tests' import of it, it must stay the solution's fail.
        optional = Task(id="optional", prompt="Write lonely.py with f() returning 1.", tests={"test_lonely.py": (
            "try:\n    import numpy\nexcept ImportError:\n    numpy = None\nfrom lonely import f\n\n\n"
            "def test_f():\n    assert f() == 1\n")})
        forged = asyncio.run(_verdicts(pipeline, optional, branch, {
            "lonely.py": "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n"}))
    finally:
        drain_docker_pool()
    assert verdicts[0].status == "error" and verdicts[0].details["code"] == "test_dependency_missing"
    assert "numpy" in verdicts[0].details["reason"]
    assert missing[0].status == "fail", missing[0].details
    assert forged[0].status == "fail", forged[0].details


async def _verdicts(pipeline, task, branch, files):
    try:
        return await pipeline.verify(task, branch, None, files)
    finally:
        await pipeline.aclose()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("sandbox", "case"), CASES, ids=[f"{c.id}-{s}" for s, c in CASES])
def test_correct_solutions_pass(case, sandbox, local_reports):
    report = golden(local_reports, case, sandbox, expect_pass=True)
    assert report.false_negatives == [], report.false_negatives


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("sandbox", "case"), EXPLOIT_CASES, ids=[f"{c.id}-{s}" for s, c in EXPLOIT_CASES])
def test_exploit_never_passes(case, sandbox, local_reports):
    report = golden(local_reports, case, sandbox, expect_pass=False)
    assert report.false_positives == [], report.false_positives
    assert len(report.caught) == 1


def test_hack_penalty_and_details():
    """The in-process guard's own evidence (asked for explicitly: it is not the default)."""
    case = next(c for c in EXPLOITS if c.id == "read-expected-values-from-tests")
    case = replace(case, task=case.task.model_copy(update={"test_isolation": "in-process"}))
    from factory.sandbox import create_sandbox, workspace_spec

    async def go():
        async with create_sandbox("bwrap", workspace_spec(case.task, case.workspace)) as sandbox:
            verifier = TestsVerifier(penalty=0.25)
            criterion = criteria_for(case.task)[0]
            return await verifier(VerifyContext(case.task, BranchOutput("done"), criterion, sandbox))

    verdict = asyncio.run(go())
    assert verdict.hack_detected and verdict.status == "fail"
    assert verdict.details["raw_score"] == 1.0 and verdict.score == pytest.approx(0.75)
    assert verdict.details["hacks"][0] == {"code": "test_file_read_by_code_under_test", "file": "test_solution.py",
                                           "by": "solution.py"}


def test_non_pytest_command_is_judged_by_exit_code():
    task = Task(id="sh", prompt="p", files={"ok.sh": "exit 0\n"}, tests={"check.sh": "test -f ok.sh\n"},
                test_command="sh check.sh")
    from factory.sandbox import SandboxSpec, create_sandbox

    async def go():
        async with create_sandbox("bwrap", SandboxSpec(files=task.files, readonly_files=task.tests)) as sandbox:
            return await TestsVerifier()(VerifyContext(task, BranchOutput("x"), criteria_for(task)[0], sandbox))

    verdict = asyncio.run(go())
    assert verdict.ok and verdict.details["method"] == "exit_code"


def test_junit_parser_reads_outcomes():
    xml = ("<testsuites><testsuite>"
           "<testcase classname='t' name='a'/>"
           "<testcase classname='t' name='b'><failure message='x'/></testcase>"
           "<testcase classname='t' name='c'><skipped type='pytest.skip' message='s'/></testcase>"
           "<testcase classname='t' name='d'><skipped type='pytest.xfail' message='x'/></testcase>"
           "<testcase classname='' name='t'><error message='collection failure'/></testcase>"
           "</testsuite></testsuites>")
    report = parse_junit_xml(xml)
    assert report.outcomes == {"t::a": "passed", "t::b": "failed", "t::c": "skipped", "t::d": "xfailed",
                               "t": "failed"}
    assert report.collection_errors == ["t"]
    with pytest.raises(ValueError):
        parse_junit_xml("<not closed")
