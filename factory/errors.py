"""The one exception tree of `factory`.

Every error the library raises on purpose derives from :class:`FactoryError`.
The CLI maps the tree to a one-line message and an exit code; it prints a
traceback only for exceptions outside this tree, which are bugs.

::

    FactoryError                      exit 1
    ├── ConfigError                   exit 2   bad option, environment or config value
    ├── TaskFileError                 exit 2   malformed task file (every problem, file:line)
    └── StoreError                    exit 1   the DuckDB store
        ├── StoreNotFoundError        exit 1   no database at that path (read-only open)
        ├── StoreLockedError          exit 3   another process holds the write lock
        ├── MigrationError            exit 1   unknown or failed schema migration
        └── QueryError                exit 2   a user's SQL failed (one clean line)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ConfigError",
    "FactoryError",
    "MigrationError",
    "QueryError",
    "StoreError",
    "StoreLockedError",
    "StoreNotFoundError",
    "TaskFileError",
    "TaskProblem",
]


class FactoryError(Exception):
    """Root of every error `factory` raises on purpose.

    Attributes:
        exit_code: The process exit code the CLI uses for this error.
    """

    exit_code: int = 1


class ConfigError(FactoryError):
    """An option, environment variable or config value is invalid."""

    exit_code = 2


@dataclass(frozen=True)
class TaskProblem:
    """One problem found in a task file.

    Attributes:
        path: The task file.
        line: 1-based line of the task (or of the offending field, in YAML).
        field: Dotted field path (``files.a.py``), or ``None`` for a whole-line problem.
        message: What is wrong, in words.
    """

    path: str
    line: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        what = f"field '{self.field}': {self.message}" if self.field else self.message
        return f"{where}: {what}"


class TaskFileError(FactoryError):
    """A task file could not be loaded; carries every problem found, not just the first."""

    exit_code = 2

    def __init__(self, problems: list[TaskProblem]):
        self.problems = list(problems)
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''} in task file"
        super().__init__(head + "\n" + "\n".join(str(p) for p in self.problems))


class StoreError(FactoryError):
    """The DuckDB store failed."""


class StoreNotFoundError(StoreError):
    """A read-only open found no database file."""


class StoreLockedError(StoreError):
    """Another process holds the database's write lock."""

    exit_code = 3


class MigrationError(StoreError):
    """The schema could not be brought up to date."""


class QueryError(StoreError):
    """A user's SQL statement failed."""

    exit_code = 2
