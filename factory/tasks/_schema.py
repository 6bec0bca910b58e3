"""Task schema and loaders (JSONL or YAML).

A task file holds one task per JSONL line, or a YAML list of tasks (optionally
under a top-level ``tasks:`` key). Loading is all-or-nothing and reports *every*
problem with its file, line and field, so a user fixes a file in one pass::

    tasks.jsonl:4: field 'prompt': required field is missing
    tasks.jsonl:7: field 'id': duplicate id 'fix-factorial' (first defined on line 2)

The fields a task carries select the verifiers that apply to it
(:attr:`Task.verifiers`). The dataset hash is sha256 over the canonical JSON of
the normalized tasks sorted by id: the same tasks hash the same whether written
as JSONL or YAML, in any key or line order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from factory.errors import TaskFileError, TaskProblem
from factory.provenance import content_hash

__all__ = [
    "DEFAULT_ENTRY",
    "DEFAULT_TEST_COMMAND",
    "RubricItem",
    "Rules",
    "Task",
    "TaskLimits",
    "TaskSet",
    "check_image_reference",
    "dataset_hash",
    "load_tasks",
    "parse_tasks",
]

#: The test command of a task with tests and no `test_command`.
DEFAULT_TEST_COMMAND = "python -m pytest -q"
#: The page a front-end task's browser opens when the task names no `entry`.
DEFAULT_ENTRY = "index.html"

_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,199}$")
_JSON_TYPE_NAMES = {
    dict: "object", list: "array", str: "string", int: "integer",
    float: "number", bool: "boolean", type(None): "null",
}


def _json_type(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


#: Longest file or folder name in a task path, in UTF-8 bytes (NAME_MAX on Linux and macOS).
MAX_NAME_BYTES = 255
#: Longest task path, in UTF-8 bytes: well inside PATH_MAX (4096) once joined to any workspace folder.
MAX_PATH_BYTES = 1024


def _shown(path: str) -> str:
    return repr(path) if len(path) <= 60 else repr(path[:40] + "...")


def _check_relative_path(path: str) -> str:
    """Reject paths that could escape a sandbox workspace, or that no file system could hold."""
    if not path or "\x00" in path or "\\" in path:
        raise ValueError(f"invalid file path {path!r}")
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or str(pure) in ("", "."):
        raise ValueError(f"file path {path!r} must be relative and stay inside the workspace")
    size = len(str(pure).encode("utf-8", "surrogatepass"))
    if size > MAX_PATH_BYTES:
        raise ValueError(f"file path {_shown(path)} is {size} bytes long; at most {MAX_PATH_BYTES}")
    for part in pure.parts:
        part_size = len(part.encode("utf-8", "surrogatepass"))
        if part_size > MAX_NAME_BYTES:
            what = f"file path {_shown(path)}" + ("" if part == str(pure) else f": name {_shown(part)}")
            raise ValueError(f"{what} is {part_size} bytes long; a file or folder name is at most {MAX_NAME_BYTES}")
    return str(pure)


def _normalized_paths(files: dict[str, str]) -> dict[str, str]:
    """``files`` with each path checked and normalized; two spellings of one path are refused."""
    normalized: dict[str, str] = {}
    spelled: dict[str, str] = {}
    for path, text in files.items():
        pure = _check_relative_path(path)
        if pure in normalized:
            raise ValueError(f"file paths {spelled[pure]!r} and {path!r} name the same file")
        normalized[pure], spelled[pure] = text, path
    return normalized


def _folder_conflicts(groups: dict[str, dict[str, str]]) -> list[str]:
    """Each path that is a file in one place and a folder of another path (``x`` and ``x/y``), across the groups."""
    where = {path: name for name, paths in groups.items() for path in paths}
    conflicts = []
    for path, name in sorted(where.items()):
        for folder in PurePosixPath(path).parents:
            folder_name = str(folder)
            if folder_name in where:
                conflicts.append(f"{where[folder_name]} path {_shown(folder_name)} is a file, but {name} path "
                                 f"{_shown(path)} needs a folder there")
                break
    return conflicts


class Rules(BaseModel):
    """Programmatic checks for the ``rules`` verifier.

    Attributes:
        max_chars: Longest allowed final answer, in characters.
        min_chars: Shortest allowed final answer, in characters.
        banned_phrases: Case-insensitive phrases that must not appear.
        required_phrases: Case-insensitive phrases that must appear.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    max_chars: int | None = Field(default=None, gt=0)
    min_chars: int | None = Field(default=None, ge=0)
    banned_phrases: list[str] = Field(default_factory=list)
    required_phrases: list[str] = Field(default_factory=list)


class RubricItem(BaseModel):
    """One criterion of a front-end task's itemised rubric.

    Attributes:
        criterion: What must hold, in plain language (what a user would see or do).
        level: ``critical`` (failing it caps the score) or ``detail``.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    criterion: str
    level: Literal["critical", "detail"]

    @field_validator("criterion")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value


#: Fields added after the first task schema, with the defaults a task hash leaves out.
_LATER_FIELD_DEFAULTS: dict[str, Any] = {"hidden_tests": {}, "test_isolation": "process", "image": None,
                                         "solution": {}, "limits": None, "kind": "code", "entry": None,
                                         "serve": None}

# A Docker image reference, as the engine parses one (distribution's reference
# grammar): [registry[:port]/]path[:tag][@digest], path components lowercase.
_IMAGE_DOMAIN_PART = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_IMAGE_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_DOMAIN = rf"{_IMAGE_DOMAIN_PART}(?:\.{_IMAGE_DOMAIN_PART})*(?::[0-9]+)?"
_IMAGE_NAME = rf"(?:{_IMAGE_DOMAIN}/)?{_IMAGE_PATH_PART}(?:/{_IMAGE_PATH_PART})*"
_IMAGE_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_IMAGE_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_IMAGE_REFERENCE = re.compile(rf"(?P<name>{_IMAGE_NAME})(?::{_IMAGE_TAG})?(?:@{_IMAGE_DIGEST})?")
_IMAGE_NAME_MAX = 255


def check_image_reference(value: str) -> str:
    """Return ``value`` if it is a Docker image reference, else raise ValueError saying why.

    Raises:
        ValueError: Whitespace, an empty name, upper case in the repository, or no reference shape at all.
    """
    if not value.strip():
        raise ValueError("must not be empty")
    if any(ch.isspace() for ch in value):
        raise ValueError(f"invalid image reference {value!r}: it must not contain whitespace")
    match = _IMAGE_REFERENCE.fullmatch(value)
    if match is None:
        hint = " (repository path components are lowercase)" if value != value.lower() else ""
        raise ValueError(f"invalid image reference {value!r}: expected repository[:tag][@digest], "
                         f"e.g. 'python:3.12-slim'{hint}")
    if len(match["name"]) > _IMAGE_NAME_MAX:
        raise ValueError(f"invalid image reference {value[:40]!r}...: the repository name is "
                         f"{len(match['name'])} characters long; at most {_IMAGE_NAME_MAX}")
    return value


class TaskLimits(BaseModel):
    """Limits of one task's test runs, over the verifier's defaults (each field optional).

    Attributes:
        timeout_s: Wall-clock seconds the whole test run may take (its ceiling).
        inactivity_s: Seconds an isolated pytest or unittest run may go without a
            test finishing before it is stopped (the inactivity window).
        cpu_seconds: CPU seconds each process of the run may use (RLIMIT_CPU).
        memory_mb: Address space per process, in MiB.
        max_processes: Processes each sandbox may hold at once (process pools count).
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    timeout_s: float | None = Field(default=None, gt=0, le=3600)
    inactivity_s: float | None = Field(default=None, gt=0, le=3600)
    cpu_seconds: int | None = Field(default=None, gt=0, le=3600)
    memory_mb: int | None = Field(default=None, ge=64, le=65536)
    max_processes: int | None = Field(default=None, ge=4, le=4096)


class Task(BaseModel):
    """One task: a prompt plus what is needed to verify answers to it.

    Attributes:
        id: Unique id within the file (letters, digits, ``._:@+-``).
        prompt: What the agent is asked to do.
        files: Workspace files seeded into each branch's sandbox (path -> text).
        tests: Test files, mounted read-only; selects the ``tests`` verifier.
        hidden_tests: Test files never shown to the agent (same shape as
            ``tests``): they join the visible tests only at verification, so a
            solution cannot be fitted to them. Use them when the visible tests
            are few or their expected values could be copied into a solution.
        test_isolation: ``process`` (default): the solution's code runs in its own
            sandboxed process and the tests reach it through an import boundary
            that carries plain data only. ``in-process``: the old guarded run
            of pytest and the solution in one process, for tests that need to
            pass callables or objects to the solution, run it as a program, or
            read files it wrote; its verdicts say ``isolation: in-process``.
        image: Container image the task's sandboxes start from, for container
            sandbox backends (``docker``), as a Docker image reference
            ``repository[:tag][@digest]`` (e.g. ``python:3.12-slim``); ``None``
            (default) takes the backend's own default image. Backends that are
            not containers ignore it.
        solution: A reference solution (path -> text), laid over ``files``: never
            seeded into a branch's sandbox nor shown to the agent; ``factory tasks
            check`` verifies it isolated and bare to find tasks whose tests the
            isolation boundary cannot carry. Its paths may not be test paths.
        limits: Limits of this task's test runs (:class:`TaskLimits`), for suites
            that need more time, CPU, memory or processes than the verifier's
            defaults give; unset fields keep the defaults.
        test_command: Command that runs the tests (default ``python -m pytest -q``).
        kind: ``code`` (default) or ``frontend``: a page or web app, verified by
            the ``browser`` verifier (a planned interaction in headless Chromium
            judged against the rubric) instead of the text ``judge``.
        entry: A front-end task's page to open, relative to the workspace
            (default :data:`DEFAULT_ENTRY`).
        serve: A front-end task's command serving the app, for apps that need a
            server: it runs in the sandbox and must listen on ``127.0.0.1:$PORT``;
            without it the workspace is served by a small static server.
        answer: Expected final answer; selects the strict ``answer`` verifier.
        rubric: Grading rubric; selects the LLM ``judge`` (a ``frontend`` task's:
            the ``browser`` verifier). A front-end task may itemise it as a list
            of :class:`RubricItem` (each ``critical`` or ``detail``).
        build_command: Build or compile command; selects the ``build`` verifier.
        json_schema: JSON Schema the output must match; selects ``json-schema``.
        rules: Programmatic checks; selects the ``rules`` verifier.
        metadata: Free-form data carried through to exports.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    id: str
    prompt: str
    files: dict[str, str] = Field(default_factory=dict)
    tests: dict[str, str] = Field(default_factory=dict)
    hidden_tests: dict[str, str] = Field(default_factory=dict)
    test_isolation: Literal["process", "in-process"] = "process"
    image: str | None = None
    solution: dict[str, str] = Field(default_factory=dict)
    limits: TaskLimits | None = None
    kind: Literal["code", "frontend"] = "code"
    entry: str | None = None
    serve: str | None = None
    test_command: str | None = None
    answer: str | None = None
    rubric: str | list[RubricItem] | None = None
    build_command: str | None = None
    json_schema: dict[str, Any] | None = None
    rules: Rules | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        if not _ID_PATTERN.match(value):
            raise ValueError(
                f"invalid id {value!r}: use 1-200 letters, digits or ._:@+- , starting with a letter or digit"
            )
        return value

    @field_validator("prompt", "test_command", "build_command", "serve")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("rubric")
    @classmethod
    def _rubric_given(cls, value: str | list[RubricItem] | None) -> str | list[RubricItem] | None:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must not be empty")
        if isinstance(value, list) and not value:
            raise ValueError("an itemised rubric needs at least one item")
        return value

    @field_validator("entry")
    @classmethod
    def _entry_path(cls, value: str | None) -> str | None:
        return None if value is None else _check_relative_path(value)

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str | None) -> str | None:
        return None if value is None else check_image_reference(value)

    @field_validator("answer", mode="before")
    @classmethod
    def _answer_text(cls, value: Any) -> Any:
        # Integers are a natural way to write numeric answers; floats and
        # booleans are not (1.0 vs 1, true vs True), so they are refused.
        if isinstance(value, bool) or not isinstance(value, (str, int, type(None))):
            raise ValueError(f"expected a string or integer, got {_json_type(value)}")
        if value is None or isinstance(value, int):
            return None if value is None else str(value)
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("files", "tests", "hidden_tests", "solution")
    @classmethod
    def _safe_paths(cls, value: dict[str, str]) -> dict[str, str]:
        return _normalized_paths(value)

    @model_validator(mode="after")
    def _consistent(self) -> Task:
        groups = {"files": self.files, "tests": self.tests, "hidden_tests": self.hidden_tests,
                  "solution": self.solution}  # a solution may replace files, never tests
        for name_a, name_b in (("files", "tests"), ("files", "hidden_tests"), ("tests", "hidden_tests"),
                               ("solution", "tests"), ("solution", "hidden_tests")):
            a, b = groups[name_a], groups[name_b]
            overlap = sorted(set(a) & set(b))
            if overlap:
                raise ValueError(f"paths in both {name_a} and {name_b}: {', '.join(overlap)}")
        conflicts = _folder_conflicts(groups)
        if conflicts:
            raise ValueError("; ".join(conflicts))
        if self.test_command is not None and not self.all_tests:
            raise ValueError("test_command is set but tests is empty")
        if self.kind != "frontend":
            extra = [name for name in ("entry", "serve") if getattr(self, name) is not None]
            if extra:
                raise ValueError(f"{', '.join(extra)} apply only to kind: frontend tasks")
            if isinstance(self.rubric, list):
                raise ValueError("an itemised rubric (a list) applies only to kind: frontend tasks")
        elif self.rubric is None:
            raise ValueError("a kind: frontend task needs a rubric (what the browser judge checks)")
        return self

    @property
    def entry_page(self) -> str:
        """The page a front-end task's browser opens (:attr:`entry`, else :data:`DEFAULT_ENTRY`)."""
        return self.entry or DEFAULT_ENTRY

    @property
    def rubric_text(self) -> str | None:
        """The rubric as one text: itemised rubrics one ``- [level] criterion`` line per item."""
        if isinstance(self.rubric, list):
            return "\n".join(f"- [{item.level}] {item.criterion}" for item in self.rubric)
        return self.rubric

    @property
    def all_tests(self) -> dict[str, str]:
        """Visible and hidden tests together: what verification runs."""
        return {**self.tests, **self.hidden_tests}

    @property
    def effective_test_command(self) -> str | None:
        """The command the tests verifier runs, or None without tests."""
        if not self.all_tests:
            return None
        return self.test_command or DEFAULT_TEST_COMMAND

    @property
    def verifiers(self) -> tuple[str, ...]:
        """Names of the verifiers this task's fields select, in a fixed order."""
        selected = [
            ("tests", bool(self.all_tests)),
            ("build", self.build_command is not None),
            ("answer", self.answer is not None),
            ("json-schema", self.json_schema is not None),
            ("rules", self.rules is not None),
            ("judge", self.rubric is not None and self.kind != "frontend"),
            ("browser", self.rubric is not None and self.kind == "frontend"),
        ]
        return tuple(name for name, applies in selected if applies)

    def canonical(self) -> dict[str, Any]:
        """The normalized task as plain JSON data (defaults filled in).

        Fields added after the first schema are left out at their defaults,
        so tasks that do not use them keep the hash they always had (and old
        runs still resume).
        """
        data = self.model_dump(mode="json")
        for name, default in _LATER_FIELD_DEFAULTS.items():
            if data.get(name) == default:
                data.pop(name, None)
        if isinstance(data.get("limits"), dict) and data["limits"].get("inactivity_s") is None:
            data["limits"].pop("inactivity_s", None)  # (a later field: tasks with limits keep their hash)
        return data

    def task_hash(self) -> str:
        """sha256 of this task's canonical JSON."""
        return content_hash(self.canonical())


@dataclass(frozen=True)
class TaskSet:
    """Tasks loaded from one file, with where each came from.

    Attributes:
        path: The file the tasks were read from.
        tasks: The tasks, in file order.
        lines: Task id -> 1-based line where the task starts.
        dataset_hash: ``sha256:<hex>`` over the canonical tasks sorted by id.
    """

    path: Path
    tasks: tuple[Task, ...]
    lines: dict[str, int]
    dataset_hash: str

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, task_id: str) -> Task:
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise KeyError(task_id)


@dataclass
class _RawTask:
    line: int
    data: Any
    field_lines: dict[str, int]


_PYDANTIC_MESSAGES = {
    "missing": "required field is missing",
    "string_type": "expected a string",
    "int_type": "expected an integer",
    "dict_type": "expected an object",
    "model_type": "expected an object",
    "list_type": "expected an array",
}


def _describe(error: dict[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind in _PYDANTIC_MESSAGES:
        text = _PYDANTIC_MESSAGES[kind]
        if kind != "missing":
            text += f", got {_json_type(error.get('input'))}"
        return text
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def _field_path(loc: tuple[Any, ...]) -> str | None:
    parts = [str(part) for part in loc]
    return ".".join(parts) if parts else None


def _validate(path: str, raw: list[_RawTask]) -> tuple[list[tuple[Task, int]], list[TaskProblem]]:
    problems: list[TaskProblem] = []
    tasks: list[tuple[Task, int]] = []
    first_line: dict[str, int] = {}
    allowed = ", ".join(Task.model_fields)
    for item in raw:
        if not isinstance(item.data, dict):
            problems.append(TaskProblem(path, item.line, None, f"expected a task object, got {_json_type(item.data)}"))
            continue
        try:
            task = Task.model_validate(item.data)
        except ValidationError as exc:
            for error in exc.errors():
                field = _field_path(error["loc"])
                top = str(error["loc"][0]) if error["loc"] else None
                line = item.field_lines.get(top, item.line) if top else item.line
                message = _describe(error)
                if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
                    message += f" (allowed: {allowed})"
                problems.append(TaskProblem(path, line, field, message))
            continue
        if task.id in first_line:
            problems.append(TaskProblem(
                path, item.field_lines.get("id", item.line), "id",
                f"duplicate id '{task.id}' (first defined on line {first_line[task.id]})",
            ))
            continue
        first_line[task.id] = item.line
        tasks.append((task, item.line))
    return tasks, problems


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key '{key}'")
        seen[key] = value
    return seen


def _read_jsonl(path: str, text: str) -> tuple[list[_RawTask], list[TaskProblem]]:
    raw: list[_RawTask] = []
    problems: list[TaskProblem] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line, object_pairs_hook=_reject_duplicate_keys)
        except json.JSONDecodeError as exc:
            problems.append(TaskProblem(path, number, None, f"invalid JSON: {exc.msg} (column {exc.colno})"))
            continue
        except ValueError as exc:  # duplicate key
            problems.append(TaskProblem(path, number, None, f"invalid JSON: {exc}"))
            continue
        raw.append(_RawTask(number, data, {}))
    return raw, problems


def _read_yaml(path: str, text: str) -> tuple[list[_RawTask], list[TaskProblem]]:
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return [], []
        if isinstance(root, yaml.MappingNode):
            keys = {key.value: value for key, value in root.value if isinstance(key, yaml.ScalarNode)}
            if set(keys) != {"tasks"}:
                line = root.start_mark.line + 1
                return [], [TaskProblem(path, line, None, "expected a list of tasks, or a mapping with only 'tasks:'")]
            root = keys["tasks"]
        if not isinstance(root, yaml.SequenceNode):
            return [], [TaskProblem(path, root.start_mark.line + 1, None, "expected a list of tasks")]
        raw = []
        for node in root.value:
            field_lines = {}
            if isinstance(node, yaml.MappingNode):
                field_lines = {
                    str(key.value): key.start_mark.line + 1
                    for key, _ in node.value if isinstance(key, yaml.ScalarNode)
                }
            raw.append(_RawTask(node.start_mark.line + 1, loader.construct_document(node), field_lines))
        return raw, []
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        return [], [TaskProblem(path, line, None, f"invalid YAML: {exc.problem or exc.context}")]
    except yaml.YAMLError as exc:
        return [], [TaskProblem(path, None, None, f"invalid YAML: {exc}")]
    finally:
        loader.dispose()


_READERS = {".jsonl": _read_jsonl, ".ndjson": _read_jsonl, ".yaml": _read_yaml, ".yml": _read_yaml}


def _parse(text: str, path: str, fmt: str) -> list[tuple[Task, int]]:
    reader = _READERS.get(fmt)
    if reader is None:
        raise TaskFileError([TaskProblem(
            path, None, None, f"unsupported task file type '{fmt}' (use {', '.join(_READERS)})"
        )])
    raw, problems = reader(path, text)
    tasks, invalid = _validate(path, raw)
    problems += invalid
    if not raw and not problems:
        problems.append(TaskProblem(path, None, None, "no tasks in file"))
    if problems:
        raise TaskFileError(sorted(problems, key=lambda p: p.line or 0))
    return tasks


def parse_tasks(text: str, path: str, fmt: str) -> list[Task]:
    """Parse task text already read from ``path``.

    Args:
        text: The file contents.
        path: Name used in error messages.
        fmt: A suffix naming the format: ``.jsonl``, ``.ndjson``, ``.yaml`` or ``.yml``.

    Raises:
        TaskFileError: With every problem found.
    """
    return [task for task, _ in _parse(text, path, fmt)]


def load_tasks(path: str | Path) -> TaskSet:
    """Load and validate a task file.

    Args:
        path: A ``.jsonl``/``.ndjson`` or ``.yaml``/``.yml`` file.

    Returns:
        The tasks with their line numbers and dataset hash.

    Raises:
        TaskFileError: If the file is missing, unreadable or has any problem.
    """
    file = Path(path)
    name = str(path)
    text = decode_text(read_file_bytes(path), name)
    parsed = _parse(text, name, file.suffix.lower())
    tasks = tuple(task for task, _ in parsed)
    return TaskSet(
        path=file,
        tasks=tasks,
        lines={task.id: line for task, line in parsed},
        dataset_hash=dataset_hash(tasks),
    )


def read_file_bytes(path: str | Path) -> bytes:
    """A user's input file's bytes; an unreadable one is a :class:`TaskFileError` naming it."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TaskFileError([TaskProblem(str(path), None, None, f"cannot read file: {exc.strerror or exc}")]) from exc


def decode_text(data: bytes, name: str) -> str:
    """``data`` as UTF-8; a bad byte is a :class:`TaskFileError` naming ``name`` and the line it is on."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TaskFileError([TaskProblem(name, line, None, "file is not valid UTF-8")]) from exc


def dataset_hash(tasks: Iterable[Task]) -> str:
    """sha256 over the canonical tasks sorted by id (order- and format-independent)."""
    return content_hash(sorted((t.canonical() for t in tasks), key=lambda t: t["id"]))
