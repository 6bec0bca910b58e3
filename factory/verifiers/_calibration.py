"""How far a run's LLM judge can be trusted, measured against the objective verifiers and against itself.

- **AUC**: the probability that a branch the objective verifiers pass gets a
  higher judge score than one they fail, ties counting half (the
  Mann–Whitney U statistic over n_pass × n_fail).
- **Spearman**: rank correlation of judge score with objective pass (0/1).
- **Self-agreement**: how much the judge's k samples of one branch disagree.
- **Swap inconsistency**: how often a pairwise preference flips when the two
  candidates trade places (position bias).

The statistics are pure functions of plain lists; :func:`calibrate_run` reads
a run's verdicts and judgments from the store and applies them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from factory.verifiers._pipeline import is_objective

if TYPE_CHECKING:
    from factory.store import Store

__all__ = ["calibrate_run", "judge_auc", "judge_spearman", "self_agreement", "swap_inconsistency"]

JUDGE_VERIFIER = "judge"


def _paired(scores: Sequence[float], passed: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    if len(scores) != len(passed):
        raise ValueError(f"scores and passed differ in length: {len(scores)} != {len(passed)}")
    return np.asarray(scores, dtype=float), np.asarray(passed, dtype=bool)


def judge_auc(scores: Sequence[float], passed: Sequence[bool]) -> float | None:
    """ROC AUC of judge scores against objective pass.

    AUC = U / (n_pass · n_fail), where U counts the (pass, fail) pairs in which
    the passing branch scored higher, ties counting half; computed from
    average ranks in O(n log n).

    Args:
        scores: Judge score per branch.
        passed: Objective pass per branch, in the same order.

    Returns:
        The AUC in [0, 1], or None when either class is empty.

    Raises:
        ValueError: The two sequences differ in length.
    """
    values, labels = _paired(scores, passed)
    n_pass, n_fail = int(labels.sum()), int((~labels).sum())
    if n_pass == 0 or n_fail == 0:
        return None
    from scipy import stats  # here, not at import: the largest import of the verifiers package

    ranks = stats.rankdata(values)  # ties get the average rank, which is what makes them count half
    u = float(ranks[labels].sum()) - n_pass * (n_pass + 1) / 2
    return u / (n_pass * n_fail)


def judge_spearman(scores: Sequence[float], passed: Sequence[bool]) -> float | None:
    """Spearman rank correlation of judge score with objective pass (as 0/1).

    Returns:
        The correlation in [-1, 1], or None when it is undefined (fewer than
        two branches, or either input constant).

    Raises:
        ValueError: The two sequences differ in length.
    """
    values, labels = _paired(scores, passed)
    if len(values) < 2 or np.all(values == values[0]) or np.all(labels == labels[0]):
        return None
    from scipy import stats

    rho = float(stats.spearmanr(values, labels.astype(float)).statistic)
    return None if math.isnan(rho) else rho


def self_agreement(samples: Sequence[Sequence[float]]) -> dict[str, Any]:
    """The judge's agreement with itself across the k samples of each branch.

    Definitions, over the branches with at least two samples (one sample
    cannot disagree with itself; the others are not counted):

    - ``mean_std``: mean over branches of the population standard deviation
      (ddof = 0) of the branch's sample scores.
    - ``mean_spread``: mean over branches of max − min of its sample scores.
    - ``share_within_1``: share of branches whose samples all lie within one
      point of each other (max − min ≤ 1).
    - ``n_branches``: the number of branches counted.

    Args:
        samples: Per branch, the scores (0-10) of its valid samples.

    Returns:
        The dict above; the three statistics are None when no branch counts.
    """
    counted = [np.asarray(branch, dtype=float) for branch in samples if len(branch) >= 2]
    if not counted:
        return {"mean_std": None, "mean_spread": None, "share_within_1": None, "n_branches": 0}
    spreads = np.array([branch.max() - branch.min() for branch in counted])
    return {
        "mean_std": float(np.mean([branch.std() for branch in counted])),
        "mean_spread": float(spreads.mean()),
        "share_within_1": float(np.mean(spreads <= 1.0)),
        "n_branches": len(counted),
    }


def swap_inconsistency(pairs: Sequence[tuple[str, str]]) -> float | None:
    """Share of pairwise comparisons whose two orders disagree.

    Args:
        pairs: Per comparison, (preference asked in order AB, preference asked
            in order BA mapped back to the branches), each ``a``, ``b`` or ``tie``.

    Returns:
        The share in [0, 1], or None when there are no comparisons.
    """
    if not pairs:
        return None
    return sum(1 for forward, backward in pairs if forward != backward) / len(pairs)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def calibrate_run(store: Store, run_id: str) -> dict[str, Any]:
    """Calibrate a run's judge against its objective verifiers.

    Reads the latest verdict per (task, branch, verifier) — the newest by
    ``created_at``, the highest version breaking a tie. A branch's objective
    pass is that every objective verdict of it is ``pass``; branches with no
    objective verdict, or whose judge verdict is not ``pass``/``fail`` (an
    error or budget cut carries no judgement), are left out of AUC and
    Spearman. Self-agreement uses the valid samples (``status`` ``ok``) in
    every latest judge verdict's ``details.samples``. Swap inconsistency uses
    the pairwise judgments whose two orders (``swapped`` false and true, same
    judge, branches and sample index) both have a preference.

    Args:
        store: An open store.
        run_id: The run.

    Returns:
        ``{"run_id", "n_branches", "n_objective_pass", "auc", "spearman",
        "self_agreement": {...}, "swap_inconsistency", "n_pairwise"}``, where
        ``n_branches`` counts the branches with both a judge score and an
        objective verdict.
    """
    latest = store.latest_verdicts(run_id)
    judge_scores: dict[tuple[str, int], float] = {}
    objective: dict[tuple[str, int], bool] = {}
    sample_scores: list[list[float]] = []
    for row in latest.iter_rows(named=True):
        key = (row["task_id"], row["branch_index"])
        if row["verifier"] == JUDGE_VERIFIER:
            details = _json(row["details"]) or {}
            sample_scores.append([float(s["score"]) for s in details.get("samples", [])
                                  if s.get("status") == "ok" and s.get("score") is not None])
            if row["status"] in ("pass", "fail") and row["score"] is not None:
                judge_scores[key] = float(row["score"])
        elif is_objective(row["verifier"]):
            objective[key] = objective.get(key, True) and row["status"] == "pass"
    paired = sorted(set(judge_scores) & set(objective))
    scores = [judge_scores[key] for key in paired]
    passed = [objective[key] for key in paired]

    pairwise = store.pairwise_judgments(run_id)
    orders: dict[tuple[Any, ...], dict[bool, str]] = {}
    for row in pairwise.iter_rows(named=True):
        if row["status"] != "ok" or row["preference"] is None:
            continue
        comparison = (row["task_id"], row["judge"], row["branch_a"], row["branch_b"], row["sample_index"])
        orders.setdefault(comparison, {})[bool(row["swapped"])] = row["preference"]
    pairs = [(both[False], both[True]) for both in orders.values() if len(both) == 2]

    return {
        "run_id": run_id,
        "n_branches": len(paired),
        "n_objective_pass": sum(passed),
        "auc": judge_auc(scores, passed),
        "spearman": judge_spearman(scores, passed),
        "self_agreement": self_agreement(sample_scores),
        "swap_inconsistency": swap_inconsistency(pairs),
        "n_pairwise": len(pairs),
    }
