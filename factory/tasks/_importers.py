"""``factory tasks import``: a benchmark's rows as validated tasks, by format.

Each format is an :class:`Importer` registered by name in
:data:`TASK_IMPORTERS` (``humaneval``, ``mbpp``, ``gsm8k``, ``math``, ``swe``,
``mapped``; a plugin registers the same way). An importer turns one row into
task data; this module does the rest the same way for every format:

- every problem is named by source file, row and field (the row's column, or
  ``task.<field>`` where the task it built is invalid), and **nothing is
  skipped silently**: without ``skip_invalid`` any problem fails the whole
  import and nothing is written; with it the skipped rows are reported;
- every task records the format, the source's sha256, its row and its id in
  the source (``metadata.import``), so the same source gives byte-identical
  tasks with the same hashes, and a dataset says where it came from;
- the output is written atomically (a temporary file renamed over it), so a
  failed import never leaves a half-written file or loses the old one.

Reference solutions (the benchmark's canonical code, a SWE gold patch) go
into the task's ``solution`` field: never seeded into a branch's sandbox,
never exported, and verified by ``factory tasks check`` after the import.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError

from factory.errors import TaskFileError, TaskProblem
from factory.registry import Registry
from factory.tasks._schema import _ID_PATTERN, Task, dataset_hash
from factory.tasks._sources import Source, open_source

__all__ = ["TASK_IMPORTERS", "ImportReport", "Importer", "RowError", "SkippedRow", "import_tasks", "write_tasks"]

#: Task importers by format name (``factory tasks import FORMAT``).
TASK_IMPORTERS: Registry[type[Importer]] = Registry("task format")


class RowError(Exception):
    """What is wrong with one field of a row (raised by an importer; collected, never shown as a traceback).

    Args:
        field: The row's column (``test_list.2`` for an item), or ``None`` for the whole row.
        message: What is wrong, in words.
    """

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class Importer(ABC):
    """One benchmark format: a row in, task data out.

    Subclasses set :attr:`name` and :attr:`columns` and implement :meth:`convert`;
    :meth:`prepare` may read the whole source first (a map file, snapshots).

    Attributes:
        name: The format's name on the command line.
        columns: Columns every row must have (checked before :meth:`convert`).
        version: Bumped whenever the tasks it makes from the same row change; recorded in each task.
    """

    name: ClassVar[str]
    columns: ClassVar[tuple[str, ...]] = ()
    version: ClassVar[str] = "1"

    def __init__(self, **options: Any) -> None:
        self.options = options

    def prepare(self, source: Source) -> None:  # noqa: B027  (optional hook; most formats need nothing)
        """Look at the whole source before any row (default: nothing)."""

    @abstractmethod
    def convert(self, row: Mapping[str, Any], number: int) -> dict[str, Any]:
        """Task data (the fields of :class:`~factory.tasks.Task`) for one row.

        Args:
            row: The row, column -> value.
            number: Its 1-based row number (for ids of formats without one).

        Raises:
            RowError: A field of the row is missing or wrong.
        """

    def source_id(self, row: Mapping[str, Any], number: int) -> str | None:
        """The row's own id in the benchmark, if it has one."""
        return None


def text_field(row: Mapping[str, Any], name: str, *, required: bool = True, blank: bool = False) -> str | None:
    """A string column, or a :class:`RowError` naming it."""
    value = row.get(name)
    if value is None:
        if required:
            raise RowError(name, "required column is missing" if name not in row else "is null")
        return None
    if not isinstance(value, str):
        raise RowError(name, f"expected a string, got {type(value).__name__}")
    if not blank and not value.strip():
        raise RowError(name, "must not be empty")
    return value


def list_field(row: Mapping[str, Any], name: str, *, required: bool = True) -> list[str]:
    """A column holding a list of strings (a JSON-encoded list is accepted, as SWE-bench stores them)."""
    value = row.get(name)
    if value is None:
        if required:
            raise RowError(name, "required column is missing" if name not in row else "is null")
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RowError(name, f"expected a list of strings (or one JSON-encoded), got text: {exc.msg}") from exc
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
        raise RowError(name, "expected a list of strings")
    return list(value)


def safe_id(text: str) -> str:
    """A benchmark id as a task id: characters a task id may not hold become ``-`` (``HumanEval/0`` ->
    ``HumanEval-0``)."""
    cleaned = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "._:@+-") else "-" for ch in text.strip())
    cleaned = cleaned.lstrip("._:@+-")[:200]
    if not cleaned or not _ID_PATTERN.match(cleaned):
        raise RowError(None, f"cannot make a task id of {text!r}")
    return cleaned


@dataclass(frozen=True)
class SkippedRow:
    """A row left out by ``--skip-invalid``, with every problem it had."""

    row: int
    problems: list[TaskProblem]


@dataclass
class ImportReport:
    """What an import made.

    Attributes:
        format: The importer's name.
        source: The source file or folder.
        source_sha256: Its hash, as recorded in every task.
        rows: Rows read.
        tasks: The tasks, in row order.
        skipped: Rows left out (only with ``skip_invalid``).
        dataset_hash: The tasks' dataset hash (as ``factory tasks validate`` prints it).
    """

    format: str
    source: str
    source_sha256: str
    rows: int
    tasks: list[Task] = field(default_factory=list)
    skipped: list[SkippedRow] = field(default_factory=list)
    dataset_hash: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format, "source": self.source, "source_sha256": self.source_sha256, "rows": self.rows,
            "imported": len(self.tasks), "dataset_hash": self.dataset_hash,
            "with_reference": sum(bool(t.solution) for t in self.tasks),
            "skipped": [{"row": s.row, "problems": [str(p) for p in s.problems]} for s in self.skipped],
        }


def _task_problems(path: str, number: int, exc: ValidationError) -> list[TaskProblem]:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        problems.append(TaskProblem(path, number, f"task.{where}" if where else "task", message))
    return problems


def import_tasks(fmt: str, source: str | Path, *, skip_invalid: bool = False, split: str | None = None,
                 limit: int | None = None, **options: Any) -> ImportReport:
    """Import a benchmark's rows as tasks.

    Args:
        fmt: A name in :data:`TASK_IMPORTERS`.
        source: The rows (see :func:`factory.tasks._sources.open_source`).
        skip_invalid: Leave out (and report) rows with problems instead of failing.
        split: The split of a ``DatasetDict`` folder.
        limit: Import only the first rows.
        **options: The importer's own options (``map_file``, ``repos``, ``id_prefix``).

    Returns:
        The tasks and what was skipped.

    Raises:
        ConfigError: No importer of that name.
        TaskFileError: Any row has a problem (every problem listed), unless ``skip_invalid``.
    """
    importer = TASK_IMPORTERS.get(fmt)(**options)
    opened = open_source(source, split=split, limit=limit)
    importer.prepare(opened)
    path = str(opened.path)
    report = ImportReport(fmt, path, opened.sha256, len(opened.rows) + len(opened.problems))
    problems: dict[int, list[TaskProblem]] = {}
    for problem in opened.problems:
        problems.setdefault(problem.line or 0, []).append(problem)
    first_row: dict[str, int] = {}
    for number, row in opened.rows:
        row_problems = [TaskProblem(path, number, column, "required column is missing")
                        for column in importer.columns if column not in row]
        if row_problems:
            problems[number] = row_problems
            continue
        try:
            data = importer.convert(row, number)
        except RowError as exc:
            problems[number] = [TaskProblem(path, number, exc.field, exc.message)]
            continue
        metadata = dict(data.get("metadata") or {})
        metadata["import"] = {"format": fmt, "importer_version": importer.version, "source_sha256": opened.sha256,
                              "row": number, "source_id": importer.source_id(row, number)}
        try:
            task = Task.model_validate({**data, "metadata": metadata})
        except ValidationError as exc:
            problems[number] = _task_problems(path, number, exc)
            continue
        if task.id in first_row:
            problems[number] = [TaskProblem(path, number, "id", f"duplicate task id '{task.id}' "
                                                                 f"(first made from row {first_row[task.id]})")]
            continue
        first_row[task.id] = number
        report.tasks.append(task)
    if problems and not skip_invalid:
        raise TaskFileError([p for row in sorted(problems) for p in problems[row]], what=f"{fmt} source "
                            "(nothing written; --skip-invalid leaves these rows out)")
    report.skipped = [SkippedRow(row, problems[row]) for row in sorted(problems)]
    if not report.tasks:
        raise TaskFileError([TaskProblem(path, None, None, "no task could be imported"
                                         + (f" ({len(report.skipped)} row(s) skipped)" if report.skipped else ""))])
    report.dataset_hash = dataset_hash(report.tasks)
    return report


def write_tasks(tasks: Sequence[Task], out: str | Path) -> Path:
    """Write tasks as JSONL, atomically (staged beside ``out``, renamed over it: :func:`~factory.outputs.write_output`).

    Each line is the task's canonical JSON with sorted keys, so the same tasks give the same bytes. The
    staged file is the common ``.NAME.<pid>-<hex>.tmp.jsonl``, locked while this process lives, so one a
    killed import left behind is swept by the next writer into the folder; a full disk is one line.
    """
    from factory.outputs import write_output

    def write(path: Path) -> None:
        with path.open("w", encoding="utf-8") as handle:
            for task in tasks:
                handle.write(json.dumps(task.canonical(), sort_keys=True, ensure_ascii=False) + "\n")

    return write_output(out, write, operation="tasks import")
