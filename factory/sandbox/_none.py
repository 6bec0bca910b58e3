"""``none``: a temp directory and no isolation at all, with a warning on every run.

For machines with neither bubblewrap nor a container engine. It still gives
commands a clean environment (no host variables, so no API keys), resource
rlimits, a wall-clock limit that kills the process group, and an output cap.
It does *not* stop network access, writes outside the workspace, changes to
the read-only files (their owner runs the commands and may chmod them),
dangerous syscalls or a full disk, and as root process limits do not bind;
its :attr:`guarantees` say exactly that. Host-side file operations are as
careful as bwrap's (no link followed, no FIFO opened): they run in this
process, whatever the backend.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from factory.errors import SandboxError
from factory.sandbox._base import ExecResult, Guarantee, Sandbox, SandboxSpec, WorkspaceFiles, register_sandbox
from factory.sandbox._host import HostWorkspace, host_file_call, processes_of, run_limited, sandbox_environment

__all__ = ["NoSandbox", "NoSandboxWarning"]


class NoSandboxWarning(UserWarning):
    """Emitted whenever the ``none`` backend runs a command."""


def _guarantees() -> frozenset[Guarantee]:
    base = {Guarantee.ENVIRONMENT, Guarantee.TIMEOUT, Guarantee.MEMORY, Guarantee.OUTPUT}
    # Not READONLY_TESTS, even unprivileged: commands run as the read-only files' owner, who may chmod them.
    if os.geteuid() != 0:  # root ignores RLIMIT_NPROC
        base |= {Guarantee.PROCESSES}
    return frozenset(base)


@register_sandbox("none")
class NoSandbox(Sandbox):
    """No isolation: commands run as the host user in a temp directory."""

    guarantees = _guarantees()

    def __init__(self, spec: SandboxSpec):
        super().__init__(spec)
        self._workspace = HostWorkspace("factory-none-")
        self._tmp: HostWorkspace | None = None
        self._python = Path(spec.python or sys.executable)

    @property
    def shared_path(self) -> str | None:
        """The spec's ``shared_dir`` itself: commands run on the host."""
        return os.path.abspath(self.spec.shared_dir) if self.spec.shared_dir is not None else None

    async def start(self) -> None:
        warnings.warn(
            "sandbox 'none' runs model-written code WITHOUT isolation: network and host files are reachable",
            NoSandboxWarning,
            stacklevel=2,
        )
        self._workspace.create(dict(self.spec.files), dict(self.spec.readonly_files))
        # A scratch dir beside the workspace, not in it: temp files are not the branch's output.
        self._tmp = HostWorkspace("factory-none-tmp-")
        self._tmp.create({}, {})

    async def close(self) -> None:
        self._workspace.remove()
        if self._tmp is not None:
            self._tmp.remove()

    async def exec(
        self, command: str | Sequence[str], timeout: float | None = None, stdin: str | bytes | None = None
    ) -> ExecResult:
        root = self._workspace.root
        if root is None:
            raise SandboxError("sandbox is not started")
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        limits = self.spec.limits
        env = sandbox_environment(str(root), str(self._python.parent))
        env["TMPDIR"] = str(self._tmp.root if self._tmp is not None else root)
        return await run_limited(
            argv,
            cwd=str(root),
            env=env,
            limits=limits,
            timeout=timeout if timeout is not None else limits.timeout_s,
            stdin=stdin.encode() if isinstance(stdin, str) else stdin,
            nproc=None if os.geteuid() == 0 else processes_of(os.getuid()) + limits.max_processes,
        )

    async def write_file(self, path: str, content: str | bytes) -> None:
        await host_file_call(lambda: self._workspace.write(path, content), f"writing {path}")

    async def read_file(self, path: str) -> str:
        return await host_file_call(lambda: self._workspace.read(path), f"reading {path}")

    async def list_files(self, path: str = ".") -> list[str]:
        return await host_file_call(lambda: self._workspace.list(path), f"listing {path}")

    async def collect_workspace(self, max_bytes: int = 64_000_000) -> WorkspaceFiles:
        return await host_file_call(lambda: self._workspace.collect(max_bytes), "collecting the workspace", 120)

