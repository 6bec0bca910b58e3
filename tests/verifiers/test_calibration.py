"""Judge calibration statistics, against scipy and brute force, and read from a real store."""

from __future__ import annotations

import random
import statistics
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from factory.store import Store
from factory.verifiers import (
    calibrate_run,
    judge_auc,
    judge_spearman,
    self_agreement,
    swap_inconsistency,
)


def brute_force_auc(scores: list[float], passed: list[bool]) -> float:
    """Count every (pass, fail) pair: a win is 1, a tie one half."""
    positives = [s for s, p in zip(scores, passed) if p]
    negatives = [s for s, p in zip(scores, passed) if not p]
    wins = sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in positives for y in negatives)
    return wins / (len(positives) * len(negatives))


# Scores on the judge's coarse scale, so ties are common; at least one branch of each class.
labelled = st.lists(st.tuples(st.integers(0, 20).map(lambda x: x / 2), st.booleans()), min_size=2, max_size=40) \
    .filter(lambda rows: len({p for _, p in rows}) == 2)


# --- AUC -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_mann_whitney_u_and_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    passed = list(rng.random(60) < 0.4)
    scores = [float(s) for s in rng.integers(0, 11, 60)]  # many ties

    auc = judge_auc(scores, passed)

    positives = [s for s, p in zip(scores, passed) if p]
    negatives = [s for s, p in zip(scores, passed) if not p]
    u = stats.mannwhitneyu(positives, negatives, alternative="two-sided").statistic
    assert auc == pytest.approx(u / (len(positives) * len(negatives)))
    assert auc == pytest.approx(brute_force_auc(scores, passed))


def test_auc_extremes_and_ties() -> None:
    assert judge_auc([9, 8, 2, 1], [True, True, False, False]) == 1.0
    assert judge_auc([1, 2, 8, 9], [True, True, False, False]) == 0.0
    assert judge_auc([5, 5, 5, 5], [True, False, True, False]) == 0.5


def test_auc_is_none_without_both_classes() -> None:
    assert judge_auc([1, 2], [True, True]) is None
    assert judge_auc([1, 2], [False, False]) is None
    assert judge_auc([], []) is None


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="length"):
        judge_auc([1, 2], [True])
    with pytest.raises(ValueError, match="length"):
        judge_spearman([1], [True, False])


@settings(max_examples=150, deadline=None)
@given(labelled)
def test_auc_properties(rows: list[tuple[float, bool]]) -> None:
    scores, passed = [s for s, _ in rows], [p for _, p in rows]
    auc = judge_auc(scores, passed)

    assert auc is not None and 0.0 <= auc <= 1.0
    assert judge_auc([-s for s in scores], passed) == pytest.approx(1 - auc)
    assert auc == pytest.approx(brute_force_auc(scores, passed))


@settings(max_examples=100, deadline=None)
@given(labelled, st.randoms(use_true_random=False))
def test_auc_is_invariant_under_shuffling(rows: list[tuple[float, bool]], rng: random.Random) -> None:
    shuffled = rows[:]
    rng.shuffle(shuffled)

    assert judge_auc(*zip(*shuffled)) == pytest.approx(judge_auc(*zip(*rows)))


# --- Spearman ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_spearman_is_the_pearson_correlation_of_ranks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    passed = rng.random(40) < 0.5
    scores = rng.integers(0, 11, 40).astype(float) + 3 * passed

    rho = judge_spearman(list(scores), list(passed))

    reference = np.corrcoef(stats.rankdata(scores), stats.rankdata(passed))[0, 1]
    assert rho == pytest.approx(reference)
    assert 0 < rho <= 1


def test_spearman_is_none_when_undefined() -> None:
    assert judge_spearman([5, 5, 5], [True, False, True]) is None
    assert judge_spearman([1, 2, 3], [True, True, True]) is None
    assert judge_spearman([1], [True]) is None
    assert judge_spearman([1, 9], [False, True]) == pytest.approx(1.0)


# --- self-agreement and swap inconsistency -------------------------------------------------------------------


def test_self_agreement_definitions() -> None:
    result = self_agreement([[8, 8, 8], [5, 7, 9], [6, 6.5, 7], [3], []])

    stds = [0.0, statistics.pstdev([5, 7, 9]), statistics.pstdev([6, 6.5, 7])]
    assert result["n_branches"] == 3  # branches with fewer than two samples are not counted
    assert result["mean_std"] == pytest.approx(statistics.mean(stds))
    assert result["mean_spread"] == pytest.approx((0 + 4 + 1) / 3)
    assert result["share_within_1"] == pytest.approx(2 / 3)


def test_self_agreement_without_countable_branches() -> None:
    assert self_agreement([[7], []]) == {"mean_std": None, "mean_spread": None, "share_within_1": None,
                                         "n_branches": 0}


def test_swap_inconsistency() -> None:
    assert swap_inconsistency([("a", "a"), ("a", "b"), ("tie", "tie"), ("b", "tie")]) == 0.5
    assert swap_inconsistency([("b", "b")]) == 0.0
    assert swap_inconsistency([]) is None


# --- calibrate_run on a real store ---------------------------------------------------------------------------

T0 = datetime(2025, 1, 1, 12, 0, 0)


def verdict(branch: int, verifier: str, status: str, score: float, *, task: str = "t1", run: str = "run-1",
            version: str = "1", at: int = 0, samples: list[float] | None = None) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if samples is not None:
        details["samples"] = [{"sample_index": i, "score": s, "status": "ok"} for i, s in enumerate(samples)]
        details["samples"].append({"sample_index": len(samples), "score": None, "status": "error"})
    return {"run_id": run, "task_id": task, "branch_index": branch, "verifier": verifier, "version": version,
            "ok": status == "pass", "score": score, "status": status, "details": details,
            "created_at": T0 + timedelta(seconds=at)}


def pairwise(a: int, b: int, swapped: bool, preference: str | None, status: str = "ok",
             run: str = "run-1") -> dict[str, Any]:
    return {"run_id": run, "task_id": "t1", "judge": "openai:judge-model", "kind": "pairwise", "branch_a": a,
            "branch_b": b, "sample_index": 0, "swapped": swapped, "score": None, "preference": preference,
            "status": status, "raw": "{}", "created_at": T0}


def test_calibrate_run_reads_latest_verdicts_and_pairwise_judgments(tmp_path: Path) -> None:
    verdicts = [
        # branch 0: objective pass, judge 0.9 (an older judge version said 0.1 and is superseded)
        verdict(0, "tests", "pass", 1.0), verdict(0, "judge", "fail", 0.1, version="0", at=-60, samples=[1, 1]),
        verdict(0, "judge", "pass", 0.9, version="1", samples=[9, 9, 8]),
        # branch 1: one objective verdict fails, so no objective pass; judge 0.7
        verdict(1, "tests", "pass", 1.0), verdict(1, "answer", "fail", 0.0),
        verdict(1, "judge", "pass", 0.7, samples=[7, 5, 9]),
        # branch 2: objective fail (the newer tests verifier version fails it; the older passed it), judge 0.2
        verdict(2, "tests", "pass", 1.0, at=-5), verdict(2, "tests", "fail", 0.0, version="2", at=5),
        verdict(2, "judge", "fail", 0.2, samples=[2, 2]),
        # branch 3: objective pass, judge 0.8
        verdict(3, "tests", "pass", 1.0), verdict(3, "judge", "pass", 0.8, samples=[8]),
        # branch 4: judge errored: no judge score, left out
        verdict(4, "tests", "pass", 1.0), verdict(4, "judge", "error", 0.0, samples=[]),
        # branch 5: no objective verdict: left out of AUC
        verdict(5, "judge", "pass", 1.0, samples=[10, 10]),
        # another task's branch 0 is a different branch
        verdict(0, "tests", "fail", 0.0, task="t2"), verdict(0, "judge", "fail", 0.5, task="t2", samples=[5, 5]),
        # another run is ignored
        verdict(0, "tests", "fail", 0.0, run="run-2"), verdict(0, "judge", "pass", 1.0, run="run-2"),
    ]
    judgments = [
        pairwise(0, 1, False, "a"), pairwise(0, 1, True, "a"),      # consistent
        pairwise(0, 2, False, "a"), pairwise(0, 2, True, "b"),      # flips with position
        pairwise(1, 2, False, "tie"), pairwise(1, 2, True, "tie"),  # consistent
        pairwise(2, 3, False, "a"), pairwise(2, 3, True, None, "error"),  # incomplete: not counted
        pairwise(0, 3, False, "b", run="run-2"), pairwise(0, 3, True, "a", run="run-2"),
    ]
    with Store.open(tmp_path / "calibration.duckdb") as store:
        store.write_verdicts(verdicts)
        store.write_judgments(judgments)

        result = calibrate_run(store, "run-1")

    # (t1,0) .9 pass, (t1,1) .7 fail, (t1,2) .2 fail, (t1,3) .8 pass, (t2,0) .5 fail
    scores, passed = [0.9, 0.7, 0.2, 0.8, 0.5], [True, False, False, True, False]
    assert result["run_id"] == "run-1"
    assert (result["n_branches"], result["n_objective_pass"]) == (5, 2)
    assert result["auc"] == pytest.approx(brute_force_auc(scores, passed)) == pytest.approx(1.0)
    assert result["spearman"] == pytest.approx(judge_spearman(scores, passed))
    # Latest judge verdicts' valid samples: [9,9,8] [7,5,9] [2,2] [8] [] [10,10] [5,5]
    assert result["self_agreement"] == self_agreement([[9, 9, 8], [7, 5, 9], [2, 2], [10, 10], [5, 5]])
    assert result["self_agreement"]["n_branches"] == 5
    assert (result["n_pairwise"], result["swap_inconsistency"]) == (3, pytest.approx(1 / 3))


def test_calibrate_an_empty_run(tmp_path: Path) -> None:
    with Store.open(tmp_path / "empty.duckdb") as store:
        result = calibrate_run(store, "nothing")

    assert result == {"run_id": "nothing", "n_branches": 0, "n_objective_pass": 0, "auc": None, "spearman": None,
                      "self_agreement": self_agreement([]), "swap_inconsistency": None, "n_pairwise": 0}
