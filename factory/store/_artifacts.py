"""Artifacts: the files a command wrote from a run (plots, exports, trained models), as the store records them.

The file stays where the user put it; its row in ``artifacts`` points at it
(an absolute path) with the sha256 it had when written, so a later change
shows as a mismatch and a removed file as missing. A row's id is derived
from what it is (run, kind and key: the path, or for ``factory power`` the
comparison), so a command that writes the same artifact again updates its
row instead of adding one.

Kinds: ``rank_plot``, ``power`` (a verdict, with or without a plot),
``export`` (a data file with its manifest and dataset card) and ``model``
(a training output folder). Companion files (a manifest, a dataset card, a
loss curve) are listed in ``meta["files"]``, each with its own hash.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from factory.provenance import content_hash, file_sha256

__all__ = ["ARTIFACT_KINDS", "FILE_STATUSES", "artifact_rows", "companion", "file_digest", "file_status"]

#: What a row records: a rank plot, a power verdict, an export, a trained model.
ARTIFACT_KINDS = ("rank_plot", "power", "export", "model")
#: What :func:`file_status` says of a recorded file.
FILE_STATUSES = ("matches", "changed", "missing", "no file")

# (device, inode, size, mtime_ns) -> digest: a viewer asks the same files' status on every page
_DIGESTS: dict[tuple[int, int, int, int], str] = {}
_DIGESTS_MAX = 4096


def file_digest(path: str | Path) -> str | None:
    """``sha256:<hex>`` of a regular file's bytes (None where there is no regular file at ``path``).

    A folder's digest is its ``train_result.json``'s (what a trained model depends on, and its figures).
    Digests are remembered by the file's identity, size and modification time, so asking again is a ``stat``.
    """
    target = Path(path)
    if target.is_dir():
        target = target / "train_result.json"
    try:
        info = os.stat(target)
    except OSError:
        return None
    if not os.path.isfile(target):
        return None
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    digest = _DIGESTS.get(key)
    if digest is None:
        try:
            digest = "sha256:" + file_sha256(target)
        except OSError:
            return None
        if len(_DIGESTS) >= _DIGESTS_MAX:
            _DIGESTS.clear()
        _DIGESTS[key] = digest
    return digest


def file_status(path: str | None, sha256: str | None) -> str:
    """Whether a recorded file is still as recorded: ``matches``, ``changed``, ``missing`` or ``no file``."""
    if not path:
        return "no file"
    digest = file_digest(path)
    if digest is None:
        return "missing"
    return "matches" if sha256 is None or digest == sha256 else "changed"


def companion(role: str, path: str | Path | None) -> dict[str, Any] | None:
    """A companion file's entry for ``meta["files"]`` (``role, path, sha256``), or None where there is none."""
    if path is None:
        return None
    resolved = Path(path).resolve()
    return {"role": role, "path": str(resolved), "sha256": file_digest(resolved)}


def artifact_rows(run_ids: Sequence[str], kind: str, path: str | Path | None, meta: Mapping[str, Any], *,
                  key: Any = None, created_at: Any) -> list[dict[str, Any]]:
    """The ``artifacts`` rows of one output, one per run it was made from.

    Args:
        run_ids: The runs (a comparison of two runs, an export of several, is recorded under each).
        kind: One of :data:`ARTIFACT_KINDS`.
        path: The file or folder written (None: no file, e.g. ``factory power`` without ``--plot``).
        meta: What the view shows of it (JSON-ready); ``files`` lists companion files (:func:`companion`).
        key: What makes it the same artifact when written again; default its path.
        created_at: When it was written (the store's naive UTC time).

    Returns:
        Rows ready for :meth:`~factory.store.Store.record_artifacts` (ids derived from run, kind and key).
    """
    if kind not in ARTIFACT_KINDS:
        raise ValueError(f"unknown artifact kind {kind!r} (known: {', '.join(ARTIFACT_KINDS)})")
    resolved = str(Path(path).resolve()) if path is not None else ""
    identity = resolved if key is None else key
    digest = file_digest(resolved) if resolved else None
    return [{"artifact_id": content_hash([run_id, kind, identity])[len("sha256:"):][:32], "run_id": run_id,
             "kind": kind, "path": resolved, "sha256": digest, "meta": dict(meta), "created_at": created_at}
            for run_id in dict.fromkeys(run_ids)]
