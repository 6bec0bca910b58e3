"""Two arms paired by task, for ``factory power``.

Pairing rule (the same for every way of forming arms): within each task,
each arm's verified branches are sorted by branch index and the i-th branch
of arm A is paired with the i-th branch of arm B, for i below the smaller
count. A task missing from either arm contributes no pair. Branches without
an objective verdict are left out. The outcome compared is objective pass.

**Arms chosen by looking at the data** (:func:`select_arms`), e.g. "the
best against the worst temperature": testing them on the data that chose
them finds a difference among arms that are all alike (the largest of
several noisy gaps is large by construction). So the tasks are split at
random (seeded) into a *selection* half and a *test* half (cross-fitting):
the arms are chosen on the selection half only, and compared, paired by
task, on the test half only, whose outcomes the choice never saw. The test
then keeps its level whatever the rule chose; the price is half the tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from factory.errors import ConfigError
from factory.ranking._records import BranchRecord, excluded_branches
from factory.store import Store

__all__ = ["SELECTION_RULES", "PairedArms", "SelectedArms", "excluded_in_arms", "pair_arms", "select_arms",
           "split_by_field"]

#: How :func:`select_arms` may choose two arms from the data.
SELECTION_RULES = ("best-worst",)


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


def _matches(value: Any, want: Any) -> bool:
    return abs(value - want) < 1e-9 if isinstance(want, float) and value is not None else value == want


def excluded_in_arms(store: Store, run_id: str, field: str, values: Sequence[str]) -> dict[str, Any]:
    """The infrastructure failures of ``run_id`` that would have been in an arm (``field`` in ``values``).

    They are not outcomes, so no arm holds them; this says how many each comparison lost
    (:func:`~factory.ranking.excluded_branches` for the rule).
    """
    def in_an_arm(row: dict[str, Any]) -> bool:
        value = row.get(field)
        if value is None:
            return False
        try:
            return any(_matches(value, _coerce(wanted, value)) for wanted in values)
        except ConfigError:  # a value that is not a number of this field matches nothing
            return False

    return excluded_branches(store, run_id, in_an_arm)


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
    arm_a = [r for r in records if _matches(r.fields[field], want_a)]
    arm_b = [r for r in records if _matches(r.fields[field], want_b)]
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


@dataclass(frozen=True)
class SelectedArms:
    """Two arms chosen on one half of the tasks, paired on the other (cross-fitting; see the module docstring).

    Attributes:
        paired: The chosen arms' outcomes on the test half, paired by task.
        field: The branch field whose values are the candidate arms.
        rule: How the arms were chosen (``"best-worst"``).
        seed: Seed of the random split of the tasks.
        selection_tasks: Tasks the choice looked at.
        test_tasks: Tasks the comparison uses.
        selection_rates: Each candidate value (as text) -> ``(passed, verified)`` on the selection half.
        value_a: The value chosen as arm A (the best).
        value_b: The value chosen as arm B (the worst).
    """

    paired: PairedArms
    field: str
    rule: str
    seed: int
    selection_tasks: list[str]
    test_tasks: list[str]
    selection_rates: dict[str, tuple[int, int]]
    value_a: Any
    value_b: Any

    def note(self) -> str:
        """The cross-fitting, in words, for a verdict."""
        return (f"arms chosen ({self.rule} {self.field}) on {len(self.selection_tasks)} tasks, tested on the "
                f"other {len(self.test_tasks)} (cross-fitting, split seed {self.seed})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the choice and the split (the test half's outcomes are in the power report)."""
        return {"field": self.field, "rule": self.rule, "seed": self.seed, "arm_a": self.paired.label_a,
                "arm_b": self.paired.label_b, "selection_tasks": self.selection_tasks,
                "test_tasks": self.test_tasks,
                "selection_rates": {value: {"passed": k, "verified": n}
                                    for value, (k, n) in self.selection_rates.items()},
                "cross_fitting": self.note()}


def select_arms(records: Sequence[BranchRecord], field: str, rule: str = "best-worst",
                seed: int = 0) -> SelectedArms:
    """Choose two arms among the values of ``field`` on half the tasks and pair them on the other half.

    ``"best-worst"``: arm A is the value with the highest pass rate on the
    selection half, arm B the one with the lowest (ties: the first value in
    sorted order). The tasks with a verified branch are shuffled with
    ``seed``; the first ⌈T/2⌉ select, the rest test.

    Raises:
        ConfigError: Unknown field or rule, fewer than two values or two tasks, or a value that
            never appears in the selection half.
    """
    if rule not in SELECTION_RULES:
        raise ConfigError(f"unknown selection rule {rule!r} (choose from: {', '.join(SELECTION_RULES)})")
    if not records:
        raise ConfigError("the run has no branches")
    if field not in records[0].fields:
        raise ConfigError(f"unknown field '{field}' (choose from: {', '.join(sorted(records[0].fields))})")
    verified = [r for r in records if r.objective_pass is not None and r.fields.get(field) is not None]
    values = sorted({r.fields[field] for r in verified}, key=lambda v: (str(type(v)), v))
    if len(values) < 2:
        raise ConfigError(f"selecting arms needs two values of {field} among verified branches, "
                          f"got {len(values)}")
    tasks = sorted({r.task_id for r in verified})
    if len(tasks) < 2:
        raise ConfigError("selecting arms needs at least two tasks: one half chooses, the other tests")
    shuffled = [tasks[i] for i in np.random.default_rng(seed).permutation(len(tasks))]
    cut = (len(tasks) + 1) // 2
    selection, test = sorted(shuffled[:cut]), sorted(shuffled[cut:])
    chosen = set(selection)
    rates: dict[Any, list[int]] = {value: [0, 0] for value in values}
    for record in verified:
        if record.task_id in chosen:
            rates[record.fields[field]][0] += bool(record.objective_pass)
            rates[record.fields[field]][1] += 1
    seen = [value for value in values if rates[value][1]]
    if len(seen) < 2:
        raise ConfigError(f"fewer than two values of {field} appear in the selection half (seed {seed})")
    best = max(seen, key=lambda v: (rates[v][0] / rates[v][1], -seen.index(v)))
    worst = min((v for v in seen if v != best), key=lambda v: (rates[v][0] / rates[v][1], seen.index(v)))
    testing = set(test)
    arm_a = [r for r in verified if r.task_id in testing and r.fields[field] == best]
    arm_b = [r for r in verified if r.task_id in testing and r.fields[field] == worst]
    paired = pair_arms(arm_a, arm_b, f"{field}={best} (best)", f"{field}={worst} (worst)")
    return SelectedArms(paired, field, rule, seed, selection, test,
                        {str(v): (rates[v][0], rates[v][1]) for v in values}, best, worst)
