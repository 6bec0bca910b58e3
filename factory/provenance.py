"""What a result depends on: canonical hashing, package version, git revision.

Hashes are sha256 over *canonical JSON*: keys sorted, no insignificant
whitespace, UTF-8, no NaN/Infinity. Two equal objects hash equal however they
were written (JSONL or YAML, any key order).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from factory._version import __version__

__all__ = ["canonical_json", "content_hash", "file_sha256", "git_sha", "package_version"]


def canonical_json(obj: Any) -> str:
    """Serialize ``obj`` to canonical JSON text.

    Raises:
        ValueError: If ``obj`` holds NaN or infinities (not valid JSON).
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def content_hash(obj: Any) -> str:
    """Return ``sha256:<hex>`` of the canonical JSON of ``obj``."""
    return "sha256:" + hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks (weights, exports: files too big to hold at once)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def package_version() -> str:
    """Return the installed `factory` version."""
    return __version__


def git_sha(cwd: str | Path | None = None) -> str | None:
    """Return the git commit of ``cwd`` (suffixed ``-dirty`` if modified), or None outside git."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if dirty else sha or None
