"""Is a ranking evidence? Only a test whose outcome the ranking did not use can say.

A ranking that orders branches by their objective outcome (tests passed,
answer right) and is then checked against that same outcome always "wins":
the top half passes more by construction, on coin flips as on real data.
So evidence is defined here so that it can be wrong (DESIGN.md,
"Statistics"):

**Signal test** (:func:`signal_evidence`). When there is a signal other
than the objective verdicts — judge scores, strengths fitted to pairwise
judge comparisons, a user's reward functions that do not read the
objective — the question is whether that signal predicts the objective
outcome. Within each task, the branches that have both a signal and an
objective verdict are sorted by the signal alone (higher first; equal
signals keep branch order); with m of them and h = m // 2, the i-th
(i = 1..h) is paired with the (m − h + i)-th, so the top half meets the
bottom half and the middle branch of an odd m sits out. A pair whose two
signals are equal (to 9 decimals) is left out: the signal does not order
it. Each pair is one item of an exact McNemar test (two-sided, see
:func:`~factory.ranking.mcnemar_exact`) of "top passes" against "bottom
passes", paired by task. The signal is **evidence** when the test is
powered (:class:`~factory.ranking.PowerPolicy`), p < α, *and* the top half
passes more: a signal that reliably prefers failing branches is reported
(``direction``), never called evidence. Under a null world — a signal
independent of the outcomes within each task — every discordant pair is a
fair coin whatever the tasks' difficulties, so false evidence is claimed at
most at rate α/2 (the suite checks ≤ α + 3 pp on 200 simulated runs).
Beside the test, and descriptive only:

- ``auc_within_task``: over every (passing, failing) pair of branches of
  the same task, the share in which the passing branch has the higher
  signal (ties count half) — what a user who ranks by the signal gets;
- ``auc_pooled``: the same over every (passing, failing) pair of the run,
  across tasks, so a signal that only tells easy tasks from hard ones
  scores here and not above;
- ``spearman``: Spearman's ρ of signal and outcome (pass = 1) over every
  branch, ties given average ranks (a pooled measure, like ``auc_pooled``).

This is what tells a user whether a judge can be trusted on tasks that
have no tests.

**No test** (:data:`ORDERED_BY_OUTCOME`). When the order is the objective
outcome itself there is nothing to test, and the statistics say so. What
is informative then is :func:`outcome_summary`: verified branches and
passes with a Wilson interval, per-task pass rates with Wilson intervals,
tasks with both passing and failing branches (``usable_tasks``), the
(passing, failing) pairs they hold (``usable_pairs``: what a preference
export can draw on), and pass@k averaged over tasks.

Arms of ``factory power`` chosen by looking at the data are tested on
tasks the choice did not see: see :func:`~factory.ranking.select_arms`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from factory.errors import ConfigError
from factory.ranking._stats import PowerPolicy, compare_paired, pass_at_k, wilson_interval

__all__ = ["EVIDENCE_DEFINITIONS", "ORDERED_BY_OUTCOME", "describe_evidence", "outcome_summary",
           "outcome_summary_counted", "signal_evidence", "signal_evidence_coded"]

#: What the statistics say when the order is the objective outcome itself.
ORDERED_BY_OUTCOME = ("ordered by the verifier's own outcome: no evidence test applies; "
                      "the verifier's reliability is its golden-set record")

#: The definitions behind every number of :func:`signal_evidence` and :func:`outcome_summary`,
#: in words, for JSON output and export manifests.
EVIDENCE_DEFINITIONS: dict[str, str] = {
    "evidence": "a signal other than the objective verdicts predicts the objective outcome: powered, "
                "McNemar p < alpha, and the signal's top half passes more; never claimed for an order "
                "that is the objective outcome itself",
    "signal_test": "within each task, branches sorted by the signal alone; with m branches and h = m // 2, "
                   "rank i is paired with rank m - h + i (i = 1..h); pairs whose signals tie are left out; "
                   "the objective pass of the top branch vs the bottom branch, paired by task",
    "mcnemar_p": "exact two-sided binomial test of the discordant pairs at 1/2 (1 with none; null below 4 pairs)",
    "powered": "n >= 10 pairs and both halves' Wilson half-widths < 30 pp (PowerPolicy)",
    "auc_within_task": "share of (passing, failing) branch pairs of the same task where the passing one has "
                       "the higher signal, ties half",
    "auc_pooled": "the same over all (passing, failing) pairs of the run, across tasks",
    "spearman": "Spearman rank correlation of signal and objective pass (1/0) over all branches, average "
                "ranks for ties",
    "pass_rate": "passing / verified branches, with a Wilson score interval at 1 - alpha",
    "usable_tasks": "tasks with at least one passing and one failing verified branch",
    "usable_pairs": "(passing, failing) branch pairs within tasks, summed over tasks",
    "pass_at_k": "mean over tasks with at least k verified branches of 1 - C(n - c, k) / C(n, k)",
}


# --------------------------------------------------------------------------- ranks


def _codes(task_ids: Sequence[Any]) -> np.ndarray:
    """Task ids as small integer codes (equal ids, equal codes)."""
    _, codes = np.unique(np.asarray([str(t) for t in task_ids], dtype=object), return_inverse=True)
    return codes.astype(np.int64).reshape(-1)


def _grouped_average_ranks(groups: np.ndarray, values: np.ndarray) -> np.ndarray:
    """1-based ranks of ``values`` within each group, tied values sharing their average rank."""
    size = values.size
    if size == 0:
        return np.zeros(0)
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order]
    new_group = np.ones(size, dtype=bool)
    new_group[1:] = g[1:] != g[:-1]
    new_tie = new_group.copy()
    new_tie[1:] |= v[1:] != v[:-1]
    position = np.arange(size)
    group_start = np.maximum.accumulate(np.where(new_group, position, 0))
    tie_id = np.cumsum(new_tie) - 1
    tie_first = position[new_tie]
    tie_last = np.append(tie_first[1:], size) - 1
    average = (tie_first + tie_last) / 2.0 - group_start[tie_first] + 1.0
    ranks = np.empty(size)
    ranks[order] = average[tie_id]
    return ranks


def _grouped_auc(scores: Sequence[float], labels: Sequence[bool],
                groups: Sequence[Any] | None = None) -> tuple[float | None, int]:
    """Probability that a positive out-scores a negative of the same group (ties half): Mann–Whitney per group.

    Args:
        scores: One score per item.
        labels: True for a positive (a passing branch).
        groups: Group of each item (a task); None for one group (pooled).

    Returns:
        ``(auc, pairs)``: the AUC over every (positive, negative) pair within a
        group, and the number of such pairs; ``(None, 0)`` when there is none.
    """
    score = np.asarray(scores, dtype=float).reshape(-1)
    label = np.asarray(labels, dtype=bool).reshape(-1)
    if score.shape != label.shape:
        raise ConfigError(f"scores and labels differ in length: {score.size} != {label.size}")
    code = np.zeros(score.size, dtype=np.int64) if groups is None else _codes(groups)
    if code.size != score.size:
        raise ConfigError(f"groups and scores differ in length: {code.size} != {score.size}")
    ranks = _grouped_average_ranks(code, score)
    n_groups = int(code.max()) + 1 if code.size else 0
    positives = np.bincount(code, weights=label, minlength=n_groups)
    totals = np.bincount(code, minlength=n_groups).astype(float)
    negatives = totals - positives
    pairs = float(np.sum(positives * negatives))
    if pairs == 0:
        return None, 0
    # U = (sum of the positives' ranks) - P(P + 1)/2 counts, per group, the (positive, negative) pairs won.
    wins = np.bincount(code, weights=np.where(label, ranks, 0.0), minlength=n_groups) - positives * (positives + 1) / 2
    return float(np.sum(wins) / pairs), int(pairs)


def _spearman_rho(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None when either side is constant or n < 2."""
    a, b = np.asarray(x, dtype=float).reshape(-1), np.asarray(y, dtype=float).reshape(-1)
    if a.shape != b.shape:
        raise ConfigError(f"x and y differ in length: {a.size} != {b.size}")
    if a.size < 2:
        return None
    one = np.zeros(a.size, dtype=np.int64)
    ra, rb = _grouped_average_ranks(one, a), _grouped_average_ranks(one, b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = float(np.sqrt(np.sum(ra * ra) * np.sum(rb * rb)))
    return None if denominator == 0 else float(np.sum(ra * rb) / denominator)


# --------------------------------------------------------------------------- the tests


def _known(task_ids: Sequence[Any], outcomes: Sequence[bool | None],
           signals: Sequence[float | None] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, outcomes and signals of the branches that have an outcome (and a finite signal, when given)."""
    n = len(task_ids)
    if len(outcomes) != n or (signals is not None and len(signals) != n):
        raise ConfigError("task_ids, outcomes and signals must be equally long")
    known = np.array([o is not None for o in outcomes], dtype=bool)
    signal = np.zeros(n)
    if signals is not None:
        # To 9 decimals: rounding noise between equal signals (fitted strengths) must not order them.
        signal = np.round(np.array([np.nan if s is None else float(s) for s in signals], dtype=float), 9)
        known &= np.isfinite(signal)
    outcome = np.array([bool(o) for o, k in zip(outcomes, known) if k], dtype=bool)
    codes = _codes([t for t, k in zip(task_ids, known) if k]) if known.any() else np.zeros(0, dtype=np.int64)
    return codes, outcome, signal[known]


def _top_bottom_pairs(codes: np.ndarray, signal: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Indices of each (top, bottom) pair of the signal test, and the pairs left out because the signals tie."""
    if codes.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 0
    rounded = signal
    # By task, then signal (higher first), then input order (branch order): deterministic for equal signals.
    order = np.lexsort((np.arange(codes.size), -rounded, codes))
    sorted_codes = order_codes = codes[order]
    starts = np.flatnonzero(np.r_[True, order_codes[1:] != order_codes[:-1]])
    counts = np.diff(np.r_[starts, codes.size])
    group = np.cumsum(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]]) - 1
    rank = np.arange(codes.size) - starts[group]
    half = (counts // 2)[group]
    is_top = rank < half
    top = order[is_top]
    bottom = order[np.flatnonzero(is_top) + (counts - counts // 2)[group[is_top]]]
    ordered = rounded[top] != rounded[bottom]
    return top[ordered], bottom[ordered], int(np.sum(~ordered))


def signal_evidence(task_ids: Sequence[Any], signals: Sequence[float | None], outcomes: Sequence[bool | None], *,
                    alpha: float = 0.05, policy: PowerPolicy | None = None,
                    signal_name: str = "signal") -> dict[str, Any]:
    """Whether a signal predicts the objective outcome within tasks (the module docstring defines every number).

    Args:
        task_ids: Task of each branch.
        signals: The signal of each branch (None or NaN: the branch has none and sits out).
        outcomes: Objective pass of each branch (None: unverified, sits out).
        alpha: Significance level.
        policy: When the test is powered; ``PowerPolicy()`` when None.
        signal_name: What the signal is, for the verdict (``"judge score"``...).

    Returns:
        A JSON-ready dict: ``test``, ``signal``, ``n`` (pairs tested), ``n_tasks_tested``,
        ``ties_left_out``, ``top_pass_rate``, ``bottom_pass_rate``, ``discordant``
        (``top_only``, ``bottom_only``), ``mcnemar_p``, ``powered``, ``significant``,
        ``direction`` (``"top passes more"``, ``"bottom passes more"``, ``"none"``),
        ``evidence``, ``min_detectable_delta_pp``, ``auc_within_task``, ``auc_pairs``,
        ``auc_pooled``, ``spearman``, ``verdict`` and ``compared``.
    """
    codes, outcome, signal = _known(task_ids, outcomes, signals)
    return signal_evidence_coded(codes, outcome, signal, alpha=alpha, policy=policy, signal_name=signal_name)


def signal_evidence_coded(codes: np.ndarray, outcome: np.ndarray, signal: np.ndarray, *, alpha: float = 0.05,
                          policy: PowerPolicy | None = None, signal_name: str = "signal") -> dict[str, Any]:
    """:func:`signal_evidence` on arrays: only the branches with an outcome and a finite signal, no Python per branch.

    Args:
        codes: Each branch's task as a code: the rank of its task id among the sorted distinct ids (0, 1, ...).
        outcome: Each branch's objective pass (bool).
        signal: Each branch's signal, rounded to 9 decimals.
        alpha: Significance level.
        policy: When the test is powered.
        signal_name: What the signal is.
    """
    top, bottom, tied = _top_bottom_pairs(codes, signal)
    auc, auc_pairs = _grouped_auc(signal, outcome, codes)
    pooled, _ = _grouped_auc(signal, outcome)
    base: dict[str, Any] = {
        "test": "signal predicts the objective outcome",
        "signal": signal_name,
        "n_tasks_tested": int(np.unique(codes[top]).size),
        "ties_left_out": tied,
        "auc_within_task": auc,
        "auc_pairs": auc_pairs,
        "auc_pooled": pooled,
        "spearman": _spearman_rho(signal, outcome.astype(float)),
        "compared": f"objective pass of the top vs the bottom half of each task by {signal_name} alone "
                    f"(rank i vs rank m-h+i, h = m // 2, signal ties left out), paired by task",
    }
    if top.size == 0:
        return {**base, "n": 0, "top_pass_rate": None, "bottom_pass_rate": None,
                "discordant": {"top_only": 0, "bottom_only": 0}, "mcnemar_p": None, "powered": False,
                "significant": False, "direction": "none", "evidence": False, "min_detectable_delta_pp": None,
                "verdict": f"not powered: no task has two verified branches that {signal_name} orders"}
    report = compare_paired(outcome[top], outcome[bottom], alpha=alpha, policy=policy)
    direction = "none" if report.b == report.c else ("top passes more" if report.b > report.c
                                                     else "bottom passes more")
    evidence = report.evidence and report.k_a > report.k_b
    verdict = report.verdict.replace("arm A", "the top half").replace("arm B", "the bottom half")
    if report.evidence and not evidence:
        verdict = f"{verdict}: {signal_name} prefers failing branches (not evidence for the order)"
    mdd = report.min_detectable_delta_pp
    return {**base, "n": report.n, "top_pass_rate": report.rate_a, "bottom_pass_rate": report.rate_b,
            "discordant": {"top_only": report.b, "bottom_only": report.c}, "mcnemar_p": report.p_value,
            "powered": report.powered, "significant": report.significant, "direction": direction,
            "evidence": evidence,
            "min_detectable_delta_pp": None if mdd is None or not np.isfinite(mdd) else float(mdd),
            "verdict": verdict}


def outcome_summary(task_ids: Sequence[Any], outcomes: Sequence[bool | None], *, alpha: float = 0.05,
                    per_task: bool = True) -> dict[str, Any]:
    """What the objective outcomes themselves say: pass rates with Wilson intervals, usable pairs, pass@k.

    Args:
        task_ids: Task of each branch.
        outcomes: Objective pass of each branch (None: unverified, left out and counted).
        alpha: 1 − confidence of the Wilson intervals.
        per_task: Include one entry per task (``tasks``).

    Returns:
        A JSON-ready dict: ``verified``, ``unverified``, ``passed``, ``pass_rate``, ``pass_rate_ci``,
        ``n_tasks``, ``usable_tasks``, ``usable_pairs``, ``pass_at_k`` (``{"1": ..., "2": ...}``
        up to the fewest verified branches of any task) and, with ``per_task``, ``tasks``:
        ``[{task_id, verified, passed, pass_rate, ci}]`` sorted by task.
    """
    if len(task_ids) != len(outcomes):
        raise ConfigError("task_ids and outcomes must be equally long")
    names = sorted({str(t) for t in task_ids})
    index = {name: i for i, name in enumerate(names)}
    verified = np.zeros(len(names), dtype=np.int64)
    passed = np.zeros(len(names), dtype=np.int64)
    unverified = 0
    for task, outcome in zip(task_ids, outcomes):
        if outcome is None:
            unverified += 1
            continue
        verified[index[str(task)]] += 1
        passed[index[str(task)]] += bool(outcome)
    return outcome_summary_counted(names, verified, passed, unverified, alpha=alpha, per_task=per_task)


def outcome_summary_counted(names: Sequence[str], verified: np.ndarray, passed: np.ndarray, unverified: int, *,
                            alpha: float = 0.05, per_task: bool = True) -> dict[str, Any]:
    """:func:`outcome_summary` from per-task counts (``names`` sorted; ``verified``/``passed`` aligned to them)."""
    verified, passed = np.asarray(verified, dtype=np.int64), np.asarray(passed, dtype=np.int64)
    total, wins = int(verified.sum()), int(passed.sum())
    low, high = wilson_interval(wins, total, alpha)
    has = verified > 0
    smallest = int(verified[has].min()) if has.any() else 0
    at_k = {}
    if smallest:
        ks = np.arange(1, smallest + 1)
        means = np.mean(pass_at_k(verified[has][:, None], passed[has][:, None], ks[None, :]), axis=0)
        at_k = {str(k): float(mean) for k, mean in zip(ks, means)}
    out: dict[str, Any] = {
        "verified": total, "unverified": unverified, "passed": wins,
        "pass_rate": wins / total if total else None, "pass_rate_ci": [float(low), float(high)],
        "n_tasks": len(names),
        "usable_tasks": int(np.sum((passed > 0) & (passed < verified))),
        "usable_pairs": int(np.sum(passed * (verified - passed))),
        "pass_at_k": at_k,
    }
    if per_task:
        lows, highs = wilson_interval(passed, verified, alpha)
        lows, highs = np.atleast_1d(lows), np.atleast_1d(highs)
        out["tasks"] = [{"task_id": name, "verified": int(verified[i]), "passed": int(passed[i]),
                         "pass_rate": float(passed[i] / verified[i]) if verified[i] else None,
                         "ci": [float(lows[i]), float(highs[i])]} for i, name in enumerate(names)]
    return out


def describe_evidence(stats: dict[str, Any]) -> str:
    """One line for a manifest or a dataset card: the test, its n and result, or why no test applies.

    Args:
        stats: A ranking's statistics (``RolloutRanker.rank(...).stats`` or ``evidence_of``).
    """
    if not stats:
        return "not ranked"
    if stats.get("test") is None:
        return stats.get("reason") or ORDERED_BY_OUTCOME

    def number(key: str, spec: str) -> str:
        value = stats.get(key)
        return "n/a" if value is None else format(value, spec)

    return (f"does the {stats.get('signal')} predict the objective outcome? n={stats.get('n', 0)} pairs, McNemar "
            f"p={number('mcnemar_p', '.3g')}, AUC within task {number('auc_within_task', '.3f')}: "
            f"{'evidence' if stats.get('evidence') else 'not evidence'} ({stats.get('verdict')})")
