"""Turn- and span-level feedback on a branch's trajectory: the ``feedback`` row, and what a turn is.

One definition, used by the CLI, the automatic proposals and the ``hints`` /
``spans`` exports alike:

- A branch's trajectory is its message list (system, user, then assistant and
  tool messages), as the ``branches.trajectory`` column stores it.
- **Turn t** is the assistant message that has exactly ``t`` assistant
  messages before it (0-based). It is the same number as the ``turn`` of the
  branch's ``model_call`` event, and as the turn a ``replay:`` script names.
  :func:`assistant_message_indexes` maps turns to message indexes.
- A **span** is a message range ``[span_start, span_end)`` (0-based, end
  exclusive). A turn's feedback covers the span ``[i, i + 1)`` where ``i`` is
  the turn's message index.

A feedback row targets exactly one of a turn or a span. Its id is derived from
``(run, task, branch, target, source)`` (:func:`feedback_id`), so adding the
same target again from the same source updates that row, and re-running the
proposals or re-importing a file writes no duplicate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from factory.errors import RecordError
from factory.provenance import content_hash
from factory.records import Record, describe_validation_error

__all__ = [
    "FEEDBACK_SOURCES",
    "FEEDBACK_STATUSES",
    "POLARITIES",
    "FeedbackRecord",
    "assistant_message_indexes",
    "feedback_id",
]

#: A feedback row's polarity: what a trainer does with the tokens it covers.
POLARITIES = ("positive", "neutral", "negative")
#: Who said it: a person, an objective verifier (tests, the behaviour monitor, tool errors) or an LLM judge.
FEEDBACK_SOURCES = ("user", "verifier", "judge")
#: ``proposed`` waits for a person; only ``accepted`` feedback is exported.
FEEDBACK_STATUSES = ("proposed", "accepted", "rejected")

Polarity = Literal["positive", "neutral", "negative"]
Source = Literal["user", "verifier", "judge"]
Status = Literal["proposed", "accepted", "rejected"]


def assistant_message_indexes(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """The message index of each assistant turn: element ``t`` is where turn ``t`` sits in ``messages``."""
    return [index for index, message in enumerate(messages) if message.get("role") == "assistant"]


def feedback_id(run_id: str, task_id: str, branch_index: int, *, turn: int | None = None,
                span: tuple[int, int] | None = None, source: str) -> str:
    """The id of the feedback from ``source`` on one turn (or span) of a branch: ``fb-`` and 16 hex digits."""
    target = ["turn", turn] if span is None else ["span", list(span)]
    return "fb-" + content_hash([run_id, task_id, int(branch_index), *target, source]).split(":", 1)[1][:16]


class FeedbackRecord(Record):
    """One ``feedback`` row (migration ``0008_feedback``).

    A table row, so its schema is the table's, versioned by the store's
    migration ledger: ``schema_version`` is not a column.

    Attributes:
        feedback_id: :func:`feedback_id` of its key.
        run_id: The run.
        task_id: The task.
        branch_index: The branch.
        turn: The assistant turn it targets (see the module docstring), or None for a span.
        span_start: First message of the span it targets (None for a turn).
        span_end: One past the span's last message (None for a turn).
        polarity: ``positive``, ``neutral`` or ``negative``.
        hint: A corrective hint for the turn (what a teacher is shown), if any.
        source: ``user``, ``verifier`` or ``judge``.
        status: ``proposed``, ``accepted`` or ``rejected``.
        note: A person's note.
        evidence: Why it was proposed: the rules that fired and what they saw (automatic proposals).
        created_at: When it was first written (naive UTC).
    """

    schema_version: Literal[1] = Field(default=1, exclude=True)  # the table's shape: versioned by migrations
    feedback_id: str
    run_id: str
    task_id: str
    branch_index: int = Field(ge=0)
    turn: int | None = Field(default=None, ge=0)
    span_start: int | None = Field(default=None, ge=0)
    span_end: int | None = Field(default=None, ge=1)
    polarity: Polarity
    hint: str | None = None
    source: Source
    status: Status
    note: str | None = None
    evidence: dict[str, Any] | None = None
    created_at: datetime

    @model_validator(mode="after")
    def _one_target(self) -> FeedbackRecord:
        span = (self.span_start, self.span_end)
        if self.turn is None and None in span:
            raise ValueError("give a turn or a span (span_start and span_end)")
        if self.turn is not None and span != (None, None):
            raise ValueError("give a turn or a span, not both")
        if self.turn is None and self.span_start >= self.span_end:  # type: ignore[operator]
            raise ValueError(f"span [{self.span_start}, {self.span_end}) is empty: start must be below end")
        return self

    @property
    def span(self) -> tuple[int, int] | None:
        """``(span_start, span_end)``, or None for turn feedback."""
        return None if self.span_start is None else (self.span_start, self.span_end)  # type: ignore[return-value]

    def target(self) -> str:
        """The target in words: ``turn 3`` or ``span 2:5``."""
        return f"turn {self.turn}" if self.turn is not None else f"span {self.span_start}:{self.span_end}"

    def message_span(self, messages: Sequence[Mapping[str, Any]]) -> tuple[int, int] | None:
        """The message range this feedback covers in ``messages`` (None: the turn or span is not in them)."""
        if self.turn is not None:
            turns = assistant_message_indexes(messages)
            return (turns[self.turn], turns[self.turn] + 1) if self.turn < len(turns) else None
        assert self.span_start is not None and self.span_end is not None
        return (self.span_start, self.span_end) if self.span_end <= len(messages) else None

    def row(self) -> dict[str, Any]:
        """The ``feedback`` row (``evidence`` as Python data; the store encodes it)."""
        return self.model_dump()

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> FeedbackRecord:
        """A stored ``feedback`` row (``evidence`` as JSON text, as the store returns it), validated.

        Raises:
            RecordError: A column that is not the record's shape.
        """
        data = {key: value for key, value in row.items() if key in cls.model_fields}
        if isinstance(data.get("evidence"), str | bytes):
            data["evidence"] = json.loads(data["evidence"])
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise RecordError(f"stored feedback is not valid: {describe_validation_error(exc)}") from exc
