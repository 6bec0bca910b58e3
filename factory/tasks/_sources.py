"""Rows of a benchmark on disk: JSONL (optionally gzipped), a JSON array, Parquet, or a saved ``datasets`` folder.

Every row comes with its 1-based number (the line of a JSONL file, the row of
the others), so a problem is named by file, row and field. The source's
sha256 (of the file, or of every file of a folder) goes into each imported
task's metadata: the same source gives the same tasks.

A saved ``datasets`` folder (``Dataset.save_to_disk``) is read with pyarrow
directly, so importing one does not need the ``datasets`` package; a
``DatasetDict`` folder needs ``split`` (or has just one split).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.errors import TaskFileError, TaskProblem
from factory.tasks._schema import decode_text

__all__ = ["Source", "iter_text_files", "open_source", "source_hash"]

_CHUNK = 1 << 20


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def source_hash(path: Path) -> str:
    """``sha256:<hex>`` of a file, or of a folder's files (relative paths and contents, sorted)."""
    if path.is_file():
        return "sha256:" + _file_digest(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        relative = file.relative_to(path).as_posix()
        if relative.startswith(".git/") or "/.git/" in relative:
            continue
        digest.update(relative.encode() + b"\0" + _file_digest(file).encode() + b"\n")
    return "sha256:" + digest.hexdigest()


@dataclass(frozen=True)
class Source:
    """An opened source of rows.

    Attributes:
        path: The file or folder, as given.
        kind: ``jsonl``, ``json``, ``parquet`` or ``datasets``.
        sha256: :func:`source_hash` of it.
        rows: ``(row number, row)`` pairs, in order.
        problems: Rows that could not be read at all (bad JSON, not an object).
    """

    path: Path
    kind: str
    sha256: str
    rows: list[tuple[int, dict[str, Any]]]
    problems: list[TaskProblem]


def _problem(path: Path, row: int | None, message: str) -> TaskProblem:
    return TaskProblem(str(path), row, None, message)


def _jsonl_rows(path: Path, text: str) -> tuple[list[tuple[int, dict[str, Any]]], list[TaskProblem]]:
    rows, problems = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(_problem(path, number, f"invalid JSON: {exc.msg} (column {exc.colno})"))
            continue
        if not isinstance(row, dict):
            problems.append(_problem(path, number, f"expected a JSON object, got {type(row).__name__}"))
            continue
        rows.append((number, row))
    return rows, problems


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    return decode_text(data, str(path))


def _table_rows(table: Any) -> list[tuple[int, dict[str, Any]]]:
    return [(number, row) for number, row in enumerate(table.to_pylist(), start=1)]


def _datasets_folder(path: Path, split: str | None) -> Any:
    import pyarrow as pa

    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits") or []
        if split is None:
            if len(splits) != 1:
                raise TaskFileError([_problem(path, None, f"a DatasetDict folder with splits {', '.join(splits)}: "
                                                          "choose one with --split")])
            split = splits[0]
        if split not in splits:
            raise TaskFileError([_problem(path, None, f"no split '{split}' (splits: {', '.join(splits)})")])
        path = path / split
    state_file = path / "state.json"
    if not state_file.is_file():
        raise TaskFileError([_problem(path, None, "not a saved datasets folder (no state.json or dataset_dict.json)")])
    state = json.loads(state_file.read_text())
    tables = []
    for entry in state.get("_data_files") or []:
        with pa.memory_map(str(path / entry["filename"])) as stream:
            tables.append(pa.ipc.open_stream(stream).read_all())
    if not tables:
        raise TaskFileError([_problem(path, None, "the saved datasets folder lists no data files")])
    return pa.concat_tables(tables)


def open_source(path: str | Path, *, split: str | None = None, limit: int | None = None) -> Source:
    """Read every row of ``path``.

    Args:
        path: ``.jsonl``/``.ndjson`` (also ``.gz``), ``.json`` (an array of objects), ``.parquet``, or a
            folder saved by ``datasets`` (``save_to_disk``).
        split: The split of a ``DatasetDict`` folder.
        limit: Read only the first rows.

    Raises:
        TaskFileError: The source is missing, unreadable, or of no known kind.
    """
    path = Path(path)
    if not path.exists():
        raise TaskFileError([_problem(path, None, "no such file or folder")])
    problems: list[TaskProblem] = []
    name = path.name.lower().removesuffix(".gz")
    try:
        if path.is_dir():
            kind, rows = "datasets", _table_rows(_datasets_folder(path, split))
        elif name.endswith((".jsonl", ".ndjson")):
            kind = "jsonl"
            rows, problems = _jsonl_rows(path, _read_text(path))
        elif name.endswith(".json"):
            kind = "json"
            data = json.loads(_read_text(path))
            if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
                raise TaskFileError([_problem(path, None, "a .json source must be an array of objects")])
            rows = list(enumerate(data, start=1))
        elif name.endswith(".parquet"):
            import pyarrow.parquet as pq

            kind, rows = "parquet", _table_rows(pq.read_table(path))
        else:
            raise TaskFileError([_problem(path, None, "unknown source type: use .jsonl, .jsonl.gz, .json, .parquet "
                                                      "or a saved datasets folder")])
    except TaskFileError:
        raise
    except (OSError, ValueError) as exc:  # pyarrow's errors are ValueErrors or OSErrors
        raise TaskFileError([_problem(path, None, f"cannot read: {exc}")]) from exc
    if limit is not None:
        rows = rows[:limit]
    return Source(path, kind, source_hash(path), rows, problems)


def iter_text_files(folder: Path) -> Iterator[tuple[str, Path]]:
    """``(relative posix path, file)`` for every file under ``folder``, sorted, ``.git`` left out."""
    for file in sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink()):
        relative = file.relative_to(folder).as_posix()
        if relative == ".git" or relative.startswith(".git/") or "/.git/" in relative:
            continue
        yield relative, file
