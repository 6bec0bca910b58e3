"""``bwrap``: each command in a fresh bubblewrap sandbox over the branch's workspace.

Every :meth:`BwrapSandbox.exec` is one ``bwrap`` invocation with new PID,
network, IPC and UTS namespaces, so nothing outlives a command and there is no
network at all. The root is an empty tmpfs holding only: read-only ``/usr``
(and its merged-usr links), an ``/etc`` of a few harmless host files
(alternatives, the loader cache, the time zone) and generated ones
(``passwd``/``group`` naming only the sandbox's user, ``nsswitch.conf``,
``hosts``), the Python prefixes (read-only, so the same interpreter with
pytest runs inside), a private ``/proc``, ``/dev``, and size-limited ``/dev/shm`` and ``/tmp``,
the workspace at ``/workspace`` with the read-only files bound read-only on
top, and the spec's ``shared_dir`` at ``/shared``.

What holds an attacker who controls every command (each closed hole has a
test in ``tests/sandbox/test_escapes.py`` and a conformance check):

- Read-only files are mounted from pristine copies in a host directory the
  sandbox never sees, and before every command each one's path in the
  workspace is cleared of links and special files planted on it, so a
  renamed folder or a symlink (bwrap resolves mount paths on the host side)
  can neither swap the tests nor mount a host file inside.
- A seccomp filter (:mod:`factory.sandbox._seccomp`) refuses namespace,
  mount, ptrace, bpf, keyring, module and similar calls: no user namespace
  can be made inside, so none of their kernel attack surface is reachable.
  Where bwrap itself runs in a user namespace, ``--disable-userns`` says the
  same a second time.
- The workspace is a tmpfs of ``limits.workspace_mb`` (bytes and inodes
  bounded), so the kernel, not a check after the fact, stops a command that
  fills it: a size-limited mount is the only quota that holds while a command
  runs (a post-exec size check lets it fill the host's disk first, and
  RLIMIT_FSIZE bounds one file, not how many). The tmpfs lives in a mount
  namespace of its own that only this process's descriptors keep alive, so
  no mount is left behind when the sandbox closes or this process dies; the
  host works from a descriptor of its root, and each command enters that
  namespace with ``nsenter`` before bwrap starts. It is backed by memory, so
  concurrent sandboxes times ``workspace_mb`` bounds what they can take.
- Host-side file operations never follow a link nor open a special file
  (:class:`~factory.sandbox._host.HostWorkspace`).

Run as root, bwrap drops to a per-sandbox unprivileged uid (``setpriv``) so
that RLIMIT_NPROC bounds processes (the kernel never applies it to root) and
file modes hold. Run as a normal user, the workspace's mount namespace
belongs to a user namespace of its own, which bwrap enters (and nests its
own in): RLIMIT_NPROC then counts the processes in that namespace, i.e. this
sandbox's alone.
"""

from __future__ import annotations

import asyncio
import functools
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from factory.errors import SandboxError, SandboxUnavailableError
from factory.sandbox._base import ExecResult, Guarantee, Sandbox, SandboxSpec, WorkspaceFiles, register_sandbox
from factory.sandbox._host import HostWorkspace, host_file_call, run_limited, sandbox_environment
from factory.sandbox._scratch import sandbox_folder
from factory.sandbox._seccomp import seccomp_program

__all__ = ["BwrapSandbox"]

_INSTALL_HINT = "bubblewrap is not installed; install it with: apt-get install bubblewrap (Debian/Ubuntu)"
#: Host files bound into /etc: none is a secret, each is something programs look up.
_ETC_FILES = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
              "/etc/protocols", "/etc/services")
_HOLDER_START_S = 10.0


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
        self._groups: dict[str, tuple[int, int]] = {}  # user group -> (uid, sandboxes holding it)

    def acquire(self, group: str | None = None) -> int:
        """A uid of its own, or the one the live sandboxes of ``group`` share (see ``SandboxSpec.user_group``)."""
        if group is not None:
            with self._lock:
                if group in self._groups:
                    uid, holders = self._groups[group]
                    self._groups[group] = (uid, holders + 1)
                    return uid
            uid = self.acquire()
            with self._lock:
                if group in self._groups:  # another thread made the group meanwhile: join it
                    self._used.discard((uid - 1_000_000) % self.SIZE)
                    shared, holders = self._groups[group]
                    self._groups[group] = (shared, holders + 1)
                    return shared
                self._groups[group] = (uid, 1)
            return uid
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

    def release(self, uid: int, group: str | None = None) -> None:
        with self._lock:
            if group is not None and group in self._groups:
                shared, holders = self._groups[group]
                if holders > 1:
                    self._groups[group] = (shared, holders - 1)
                    return
                del self._groups[group]
            self._used.discard((uid - 1_000_000) % self.SIZE)


_UIDS = _UidPool()


def _python_mounts(python: Path) -> list[Path]:
    """Directories that make ``python`` (a venv or not) work inside the sandbox."""
    mounts = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), python.resolve().parent.parent}
    if python.parent.parent.resolve() != python.resolve().parent.parent:
        mounts.add(python.parent.parent)  # a venv: its own prefix, besides the base interpreter's
    return sorted(p for p in mounts if not str(p).startswith("/usr/"))


class _WorkspaceMount:
    """The workspace's size-limited tmpfs, in a mount namespace of its own that descriptors keep alive.

    A short-lived process makes the namespace (``unshare``) and mounts the
    tmpfs; before it exits, this process opens the namespace (and, run
    unprivileged, the user namespace that owns it) and the tmpfs's root.
    Those descriptors keep both alive with no process behind them: commands
    enter the namespace through them (``nsenter --mount=/proc/<this pid>/fd/N``,
    so no recycled pid can ever lead elsewhere), host-side file operations
    work from the root's, and closing them (on close, or when this process
    dies) frees the tmpfs.

    Args:
        mountpoint: An empty host directory; the tmpfs is mounted on it inside the namespace only.
        size_mb: The tmpfs's size (``limits.workspace_mb``); inodes are bounded in proportion.
        owner: Owner of the tmpfs's root (root runs; None: the user namespace's root, i.e. this user).
    """

    def __init__(self, mountpoint: Path, size_mb: int, owner: int | None):
        self.mountpoint = mountpoint
        self._size_mb = size_mb
        self._owner = owner
        self._namespaces: dict[str, int] = {}  # nsenter option -> descriptor

    def start(self) -> int:
        """Mount the tmpfs; returns a descriptor of its root (the caller owns it)."""
        unshare, self._nsenter = shutil.which("unshare"), shutil.which("nsenter")
        if unshare is None or self._nsenter is None:
            raise SandboxUnavailableError("unshare and nsenter (util-linux) are needed for the workspace quota")
        options = [f"size={self._size_mb}m", f"nr_inodes={max(4096, self._size_mb * 256)}", "nosuid", "nodev"]
        options += ["mode=0755", f"uid={self._owner}", f"gid={self._owner}"] if self._owner is not None else [
            "mode=0700"]
        userns = [] if self._owner is not None else ["--user", "--map-root-user"]
        script = 'mount -t tmpfs -o "$2" factory-workspace "$1" || exit 1; echo ready; read -r _'
        holder = subprocess.Popen(
            [unshare, *userns, "--mount", "--propagation", "slave", "--", "sh", "-c", script, "sh",
             str(self.mountpoint), ",".join(options)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        assert holder.stdin is not None and holder.stdout is not None
        try:
            ready, _, _ = select.select([holder.stdout], [], [], _HOLDER_START_S)
            if not ready or holder.stdout.readline() != b"ready\n":
                raise SandboxUnavailableError(
                    "cannot mount the workspace's size-limited tmpfs in a mount namespace of its own")
            for option, name in ((("--user", "user"),) if userns else ()) + (("--mount", "mnt"),):
                self._namespaces[option] = os.open(f"/proc/{holder.pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
            return os.open(f"/proc/{holder.pid}/root{self.mountpoint}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except BaseException:
            self.stop()
            raise
        finally:
            holder.stdin.close()  # the holder exits; the descriptors keep the namespace
            holder.stdout.close()
            try:
                holder.wait(5)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait()

    def enter(self) -> list[str]:
        """The command prefix that runs the rest inside the namespace (built per command: it names this pid)."""
        argv = [self._nsenter or "nsenter"]
        for option, fd in self._namespaces.items():
            argv.append(f"{option}=/proc/{os.getpid()}/fd/{fd}")
        if "--user" in self._namespaces:
            argv.append("--preserve-credentials")
        return [*argv, "--"]

    def stop(self) -> None:
        namespaces, self._namespaces = self._namespaces, {}
        for fd in namespaces.values():
            os.close(fd)
        try:
            self.mountpoint.rmdir()
        except OSError:
            pass


@functools.cache
def _seccomp(no_symlinks: bool = False) -> bytes:
    return seccomp_program(no_symlinks=no_symlinks)


def _etc_files(uid: int) -> dict[str, str]:
    """Generated /etc files: only the sandbox's user and group, localhost, and where to look them up."""
    name = "root" if uid == 0 else "sandbox"
    passwd = "" if uid == 0 else "root:x:0:0:root:/root:/usr/sbin/nologin\n"
    group = "" if uid == 0 else "root:x:0:\n"
    return {
        "passwd": passwd + f"{name}:x:{uid}:{uid}:{name}:/workspace:/bin/sh\n"
                           "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": group + f"{name}:x:{uid}:\nnogroup:x:65534:\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\n",
        "hosts": "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n",
        "hostname": "sandbox\n",
    }


@register_sandbox("bwrap")
class BwrapSandbox(Sandbox):
    """Bubblewrap sandbox (default on Linux): no network, clean env, read-only system, syscall filter, quota."""

    guarantees = frozenset(Guarantee)

    def __init__(self, spec: SandboxSpec):
        super().__init__(spec)
        self._workspace = HostWorkspace("factory-bwrap-")
        self._mount: _WorkspaceMount | None = None
        self._uid: int | None = None
        self._bwrap = ""
        self._args: list[str] = []
        self._python = Path(spec.python or sys.executable)
        self._exec_lock = asyncio.Lock()

    @property
    def shared_path(self) -> str | None:
        return (self.spec.shared_mount or "/shared") if self.spec.shared_dir is not None else None

    async def start(self) -> None:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailableError(_INSTALL_HINT)
        privileged = os.geteuid() == 0
        setpriv = shutil.which("setpriv") if privileged else None
        if privileged and setpriv is None:
            raise SandboxUnavailableError("setpriv (util-linux) is needed to drop root inside bwrap")
        shared = self.spec.shared_dir
        if shared is not None and not os.path.isdir(shared):
            raise SandboxError(f"shared_dir {shared} is not a directory")
        _seccomp()  # an architecture without a filter fails here, not at the first command
        self._bwrap = bwrap
        self._uid = _UIDS.acquire(self.spec.user_group) if privileged else None
        try:
            await asyncio.to_thread(self._create, setpriv)
        except BaseException:
            await self.close()
            raise

    def _create(self, setpriv: str | None) -> None:
        self._mount = _WorkspaceMount(Path(tempfile.mkdtemp(prefix="factory-bwrap-mnt-", dir=sandbox_folder())),
                                      self.spec.limits.workspace_mb, self._uid)
        root = self._mount.start()
        self._workspace.create(dict(self.spec.files), dict(self.spec.readonly_files), owner=self._uid, root_fd=root)
        assert self._workspace.private is not None
        etc = self._workspace.private / "etc"
        etc.mkdir()
        for name, text in _etc_files(self._uid if self._uid is not None else 0).items():
            (etc / name).write_text(text)
            (etc / name).chmod(0o444)
        self._args = self._bwrap_args(self._mount.mountpoint, etc, setpriv)

    def _bwrap_args(self, root: Path, etc: Path, setpriv: str | None) -> list[str]:
        """bwrap's arguments after the program name, but for ``--seccomp`` (a new descriptor each time)."""
        limits = self.spec.limits
        argv = [
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr",
        ]
        if setpriv is None:
            argv += ["--unshare-user", "--disable-userns"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                argv += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                argv += ["--ro-bind", top, top]
        argv += ["--perms", "0755", "--dir", "/etc"]
        for path in _ETC_FILES:
            if os.path.exists(path):
                argv += ["--ro-bind", path, path]
        for generated in sorted(etc.iterdir()):
            argv += ["--ro-bind", str(generated), f"/etc/{generated.name}"]
        # /proc, /dev and /tmp first: a later bind (a venv under /tmp, say) must land on top of them.
        # bwrap's /dev/shm is a root-owned directory the sandbox's uid cannot write: POSIX semaphores and
        # shared memory (multiprocessing.Pool, ProcessPoolExecutor) need a writable one, size-limited like /tmp.
        argv += ["--proc", "/proc", "--dev", "/dev",
                 "--perms", "1777", "--size", str(limits.tmp_mb * 1024 * 1024), "--tmpfs", "/dev/shm",
                 "--perms", "1777", "--size", str(limits.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        made: set[str] = {"/tmp", "/etc"}
        for mount in _python_mounts(self._python):
            for parent in reversed(mount.parents):
                if str(parent) != "/" and str(parent) not in made:
                    made.add(str(parent))
                    argv += ["--perms", "0755", "--dir", str(parent)]
            argv += ["--ro-bind", str(mount), str(mount)]
        argv += ["--bind", str(root), "/workspace"]
        # Pristine copies the sandbox cannot reach; their paths inside are cleared before each command.
        for rel, source in sorted(self._workspace.readonly.items()):
            argv += ["--ro-bind", str(source), f"/workspace/{rel}"]
        if self.spec.shared_dir is not None:
            target = self.spec.shared_mount or "/shared"
            for parent in reversed(Path(target).parents):  # bwrap would make them 0700, root's: untraversable
                if str(parent) != "/" and str(parent) not in made:
                    made.add(str(parent))
                    argv += ["--perms", "0755", "--dir", str(parent)]
            argv += ["--bind", os.path.realpath(self.spec.shared_dir), target]
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
        mount, self._mount = self._mount, None
        self._args = []

        def remove() -> None:
            self._workspace.remove()
            if mount is not None:
                mount.stop()

        await asyncio.to_thread(remove)
        if self._uid is not None:
            _UIDS.release(self._uid, self.spec.user_group)
            self._uid = None

    async def exec(
        self, command: str | Sequence[str], timeout: float | None = None, stdin: str | bytes | None = None
    ) -> ExecResult:
        if not self._args:
            raise SandboxError("sandbox is not started")
        limits = self.spec.limits
        # Root runs: the sandbox's uid is its own. Unprivileged runs: the kernel counts RLIMIT_NPROC per user
        # namespace, and the workspace's namespace holds nothing but this sandbox's commands, so the limit is
        # the sandbox's alone there too (not relative to what the user runs elsewhere).
        nproc = limits.max_processes
        # One command at a time: the read-only paths are cleared while nothing of the sandbox runs.
        async with self._exec_lock:
            await host_file_call(lambda: self._workspace.clear_readonly_paths(self._uid), "read-only files")
            read_end, write_end = os.pipe()
            try:
                os.write(write_end, _seccomp(self.spec.no_symlinks))
                os.close(write_end)
                write_end = -1
                assert self._mount is not None
                argv = [*self._mount.enter(), self._bwrap, "--seccomp", str(read_end), *self._args,
                        *(["sh", "-c", command] if isinstance(command, str) else command)]
                return await run_limited(
                    argv,
                    cwd="/",
                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},  # bwrap's own env; --clearenv empties it inside
                    limits=limits,
                    timeout=timeout if timeout is not None else limits.timeout_s,
                    stdin=stdin.encode() if isinstance(stdin, str) else stdin,
                    nproc=nproc,
                    pass_fds=(read_end,),
                )
            finally:
                os.close(read_end)
                if write_end >= 0:
                    os.close(write_end)

    async def write_file(self, path: str, content: str | bytes) -> None:
        await host_file_call(lambda: self._workspace.write(path, content, owner=self._uid), f"writing {path}")

    async def read_file(self, path: str) -> str:
        return await host_file_call(lambda: self._workspace.read(path), f"reading {path}")

    async def list_files(self, path: str = ".") -> list[str]:
        return await host_file_call(lambda: self._workspace.list(path), f"listing {path}")

    async def collect_workspace(self, max_bytes: int = 64_000_000) -> WorkspaceFiles:
        return await host_file_call(lambda: self._workspace.collect(max_bytes), "collecting the workspace", 120)
