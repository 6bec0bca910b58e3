"""The one exception tree of `factory`.

Every error the library raises on purpose derives from :class:`FactoryError`.
The CLI maps the tree to a one-line message and an exit code; it prints a
traceback only for exceptions outside this tree, which are bugs.

::

    FactoryError                      exit 1
    ├── ConfigError                   exit 2   bad option, environment or config value
    ├── TaskFileError                 exit 2   malformed task file (every problem, file:line)
    ├── StoreError                    exit 1   the DuckDB store
    │   ├── StoreNotFoundError        exit 1   no database at that path (read-only open)
    │   ├── StoreLockedError          exit 3   another process holds the write lock
    │   ├── MigrationError            exit 1   unknown or failed schema migration
    │   └── QueryError                exit 2   a user's SQL failed (one clean line)
    ├── RecordError                   exit 1   a stored record is not a shape this factory reads
    ├── SandboxError                  exit 1   a sandbox could not start or run
    │   ├── SandboxUnavailableError   exit 1   backend missing here (names the install command)
    │   └── SandboxPathError          exit 1   a path escapes the workspace (a tool error, not a crash)
    ├── ModelError                    exit 1   a policy / judge model call failed
    │   ├── ModelConfigError          exit 2   bad model spec, missing SDK or weights
    │   ├── RateLimitError            exit 1   429: retried with backoff, concurrency shrinks
    │   ├── ProviderServerError       exit 1   5xx: retried with backoff
    │   ├── ProviderTimeoutError      exit 1   timeout: retried with backoff
    │   │   └── ProviderConnectionError exit 1 no connection (nothing listens): retried; arms the circuit breaker
    │   ├── ProviderRequestError      exit 1   4xx other than 429: not retried
    │   ├── MalformedResponseError    exit 1   a body that is not the protocol (cut off, say): retried with backoff
    │   ├── ProviderExhaustedError    exit 1   retries or the request timeout used up: the infrastructure failed
    │   ├── ProviderUnavailableError  exit 1   the provider is gone for the whole run: the run stops (resumable)
    │   │   ├── EndpointDownError     exit 1   nothing but connection failures for a window (circuit breaker)
    │   │   └── EngineCrashedError    exit 1   an engine's child process died (the signal named, and the remedy)
    │   └── ReplayMissError           exit 1   replay: no recorded response for a request
    ├── RunError                      exit 1   a fork run cannot start or resume
    │   └── RunAbortedError           exit 1   a fork stopped because its provider became unavailable
    ├── ExportError                   exit 1   an export cannot be made (no such run, nothing to export)
    │   └── ExportValidationError     exit 2   an exported file breaks its format (every problem, file:line)
    ├── FeedbackError                 exit 2   feedback naming no branch, turn or stored row; a bad feedback file
    ├── OutputSpaceError              exit 1   the disk (or quota) filled while writing an output: staged files removed
    └── TrainingStoppedError          exit 4   a monitor (the reward-hacking detector) ended training early
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ConfigError",
    "EndpointDownError",
    "EngineCrashedError",
    "ExportError",
    "ExportValidationError",
    "FactoryError",
    "FeedbackError",
    "MalformedResponseError",
    "MigrationError",
    "OutputSpaceError",
    "ModelConfigError",
    "ModelError",
    "ProviderConnectionError",
    "ProviderExhaustedError",
    "ProviderRequestError",
    "ProviderServerError",
    "ProviderTimeoutError",
    "ProviderUnavailableError",
    "QueryError",
    "RateLimitError",
    "RecordError",
    "ReplayMissError",
    "RunAbortedError",
    "RunError",
    "SandboxError",
    "SandboxPathError",
    "SandboxUnavailableError",
    "StoreError",
    "StoreLockedError",
    "StoreNotFoundError",
    "TaskFileError",
    "TaskProblem",
    "TrainingStoppedError",
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

    def __init__(self, problems: list[TaskProblem], what: str = "task file"):
        self.problems = list(problems)
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''} in {what}"
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


class RecordError(FactoryError):
    """A stored record (run manifest, event, workspace snapshot, export manifest...) cannot be read.

    It is not JSON, not the record's shape, or was written by a newer factory.
    """


class SandboxError(FactoryError):
    """A sandbox could not be started or could not run a command."""


class SandboxUnavailableError(SandboxError):
    """The backend cannot run on this machine; the message says how to fix that."""


class SandboxPathError(SandboxError):
    """A path given to a sandbox file operation escapes its workspace."""


class ModelError(FactoryError):
    """A model call failed.

    Attributes:
        retryable: Whether a retry with backoff may succeed.
        retry_after: Seconds the server asked to wait, if it said.
    """

    retryable: bool = False

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class ModelConfigError(ModelError):
    """A model spec, SDK install or weight file is wrong."""

    exit_code = 2


class RateLimitError(ModelError):
    """The provider answered 429."""

    retryable = True


class ProviderServerError(ModelError):
    """The provider answered with a 5xx status."""

    retryable = True


class ProviderTimeoutError(ModelError):
    """The request timed out or the connection failed."""

    retryable = True


class ProviderConnectionError(ProviderTimeoutError):
    """The connection to the provider could not be made (nothing listens, refused, unreachable).

    Retried like a timeout; when nothing but these comes back for a whole
    window, the run's circuit breaker stops the run (:class:`EndpointDownError`).
    """


class ProviderRequestError(ModelError):
    """The provider rejected the request (4xx other than 429)."""


class MalformedResponseError(ModelError):
    """The response body does not follow the provider's protocol.

    A body cut off in transit or a proxy's error page is a transient fault of
    the provider's side, like a 5xx, so it is retried.
    """

    retryable = True


class ProviderExhaustedError(ModelError):
    """The provider kept failing until the retries ran out: the infrastructure failed, not the model's answer.

    Raised by :class:`~factory.models.ResilientModel` when a retryable fault
    (429, 5xx, a timeout, a malformed body) is still there after the last
    attempt. A branch that ends on it is an infrastructure failure, never an
    agent outcome.

    Attributes:
        last_error: The fault of the last attempt.
        attempts: Attempts made.
    """

    def __init__(self, message: str, *, last_error: ModelError, attempts: int):
        super().__init__(message)
        self.last_error = last_error
        self.attempts = attempts


class ProviderUnavailableError(ModelError):
    """The provider is gone for the whole run: no branch can go on, so the run stops.

    A branch in flight when it happens is an infrastructure failure; branches
    not started stay pending, for ``--resume`` once the cause is fixed.
    """


class EndpointDownError(ProviderUnavailableError):
    """Calls kept failing to connect and none succeeded for a whole window (the circuit breaker tripped).

    Attributes:
        endpoint: The server (URL or model spec) that does not answer.
    """

    def __init__(self, message: str, *, endpoint: str):
        super().__init__(message)
        self.endpoint = endpoint


class EngineCrashedError(ProviderUnavailableError):
    """An engine running native code in a child process died (a signal, or an exit it did not ask for).

    Attributes:
        signal: The signal's name (``SIGILL``, ``SIGSEGV``, ``SIGKILL``), or None for a plain exit.
        returncode: The child's return code.
    """

    def __init__(self, message: str, *, signal: str | None = None, returncode: int | None = None):
        super().__init__(message)
        self.signal = signal
        self.returncode = returncode


class ReplayMissError(ModelError):
    """A replay file holds no response for this request."""


class RunError(FactoryError):
    """A fork run cannot start or resume."""


class RunAbortedError(RunError):
    """A fork stopped before its end because its provider became unavailable; ``--resume`` continues it.

    Attributes:
        run_id: The stopped run.
        cause: The :class:`ProviderUnavailableError` that stopped it.
    """

    def __init__(self, message: str, *, run_id: str, cause: ProviderUnavailableError):
        super().__init__(message)
        self.run_id = run_id
        self.cause = cause


class ExportError(FactoryError):
    """An export cannot be made: no such run, an unknown format, nothing left to write."""


class ExportValidationError(ExportError):
    """An exported file breaks its format; carries every problem found, each naming its line."""

    exit_code = 2

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = list(problems)
        count = len(self.problems)
        super().__init__(f"{count} problem{'s' if count != 1 else ''} in {path}\n" + "\n".join(self.problems))


class FeedbackError(FactoryError):
    """Feedback that cannot be recorded: no such branch, turn, span or feedback id, or a bad feedback file.

    A file's problems are all reported at once, each as ``FILE:LINE: field 'NAME': message``.
    """

    exit_code = 2

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = list(problems or [])
        super().__init__(message + "".join("\n" + p for p in self.problems))


class OutputSpaceError(FactoryError):
    """The disk (or a quota) filled while writing an output: its staged files were removed, nothing was replaced.

    The message names the operation and the path; the store and every earlier
    output are as they were, and the same command can run again once space is freed.
    """

    def __init__(self, operation: str, path: str, detail: str = "no space left on device",
                 remedy: str = "nothing was replaced; free some space and run it again"):
        self.operation = operation
        self.path = path
        self.detail = detail
        super().__init__(f"{operation}: {detail} writing {path} ({remedy})")


class TrainingStoppedError(FactoryError):
    """A monitor ended training early (``--hacking-detector stop``); the model and a checkpoint were still saved.

    The message names the reason: the step, the rule that fired and its figures.
    """

    exit_code = 4
