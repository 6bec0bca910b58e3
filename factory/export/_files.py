"""Export files: JSONL or Parquet by extension, written atomically; read back for validation.

A file is written to a temporary name beside its target and renamed into
place, so an interrupted export never leaves a half-written file where a
finished one (or the previous export) was.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factory.errors import ConfigError

if TYPE_CHECKING:  # only for hints: reading and validating a file never import polars
    import polars as pl

__all__ = ["FILE_KINDS", "MANIFEST_SUFFIX", "file_kind", "iter_records", "side_path", "write_rows"]

#: Export file kind by extension: the formats a file may be written in.
FILE_KINDS = {".jsonl": "jsonl", ".parquet": "parquet"}
#: ``FILE`` + this names the export manifest written beside ``FILE``.
MANIFEST_SUFFIX = ".manifest.json"


def file_kind(path: Path) -> str:
    """``jsonl`` or ``parquet``, from the extension.

    Raises:
        ConfigError: Another extension.
    """
    try:
        return FILE_KINDS[path.suffix.lower()]
    except KeyError:
        raise ConfigError(f"{path}: export files end in .jsonl or .parquet") from None


def side_path(path: Path, tag: str) -> Path:
    """``data.jsonl`` + ``scalar`` -> ``data.scalar.jsonl`` (same kind as the main file)."""
    return path.with_name(f"{path.stem}.{tag}{path.suffix}")


def write_rows(frame: pl.DataFrame, path: Path) -> None:
    """Write ``frame`` to ``path`` (kind by extension), atomically."""
    kind = file_kind(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if kind == "jsonl":
            frame.write_ndjson(tmp)
        else:
            frame.write_parquet(tmp, compression="zstd", statistics=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def iter_records(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """Each record of an export file: (1-based line or row, record or None, why it could not be read)."""
    if file_kind(path) == "parquet":
        import pyarrow.parquet as pq

        for number, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield number, row, None
        return
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                yield number, None, "empty line"
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, None, f"not JSON ({exc.msg} at column {exc.colno})"
                continue
            if not isinstance(record, dict):
                yield number, None, "not a JSON object"
                continue
            yield number, record, None
