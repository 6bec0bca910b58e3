"""``factory export validate``: an export file against its format, every problem naming its line.

Checks: the required columns and their types; one format per file (prompts
and completions are all message lists or all strings, never both); no empty
field (an empty string, list or message content where text is needed); chosen
differs from rejected; messages have known roles; KTO labels are booleans;
margins are finite numbers; the ``hints`` and ``spans`` rows' own contract
(:func:`~factory.export._feedback_rows.row_problems`).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from factory.errors import ExportValidationError
from factory.export._columns import FORMAT_COLUMNS, SIDE_FILE_COLUMNS
from factory.export._feedback_rows import row_problems
from factory.export._files import iter_records

__all__ = ["validate_file"]

_ROLES = {"system", "user", "assistant", "tool"}
_MAX_PROBLEMS = 200


def _shape(value: Any) -> str | None:
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "messages"
    return None


def _message_problems(value: list[Any], field: str) -> list[str]:
    problems = []
    if not value:
        return [f"field '{field}': empty message list"]
    for i, message in enumerate(value):
        where = f"field '{field}[{i}]'"
        if not isinstance(message, dict):
            problems.append(f"{where}: a message is an object, got {type(message).__name__}")
            continue
        role = message.get("role")
        if role not in _ROLES:
            problems.append(f"{where}: role {role!r} is not one of {sorted(_ROLES)}")
        has_calls = bool(message.get("tool_calls"))
        if not (message.get("content") or "").strip() and not has_calls and role != "tool":
            problems.append(f"{where}: empty content")
    return problems


def _columns(format_name: str) -> dict[str, str]:
    """The format's columns, without importing the format implementations (polars, the store) where not needed.

    Formats are registered in ``_formats``; until it is imported nothing can have replaced a built-in one.
    Side files (``reward-scalar``) are not formats of their own and have fixed columns.
    """
    if format_name in SIDE_FILE_COLUMNS:
        return SIDE_FILE_COLUMNS[format_name]
    if "factory.export._formats" not in sys.modules and format_name in FORMAT_COLUMNS:
        return FORMAT_COLUMNS[format_name]
    from factory.export._formats import create_format

    return dict(create_format(format_name).columns)


def validate_file(path: str | Path, format_name: str) -> int:
    """Check an export file; return its row count.

    Raises:
        ExportValidationError: With every problem (up to 200), each as ``FILE:LINE: field 'NAME': message``.
        ConfigError: Unknown format or extension.
    """
    path = Path(path)
    columns = _columns(format_name)
    problems: list[str] = []
    shapes: dict[str, tuple[str, int]] = {}  # conversational-or-text, decided by the first row
    rows = 0
    for line, record, error in iter_records(path):
        if len(problems) >= _MAX_PROBLEMS:
            problems.append(f"{path}: more problems not shown")
            break
        if record is None:
            problems.append(f"{path}:{line}: {error}")
            continue
        rows += 1
        found = [f"{path}:{line}: {p}" for p in [*_record_problems(record, columns, shapes, line),
                                                  *row_problems(format_name, record)]]
        problems.extend(found)
    if rows == 0 and not problems:
        problems.append(f"{path}: no rows")
    if problems:
        raise ExportValidationError(str(path), problems)
    return rows


def _record_problems(record: dict[str, Any], columns: dict[str, str], shapes: dict[str, tuple[str, int]],
                     line: int) -> list[str]:
    problems = []
    for name, kind in columns.items():
        if name not in record or record[name] is None:
            problems.append(f"field '{name}': missing")
            continue
        value = record[name]
        if kind == "bool":
            if not isinstance(value, bool):
                problems.append(f"field '{name}': expected true or false, got {value!r}")
        elif kind == "list":  # what the list holds is the format's own check (row_problems)
            if not isinstance(value, list):
                problems.append(f"field '{name}': expected a list, got {type(value).__name__}")
        elif kind == "number":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                problems.append(f"field '{name}': expected a finite number, got {value!r}")
        else:
            shape = _shape(value)
            allowed = kind.split("|")
            if shape not in allowed:
                problems.append(f"field '{name}': expected {' or '.join(allowed)}, got {type(value).__name__}")
                continue
            first = shapes.setdefault("content", (shape, line)) if len(allowed) > 1 else (shape, line)
            if first[0] != shape:  # a column that may be either: every such column of the file alike
                problems.append(f"field '{name}': {shape} in a file of {first[0]} rows (line {first[1]}); "
                                "one format per file")
            if shape == "text" and not value.strip():
                problems.append(f"field '{name}': empty")
            elif shape == "messages":
                problems.extend(_message_problems(value, name))
    if "chosen" in columns and record.get("chosen") is not None and record.get("chosen") == record.get("rejected"):
        problems.append("field 'rejected': identical to 'chosen'")
    return problems
