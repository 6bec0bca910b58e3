"""The trusted sandbox's bootstrap: the import boundary and program proxies in every Python process.

The trusted sandbox holds the task's own files and tests and not one file
the agent wrote, plus, read-only, a folder of ours (:data:`BOUNDARY_DIR`)
with this bootstrap as ``sitecustomize.py`` and its settings. Every command
there runs with that folder first on ``PYTHONPATH``, so every Python process
the task's test command starts (pytest, ``python -m unittest`` under
``make``, a script's ``python test_x.py``) runs :func:`install` before any
test code:

- an import hook, last on ``sys.meta_path``, for the solution's top-level
  module names: the first import of one connects to the solution sandbox's
  front door (:mod:`._program_server`), which serves this process's imports
  from a fresh solution process of its own (:mod:`._trusted_runner`'s
  proxies, :mod:`._solution_server`);
- a program proxy: a process started as one of the solution's programs
  (``python cli.py``, ``python -m pkg``, found in ``sys.orig_argv``) runs it
  in the solution sandbox instead, relaying argv, standard input, output,
  error, exit status (a signal as the same signal), environment and working
  directory, and exits as it did;
- a guard on the scratch area (the one folder both sandboxes write, at the
  same path in both; ``TMPDIR`` and pytest's ``--basetemp`` point there):
  ``open`` and ``os.open`` of a path inside it walk it one component at a
  time and never follow a link out of it, so a link there (``out.json ->
  tests/expected.json``), swapped in even after a check, cannot hand a test
  its own expected values. The solution sandbox cannot create links at all
  (``SandboxSpec.no_symlinks``), which covers the tools that are not Python.

A command that is not pytest runs under :func:`launch`, which gives it that
environment, runs it with ``sh -c`` unchanged, and reports its exit status
as one ``<nonce> <base64 JSON>`` line: the status of a process tree that
ran no agent code, whatever the agent's programs printed or returned.
pytest commands run under :mod:`._trusted_runner` with the same environment
for the processes their tests start.

Known limits: a process started with ``python -I``, ``-E`` or ``-S`` loads
no bootstrap, so it can neither import the solution nor run its programs
(the test fails; nothing is forged); a link the trusted side itself made in
the scratch area is followed by tools that are not Python (``diff``, ``cat``),
even where the solution renamed it there.
"""

from __future__ import annotations

import base64
import builtins
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import types

if __name__ != "__main__":  # imported on the host (tests); in the sandbox the sources precede this
    from factory.verifiers._program_server import read_stream_frame, write_stream_frame
    from factory.verifiers._trusted_runner import (
        _NAN,
        _RUN,
        SolutionClient,
        SolutionFinder,
        _is_package_marker,
        _Outcomes,
    )
    from factory.verifiers._wire import Channel, cwd_to_wire

__all__ = ["BOUNDARY_DIR", "FINDINGS_ENV", "SETTINGS_NAME", "guard_scratch", "install", "launch", "program_argv"]

#: The bootstrap's folder, relative to the trusted workspace.
BOUNDARY_DIR = ".factory-boundary"
SETTINGS_NAME = "settings.json"
#: Interpreter options that take a value (``-W error``, ``-X dev``).
_OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "--check-hash-based-pycs"})
#: Environment variables of pytest's own, never relayed to a solution program.
_PYTEST_ENV = ("PYTEST_", "_PYTEST")
#: Names the file (private to the trusted sandbox) where each trusted Python process of a command that is not
#: pytest records what its exit status cannot say: a NaN from the solution it never checked, the tests it
#: skipped. The launcher reports them with the exit status.
FINDINGS_ENV = "FACTORY_BOUNDARY_FINDINGS"
_FINDINGS = {"path": None}
_PLUGIN_NAME = "_factory_boundary_checks"


def _connect(path, deadline):
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _own_module(name):
    """Whether this interpreter finds top-level module ``name`` itself (an installed ``pytest``, ``coverage``).

    What the trusted side can import wins over the solution's module of the
    same name, for ``python -m`` as for ``import`` (the import hook is last):
    a solution that ships ``pytest.py`` must not be the ``python -m pytest``
    that a ``make`` target runs. A package marker of ours is the solution's.
    """
    import importlib.machinery

    try:
        spec = importlib.machinery.PathFinder.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None and not _is_package_marker(spec.origin)


def program_argv(orig_argv, cwd, workspace, programs, modules):
    """The interpreter arguments to relay when this process was started as a solution program, else None.

    Args:
        orig_argv: ``sys.orig_argv``.
        cwd: The working directory.
        workspace: The trusted workspace's absolute path.
        programs: The solution's files (workspace-relative) that the trusted workspace lacks.
        modules: The solution's top-level module names.
    """
    args = list(orig_argv[1:])
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")):
            name = args[index + 1] if arg == "-m" and index + 1 < len(args) else arg[2:]
            if name.split(".")[0] in modules and not _own_module(name.split(".")[0]):
                return args
            return None
        if arg == "-c" or arg.startswith("-c") and not arg.startswith("--") or arg == "-":
            return None
        if arg in _OPTIONS_WITH_VALUE:
            index += 2
            continue
        if arg.startswith("-"):
            index += 1
            continue
        path = os.path.normpath(os.path.join(cwd, arg))
        rel = os.path.relpath(path, workspace)
        if rel.startswith("..") or os.path.exists(path):
            return None
        if rel in programs:
            return args
        return None
    return None


def _relay(settings, argv, bootstrap):
    """Run ``argv`` with the solution's interpreter, in the solution sandbox; exit as the program did."""
    sock = _connect(settings["socket"], time.monotonic() + settings.get("connect_timeout", 30))
    # Never pytest's own variables: PYTEST_CURRENT_TEST names the running test and its parameters (an answer
    # key), as the import boundary's environment relay never carries them either.
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(_PYTEST_ENV)}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != bootstrap]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    cwd = cwd_to_wire(os.getcwd(), os.path.dirname(bootstrap))  # the workspace part crosses relative to it
    Channel(sock).send({"op": "program", "argv": argv, "cwd": cwd, "env": env})
    lock = threading.Lock()

    def feed():
        try:
            while True:
                data = os.read(0, 65536)
                if not data:
                    break
                with lock:
                    write_stream_frame(sock, b"i", data)
        except OSError:
            pass
        try:
            with lock:
                write_stream_frame(sock, b"I")
        except OSError:
            pass

    threading.Thread(target=feed, daemon=True).start()
    while True:
        try:
            tag, data = read_stream_frame(sock)
        except (EOFError, OSError, ValueError):
            os.write(2, b"factory: the solution's program ended without an exit status\n")
            os._exit(1)
        if tag in (b"o", b"e"):
            fd = 1 if tag == b"o" else 2
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        elif tag == b"E":
            os.write(2, data[:2000] + b"\n")
            os._exit(127)
        elif tag == b"x" and len(data) == 4:
            (code,) = struct.unpack(">i", data)
            if code < 0:
                import signal

                try:
                    signal.signal(-code, signal.SIG_DFL)
                    os.kill(os.getpid(), -code)
                except (OSError, ValueError):
                    pass
                os._exit(128 - code)
            os._exit(code & 0xFF)


class LazySolutionFinder:
    """The import hook, connecting to the solution sandbox on the first import of a solution name."""

    def __init__(self, settings):
        self.settings = settings
        self.names = frozenset(settings.get("modules", ()))
        self.finder = None

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.names:
            return None
        if self.finder is None:
            sock = _connect(self.settings["socket"], time.monotonic() + self.settings.get("connect_timeout", 30))
            client = SolutionClient(Channel(sock), self.settings.get("call_timeout", 60))
            self.finder = SolutionFinder(client, self.names)
        return self.finder.find_spec(fullname, path, target)

    def invalidate_caches(self):
        return None


#: Set while this process's own scratch-area walk opens components (the audit hook leaves those alone).
_WALKING = threading.local()
#: Links one path may expand through, as the kernel allows.
_MAX_LINKS = 40
#: ``os.open`` itself (:func:`guard_scratch` replaces the module's).
_OS_OPEN = os.open


def _open_beneath(root, path, flags, mode=0o777):
    """Open ``path`` (absolute, inside ``root``) one component at a time, never leaving ``root``.

    Each component is opened with ``O_NOFOLLOW`` from its parent's
    descriptor, so no component is looked up twice: a link the solution swaps
    in after a check cannot be followed, because there is no separate check.
    Links are resolved here (at most 40) and must stay inside ``root``.
    """
    import errno

    parts = path[len(root):].split("/")
    stack = [_OS_OPEN(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
    links = 0

    def refuse():
        raise PermissionError(errno.EACCES, "factory: a link out of the scratch area the solution shares is not "
                                            "followed", path)

    try:
        while parts:
            name = parts.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                if len(stack) == 1:
                    refuse()
                os.close(stack.pop())
                continue
            try:
                if parts and any(p not in ("", ".") for p in parts):
                    stack.append(_OS_OPEN(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                          dir_fd=stack[-1]))
                    continue
                return _OS_OPEN(name, flags | os.O_NOFOLLOW, mode, dir_fd=stack[-1])
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                try:
                    target = os.readlink(name, dir_fd=stack[-1])
                except OSError:
                    raise exc from None
            links += 1
            if links > _MAX_LINKS:
                raise OSError(errno.ELOOP, "Too many levels of symbolic links", path)
            if target.startswith("/"):
                if target != root and not target.startswith(root + "/"):
                    refuse()
                while len(stack) > 1:
                    os.close(stack.pop())
                target = target[len(root):]
            parts[:0] = target.split("/")
        return _OS_OPEN(".", flags, mode, dir_fd=stack[-1])  # a folder reached by "..": itself
    finally:
        for fd in stack:
            os.close(fd)


def guard_scratch(scratch):
    """Never follow, in this process, a link in ``scratch`` out of it (see :func:`_open_beneath`).

    ``open``, ``io.open`` and ``os.open`` of a path inside the scratch area
    open it with :func:`_open_beneath`; an audit hook refuses any other open
    or listing of a path there that resolves outside it (a check that a link
    swapped in afterwards could still beat: what opens through the standard
    library's ``open`` is walked, never checked).
    """
    import io

    root = os.path.realpath(scratch)
    named = os.path.abspath(scratch)

    def inside(target):
        if not isinstance(target, (str, bytes)) and not hasattr(target, "__fspath__"):
            return None
        try:
            path = os.path.abspath(os.fsdecode(os.fspath(target)))
        except (TypeError, ValueError):
            return None
        if named != root and (path == named or path.startswith(named + os.sep)):
            path = root + path[len(named):]
        return path if path == root or path.startswith(root + os.sep) else None

    def audit(event, args):
        if event not in ("open", "os.listdir", "os.scandir") or not args or getattr(_WALKING, "on", False):
            return
        path = inside(args[0])
        if path is None:
            return
        real = os.path.realpath(path)
        if real != root and not real.startswith(root + os.sep):
            raise PermissionError(f"factory: {path} is a link out of the scratch area the solution shares; "
                                  "it is not followed")

    sys.addaudithook(audit)
    plain_open, plain_os_open = io.open, os.open

    def walked(path, flags, mode=0o777):
        _WALKING.on = True
        try:
            return _open_beneath(root, path, flags, mode)
        finally:
            _WALKING.on = False

    def guarded_os_open(path, flags, mode=0o777, *, dir_fd=None):
        where = inside(path) if dir_fd is None else None
        if where is None:
            return plain_os_open(path, flags, mode, dir_fd=dir_fd)
        return walked(where, flags | os.O_CLOEXEC, mode)

    def guarded_open(file, mode="r", buffering=-1, encoding=None, errors=None, newline=None, closefd=True,
                     opener=None):
        where = inside(file) if opener is None and not isinstance(file, int) else None
        if where is None:
            return plain_open(file, mode, buffering, encoding, errors, newline, closefd, opener)
        _WALKING.on = True  # the file object's own "open" event: the walk below is the check
        try:
            return plain_open(file, mode, buffering, encoding, errors, newline, closefd,
                              lambda _, flags: _open_beneath(root, where, flags, 0o666))
        finally:
            _WALKING.on = False

    guarded_open.__doc__, guarded_os_open.__doc__ = plain_open.__doc__, plain_os_open.__doc__
    builtins.open = io.open = guarded_open
    os.open = guarded_os_open


def _finding(entry):
    """Append one finding (``{"nan": test}`` or ``{"skip": test}``) to this command's findings file."""
    path = _FINDINGS["path"]
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")
    except (OSError, TypeError, ValueError):
        pass


def _report_unchecked_nans():
    for test in sorted(_NAN["received"] - _NAN["checked"], key=str):
        _finding({"nan": test})


def _record_checks():
    """Record, in this process, what the launcher needs besides the exit status (see :data:`FINDINGS_ENV`).

    NaNs received from the solution and never checked (``math.isnan``, ``cmath.isnan``,
    ``pytest.approx(nan_ok=True)``), per test where pytest runs; tests skipped by unittest or pytest (a
    plugin of ours, named in ``PYTEST_PLUGINS``: plugin autoloading stays off).
    """
    import atexit
    import cmath
    import math

    def checked(function):
        def wrapper(*args, **kwargs):
            result = function(*args, **kwargs)
            if result is True:
                _NAN["checked"].add(_NAN["current"])
            return result
        return wrapper

    math.isnan = checked(math.isnan)
    cmath.isnan = checked(cmath.isnan)
    atexit.register(_report_unchecked_nans)
    import unittest.result

    add_skip = unittest.result.TestResult.addSkip

    def record_skip(result, test, reason):
        try:
            _finding({"skip": str(test.id())})
        except Exception:  # noqa: BLE001 - a test whose id cannot be read is still skipped
            _finding({"skip": repr(test)[:300]})
        return add_skip(result, test, reason)

    unittest.result.TestResult.addSkip = record_skip
    start_test = unittest.result.TestResult.startTest

    def record_start(result, test):
        try:
            _finding({"ran": str(test.id())})
        except Exception:  # noqa: BLE001 - a test whose id cannot be read still runs
            pass
        return start_test(result, test)

    unittest.result.TestResult.startTest = record_start
    import unittest.case

    call_test = unittest.case.TestCase._callTestMethod

    def call_watched(case, method):
        # A test method a decorator of the solution wraps counts only if its own function ran to its end (as
        # under pytest, see _run_watched): a wrapper swallowing its failure must not pass it.
        if getattr(type(method), "_factory_handle_of", None) is None:
            return call_test(case, method)
        try:
            own = method.__wrapped__
        except BaseException:  # noqa: BLE001 - no answer is no wrapped function
            own = None
        _RUN["watch"], _RUN["ran"], _RUN["args"] = own, False, {}
        try:
            result = call_test(case, method)
        finally:
            _RUN["watch"] = None
        if not _RUN["ran"]:
            raise case.failureException("the test method is wrapped by a decorator of the solution that did not run "
                                        "it to its end: the pass is not counted")
        return result

    unittest.case.TestCase._callTestMethod = call_watched
    plugin = types.ModuleType(_PLUGIN_NAME)

    original = os.environ.get("PYTEST_PLUGINS")

    def pytest_configure(config):
        import pytest

        # Loaded: the processes the tests start (a python -I among them) must not look for it.
        if original is None:
            os.environ.pop("PYTEST_PLUGINS", None)
        else:
            os.environ["PYTEST_PLUGINS"] = original
        approx = pytest.approx

        def approx_watching(*args, **kwargs):
            if kwargs.get("nan_ok"):
                _NAN["checked"].add(_NAN["current"])
            return approx(*args, **kwargs)

        pytest.approx = approx_watching
        # The trusted runner's own checks, as under pytest: a NaN never checked, a decorated test whose function
        # did not run, a test function replaced by the solution fail there; here they are findings.
        outcomes = _Outcomes()
        config.pluginmanager.register(outcomes, "factory-boundary-outcomes")
        plugin.outcomes = outcomes
        importorskip = pytest.importorskip
        solution_names = frozenset(_FINDINGS.get("modules") or ())

        def importorskip_solution(modname, *args, **kwargs):  # a solution that fails to import fails, never skips
            if modname.split(".")[0] in solution_names:
                import importlib

                return importlib.import_module(modname)
            return importorskip(modname, *args, **kwargs)

        pytest.importorskip = importorskip_solution

    passed_by_pytest = set()

    def pytest_sessionfinish(session):
        # Only what pytest itself passed: a failure pytest reports already sets its exit status (or a make
        # target ignores it on purpose).
        outcomes = getattr(plugin, "outcomes", None)
        for node, outcome in (outcomes.outcomes.items() if outcomes is not None else ()):
            if outcome == "failed" and node in passed_by_pytest:
                _finding({"failed": node})

    def pytest_runtest_setup(item):
        _NAN["current"] = item.nodeid

    def pytest_runtest_logreport(report):
        if report.when == "call" and report.passed:
            passed_by_pytest.add(report.nodeid)
        if report.when == "setup":
            _finding({"ran": report.nodeid})
        if report.skipped and report.when in ("setup", "call"):
            _finding({"skip": report.nodeid})

    def pytest_collectreport(report):
        if report.nodeid and not report.passed:
            _finding({"ran": report.nodeid})
        if report.skipped and report.nodeid:
            _finding({"skip": report.nodeid})

    for hook in (pytest_configure, pytest_sessionfinish, pytest_runtest_setup, pytest_runtest_logreport,
                 pytest_collectreport):
        setattr(plugin, hook.__name__, hook)
    sys.modules[_PLUGIN_NAME] = plugin
    named = [p for p in os.environ.get("PYTEST_PLUGINS", "").split(",") if p.strip()]
    if _PLUGIN_NAME not in named:
        os.environ["PYTEST_PLUGINS"] = ",".join([*named, _PLUGIN_NAME])


def _load(bootstrap):
    with open(os.path.join(bootstrap, SETTINGS_NAME), encoding="utf-8") as handle:
        return json.load(handle)


def install(bootstrap):
    """Set this trusted Python process up (see the module docstring)."""
    settings = _load(bootstrap)
    workspace = os.path.dirname(bootstrap)
    if settings.get("scratch"):
        guard_scratch(settings["scratch"])
    orig_argv = getattr(sys, "orig_argv", sys.argv)
    argv = program_argv(orig_argv, os.getcwd(), workspace, frozenset(settings.get("programs", ())),
                        frozenset(settings.get("modules", ())))
    if argv is not None:
        _relay(settings, argv, bootstrap)
    if os.environ.get(FINDINGS_ENV):
        _FINDINGS["path"] = os.environ[FINDINGS_ENV]
        _FINDINGS["modules"] = list(settings.get("modules", ()))
        _record_checks()
    sys.meta_path.append(LazySolutionFinder(settings))


def child_environment(bootstrap, scratch, base=None):
    """The environment trusted commands run with: the bootstrap first on the path, temporary files in scratch."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([bootstrap] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTHONSTARTUP", None)
    if scratch:
        env["TMPDIR"] = scratch
    return env


def prepare_runner(bootstrap):
    """Give this process (the trusted pytest runner, started with ``-I``) the environment of a trusted command."""
    settings = _load(bootstrap)
    if settings.get("scratch"):
        guard_scratch(settings["scratch"])
    os.umask(0o000)  # what the tests write in the scratch area stays usable by the solution
    env = child_environment(bootstrap, settings.get("scratch"))
    os.environ.clear()
    os.environ.update(env)


def _missing_program(command, env):
    """The first program ``command`` runs (past ``NAME=value`` assignments), if ``sh`` finds no such command or
    builtin here; else ``None`` (also for what is not a plain word: a path, an expansion, a subshell)."""
    import shlex

    try:
        words = shlex.split(command)
    except ValueError:
        return None
    words = [w for w in words if not (("=" in w) and w.split("=", 1)[0].isidentifier())]
    if not words or not all(c.isalnum() or c in "._+-" for c in words[0]):
        return None
    found = subprocess.run(["sh", "-c", 'command -v "$1" >/dev/null 2>&1', "sh", words[0]],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return words[0] if found.returncode != 0 else None


def launch(settings):
    """Run ``settings["command"]`` unchanged with ``sh -c``; return the report payload (its exit status)."""
    bootstrap = os.path.join(os.getcwd(), BOUNDARY_DIR)
    boundary = _load(bootstrap)
    # The findings file: in this sandbox's own temporary folder (never the scratch area the solution shares).
    handle, findings = tempfile.mkstemp(prefix="factory-findings-")
    os.close(handle)
    scratch = os.path.realpath(boundary.get("scratch") or "/nonexistent")
    if os.path.realpath(findings).startswith(scratch + os.sep):
        os.unlink(findings)
        handle, findings = tempfile.mkstemp(prefix=".factory-findings-", dir=os.getcwd())
        os.close(handle)
    os.umask(0o000)
    env = child_environment(bootstrap, boundary.get("scratch"))
    env[FINDINGS_ENV] = findings
    missing = _missing_program(settings["command"], env)
    if missing:
        # This sandbox holds no agent file: a program the task's command names that is not here is the
        # environment's lack (an image without make), never the agent's failure.
        return {"infra_error": f"the test command's program {missing!r} is not installed where the tests run "
                               "(the sandbox's image): use an image that has it"}
    try:
        process = subprocess.run(["sh", "-c", settings["command"]], stdin=subprocess.DEVNULL, env=env)
    except OSError as exc:
        return {"infra_error": f"cannot start the test command: {exc}"}
    nans, skipped, ran, failed = set(), set(), set(), set()
    try:
        with open(findings, encoding="utf-8") as lines:
            for line in lines:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if "nan" in entry:
                    nans.add(str(entry["nan"]))
                elif "skip" in entry:
                    skipped.add(str(entry["skip"]))
                elif "ran" in entry:
                    ran.add(str(entry["ran"]))
                elif "failed" in entry:
                    failed.add(str(entry["failed"]))
    except OSError:
        pass
    return {"exit": process.returncode, "nan": sorted(nans)[:100], "skipped": sorted(skipped)[:5000],
            "ran": sorted(ran)[:20000], "failed": sorted(failed)[:1000]}


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    _settings = json.loads(sys.stdin.read())
    sys.stdin.close()
    _nonce = _settings.pop("nonce")
    _payload = launch(_settings)
    sys.stdout.flush()
    print("\n" + _nonce + " " + base64.b64encode(json.dumps(_payload).encode()).decode(), flush=True)
