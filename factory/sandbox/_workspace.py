"""A branch's final workspace as a change set, and the sandbox spec that rebuilds it.

Stored with the branch so that ``factory verify`` (and golden sets) can
verify exactly what a branch left behind, without running it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from factory.sandbox._base import SandboxLimits, SandboxSpec, WorkspaceFiles
from factory.sandbox._fdtree import is_exact_path
from factory.store import WorkspaceSnapshot
from factory.tasks import Task

__all__ = ["files_spec", "snapshot_of", "workspace_spec"]

_MAX_FILE_BYTES = 256_000
_MAX_TOTAL_BYTES = 2_000_000


def snapshot_of(collected: WorkspaceFiles, task: Task) -> WorkspaceSnapshot:
    """The stored change set of a collected workspace.

    Files that differ from the task's, as text, size-capped; binary, oversized
    and over-budget files are listed as skipped. Symbolic links and special
    files (FIFOs, sockets, devices) are recorded as such, never followed or
    opened, so a branch that leaves them behind is stored whole.
    """
    originals = {**task.files, **task.tests}
    changed: dict[str, str] = {}
    skipped: list[str] = list(collected.oversized)
    total = 0
    for path, data in sorted(collected.files.items()):
        if not is_exact_path(path):  # 'main.py ' is not main.py, and no sandbox can be seeded with it as itself
            skipped.append(path)
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(path)
            continue
        if originals.get(path) == text:
            continue
        if len(data) > _MAX_FILE_BYTES or total + len(data) > _MAX_TOTAL_BYTES or "\x00" in text:
            skipped.append(path)
            continue
        changed[path] = text
        total += len(data)
    present = set(collected.files) | set(collected.oversized) | set(collected.symlinks) | set(collected.special)
    return WorkspaceSnapshot(files=changed, deleted=sorted(set(originals) - present), skipped=sorted(skipped),
                             symlinks=dict(collected.symlinks), special=dict(collected.special))


def files_spec(task: Task, files: Mapping[str, str | bytes], limits: SandboxLimits | None = None) -> SandboxSpec:
    """A sandbox spec holding a branch's whole final workspace with every test, hidden ones too, restored read-only.

    A file whose name is not an exact workspace path (``'main.py '``, ``' '``) stays out: it could
    not be seeded as itself, and it must not fail the verification (an infrastructure error).

    The spec starts from the task's image (:attr:`Task.image`), as every sandbox built for a task does.
    What the branch did to a test file is not carried over: the tests run as the task wrote them (the
    tamper scan reads ``files`` itself).
    """
    return SandboxSpec(files={p: c for p, c in files.items() if p not in task.all_tests and is_exact_path(p)},
                       readonly_files=task.all_tests, limits=limits or SandboxLimits(), image=task.image)


def workspace_spec(task: Task, workspace: WorkspaceSnapshot | Mapping[str, Any] | None,
                   limits: SandboxLimits | None = None) -> SandboxSpec:
    """A sandbox spec holding the task's files with ``workspace`` (a snapshot) applied, on the task's image.

    Test files keep their read-only mount; a changed or deleted test file is
    reproduced as changed or deleted, so tamper checks see what the branch did.

    Args:
        task: The task whose files the sandbox starts from.
        workspace: The snapshot, or its stored JSON object (older shapes are upgraded); None: no changes.
        limits: The sandbox limits (default ones if None).

    Raises:
        RecordError: ``workspace`` is not a workspace snapshot.
    """
    if workspace is None:
        workspace = WorkspaceSnapshot()
    elif not isinstance(workspace, WorkspaceSnapshot):
        workspace = WorkspaceSnapshot.from_stored(workspace)
    changes = workspace.files
    deleted = set(workspace.deleted)
    files = {p: t for p, t in task.files.items() if p not in deleted}
    files.update({p: t for p, t in changes.items() if p not in task.tests})
    tests = {p: changes.get(p, t) for p, t in task.tests.items() if p not in deleted}
    return SandboxSpec(files=files, readonly_files=tests, limits=limits or SandboxLimits(), image=task.image)
