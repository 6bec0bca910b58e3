"""``RolloutRanker``: order each task's branches, and test what can be tested about the order.

**Reward.** A branch's reward is a weighted sum of reward functions of its
record. Defaults: ``objective`` (weight 1.0) = the mean score of its latest
objective verdicts (tests passed/total after any hack penalty, answer 0/1,
...), and ``judge`` (weight 0.3) = the judge's median score / 10 (a branch
the judge did not score gets 0 here and has no judge signal). Users add
their own ``(weight, fn)`` pairs; a function returning None contributes 0.

**Strengths.** Within each task, Bradley–Terry strengths come from the
judge's position-swapped pairwise comparisons when there are any (a pair
whose two orders disagree is a tie), and otherwise from the rewards (every
pair of branches compared: the higher reward wins, equal rewards tie). Each
task is its own fit: strengths are comparable within a task only. Their
intervals follow :func:`~factory.ranking.fit_bradley_terry`'s ``"auto"``
rule (Fisher intervals of the prior-regularised fit below 50 comparisons
per branch, the bootstrap widened to them above), so they are never of zero
width; a task with a single branch has no interval (None).

**Order and ties.** Branches are sorted by reward (higher first), then by
strength (higher first), both rounded to 9 decimals, then by branch index
(lower first), so equal branches always come out in the same order.

**Is anything evidence?** Not the order against the objective outcome: the
reward is mostly that outcome, so the top half passes more by construction.
``stats`` (see :mod:`factory.ranking._evidence` for every definition) tests
instead the **signal** — what orders branches besides the objective — for
whether it predicts the objective outcome:

- in a task with pairwise judge comparisons, the strengths fitted to them
  (a branch in no comparison has no signal);
- elsewhere, the sum of the weighted reward components *not* named in
  ``objective_rewards`` (default: everything but ``objective``, i.e. the
  judge's score), where at least one of those functions returned a value.

Within each task the branches are sorted by the signal alone and the top
half's objective passes are compared with the bottom half's, paired by task
(exact McNemar); ``evidence`` needs a powered test, p < α and the top half
passing more. When no branch has a signal, the order is the objective
outcome itself: ``test`` is None, ``evidence`` False, and ``reason`` says
:data:`~factory.ranking.ORDERED_BY_OUTCOME`. Either way ``outcomes`` holds
what the verdicts themselves say (pass rates with Wilson intervals, tasks
with both passing and failing branches, usable pairs, pass@k), and
``definitions`` the words behind every number.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from factory.ranking._bradley_terry import fit_bradley_terry
from factory.ranking._evidence import EVIDENCE_DEFINITIONS, ORDERED_BY_OUTCOME, outcome_summary, signal_evidence
from factory.ranking._records import BranchRecord, PairwiseOutcome
from factory.ranking._stats import PowerPolicy

__all__ = ["DEFAULT_REWARDS", "RankResult", "RankedBranch", "RewardFunction", "RolloutRanker"]

#: A reward function maps a branch record to a number (before its weight); None means "no value" (counts 0).
RewardFunction = Callable[[BranchRecord], float | None]

#: The reward when none is given: objective score, plus three tenths of the judge's.
#: The reward when none is given: objective score, plus three tenths of the judge's (None, counted 0,
#: for a branch the judge did not score: it has no judge signal).
DEFAULT_REWARDS: dict[str, tuple[float, RewardFunction]] = {
    "objective": (1.0, lambda record: record.objective_score),
    "judge": (0.3, lambda record: record.judge_score),
}

#: The record column each default reward function reads (:meth:`RolloutRanker.evidence_of_frame` vectorises them).
_RECORD_COLUMNS = {"objective": "objective_score", "judge": "judge_score"}

#: Where a branch's signal came from (see the module docstring).
PAIRWISE_SIGNAL = "judge pairwise strengths"


@dataclass(frozen=True)
class RankedBranch:
    """A branch's place in its task's order.

    ``ci_low``/``ci_high`` are None for a task's only branch (nothing to
    compare it with). ``signal`` is what the evidence test ranks this branch
    by (None: it has none), and ``signal_source`` says what that is.
    """

    task_id: str
    branch_index: int
    rank: int
    reward: float
    components: dict[str, float]
    strength: float
    ci_low: float | None
    ci_high: float | None
    objective_pass: bool | None
    hack_detected: bool
    signal: float | None = None
    signal_source: str | None = None

    def row(self, run_id: str) -> dict[str, Any]:
        """The ``rankings`` table row."""
        from factory.store import utc_now

        return {"run_id": run_id, "task_id": self.task_id, "branch_index": self.branch_index, "rank": self.rank,
                "strength": self.strength, "ci_low": self.ci_low, "ci_high": self.ci_high, "reward": self.reward,
                "components": {**self.components, "objective_pass": self.objective_pass,
                               "hack_detected": self.hack_detected, "signal": self.signal,
                               "signal_source": self.signal_source},
                "created_at": utc_now()}


@dataclass
class RankResult:
    """The ranking, and what can be tested about it.

    Attributes:
        ranked: Every branch, grouped by task (tasks sorted), best first within a task.
        stats: The evidence test of the signal (``test``, ``signal``, ``n``, ``n_tasks``, ``powered``,
            ``mcnemar_p``, ``significant``, ``evidence``, ``top_pass_rate``, ``bottom_pass_rate``,
            ``auc_within_task``, ``auc_pooled``, ``spearman``, ``min_detectable_delta_pp``, ``verdict``), or
            ``test`` None with the ``reason`` when the order is the objective outcome itself; always
            ``outcomes`` (:func:`~factory.ranking.outcome_summary`), ``order`` and ``definitions``.
    """

    ranked: list[RankedBranch]
    stats: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"ranked": [asdict(r) for r in self.ranked], "stats": self.stats}


class RolloutRanker:
    """Ranks branches within tasks (see the module docstring for every definition).

    Args:
        rewards: Name -> (weight, function); default :data:`DEFAULT_REWARDS`.
        policy: When a test counts as powered.
        alpha: Significance level, and 1 − confidence of every interval.
        bootstrap_rounds: Rounds for the strengths' bootstrap intervals (where a branch has enough comparisons).
        seed: Bootstrap seed.
        objective_rewards: Names of the reward functions that read the objective verdicts; the others
            make up the signal the evidence test ranks by.
    """

    def __init__(self, rewards: Mapping[str, tuple[float, RewardFunction]] | None = None,
                 policy: PowerPolicy | None = None, alpha: float = 0.05, bootstrap_rounds: int = 200, seed: int = 0,
                 objective_rewards: Collection[str] = ("objective",)):
        self.rewards = dict(DEFAULT_REWARDS if rewards is None else rewards)
        self.policy = policy or PowerPolicy()
        self.alpha = alpha
        self.bootstrap_rounds = bootstrap_rounds
        self.seed = seed
        self.objective_rewards = frozenset(objective_rewards)

    def components(self, record: BranchRecord) -> dict[str, float]:
        """Each reward function's weighted contribution (0 where it returned None)."""
        parts = {}
        for name, (weight, fn) in self.rewards.items():
            value = fn(record)
            parts[name] = 0.0 if value is None else float(weight) * float(value)
        return parts

    def reward_signal(self, record: BranchRecord) -> float | None:
        """The weighted sum of the reward functions outside ``objective_rewards``; None when none returned a value."""
        values = [(weight, fn(record)) for name, (weight, fn) in self.rewards.items()
                  if name not in self.objective_rewards]
        given = [float(weight) * float(value) for weight, value in values if value is not None]
        return sum(given) if given else None

    def _signal_name(self) -> str:
        names = [name for name in self.rewards if name not in self.objective_rewards]
        return "rewards without the objective: " + ", ".join(names) if names else "rewards without the objective"

    @staticmethod
    def _pairwise_rows(records: list[BranchRecord], pairwise: list[PairwiseOutcome]) -> list[tuple[int, int, float]]:
        local = {record.branch_index: i for i, record in enumerate(records)}
        return [(local[p.a], local[p.b], p.outcome) for p in pairwise if p.a in local and p.b in local]

    def _task_signals(self, records: list[BranchRecord], rows: list[tuple[int, int, float]],
                      strengths: np.ndarray | None) -> tuple[list[float | None], str | None]:
        """Each branch's signal and its source: pairwise strengths where the judge compared, else the rewards'."""
        if rows:
            if strengths is None:
                strengths = fit_bradley_terry(np.array(rows, dtype=float), n_items=len(records), ci=None).strengths
            compared = {int(i) for row in rows for i in row[:2]}
            return [float(strengths[i]) if i in compared else None for i in range(len(records))], PAIRWISE_SIGNAL
        signals = [self.reward_signal(record) for record in records]
        return signals, (self._signal_name() if any(s is not None for s in signals) else None)

    def _task_order(self, records: list[BranchRecord], pairwise: list[PairwiseOutcome]) -> list[RankedBranch]:
        parts = [self.components(r) for r in records]
        rewards = np.array([sum(p.values()) for p in parts])
        judged = self._pairwise_rows(records, pairwise)
        rows = list(judged)
        if not rows:  # no judge comparisons: compare every pair by reward
            for i in range(len(records)):
                for j in range(i + 1, len(records)):
                    diff = rewards[i] - rewards[j]
                    rows.append((i, j, 0.5 if abs(diff) < 1e-12 else float(diff > 0)))
        lows: Sequence[float | None]
        highs: Sequence[float | None]
        if rows:
            fit = fit_bradley_terry(np.array(rows, dtype=float), n_items=len(records),
                                    bootstrap_rounds=self.bootstrap_rounds, alpha=self.alpha, seed=self.seed)
            strengths, lows, highs = fit.strengths, fit.ci_low.tolist(), fit.ci_high.tolist()
        else:  # a single branch: nothing to compare it with, so no interval
            strengths, lows, highs = np.zeros(len(records)), [None] * len(records), [None] * len(records)
        signals, source = self._task_signals(records, judged, strengths if judged else None)
        # Rounded so that rounding noise in equal fits never decides the order; the index does.
        order = sorted(range(len(records)), key=lambda i: (-round(float(rewards[i]), 9),
                                                           -round(float(strengths[i]), 9), records[i].branch_index))
        return [
            RankedBranch(records[i].task_id, records[i].branch_index, rank, float(rewards[i]), parts[i],
                         float(strengths[i]), lows[i], highs[i], records[i].objective_pass,
                         records[i].hack_detected, signals[i], source if signals[i] is not None else None)
            for rank, i in enumerate(order, start=1)
        ]

    @staticmethod
    def _by_task(records: Sequence[BranchRecord],
                 pairwise: Sequence[PairwiseOutcome]) -> tuple[dict[str, list[BranchRecord]],
                                                               dict[str, list[PairwiseOutcome]]]:
        by_task: dict[str, list[BranchRecord]] = {}
        for record in sorted(records, key=lambda r: (r.task_id, r.branch_index)):
            by_task.setdefault(record.task_id, []).append(record)
        pairs_by_task: dict[str, list[PairwiseOutcome]] = {}
        for outcome in pairwise:
            pairs_by_task.setdefault(outcome.task_id, []).append(outcome)
        return by_task, pairs_by_task

    def rank(self, records: Sequence[BranchRecord], pairwise: Sequence[PairwiseOutcome] = ()) -> RankResult:
        """Rank every task's branches, and test whether the signal (not the order) predicts the objective outcome."""
        by_task, pairs_by_task = self._by_task(records, pairwise)
        ranked: list[RankedBranch] = []
        for task_id, task_records in by_task.items():
            ranked.extend(self._task_order(task_records, pairs_by_task.get(task_id, [])))
        return RankResult(ranked, self.stats_of(ranked))

    def evidence_of(self, records: Sequence[BranchRecord],
                    pairwise: Sequence[PairwiseOutcome] = ()) -> dict[str, Any]:
        """The ``stats`` :meth:`rank` would give, without ordering the branches or computing intervals.

        The statistics depend on the signals and the objective outcomes only,
        never on the order, so a stored ranking's statistics can be recomputed
        from the run's records (as an export does).
        """
        by_task, pairs_by_task = self._by_task(records, pairwise)
        rows_by_task = {task_id: self._pairwise_rows(task_records, pairs_by_task.get(task_id, []))
                        for task_id, task_records in by_task.items()}
        strengths = self._joint_strengths(by_task, rows_by_task)
        branches = []
        for task_id, task_records in by_task.items():
            signals, source = self._task_signals(task_records, rows_by_task[task_id], strengths.get(task_id))
            branches.extend(RankedBranch(r.task_id, r.branch_index, 0, 0.0, {}, 0.0, None, None, r.objective_pass,
                                         r.hack_detected, signal, source if signal is not None else None)
                            for r, signal in zip(task_records, signals))
        return self.stats_of(branches)

    def evidence_of_frame(self, frame: Any, pairwise: Sequence[PairwiseOutcome] = (), *,
                          per_task: bool = True) -> dict[str, Any]:
        """:meth:`evidence_of` from a run's :meth:`~factory.store.Store.branch_records` frame, vectorised.

        The same statistics, without a Python object per branch: with reward functions that read the
        record's columns (:data:`DEFAULT_REWARDS`), a branch's reward signal is a column expression, and
        only the tasks the judge compared pairwise (their strengths come from a fit) become records.
        A ranker with other reward functions takes :meth:`evidence_of`'s path on the frame's records.

        Args:
            frame: Polars rows of ``Store.branch_records`` (every column, ordered or not).
            pairwise: The run's pairwise judge outcomes (:func:`~factory.ranking.load_pairwise`).
            per_task: Keep ``outcomes.tasks``, one entry per task (False: the run's figures only, whatever
                its number of tasks).
        """
        import polars as pl

        from factory.ranking._records import records_of

        signal_parts = self._signal_parts()
        if signal_parts is None:
            stats = self.evidence_of(records_of(frame), pairwise)  # a reward function only Python can apply
            if not per_task:
                stats["outcomes"].pop("tasks", None)
            return stats
        # A branch's reward signal: the weighted sum of the values given, null when none is (reward_signal).
        signal = None
        for weight, column in signal_parts:
            value = pl.col(column).cast(pl.Float64)
            if column == "objective_score":
                value = value.fill_null(0.0)  # BranchRecord.objective_score: 0 when none
            part = pl.lit(weight) * value
            signal = part if signal is None else pl.when(signal.is_null()).then(part).otherwise(
                pl.when(part.is_null()).then(signal).otherwise(signal + part))
        # Narrowed before it is sorted: a run of millions of branches is never copied whole again.
        light = frame.select("task_id", "branch_index", "objective_pass",
                             (signal if signal is not None else pl.lit(None, pl.Float64)).alias("signal")
                             ).sort("task_id", "branch_index")
        sources: set[str] = set()
        judged_tasks = {outcome.task_id for outcome in pairwise}
        if judged_tasks:
            sub = frame.filter(pl.col("task_id").is_in(sorted(judged_tasks)))
            by_task, pairs_by_task = self._by_task(records_of(sub), pairwise)
            rows_by_task = {task_id: rows for task_id, task_records in by_task.items()
                            if (rows := self._pairwise_rows(task_records, pairs_by_task.get(task_id, [])))}
            strengths = self._joint_strengths({t: by_task[t] for t in rows_by_task}, rows_by_task)
            fitted = []
            for task_id, rows in rows_by_task.items():
                signals, _ = self._task_signals(by_task[task_id], rows, strengths.get(task_id))
                fitted.extend((task_id, r.branch_index, value) for r, value in zip(by_task[task_id], signals))
                sources.update(PAIRWISE_SIGNAL for value in signals if value is not None)
            if fitted:
                pairwise_signal = pl.DataFrame(fitted, schema={"task_id": pl.String, "branch_index": pl.Int64,
                                                               "_pairwise": pl.Float64}, orient="row")
                light = (light.with_columns(pl.col("branch_index").cast(pl.Int64))
                         .join(pairwise_signal.with_columns(pl.lit(True).alias("_judged")),
                               on=["task_id", "branch_index"], how="left", maintain_order="left")
                         .with_columns(pl.when(pl.col("_judged")).then(pl.col("_pairwise"))
                                       .otherwise(pl.col("signal")).alias("signal"))
                         .drop("_pairwise", "_judged"))
                judged = pl.col("task_id").is_in(list(rows_by_task))
                if light.filter(~judged & pl.col("signal").is_not_null()).height:
                    sources.add(self._signal_name())
            elif light["signal"].null_count() < light.height:
                sources.add(self._signal_name())
        elif light["signal"].null_count() < light.height:
            sources.add(self._signal_name())
        return self._stats_of_frame(light, sorted(sources), per_task)

    def _signal_parts(self) -> list[tuple[float, str]] | None:
        """``(weight, record column)`` of each reward making up the signal; None when one is not a column's."""
        parts = [(float(weight), _RECORD_COLUMNS[name]) for name, (weight, fn) in self.rewards.items()
                 if name not in self.objective_rewards and name in _RECORD_COLUMNS
                 and fn is DEFAULT_REWARDS.get(name, (0, None))[1]]
        return parts if len(parts) == sum(name not in self.objective_rewards for name in self.rewards) else None

    def evidence_of_task_counts(self, counts: Any) -> dict[str, Any] | None:
        """:meth:`evidence_of_frame`'s statistics (the run's figures only) from one row per task, or None.

        When no branch has a signal (none of the columns the signal reads is set, and the run has no
        pairwise judgments: the caller checks those), the statistics are the objective outcomes' alone, and
        per-task counts give them exactly: no row per branch is read. None when a branch may have a signal
        (or a reward only Python can apply): the caller takes :meth:`evidence_of_frame`'s path.

        Args:
            counts: Polars rows of :meth:`~factory.store.Store.run_outcome_counts` (one per task, by task id).
        """
        from factory.ranking._evidence import outcome_summary_counted

        parts = self._signal_parts()
        if parts is None or any(column == "objective_score" or counts[f"{column}s"].sum() for _, column in parts):
            return None
        summary = outcome_summary_counted(range(counts.height), counts["verified"].to_numpy(),
                                          counts["passed"].to_numpy(), int(counts["unverified"].sum()),
                                          alpha=self.alpha, per_task=False)
        common = {"n_tasks": counts.height, "order": self._order_words(), "outcomes": summary,
                  "definitions": EVIDENCE_DEFINITIONS}
        return self._no_signal_stats(summary, common)

    def _stats_of_frame(self, light: Any, sources: list[str], per_task: bool) -> dict[str, Any]:
        """:meth:`stats_of` on ``task_id, branch_index, objective_pass, signal`` rows sorted by task and branch."""
        import polars as pl

        from factory.ranking._evidence import outcome_summary_counted, signal_evidence_coded

        counts = (light.group_by("task_id").agg(pl.col("objective_pass").count().alias("verified"),
                                                 pl.col("objective_pass").sum().alias("passed"))
                  .sort("task_id"))
        summary = outcome_summary_counted(counts["task_id"].to_list(), counts["verified"].to_numpy(),
                                          counts["passed"].to_numpy(), light["objective_pass"].null_count(),
                                          alpha=self.alpha, per_task=per_task)
        common = {"n_tasks": counts.height, "order": self._order_words(), "outcomes": summary,
                  "definitions": EVIDENCE_DEFINITIONS}
        if not sources:
            return self._no_signal_stats(summary, common)
        # As signal_evidence's _known: branches with an outcome and a finite signal (to 9 decimals), their
        # tasks coded by rank among the sorted ids that remain.
        signal = np.round(light["signal"].cast(pl.Float64).fill_null(np.nan).to_numpy(), 9)
        known = light["objective_pass"].is_not_null().to_numpy() & np.isfinite(signal)
        kept = light.filter(pl.Series(known))
        codes = (kept["task_id"].rank("dense").to_numpy().astype(np.int64) - 1) if kept.height else \
            np.zeros(0, dtype=np.int64)
        test = signal_evidence_coded(codes, kept["objective_pass"].to_numpy().astype(bool), signal[known],
                                     alpha=self.alpha, policy=self.policy, signal_name=" / ".join(sources))
        return {**test, "reason": None, **common}

    @staticmethod
    def _joint_strengths(by_task: Mapping[str, list[BranchRecord]],
                         rows_by_task: Mapping[str, list[tuple[int, int, float]]]) -> dict[str, np.ndarray]:
        """Every judged task's pairwise strengths from one fit, each task centred on its own.

        Tasks share no comparison, and the prior ties each branch to a fixed
        reference, so the joint posterior is the product of the tasks' own:
        one fit gives each task's strengths up to its offset, which centring
        removes. One fit of all tasks costs far less than one per task.
        """
        offsets, rows = {}, []
        total = 0
        for task_id, task_rows in rows_by_task.items():
            if task_rows:
                offsets[task_id] = total
                rows.extend((i + total, j + total, outcome) for i, j, outcome in task_rows)
            total += len(by_task[task_id]) if task_rows else 0
        if not rows:
            return {}
        joint = fit_bradley_terry(np.array(rows, dtype=float), n_items=total, ci=None).strengths
        out = {}
        for task_id, start in offsets.items():
            part = joint[start:start + len(by_task[task_id])]
            out[task_id] = part - part.mean()
        return out

    def _order_words(self) -> str:
        weights = " + ".join(f"{name} {weight:g}" for name, (weight, _) in self.rewards.items())
        return (f"reward ({weights}), then Bradley-Terry strength, then branch index; the test below uses "
                f"the signal alone, never this order")

    def stats_of(self, ranked: Sequence[RankedBranch]) -> dict[str, Any]:
        """What can be tested about ranked branches (the module docstring says what and how).

        Args:
            ranked: Ranked branches of any number of tasks, with their ``signal`` (branches built
                without one count as having none).
        """
        branches = sorted(ranked, key=lambda r: (r.task_id, r.branch_index))
        tasks = [r.task_id for r in branches]
        outcomes = [r.objective_pass for r in branches]
        summary = outcome_summary(tasks, outcomes, alpha=self.alpha)
        common = {"n_tasks": len(set(tasks)), "order": self._order_words(), "outcomes": summary,
                  "definitions": EVIDENCE_DEFINITIONS}
        sources = sorted({r.signal_source or "signal" for r in branches if r.signal is not None})
        if not sources:
            return self._no_signal_stats(summary, common)
        test = signal_evidence(tasks, [r.signal for r in branches], outcomes, alpha=self.alpha, policy=self.policy,
                               signal_name=" / ".join(sources))
        return {**test, "reason": None, **common}

    @staticmethod
    def _no_signal_stats(summary: dict[str, Any], common: dict[str, Any]) -> dict[str, Any]:
        """The statistics when no branch has a signal: the order is the objective outcome, nothing to test."""
        usable = (f"{summary['usable_tasks']} of {summary['n_tasks']} tasks have both passing and failing "
                  f"branches ({summary['usable_pairs']} usable pairs)")
        return {"test": None, "signal": None, "reason": ORDERED_BY_OUTCOME, "n": 0, "powered": False,
                "min_detectable_delta_pp": None, "mcnemar_p": None, "significant": False, "evidence": False,
                "top_pass_rate": None, "bottom_pass_rate": None, "auc_within_task": None,
                "auc_pooled": None, "spearman": None, **common,
                "verdict": f"{ORDERED_BY_OUTCOME}; {usable}", "compared": None}
