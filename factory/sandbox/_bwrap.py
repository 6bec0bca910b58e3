"""``bwrap``: each command in a fresh bubblewrap sandbox over the branch's workspace.

Every :meth:`BwrapSandbox.exec` is one ``bwrap`` invocation with new PID,
network, IPC and UTS namespaces, so nothing outlives a command and there is no
network at all. The root is an empty tmpfs holding only: read-only ``/usr``
(and its merged-usr links), a few files of ``/etc``, the Python prefixes
(read-only, so the same interpreter with pytest runs inside), a private
``/proc``, ``/dev`` and size-limited ``/tmp``, and the workspace at
``/workspace`` with the read-only files bound read-only on top.

Run as root, bwrap drops to a per-sandbox unprivileged uid (``setpriv``) so
that RLIMIT_NPROC bounds processes (the kernel never applies it to root) and
file modes hold. Run as a normal user, it uses a user namespace and bounds
processes relative to what the user already runs.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from factory.errors import SandboxError, SandboxUnavailableError
from factory.sandbox._base import ExecResult, Guarantee, Sandbox, SandboxSpec, register_sandbox
from factory.sandbox._host import HostWorkspace, processes_of, run_limited, sandbox_environment

__all__ = ["BwrapSandbox"]

_INSTALL_HINT = "bubblewrap is not installed; install it with: apt-get install bubblewrap (Debian/Ubuntu)"
_ETC_FILES = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")


class _UidPool:
    """Distinct unprivileged uids for concurrent sandboxes of this process.

    RLIMIT_NPROC counts every process of a uid, so each live sandbox gets its
    own; the base is derived from the pid so two runs rarely share one.
    """

    SIZE = 256

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: set[int] = set()
        self._next = 0

    def acquire(self) -> int:
        base = 1_000_000 + (os.getpid() % 10_000) * self.SIZE
        with self._lock:
            for offset in range(self.SIZE):
                slot = (self._next + offset) % self.SIZE
                if slot not in self._used:
                    self._used.add(slot)
                    self._next = slot + 1
                    return base + slot
            # More than SIZE live sandboxes: share a uid (a stricter joint limit).
            self._next += 1
            return base + self._next % self.SIZE

    def release(self, uid: int) -> None:
        with self._lock:
            self._used.discard((uid - 1_000_000) % self.SIZE)


_UIDS = _UidPool()


def _python_mounts(python: Path) -> list[Path]:
    """Directories that make ``python`` (a venv or not) work inside the sandbox."""
    mounts = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), python.resolve().parent.parent}
    if python.parent.parent.resolve() != python.resolve().parent.parent:
        mounts.add(python.parent.parent)  # a venv: its own prefix, besides the base interpreter's
    return sorted(p for p in mounts if not str(p).startswith("/usr/"))


@register_sandbox("bwrap")
class BwrapSandbox(Sandbox):
    """Bubblewrap sandbox (default on Linux): no network, clean env, read-only system."""

    guarantees = frozenset(Guarantee)

    def __init__(self, spec: SandboxSpec):
        super().__init__(spec)
        self._workspace = HostWorkspace("factory-bwrap-")
        self._uid: int | None = None
        self._prefix: list[str] = []
        self._python = Path(spec.python or sys.executable)

    async def start(self) -> None:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailableError(_INSTALL_HINT)
        privileged = os.geteuid() == 0
        setpriv = shutil.which("setpriv") if privileged else None
        if privileged and setpriv is None:
            raise SandboxUnavailableError("setpriv (util-linux) is needed to drop root inside bwrap")
        self._uid = _UIDS.acquire() if privileged else None
        root = self._workspace.create(dict(self.spec.files), dict(self.spec.readonly_files), owner=self._uid)
        self._prefix = self._command_prefix(bwrap, root, setpriv)

    def _command_prefix(self, bwrap: str, root: Path, setpriv: str | None) -> list[str]:
        limits = self.spec.limits
        argv = [
            bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr",
        ]
        if setpriv is None:
            argv.append("--unshare-user")
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                argv += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                argv += ["--ro-bind", top, top]
        for path in _ETC_FILES:
            if os.path.exists(path):
                argv += ["--ro-bind", path, path]
        # /proc, /dev and /tmp first: a later bind (a venv under /tmp, say) must land on top of them.
        argv += ["--proc", "/proc", "--dev", "/dev",
                 "--perms", "1777", "--size", str(limits.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        made: set[str] = {"/tmp"}
        for mount in _python_mounts(self._python):
            for parent in reversed(mount.parents):
                if str(parent) != "/" and str(parent) not in made:
                    made.add(str(parent))
                    argv += ["--perms", "0755", "--dir", str(parent)]
            argv += ["--ro-bind", str(mount), str(mount)]
        argv += ["--bind", str(root), "/workspace"]
        for path in sorted(self._workspace.readonly):
            argv += ["--ro-bind", str(path), "/workspace/" + str(path.relative_to(root))]
        argv += ["--chdir", "/workspace", "--clearenv"]
        for key, value in sandbox_environment("/workspace", str(self._python.parent)).items():
            argv += ["--setenv", key, value]
        if setpriv is not None and self._uid is not None:
            argv += [
                setpriv, f"--reuid={self._uid}", f"--regid={self._uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
            ]
        return argv

    async def close(self) -> None:
        self._workspace.remove()
        if self._uid is not None:
            _UIDS.release(self._uid)
            self._uid = None

    async def exec(
        self, command: str | Sequence[str], timeout: float | None = None, stdin: str | bytes | None = None
    ) -> ExecResult:
        if not self._prefix or self._workspace.root is None:
            raise SandboxError("sandbox is not started")
        argv = [*self._prefix, *(["sh", "-c", command] if isinstance(command, str) else command)]
        limits = self.spec.limits
        nproc = limits.max_processes if self._uid is not None else processes_of(os.getuid()) + limits.max_processes
        return await run_limited(
            argv,
            cwd=str(self._workspace.root),
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},  # bwrap's own env; --clearenv empties it inside
            limits=limits,
            timeout=timeout if timeout is not None else limits.timeout_s,
            stdin=stdin.encode() if isinstance(stdin, str) else stdin,
            nproc=nproc,
        )

    async def write_file(self, path: str, content: str | bytes) -> None:
        self._workspace.write(path, content, owner=self._uid)

    async def read_file(self, path: str) -> str:
        return self._workspace.read(path)

    async def list_files(self, path: str = ".") -> list[str]:
        return self._workspace.list(path)
