"""``hints`` and ``spans``: accepted turn- and span-level feedback as training rows.

The row formats (a contract with ``factory.trainers``: change them only
here, and say so here):

``factory export hints`` — one row per accepted feedback with a hint::

    {"prompt":         [the messages before assistant turn t],
     "teacher_prompt": prompt + [{"role": "user", "content": "Hint: <hint>"}],   # the hint is the LAST message
     "completion":     [the assistant turn t message, its tool_calls included],    # always one message
     "hint": str, "turn": t, "polarity": "negative" | "neutral" | "positive",
     "run_id": str, "task_id": str, "branch_index": int, "feedback_id": str,
     "source": "user" | "verifier" | "judge",
     "tools": str | null}   # JSON text of the agent's tool schemas (for the chat template); null if single-turn

``factory export spans`` — one row per branch with at least one accepted feedback::

    {"messages": [the whole trajectory],
     "polarity": ["positive" | "neutral" | "negative", ...],     # one per message, for every message
     "spans":    [{"start": i, "end": j, "polarity": p, "source": s}, ...],   # sorted by start
     "run_id": str, "task_id": str, "branch_index": int,
     "tools": str | null}

Definitions (:mod:`factory.store._feedback`): a message is what the other
conversational exports write (``role``, ``content``, ``name``,
``tool_call_id``, ``tool_calls`` with ``arguments`` as JSON text; the
inserted hint message has the last three null). Turn t is the assistant
message with t assistant messages before it; a span is a message range
[start, end). In ``spans``, turn feedback appears as [i, i + 1) at the turn's
message index i; messages no accepted feedback covers are ``neutral``, and
non-assistant messages are always ``neutral`` (never in a loss). Where
accepted feedback overlaps on a message, a ``user`` row beats automatic ones,
and among equals negative beats positive beats neutral
(:func:`~factory.export._feedback_rows.message_polarities`). A span feedback
with a hint targets, in ``hints``, the first assistant turn inside it.

Only ``accepted`` feedback is exported; feedback on a branch that is not an
outcome (an infrastructure failure) or whose turn or span is not in its
trajectory is left out and counted in the manifest.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from factory.errors import ConfigError, ExportError
from factory.export._columns import FORMAT_COLUMNS
from factory.export._feedback_rows import hint_message, message_polarities
from factory.export._formats import ExportOptions, ExportRows, tool_schemas_json
from factory.export._source import ExportSource
from factory.store import FeedbackRecord, assistant_message_indexes

__all__ = ["HintsFormat", "SpansFormat"]

_SPAN = pl.Struct({"start": pl.Int64, "end": pl.Int64, "polarity": pl.String, "source": pl.String})


def _accepted(source: ExportSource) -> list[FeedbackRecord]:
    store = source.store
    if store is None:
        raise ExportError("the hints and spans formats read accepted feedback from the store; this source has none")
    return [FeedbackRecord.from_row(r) for r in store.accepted_feedback(list(source.runs)).iter_rows(named=True)]


def _branches_with_feedback(source: ExportSource, records: list[FeedbackRecord]
                            ) -> tuple[list[tuple[dict[str, Any], list[dict[str, Any]]]], pl.DataType | None]:
    """``(branch row, its messages)`` of each exported branch some record names, and the message list dtype."""
    keys = {(r.run_id, r.task_id, r.branch_index) for r in records}
    found, dtype = [], None
    for batch in source.batches():  # slice by slice: only the branches named are kept
        if batch.is_empty():
            continue
        dtype = batch.schema["prompt_messages"]
        found.extend((row, [*row["prompt_messages"], *row["completion_messages"]])
                     for row in batch.iter_rows(named=True)
                     if (row["run_id"], row["task_id"], int(row["branch_index"])) in keys)
    return found, dtype


def _require_conversational(options: ExportOptions, name: str) -> None:
    if not options.conversational:
        raise ConfigError(f"{name} rows are conversations (messages); --format standard does not apply")


def _nothing(what: str, source: ExportSource, stats: dict[str, Any]) -> ExportError:
    return ExportError(f"nothing to export: no {what} in run(s) {', '.join(source.runs)} ({stats}; see: factory "
                       "feedback list RUN, factory feedback propose RUN, factory feedback accept ID)")


def _tools(row: dict[str, Any]) -> str | None:
    return tool_schemas_json() if row.get("mode") == "tools" else None


class HintsFormat:
    """One row per accepted hint: the prompt before turn t, the same with the hint, and turn t (module docstring)."""

    name = "hints"
    trainer = "factory train hint"
    columns = FORMAT_COLUMNS["hints"]

    def build(self, source: ExportSource, options: ExportOptions) -> ExportRows:
        _require_conversational(options, self.name)
        records = _accepted(source)
        with_hint = [r for r in records if r.hint]
        stats: dict[str, Any] = {"accepted_feedback": len(records), "without_hint": len(records) - len(with_hint),
                                 "not_in_trajectory": 0}
        by_branch: dict[tuple[str, str, int], list[FeedbackRecord]] = {}
        for record in with_hint:
            by_branch.setdefault((record.run_id, record.task_id, record.branch_index), []).append(record)
        rows, found = [], set()
        branches, dtype = _branches_with_feedback(source, with_hint)
        for branch, messages in branches:
            key = (branch["run_id"], branch["task_id"], int(branch["branch_index"]))
            found.add(key)
            turns = assistant_message_indexes(messages)
            for record in by_branch[key]:
                turn = record.turn
                if turn is None:  # a span: its first assistant turn
                    turn = next((t for t, i in enumerate(turns) if record.span_start <= i < record.span_end), None)
                if turn is None or turn >= len(turns):
                    stats["not_in_trajectory"] += 1
                    continue
                prompt = messages[: turns[turn]]
                rows.append({"prompt": prompt, "teacher_prompt": [*prompt, hint_message(record.hint or "")],
                             "completion": [messages[turns[turn]]], "hint": record.hint, "turn": turn,
                             "polarity": record.polarity, "run_id": record.run_id, "task_id": record.task_id,
                             "branch_index": record.branch_index, "feedback_id": record.feedback_id,
                             "source": record.source, "tools": _tools(branch)})
        stats["not_an_outcome"] = sum(len(v) for k, v in by_branch.items() if k not in found)
        if not rows:
            raise _nothing("accepted feedback with a hint", source, stats)
        rows.sort(key=lambda r: (r["run_id"], r["task_id"], r["branch_index"], r["turn"], r["feedback_id"]))
        stats["rows"] = len(rows)
        frame = pl.DataFrame(rows, schema={
            "prompt": dtype, "teacher_prompt": dtype, "completion": dtype, "hint": pl.String, "turn": pl.Int64,
            "polarity": pl.String, "run_id": pl.String, "task_id": pl.String, "branch_index": pl.Int64,
            "feedback_id": pl.String, "source": pl.String, "tools": pl.String})
        return ExportRows(frame, stats=stats)


class SpansFormat:
    """One row per branch with accepted feedback: its messages, a polarity per message, the spans (module docstring)."""

    name = "spans"
    trainer = "factory train rw-sft | span-kto"
    columns = FORMAT_COLUMNS["spans"]

    def build(self, source: ExportSource, options: ExportOptions) -> ExportRows:
        _require_conversational(options, self.name)
        records = _accepted(source)
        stats: dict[str, Any] = {"accepted_feedback": len(records), "not_in_trajectory": 0}
        by_branch: dict[tuple[str, str, int], list[FeedbackRecord]] = {}
        for record in records:
            by_branch.setdefault((record.run_id, record.task_id, record.branch_index), []).append(record)
        rows, found = [], set()
        branches, dtype = _branches_with_feedback(source, records)
        for branch, messages in branches:
            key = (branch["run_id"], branch["task_id"], int(branch["branch_index"]))
            found.add(key)
            spans = []
            for record in by_branch[key]:
                covered = record.message_span(messages)
                if covered is None:
                    stats["not_in_trajectory"] += 1
                    continue
                spans.append({"start": covered[0], "end": covered[1], "polarity": record.polarity,
                              "source": record.source})
            if not spans:
                continue
            spans.sort(key=lambda s: (s["start"], s["end"], s["source"], s["polarity"]))
            rows.append({"messages": messages, "polarity": message_polarities(messages, spans), "spans": spans,
                         "run_id": key[0], "task_id": key[1], "branch_index": key[2], "tools": _tools(branch)})
        stats["not_an_outcome"] = sum(len(v) for k, v in by_branch.items() if k not in found)
        if not rows:
            raise _nothing("accepted feedback", source, stats)
        stats["rows"] = len(rows)
        stats["messages_by_polarity"] = {p: sum(r["polarity"].count(p) for r in rows)
                                         for p in ("positive", "neutral", "negative")}
        frame = pl.DataFrame(rows, schema={
            "messages": dtype, "polarity": pl.List(pl.String), "spans": pl.List(_SPAN), "run_id": pl.String,
            "task_id": pl.String, "branch_index": pl.Int64, "tools": pl.String})
        return ExportRows(frame, stats=stats)
