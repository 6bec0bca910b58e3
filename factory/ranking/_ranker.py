"""``RolloutRanker``: order each task's branches and say whether the order is evidence.

**Reward.** A branch's reward is a weighted sum of reward functions of its
record. Defaults: ``objective`` (weight 1.0) = the mean score of its latest
objective verdicts (tests passed/total after any hack penalty, answer 0/1,
...), and ``judge`` (weight 0.3) = the judge's median score / 10. Users add
their own ``(weight, fn)`` pairs.

**Strengths.** Within each task, Bradley–Terry strengths come from the
judge's position-swapped pairwise comparisons when there are any (a pair
whose two orders disagree is a tie), and otherwise from the rewards (every
pair of branches compared: the higher reward wins, equal rewards tie). Each
task is its own fit: strengths are comparable within a task only.

**Order and ties.** Branches are sorted by reward (higher first), then by
strength (higher first), both rounded to 9 decimals, then by branch index
(lower first), so equal branches always come out in the same order.

**Is the order evidence?** ``stats`` compares the objective outcomes of the
top and bottom halves of every task, paired by task: with m verified
branches ranked 1..m and h = m // 2, rank i is paired with rank m − h + i
for i = 1..h (the middle branch of an odd m sits out). Each pair is one item
of an exact McNemar test (``mcnemar_p``); ``n`` is the number of such pairs;
``powered`` and ``min_detectable_delta_pp`` follow the Wilson rule and the
paired-difference approximation of :mod:`._stats`. A ranking is evidence
only when it is powered and p < α.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from factory.ranking._bradley_terry import fit_bradley_terry
from factory.ranking._records import BranchRecord, PairwiseOutcome
from factory.ranking._stats import PowerPolicy, compare_paired

__all__ = ["DEFAULT_REWARDS", "RankResult", "RankedBranch", "RewardFunction", "RolloutRanker"]

#: A reward function maps a branch record to a number (before its weight).
RewardFunction = Callable[[BranchRecord], float]

#: The reward when none is given: objective score, plus three tenths of the judge's.
DEFAULT_REWARDS: dict[str, tuple[float, RewardFunction]] = {
    "objective": (1.0, lambda record: record.objective_score),
    "judge": (0.3, lambda record: record.judge_score or 0.0),
}


@dataclass(frozen=True)
class RankedBranch:
    """A branch's place in its task's order."""

    task_id: str
    branch_index: int
    rank: int
    reward: float
    components: dict[str, float]
    strength: float
    ci_low: float
    ci_high: float
    objective_pass: bool | None
    hack_detected: bool

    def row(self, run_id: str) -> dict[str, Any]:
        """The ``rankings`` table row."""
        from factory.store import utc_now

        return {"run_id": run_id, "task_id": self.task_id, "branch_index": self.branch_index, "rank": self.rank,
                "strength": self.strength, "ci_low": self.ci_low, "ci_high": self.ci_high, "reward": self.reward,
                "components": {**self.components, "objective_pass": self.objective_pass,
                               "hack_detected": self.hack_detected},
                "created_at": utc_now()}


@dataclass
class RankResult:
    """The ranking and whether it is powered.

    Attributes:
        ranked: Every branch, grouped by task (tasks sorted), best first within a task.
        stats: ``n``, ``n_tasks``, ``powered``, ``min_detectable_delta_pp``, ``mcnemar_p``,
            ``significant``, ``evidence``, the two halves' pass rates and a plain-words ``verdict``.
    """

    ranked: list[RankedBranch]
    stats: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"ranked": [asdict(r) for r in self.ranked], "stats": self.stats}


class RolloutRanker:
    """Ranks branches within tasks (see the module docstring for every definition).

    Args:
        rewards: Name -> (weight, function); default :data:`DEFAULT_REWARDS`.
        policy: When a comparison counts as powered.
        alpha: Significance level.
        bootstrap_rounds: Rounds for the strengths' confidence intervals.
        seed: Bootstrap seed.
    """

    def __init__(self, rewards: Mapping[str, tuple[float, RewardFunction]] | None = None,
                 policy: PowerPolicy | None = None, alpha: float = 0.05, bootstrap_rounds: int = 200, seed: int = 0):
        self.rewards = dict(DEFAULT_REWARDS if rewards is None else rewards)
        self.policy = policy or PowerPolicy()
        self.alpha = alpha
        self.bootstrap_rounds = bootstrap_rounds
        self.seed = seed

    def components(self, record: BranchRecord) -> dict[str, float]:
        """Each reward function's weighted contribution."""
        return {name: float(weight) * float(fn(record)) for name, (weight, fn) in self.rewards.items()}

    def _task_order(self, records: list[BranchRecord], pairwise: list[PairwiseOutcome]) -> list[RankedBranch]:
        local = {record.branch_index: i for i, record in enumerate(records)}
        parts = [self.components(r) for r in records]
        rewards = np.array([sum(p.values()) for p in parts])
        rows = [(local[p.a], local[p.b], p.outcome) for p in pairwise if p.a in local and p.b in local]
        if not rows:  # no judge comparisons: compare every pair by reward
            for i in range(len(records)):
                for j in range(i + 1, len(records)):
                    diff = rewards[i] - rewards[j]
                    rows.append((i, j, 0.5 if abs(diff) < 1e-12 else float(diff > 0)))
        if rows:
            fit = fit_bradley_terry(np.array(rows, dtype=float), n_items=len(records),
                                    bootstrap_rounds=self.bootstrap_rounds, alpha=self.alpha, seed=self.seed)
            strengths, lows, highs = fit.strengths, fit.ci_low, fit.ci_high
        else:  # a single branch
            strengths = lows = highs = np.zeros(len(records))
        # Rounded so that rounding noise in equal fits never decides the order; the index does.
        order = sorted(range(len(records)), key=lambda i: (-round(float(rewards[i]), 9),
                                                           -round(float(strengths[i]), 9), records[i].branch_index))
        return [
            RankedBranch(records[i].task_id, records[i].branch_index, rank, float(rewards[i]), parts[i],
                         float(strengths[i]), float(lows[i]), float(highs[i]), records[i].objective_pass,
                         records[i].hack_detected)
            for rank, i in enumerate(order, start=1)
        ]

    def rank(self, records: Sequence[BranchRecord], pairwise: Sequence[PairwiseOutcome] = ()) -> RankResult:
        """Rank every task's branches and test whether the top halves beat the bottom halves."""
        by_task: dict[str, list[BranchRecord]] = {}
        for record in sorted(records, key=lambda r: (r.task_id, r.branch_index)):
            by_task.setdefault(record.task_id, []).append(record)
        pairs_by_task: dict[str, list[PairwiseOutcome]] = {}
        for outcome in pairwise:
            pairs_by_task.setdefault(outcome.task_id, []).append(outcome)
        ranked: list[RankedBranch] = []
        for task_id, task_records in by_task.items():
            ranked.extend(self._task_order(task_records, pairs_by_task.get(task_id, [])))
        return RankResult(ranked, self.stats_of(ranked))

    def stats_of(self, ranked: Sequence[RankedBranch]) -> dict[str, Any]:
        """Whether an order is evidence: top vs bottom halves of every task, paired by task (module docstring).

        Args:
            ranked: Ranked branches of any number of tasks (each task's in rank order, or with ranks to sort by).
        """
        by_task: dict[str, list[RankedBranch]] = {}
        for branch in ranked:
            by_task.setdefault(branch.task_id, []).append(branch)
        top: list[bool] = []
        bottom: list[bool] = []
        for order in by_task.values():
            verified = [r for r in sorted(order, key=lambda r: r.rank) if r.objective_pass is not None]
            half = len(verified) // 2
            for i in range(half):
                top.append(bool(verified[i].objective_pass))
                bottom.append(bool(verified[len(verified) - half + i].objective_pass))
        return self._stats(top, bottom, len(by_task))

    def _stats(self, top: list[bool], bottom: list[bool], n_tasks: int) -> dict[str, Any]:
        if not top:
            return {"n": 0, "n_tasks": n_tasks, "powered": False, "min_detectable_delta_pp": None,
                    "mcnemar_p": None, "significant": False, "evidence": False, "top_pass_rate": None,
                    "bottom_pass_rate": None, "verdict": "not powered: no task has two verified branches"}
        report = compare_paired(top, bottom, alpha=self.alpha, policy=self.policy)
        mdd = report.min_detectable_delta_pp
        return {
            "n": report.n,
            "n_tasks": n_tasks,
            "powered": report.powered,
            "min_detectable_delta_pp": None if mdd is None or not np.isfinite(mdd) else float(mdd),
            "mcnemar_p": report.p_value,
            "significant": report.significant,
            "evidence": report.evidence,
            "top_pass_rate": report.rate_a,
            "bottom_pass_rate": report.rate_b,
            "verdict": report.verdict.replace("arm A", "the top half").replace("arm B", "the bottom half"),
            "compared": "objective pass of rank i vs rank m-h+i within each task (h = m // 2), paired by task",
        }
