"""Process isolation for the ``tests`` verifier: the solution never shares a process with its judge.

A policy under optimisation pressure that runs in the same interpreter as
pytest can reach everything pytest trusts: ``__eq__`` overrides, patched
``pytest.approx`` or ``TestCase.assert*``, the caller's frame locals, the
JUnit writer, the guard's own globals. No in-process guard closes that
(see :mod:`._pytest_guard` for what one can do). So by default verification
runs in two fresh sandboxes, after the agent's processes are gone:

- the **solution sandbox** holds the pristine task files overlaid with the
  files the agent left (:func:`solution_files`), without test files, bytecode,
  ``__pycache__``, ``.pth`` files, ``sitecustomize``/``usercustomize`` or a
  ``conftest.py``; :mod:`._solution_server` runs there (``python -I -B``, the
  standard library first on ``sys.path``) and serves the agent's modules;
- the **trusted sandbox** holds the task's tests (visible and hidden,
  read-only) and its pristine non-Python files, and not one file the agent
  wrote; :mod:`._trusted_runner` runs pytest there. Tests import the
  solution's modules through an import hook, and every call crosses the
  boundary as plain data (see :mod:`._wire`); objects of the solution stay
  there as handles, and comparing or truth-testing a handle fails the test
  with a clear reason. Monkeypatching, frame inspection, ``gc`` and
  ``sys.modules`` tricks act on the wrong process.

The two talk over a Unix socket in a directory only they share. The report
is built by pytest's hooks in the trusted process and read from that
process's stdout, which the solution's process cannot write to.

Known limits, by design: a test that passes a callable or another
non-plain object *to* the solution, relies on the solution mutating an
argument in place, runs the solution as a program (``subprocess``), or
reads a file the solution wrote, cannot work across the boundary — such a
task sets ``test_isolation: "in-process"`` and its verdicts say
``isolation: in-process``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from factory.sandbox import SandboxLimits, SandboxSpec, create_sandbox, sandbox_folder
from factory.tasks import Task

__all__ = ["IsolatedRun", "module_names", "run_isolated", "solution_files", "trusted_files"]

SOCKET_NAME = "solution.sock"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Files the interpreter or pytest would act on by their mere presence.
_HOOK_NAMES = frozenset({"sitecustomize.py", "usercustomize.py", "conftest.py"})
_HOOK_SUFFIXES = (".pyc", ".pyo", ".pth")


@functools.cache
def _script(name: str) -> str:
    """The source sent to ``python -c``: the wire helpers, then module ``name``."""
    package = resources.files("factory.verifiers")
    parts = [package.joinpath("_wire.py").read_text(), package.joinpath(f"{name}.py").read_text()]
    return "\n".join(re.sub(r"^from __future__ import annotations$", "", part, flags=re.MULTILINE)
                     for part in parts)


def _is_hook(path: str) -> bool:
    parts = path.split("/")
    return "__pycache__" in parts or parts[-1] in _HOOK_NAMES or parts[-1].endswith(_HOOK_SUFFIXES)


def solution_files(task: Task, changed: Mapping[str, str | bytes], deleted: tuple[str, ...] | list[str] = ()
                   ) -> dict[str, str | bytes]:
    """The solution sandbox's files: pristine task files overlaid with the agent's, minus tests and hooks.

    Args:
        task: The task.
        changed: Files the agent wrote or changed (relative path -> content).
        deleted: Task files the agent removed.
    """
    tests = set(task.tests) | set(task.hidden_tests)
    files: dict[str, str | bytes] = {p: t for p, t in task.files.items() if p not in set(deleted)}
    files.update(changed)
    return {p: c for p, c in sorted(files.items()) if p not in tests and not _is_hook(p)}


def trusted_files(task: Task) -> tuple[dict[str, str], dict[str, str]]:
    """The trusted sandbox's (writable data files, read-only tests): no file of the agent's."""
    data = {p: t for p, t in task.files.items() if not p.endswith(".py") and not _is_hook(p)}
    return data, {**task.tests, **task.hidden_tests}


def _top_level_names(paths: list[str]) -> set[str]:
    names = set()
    for path in paths:
        parts = path.split("/")
        if parts[0] == "src" and len(parts) > 1:  # a src layout is served from src/ too
            parts = parts[1:]
        if len(parts) == 1 and parts[0].endswith(".py"):
            names.add(parts[0][:-3])
        elif len(parts) > 1 and parts[-1].endswith(".py"):
            names.add(parts[0])
    return {n for n in names if _IDENTIFIER.match(n)}


def module_names(solution: Mapping[str, Any], trusted: Mapping[str, Any]) -> list[str]:
    """Top-level module names the trusted side imports from the solution.

    Names the trusted side has itself (test modules, test packages) are never
    proxied; names it can import from its own interpreter (the standard
    library, pytest) are not either, because the import hook runs last.
    """
    return sorted(_top_level_names(list(solution)) - _top_level_names(list(trusted))
                  - set(sys.stdlib_module_names))


@dataclass
class IsolatedRun:
    """What one isolated test run reported.

    Attributes:
        payload: The trusted runner's report (outcomes, messages, collection
            errors, exit code, solution_error), or None when it never reported.
        exit_code: The trusted process's exit status.
        timed_out: The run hit its time limit.
        output_tail: The end of the trusted process's output, when it did not report.
        modules: The solution module names served.
    """

    payload: dict[str, Any] | None
    exit_code: int
    timed_out: bool
    output_tail: str = ""
    modules: list[str] = field(default_factory=list)


async def run_isolated(task: Task, solution: Mapping[str, str | bytes], args: list[str], *, sandbox: str,
                       limits: SandboxLimits, timeout_s: float, call_timeout_s: float | None = None) -> IsolatedRun:
    """Run the task's tests in a trusted sandbox against ``solution`` served from another.

    Args:
        task: The task (its tests and hidden tests are the trusted side's).
        solution: The solution sandbox's files (see :func:`solution_files`).
        args: pytest arguments.
        sandbox: Backend name for both sandboxes.
        limits: Limits of each sandbox.
        timeout_s: Wall-clock limit of the whole run.
        call_timeout_s: Longest a single call into the solution may take
            (default: half of ``timeout_s``); past it the solution counts as hung
            and its remaining calls fail at once, so the other tests still report.

    Raises:
        SandboxError: If a sandbox cannot start (an infrastructure failure, not a verdict).
    """
    data, tests = trusted_files(task)
    modules = module_names(solution, {**data, **tests})
    shared = tempfile.mkdtemp(prefix="factory-channel-", dir=sandbox_folder())  # swept if this process dies
    os.chmod(shared, 0o1777)  # each sandbox may run as its own uid; sticky: neither removes the other's files
    nonce = secrets.token_hex(16)
    try:
        # Both sides start from the task's image: the solution runs where the agent wrote it.
        solution_spec = SandboxSpec(files=dict(solution), limits=limits, shared_dir=shared, image=task.image)
        trusted_spec = SandboxSpec(files=data, readonly_files=tests, limits=limits, shared_dir=shared,
                                   image=task.image)
        solution_box, trusted_box = create_sandbox(sandbox, solution_spec), create_sandbox(sandbox, trusted_spec)
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(trusted_box.close)  # close is safe on a sandbox that never started
            stack.push_async_callback(solution_box.close)
            # Both start at once: a container backend spends most of a verification's overhead starting them.
            started = await asyncio.gather(solution_box.start(), trusted_box.start(), return_exceptions=True)
            failed = next((outcome for outcome in started if isinstance(outcome, BaseException)), None)
            if failed is not None:
                raise failed
            # Paths relative to the workspace, where every backend starts a command.
            server_settings = {"socket": f"{solution_box.shared_path}/{SOCKET_NAME}", "accept_timeout": timeout_s,
                               "paths": ["."] + (["src"] if any(p.startswith("src/") for p in solution) else [])}
            # A hung call must leave the trusted side time to report the other tests.
            runner_settings = {"socket": f"{trusted_box.shared_path}/{SOCKET_NAME}", "modules": modules,
                               "args": args, "nonce": nonce, "call_timeout": call_timeout_s or timeout_s / 2,
                               "connect_timeout": min(30.0, timeout_s)}
            server = asyncio.ensure_future(solution_box.exec(
                ["python", "-I", "-B", "-c", _script("_solution_server")], timeout=timeout_s,
                stdin=json.dumps(server_settings)))
            try:
                result = await trusted_box.exec(["python", "-I", "-B", "-c", _script("_trusted_runner")],
                                                timeout=timeout_s, stdin=json.dumps(runner_settings))
            finally:
                # The trusted side hung up, so the server has nothing left to serve: stop it.
                if not server.done():
                    try:
                        await asyncio.wait_for(asyncio.shield(server), 2)
                    except asyncio.TimeoutError:
                        server.cancel()
                        await asyncio.gather(server, return_exceptions=True)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(nonce + " "):
            try:
                payload = json.loads(base64.b64decode(line[len(nonce) + 1:]))
            except ValueError:
                break
            return IsolatedRun(payload, result.exit_code, result.timed_out, modules=modules)
    return IsolatedRun(None, result.exit_code, result.timed_out,
                       output_tail=(result.stdout + result.stderr)[-600:], modules=modules)
