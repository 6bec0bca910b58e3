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
verification's settings), sent with its request and written by the runner
into its workspace, empty between verifications, so every path is where a
fresh trusted sandbox has it; and a channel folder in the runner's shared
directory (the socket, the scratch area), which is the solution sandbox's
whole shared directory, mounted at the same path there. No solution sandbox
sees the runner's socket, its script, or another verification's channel. A
runner serves one verification at a time, and between two it kills every
process its sandbox holds besides itself and empties its workspace,
``/tmp`` and ``/dev/shm``; the child's memory is its own (a fork). Runners are pooled per event loop, sandbox
backend, image and limits; an idle one exits by itself after
:data:`IDLE_S`, a used-up one (age, runs) is closed.

Backends: bwrap, none and docker (:data:`._isolation.WARM_BACKENDS`). On
docker the runner is a long-lived container, and the solution side is cheap
too: each runner keeps its next verification's channel folder made and a
solution container started ahead with that folder (and nothing else of the
host) mounted (:meth:`~factory.sandbox.DockerSandbox.prestart`), seeded with
the solution's files when the verification comes and removed after it,
off the caller's path; it is never reused. A runner that cannot start is
not a verdict: :func:`._isolation.run_isolated` runs that verification with
a fresh trusted sandbox instead (:class:`WarmUnavailable`), and the pool
does not try that configuration again for :data:`RETRY_S`.
"""

from __future__ import annotations

import asyncio
import base64
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
from factory.sandbox import (
    DockerSandbox,
    ExecResult,
    Sandbox,
    SandboxLimits,
    SandboxSpec,
    create_sandbox,
    sandbox_folder,
)
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
    default_call_timeout,
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

__all__ = ["IDLE_S", "WarmRunner", "WarmUnavailable", "close_warm_runners", "run_warm"]

#: A warm runner with no request for this long exits by itself (so a pool whose event loop is gone leaves no
#: process behind); the pool stops handing it out a few seconds before.
IDLE_S = 300.0
#: A runner is retired past this age or this many verifications (its sandbox's own time limit is a bit longer).
LIFETIME_S, MAX_RUNS = 1800.0, 500
_MAX_IDLE_PER_KEY = 8
#: After a runner of a configuration failed to start, its verifications use fresh trusted sandboxes this long.
RETRY_S = 60.0
#: Trusted files up to this many bytes travel with the request (one message); more are written by the sandbox.
_INLINE_BYTES = 16 << 20
ZYGOTE_DIR, ZYGOTE_NAME = ".factory-zygote", "factory-zygote.py"
_LENGTH = struct.Struct(">I")


def _zygote_script() -> str:
    return _script("_program_server", "_boundary", "_trusted_runner", "_zygote")


class WarmUnavailable(SandboxError):
    """No warm runner could start for this configuration (nothing ran): use a fresh trusted sandbox."""


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
        # docker: the next verification's channel folder and the solution sandbox started ahead for it, with
        # the limits and image it was started for.
        self.spare: tuple[str, SandboxLimits, str | None, Sandbox] | None = None

    @property
    def inside(self) -> str:
        """The shared directory's path inside the runner's sandbox."""
        assert self.sandbox is not None and self.sandbox.shared_path is not None
        return self.sandbox.shared_path

    def usable(self, timeout_s: float) -> bool:
        now = time.monotonic()
        return (self.server is not None and not self.server.done() and now - self.last_used < IDLE_S - 5
                and now - self.started + timeout_s + 60 < LIFETIME_S and self.runs < MAX_RUNS)

    async def start(self, spare: SandboxLimits | None = None) -> None:
        """Start the runner (and, with ``spare`` limits, its first solution sandbox meanwhile: see prepare_spare)."""
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
        if spare is not None:
            self.prepare_spare(spare, self.image)
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
            except PermissionError as exc:  # the runner's user's socket (this process is not root): never
                lifeline.close()
                raise SandboxError(f"the warm trusted runner's socket cannot be reached: {exc}") from exc
            except OSError:
                lifeline.close()
                await asyncio.sleep(0.002)
                continue
            self.lifeline = lifeline
        self.started = self.last_used = time.monotonic()

    def channel(self) -> str:
        """A new channel folder in the shared directory (socket, scratch area, the front door's script); its name."""
        name = secrets.token_hex(6)  # short: a socket's path must fit 108 bytes where paths are the host's (none)
        channel = os.path.join(self.root, name)
        os.mkdir(channel, 0o1777)
        os.chmod(channel, 0o1777)
        os.mkdir(os.path.join(channel, SCRATCH_NAME), 0o1777)
        os.chmod(os.path.join(channel, SCRATCH_NAME), 0o1777)
        place_server(channel)
        return name

    def solution_spec(self, name: str, limits: SandboxLimits, image: str | None, **files: Any) -> SandboxSpec:
        """The spec of a solution sandbox whose whole shared directory is channel ``name``, at the same path."""
        return SandboxSpec(limits=limits, shared_dir=os.path.join(self.root, name),
                           shared_mount=f"{self.inside}/{name}", image=image, user_group=self.group,
                           no_symlinks=True, **files)  # (links in the scratch area: see run_isolated)

    def take_channel(self, limits: SandboxLimits, image: str | None) -> tuple[str, bool]:
        """This verification's channel: the spare one if it was made for ``limits`` and ``image`` (its solution
        sandbox started ahead), else a new one; and whether it is the spare."""
        spare, self.spare = self.spare, None
        if spare is not None:
            name, spare_limits, spare_image, box = spare
            if (spare_limits, spare_image) == (limits, image):
                return name, True
            assert isinstance(box, DockerSandbox)
            box.cancel_prestart()
            shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
        return self.channel(), False

    def prepare_spare(self, limits: SandboxLimits, image: str | None) -> None:
        """docker: make the next verification's channel and start its solution container now, in the background
        (the docker pool's reservation: its container holds nothing but that channel until the files come)."""
        if self.backend != "docker" or self.spare is not None or self.sandbox is None:
            return
        name = self.channel()
        box = create_sandbox(self.backend, self.solution_spec(name, limits, image))
        assert isinstance(box, DockerSandbox)
        box.prestart()
        self.spare = (name, limits, image, box)

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
        spare, self.spare = self.spare, None
        if spare is not None:
            assert isinstance(spare[3], DockerSandbox)
            spare[3].cancel_prestart()
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
        self.failed: dict[tuple[str, str | None, SandboxLimits], float] = {}  # when a runner last failed to start
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

    async def acquire(self, backend: str, image: str | None, limits: SandboxLimits, timeout_s: float,
                      spare: SandboxLimits | None = None) -> WarmRunner:
        """An idle runner of this configuration, or a new one (its first solution sandbox, for ``spare`` limits,
        started with it on docker)."""
        idle = self.idle.setdefault((backend, image, limits), [])
        while idle:
            runner = idle.pop()
            if runner.usable(timeout_s):
                return runner
            self._close(runner)
        failed = self.failed.get((backend, image, limits))
        if failed is not None and time.monotonic() - failed < RETRY_S:
            raise WarmUnavailable("a warm trusted runner of this configuration failed to start recently")
        runner = WarmRunner(backend, image, limits)
        try:
            await runner.start(spare)
        except SandboxError as exc:
            await runner.close()
            self.failed[(backend, image, limits)] = time.monotonic()
            raise WarmUnavailable(f"the warm trusted runner did not start: {exc}") from exc
        except BaseException:
            await runner.close()
            raise
        self.failed.pop((backend, image, limits), None)
        return runner

    def release(self, runner: WarmRunner, healthy: bool) -> None:
        runner.last_used = time.monotonic()
        idle = self.idle.setdefault((runner.backend, runner.image, runner.limits), [])
        if healthy and len(idle) < _MAX_IDLE_PER_KEY:
            idle.append(runner)
        else:
            self._close(runner)

    def _close(self, runner: WarmRunner) -> None:
        self.later(runner.close())

    def later(self, closing: Any) -> None:
        """Run ``closing`` (a coroutine: a closing) off the caller's path; :meth:`close_all` waits for it."""
        task = asyncio.ensure_future(closing)
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


async def _dispose(box: Sandbox, channel: str) -> None:
    """Close a verification's solution sandbox, then remove its channel folder (nothing writes it any more)."""
    try:
        await box.close()
    finally:
        shutil.rmtree(channel, ignore_errors=True)


async def run_warm(task: Task, solution: Mapping[str, str | bytes], args: list[str] | None, *, sandbox: str,
                   limits: SandboxLimits, timeout_s: float, call_timeout_s: float | None = None,
                   command: str | None = None, inactivity_s: float | None = None) -> IsolatedRun:
    """:func:`._isolation.run_isolated` with the trusted side forked from a warm runner (same arguments).

    Raises:
        WarmUnavailable: No runner could start (nothing ran): the caller uses a fresh trusted sandbox.
        SandboxError: The runner or the solution's sandbox failed during the verification.
    """
    data, tests = trusted_files(task)
    modules = module_names(solution, {**data, **tests})
    pool = _pool()
    # The runner itself is not charged the run's CPU limit (its imports and the cleanup between runs add up over
    # its life): its sandbox gets a generous one, and each forked child lowers RLIMIT_CPU to the run's limit
    # (a fork's CPU time starts at zero), so a run stopped by it is named as before.
    runner = await pool.acquire(sandbox, task.image, dataclasses.replace(limits, cpu_seconds=RUNNER_CPU_S), timeout_s,
                                spare=limits)
    nonce = secrets.token_hex(16)
    healthy = False
    channel = ""
    solution_box: Sandbox | None = None
    try:
        name, _ = runner.take_channel(limits, task.image)
        channel, channel_in = os.path.join(runner.root, name), f"{runner.inside}/{name}"
        runner.prepare_spare(limits, task.image)  # the next verification's, while this one runs
        scratch = f"{channel_in}/{SCRATCH_NAME}"
        call_timeout = call_timeout_s or default_call_timeout(timeout_s, inactivity_s)
        programs = sorted(p for p in solution if p not in data and p not in tests)
        boundary = {"socket": f"{channel_in}/{SOCKET_NAME}", "modules": modules, "programs": programs,
                    "scratch": scratch, "call_timeout": call_timeout, "connect_timeout": timeout_s}
        # The bootstrap every Python process of the test command loads (the runner's own code is preloaded).
        bootstrap = {**_with_bytecode("sitecustomize.py", bootstrap_source()),
                     f"{BOUNDARY_DIR}/{SETTINGS_NAME}": json.dumps(boundary)}
        markers = package_markers(solution, {**data, **tests})
        # Into the runner's workspace, empty between verifications: where a fresh trusted sandbox has them. The
        # runner writes them itself from the request (no round trip per file: one exec each on docker).
        trusted = {rel: content.encode() if isinstance(content, str) else content
                   for rel, content in {**data, **markers, **tests, **bootstrap}.items()}
        inline = sum(map(len, trusted.values())) <= _INLINE_BYTES
        if not inline:
            assert runner.sandbox is not None
            await asyncio.gather(*(runner.sandbox.write_file(rel, content) for rel, content in trusted.items()))
        if args is not None:
            settings: dict[str, Any] = {"socket": boundary["socket"], "modules": modules,
                                        "args": [*args, f"--basetemp={scratch}/pytest"], "nonce": nonce,
                                        "call_timeout": call_timeout, "connect_timeout": boundary["connect_timeout"],
                                        "inactivity": inactivity_s}
        else:
            settings = {"nonce": nonce, "command": command}
        request = {"mode": "pytest" if args is not None else "command", "settings": settings,
                   "timeout": timeout_s, "max_output": limits.max_output_bytes, "cpu_seconds": limits.cpu_seconds,
                   "files": {rel: base64.b64encode(content).decode() for rel, content in trusted.items()}
                   if inline else {}}
        # The solution sandbox's shared directory is this verification's channel alone, at the same path
        # (docker: the container started ahead for this channel, if it was made for these limits and image).
        solution_box = create_sandbox(sandbox, runner.solution_spec(
            name, limits, task.image, files=dict(solution), readonly_files=test_data_files(task)))
        # The trusted child starts at once and waits for the solution's socket while its sandbox starts.
        trusted_run = asyncio.ensure_future(runner.run(request, timeout_s))
        try:
            await solution_box.start()
            server_settings = {"socket": f"{channel_in}/{SOCKET_NAME}", "scratch": scratch,
                               "paths": ["."] + (["src"] if any(p.startswith("src/") for p in solution) else [])}
            server = asyncio.ensure_future(solution_box.exec(
                server_command(channel_in), timeout=timeout_s + 5, stdin=json.dumps(server_settings)))
            try:
                answer = await await_trusted(trusted_run, server, os.path.join(channel, SOCKET_NAME))
            finally:
                server.cancel()
                await asyncio.gather(server, return_exceptions=True)
        finally:
            if not trusted_run.done():
                trusted_run.cancel()
                await asyncio.gather(trusted_run, return_exceptions=True)
        if "error" in answer:
            raise SandboxError(f"the warm trusted runner failed: {answer['error']}")
        healthy = not answer.get("retire")
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
        raise SandboxError(f"the warm trusted runner was lost: {type(exc).__name__}: {exc}") from exc
    finally:
        if solution_box is not None and sandbox == "docker":
            # Its container's removal is the engine's slow part, and nothing of it is read any more: off the
            # caller's path (the channel is removed once the container is gone; the container sees nothing else).
            pool.later(_dispose(solution_box, channel))
        elif solution_box is not None:
            await _dispose(solution_box, channel)
        elif channel:
            shutil.rmtree(channel, ignore_errors=True)
        pool.release(runner, healthy)
    result = ExecResult(exit_code=int(answer["exit"]), stdout=answer["stdout"], stderr=answer["stderr"],
                        timed_out=bool(answer["timed_out"]), output_truncated=bool(answer["truncated"]))
    return parse_report(result, nonce, modules, command)
