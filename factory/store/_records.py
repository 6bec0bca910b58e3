"""Typed, versioned records that the store persists and the layers above exchange.

A record stored as a JSON document (the run manifest in ``runs.config``, an
event's ``payload``, a branch's ``workspace``, a judge sample in a verdict's
details) carries its ``schema_version`` inside the document, so the stored
JSON is what it always was plus that one key. A record that is a table row
(:class:`BranchRecord`) has the table's columns as its schema, which the
store's migration ledger versions: its ``schema_version`` is not a column.

They live here, in the store's layer, because the store persists them and
every layer that produces or reads them (sandbox, verifiers, rollouts,
export, cli) sits above it. Parts whose shape a higher layer owns (the agent
settings, the sandbox limits) are plain JSON objects here: typing them would
need an upward import, and their owners validate them when they rebuild
their configs from a manifest. Reading upgrades older shapes; see
:class:`factory.records.Record`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationError, model_serializer

from factory.errors import RecordError
from factory.provenance import content_hash
from factory.records import Record, RecordPart, describe_validation_error

__all__ = [
    "BranchEvent",
    "BranchRecord",
    "ErrorEvent",
    "Event",
    "FinalAnswerEvent",
    "JudgeCallEvent",
    "JudgeSample",
    "ModelCallEvent",
    "PairwiseCall",
    "RunManifest",
    "RunStartEvent",
    "ToolCallEvent",
    "ToolResultEvent",
    "VerdictEvent",
    "WorkspaceSnapshot",
    "parse_event",
]


# ------------------------------------------------------------------ run manifest


class Sampling(RecordPart):
    """Per-branch sampling of a run: branch ``b`` uses ``temperatures[b]`` and ``seeds[b]`` for every task."""

    temperatures: list[float]
    seeds: list[int]
    max_tokens: int


class MemorySettings(RecordPart):
    """Memory priming of a run: ``k`` memories per task, plus what the primer recorded to reopen itself.

    The other keys are the primer's own description (``BranchPrimer.describe``:
    embedder, backend, ...), kept as given.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    k: int


class RunManifest(Record):
    """Everything a run's results depend on (``runs.config``).

    Attributes:
        dataset_hash: Hash of the tasks.
        task_file: The task file the run was started from (None: tasks given in code).
        n_tasks: Tasks in the run.
        model: The policy's model spec.
        branches: Branches per task.
        sampling: Per-branch temperatures and seeds, and the token cap.
        agent: The agent settings (``AgentConfig``'s fields; the rollouts layer owns their shape).
        sandbox: The sandbox backend's name.
        limits: The sandbox limits (``SandboxLimits``' fields; the sandbox layer owns their shape).
        memory: Memory priming (None: none).
        backend: Where its branches ran: the execution backend's name and settings (``{"name": "ray",
            "address": ...}``); None for runs from before backends, which ran ``local``. Not hashed into
            ``config_hash``: where a branch runs does not change it.
        package_version: The factory version that ran it.
        git_sha: The factory checkout's commit, when known.
        python: The Python version.
        platform: ``sys.platform``.
    """

    schema_version: Literal[1] = 1
    dataset_hash: str
    task_file: str | None = None
    n_tasks: int
    model: str
    branches: int
    sampling: Sampling
    agent: dict[str, Any]
    sandbox: str
    limits: dict[str, Any]
    memory: MemorySettings | None = None  # runs before memory priming existed have none
    backend: dict[str, Any] | None = None  # runs before execution backends have none (they ran locally)
    package_version: str
    git_sha: str | None = None
    python: str
    platform: str

    #: What a run's results depend on, hashed into ``config_hash`` (not versions or paths).
    RESULT_KEYS: ClassVar[tuple[str, ...]] = (
        "dataset_hash", "model", "branches", "sampling", "agent", "sandbox", "limits", "memory")

    @model_serializer(mode="wrap")
    def _local_runs_stay_as_before(self, handler: Any) -> dict[str, Any]:
        # a local run's manifest is stored exactly as before execution backends existed (no backend key)
        data = handler(self)
        if data.get("backend") is None:
            data.pop("backend", None)
        return data

    def config_hash(self) -> str:
        """Hash of the result-determining part (the same hash the unversioned manifest dict gave)."""
        data = self.model_dump(mode="json")
        return content_hash({key: data.get(key) for key in self.RESULT_KEYS})


# ------------------------------------------------------------------ workspace


class WorkspaceSnapshot(Record):
    """A branch's final workspace as a change set against its task's files (``branches.workspace``).

    Attributes:
        files: Files that differ from the task's (text), by path.
        deleted: Task files that are gone.
        skipped: Changed files left out (too large, binary, past the total cap).
        symlinks: Symbolic links left in the workspace (path -> target), recorded, never followed.
        special: FIFOs, sockets and devices left in the workspace (path -> kind), never opened.
    """

    # 2: symlinks and special files recorded (a version-1 snapshot has none).
    schema_version: Literal[1, 2] = 2
    files: dict[str, str] = Field(default_factory=dict)
    deleted: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)  # not recorded before snapshots capped files
    symlinks: dict[str, str] = Field(default_factory=dict)
    special: dict[str, str] = Field(default_factory=dict)


# ------------------------------------------------------------------ judge samples


class JudgeSample(Record):
    """One judge call on one branch (kept in the judge verdict's ``details["samples"]`` and as a judgment row).

    Attributes:
        sample_index: Which of the k samples (its seed).
        score: The 0-10 score (None when the call gave no valid answer; neutral 5 when the budget refused it).
        status: ``ok``, ``error`` or ``budget_exhausted``.
        reason: The judge's reason, or why the sample failed.
        raw: The reply (capped).
        model: The judge's model spec.
        prompt_version: The judge prompts' version.
        latency_s: Seconds the call took.
    """

    schema_version: Literal[1] = 1
    sample_index: int
    score: float | None
    status: Literal["ok", "error", "budget_exhausted"]
    reason: str
    raw: str
    model: str
    prompt_version: str
    latency_s: float


class PairwiseCall(JudgeSample):
    """One order of a pairwise comparison: a judge sample plus the order and the preference it gave.

    Attributes:
        swapped: Branch b was shown as candidate A.
        preference: ``a``, ``b`` or ``tie``, mapped back to the branches (None: no valid answer).
    """

    swapped: bool
    preference: Literal["a", "b", "tie"] | None


# ------------------------------------------------------------------ events


class BranchEvent(Record):
    """One timestamped step of a branch (an ``events`` row).

    The row's columns are ``seq``, ``ts`` and ``kind``; every other field
    (``schema_version`` included) is the ``payload`` JSON.

    Attributes:
        seq: Position in the branch, from 0.
        ts: When it happened (naive UTC, as the store keeps timestamps).
        kind: What happened; each kind is a subclass (see :data:`Event`).
    """

    schema_version: Literal[1] = 1
    seq: int
    ts: datetime
    kind: str

    #: The columns of an ``events`` row that are not payload.
    ENVELOPE: ClassVar[frozenset[str]] = frozenset({"seq", "ts", "kind"})

    def payload(self) -> dict[str, Any]:
        """The ``payload`` JSON object."""
        return self.model_dump(mode="json", exclude=set(self.ENVELOPE))

    def row(self) -> dict[str, Any]:
        """The ``events`` row (without the branch key): ``seq``, ``ts``, ``kind``, ``payload``."""
        return {"seq": self.seq, "ts": self.ts, "kind": self.kind, "payload": self.payload()}


class RunStartEvent(BranchEvent):
    """A branch started (``run_start``)."""

    kind: Literal["run_start"] = "run_start"
    task_id: str
    model: str
    temperature: float
    seed: int | None
    mode: Literal["single-turn", "tools"]
    max_turns: int
    primer: str | None = None  # not recorded before memory priming existed
    system_prompt: str


class ModelCallEvent(BranchEvent):
    """The policy answered one turn (``model_call``)."""

    kind: Literal["model_call"] = "model_call"
    turn: int
    latency_s: float
    input_tokens: int
    output_tokens: int
    finish_reason: str | None
    text: str
    tool_calls: list[str]


class ToolCallEvent(BranchEvent):
    """The policy called a tool (``tool_call``); ``error`` says why its arguments did not parse.

    ``origin`` says how the call arrived: ``native`` (the server's structured
    tool calls) or ``text`` (written in the reply's text and read from it);
    None for calls stored before it was recorded.
    """

    kind: Literal["tool_call"] = "tool_call"
    id: str
    name: str
    arguments: dict[str, Any]
    error: str | None
    origin: Literal["native", "text"] | None = None


class ToolResultEvent(BranchEvent):
    """A tool call's summarized result (``tool_result``)."""

    kind: Literal["tool_result"] = "tool_result"
    id: str
    name: str
    ok: bool
    output: str


class FinalAnswerEvent(BranchEvent):
    """The branch's answer (``final_answer``), by ``submit`` or as the reply's text."""

    kind: Literal["final_answer"] = "final_answer"
    answer: str
    via: Literal["reply", "submit"]


class ErrorEvent(BranchEvent):
    """Why a branch stopped without an answer (``error``): an exception's type, or ``max_turns``."""

    kind: Literal["error"] = "error"
    type: str
    message: str


class JudgeCallEvent(BranchEvent, JudgeSample):
    """One judge sample of a verdict on the branch (``judge_call``)."""

    kind: Literal["judge_call"] = "judge_call"
    verifier: str
    version: str


class VerdictEvent(BranchEvent):
    """A verifier's verdict on the branch (``verdict``)."""

    kind: Literal["verdict"] = "verdict"
    verifier: str
    version: str
    status: str
    score: float
    hack_detected: bool


#: Any branch event, told apart by ``kind``.
Event = Annotated[
    RunStartEvent | ModelCallEvent | ToolCallEvent | ToolResultEvent | FinalAnswerEvent | ErrorEvent
    | JudgeCallEvent | VerdictEvent,
    Field(discriminator="kind"),
]
_EVENT_TYPES: dict[str, type[BranchEvent]] = {
    cls.model_fields["kind"].default: cls
    for cls in (RunStartEvent, ModelCallEvent, ToolCallEvent, ToolResultEvent, FinalAnswerEvent, ErrorEvent,
                JudgeCallEvent, VerdictEvent)
}


def parse_event(row: Mapping[str, Any]) -> BranchEvent:
    """The event an ``events`` row holds (``payload`` as JSON text or parsed), older shapes upgraded.

    Raises:
        RecordError: An unknown kind, or a payload that is not that kind's shape.
    """
    payload = row.get("payload")
    if isinstance(payload, str | bytes):
        try:
            payload = json.loads(payload)
        except json.JSONDecodeError as exc:
            raise RecordError(f"stored event payload is not JSON: {exc.msg}") from exc
    kind = row.get("kind")
    event_type = _EVENT_TYPES.get(kind)  # type: ignore[arg-type]
    if event_type is None:
        raise RecordError(f"stored event has an unknown kind {kind!r} (known: {', '.join(sorted(_EVENT_TYPES))})")
    if not isinstance(payload, Mapping):
        raise RecordError(f"stored {kind} event's payload is not a JSON object")
    return event_type.from_stored({**payload, "seq": row.get("seq"), "ts": row.get("ts"), "kind": kind})


# ------------------------------------------------------------------ branches


class BranchRecord(Record):
    """One branch as stored (a ``branches`` row; see DESIGN "Branch record").

    JSON columns hold: ``trajectory`` the messages, ``tool_call_sequence``
    the tool calls with summarized results, ``usage`` the tokens and cost,
    ``workspace`` a :class:`WorkspaceSnapshot`.
    """

    schema_version: Literal[1] = Field(default=1, exclude=True)  # the table's shape: versioned by migrations
    run_id: str
    task_id: str
    branch_index: int
    rollout_id: str | None = None  # rows before migration 0004 have none
    session_id: str
    temperature: float | None = None
    seed: int | None = None
    model: str | None = None
    status: str
    final_answer: str | None = None
    trajectory: list[dict[str, Any]] = Field(default_factory=list)
    tool_call_sequence: list[dict[str, Any]] = Field(default_factory=list)
    usage: dict[str, Any] = Field(default_factory=dict)
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    workspace: WorkspaceSnapshot | None = None

    _JSON_COLUMNS: ClassVar[tuple[str, ...]] = ("trajectory", "tool_call_sequence", "usage", "workspace")

    def row(self) -> dict[str, Any]:
        """The ``branches`` row (JSON columns as Python data; the store encodes them)."""
        row = self.model_dump()
        row["workspace"] = None if self.workspace is None else self.workspace.model_dump(mode="json")
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> BranchRecord:
        """A stored ``branches`` row (JSON columns as text, as the store returns them), validated.

        Raises:
            RecordError: A column that is not its record's shape.
        """
        data = {key: value for key, value in row.items() if key in cls.model_fields}
        for column in cls._JSON_COLUMNS:
            value = data.get(column)
            if isinstance(value, str | bytes):
                data[column] = json.loads(value)
        if data.get("workspace") is not None:
            data["workspace"] = WorkspaceSnapshot.from_stored(data["workspace"])
        data = {key: value for key, value in data.items() if value is not None or key == "workspace"}
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise RecordError(f"stored branch is not valid: {describe_validation_error(exc)}") from exc
