"""Sandbox backends: where untrusted, model-written code runs.

Backends register by name (``--sandbox``): ``bwrap`` (default on Linux),
``docker`` and ``none``. :func:`default_sandbox_name` picks the default.
"""

import sys

from factory.sandbox._base import (
    ExecResult,
    Guarantee,
    Sandbox,
    SandboxLimits,
    SandboxSpec,
    create_sandbox,
    register_sandbox,
    sandbox_names,
)
from factory.sandbox._bwrap import BwrapSandbox
from factory.sandbox._docker import DockerSandbox, docker_available
from factory.sandbox._host import HostWorkspace, processes_of, run_limited, sandbox_environment
from factory.sandbox._none import NoSandbox, NoSandboxWarning
from factory.sandbox._pool import SandboxPool
from factory.sandbox._summarize import summarize_tool_output
from factory.sandbox._workspace import snapshot_workspace, workspace_spec

__all__ = [
    "BwrapSandbox",
    "DockerSandbox",
    "ExecResult",
    "Guarantee",
    "HostWorkspace",
    "NoSandbox",
    "NoSandboxWarning",
    "Sandbox",
    "SandboxLimits",
    "SandboxPool",
    "SandboxSpec",
    "create_sandbox",
    "default_sandbox_name",
    "docker_available",
    "processes_of",
    "register_sandbox",
    "run_limited",
    "sandbox_environment",
    "sandbox_names",
    "snapshot_workspace",
    "summarize_tool_output",
    "workspace_spec",
]


def default_sandbox_name() -> str:
    """``bwrap`` on Linux, else ``none`` (which warns on every run)."""
    return "bwrap" if sys.platform.startswith("linux") else "none"
