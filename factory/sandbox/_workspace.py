"""A branch's final workspace as a change set, and the sandbox spec that rebuilds it.

Stored with the branch so that ``factory verify`` (and golden sets) can
verify exactly what a branch left behind, without running it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from factory.sandbox._base import Sandbox, SandboxLimits, SandboxSpec
from factory.store import WorkspaceSnapshot
from factory.tasks import Task

__all__ = ["snapshot_workspace", "workspace_spec"]

_MAX_FILE_BYTES = 256_000
_MAX_TOTAL_BYTES = 2_000_000


async def snapshot_workspace(sandbox: Sandbox, task: Task) -> WorkspaceSnapshot:
    """Files that differ from the task's (text, size-capped) and task files that are gone."""
    originals = {**task.files, **task.tests}
    present = await sandbox.list_files(".")
    changed: dict[str, str] = {}
    skipped: list[str] = []
    total = 0
    for path in present:
        text = await sandbox.read_file(path)
        if originals.get(path) == text:
            continue
        size = len(text.encode("utf-8"))
        if size > _MAX_FILE_BYTES or total + size > _MAX_TOTAL_BYTES or "\x00" in text:
            skipped.append(path)
            continue
        changed[path] = text
        total += size
    deleted = sorted(set(originals) - set(present))
    return WorkspaceSnapshot(files=changed, deleted=deleted, skipped=skipped)


def workspace_spec(task: Task, workspace: WorkspaceSnapshot | Mapping[str, Any] | None,
                   limits: SandboxLimits | None = None) -> SandboxSpec:
    """A sandbox spec holding the task's files with ``workspace`` (a snapshot) applied.

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
    return SandboxSpec(files=files, readonly_files=tests, limits=limits or SandboxLimits())
