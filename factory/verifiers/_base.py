"""The verifier extension point: an async callable returning a :class:`Verdict`.

A verifier is production code: total (it never raises — :func:`run_verifier`
turns any exception into an ``error`` verdict that says why), deterministic,
explainable (``details``), fast and versioned (a new ``version`` adds new
verdict rows; old ones are kept).

Statuses: ``pass``, ``fail``, ``error``, ``running``, ``unknown``,
``budget_exhausted``. Only ``pass`` is a pass; ``ok`` is true exactly then.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, get_args, runtime_checkable

from pydantic import Field, model_validator

from factory.records import Record
from factory.registry import Registry
from factory.sandbox import Sandbox
from factory.store import JudgeSample
from factory.tasks import Task

__all__ = [
    "STATUSES",
    "VERIFIERS",
    "BranchOutput",
    "Criterion",
    "Verdict",
    "Verifier",
    "VerifyContext",
    "create_verifier",
    "criteria_for",
    "register_verifier",
    "run_verifier",
    "verifier_names",
]

#: What a verifier may conclude; only ``pass`` is a pass.
VerdictStatus = Literal["pass", "fail", "error", "running", "unknown", "budget_exhausted"]
#: The statuses of :data:`VerdictStatus`, in order.
STATUSES: tuple[str, ...] = get_args(VerdictStatus)


class Verdict(Record):
    """The outcome of one verifier on one branch: a typed record, stored as a ``verdicts`` row.

    The verdict itself is the record, not a dataclass beside a second model
    for persistence: what a verifier returns is what is stored and read back
    (:meth:`from_row`), so there is one shape to keep versioned. Its fields
    are the ``verdicts`` table's columns, whose shape the store's migration
    ledger versions, so ``schema_version`` is not a column; ``details`` is
    the verifier's own JSON, which its ``version`` accounts for.

    Attributes:
        ok: True exactly when ``status == "pass"``.
        score: In [0, 1] (judges: the 0-10 score divided by 10).
        status: One of :data:`STATUSES`.
        details: Why, as JSON data (codes, counts, evidence).
        verifier: The verifier's name.
        version: The verifier's version.

    Raises:
        ValueError: (pydantic's ``ValidationError``) An unknown status, or ``ok`` not following it.
    """

    schema_version: Literal[1] = Field(default=1, exclude=True)
    ok: bool
    score: float
    status: VerdictStatus
    details: dict[str, Any]
    verifier: str
    version: str

    @model_validator(mode="after")
    def _ok_follows_status(self) -> Verdict:
        if self.ok != (self.status == "pass"):
            raise ValueError("ok must be true exactly when status is 'pass'")
        return self

    @classmethod
    def make(cls, verifier: Verifier, status: str, score: float, **details: Any) -> Verdict:
        """A verdict from ``verifier`` (``ok`` follows ``status``; score clamped to [0, 1])."""
        return cls(ok=status == "pass", score=min(1.0, max(0.0, float(score))), status=status, details=details,
                   verifier=verifier.name, version=verifier.version)

    @property
    def hack_detected(self) -> bool:
        """Whether the verifier caught tampering."""
        return bool(self.details.get("hack_detected"))

    @property
    def judge_samples(self) -> list[JudgeSample]:
        """The judge samples the verdict carries (``details["samples"]``; none for other verifiers), typed.

        Raises:
            RecordError: A sample that is not a judge sample.
        """
        return [JudgeSample.from_stored(sample) for sample in self.details.get("samples") or ()]

    def row(self, run_id: str, task_id: str, branch_index: int) -> dict[str, Any]:
        """The ``verdicts`` table row."""
        from factory.store import utc_now

        return {"run_id": run_id, "task_id": task_id, "branch_index": branch_index, "verifier": self.verifier,
                "version": self.version, "ok": self.ok, "score": self.score, "status": self.status,
                "details": self.details, "created_at": utc_now()}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Verdict:
        """A stored ``verdicts`` row (``details`` as JSON text, as the store returns it).

        Raises:
            RecordError: A row that is not a verdict.
        """
        details = row.get("details")
        return cls.from_stored({
            "ok": row.get("ok"), "score": row.get("score"), "status": row.get("status"),
            "details": (json.loads(details) if isinstance(details, str) else details) or {},
            "verifier": row.get("verifier"), "version": row.get("version"), "schema_version": 1})


@dataclass(frozen=True)
class Criterion:
    """One thing to check: ``{id, description, verify_method, arg}``.

    Attributes:
        id: Stable id within the task (e.g. ``tests``).
        description: What is checked, in words.
        verify_method: The registered verifier's name.
        arg: The verifier's argument (the answer, a schema, a command, a rubric, ...).
    """

    id: str
    description: str
    verify_method: str
    arg: Any = None


@dataclass(frozen=True)
class BranchOutput:
    """What a verifier may look at of a branch.

    Attributes:
        final_answer: The submitted answer (None if the branch gave none).
        trajectory: The conversation.
        status: The branch's status (``ok``, ``max_turns``, ``error``).
    """

    final_answer: str | None
    trajectory: list[dict[str, Any]] = field(default_factory=list)
    status: str = "ok"


@dataclass
class VerifyContext:
    """Everything one verification sees.

    Attributes:
        task: The task.
        branch: The branch's output.
        criterion: The criterion being checked.
        sandbox: The branch's sandbox (still open), or None where none exists.
        workspace: The branch's final workspace (relative path -> content, every
            regular file), when the caller collected it; verifiers that build
            sandboxes of their own (the isolated tests run) start from it.
    """

    task: Task
    branch: BranchOutput
    criterion: Criterion
    sandbox: Sandbox | None = None
    workspace: Mapping[str, str | bytes] | None = None


@runtime_checkable
class Verifier(Protocol):
    """An async callable from a :class:`VerifyContext` to a :class:`Verdict`.

    Attributes:
        name: Registered name (``tests``, ``answer``, ...).
        version: Bumped whenever its judgement can change.
        needs_sandbox: Whether it must run inside the branch's sandbox.
        objective: Whether its verdict is a check (tests, answer, schema...) rather than an
            opinion (the LLM judge): only objective verdicts make a branch's objective pass,
            and a pipeline runs an opinion only when it is configured with one.
    """

    name: ClassVar[str]
    version: ClassVar[str]
    needs_sandbox: ClassVar[bool]
    objective: ClassVar[bool]

    async def __call__(self, ctx: VerifyContext) -> Verdict:
        ...


#: Verifiers by name (``tests``, ``answer``, ...); :func:`register_verifier` adds one.
VERIFIERS: Registry[Callable[..., Verifier]] = Registry("verifier")


def register_verifier(name: str) -> Callable[[type], type]:
    """Class decorator registering a verifier under ``name``."""

    def decorate(cls: type) -> type:
        cls.name = name
        VERIFIERS.register(name, cls)
        return cls

    return decorate


def verifier_names() -> list[str]:
    """Registered verifier names."""
    return VERIFIERS.names()


def create_verifier(name: str, **options: Any) -> Verifier:
    """Instantiate a registered verifier.

    Raises:
        ConfigError: Unknown name.
    """
    return VERIFIERS.get(name)(**options)


async def run_verifier(verifier: Verifier, ctx: VerifyContext) -> Verdict:
    """Run ``verifier`` totally: an exception becomes an ``error`` verdict naming it."""
    try:
        verdict = await verifier(ctx)
    except Exception as exc:  # totality: a verifier bug is a verdict, never a crash of the run
        return Verdict(ok=False, score=0.0, status="error", details={
            "code": "verifier_crashed", "exception": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(limit=5)}, verifier=verifier.name, version=verifier.version)
    if not isinstance(verdict, Verdict):
        return Verdict(ok=False, score=0.0, status="error",
                       details={"code": "not_a_verdict", "returned": repr(verdict)[:200]},
                       verifier=verifier.name, version=verifier.version)
    return verdict


def criteria_for(task: Task) -> list[Criterion]:
    """The criteria a task's fields select (the order of :attr:`Task.verifiers`)."""
    arguments: Mapping[str, Any] = {
        "tests": task.effective_test_command,
        "build": task.build_command,
        "answer": task.answer,
        "json-schema": task.json_schema,
        "rules": task.rules.model_dump() if task.rules else None,
        "judge": task.rubric,
        "browser": task.rubric,
    }
    descriptions = {
        "tests": "the task's tests pass, untampered",
        "build": "the build command succeeds",
        "answer": "the last line is exactly `Final: <answer>`",
        "json-schema": "the output is JSON matching the task's schema",
        "rules": "the output follows the task's rules",
        "judge": "an LLM judge's score against the rubric",
        "browser": "the page, exercised in a headless browser, judged item by item against the rubric",
    }
    return [Criterion(name, descriptions[name], name, arguments[name]) for name in task.verifiers]



