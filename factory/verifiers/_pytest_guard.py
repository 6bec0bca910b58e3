"""The program the ``tests`` verifier runs inside the sandbox to drive pytest under guard.

It is sent as source to ``python -s -c`` (no user site; the workspace is not
on ``sys.path`` while ``site`` starts up, so a planted ``sitecustomize``
never loads, and its first lines take it off before any import; not ``-I``,
which would ignore the sandbox's ``PYTHONHASHSEED``: tests parametrized from
a set would be named in another order than under bare pytest, and read as a
changed collection) and reads its settings from stdin,
which it then closes, so nothing of them is on the command line or in the
environment for the code under test to find. It:

- runs pytest with an empty ini of its own (``-c``; workspace ``pytest.ini``,
  ``setup.cfg``, ``tox.ini`` and ``pyproject.toml`` are ignored), no cache,
  no plugin autoload and, unless the task ships one, no conftest;
- writes the JUnit XML into a fresh temp dir outside the workspace and reads
  it back inside pytest's own process right after pytest wrote it;
- refuses to load bytecode from the workspace (a planted pytest cache of the
  tests would otherwise replace them), so the real sources are compiled;
- watches, with an audit hook and a plugin installed before any code under
  test is imported, for: the test files being opened by code under test
  (reading expected values out of the tests), ``Function.runtest`` or the
  ``pytest_pyfunc_call`` hook being replaced (tests neutered), and processes
  forked by the code under test still alive after the run;
- prints one report line, ``<nonce> <base64 JSON>``, last.

A run that never prints that line ended early (``os._exit`` from the code
under test, a crash, the time limit). Known limit: code under test that
inspects this program's own frames could find the nonce; no in-process
guard can prevent that, so the verifier also trusts nothing it did not see
pytest write.
"""

from __future__ import annotations

__all__ = ["GUARD_SOURCE", "GUARD_VERSION"]

GUARD_VERSION = "4"  # 2: workspace bytecode refused; 3: unittest items keep their own runtest; 4: hash seed

GUARD_SOURCE = r'''
import sys
if sys.path[:1] == [""]:  # the workspace (the -c entry): nothing of the agent's may shadow what we import
    del sys.path[0]
import base64, json, os, shutil, tempfile
# The guard must not leave bytecode in the workspace, whatever the environment says.
sys.dont_write_bytecode = True
settings = json.loads(sys.stdin.read())
sys.stdin.close()
try:
    os.close(0)
except OSError:
    pass
nonce = settings.pop("nonce")
os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
os.environ.pop("PYTEST_ADDOPTS", None)
workspace = os.path.realpath(os.getcwd())
test_paths = {os.path.realpath(os.path.join(workspace, p)) for p in settings["test_files"]}
problems = []

import pytest
import _pytest.python as _pp
import _pytest.unittest as _pu
# Each pytest item class with its own runtest (unittest's TestCaseFunction has one), as pytest ships it.
_original_runtests = {_pu.TestCaseFunction: _pu.TestCaseFunction.runtest, _pp.Function: _pp.Function.runtest}
_stdlib_roots = tuple({os.path.dirname(os.__file__), os.path.dirname(pytest.__file__),
                       os.path.dirname(os.path.dirname(_pp.__file__))})

def _audit(event, args):
    if event != "open" or not args or not isinstance(args[0], (str, bytes)):
        return
    try:
        path = os.path.realpath(os.fsdecode(args[0]))
    except Exception:
        return
    if path.endswith(".pyc") and path.startswith(workspace + os.sep):
        # Bytecode in the workspace may be planted (a pytest cache of the tests with
        # the tests' source hash but empty bodies). Refused, pytest and importlib
        # fall back to compiling the real sources.
        raise PermissionError(f"factory guard: workspace bytecode is not loaded: {path}")
    if path not in test_paths:
        return
    frame = sys._getframe(1)
    while frame is not None:
        raw = frame.f_code.co_filename or ""
        name = os.path.realpath(raw) if raw and not raw.startswith("<") else ""
        if name.startswith(workspace + os.sep) and name not in test_paths:
            problems.append({"code": "test_file_read_by_code_under_test",
                             "file": os.path.relpath(path, workspace), "by": os.path.relpath(name, workspace)})
            return
        frame = frame.f_back

sys.addaudithook(_audit)

def _pyfunc_impls(config):
    return sorted(str(i.plugin_name) for i in config.pluginmanager.hook.pytest_pyfunc_call.get_hookimpls())

class _Guard:
    def __init__(self, report):
        self.report = report
        self.xml = None
        self.pyfunc_impls = None

    def pytest_configure(self, config):
        self.pyfunc_impls = _pyfunc_impls(config)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        shipped = next((_original_runtests[c] for c in type(item).__mro__ if c in _original_runtests), None)
        if shipped is not None and type(item).runtest is not shipped:
            problems.append({"code": "runtest_replaced", "test": item.nodeid})
        code = getattr(getattr(item, "obj", None), "__code__", None)
        if code is not None and os.path.realpath(code.co_filename) not in test_paths:
            problems.append({"code": "test_function_replaced", "test": item.nodeid,
                             "by": os.path.relpath(os.path.realpath(code.co_filename), workspace)})
        if _pyfunc_impls(item.config) != self.pyfunc_impls:
            problems.append({"code": "pyfunc_call_hook_changed", "test": item.nodeid})
        yield

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config):
        try:
            with open(self.report, "rb") as handle:
                self.xml = handle.read().decode("utf-8", "replace")
        except OSError:
            self.xml = None

def _ancestors():
    chain, pid = set(), os.getpid()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                pid = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return chain | {1}

def _survivors():
    mine = _ancestors()
    sid = os.getsid(0)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] not in (b"Z", b"X"):
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    cmd = handle.read().replace(b"\0", b" ").decode("utf-8", "replace")[:200]
                found.append({"pid": int(entry), "cmdline": cmd})
        except (OSError, IndexError, ValueError):
            continue
    return found

report_dir = tempfile.mkdtemp(prefix="factory-junit-")
report = os.path.join(report_dir, "report.xml")
ini = os.path.join(report_dir, "pytest.ini")
with open(ini, "w") as handle:
    handle.write("[pytest]\n")
guard = _Guard(report)
args = [*settings["args"], "-c", ini, "--rootdir", workspace, "-p", "no:cacheprovider",
        "--junitxml", report, "-o", "junit_family=xunit2", "-o", "console_output_style=classic"]
if not settings.get("allow_conftest"):
    args.append("--noconftest")
# As `python -m pytest` would: the workspace importable (start-up is over, so no sitecustomize from it).
sys.path.insert(0, workspace)
try:
    code = int(pytest.main(args, plugins=[guard]))
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 1
except BaseException as exc:
    problems.append({"code": "pytest_raised", "error": f"{type(exc).__name__}: {exc}"[:300]})
    code = 3
survivors = _survivors()
for proc in survivors:
    try:
        os.kill(proc["pid"], 9)
    except OSError:
        pass
payload = {"exit": code, "xml": guard.xml, "problems": problems, "survivors": survivors}
shutil.rmtree(report_dir, ignore_errors=True)
sys.stdout.flush()
os.write(1, ("\n" + nonce + " " + base64.b64encode(json.dumps(payload).encode()).decode() + "\n").encode())
os._exit(0)
'''
