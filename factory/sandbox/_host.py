"""Host-side machinery shared by the process-based backends (bwrap, none).

- :class:`HostWorkspace`: a workspace directory on the host, seeded from the
  spec, with file operations confined to it (symlinks that point out are
  refused: the file tools run as the host user, not as the sandbox user).
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
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from factory.errors import SandboxError, SandboxPathError
from factory.sandbox._base import ExecResult, SandboxLimits

__all__ = ["HostWorkspace", "processes_of", "run_limited", "sandbox_environment"]

_READ_CAP = 4_000_000  # bytes read_file returns at most


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


class HostWorkspace:
    """A workspace directory on the host.

    Attributes:
        root: The workspace directory (created by :meth:`create`).
    """

    def __init__(self, prefix: str = "factory-sbx-"):
        self._prefix = prefix
        self.root: Path | None = None
        self.readonly: set[Path] = set()

    def create(
        self, files: Mapping[str, str], readonly_files: Mapping[str, str], owner: int | None = None
    ) -> Path:
        """Make the directory and seed it.

        ``files`` are owned by ``owner`` (when given); ``readonly_files`` stay
        owned by the host user with mode 0444, and file operations refuse to
        write them. Backends mount them read-only on top, where they can.
        """
        self.root = Path(tempfile.mkdtemp(prefix=self._prefix)).resolve()
        for rel, text in files.items():
            target = self.resolve(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        if owner is not None:
            for path in [self.root, *self.root.rglob("*")]:
                os.chown(path, owner, owner, follow_symlinks=False)
        for rel, text in readonly_files.items():
            target = self.resolve(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            target.chmod(0o444)
            self.readonly.add(target)
        return self.root

    def remove(self) -> None:
        """Delete the directory (idempotent)."""
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def resolve(self, rel: str) -> Path:
        """Map a workspace-relative path to the host, refusing any escape.

        Raises:
            SandboxPathError: For absolute paths, ``..`` escapes, or symlinks out.
        """
        if self.root is None:
            raise SandboxError("sandbox is not started")
        text = str(rel).strip()
        if text.startswith("/workspace/"):
            text = text[len("/workspace/"):]
        elif text == "/workspace":
            text = "."
        if not text or "\x00" in text or text.startswith("/"):
            raise SandboxPathError(f"path {rel!r} must be relative to the workspace")
        candidate = (self.root / text).resolve()
        if candidate != self.root and self.root not in candidate.parents:
            raise SandboxPathError(f"path {rel!r} is outside the workspace")
        return candidate

    def write(self, rel: str, content: str | bytes, owner: int | None = None) -> None:
        target = self.resolve(rel)
        if target == self.root or target in self.readonly:
            raise SandboxPathError(f"{rel} is read-only")
        missing = []
        parent = target.parent
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        data = content.encode("utf-8") if isinstance(content, str) else content
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except OSError as exc:  # a file where a directory should be, EROFS, ...
            raise SandboxPathError(f"cannot write {rel}: {exc.strerror or exc}") from exc
        if owner is not None:
            for path in [target, *missing]:
                os.chown(path, owner, owner, follow_symlinks=False)

    def read(self, rel: str) -> str:
        target = self.resolve(rel)
        if not target.is_file():
            raise SandboxPathError(f"no such file: {rel}")
        with open(target, "rb") as handle:
            data = handle.read(_READ_CAP + 1)
        text = data[:_READ_CAP].decode("utf-8", errors="replace")
        return text + ("\n[... file truncated ...]" if len(data) > _READ_CAP else "")

    def list(self, rel: str = ".") -> list[str]:
        base = self.resolve(rel)
        if not base.exists():
            raise SandboxPathError(f"no such directory: {rel}")
        assert self.root is not None
        if base.is_file():
            return [str(base.relative_to(self.root))]
        found = []
        for path in base.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                found.append(str(path.relative_to(self.root)))
        return sorted(found)


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
) -> ExecResult:
    """Run ``argv`` with rlimits in a new session; kill the group on timeout or flood.

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
