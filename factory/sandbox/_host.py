"""Host-side machinery shared by the process-based backends (bwrap, none).

- :class:`HostWorkspace`: a workspace directory on the host (in the
  process's sandbox folder, see :func:`~factory.sandbox.sandbox_folder`),
  seeded from the spec, with file operations confined to it. They run as the host user, on a
  tree the sandbox's processes write, so they trust nothing in it: they are
  :class:`~factory.sandbox._fdtree.FdTree`'s (no link followed, no special
  file opened), and the backends run them in a worker thread under a
  timeout, never in the event loop. Read-only files keep a private copy outside the workspace, for
  backends that mount them from somewhere the sandbox cannot change.
- :func:`run_limited`: start a process with rlimits in its own session, read
  its output up to a cap, and kill the whole process group on timeout or
  output flood.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from factory.errors import SandboxError, SandboxPathError
from factory.sandbox._base import ExecResult, SandboxLimits, WorkspaceFiles
from factory.sandbox._fdtree import _O_DIR, FdTree, _as_bytes, workspace_parts
from factory.sandbox._scratch import sandbox_folder

__all__ = ["HostWorkspace", "host_file_call", "processes_of", "run_limited", "sandbox_environment"]

_FILE_OP_TIMEOUT_S = 30.0  # a host-side file operation never holds a branch longer

T = TypeVar("T")


def sandbox_environment(home: str, python_bin: str | None) -> dict[str, str]:
    """A fresh environment: nothing of the host's, API keys least of all."""
    path = ":".join(p for p in (python_bin, "/usr/local/bin", "/usr/bin", "/bin") if p)
    return {
        "PATH": path,
        "HOME": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONHASHSEED": "0",
    }


async def host_file_call(call: Callable[[], T], what: str, timeout: float = _FILE_OP_TIMEOUT_S) -> T:
    """Run a blocking host-side file operation in a worker thread, under a timeout.

    Raises:
        SandboxPathError: It took longer than ``timeout`` (the branch goes on; the tool call fails).
    """
    try:
        return await asyncio.wait_for(asyncio.to_thread(call), timeout)
    except asyncio.TimeoutError:
        raise SandboxPathError(f"{what}: timed out after {timeout:.0f}s") from None


class HostWorkspace(FdTree):
    """A workspace directory on the host, every operation relative to a descriptor of its root.

    Attributes:
        root: The workspace directory, as this process reaches it (set by :meth:`create`).
        private: A directory beside it the sandbox never sees, holding the
            read-only files' pristine copies under ``readonly/`` (and whatever
            else a backend must keep out of reach).
        readonly: Read-only files: workspace-relative path -> pristine copy in :attr:`private`.
    """

    error = SandboxPathError

    def __init__(self, prefix: str = "factory-sbx-"):
        super().__init__()
        self._prefix = prefix
        self.root: Path | None = None
        self.private: Path | None = None
        self.readonly: dict[str, Path] = {}  # type: ignore[assignment]  # the pristine copies, by path
        self._owns_root = True

    def create(
        self,
        files: Mapping[str, str | bytes],
        readonly_files: Mapping[str, str | bytes],
        owner: int | None = None,
        root_fd: int | None = None,
    ) -> Path:
        """Make the directory (or adopt ``root_fd``, a descriptor of an empty directory) and seed it.

        ``files`` and directories are owned by ``owner`` (when given);
        ``readonly_files`` stay owned by the host user with mode 0444, file
        operations refuse to write them, and a pristine copy of each is kept
        under :attr:`private`. Backends mount those copies read-only on top.
        An adopted descriptor is closed by :meth:`remove`; the directory is the caller's to delete.
        """
        self._owns_root = root_fd is None
        folder = sandbox_folder()  # the next fork's sweep removes what remove() never got to, if this process dies
        if root_fd is None:
            self.root = Path(tempfile.mkdtemp(prefix=self._prefix, dir=folder)).resolve()
            self._root_fd = os.open(self.root, _O_DIR)
        else:
            self.root = Path(f"/proc/{os.getpid()}/fd/{root_fd}")
            self._root_fd = root_fd
        self.private = Path(tempfile.mkdtemp(prefix=self._prefix + "private-", dir=folder)).resolve()
        if owner is not None:
            os.fchown(self._root_fd, owner, owner)
        for rel, content in files.items():
            self.write(rel, content, owner=owner)
        for rel, content in readonly_files.items():
            parts = workspace_parts(rel, SandboxPathError)
            key = "/".join(parts)
            source = self.private.joinpath("readonly", *parts)
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_bytes(_as_bytes(content))
            source.chmod(0o444)
            self.write(key, content, owner=owner, mode=0o444, chown_file=False)
            self.readonly[key] = source
        return self.root

    def remove(self) -> None:
        """Delete the directory and the private one (idempotent)."""
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None
        if self.root is not None and self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)
        if self.private is not None:
            shutil.rmtree(self.private, ignore_errors=True)
        self.root = self.private = None

    def _root(self) -> int:
        if self._root_fd is None:
            raise SandboxError("sandbox is not started")
        return self._root_fd

    def collect(self, max_bytes: int, max_entries: int = 100_000) -> WorkspaceFiles:
        """Everything under the root: regular files read up to ``max_bytes`` in all, links and special files named."""
        found = FdTree.collect(self, max_bytes, max_entries)
        return WorkspaceFiles(files=found.files, symlinks=found.symlinks, special=found.special,
                              oversized=found.oversized, truncated=found.truncated)

    def clear_readonly_paths(self, owner: int | None = None) -> None:
        """Make every read-only file's path a chain of real directories ending in a regular file or nothing.

        A backend that mounts the pristine copies over the workspace calls
        this before each command, while nothing of the sandbox runs: a link or
        file planted where a parent directory belongs is removed (and the
        directory made), and a link, directory or special file planted in a
        read-only file's place is removed, so the mount lands exactly there
        and nowhere else. A regular file in its place stays (the mount covers
        it; tamper checks still see it).
        """
        for rel in sorted(self.readonly):
            parts = rel.split("/")
            fd = os.dup(self._root())
            try:
                for name in parts[:-1]:
                    found = self._lstat(fd, name)
                    if found is not None and not stat.S_ISDIR(found.st_mode):
                        os.unlink(name, dir_fd=fd)
                        found = None
                    if found is None:
                        os.mkdir(name, 0o755, dir_fd=fd)
                        if owner is not None:
                            os.chown(name, owner, owner, dir_fd=fd, follow_symlinks=False)
                    child = os.open(name, _O_DIR, dir_fd=fd)
                    os.close(fd)
                    fd = child
                found = self._lstat(fd, parts[-1])
                if found is not None and stat.S_ISDIR(found.st_mode):
                    shutil.rmtree(parts[-1], dir_fd=fd)
                elif found is not None and not stat.S_ISREG(found.st_mode):
                    os.unlink(parts[-1], dir_fd=fd)
            finally:
                os.close(fd)


def processes_of(uid: int) -> int:
    """How many processes ``uid`` runs now (for an RLIMIT_NPROC relative to them)."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:
                continue
    return count


def _limited_argv(argv: Sequence[str], limits: SandboxLimits, nproc: int | None) -> tuple[list[str], object]:
    """Apply rlimits through util-linux ``prlimit`` when present, else a preexec function.

    A ``preexec_fn`` forces CPython to ``fork()`` instead of ``vfork()``, and
    ``fork()`` costs more the more memory the runner holds; ``prlimit`` keeps
    sandbox start flat.
    """
    memory = limits.memory_mb * 1024 * 1024
    file_size = limits.max_file_mb * 1024 * 1024
    prlimit = shutil.which("prlimit")
    if prlimit is not None:
        flags = [f"--as={memory}", f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}",
                 f"--fsize={file_size}", "--core=0"]
        if nproc is not None:
            flags.append(f"--nproc={nproc}")
        return [prlimit, *flags, "--", *argv], None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    return list(argv), apply


async def _read_capped(stream: asyncio.StreamReader, cap: int, flood: asyncio.Event) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            break
        if size < cap:
            chunks.append(chunk[: cap - size])
        size += len(chunk)
        if size > cap:
            # Keep draining (and discarding) until EOF: asyncio reports the
            # process finished only once its pipes are closed.
            flood.set()
    return b"".join(chunks)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def run_limited(
    argv: Sequence[str],
    *,
    cwd: str,
    env: dict[str, str],
    limits: SandboxLimits,
    timeout: float,
    stdin: bytes | None,
    nproc: int | None,
    pass_fds: Sequence[int] = (),
) -> ExecResult:
    """Run ``argv`` with rlimits in a new session; kill the group on timeout or flood.

    ``pass_fds`` are kept open in the child (under the same numbers).

    Raises:
        SandboxError: If the program cannot be started at all.
    """
    started = time.monotonic()
    command, preexec = _limited_argv(argv, limits, nproc)
    try:
        proc = await asyncio.create_subprocess_exec(
            *command,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            preexec_fn=preexec,
            pass_fds=tuple(pass_fds),
        )
    except OSError as exc:
        raise SandboxError(f"cannot start {argv[0]}: {exc}") from exc

    flood = asyncio.Event()
    assert proc.stdout is not None and proc.stderr is not None
    out_task = asyncio.ensure_future(_read_capped(proc.stdout, limits.max_output_bytes, flood))
    err_task = asyncio.ensure_future(_read_capped(proc.stderr, limits.max_output_bytes, flood))
    flood_task = asyncio.ensure_future(flood.wait())

    async def feed() -> None:
        if stdin is not None and proc.stdin is not None:
            try:
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                proc.stdin.close()

    feed_task = asyncio.ensure_future(feed())
    wait_task = asyncio.ensure_future(proc.wait())
    timed_out = False
    try:
        done, _ = await asyncio.wait({wait_task, flood_task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            timed_out = True
            _kill_group(proc.pid)
        elif flood_task in done:
            _kill_group(proc.pid)
        await wait_task
        # Orphans still holding the pipes (none backend) must not keep us waiting.
        _kill_group(proc.pid)
        stdout, stderr = await asyncio.wait_for(asyncio.gather(out_task, err_task), timeout=10)
    except BaseException:
        # Cancelled mid-command (an interrupted run): kill the tree and reap it,
        # so no process or transport outlives the branch.
        _kill_group(proc.pid)
        for task in (out_task, err_task, feed_task):
            task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(wait_task), 5)
        except BaseException:
            wait_task.cancel()
        # The readers were cancelled, so nothing closes the pipes: close them here, while the loop still runs
        # (a transport collected after its loop closed complains that the loop is closed).
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()
        raise
    finally:
        flood_task.cancel()
        feed_task.cancel()
    return ExecResult(
        exit_code=proc.returncode if proc.returncode is not None else -signal.SIGKILL,
        stdout=stdout.decode("utf-8", errors="replace"),
        stderr=stderr.decode("utf-8", errors="replace"),
        timed_out=timed_out,
        output_truncated=flood.is_set(),
        duration_s=time.monotonic() - started,
    )
