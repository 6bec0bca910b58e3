"""``none``: a temp directory and no isolation at all, with a warning on every run.

For machines with neither bubblewrap nor a container engine. It still gives
commands a clean environment (no host variables, so no API keys), resource
rlimits, a wall-clock limit that kills the process group, and an output cap.
It does *not* stop network access or writes outside the workspace, and as
root neither file modes nor process limits bind; its :attr:`guarantees` say
exactly that.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from factory.errors import SandboxError
from factory.sandbox._base import ExecResult, Guarantee, Sandbox, SandboxSpec, register_sandbox
from factory.sandbox._host import HostWorkspace, processes_of, run_limited, sandbox_environment

__all__ = ["NoSandbox", "NoSandboxWarning"]


class NoSandboxWarning(UserWarning):
    """Emitted whenever the ``none`` backend runs a command."""


def _guarantees() -> frozenset[Guarantee]:
    base = {Guarantee.ENVIRONMENT, Guarantee.TIMEOUT, Guarantee.MEMORY, Guarantee.OUTPUT}
    if os.geteuid() != 0:  # root ignores file modes and RLIMIT_NPROC
        base |= {Guarantee.READONLY_TESTS, Guarantee.PROCESSES}
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
        self._workspace.write(path, content)

    async def read_file(self, path: str) -> str:
        return self._workspace.read(path)

    async def list_files(self, path: str = ".") -> list[str]:
        return self._workspace.list(path)

