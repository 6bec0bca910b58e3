"""Sandbox backends: where untrusted, model-written code runs.

Backends register by name (``--sandbox``): ``bwrap`` (default on Linux),
``docker`` and ``none``. :func:`default_sandbox_name` picks the default.
"""

import sys

from factory.rollouts.sandbox._base import (
    ExecResult,
    Guarantee,
    Sandbox,
    SandboxLimits,
    SandboxSpec,
    create_sandbox,
    register_sandbox,
    sandbox_names,
)
from factory.rollouts.sandbox._bwrap import BwrapSandbox
from factory.rollouts.sandbox._docker import DockerSandbox, docker_available
from factory.rollouts.sandbox._host import HostWorkspace, processes_of, run_limited, sandbox_environment
from factory.rollouts.sandbox._none import NoSandbox, NoSandboxWarning
from factory.rollouts.sandbox._pool import SandboxPool

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
]


def default_sandbox_name() -> str:
    """``bwrap`` on Linux, else ``none`` (which warns on every run)."""
    return "bwrap" if sys.platform.startswith("linux") else "none"
