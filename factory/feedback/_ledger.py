"""Recording feedback: add one, import a file, propose automatically, accept, reject, override, list.

Every write checks its target against the stored branch first: the branch
is an outcome of the run (not an infrastructure failure), the turn is one of
its assistant turns, the span lies within its messages. Writes are keyed by
:func:`~factory.store.feedback_id`, so repeating any of them writes no
duplicate.

Import is all or nothing: every problem of the file is reported (``FILE:LINE:
field 'NAME': message``) and nothing is written unless every line is good,
so a file fixed and imported again lands exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from factory.errors import FeedbackError
from factory.feedback._branch import BranchView, load_branch_views
from factory.feedback._propose import propose_for_branch
from factory.records import describe_validation_error
from factory.store import (
    FEEDBACK_SOURCES,
    FEEDBACK_STATUSES,
    POLARITIES,
    FeedbackRecord,
    Store,
    assistant_message_indexes,
    feedback_id,
    utc_now,
)

__all__ = ["ProposalResult", "add_feedback", "import_feedback", "list_feedback", "override_feedback",
           "parse_span", "propose_feedback", "set_feedback_status"]

_IMPORT_FIELDS = {"run_id", "task_id", "branch_index", "turn", "span", "polarity", "hint", "note", "source",
                  "status"}
_MAX_PROBLEMS = 200


def parse_span(text: str) -> tuple[int, int]:
    """``A:B`` -> ``(A, B)``: a message range [A, B).

    Raises:
        ValueError: Not two integers with 0 <= A < B.
    """
    start, sep, end = str(text).partition(":")
    if not sep:
        raise ValueError(f"a span is START:END (a message range [START, END)), got {text!r}")
    try:
        a, b = int(start), int(end)
    except ValueError:
        raise ValueError(f"a span is two integers START:END, got {text!r}") from None
    if not 0 <= a < b:
        raise ValueError(f"span {a}:{b} is empty or negative: need 0 <= START < END")
    return a, b


class _Branches:
    """The stored trajectories of the branches a command names, read once each."""

    def __init__(self, store: Store):
        self.store = store
        self._messages: dict[tuple[str, str, int], list[dict[str, Any]] | None] = {}

    def messages(self, run_id: str, task_id: str, branch_index: int) -> list[dict[str, Any]] | None:
        key = (run_id, task_id, branch_index)
        if key not in self._messages:
            frame = self.store.branches(run_id, task_id)
            rows = [r for r in frame.iter_rows(named=True) if r["branch_index"] == branch_index]
            if not rows or rows[0]["status"] in ("infra_error", "error"):
                self._messages[key] = None
            else:
                trajectory = rows[0]["trajectory"]
                self._messages[key] = json.loads(trajectory) if isinstance(trajectory, str) else trajectory or []
        return self._messages[key]

    def problem(self, run_id: str, task_id: str, branch_index: int, turn: int | None,
                span: tuple[int, int] | None) -> tuple[str, str] | None:
        """``(field, message)`` of what is wrong with the target, or None."""
        messages = self.messages(run_id, task_id, branch_index)
        if messages is None:
            return "branch_index", (f"run {run_id} has no branch {branch_index} of task {task_id} that is an "
                                    f"outcome (its branches and their statuses: factory view, run {run_id})")
        if turn is not None:
            turns = len(assistant_message_indexes(messages))
            if turn >= turns:
                return "turn", (f"branch {task_id}/{branch_index} has {turns} assistant turn(s) "
                                f"(0-{turns - 1}); got {turn}" if turns else
                                f"branch {task_id}/{branch_index} has no assistant turn")
        if span is not None and span[1] > len(messages):
            return "span", f"branch {task_id}/{branch_index} has {len(messages)} messages; span {span[0]}:{span[1]} " \
                           "runs past them"
        return None


def _record(run_id: str, task_id: str, branch_index: int, *, turn: int | None, span: tuple[int, int] | None,
            polarity: str, hint: str | None, note: str | None, source: str, status: str) -> FeedbackRecord:
    return FeedbackRecord(
        feedback_id=feedback_id(run_id, task_id, branch_index, turn=turn, span=span, source=source),
        run_id=run_id, task_id=task_id, branch_index=branch_index, turn=turn,
        span_start=None if span is None else span[0], span_end=None if span is None else span[1],
        polarity=polarity, hint=hint or None, source=source, status=status, note=note or None, evidence=None,
        created_at=utc_now())


def _check_run(store: Store, run_id: str) -> None:
    if store.run(run_id) is None:
        raise FeedbackError(f"no run {run_id} in {store.path} (see: factory runs)")


def add_feedback(store: Store, run_id: str, task_id: str, branch_index: int, *, turn: int | None = None,
                 span: tuple[int, int] | None = None, polarity: str, hint: str | None = None,
                 note: str | None = None, source: str = "user", status: str = "accepted") -> FeedbackRecord:
    """Record one feedback on a turn or span of a branch (a person's, by default: accepted).

    The same target from the same source again replaces the earlier row.

    Raises:
        FeedbackError: No such run or branch, the turn or span is not in it, or a bad value.
    """
    if (turn is None) == (span is None):
        raise FeedbackError("give exactly one of --turn N or --span A:B")
    _check_run(store, run_id)
    problem = _Branches(store).problem(run_id, task_id, branch_index, turn, span)
    if problem:
        raise FeedbackError(f"{problem[0]}: {problem[1]}")
    try:
        record = _record(run_id, task_id, branch_index, turn=turn, span=span, polarity=polarity, hint=hint,
                         note=note, source=source, status=status)
    except ValidationError as exc:
        raise FeedbackError(f"bad feedback: {describe_validation_error(exc)}") from exc
    store.write_feedback([record.row()])
    return record


def _import_line(raw: Any, where: str, branches: _Branches, runs: set[str]) -> tuple[FeedbackRecord | None, list[str]]:
    """One import line as a record, or the problems that keep it out (each ``WHERE: field 'NAME': message``)."""
    if not isinstance(raw, dict):
        return None, [f"{where}: a line is a JSON object, got {type(raw).__name__}"]
    problems = [f"{where}: field '{key}': unknown field (fields: {', '.join(sorted(_IMPORT_FIELDS))})"
                for key in raw if key not in _IMPORT_FIELDS]
    for key in ("run_id", "task_id", "branch_index", "polarity"):
        if raw.get(key) is None:
            problems.append(f"{where}: field '{key}': required field is missing")
    for key in ("run_id", "task_id", "hint", "note"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            problems.append(f"{where}: field '{key}': expected a string, got {type(raw[key]).__name__}")
    for key, allowed in (("polarity", POLARITIES), ("source", FEEDBACK_SOURCES), ("status", FEEDBACK_STATUSES)):
        if raw.get(key) is not None and raw[key] not in allowed:
            problems.append(f"{where}: field '{key}': {raw[key]!r} is not one of {', '.join(allowed)}")
    branch = raw.get("branch_index")
    if branch is not None and (isinstance(branch, bool) or not isinstance(branch, int) or branch < 0):
        problems.append(f"{where}: field 'branch_index': expected an integer >= 0, got {branch!r}")
    turn, span = raw.get("turn"), raw.get("span")
    if (turn is None) == (span is None):
        problems.append(f"{where}: field 'turn': give exactly one of 'turn' (an assistant turn) or 'span' "
                        "(\"A:B\" or [A, B], a message range)")
    if turn is not None and (isinstance(turn, bool) or not isinstance(turn, int) or turn < 0):
        problems.append(f"{where}: field 'turn': expected an integer >= 0, got {turn!r}")
    if span is not None:
        try:
            span = parse_span(f"{span[0]}:{span[1]}" if isinstance(span, list) and len(span) == 2 else span)
        except (ValueError, TypeError) as exc:
            problems.append(f"{where}: field 'span': {exc}")
    if problems:
        return None, problems
    if raw["run_id"] not in runs:
        return None, [f"{where}: field 'run_id': no run {raw['run_id']} in {branches.store.path}"]
    problem = branches.problem(raw["run_id"], raw["task_id"], branch, turn, span)
    if problem:
        return None, [f"{where}: field '{problem[0]}': {problem[1]}"]
    return _record(raw["run_id"], raw["task_id"], branch, turn=turn, span=span, polarity=raw["polarity"],
                   hint=raw.get("hint"), note=raw.get("note"), source=raw.get("source") or "user",
                   status=raw.get("status") or "accepted"), []


def import_feedback(store: Store, path: str | Path) -> list[FeedbackRecord]:
    """Import a JSONL file of feedback, one object a line; all or nothing (see the module docstring).

    A line: ``run_id``, ``task_id``, ``branch_index``, one of ``turn`` (int) or
    ``span`` (``"A:B"`` or ``[A, B]``), ``polarity``; optional ``hint``,
    ``note``, ``source`` (default ``user``) and ``status`` (default ``accepted``).

    Raises:
        FeedbackError: The file cannot be read, or any line is bad (every problem, ``FILE:LINE: field``).
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise FeedbackError(f"{path}: cannot be read: {getattr(exc, 'strerror', None) or exc}") from exc
    branches = _Branches(store)
    runs_frame = store.runs()
    runs = set(runs_frame["run_id"].to_list()) if runs_frame.height else set()
    records: dict[str, FeedbackRecord] = {}
    problems: list[str] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if len(problems) >= _MAX_PROBLEMS:
            problems.append(f"{path}: more problems not shown")
            break
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{path}:{number}: not JSON: {exc.msg} (column {exc.colno})")
            continue
        record, found = _import_line(raw, f"{path}:{number}", branches, runs)
        problems.extend(found)
        if record is not None:
            records[record.feedback_id] = record  # a later line on the same target and source wins
    if problems:
        raise FeedbackError(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} in {path}; "
                            "nothing was imported", problems)
    if not records:
        raise FeedbackError(f"{path}: no feedback lines")
    store.write_feedback([r.row() for r in records.values()])
    return list(records.values())


@dataclass
class ProposalResult:
    """What :func:`propose_feedback` did.

    Attributes:
        written: The proposals written (new ones and ones still ``proposed``, refreshed).
        new: How many of them were not stored before.
        kept: Proposals left as they were because a person decided them (accepted, rejected or overridden).
        branches: Branches read.
    """

    written: list[FeedbackRecord]
    new: int
    kept: int
    branches: int


def propose_feedback(store: Store, run_id: str, *, task_id: str | None = None,
                     teacher: str | None = None) -> ProposalResult:
    """Propose feedback for every branch of a run from its trajectories and verdicts (status ``proposed``).

    Args:
        store: The store (writable).
        run_id: The run.
        task_id: Only this task's branches.
        teacher: A model spec: it writes the hints of the negative proposals (see :mod:`._teacher`).

    Raises:
        FeedbackError: No such run.
        ModelError: The teacher failed.
    """
    _check_run(store, run_id)
    views = load_branch_views(store, run_id, task_id)
    candidates: list[tuple[BranchView, FeedbackRecord]] = [(v, r) for v in views for r in propose_for_branch(v)]
    stored = {r["feedback_id"]: r for r in store.feedback_by_ids([r.feedback_id for _, r in candidates])
              .iter_rows(named=True)} if candidates else {}
    fresh = [(view, record) for view, record in candidates
             if record.feedback_id not in stored or stored[record.feedback_id]["status"] == "proposed"]
    if teacher:
        from factory.feedback._teacher import write_teacher_hints

        fresh = list(zip([v for v, _ in fresh], write_teacher_hints(teacher, fresh), strict=True))
    written = [record.model_copy(update={"created_at": stored[record.feedback_id]["created_at"]})
               if record.feedback_id in stored else record for _, record in fresh]
    store.write_feedback([r.row() for r in written])
    return ProposalResult(written, new=sum(r.feedback_id not in stored for r in written),
                          kept=len(candidates) - len(fresh), branches=len(views))


def _stored(store: Store, feedback_ids: Sequence[str]) -> list[FeedbackRecord]:
    ids = list(dict.fromkeys(feedback_ids))
    if not ids:
        raise FeedbackError("give at least one feedback id (see: factory feedback list RUN)")
    found = {r["feedback_id"]: FeedbackRecord.from_row(r) for r in store.feedback_by_ids(ids).iter_rows(named=True)}
    missing = [i for i in ids if i not in found]
    if missing:
        raise FeedbackError(f"no feedback {', '.join(missing)} in {store.path}; nothing was changed "
                            "(see: factory feedback list RUN)")
    return [found[i] for i in ids]


def set_feedback_status(store: Store, feedback_ids: Sequence[str], status: str) -> list[FeedbackRecord]:
    """Accept or reject feedback rows (all or none: an unknown id changes nothing).

    Raises:
        FeedbackError: An id that is not stored, or a status that is not one.
    """
    if status not in FEEDBACK_STATUSES:
        raise FeedbackError(f"status {status!r} is not one of {', '.join(FEEDBACK_STATUSES)}")
    records = _stored(store, feedback_ids)
    store.set_feedback_status([r.feedback_id for r in records], status)
    return [r.model_copy(update={"status": status}) for r in records]


def override_feedback(store: Store, feedback_id_: str, *, polarity: str | None = None, hint: str | None = None,
                      note: str | None = None) -> FeedbackRecord:
    """A person's correction of a row (a proposal, usually): new polarity, hint or note; the row is accepted.

    What it replaced is kept in ``evidence.override`` (the earlier polarity and hint).

    Raises:
        FeedbackError: No such id, nothing to change, or a bad polarity.
    """
    if polarity is None and hint is None and note is None:
        raise FeedbackError("give --polarity, --hint or --note to override")
    if polarity is not None and polarity not in POLARITIES:
        raise FeedbackError(f"polarity {polarity!r} is not one of {', '.join(POLARITIES)}")
    (record,) = _stored(store, [feedback_id_])
    evidence = {**(record.evidence or {}),
                "override": {"polarity": record.polarity, "hint": record.hint, "at": utc_now().isoformat() + "Z"}}
    updated = record.model_copy(update={
        "polarity": polarity or record.polarity, "hint": record.hint if hint is None else (hint or None),
        "note": record.note if note is None else (note or None), "status": "accepted", "evidence": evidence})
    store.write_feedback([FeedbackRecord.model_validate(updated.model_dump()).row()])
    return updated


def list_feedback(store: Store, run_id: str, *, task_id: str | None = None,
                  status: str | None = None) -> list[FeedbackRecord]:
    """A run's feedback, by branch and place in the trajectory.

    Raises:
        FeedbackError: No such run.
    """
    _check_run(store, run_id)
    return [FeedbackRecord.from_row(r) for r in
            store.feedback(run_id, task_id=task_id, status=status).iter_rows(named=True)]
