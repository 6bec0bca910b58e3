"""Export files: JSONL or Parquet by extension, written atomically; read back for validation.

A file is written to a temporary name beside its target and renamed into
place (:class:`~factory.outputs.OutputFiles`), so an interrupted export never
leaves a half-written file where a finished one (or the previous export) was.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factory.errors import ConfigError, ExportValidationError
from factory.outputs import OutputFiles

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


def write_rows(frame: pl.DataFrame, path: Path, outputs: OutputFiles | None = None) -> None:
    """Write ``frame`` to ``path`` (kind by extension), atomically.

    Args:
        frame: The rows.
        path: The target file.
        outputs: Stage the file in this set, renamed into place with the rest
            of it (default: on its own, at once).

    Raises:
        ConfigError: Not a .jsonl or .parquet path, or ``outputs`` protects it.
    """
    kind = file_kind(path)
    if outputs is None:
        with OutputFiles() as alone:
            _write_frame(frame, alone.stage(path), kind)
    else:
        _write_frame(frame, outputs.stage(path), kind)


def _write_frame(frame: pl.DataFrame, path: Path, kind: str) -> None:
    if kind == "jsonl":
        frame.write_ndjson(path)
    else:
        frame.write_parquet(path, compression="zstd", statistics=False)


def iter_records(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """Each record of an export file: (1-based line or row, record or None, why it could not be read).

    A JSONL line that is not UTF-8, not JSON or not an object is reported on its own line.

    Raises:
        ExportValidationError: The file cannot be read at all: a ``.parquet`` file that is not Parquet, or
            a file that cannot be opened.
    """
    if file_kind(path) == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as exc:  # ArrowInvalid: no Parquet footer, a cut-off file
            detail = re.sub(r"^Could not open Parquet input source '.*?': ", "", " ".join(str(exc).split()))
            raise ExportValidationError(str(path), [f"{path}: cannot be read as Parquet: {detail}"]) from exc
        for number, row in enumerate(rows, start=1):
            yield number, row, None
        return
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise ExportValidationError(str(path), [f"{path}: cannot be read: {exc.strerror or exc}"]) from exc
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield number, None, "not UTF-8 text"
                continue
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
