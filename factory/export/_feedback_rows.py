"""The ``hints`` and ``spans`` row contract in plain Python: the hint message, polarity per message, checks.

The row formats themselves are written at the top of
:mod:`factory.export._feedback`. This module needs neither polars nor the
store, so ``factory export validate`` and the trainers that read these files
check them as lightly as the other formats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["HINT_PREFIX", "POLARITY_ORDER", "SOURCE_RANK", "hint_message", "message_polarities", "row_problems"]

#: The inserted hint message's content is this prefix and the hint.
HINT_PREFIX = "Hint: "
#: Where accepted feedback overlaps on a message: the higher source rank wins, then the stronger polarity.
SOURCE_RANK = {"user": 2, "judge": 1, "verifier": 1}
#: Negative beats positive beats neutral: never reinforce what something flagged.
POLARITY_ORDER = {"negative": 2, "positive": 1, "neutral": 0}
_POLARITIES = tuple(POLARITY_ORDER)


def hint_message(hint: str) -> dict[str, Any]:
    """The message a teacher prompt ends with: ``{"role": "user", "content": "Hint: <hint>"}`` (other keys null)."""
    return {"role": "user", "content": HINT_PREFIX + hint, "name": None, "tool_call_id": None, "tool_calls": None}


def message_polarities(messages: Sequence[Mapping[str, Any]], spans: Sequence[Mapping[str, Any]]) -> list[str]:
    """One polarity per message: covered assistant messages take their spans' (see :data:`SOURCE_RANK`).

    Args:
        messages: The trajectory.
        spans: ``{"start", "end", "polarity", "source"}`` message ranges [start, end).
    """
    best: list[tuple[int, int] | None] = [None] * len(messages)
    polarity = ["neutral"] * len(messages)
    for span in spans:
        key = (SOURCE_RANK.get(str(span["source"]), 0), POLARITY_ORDER[str(span["polarity"])])
        for i in range(max(0, int(span["start"])), min(len(messages), int(span["end"]))):
            if messages[i].get("role") == "assistant" and (best[i] is None or key > best[i]):  # type: ignore[operator]
                best[i], polarity[i] = key, str(span["polarity"])
    return polarity


def _hints_problems(record: Mapping[str, Any]) -> list[str]:
    prompt, teacher, completion, hint = (record.get(k) for k in ("prompt", "teacher_prompt", "completion", "hint"))
    if not all(isinstance(v, list) for v in (prompt, teacher, completion)) or not isinstance(hint, str):
        return []  # the column checks already said so
    problems = []
    last = teacher[-1] if teacher else {}
    if (teacher[:-1] != prompt or not isinstance(last, Mapping) or last.get("role") != "user"
            or last.get("content") != HINT_PREFIX + hint):
        problems.append(f"field 'teacher_prompt': must be 'prompt' plus a last user message "
                        f"{HINT_PREFIX!r} + 'hint'")
    if len(completion) != 1 or not isinstance(completion[0], Mapping) or completion[0].get("role") != "assistant":
        problems.append("field 'completion': must be exactly one assistant message (the turn)")
    turn = record.get("turn")
    turns = sum(1 for m in prompt if isinstance(m, Mapping) and m.get("role") == "assistant")
    if isinstance(turn, int) and not isinstance(turn, bool) and turn != turns:
        problems.append(f"field 'turn': {turn}, but 'prompt' holds {turns} assistant message(s) before the turn")
    return problems


def _spans_problems(record: Mapping[str, Any]) -> list[str]:
    messages, polarity, spans = record.get("messages"), record.get("polarity"), record.get("spans")
    if not isinstance(messages, list):
        return []
    problems = []
    if not isinstance(polarity, list) or any(p not in _POLARITIES for p in polarity):
        problems.append(f"field 'polarity': expected a list of {', '.join(_POLARITIES)}")
    elif len(polarity) != len(messages):
        problems.append(f"field 'polarity': {len(polarity)} entries for {len(messages)} messages")
    else:
        for i, (message, p) in enumerate(zip(messages, polarity, strict=True)):
            if isinstance(message, Mapping) and message.get("role") != "assistant" and p != "neutral":
                problems.append(f"field 'polarity[{i}]': a {message.get('role')} message is never in a loss: "
                                f"must be neutral, got {p}")
    if not isinstance(spans, list):
        return [*problems, "field 'spans': expected a list of {start, end, polarity, source}"]
    for i, span in enumerate(spans):
        start, end = (span.get("start"), span.get("end")) if isinstance(span, Mapping) else (None, None)
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= len(messages)):
            problems.append(f"field 'spans[{i}]': expected 0 <= start < end <= {len(messages)}, got {span!r:.120}")
        elif span.get("polarity") not in _POLARITIES:
            problems.append(f"field 'spans[{i}].polarity': {span.get('polarity')!r} is not one of "
                            f"{', '.join(_POLARITIES)}")
    return problems


_CHECKS = {"hints": _hints_problems, "spans": _spans_problems}


def row_problems(format_name: str, record: Mapping[str, Any]) -> list[str]:
    """What breaks the ``hints`` or ``spans`` contract in one row beyond its columns' kinds (other formats: none)."""
    check = _CHECKS.get(format_name)
    return check(record) if check else []
