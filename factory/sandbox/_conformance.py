"""The sandbox conformance suite: the checks every backend runs, shipped with the package.

A backend declares the isolation it guarantees; this suite holds it to that.
Each check that needs a guarantee is skipped, with that reason, for a backend
that does not claim it (``none`` says plainly that it has no network or
filesystem isolation); the rest run for every backend. The test suite runs
every check against every registered backend, and the author of a new
backend runs the same checks without pytest (as inspect_ai's ``self_check``)::

    import asyncio
    from factory.sandbox import self_check

    for result in asyncio.run(self_check(MySandbox)):  # or a registered name
        print(result.status, result.name, result.detail)

Adding a check is one decorated async function: it receives the backend's
factory, opens its own sandbox(es) from it (usually seeded with
:data:`CONFORMANCE_SPEC`), and raises :class:`AssertionError` through
:func:`expect` when the backend misbehaves::

    @conformance_check(Guarantee.FILESYSTEM)
    async def symlinks_do_not_escape(factory: SandboxFactory) -> None:
        '''A symlink out of the workspace cannot be read through.'''
        async with factory(CONFORMANCE_SPEC) as sandbox:
            ...
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

from factory.errors import SandboxPathError
from factory.sandbox._base import SANDBOXES, Guarantee, Sandbox, SandboxLimits, SandboxSpec
from factory.sandbox._none import NoSandboxWarning

__all__ = [
    "CHECKS",
    "CONFORMANCE_SPEC",
    "CheckResult",
    "ConformanceCheck",
    "SandboxFactory",
    "conformance_check",
    "expect",
    "self_check",
]

T = TypeVar("T")

#: What builds an unstarted sandbox from a spec: a backend class, or any factory.
SandboxFactory = Callable[[SandboxSpec], Sandbox]

#: The workspace every check starts from: a failing solution and its read-only test.
CONFORMANCE_SPEC = SandboxSpec(
    files={"solution.py": "def answer():\n    return 41\n", "pkg/data.txt": "hello\n"},
    readonly_files={
        "test_solution.py": "from solution import answer\n\ndef test_answer():\n    assert answer() == 42\n"},
    limits=SandboxLimits(timeout_s=20, memory_mb=512, max_processes=48, max_output_bytes=200_000),
)


def _factory_of(backend: str | SandboxFactory) -> SandboxFactory:
    return SANDBOXES.get(backend) if isinstance(backend, str) else backend


@dataclass(frozen=True)
class ConformanceCheck:
    """One check of the suite.

    Attributes:
        name: Its name (the function's), as results and test ids show it.
        body: The check; raises :class:`AssertionError` when the backend fails it.
        requires: The guarantee it tests; backends that do not claim it skip it.
        description: What it checks (the function's docstring).
    """

    name: str
    body: Callable[[SandboxFactory], Awaitable[None]]
    requires: Guarantee | None = None
    description: str = ""

    def skip_reason(self, backend: str | SandboxFactory) -> str | None:
        """Why ``backend`` skips this check (it does not claim the guarantee), or None if it must pass it."""
        if self.requires is None:
            return None
        sandbox = _factory_of(backend)(CONFORMANCE_SPEC)  # never started: only its class's claims are read
        if self.requires in sandbox.guarantees:
            return None
        name = getattr(sandbox, "name", type(sandbox).__name__)
        return f"'{name}' does not guarantee {self.requires.value}"

    async def run(self, backend: str | SandboxFactory) -> None:
        """Run the check against ``backend`` (a registered name or a factory), whatever it claims.

        Raises:
            AssertionError: The backend fails the check.
        """
        with warnings.catch_warnings():  # `none` warns on every start; the suite knows
            warnings.simplefilter("ignore", NoSandboxWarning)
            await self.body(_factory_of(backend))


#: Every check, in the order the suite runs them; :func:`conformance_check` appends.
CHECKS: list[ConformanceCheck] = []


def conformance_check(
    requires: Guarantee | None = None,
) -> Callable[[Callable[[SandboxFactory], Awaitable[None]]], Callable[[SandboxFactory], Awaitable[None]]]:
    """Decorator adding an async check function to :data:`CHECKS`.

    Args:
        requires: The guarantee the check tests (None: every backend must pass it).
    """

    def decorate(body: Callable[[SandboxFactory], Awaitable[None]]) -> Callable[[SandboxFactory], Awaitable[None]]:
        description = (body.__doc__ or "").strip().splitlines()[0] if body.__doc__ else ""
        CHECKS.append(ConformanceCheck(body.__name__, body, requires, description))
        return body

    return decorate


def expect(condition: object, message: str) -> None:
    """Fail the running check with ``message`` unless ``condition`` holds.

    An explicit raise rather than ``assert``, which ``python -O`` strips.

    Raises:
        AssertionError: ``condition`` is false.
    """
    if not condition:
        raise AssertionError(message)


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check for one backend.

    Attributes:
        name: The check's name.
        status: ``passed``, ``failed``, or ``skipped`` (the backend does not claim the guarantee).
        detail: Why it failed or was skipped; empty when it passed.
    """

    name: str
    status: Literal["passed", "failed", "skipped"]
    detail: str = ""

    @property
    def passed(self) -> bool:
        """The check ran and passed."""
        return self.status == "passed"


async def self_check(
    backend: str | SandboxFactory, checks: Sequence[ConformanceCheck] | None = None
) -> list[CheckResult]:
    """Run the conformance suite against one backend, one check after another.

    Args:
        backend: A registered name (``"bwrap"``) or a factory such as the backend's class.
        checks: The checks to run (default: all of :data:`CHECKS`).

    Returns:
        One result per check, in order. A check that raises anything (a failed
        expectation, or the backend erroring) is ``failed`` with the reason.

    Raises:
        ConfigError: ``backend`` is a name nothing is registered under.
    """
    factory = _factory_of(backend)
    results = []
    for check in CHECKS if checks is None else checks:
        try:
            reason = check.skip_reason(factory)
            if reason is None:
                await check.run(factory)
        except Exception as exc:  # a conformance report names every failure instead of stopping at one
            detail = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {exc}"
            results.append(CheckResult(check.name, "failed", detail))
        else:
            results.append(CheckResult(check.name, "skipped", reason) if reason else CheckResult(check.name, "passed"))
    return results


async def _refuses(attempt: Awaitable[object], what: str) -> None:
    """Expect ``attempt`` to raise :class:`SandboxPathError` (anything else propagates)."""
    try:
        await attempt
    except SandboxPathError:
        return
    raise AssertionError(f"{what} was not refused with SandboxPathError")


@contextmanager
def _host_variables(values: Mapping[str, str]) -> Iterator[None]:
    """Set host environment variables for the block, then restore them (a canary for leaks)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@conformance_check()
async def file_round_trip_and_listing(factory: SandboxFactory) -> None:
    """Files written, read, listed and seen by commands agree; paths out of the workspace are refused."""
    spec = CONFORMANCE_SPEC
    async with factory(spec) as sb:
        await sb.write_file("new/dir/note.txt", "über\n")
        expect(await sb.read_file("new/dir/note.txt") == "über\n", "a written file does not read back")
        expect(await sb.read_file("solution.py") == spec.files["solution.py"], "a seeded file reads back wrong")
        expect(await sb.read_file("test_solution.py") == spec.readonly_files["test_solution.py"],
               "a read-only file reads back wrong")
        listed = await sb.list_files()
        expect({"solution.py", "pkg/data.txt", "test_solution.py", "new/dir/note.txt"} <= set(listed),
               f"list_files() misses files: {listed}")
        in_pkg = await sb.list_files("pkg")
        expect(in_pkg == ["pkg/data.txt"], f"list_files('pkg') is {in_pkg}")
        seen = await sb.exec("cat new/dir/note.txt")
        expect(seen.stdout == "über\n", f"a command does not see a written file: {seen.describe()}")
        await _refuses(sb.read_file("../../etc/passwd"), "reading ../../etc/passwd")
        await _refuses(sb.write_file("/etc/evil", "x"), "writing /etc/evil")
        await _refuses(sb.write_file("test_solution.py", "def test_answer(): pass\n"),
                       "overwriting a read-only file")


@conformance_check()
async def exit_codes_stdin_and_python_with_pytest(factory: SandboxFactory) -> None:
    """Exit codes, argv commands and stdin come through; the workspace runs its tests with pytest."""
    async with factory(CONFORMANCE_SPEC) as sb:
        code = (await sb.exec("exit 3")).exit_code
        expect(code == 3, f"'exit 3' gave exit code {code}")
        printed = await sb.exec(["python", "-c", "print(6 * 7)"])
        expect(printed.stdout == "42\n", f"python in the sandbox: {printed.describe()}")
        echoed = await sb.exec("cat", stdin="from stdin\n")
        expect(echoed.stdout == "from stdin\n" and echoed.ok, f"stdin was not fed: {echoed.describe()}")
        failing = await sb.exec("python -m pytest -q")
        expect(failing.exit_code == 1 and "1 failed" in failing.stdout,
               f"pytest on the failing solution: {failing.describe()}")
        await sb.write_file("solution.py", "def answer():\n    return 42\n")
        passing = await sb.exec("python -m pytest -q")
        expect(passing.exit_code == 0 and "1 passed" in passing.stdout,
               f"pytest on the fixed solution: {passing.describe()}")


@conformance_check(Guarantee.TIMEOUT)
async def timeout_kills_runaway_process_and_children(factory: SandboxFactory) -> None:
    """A command past its timeout is killed with its whole process tree, background children included."""
    async with factory(CONFORMANCE_SPEC) as sb:
        start = time.monotonic()
        result = await sb.exec("(sleep 3; echo late > late.txt) & (sleep 3; echo late2 > late2.txt) & sleep 60",
                               timeout=1)
        expect(result.timed_out and not result.ok, f"the runaway command was not timed out: {result.describe()}")
        elapsed = time.monotonic() - start
        expect(elapsed < 10, f"the timeout took {elapsed:.1f}s to kill a 1s command")
        await asyncio.sleep(3.5)
        files = await sb.list_files()
        expect("late.txt" not in files and "late2.txt" not in files,
               "background children outlived the timeout and wrote their files")


@conformance_check(Guarantee.NETWORK)
async def no_network(factory: SandboxFactory) -> None:
    """No outbound connection succeeds, and no interface but loopback exists."""
    code = ("import socket\n"
            "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=3)\n    print('connected')\n"
            "except OSError as e:\n    print('blocked', e.errno)\n"
            "print(sorted(n for _, n in socket.if_nameindex()))\n")
    async with factory(CONFORMANCE_SPEC) as sb:
        result = await sb.exec(["python", "-c", code])
        expect("blocked" in result.stdout, result.describe())
        lines = result.stdout.strip().splitlines()
        expect(bool(lines) and lines[-1] in ("['lo']", "[]"), f"network interfaces: {result.describe()}")


@conformance_check(Guarantee.ENVIRONMENT)
async def host_secret_is_not_visible(factory: SandboxFactory) -> None:
    """The host's environment (API keys above all) is invisible to commands, through /proc too."""
    canaries = {"OPENAI_API_KEY": "sk-secret-host-value", "FACTORY_TEST_SECRET": "do-not-leak"}
    with _host_variables(canaries):
        async with factory(CONFORMANCE_SPEC) as sb:
            result = await sb.exec("env; cat /proc/self/environ 2>/dev/null | tr '\\0' '\\n'")
            seen = result.stdout + result.stderr
            expect("sk-secret-host-value" not in seen, "the host's OPENAI_API_KEY value is visible")
            expect("do-not-leak" not in seen, "a host variable's value is visible")
            expect("OPENAI_API_KEY" not in result.stdout, "the host's OPENAI_API_KEY is set")
            first = await sb.exec("cat /proc/1/environ 2>&1 | tr '\\0' '\\n'")
            expect("do-not-leak" not in first.stdout, "a host variable is visible in /proc/1/environ")


@conformance_check(Guarantee.FILESYSTEM)
async def no_writes_outside_workspace_and_tests_read_only(factory: SandboxFactory) -> None:
    """Nothing outside the workspace is writable, and no shell trick changes the read-only tests."""
    spec = CONFORMANCE_SPEC
    with tempfile.TemporaryDirectory(prefix="factory-conformance-") as host_dir:
        outside = os.path.join(host_dir, "outside.txt")
        async with factory(spec) as sb:
            for target in (outside, "/usr/factory-evil", "/etc/factory-evil", "/factory-evil"):
                result = await sb.exec(f"echo pwned > {target}")
                expect(result.exit_code != 0, f"writing {target} succeeded")
            for attack in ("echo 'def test_answer(): pass' > test_solution.py",
                           "rm -f test_solution.py", "mv test_solution.py moved.py",
                           "chmod 666 test_solution.py && echo x >> test_solution.py"):
                await sb.exec(attack)
            expect(await sb.read_file("test_solution.py") == spec.readonly_files["test_solution.py"],
                   "the read-only test file was changed")
            code = (await sb.exec("python -m pytest -q")).exit_code
            expect(code == 1, f"the tests no longer fail on the failing solution (exit code {code})")
        expect(not os.path.exists(outside), f"{outside} was written on the host")
    expect(not os.path.exists("/usr/factory-evil") and not os.path.exists("/factory-evil"),
           "a file was written into the host's / or /usr")


@conformance_check(Guarantee.READONLY_TESTS)
async def read_only_tests_cannot_be_modified(factory: SandboxFactory) -> None:
    """Overwriting a read-only test file from a command fails and leaves it as it was."""
    spec = CONFORMANCE_SPEC
    async with factory(spec) as sb:
        result = await sb.exec("echo 'def test_answer(): pass' > test_solution.py")
        expect(result.exit_code != 0, "overwriting the read-only test file succeeded")
        expect(await sb.read_file("test_solution.py") == spec.readonly_files["test_solution.py"],
               "the read-only test file was changed")


@conformance_check(Guarantee.PROCESSES)
async def fork_bomb_is_contained(factory: SandboxFactory) -> None:
    """A fork bomb stops at the process limit, and the sandbox still works afterwards."""
    bomb = ("import os, time\nn = 0\ntry:\n    while n < 5000:\n        if os.fork() == 0:\n"
            "            time.sleep(20)\n            os._exit(0)\n        n += 1\n"
            "except OSError:\n    print('contained at', n)\n")
    async with factory(CONFORMANCE_SPEC) as sb:
        result = await sb.exec(["python", "-c", bomb], timeout=15)
        expect("contained at" in result.stdout, result.describe())
        forked = int(result.stdout.split()[-1])
        limit = CONFORMANCE_SPEC.limits.max_processes
        expect(forked <= limit, f"{forked} processes forked past the limit of {limit}")
        # the sandbox still works afterwards, and nothing from the bomb survives
        alive = await sb.exec("echo alive")
        expect(alive.stdout == "alive\n", f"the sandbox is unusable after the bomb: {alive.describe()}")


@conformance_check(Guarantee.MEMORY)
async def memory_hog_is_contained(factory: SandboxFactory) -> None:
    """Allocating past the memory limit fails (MemoryError or a kill)."""
    async with factory(CONFORMANCE_SPEC) as sb:
        result = await sb.exec(["python", "-c", "x = bytearray(2 * 1024 ** 3); print('allocated')"])
        expect(result.exit_code != 0 and "allocated" not in result.stdout,
               f"2 GiB were allocated: {result.describe()}")
        expect("MemoryError" in result.stderr or result.exit_code < 0,
               f"neither a MemoryError nor a kill: {result.describe()}")


@conformance_check(Guarantee.OUTPUT)
async def output_flood_is_contained(factory: SandboxFactory) -> None:
    """A command flooding its output is killed at the output limit, quickly, not at its timeout."""
    async with factory(CONFORMANCE_SPEC) as sb:
        start = time.monotonic()
        result = await sb.exec("yes 'flood flood flood flood'", timeout=15)
        expect(result.output_truncated and not result.timed_out,
               f"the flood was not cut at the output limit (truncated={result.output_truncated}, "
               f"timed_out={result.timed_out})")
        size = len(result.stdout.encode())
        limit = CONFORMANCE_SPEC.limits.max_output_bytes
        expect(size <= limit, f"{size} bytes captured past the limit of {limit}")
        elapsed = time.monotonic() - start
        expect(elapsed < 10, f"the flood ran {elapsed:.1f}s before it was cut")


@conformance_check()
async def private_tmp_is_writable(factory: SandboxFactory) -> None:
    """Commands have a writable temp directory ($TMPDIR, or /tmp)."""
    async with factory(CONFORMANCE_SPEC) as sb:
        result = await sb.exec("echo scratch > \"${TMPDIR:-/tmp}/scratch.txt\" && cat \"${TMPDIR:-/tmp}/scratch.txt\"")
        expect(result.stdout == "scratch\n", result.describe())


# ----------------------------------------------------------------------------- escapes
# What a policy under optimisation pressure tries. Each check is one closed hole.

#: A read-only test inside a folder, so the folder itself can be swapped.
_NESTED_TESTS = SandboxSpec(
    files={"solution.py": "def answer():\n    return 41\n"},
    readonly_files={"tests/test_solution.py": "from solution import answer\n\n\ndef test_answer():\n"
                                              "    assert answer() == 42\n"},
    limits=CONFORMANCE_SPEC.limits,
)
#: Enough ``../`` to reach / from any workspace a backend could use: extra ones stay at /.
_TO_ROOT = "../" * 24


async def _within(seconds: float, attempt: Awaitable[T], what: str) -> T:
    """``attempt``'s result, or a failed check if it hangs."""
    try:
        return await asyncio.wait_for(attempt, seconds)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what} hung for more than {seconds:.0f}s") from None


@conformance_check(Guarantee.READONLY_TESTS)
async def swapped_test_folder_mounts_no_host_file(factory: SandboxFactory) -> None:
    """Swapping the tests folder, or linking a test file or folder anywhere, never changes what the next command sees.

    A backend that binds read-only files from their place in the workspace
    binds whatever the sandbox renamed or linked there: the agent's own test
    in a new folder, a host file reached through ``../``, or, for a path
    that cannot be made, no command at all (a failed test run that a
    verifier would count as an infrastructure error, not a failure).
    """
    secret = "host-secret-" + os.urandom(8).hex()
    with tempfile.TemporaryDirectory(prefix="factory-conformance-") as host_dir:
        os.chmod(host_dir, 0o755)
        canary = os.path.join(host_dir, "canary.txt")
        with open(canary, "w") as handle:
            handle.write(secret + "\n")
        os.chmod(canary, 0o644)  # world-readable, as most host files are: only isolation keeps it out
        target_dir, empty_dir = os.path.join(host_dir, "tests"), os.path.join(host_dir, "empty")
        os.mkdir(target_dir)
        os.mkdir(empty_dir)
        with open(os.path.join(target_dir, "test_solution.py"), "w") as handle:
            handle.write(f"def test_answer():\n    assert True  # {secret}\n")
        original = _NESTED_TESTS.readonly_files["tests/test_solution.py"]
        async with factory(_NESTED_TESTS) as sb:
            for attack in (
                "mkdir tests && echo 'def test_answer(): pass' > tests/test_solution.py",
                # the file, then its folder, linked to host paths (a bind from the workspace follows them)
                f"mkdir tests && ln -s {_TO_ROOT}{canary.lstrip('/')} tests/test_solution.py",
                f"ln -s {_TO_ROOT}{target_dir.lstrip('/')} tests",
                # the folder linked to where bwrap keeps the host's root while it sets up (a bind creates its target)
                f"ln -s {_TO_ROOT}oldroot{empty_dir} tests",
                f"ln -s {canary} tests",
                "mkfifo tests",
                "mkdir -p tests/test_solution.py",
            ):
                # the mounted test cannot be removed while a command runs, but its folder can be moved away
                attack = f"mv tests moved-$(date +%s%N) && {attack}"
                await sb.exec(attack)
                seen = await sb.exec("cat tests/test_solution.py; python -m pytest -q tests 2>&1 | tail -3")
                expect(secret not in seen.stdout + seen.stderr,
                       f"a host file is readable in the sandbox after {attack!r}")
                expect(seen.stdout.startswith(original), f"the read-only test is not in place after {attack!r}: "
                                                         f"{seen.describe()}")
                expect("1 failed" in seen.stdout, f"the tests no longer fail after {attack!r}: {seen.describe()}")
        expect(sorted(os.listdir(host_dir)) == ["canary.txt", "empty", "tests"] and not os.listdir(empty_dir)
               and os.listdir(target_dir) == ["test_solution.py"], "a file was created in a host folder")


@conformance_check()
async def file_tools_never_follow_links_nor_block_on_fifos(factory: SandboxFactory) -> None:
    """write_file/read_file/list_files on a FIFO or a link fail fast, and the sandbox keeps working."""
    async with factory(CONFORMANCE_SPEC) as sb:
        made = await sb.exec("mkfifo out.txt && mkdir -p d && mkfifo d/pipe && ln -s /etc/hostname link.txt && "
                             "ln -s solution.py inner.py && ln -s / d/root")
        expect(made.ok, f"cannot make FIFOs and links: {made.describe()}")
        for name, attempt in (("write_file on a FIFO", sb.write_file("out.txt", "x")),
                              ("read_file on a FIFO", sb.read_file("out.txt")),
                              ("read_file on a FIFO in a folder", sb.read_file("d/pipe")),
                              ("write_file through a link out", sb.write_file("link.txt", "x")),
                              ("read_file through a link out", sb.read_file("link.txt")),
                              ("read_file through a folder link", sb.read_file("d/root/etc/passwd")),
                              ("write_file through a folder link", sb.write_file("d/root/tmp/evil", "x"))):
            await _within(25, _refuses(attempt, name), name)
        listed = await _within(25, sb.list_files(), "list_files with FIFOs and links")
        expect("solution.py" in listed and "out.txt" not in listed and "d/pipe" not in listed,
               f"list_files lists special files: {listed}")
        expect(not any(path.startswith("d/root/") for path in listed), f"list_files followed a link: {listed}")
        alive = await sb.exec("echo alive")
        expect(alive.stdout == "alive\n", f"the sandbox is unusable afterwards: {alive.describe()}")


@conformance_check()
async def final_workspace_with_links_and_special_files_is_collected(factory: SandboxFactory) -> None:
    """A workspace holding links, FIFOs, sockets and binary files is collected, never followed nor opened."""
    make = ("import os, socket\n"
            "os.mkfifo('fifo')\n"
            "socket.socket(socket.AF_UNIX).bind('sock')\n"
            "os.symlink('/etc/passwd', 'etc-link')\n"
            "os.symlink('.', 'loop')\n"
            "open('blob.bin', 'wb').write(bytes(range(256)))\n")
    async with factory(CONFORMANCE_SPEC) as sb:
        made = await sb.exec(["python", "-c", make])
        expect(made.ok, f"cannot make the special files: {made.describe()}")
        collected = await _within(60, sb.collect_workspace(), "collect_workspace")
        expect(collected.files.get("solution.py") == CONFORMANCE_SPEC.files["solution.py"].encode(),
               f"solution.py collected as {collected.files.get('solution.py')!r}")
        expect(not {"fifo", "sock", "etc-link", "loop"} & set(collected.files),
               f"a link or special file was read as a file: {sorted(collected.files)}")
        expect(not any(path.startswith("loop/") for path in collected.files), "a link to a folder was followed")
        # The defaults read through read_file (text); a backend that sees the files collects them exactly.
        if collected.symlinks or collected.special:
            expect(collected.files.get("blob.bin") == bytes(range(256)), "a binary file was not collected exactly")
            expect(collected.symlinks.get("etc-link") == "/etc/passwd" and collected.symlinks.get("loop") == ".",
                   f"links collected as {dict(collected.symlinks)}")
            expect(collected.special.get("fifo") == "fifo" and collected.special.get("sock") == "socket",
                   f"special files collected as {dict(collected.special)}")


@conformance_check()
async def etc_serves_common_programs(factory: SandboxFactory) -> None:
    """awk (through /etc/alternatives), id and getpass find what they need in /etc."""
    async with factory(CONFORMANCE_SPEC) as sb:
        for command, wanted in (("awk 'BEGIN{print 1}'", "1\n"), ("id -un >/dev/null && echo named", "named\n"),
                                ("python -c 'import getpass; getpass.getuser(); print(\"user\")'", "user\n")):
            result = await sb.exec(command)
            expect(result.ok and result.stdout == wanted, f"{command}: {result.describe()}")


@conformance_check(Guarantee.FILESYSTEM)
async def etc_holds_no_host_secrets(factory: SandboxFactory) -> None:
    """No shadow file or host key is readable, and /etc/passwd is not the host's (its accounts stay private)."""
    try:
        with open("/etc/passwd") as handle:
            host_accounts = handle.read()
    except OSError:
        host_accounts = None
    async with factory(CONFORMANCE_SPEC) as sb:
        shadow = await sb.exec("cat /etc/shadow /etc/gshadow /etc/ssh/ssh_host_*_key 2>/dev/null")
        expect(not shadow.stdout, "a host shadow or key file is readable")
        accounts = await sb.exec("cat /etc/passwd")
        expect(accounts.ok, f"/etc/passwd is unreadable: {accounts.describe()}")
        expect(accounts.stdout != host_accounts, "/etc/passwd is the host's")


@conformance_check(Guarantee.SYSCALLS)
async def no_user_namespaces_inside(factory: SandboxFactory) -> None:
    """No user namespace can be made inside (`unshare -Ur`, unshare(2), clone(2) with CLONE_NEWUSER)."""
    probe = ("import ctypes, errno, os, platform, signal\n"
             "libc = ctypes.CDLL(None, use_errno=True)\n"
             "clone = {'x86_64': 56, 'aarch64': 220}[platform.machine()]\n"
             "print('unshare', libc.unshare(0x10000000), errno.errorcode.get(ctypes.get_errno()))\n"
             "pid = libc.syscall(clone, 0x10000000 | signal.SIGCHLD, 0, 0, 0, 0)\n"
             "if pid == 0:\n    os._exit(0)\n"
             "print('clone', -1 if pid < 0 else 'child', errno.errorcode.get(ctypes.get_errno()))\n")
    async with factory(CONFORMANCE_SPEC) as sb:
        cli = await sb.exec("unshare -Ur id")
        expect(cli.exit_code != 0 and "uid=0" not in cli.stdout, f"unshare -Ur id worked: {cli.describe()}")
        calls = await sb.exec(["python", "-c", probe])
        expect(calls.stdout.split() == ["unshare", "-1", "EPERM", "clone", "-1", "EPERM"],
               f"a user namespace could be made: {calls.describe()}")


@conformance_check(Guarantee.SYSCALLS)
async def dangerous_syscalls_are_refused(factory: SandboxFactory) -> None:
    """ptrace, mount, unshare, setns, keyctl, bpf, perf_event_open, kexec, modules... return EPERM.

    The arguments are ones each call would answer with something other than
    EPERM when allowed (success, EFAULT, EINVAL, EBADF...), so the check fails
    on a backend that merely runs unprivileged.
    """
    from factory.sandbox._seccomp import syscall_numbers

    # name -> arguments (NULL pointers, bad descriptors, invalid flags).
    calls = {"ptrace": [0, 0, 0, 0], "unshare": [0], "setns": [-1, 0], "keyctl": [9999, 0, 0, 0],
             "add_key": [0, 0, 0, 0, 0], "request_key": [0, 0, 0, 0], "mount": [0, 0, 0, 0, 0],
             "umount2": [0, 0xFFFF], "bpf": [9999, 0, 0], "perf_event_open": [0, 0, -1, -1, 0],
             "userfaultfd": [1], "io_uring_setup": [1, 0], "open_by_handle_at": [-1, 0, 0],
             "pivot_root": [0, 0], "kexec_load": [0, 0, 0, 0], "kexec_file_load": [-1, -1, 0, 0, 0],
             "init_module": [0, 0, 0], "finit_module": [-1, 0, 0], "delete_module": [0, 0],
             "process_vm_readv": [1, 0, 0, 0, 0, 0], "iopl": [4], "ioperm": [0, 0, 0], "fsopen": [0, 0]}
    probe = ("import ctypes, errno, json, platform, sys\n"
             "libc = ctypes.CDLL(None, use_errno=True)\n"
             "numbers = json.loads(sys.argv[1])[platform.machine()]\n"
             "for name, args in json.loads(sys.argv[2]).items():\n"
             "    if name not in numbers:\n        continue\n"
             "    ctypes.set_errno(0)\n"
             "    result = libc.syscall(numbers[name], *[ctypes.c_long(a) for a in args])\n"
             "    print(name, errno.errorcode.get(ctypes.get_errno(), 'ok') if result == -1 else 'ok')\n")
    async with factory(CONFORMANCE_SPEC) as sb:
        result = await sb.exec(["python", "-c", probe, json.dumps(syscall_numbers()), json.dumps(calls)])
        outcomes = dict(line.split() for line in result.stdout.splitlines())
        expect(result.ok and outcomes, f"the probe failed: {result.describe()}")
        allowed = {name: outcome for name, outcome in outcomes.items() if outcome != "EPERM"}
        expect(not allowed, f"syscalls not refused with EPERM: {allowed}")
        works = await sb.exec("python -c 'import threading, subprocess; t = threading.Thread(target=print); "
                              "t.start(); t.join(); subprocess.run([\"true\"], check=True)' && sh -c 'echo ok'")
        expect(works.stdout.strip().endswith("ok") and works.ok, f"threads or subprocesses broke: {works.describe()}")


@conformance_check(Guarantee.DISK)
async def workspace_quota_holds(factory: SandboxFactory) -> None:
    """Filling the workspace past limits.workspace_mb fails, many small files or one; the sandbox stays usable."""
    quota = 8
    spec = replace(CONFORMANCE_SPEC, limits=replace(CONFORMANCE_SPEC.limits, workspace_mb=quota))
    async with factory(spec) as sb:
        one = await sb.exec(f"dd if=/dev/zero of=big.bin bs=1M count={quota * 2} 2>&1")
        expect(one.exit_code != 0, f"writing {quota * 2} MiB into an {quota} MiB workspace succeeded")
        await sb.exec("rm -f big.bin")
        many = await sb.exec(f"for i in $(seq {quota * 2}); do head -c 1048576 /dev/zero > part$i.bin || exit 1; "
                             "done")
        expect(many.exit_code != 0, f"{quota * 2} files of 1 MiB fit in an {quota} MiB workspace")
        used = await sb.exec("du -sk . | cut -f1")
        expect(int(used.stdout.strip() or 0) <= quota * 1024 + 512, f"the workspace holds {used.stdout.strip()} KiB")
        try:
            await sb.write_file("host-written.bin", b"\0" * (quota * 2 * 1024 * 1024))
        except SandboxPathError:
            pass
        else:
            raise AssertionError("write_file put more than the quota into the workspace")
        await sb.exec("rm -f part*.bin host-written.bin")
        again = await sb.exec("echo fine > after.txt && cat after.txt")
        expect(again.stdout == "fine\n", f"the workspace is unusable after being filled: {again.describe()}")
