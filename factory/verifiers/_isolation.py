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

Every test command runs this way, not only pytest: the trusted sandbox runs
the task's own command unchanged (``make test``, a shell script, ``python
test_x.py``) with a bootstrap of ours first on ``PYTHONPATH``
(:mod:`._boundary`), so that every Python process it starts imports the
solution through the boundary and runs the solution's programs (``python
cli.py``, ``python -m pkg``) in the solution sandbox through a proxy; its
exit status, reported by a launcher that ran no agent code, is the verdict.
The solution sandbox's front door (:mod:`._program_server`) serves each
trusted process from a fresh solution process of its own. One scratch area,
at the same path in both sandboxes, holds the tests' temporary files
(``TMPDIR``, pytest's ``--basetemp``); both sandboxes run as one user so
that pytest's private ``tmp_path`` folders are the solution's too. Data
files shipped with the visible tests are in the solution sandbox too,
read-only, for tests that hand their paths to the code under test. Files
made during the run in the workspace's top folder (a test's ``temp``, the
``test.ini`` the code writes) are mirrored between the two with each
message, never over a file either side started with and never under a name
an import, collection or tool would pick up (:class:`._wire.WorkspaceFiles`).

Known limits: see :mod:`._boundary`; a task whose tests cannot be split
from the solution (a compiled test binary that links it) sets
``test_isolation: "in-process"`` and its verdicts say ``isolation:
in-process``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import importlib.util
import json
import logging
import marshal
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

from factory.errors import SandboxError
from factory.sandbox import ExecResult, SandboxLimits, SandboxSpec, create_sandbox, sandbox_folder
from factory.tasks import Task
from factory.verifiers._boundary import BOUNDARY_DIR, SETTINGS_NAME
from factory.verifiers._trusted_runner import PACKAGE_MARKER

_log = logging.getLogger(__name__)

__all__ = ["IsolatedRun", "bootstrap_files", "bootstrap_source", "module_names", "package_markers", "run_isolated",
           "solution_files", "test_data_files", "trusted_command", "trusted_files"]

SOCKET_NAME = "solution.sock"
#: The scratch area's folder in the shared directory: the tests' temporary files, seen by both sides.
SCRATCH_NAME = "scratch"
#: Backends whose trusted side is forked from a warm runner by default (see :mod:`._warm`).
WARM_BACKENDS = frozenset({"bwrap", "none", "docker"})
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Files the interpreter or pytest would act on by their mere presence.
_HOOK_NAMES = frozenset({"sitecustomize.py", "usercustomize.py", "conftest.py"})
_HOOK_SUFFIXES = (".pyc", ".pyo", ".pth")


def _source(name: str, entry: bool) -> str:
    """Module ``name``'s source for a composed script; its ``__main__`` block only if it is the ``entry``."""
    text = resources.files("factory.verifiers").joinpath(f"{name}.py").read_text()
    text = re.sub(r"^from __future__ import annotations$", "", text, flags=re.MULTILINE)
    # Host-only imports never run in a sandbox: the modules before this one define those names.
    text = re.sub(r'^if __name__ != "__main__":', "if False:", text, flags=re.MULTILINE)
    if not entry:
        text = re.sub(r'^if __name__ == "__main__":', "if False:", text, flags=re.MULTILINE)
    return text


@functools.cache
def _script(*names: str, tail: str = "") -> str:
    """The source sent to ``python -c``: the wire helpers, then modules ``names`` (the last is the entry).

    ``tail`` is inserted before the entry module.
    """
    parts = [_source("_wire", False)] + [_source(n, False) for n in names[:-1]] + [tail, _source(names[-1], True)]
    return "\n".join(parts)


#: What each side runs: the solution's front door; the trusted pytest runner; the trusted launcher of any
#: other command; the bootstrap every trusted Python process loads.
def _dispatcher_script() -> str:
    return _script("_solution_server", "_program_server")


def _runner_script() -> str:
    # pytest is imported (plugins are loaded later, by pytest.main) before the runner connects to the solution's
    # front door, so that the two sides' start-ups overlap instead of the runner waiting for the socket first.
    return _script("_program_server", "_boundary", "_trusted_runner",
                   tail="prepare_runner(os.path.join(os.getcwd(), BOUNDARY_DIR))\nimport pytest\n")


def _launcher_script() -> str:
    # launch() uses nothing of the boundary's clients (the processes it starts load the whole bootstrap), and
    # _trusted_runner imports unittest.mock, hence asyncio: a large part of a short command's verification.
    return _script("_boundary")


@functools.cache
def bootstrap_source() -> str:
    """The trusted sandbox's ``sitecustomize.py`` (see :mod:`._boundary`)."""
    parts = [_source(n, False) for n in ("_wire", "_program_server", "_trusted_runner", "_boundary")]
    return "\n".join([*parts, "install(os.path.dirname(os.path.abspath(__file__)))\n"])


#: The trusted scripts' file names in the bootstrap folder: not identifiers, so no import ever finds them.
RUNNER_NAME, LAUNCHER_NAME = "factory-runner.py", "factory-launcher.py"


@functools.cache
def _pyc(source: str) -> bytes:
    """``source`` compiled by this interpreter, as a checked hash-based ``.pyc`` (PEP 552).

    An interpreter of another version ignores it (its cache tag or magic
    number differs) and compiles the source; the same one loads it after
    checking the source's hash, so a stale one is never run.
    """
    data = source.encode()
    code = compile(data, "<string>", "exec", dont_inherit=True, optimize=0)
    flags = 0b11  # hash-based, checked
    return importlib.util.MAGIC_NUMBER + flags.to_bytes(4, "little") + importlib.util.source_hash(data) + \
        marshal.dumps(code)


def _with_bytecode(name: str, source: str, folder: str = BOUNDARY_DIR) -> dict[str, str | bytes]:
    """``folder/name`` and its precompiled form where this interpreter's import looks for it."""
    cached = importlib.util.cache_from_source(name)  # __pycache__/<stem>.<tag>.pyc, relative to the folder
    return {f"{folder}/{name}": source, f"{folder}/{cached}": _pyc(source)}


def bootstrap_files(boundary: Mapping[str, Any]) -> dict[str, str | bytes]:
    """The trusted sandbox's read-only bootstrap folder: the ``sitecustomize``, the two entry scripts, each with
    its bytecode (so that no trusted process spends its start compiling ~100 KB of source), and the settings."""
    return {**_with_bytecode("sitecustomize.py", bootstrap_source()),
            **_with_bytecode(RUNNER_NAME, _runner_script()),
            **_with_bytecode(LAUNCHER_NAME, _launcher_script()),
            f"{BOUNDARY_DIR}/{SETTINGS_NAME}": json.dumps(dict(boundary))}


def _run_file(path: str, site: bool = True) -> list[str]:
    """``python -s -B`` running the script at ``path`` (workspace-relative or absolute) as ``__main__``.

    No user site, nothing written, and the working directory off
    ``sys.path`` before anything is imported (what ``-I`` adds on top, but
    ``-I`` also ignores ``PYTHONHASHSEED``: tests parametrized from a set
    would then be named in a random order, unlike under bare pytest with the
    sandbox's fixed seed; the environment is the sandbox backend's, never
    the agent's). The code comes from the script's bytecode where its
    source's hash matches, else from the source. Without ``site``, ``-S``
    too: a script that needs only the standard library skips the
    site-packages' ``.pth`` files.
    """
    loader = ("import sys\n"
              "if sys.path[:1] == ['']: del sys.path[0]\n"
              "import importlib.machinery, os\n"
              f"exec(importlib.machinery.SourceFileLoader('__main__', os.path.join(os.getcwd(), {path!r}))"
              ".get_code('__main__'))\n")
    return ["python", "-s", "-B", *([] if site else ["-S"]), "-c", loader]


#: ``sh -c`` prefix running its arguments with the address space laid out the same in every process (no ASLR:
#: ``setarch -R``) where the sandbox allows it, else plainly. Before Python 3.12, ``hash(None)`` is ``None``'s
#: address, so a suite parametrized from a set holding ``None`` (isodate's) names its tests in another order in
#: each process: the isolated run's ids would differ from the reference run's (read as a changed collection)
#: and from bare pytest's. Only for processes that run no agent code, or the pristine task's reference run.
_STABLE_LAYOUT = ("sh", "-c", 'if setarch -R true 2>/dev/null; then exec setarch -R "$@"; fi; exec "$@"', "sh")


def stable_layout(argv: list[str]) -> list[str]:
    """``argv`` run with a fixed address-space layout where the sandbox allows it (see :data:`_STABLE_LAYOUT`)."""
    return [*_STABLE_LAYOUT, *argv]


def trusted_command(name: str) -> list[str]:
    """The argv that runs the bootstrap folder's script ``name`` as ``__main__`` in the trusted sandbox.

    The launcher needs only the standard library (the command it starts is
    an ordinary process, with its own ``site``); the runner imports pytest.
    Both with a fixed address-space layout (:func:`stable_layout`).
    """
    return stable_layout(_run_file(f"{BOUNDARY_DIR}/{name}", site=name != LAUNCHER_NAME))


#: The solution side's front door, with its bytecode, in a folder of the shared directory (the solution's
#: workspace holds only the solution's files). It runs before any agent code; the trusted side never runs it.
SERVER_DIR, SERVER_NAME = ".factory-server", "factory-server.py"


def place_server(shared: str) -> None:
    """Write the front door's script and bytecode into ``shared`` (a new directory, read-only files)."""
    folder = os.path.join(shared, SERVER_DIR)
    os.mkdir(folder, 0o755)
    os.chmod(folder, 0o755)
    for rel, content in _with_bytecode(SERVER_NAME, _dispatcher_script(), SERVER_DIR).items():
        path = os.path.join(shared, rel)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(path, "xb") as handle:
            handle.write(content.encode() if isinstance(content, str) else content)
        os.chmod(path, 0o444)


#: The front door's launch: listen first (stdlib only, no ``site`` yet), then ``site`` and the server's own
#: imports, so the trusted side connects (its request waits in the backlog) and starts pytest meanwhile.
_SERVER_PRELUDE = """\
import json, os, socket, sys
settings = json.loads(sys.stdin.read())
sys.stdin.close()
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    os.unlink(settings["socket"])
except FileNotFoundError:
    pass
listener.bind(settings["socket"])
os.chmod(settings["socket"], 0o666)
listener.listen(64)
import site
site.main()
import importlib.machinery
__name__ = "factory_server"
exec(importlib.machinery.SourceFileLoader(__name__, {path!r}).get_code(__name__))
__name__ = "__main__"
serve_forever(settings, listener)
"""


def server_command(shared_path: str) -> list[str]:
    """The argv that runs the front door placed by :func:`place_server`, ``shared_path`` being the shared
    directory's path inside the solution sandbox (settings on standard input).

    ``-S``: the prelude binds the socket before ``site`` runs; it then runs
    ``site`` itself, so the server and the solution see the same
    ``sys.path`` as without the flag.
    """
    return ["python", "-I", "-B", "-S", "-c",
            _SERVER_PRELUDE.format(path=f"{shared_path}/{SERVER_DIR}/{SERVER_NAME}")]


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


def test_data_files(task: Task) -> dict[str, str]:
    """Data files shipped with the visible tests, which tests may hand to the code under test.

    They are in the solution sandbox too, read-only. Hidden tests' files are
    not: they could hold expected values the solution was never given.
    """
    return {p: t for p, t in task.tests.items() if not p.endswith(".py") and not _is_hook(p)}


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


def _package_dirs(solution: Mapping[str, Any], trusted: Mapping[str, Any]) -> list[str]:
    """Folders that are the solution's packages (an ``__init__.py`` of its own) and hold trusted files
    (``pkg/tests/test_x.py``) but no ``__init__.py`` or ``.py`` module of the trusted side's at their level."""
    folders = set()
    for path in (p for p in trusted if p.endswith(".py")):
        parts = path.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return sorted(f for f in folders if f"{f}/__init__.py" in solution and f"{f}/__init__.py" not in trusted
                  and f"{f}.py" not in trusted and _IDENTIFIER.match(f.rsplit("/", 1)[-1]))


def package_markers(solution: Mapping[str, Any], trusted: Mapping[str, Any]) -> dict[str, str]:
    """The trusted sandbox's marker ``__init__.py`` files (our text, never the agent's) for the solution's
    packages that hold tests (see :func:`_package_dirs`): with them pytest names ``pkg/tests/test_x.py``
    ``pkg.tests.test_x`` as beside the solution, and the import hook serves ``pkg`` from the solution with
    the trusted folder as its ``__path__`` (the tests import locally, ``from ..mod import x`` remotely)."""
    return {f"{folder}/__init__.py": PACKAGE_MARKER for folder in _package_dirs(solution, trusted)}


def module_names(solution: Mapping[str, Any], trusted: Mapping[str, Any]) -> list[str]:
    """Top-level module names the trusted side imports from the solution.

    Names the trusted side has itself (test modules, test packages) are never
    proxied, except a package of the solution's that only holds the tests
    (``pkg/tests/``); names it can import from its own interpreter (the
    standard library, pytest) are not either, because the import hook runs last.
    """
    mixed = {folder.split("/")[0] for folder in _package_dirs(solution, trusted) if "/" not in folder}
    return sorted(_top_level_names(list(solution)) - (_top_level_names(list(trusted)) - mixed)
                  - set(sys.stdlib_module_names))


def _without(nonce: str, output: str) -> str:
    """``output`` without the report line."""
    return "\n".join(line for line in output.splitlines() if not line.startswith(nonce + " "))


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
        output_truncated: The trusted side's output passed the output limit (its tree was killed).
        output: The trusted command's output (the end of it), for a command that is not pytest.
    """

    payload: dict[str, Any] | None
    exit_code: int
    timed_out: bool
    output_tail: str = ""
    modules: list[str] = field(default_factory=list)
    output_truncated: bool = False
    output: str = ""


def parse_report(result: ExecResult, nonce: str, modules: list[str], command: str | None) -> IsolatedRun:
    """The :class:`IsolatedRun` of a trusted run's ``result``: its last ``<nonce> <base64 JSON>`` line."""
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(nonce + " "):
            try:
                payload = json.loads(base64.b64decode(line[len(nonce) + 1:]))
            except ValueError:
                break
            return IsolatedRun(payload, result.exit_code, result.timed_out, modules=modules,
                               output_truncated=result.output_truncated,
                               output=_without(nonce, result.stdout + result.stderr)[-2000:]
                               if command is not None else "")
    return IsolatedRun(None, result.exit_code, result.timed_out, output_tail=(result.stdout + result.stderr)[-600:],
                       modules=modules, output_truncated=result.output_truncated)


async def await_trusted(trusted: asyncio.Future, server: asyncio.Future, socket_path: str) -> Any:
    """The trusted side's answer, or a :class:`SandboxError` at once if the solution's server ends unheard.

    The trusted side waits for the server's socket as long as the run may take: on a loaded machine a
    container's start and the server's interpreter can take longer than any fixed wait (a 30 s one made
    verdicts infrastructure errors under a full test suite). A server that ended before it ever listened
    had run no agent code, so its death is the infrastructure's failure, said with its output, without
    waiting for the run's time limit.

    Args:
        trusted: The trusted side's run.
        server: The solution server's ``exec``.
        socket_path: The server's socket, as this process sees it.
    """
    await asyncio.wait({trusted, server}, return_when=asyncio.FIRST_COMPLETED)
    if not trusted.done() and not os.path.exists(socket_path):
        trusted.cancel()
        await asyncio.gather(trusted, return_exceptions=True)
        failure = server.exception()
        ended = server.result() if failure is None else None
        said = (f"{type(failure).__name__}: {failure}" if ended is None
                else f"exit {ended.exit_code}: {(ended.stderr or ended.stdout)[-600:]}")
        raise SandboxError(f"the solution's server ended before it listened: {said}")
    return await trusted


def default_call_timeout(timeout_s: float, inactivity_s: float | None) -> float:
    """How long one call into the solution may wait for its next message: three quarters of the inactivity
    window (half the ceiling without one), so a hung call fails its test and the run goes on (the other tests
    report) before the window would stop the whole run."""
    return min(timeout_s / 2, 0.75 * inactivity_s) if inactivity_s else timeout_s / 2


async def run_isolated(task: Task, solution: Mapping[str, str | bytes], args: list[str] | None, *, sandbox: str,
                       limits: SandboxLimits, timeout_s: float, call_timeout_s: float | None = None,
                       command: str | None = None, warm: bool = True,
                       inactivity_s: float | None = None) -> IsolatedRun:
    """Run the task's tests in a trusted sandbox against ``solution`` served from another.

    Args:
        task: The task (its tests and hidden tests are the trusted side's).
        solution: The solution sandbox's files (see :func:`solution_files`).
        args: pytest arguments, or None to run ``command`` instead.
        command: A test command that is not pytest, run unchanged with ``sh -c``
            in the trusted sandbox (with ``args`` None); its exit status is the report.
        sandbox: Backend name for both sandboxes.
        limits: Limits of each sandbox.
        timeout_s: Wall-clock limit of the whole run (its ceiling).
        call_timeout_s: Longest a single call into the solution may wait for
            its next message (default: :func:`call_timeout`); past it the solution counts as hung
            and its remaining calls fail at once, so the other tests still report.
        inactivity_s: A pytest run (``args``) in which no test finishes for this
            long is stopped by the trusted runner itself, with a report saying so
            (``payload["stopped"]``); None: the ceiling alone.
        warm: Fork the trusted side from a warm runner that has imported pytest
            already (:mod:`._warm`), where the backend has one and one starts
            (else, as with False: a fresh trusted sandbox and interpreter).

    Raises:
        SandboxError: If a sandbox cannot start (an infrastructure failure, not a verdict).
    """
    if (args is None) == (command is None):
        raise ValueError("run_isolated takes pytest args or a command, not both")
    if warm and sandbox in WARM_BACKENDS:
        from factory.verifiers._warm import WarmUnavailable, run_warm

        try:
            return await run_warm(task, solution, args, sandbox=sandbox, limits=limits, timeout_s=timeout_s,
                                  call_timeout_s=call_timeout_s, command=command, inactivity_s=inactivity_s)
        except WarmUnavailable as exc:  # nothing ran: the fresh trusted sandbox judges it as well
            _log.warning("%s; verifying with a fresh trusted sandbox", exc)
    data, tests = trusted_files(task)
    modules = module_names(solution, {**data, **tests})
    shared = tempfile.mkdtemp(prefix="factory-channel-", dir=sandbox_folder())  # swept if this process dies
    os.chmod(shared, 0o1777)  # each sandbox may run as its own uid; sticky: neither removes the other's files
    os.mkdir(os.path.join(shared, SCRATCH_NAME), 0o1777)
    os.chmod(os.path.join(shared, SCRATCH_NAME), 0o1777)
    nonce = secrets.token_hex(16)
    group = f"verify-{nonce[:12]}"  # one user for both: pytest's 0o700 tmp_path folders are the solution's too
    try:
        place_server(shared)
        # Both sides start from the task's image: the solution runs where the agent wrote it.
        # no_symlinks: a link the solution planted in the scratch area would be followed there by the trusted
        # side's tools that are not Python (diff, cat); Python opens are guarded (see _boundary.guard_scratch).
        solution_spec = SandboxSpec(files=dict(solution), readonly_files=test_data_files(task), limits=limits,
                                    shared_dir=shared, image=task.image, user_group=group, no_symlinks=True)
        probe = create_sandbox(sandbox, SandboxSpec(shared_dir=shared, image=task.image))
        shared_path = probe.shared_path
        scratch = f"{shared_path}/{SCRATCH_NAME}"
        call_timeout = call_timeout_s or default_call_timeout(timeout_s, inactivity_s)
        programs = sorted(p for p in solution if p not in data and p not in tests)
        boundary = {"socket": f"{shared_path}/{SOCKET_NAME}", "modules": modules, "programs": programs,
                    "scratch": scratch, "call_timeout": call_timeout, "connect_timeout": timeout_s}
        bootstrap = bootstrap_files(boundary)
        markers = package_markers(solution, {**data, **tests})
        trusted_spec = SandboxSpec(files=data, readonly_files={**markers, **tests, **bootstrap}, limits=limits,
                                   shared_dir=shared, image=task.image, user_group=group)
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
            server_settings = {"socket": f"{solution_box.shared_path}/{SOCKET_NAME}", "scratch": scratch,
                               "paths": ["."] + (["src"] if any(p.startswith("src/") for p in solution) else [])}
            server = asyncio.ensure_future(solution_box.exec(
                server_command(solution_box.shared_path or shared_path), timeout=timeout_s + 5,
                stdin=json.dumps(server_settings)))
            try:
                if args is not None:
                    # A hung call must leave the trusted side time to report the other tests.
                    runner_settings = {"socket": boundary["socket"], "modules": modules,
                                       "args": [*args, f"--basetemp={scratch}/pytest"], "nonce": nonce,
                                       "call_timeout": call_timeout, "connect_timeout": boundary["connect_timeout"],
                                       "inactivity": inactivity_s}
                    trusted = trusted_box.exec(trusted_command(RUNNER_NAME), timeout=timeout_s,
                                               stdin=json.dumps(runner_settings))
                else:
                    trusted = trusted_box.exec(trusted_command(LAUNCHER_NAME), timeout=timeout_s,
                                               stdin=json.dumps({"nonce": nonce, "command": command}))
                result = await await_trusted(asyncio.ensure_future(trusted), server,
                                             os.path.join(shared, SOCKET_NAME))
            finally:
                # The trusted side is done, so the front door has nothing left to serve: stop it.
                server.cancel()
                await asyncio.gather(server, return_exceptions=True)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    return parse_report(result, nonce, modules, command)
