"""Warm trusted runners: isolated verification without importing pytest each time.

Most of a short pytest run is importing pytest. The trusted side of an
isolated verification never runs agent code, so its start need not be fresh:
a warm runner (:mod:`._zygote`) is a trusted sandbox holding no task file and
no agent file, with one long-lived process that has imported pytest and
forks a child per verification. Only the solution's side starts fresh, as
before: a new solution sandbox per verification, started while the trusted
child already runs (it waits for the solution's socket).

What each verification gets of its own (see :func:`run_warm`): its trusted
files (tests, pristine data files, package markers, the bootstrap with this
verification's settings), written by this process into the runner's
workspace, empty between verifications, so every path is where a fresh
trusted sandbox has it; and a channel folder in the runner's shared
directory (the socket, the scratch area), which is the solution sandbox's
whole shared directory, mounted at the same path there. No solution sandbox
sees the runner's socket, its script, or another verification's channel. A
runner serves one verification at a time, and between two it kills every
process its sandbox holds besides itself and empties its workspace,
``/tmp`` and ``/dev/shm``; the child's memory is its own (a fork). Runners are pooled per event loop, sandbox
backend, image and limits; an idle one exits by itself after
:data:`IDLE_S`, a used-up one (age, runs) is closed.

Backends: bwrap and none (:data:`WARM_BACKENDS`); others (docker) start a
fresh trusted sandbox per verification (:func:`._isolation.run_isolated`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import socket
import struct
import tempfile
import time
import weakref
from collections.abc import Mapping
from typing import Any

from factory.errors import SandboxError
from factory.sandbox import ExecResult, Sandbox, SandboxLimits, SandboxSpec, create_sandbox, sandbox_folder
from factory.tasks import Task
from factory.verifiers._boundary import BOUNDARY_DIR, SETTINGS_NAME
from factory.verifiers._isolation import (
    SCRATCH_NAME,
    SOCKET_NAME,
    IsolatedRun,
    _run_file,
    _script,
    _with_bytecode,
    await_trusted,
    bootstrap_source,
    module_names,
    package_markers,
    parse_report,
    place_server,
    server_command,
    stable_layout,
    test_data_files,
    trusted_files,
)
from factory.verifiers._zygote import ZYGOTE_SOCKET

#: CPU seconds of a warm runner's own sandbox (a run's own limit is set in its fork).
RUNNER_CPU_S = 24 * 3600

__all__ = ["IDLE_S", "WarmRunner", "close_warm_runners", "run_warm"]

#: A warm runner with no request for this long exits by itself (so a pool whose event loop is gone leaves no
#: process behind); the pool stops handing it out a few seconds before.
IDLE_S = 300.0
#: A runner is retired past this age or this many verifications (its sandbox's own time limit is a bit longer).
LIFETIME_S, MAX_RUNS = 1800.0, 500
_MAX_IDLE_PER_KEY = 8
ZYGOTE_DIR, ZYGOTE_NAME = ".factory-zygote", "factory-zygote.py"
_LENGTH = struct.Struct(">I")


def _zygote_script() -> str:
    return _script("_program_server", "_boundary", "_trusted_runner", "_zygote")


class WarmRunner:
    """One warm trusted sandbox and its pre-imported, forking process (see :mod:`._zygote`)."""

    def __init__(self, backend: str, image: str | None, limits: SandboxLimits):
        self.backend, self.image, self.limits = backend, image, limits
        self.group = f"warm-{secrets.token_hex(6)}"  # solution sandboxes of its runs share its user
        self.root = ""
        self.sandbox: Sandbox | None = None
        self.server: asyncio.Future[ExecResult] | None = None
        self.started = self.last_used = time.monotonic()
        self.runs = 0
        self.lifeline: socket.socket | None = None
        self.root_fd: int | None = None  # (see address)

    @property
    def inside(self) -> str:
        """The shared directory's path inside the runner's sandbox."""
        assert self.sandbox is not None and self.sandbox.shared_path is not None
        return self.sandbox.shared_path

    def usable(self, timeout_s: float) -> bool:
        now = time.monotonic()
        return (self.server is not None and not self.server.done() and now - self.last_used < IDLE_S - 5
                and now - self.started + timeout_s + 60 < LIFETIME_S and self.runs < MAX_RUNS)

    async def start(self) -> None:
        self.root = tempfile.mkdtemp(prefix="factory-warm-", dir=sandbox_folder())
        os.chmod(self.root, 0o1777)  # the runner's children write their trees; sticky: no one removes another's
        # The runner's script is in the shared directory (read-only, root's): the workspace starts empty and is
        # each verification's own in turn. A fixed address-space layout, as a fresh trusted command has (its
        # forks keep it).
        os.mkdir(os.path.join(self.root, ZYGOTE_DIR), 0o755)
        for rel, content in _with_bytecode(ZYGOTE_NAME, _zygote_script(), ZYGOTE_DIR).items():
            path = os.path.join(self.root, rel)
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            with open(path, "xb") as handle:
                handle.write(content.encode() if isinstance(content, str) else content)
            os.chmod(path, 0o444)
        self.sandbox = create_sandbox(self.backend, SandboxSpec(
            limits=self.limits, shared_dir=self.root, image=self.image, user_group=self.group))
        await self.sandbox.start()
        settings = {"socket": f"{self.inside}/{ZYGOTE_SOCKET}", "sweep": self.backend != "none", "idle": IDLE_S}
        self.server = asyncio.ensure_future(self.sandbox.exec(
            stable_layout(_run_file(f"{self.inside}/{ZYGOTE_DIR}/{ZYGOTE_NAME}")), timeout=LIFETIME_S + 60,
            stdin=json.dumps(settings)))
        socket_path = self.address()
        deadline = time.monotonic() + 60
        # The first connection is the lifeline: the runner exits when it closes (close(), or this pool's event
        # loop found closed). The socket's file is there from bind(); connect succeeds from listen().
        while self.lifeline is None:
            if self.server.done():
                raise SandboxError(f"the warm trusted runner exited: {self.server.result().describe()[-800:]}")
            if time.monotonic() > deadline:
                raise SandboxError("the warm trusted runner did not start listening within 60 s")
            lifeline = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                lifeline.connect(socket_path)  # a Unix socket: refused or accepted into the backlog at once
            except OSError:
                lifeline.close()
                await asyncio.sleep(0.002)
                continue
            self.lifeline = lifeline
        self.started = self.last_used = time.monotonic()

    def address(self) -> str:
        """The runner's socket as this process reaches it, in fewer than 108 bytes whatever ``TMPDIR`` is.

        A Unix socket's path must fit ``sun_path``: under a long temporary folder (pytest's, a job
        scheduler's) the host's path to the runner's socket does not, and every verification would wait for a
        runner it can never reach. The folder is reached through its descriptor in ``/proc/self/fd`` instead.
        """
        path = os.path.join(self.root, ZYGOTE_SOCKET)
        if len(os.fsencode(path)) < 100:
            return path
        if self.root_fd is None:
            self.root_fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        return f"/proc/self/fd/{self.root_fd}/{ZYGOTE_SOCKET}"

    def let_go(self) -> None:
        """Close the lifeline: the runner's process exits (synchronous: usable after its event loop closed)."""
        if self.lifeline is not None:
            self.lifeline.close()
            self.lifeline = None
        if self.root_fd is not None:
            os.close(self.root_fd)
            self.root_fd = None

    async def run(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one verification; its exit status and output (or ``error``)."""
        self.runs += 1
        reader, writer = await asyncio.open_unix_connection(self.address())
        try:
            data = json.dumps(request).encode()
            writer.write(_LENGTH.pack(len(data)) + data)
            await writer.drain()
            # The runner enforces the time limit itself; this one only covers a runner that died or hung.
            header = await asyncio.wait_for(reader.readexactly(_LENGTH.size), timeout_s + 30)
            (size,) = _LENGTH.unpack(header)
            answer: dict[str, Any] = json.loads(await asyncio.wait_for(reader.readexactly(size), 30))
            return answer
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def close(self) -> None:
        self.let_go()
        if self.server is not None:
            self.server.cancel()
            await asyncio.gather(self.server, return_exceptions=True)
        if self.sandbox is not None:
            await self.sandbox.close()
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)


class _Pool:
    """Idle warm runners of one event loop, by (backend, image, limits)."""

    def __init__(self) -> None:
        self.idle: dict[tuple[str, str | None, SandboxLimits], list[WarmRunner]] = {}
        self.closing: set[asyncio.Future[None]] = set()
        # Cancelled when the loop shuts down (asyncio.run cancels what is left): then it closes the idle runners.
        self.keeper = asyncio.ensure_future(self._keep())

    async def _keep(self) -> None:
        try:
            await asyncio.get_running_loop().create_future()  # never set
        finally:
            await self.close_all()

    async def close_all(self) -> None:
        runners = [r for idle in self.idle.values() for r in idle]
        self.idle.clear()
        await asyncio.gather(*(r.close() for r in runners), *self.closing, return_exceptions=True)

    async def acquire(self, backend: str, image: str | None, limits: SandboxLimits, timeout_s: float) -> WarmRunner:
        idle = self.idle.setdefault((backend, image, limits), [])
        while idle:
            runner = idle.pop()
            if runner.usable(timeout_s):
                return runner
            self._close(runner)
        runner = WarmRunner(backend, image, limits)
        try:
            await runner.start()
        except BaseException:
            await runner.close()
            raise
        return runner

    def release(self, runner: WarmRunner, healthy: bool) -> None:
        runner.last_used = time.monotonic()
        idle = self.idle.setdefault((runner.backend, runner.image, runner.limits), [])
        if healthy and len(idle) < _MAX_IDLE_PER_KEY:
            idle.append(runner)
        else:
            self._close(runner)

    def _close(self, runner: WarmRunner) -> None:
        task = asyncio.ensure_future(runner.close())
        self.closing.add(task)
        task.add_done_callback(self.closing.discard)


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()


def _pool() -> _Pool:
    loop = asyncio.get_running_loop()
    for other in [other for other in _POOLS if other.is_closed()]:
        # A loop closed with runners still idle (nobody called close_warm_runners): they exit now.
        for runner in (r for idle in _POOLS.pop(other).idle.values() for r in idle):
            runner.let_go()
    if loop not in _POOLS:
        _POOLS[loop] = _Pool()
    return _POOLS[loop]


async def close_warm_runners() -> None:
    """Close this event loop's idle warm runners (they also exit by themselves after :data:`IDLE_S`)."""
    pool = _POOLS.pop(asyncio.get_running_loop(), None)
    if pool is None:
        return
    pool.keeper.cancel()
    await asyncio.gather(pool.keeper, return_exceptions=True)


async def run_warm(task: Task, solution: Mapping[str, str | bytes], args: list[str] | None, *, sandbox: str,
                   limits: SandboxLimits, timeout_s: float, call_timeout_s: float | None = None,
                   command: str | None = None) -> IsolatedRun:
    """:func:`._isolation.run_isolated` with the trusted side forked from a warm runner (same arguments)."""
    data, tests = trusted_files(task)
    modules = module_names(solution, {**data, **tests})
    pool = _pool()
    # The runner itself is not charged the run's CPU limit (its imports and the cleanup between runs add up over
    # its life): its sandbox gets a generous one, and each forked child lowers RLIMIT_CPU to the run's limit
    # (a fork's CPU time starts at zero), so a run stopped by it is named as before.
    runner = await pool.acquire(sandbox, task.image, dataclasses.replace(limits, cpu_seconds=RUNNER_CPU_S), timeout_s)
    nonce = secrets.token_hex(16)
    name = nonce[:12]  # short: a socket's path must fit 108 bytes where paths are the host's (none)
    channel, channel_in = os.path.join(runner.root, name), f"{runner.inside}/{name}"
    healthy = False
    try:
        os.mkdir(channel, 0o1777)
        os.chmod(channel, 0o1777)
        os.mkdir(os.path.join(channel, SCRATCH_NAME), 0o1777)
        os.chmod(os.path.join(channel, SCRATCH_NAME), 0o1777)
        place_server(channel)
        scratch = f"{channel_in}/{SCRATCH_NAME}"
        call_timeout = call_timeout_s or timeout_s / 2
        programs = sorted(p for p in solution if p not in data and p not in tests)
        boundary = {"socket": f"{channel_in}/{SOCKET_NAME}", "modules": modules, "programs": programs,
                    "scratch": scratch, "call_timeout": call_timeout, "connect_timeout": timeout_s}
        # The bootstrap every Python process of the test command loads (the runner's own code is preloaded).
        bootstrap = {**_with_bytecode("sitecustomize.py", bootstrap_source()),
                     f"{BOUNDARY_DIR}/{SETTINGS_NAME}": json.dumps(boundary)}
        markers = package_markers(solution, {**data, **tests})
        # Into the runner's workspace, empty between verifications: where a fresh trusted sandbox has them.
        assert runner.sandbox is not None
        await asyncio.gather(*(runner.sandbox.write_file(rel, content)
                               for rel, content in {**data, **markers, **tests, **bootstrap}.items()))
        if args is not None:
            settings: dict[str, Any] = {"socket": boundary["socket"], "modules": modules,
                                        "args": [*args, f"--basetemp={scratch}/pytest"], "nonce": nonce,
                                        "call_timeout": call_timeout, "connect_timeout": boundary["connect_timeout"]}
        else:
            settings = {"nonce": nonce, "command": command}
        request = {"mode": "pytest" if args is not None else "command", "settings": settings,
                   "timeout": timeout_s, "max_output": limits.max_output_bytes, "cpu_seconds": limits.cpu_seconds}
        # The solution sandbox's shared directory is this verification's channel alone, at the same path.
        solution_box = create_sandbox(sandbox, SandboxSpec(
            files=dict(solution), readonly_files=test_data_files(task), limits=limits, shared_dir=channel,
            shared_mount=channel_in, image=task.image, user_group=runner.group,
            no_symlinks=True))  # (links in the scratch area: see run_isolated)
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(solution_box.close)
            # The trusted child starts at once and waits for the solution's socket while its sandbox starts.
            trusted = asyncio.ensure_future(runner.run(request, timeout_s))
            try:
                await solution_box.start()
                server_settings = {"socket": f"{channel_in}/{SOCKET_NAME}", "scratch": scratch,
                                   "paths": ["."] + (["src"] if any(p.startswith("src/") for p in solution) else [])}
                server = asyncio.ensure_future(solution_box.exec(
                    server_command(channel_in), timeout=timeout_s + 5, stdin=json.dumps(server_settings)))
                try:
                    answer = await await_trusted(trusted, server, os.path.join(channel, SOCKET_NAME))
                finally:
                    server.cancel()
                    await asyncio.gather(server, return_exceptions=True)
            finally:
                if not trusted.done():
                    trusted.cancel()
                    await asyncio.gather(trusted, return_exceptions=True)
        if "error" in answer:
            raise SandboxError(f"the warm trusted runner failed: {answer['error']}")
        healthy = not answer.get("retire")
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
        raise SandboxError(f"the warm trusted runner was lost: {type(exc).__name__}: {exc}") from exc
    finally:
        shutil.rmtree(channel, ignore_errors=True)
        pool.release(runner, healthy)
    result = ExecResult(exit_code=int(answer["exit"]), stdout=answer["stdout"], stderr=answer["stderr"],
                        timed_out=bool(answer["timed_out"]), output_truncated=bool(answer["truncated"]))
    return parse_report(result, nonce, modules, command)
