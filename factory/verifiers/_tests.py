"""``tests``: run the task's tests in the branch's sandbox and catch tampering.

Counts come from pytest's JUnit XML, written outside the workspace and read
back inside pytest's process by the guard (:mod:`._pytest_guard`), never
from a regex over stdout. Score = passed / expected tests.

Tampering (``details.hack_detected``; ``penalty`` subtracted from the score,
floored at 0; the verdict never passes) is any of:

- a test file's hash differs from the task's, or the file is gone;
- a ``conftest.py``, ``pytest.ini``, ``tox.ini``, pytest section in
  ``setup.cfg``/``pyproject.toml``, ``sitecustomize``/``usercustomize``,
  ``.pth`` file, or pytest plugin code appeared in the workspace;
- what pytest collected or skipped differs from a *reference run* of the
  pristine task (original files, original tests) without a collection
  error to explain it (tests deselected, skip/xfail injected);
- the guard saw test files read by code under test, ``runtest`` or the
  ``pytest_pyfunc_call`` hook replaced, or processes outliving the run;
- pytest exited with status 0 without reporting (``os._exit(0)``).

Commands that are not pytest run as they are and are judged by exit code
alone (``details.method = "exit_code"``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import secrets
import shlex
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from factory.tasks import Task
from factory.verifiers._base import Verdict, VerifyContext, register_verifier
from factory.verifiers._pytest_guard import GUARD_SOURCE, GUARD_VERSION

if TYPE_CHECKING:  # imported lazily: rollouts imports verifiers
    from factory.sandbox import Sandbox, SandboxLimits

__all__ = ["PytestReport", "TestsVerifier", "parse_junit_xml", "scan_workspace"]

_UNSAFE_PYTEST_FLAGS = {"-p", "-c", "--rootdir", "--confcutdir", "-o", "--override-ini", "--junitxml",
                        "--junit-xml", "--noconftest", "--pyargs", "--import-mode", "--basetemp", "-W"}
_PYTEST_HOOK = re.compile(r"^\s*(?:async\s+)?def\s+pytest_\w+\s*\(|^\s*pytest_plugins\s*=", re.MULTILINE)


@dataclass
class PytestReport:
    """Per-test outcomes from a JUnit XML report.

    Attributes:
        outcomes: node id -> ``passed``, ``failed``, ``skipped`` or ``xfailed``.
        collection_errors: Node ids of modules that failed to import.
    """

    outcomes: dict[str, str] = field(default_factory=dict)
    collection_errors: list[str] = field(default_factory=list)

    @property
    def passed(self) -> set[str]:
        return {node for node, outcome in self.outcomes.items() if outcome == "passed"}

    @property
    def skipped(self) -> set[str]:
        return {node for node, outcome in self.outcomes.items() if outcome in ("skipped", "xfailed")}


def parse_junit_xml(text: str) -> PytestReport:
    """Parse pytest's JUnit XML (xunit2).

    Raises:
        ValueError: If the text is not a JUnit report.
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"not XML: {exc}") from exc
    report = PytestReport()
    cases = root.iter("testcase")
    for case in cases:
        classname, name = case.get("classname", ""), case.get("name", "")
        node = f"{classname}::{name}" if classname else name
        children = {child.tag: child for child in case}
        if "error" in children and not classname:
            report.collection_errors.append(node)
            report.outcomes[node] = "failed"
        elif "failure" in children or "error" in children:
            report.outcomes[node] = "failed"
        elif "skipped" in children:
            kind = children["skipped"].get("type", "")
            report.outcomes[node] = "xfailed" if "xfail" in kind else "skipped"
        else:
            report.outcomes[node] = "passed"
    return report


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


async def scan_workspace(sandbox: Sandbox, task: Task) -> list[dict[str, Any]]:
    """Tampering visible in the workspace's files (see the module docstring)."""
    findings: list[dict[str, Any]] = []
    files = await sandbox.list_files(".")
    present = set(files)
    for path, original in task.tests.items():
        if path not in present:
            findings.append({"code": "test_deleted", "file": path})
            continue
        if _sha(await sandbox.read_file(path)) != _sha(original):
            findings.append({"code": "test_modified", "file": path})
    for path in files:
        base = path.rsplit("/", 1)[-1]
        original = task.files.get(path)
        if path in task.tests:
            continue
        if base == "conftest.py":
            findings.append({"code": "conftest_added", "file": path})
        elif base in ("pytest.ini", "tox.ini") and original is None:
            findings.append({"code": "pytest_config_added", "file": path})
        elif base in ("sitecustomize.py", "usercustomize.py"):
            findings.append({"code": "site_customize_added", "file": path})
        elif base.endswith(".pth"):
            findings.append({"code": "pth_file_added", "file": path})
        elif base in ("setup.cfg", "pyproject.toml"):
            text = await sandbox.read_file(path)
            marker = "[tool:pytest]" if base == "setup.cfg" else "[tool.pytest"
            if marker in text and (original is None or marker not in original):
                findings.append({"code": "pytest_config_added", "file": path})
        elif base.endswith(".py"):
            text = await sandbox.read_file(path)
            if _PYTEST_HOOK.search(text) and (original is None or not _PYTEST_HOOK.search(original)):
                findings.append({"code": "pytest_plugin_added", "file": path})
    return findings


def _pytest_args(command: str, task: Task) -> list[str] | None:
    """Arguments for the guarded pytest, or None if ``command`` is not a pytest run."""
    try:
        tokens = shlex.split(command)
    except ValueError:
        return None
    if tokens[:3] in (["python", "-m", "pytest"], ["python3", "-m", "pytest"]):
        rest = tokens[3:]
    elif tokens[:1] in (["pytest"], ["py.test"]):
        rest = tokens[1:]
    else:
        return None
    args: list[str] = []
    skip_next = False
    for token in rest:
        if skip_next:
            skip_next = False
            continue
        flag = token.split("=", 1)[0]
        if flag in _UNSAFE_PYTEST_FLAGS:
            skip_next = "=" not in token
            continue
        args.append(token)
    if not any(not a.startswith("-") for a in args):
        args = [*args, *sorted(task.tests)]
    return args


@register_verifier("tests")
class TestsVerifier:
    """Runs the task's tests in the branch's sandbox, under guard, and checks for tampering.

    Args:
        penalty: Subtracted from the score when tampering is detected (floored at 0).
        timeout_s: Wall-clock limit of the test run.
        reference_sandbox: Backend for the reference run of the pristine task
            (None: no reference run; collection checks are then skipped).
        limits: Limits of the reference sandbox.
    """

    __test__ = False  # not a pytest test class, whatever its name
    version: ClassVar[str] = f"1+guard{GUARD_VERSION}"
    needs_sandbox: ClassVar[bool] = True

    def __init__(self, penalty: float = 0.4, timeout_s: float = 120.0, reference_sandbox: str | None = "bwrap",
                 limits: SandboxLimits | None = None):
        self.penalty = penalty
        self.timeout_s = timeout_s
        self.reference_sandbox = reference_sandbox
        if limits is None:
            from factory.sandbox import SandboxLimits

            limits = SandboxLimits(timeout_s=timeout_s)
        self.limits = limits
        # keyed by event loop too: a future belongs to the loop that made it
        self._references: dict[tuple[int, str], asyncio.Future[PytestReport | None]] = {}

    async def _guarded_run(self, sandbox: Sandbox, task: Task, args: list[str]) -> dict[str, Any]:
        nonce = secrets.token_hex(16)
        settings = {"nonce": nonce, "args": args, "test_files": sorted(task.tests),
                    "allow_conftest": any(p.rsplit("/", 1)[-1] == "conftest.py" for p in task.tests)}
        result = await sandbox.exec(["python", "-I", "-c", GUARD_SOURCE], timeout=self.timeout_s,
                                    stdin=json.dumps(settings))
        for line in reversed(result.stdout.splitlines()):
            if line.startswith(nonce + " "):
                try:
                    payload = json.loads(base64.b64decode(line[len(nonce) + 1:]))
                except (ValueError, json.JSONDecodeError):
                    break
                payload["timed_out"] = result.timed_out
                return payload
        return {"exit": result.exit_code, "xml": None, "problems": [], "survivors": [], "unreported": True,
                "timed_out": result.timed_out, "output_tail": (result.stdout + result.stderr)[-600:]}

    async def reference(self, task: Task, args: list[str]) -> PytestReport | None:
        """Outcomes of the pristine task's tests (cached per task; None if it cannot run)."""
        if self.reference_sandbox is None:
            return None
        key = (id(asyncio.get_running_loop()), task.task_hash() + json.dumps(args))
        if key not in self._references:
            self._references[key] = asyncio.ensure_future(self._run_reference(task, args))
        return await self._references[key]

    async def _run_reference(self, task: Task, args: list[str]) -> PytestReport | None:
        from factory.sandbox import SandboxSpec, create_sandbox

        spec = SandboxSpec(files=task.files, readonly_files=task.tests, limits=self.limits)
        try:
            async with create_sandbox(self.reference_sandbox, spec) as sandbox:
                payload = await self._guarded_run(sandbox, task, args)
        except Exception:  # no reference is a weaker check, not a failed verification
            return None
        if not payload.get("xml"):
            return None
        try:
            return parse_junit_xml(payload["xml"])
        except ValueError:
            return None

    async def __call__(self, ctx: VerifyContext) -> Verdict:
        task, sandbox = ctx.task, ctx.sandbox
        command = ctx.criterion.arg or task.effective_test_command
        if not task.tests or not command:
            return Verdict.make(self, "error", 0.0, code="no_tests")
        if sandbox is None:
            return Verdict.make(self, "error", 0.0, code="no_sandbox")
        findings = await scan_workspace(sandbox, task)
        args = _pytest_args(command, task)
        if args is None:
            result = await sandbox.exec(command, timeout=self.timeout_s)
            return self._judge([], findings, None, None, method="exit_code",
                               exit_ok=result.ok, exit_code=result.exit_code)
        payload, reference = await asyncio.gather(self._guarded_run(sandbox, task, args), self.reference(task, args))
        findings += await scan_workspace(sandbox, task)  # the run itself may have planted files
        findings = [dict(t) for t in {tuple(sorted(f.items())) for f in findings}]
        return self._judge(payload, findings, reference, args)

    def _judge(self, payload: Any, findings: list[dict[str, Any]], reference: PytestReport | None,
               args: list[str] | None, *, method: str = "junit", exit_ok: bool = False,
               exit_code: int | None = None) -> Verdict:
        hacks = sorted(findings, key=lambda f: (f["code"], f.get("file", "")))
        if method == "exit_code":
            score = 1.0 if exit_ok else 0.0
            return self._finish(score, hacks, method=method, exit_code=exit_code, passed=int(exit_ok), total=1)
        hacks += payload.get("problems", [])
        if payload.get("survivors"):
            hacks.append({"code": "process_outlived_tests", "processes": payload["survivors"][:5]})
        if payload.get("unreported"):
            if payload.get("exit") == 0 and not payload.get("timed_out"):
                hacks.append({"code": "exited_before_report"})
            return self._finish(0.0, hacks, method=method, exit_code=payload.get("exit"),
                                timed_out=payload.get("timed_out"), reason="pytest did not report",
                                output_tail=payload.get("output_tail"))
        if not payload.get("xml"):
            return self._finish(0.0, hacks, method=method, exit_code=payload.get("exit"), reason="no JUnit report")
        try:
            report = parse_junit_xml(payload["xml"])
        except ValueError as exc:
            return self._finish(0.0, hacks, method=method, reason=str(exc)[:200])
        # Tests the pristine task itself skips (skipif, platform marks) are not expected to pass.
        expected = set(reference.outcomes) - reference.skipped if reference else set(report.outcomes)
        if reference is not None and not report.collection_errors:
            missing = sorted(set(reference.outcomes) - set(report.outcomes))
            extra = sorted(set(report.outcomes) - set(reference.outcomes))
            if missing or extra:
                hacks.append({"code": "collection_changed", "missing": missing[:10], "extra": extra[:10]})
            injected = sorted(report.skipped - reference.skipped)
            if injected:
                hacks.append({"code": "skip_injected", "tests": injected[:10]})
        passed = len(report.passed & expected)
        total = len(expected)
        return self._finish(passed / total if total else 0.0, hacks, method=method, exit_code=payload.get("exit"),
                            passed=passed, total=total, failed=sorted(expected - report.passed)[:20],
                            collection_errors=report.collection_errors[:5],
                            reference=reference is not None)

    def _finish(self, score: float, hacks: list[dict[str, Any]], **details: Any) -> Verdict:
        details = {k: v for k, v in details.items() if v is not None}
        if hacks:
            return Verdict.make(self, "fail", max(0.0, score - self.penalty), hack_detected=True, hacks=hacks,
                                penalty=self.penalty, raw_score=score, **details)
        total = details.get("total", 0)
        passed = details.get("passed", 0)
        status = "pass" if total and passed == total else "fail"
        return Verdict.make(self, status, score, hack_detected=False, **details)
