"""Sandbox backends: where untrusted, model-written code runs.

Backends register by name (``--sandbox``) in :data:`SANDBOXES`: ``bwrap``
(default on Linux), ``docker`` and ``none``. :func:`default_sandbox_name` picks
the default. :func:`self_check` runs the conformance suite every backend must
pass, a user's own included. :func:`build_image` builds the docker backend's
default image (:func:`default_image_tag`) from this host, offline, and returns
an :class:`ImageBuild`.
"""

import sys

from factory.sandbox._base import (
    SANDBOXES,
    ExecResult,
    Guarantee,
    Sandbox,
    SandboxLimits,
    SandboxSpec,
    WorkspaceFiles,
    create_sandbox,
    register_sandbox,
    sandbox_names,
)
from factory.sandbox._bwrap import BwrapSandbox
from factory.sandbox._conformance import (
    CHECKS,
    CONFORMANCE_SPEC,
    CheckResult,
    ConformanceCheck,
    SandboxFactory,
    conformance_check,
    expect,
    self_check,
)
from factory.sandbox._docker import (
    DockerSandbox,
    docker_available,
    docker_image_status,
    drain_docker_pool,
    sweep_docker_containers,
)
from factory.sandbox._host import HostWorkspace, host_file_call, processes_of, run_limited, sandbox_environment
from factory.sandbox._image import BROWSER_CHROMIUM, ImageBuild, browser_image_tag, build_image, default_image_tag
from factory.sandbox._none import NoSandbox, NoSandboxWarning
from factory.sandbox._scratch import sandbox_folder, sandbox_owner, sandbox_root, sweep_sandbox_folders
from factory.sandbox._summarize import summarize_tool_output
from factory.sandbox._workspace import files_spec, snapshot_of, workspace_spec

__all__ = [
    "BROWSER_CHROMIUM",
    "CHECKS",
    "CONFORMANCE_SPEC",
    "SANDBOXES",
    "BwrapSandbox",
    "CheckResult",
    "DockerSandbox",
    "ConformanceCheck",
    "ExecResult",
    "Guarantee",
    "HostWorkspace",
    "ImageBuild",
    "NoSandbox",
    "NoSandboxWarning",
    "Sandbox",
    "SandboxFactory",
    "SandboxLimits",
    "SandboxSpec",
    "WorkspaceFiles",
    "browser_image_tag",
    "build_image",
    "conformance_check",
    "create_sandbox",
    "default_image_tag",
    "default_sandbox_name",
    "docker_available",
    "docker_image_status",
    "drain_docker_pool",
    "expect",
    "host_file_call",
    "processes_of",
    "register_sandbox",
    "run_limited",
    "sandbox_environment",
    "sandbox_folder",
    "sandbox_names",
    "sandbox_owner",
    "sandbox_root",
    "self_check",
    "files_spec",
    "snapshot_of",
    "summarize_tool_output",
    "sweep_docker_containers",
    "sweep_sandbox_folders",
    "workspace_spec",
]


def default_sandbox_name() -> str:
    """``bwrap`` on Linux, else ``none`` (which warns on every run)."""
    return "bwrap" if sys.platform.startswith("linux") else "none"
