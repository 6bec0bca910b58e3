"""Tasks: the schema and loaders (JSONL or YAML), and importers of the benchmarks users already have.

- :mod:`factory.tasks._schema`: :class:`Task` and :func:`load_tasks`, every problem named by file, line
  and field.
- :mod:`factory.tasks._importers`: ``factory tasks import FORMAT SOURCE``: rows of a benchmark (JSONL,
  Parquet or a saved ``datasets`` folder) as tasks, each format an :class:`Importer` registered by name
  in :data:`TASK_IMPORTERS`.
"""

from factory.tasks import _formats, _swe  # noqa: F401  (the built-in formats register themselves)
from factory.tasks._formats import MAP_KEYS
from factory.tasks._importers import (
    TASK_IMPORTERS,
    Importer,
    ImportReport,
    SkippedRow,
    import_tasks,
    write_tasks,
)
from factory.tasks._schema import (
    DEFAULT_ENTRY,
    DEFAULT_TEST_COMMAND,
    RubricItem,
    Rules,
    Task,
    check_image_reference,
    dataset_hash,
    decode_text,
    load_tasks,
    read_file_bytes,
)
from factory.tasks._swe import apply_patch

__all__ = [
    "DEFAULT_ENTRY",
    "DEFAULT_TEST_COMMAND",
    "MAP_KEYS",
    "TASK_IMPORTERS",
    "ImportReport",
    "Importer",
    "RubricItem",
    "Rules",
    "SkippedRow",
    "Task",
    "apply_patch",
    "check_image_reference",
    "dataset_hash",
    "decode_text",
    "import_tasks",
    "load_tasks",
    "read_file_bytes",
    "write_tasks",
]
