"""The sandbox extension point: one small ABC, implementations registered by name.

A sandbox is where one branch's untrusted, model-written code runs. Backends
declare the isolation they *guarantee* (:class:`Guarantee`); the conformance
suite checks every guarantee a backend claims, and the fork runner records
the backend with the run, so nobody mistakes ``none`` for isolation.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import ClassVar

from factory.errors import SandboxPathError, SandboxUnavailableError
from factory.registry import Registry

__all__ = [
    "SANDBOXES",
    "ExecResult",
    "Guarantee",
    "Sandbox",
    "SandboxLimits",
    "SandboxSpec",
    "WorkspaceFiles",
    "create_sandbox",
    "register_sandbox",
    "sandbox_names",
]


class Guarantee(str, Enum):
    """An isolation property a backend promises."""

    NETWORK = "no-network"
    ENVIRONMENT = "clean-environment"
    FILESYSTEM = "no-writes-outside-workspace"
    READONLY_TESTS = "read-only-tests"
    TIMEOUT = "timeout-kills-tree"
    PROCESSES = "process-limit"
    MEMORY = "memory-limit"
    OUTPUT = "output-limit"
    SYSCALLS = "syscall-filter"  # no user namespaces, no ptrace/mount/bpf/keyring/module calls
    DISK = "disk-quota"  # the workspace cannot grow past SandboxLimits.workspace_mb


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits applied to every command a sandbox runs.

    Attributes:
        timeout_s: Default wall-clock limit per command; the whole process tree is killed.
        cpu_seconds: CPU time per command (RLIMIT_CPU).
        memory_mb: Address space per process (RLIMIT_AS).
        max_processes: Processes the sandbox may hold at once.
        max_output_bytes: Captured bytes per stream; past this the command is killed.
        max_file_mb: Largest file a command may write (RLIMIT_FSIZE).
        tmp_mb: Size of the sandbox's private /tmp, where the backend has one.
        workspace_mb: Size of the workspace (files and directories together), where the
            backend enforces one (:attr:`Guarantee.DISK`).
    """

    timeout_s: float = 60.0
    cpu_seconds: int = 60
    memory_mb: int = 1024
    max_processes: int = 64
    max_output_bytes: int = 1_000_000
    max_file_mb: int = 64
    tmp_mb: int = 64
    workspace_mb: int = 256


@dataclass(frozen=True)
class SandboxSpec:
    """What a new sandbox is seeded with.

    Attributes:
        files: Workspace files (relative path -> text, or bytes for binary files), writable by the agent.
        readonly_files: Files (e.g. tests) the agent can read but never change (text or bytes).
        limits: Resource limits.
        python: Interpreter made available inside (default: the running one).
        image: Container image, for container backends.
        options: Backend-specific settings.
        shared_dir: A host directory shared read-write with the sandbox (at
            :attr:`Sandbox.shared_path` inside), for talking to a process outside
            it or in another sandbox through a Unix socket (filesystem sockets
            work across network namespaces; abstract ones do not). The caller
            creates it; sandboxes run as distinct unprivileged uids when the
            host runs as root, so make it writable by all of them (mode
            ``0o1777``: sticky, so none deletes another's files) and make a
            listening socket connectable by other uids (``os.chmod(path,
            0o777)`` after ``bind``). Whatever a sandbox leaves there is
            untrusted: read it without following symlinks.
        user_group: Sandboxes whose specs name the same group run their commands
            as one unprivileged user, where a backend would give each its own
            (bwrap run as root): what one writes in ``shared_dir`` with a private
            mode (pytest makes ``tmp_path`` ``0o700``) the other can still use.
            Their process limit is then shared. Backends that run every sandbox
            as one user (docker: ``nobody``) need nothing for it.
        shared_mount: Where ``shared_dir`` appears inside (an absolute path;
            default ``/shared``), so that a folder of one sandbox's shared
            directory can be another sandbox's whole shared directory at the
            same path in both. Backends that run commands on the host (none)
            ignore it: the folder is at its host path in both.
        no_symlinks: Creating a symbolic link fails (``EPERM``) in the sandbox
            (bwrap and docker: their syscall filter). The solution sandbox of an
            isolated verification: a link it planted in the scratch area it
            shares with the trusted sandbox would be followed there by tools
            that are not Python (``diff`` comparing a test's expected file with
            itself). Backends that run commands on the host (none) ignore it.
    """

    files: Mapping[str, str | bytes] = field(default_factory=dict)
    readonly_files: Mapping[str, str | bytes] = field(default_factory=dict)
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    python: Path | None = None
    image: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    shared_dir: str | None = None
    user_group: str | None = None
    shared_mount: str | None = None
    no_symlinks: bool = False


@dataclass(frozen=True)
class WorkspaceFiles:
    """Everything a workspace holds, read without following a link or opening a special file.

    Attributes:
        files: Regular files (workspace-relative path -> content).
        symlinks: Symbolic links (path -> their target, never followed).
        special: FIFOs, sockets and device nodes (path -> ``fifo``, ``socket``,
            ``char-device``, ``block-device`` or ``unknown``), never opened.
        oversized: Regular files left unread because they would take the total past the byte budget.
        truncated: The walk stopped at its entry limit; entries past it are in none of the above.
    """

    files: Mapping[str, bytes] = field(default_factory=dict)
    symlinks: Mapping[str, str] = field(default_factory=dict)
    special: Mapping[str, str] = field(default_factory=dict)
    oversized: tuple[str, ...] = ()
    truncated: bool = False


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command.

    Attributes:
        exit_code: The process's exit status (negative: killed by that signal).
        stdout: Captured standard output (decoded, at most the output limit).
        stderr: Captured standard error (likewise).
        timed_out: The wall-clock limit killed the process tree.
        output_truncated: The output limit was hit and the tree was killed.
        duration_s: Wall-clock seconds.
    """

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    output_truncated: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Exit status 0, not timed out, not truncated."""
        return self.exit_code == 0 and not self.timed_out and not self.output_truncated

    def describe(self) -> str:
        """Output and status as one text, the way a tool result shows it."""
        parts = [self.stdout]
        if self.stderr:
            parts.append(self.stderr)
        status = f"[exit code {self.exit_code}]"
        if self.timed_out:
            status = f"[timed out after {self.duration_s:.1f}s; process tree killed]"
        elif self.output_truncated:
            status = "[output limit exceeded; process tree killed]"
        parts.append(status)
        return "\n".join(part.rstrip("\n") for part in parts if part)


class Sandbox(abc.ABC):
    """An isolated workspace that runs commands; an async context manager.

    Subclasses set :attr:`name` and :attr:`guarantees` and implement the
    abstract methods. Paths are relative to the workspace root.
    """

    name: ClassVar[str]
    guarantees: ClassVar[frozenset[Guarantee]] = frozenset()

    def __init__(self, spec: SandboxSpec):
        if spec.shared_dir is not None and type(self).shared_path is Sandbox.shared_path:
            name = getattr(self, "name", type(self).__name__)
            raise SandboxUnavailableError(f"sandbox '{name}' cannot share a directory (shared_dir)")
        self.spec = spec

    @property
    def shared_path(self) -> str | None:
        """Where :attr:`SandboxSpec.shared_dir` appears inside (None without one).

        Backends that support ``shared_dir`` override this; the others refuse a spec that has one.
        """
        return None

    @classmethod
    def preflight(cls, images: Collection[str | None] = ()) -> None:
        """Check, before a run writes anything, that this backend can start sandboxes here.

        Args:
            images: The container images the run's tasks name (None: the
                backend's default); backends without images ignore them.

        Raises:
            SandboxUnavailableError: It cannot, with what to do about it.
        """
        return None

    @abc.abstractmethod
    async def start(self) -> None:
        """Create the workspace and seed it; must be called before anything else."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Kill anything still running and delete the workspace. Safe to call twice."""

    @abc.abstractmethod
    async def exec(
        self, command: str | Sequence[str], timeout: float | None = None, stdin: str | bytes | None = None
    ) -> ExecResult:
        """Run ``command`` (a shell string, or an argv list) in the workspace.

        Args:
            command: ``sh -c`` text, or an argument vector.
            timeout: Wall-clock seconds (default: the spec's limit).
            stdin: Data fed to the command's standard input.
        """

    @abc.abstractmethod
    async def write_file(self, path: str, content: str | bytes) -> None:
        """Create or replace a workspace file (parents are created)."""

    @abc.abstractmethod
    async def read_file(self, path: str) -> str:
        """Read a workspace file as text (undecodable bytes replaced)."""

    @abc.abstractmethod
    async def list_files(self, path: str = ".") -> list[str]:
        """Files under ``path``, recursively, as sorted workspace-relative paths."""

    async def collect_workspace(self, max_bytes: int = 64_000_000) -> WorkspaceFiles:
        """Every file the workspace holds, as bytes, up to ``max_bytes`` in total.

        This default reads through :meth:`list_files` and :meth:`read_file`, so
        it sees only what those show (text; undecodable bytes are replaced) and
        no links or special files; backends that can see the workspace's files
        directly override it with an exact, link-safe walk.
        """
        files: dict[str, bytes] = {}
        oversized: list[str] = []
        total = 0
        for path in await self.list_files("."):
            try:
                data = (await self.read_file(path)).encode("utf-8")
            except SandboxPathError:  # gone or swapped since it was listed
                continue
            if total + len(data) > max_bytes:
                oversized.append(path)
                continue
            files[path] = data
            total += len(data)
        return WorkspaceFiles(files=files, oversized=tuple(oversized))

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


#: The sandbox backends by name (``--sandbox``); :func:`register_sandbox` adds one.
SANDBOXES: Registry[Callable[[SandboxSpec], Sandbox]] = Registry("sandbox")


def register_sandbox(name: str) -> Callable[[type[Sandbox]], type[Sandbox]]:
    """Class decorator registering a backend under ``name`` (used by ``--sandbox``)."""

    def decorate(cls: type[Sandbox]) -> type[Sandbox]:
        cls.name = name
        SANDBOXES.register(name, cls)
        return cls

    return decorate


def sandbox_names() -> list[str]:
    """Registered backend names."""
    return SANDBOXES.names()


def create_sandbox(name: str, spec: SandboxSpec) -> Sandbox:
    """Instantiate the backend registered as ``name`` (not yet started).

    Raises:
        ConfigError: If no backend has that name.
    """
    return SANDBOXES.get(name)(spec)
