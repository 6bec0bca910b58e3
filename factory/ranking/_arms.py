"""Two arms paired by task, for ``factory power``.

Pairing rule (the same for both ways of forming arms): within each task,
each arm's verified branches are sorted by branch index and the i-th branch
of arm A is paired with the i-th branch of arm B, for i below the smaller
count. A task missing from either arm contributes no pair. Branches without
an objective verdict are left out. The outcome compared is objective pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from factory.errors import ConfigError
from factory.ranking._records import BranchRecord

__all__ = ["PairedArms", "pair_arms", "split_by_field"]


@dataclass(frozen=True)
class PairedArms:
    """Objective outcomes of two arms, aligned item by item.

    Attributes:
        a: Arm A's outcomes.
        b: Arm B's outcomes.
        items: ``(task_id, branch_index_a, branch_index_b)`` for each pair.
        label_a: How arm A was chosen.
        label_b: How arm B was chosen.
    """

    a: list[bool]
    b: list[bool]
    items: list[tuple[str, int, int]]
    label_a: str
    label_b: str


def _coerce(value: str, sample: Any) -> Any:
    if isinstance(sample, bool):
        return value.lower() in ("1", "true", "yes")
    if isinstance(sample, (int, float)) and not isinstance(sample, bool):
        try:
            return type(sample)(float(value)) if isinstance(sample, int) else float(value)
        except ValueError:
            raise ConfigError(f"expected a number for this field, got {value!r}") from None
    return value


def split_by_field(records: Sequence[BranchRecord], field: str, a_value: str,
                   b_value: str) -> tuple[list[BranchRecord], list[BranchRecord]]:
    """Branches whose ``field`` equals ``a_value`` (arm A) and ``b_value`` (arm B).

    Raises:
        ConfigError: Unknown field, or a value no branch has.
    """
    if not records:
        raise ConfigError("the run has no branches")
    if field not in records[0].fields:
        raise ConfigError(f"unknown field '{field}' (choose from: {', '.join(sorted(records[0].fields))})")
    sample = next((r.fields[field] for r in records if r.fields[field] is not None), None)
    want_a, want_b = _coerce(a_value, sample), _coerce(b_value, sample)

    def matches(value: Any, want: Any) -> bool:
        return abs(value - want) < 1e-9 if isinstance(want, float) and value is not None else value == want

    arm_a = [r for r in records if matches(r.fields[field], want_a)]
    arm_b = [r for r in records if matches(r.fields[field], want_b)]
    present = sorted({str(r.fields[field]) for r in records})
    for label, arm in ((a_value, arm_a), (b_value, arm_b)):
        if not arm:
            raise ConfigError(f"no branch has {field} = {label} (values: {', '.join(present)})")
    return arm_a, arm_b


def pair_arms(arm_a: Sequence[BranchRecord], arm_b: Sequence[BranchRecord], label_a: str,
              label_b: str) -> PairedArms:
    """Align two arms by task (see the module docstring for the rule)."""
    def by_task(arm: Sequence[BranchRecord]) -> dict[str, list[BranchRecord]]:
        grouped: dict[str, list[BranchRecord]] = {}
        for record in sorted(arm, key=lambda r: (r.task_id, r.branch_index)):
            if record.objective_pass is not None:
                grouped.setdefault(record.task_id, []).append(record)
        return grouped

    tasks_a, tasks_b = by_task(arm_a), by_task(arm_b)
    a, b, items = [], [], []
    for task_id in sorted(set(tasks_a) & set(tasks_b)):
        for left, right in zip(tasks_a[task_id], tasks_b[task_id]):
            a.append(bool(left.objective_pass))
            b.append(bool(right.objective_pass))
            items.append((task_id, left.branch_index, right.branch_index))
    return PairedArms(a, b, items, label_a, label_b)
