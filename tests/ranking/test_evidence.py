"""Evidence that can be wrong: simulated null worlds claim it at most at α + 3 pp, informative worlds find it.

Every world is 30 tasks x 4 branches (8 for arms), 200 simulated runs, and
goes through the real ``RolloutRanker`` (``evidence_of``, which ``rank``
and exports share) or ``select_arms`` + ``compare_paired`` (``factory
power --select``). The same worlds run, with more of them, in
``bench/bench_rank.py --only evidence``.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special, stats
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.proportion import proportion_confint

from factory.errors import ConfigError
from factory.ranking import (
    ORDERED_BY_OUTCOME,
    SELECTION_RULES,
    BranchRecord,
    PairwiseOutcome,
    RolloutRanker,
    compare_paired,
    outcome_summary,
    pair_arms,
    pass_at_k,
    select_arms,
    signal_evidence,
    split_by_field,
)

ALPHA = 0.05
SLACK = 0.03  # the bound: false evidence at most α + 3 pp
RUNS = 200
TASKS, BRANCHES = 30, 4
TEMPERATURES = (0.2, 0.5, 0.8, 1.1)
RANKER = RolloutRanker(alpha=ALPHA)


def records(outcomes: np.ndarray, judge: np.ndarray | None = None,
            temperatures: tuple[float, ...] | None = None) -> list[BranchRecord]:
    """One record per (task, branch) of an outcome matrix, with a judge score (0..1) where given."""
    tasks, branches = outcomes.shape
    return [BranchRecord(f"t{t:02d}", b, bool(outcomes[t, b]), float(outcomes[t, b]),
                         None if judge is None else float(judge[t, b]), False,
                         {"temperature": None if temperatures is None else temperatures[b % len(temperatures)],
                          "seed": b, "model": "m", "status": "ok"})
            for t in range(tasks) for b in range(branches)]


def pairwise(rng: np.random.Generator, outcomes: np.ndarray, accuracy: float,
             tie_rate: float = 0.2) -> list[PairwiseOutcome]:
    """Every pair of branches of every task judged once: a tie at ``tie_rate``; otherwise, where the outcomes
    differ, the passing branch is preferred with probability ``accuracy``, and a coin decides where they agree."""
    tasks, branches = outcomes.shape
    a, b = np.triu_indices(branches, 1)
    tie = rng.random((tasks, a.size)) < tie_rate
    differ = outcomes[:, a] != outcomes[:, b]
    right = rng.random((tasks, a.size)) < accuracy
    a_wins = np.where(differ, right == outcomes[:, a], rng.random((tasks, a.size)) < 0.5)
    result = np.where(tie, 0.5, a_wins.astype(float))
    return [PairwiseOutcome(f"t{t:02d}", int(a[k]), int(b[k]), float(result[t, k]))
            for t in range(tasks) for k in range(a.size)]


# --------------------------------------------------------------------------- the worlds


def coin_flips_no_judge(rng):
    """The issue's world: passes are fair coins and nothing but the objective orders the branches."""
    return RANKER.evidence_of(records(rng.random((TASKS, BRANCHES)) < 0.5))


def coin_flips_random_judge(rng):
    """A judge whose scores (0, 0.1, ..., 1) are independent of the coin-flip passes."""
    outcomes = rng.random((TASKS, BRANCHES)) < 0.5
    return RANKER.evidence_of(records(outcomes, rng.integers(0, 11, (TASKS, BRANCHES)) / 10))


def judge_sees_difficulty_only(rng):
    """Tasks differ in difficulty; the judge scores easy tasks higher but cannot tell branches of a task apart."""
    rate = rng.uniform(0.05, 0.95, (TASKS, 1))
    outcomes = rng.random((TASKS, BRANCHES)) < rate
    judge = np.clip(np.round(rate + rng.normal(0.0, 0.15, (TASKS, BRANCHES)), 1), 0.0, 1.0)
    return RANKER.evidence_of(records(outcomes, judge))


def coin_flips_random_pairwise_judge(rng):
    outcomes = rng.random((TASKS, BRANCHES)) < 0.5
    return RANKER.evidence_of(records(outcomes), pairwise(rng, outcomes, accuracy=0.5))


def informative_judge(rng):
    """A judge with within-task AUC ~0.75: score = σ(±0.5 + N(0, 1)), + for a pass, rounded to tenths."""
    outcomes = rng.random((TASKS, BRANCHES)) < 0.5
    judge = np.round(special.expit(0.5 * (2 * outcomes - 1) + rng.normal(0.0, 1.0, (TASKS, BRANCHES))), 1)
    return RANKER.evidence_of(records(outcomes, judge))


def informative_pairwise_judge(rng):
    """A pairwise judge that prefers the passing branch 3 times in 4 where outcomes differ (20 % ties)."""
    outcomes = rng.random((TASKS, BRANCHES)) < 0.5
    return RANKER.evidence_of(records(outcomes), pairwise(rng, outcomes, accuracy=0.75))


def rates(world, runs: int = RUNS, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    results = [world(rng) for _ in range(runs)]
    tested = [r for r in results if r["test"] is not None]
    return {
        "evidence": float(np.mean([r["evidence"] for r in results])),
        "tested": len(tested) / runs,
        "auc_within_task": float(np.mean([r["auc_within_task"] for r in tested])) if tested else float("nan"),
        "auc_pooled": float(np.mean([r["auc_pooled"] for r in tested])) if tested else float("nan"),
    }


@pytest.mark.parametrize("world", [coin_flips_random_judge, judge_sees_difficulty_only,
                                   coin_flips_random_pairwise_judge], ids=lambda w: w.__name__)
def test_null_worlds_claim_evidence_at_most_alpha_plus_3pp(world):
    seen = rates(world)
    assert seen["tested"] == 1.0
    assert seen["evidence"] <= ALPHA + SLACK
    assert abs(seen["auc_within_task"] - 0.5) < 0.02  # what a user ranking within tasks gets: nothing


def test_an_order_by_coin_flip_outcomes_is_never_called_evidence():
    """The issue's 100 %: passes are coins, the reward is the objective. There is nothing to test, and it says so."""
    seen = rates(coin_flips_no_judge)
    assert seen["evidence"] == 0.0 and seen["tested"] == 0.0
    stats = coin_flips_no_judge(np.random.default_rng(1))
    assert stats["reason"] == ORDERED_BY_OUTCOME and stats["test"] is None and stats["verdict"].startswith(
        ORDERED_BY_OUTCOME)


def test_a_judge_that_only_tells_easy_tasks_from_hard_scores_pooled_not_within_task():
    seen = rates(judge_sees_difficulty_only, runs=50)
    assert seen["auc_pooled"] > 0.7 and abs(seen["auc_within_task"] - 0.5) < 0.03


@pytest.mark.parametrize("world", [informative_judge, informative_pairwise_judge], ids=lambda w: w.__name__)
def test_informative_worlds_find_evidence_at_least_80_percent_of_runs(world):
    seen = rates(world)
    assert seen["evidence"] >= 0.80
    assert 0.7 <= seen["auc_within_task"] <= 0.8  # informative, not obvious


def test_the_ranker_reports_the_same_statistics_as_evidence_of():
    rng = np.random.default_rng(5)
    for make in (informative_judge, informative_pairwise_judge):
        outcomes = rng.random((TASKS, BRANCHES)) < 0.5
        if make is informative_judge:
            recs, pairs = records(outcomes, rng.integers(0, 11, (TASKS, BRANCHES)) / 10), []
        else:
            recs, pairs = records(outcomes), pairwise(rng, outcomes, accuracy=0.75)
        ranked = RolloutRanker(alpha=ALPHA, bootstrap_rounds=20).rank(recs, pairs).stats
        again = RANKER.evidence_of(recs, pairs)
        assert {k: v for k, v in ranked.items() if k != "spearman"} == {
            k: v for k, v in again.items() if k != "spearman"}
        assert ranked["spearman"] == pytest.approx(again["spearman"], abs=1e-9)


# --------------------------------------------------------------------------- arms chosen from the data


def best_worst_rates(pass_rates: np.ndarray, runs: int = RUNS, seed: int = 0) -> tuple[float, float]:
    """Evidence rates of best-vs-worst temperature: cross-fitted (select_arms) and naive (chosen and tested on all)."""
    rng = np.random.default_rng(seed)
    crossfit = naive = 0
    for run in range(runs):
        recs = records(rng.random((TASKS, 8)) < np.tile(pass_rates, 2), temperatures=TEMPERATURES)
        chosen = select_arms(recs, "temperature", "best-worst", seed=run)
        crossfit += compare_paired(chosen.paired.a, chosen.paired.b, alpha=ALPHA).evidence
        observed = {t: np.mean([r.objective_pass for r in recs if r.fields["temperature"] == t]) for t in TEMPERATURES}
        best, worst = max(observed, key=observed.get), min(observed, key=observed.get)
        paired = pair_arms(*split_by_field(recs, "temperature", str(best), str(worst)), "best", "worst")
        naive += compare_paired(paired.a, paired.b, alpha=ALPHA).evidence
    return crossfit / runs, naive / runs


def test_best_vs_worst_arms_are_tested_on_tasks_the_choice_did_not_see():
    crossfit, naive = best_worst_rates(np.full(4, 0.5))
    assert crossfit <= ALPHA + SLACK
    assert naive > ALPHA  # choosing and testing on the same tasks finds differences among equal arms


def test_cross_fitting_finds_a_real_difference():
    crossfit, _ = best_worst_rates(np.array([0.8, 0.4, 0.4, 0.4]), runs=100)
    assert crossfit >= 0.7


def test_select_arms_splits_tasks_and_says_so():
    recs = records(np.tile([True, False, False, False], (10, 2)), temperatures=TEMPERATURES)
    chosen = select_arms(recs, "temperature", seed=3)
    assert SELECTION_RULES == ("best-worst",) and chosen.rule == "best-worst"
    assert len(chosen.selection_tasks) == 5 and len(chosen.test_tasks) == 5
    assert not set(chosen.selection_tasks) & set(chosen.test_tasks)
    assert (chosen.value_a, chosen.value_b) == (0.2, 0.5)  # 0.5, 0.8, 1.1 tie at 0: the first in order
    assert chosen.selection_rates["0.2"] == (10, 10)
    assert {task for task, _, _ in chosen.paired.items} == set(chosen.test_tasks)
    assert chosen.paired.a == [True] * 10 and chosen.paired.b == [False] * 10
    assert "on 5 tasks, tested on the other 5 (cross-fitting" in chosen.note()
    assert chosen.to_dict()["arm_a"] == "temperature=0.2 (best)"
    assert select_arms(recs, "temperature", seed=3).test_tasks == chosen.test_tasks  # seeded
    with pytest.raises(ConfigError, match="unknown selection rule"):
        select_arms(recs, "temperature", "best-rest")
    with pytest.raises(ConfigError, match="two values"):
        select_arms(records(np.ones((4, 2), bool), temperatures=(0.5,)), "temperature")


# --------------------------------------------------------------------------- the definitions, against references


def test_signal_test_pairs_top_and_bottom_by_the_signal_alone():
    # task a: signals 4 3 2 1 -> pairs (4, 2), (3, 1); task b: 1 1 0 0 -> (1, 0), (1, 0); task c: ties only
    tasks = list("aaaa") + list("bbbb") + list("cc")
    signals = [4, 3, 2, 1, 1, 1, 0, 0, 5, 5]
    outcomes = [True, True, False, False, True, False, False, True, True, False]
    result = signal_evidence(tasks, signals, outcomes, signal_name="judge score")
    assert result["n"] == 4 and result["n_tasks_tested"] == 2 and result["ties_left_out"] == 1
    assert result["discordant"] == {"top_only": 3, "bottom_only": 1}
    assert result["top_pass_rate"] == 0.75 and result["bottom_pass_rate"] == 0.25
    assert result["mcnemar_p"] == pytest.approx(sm_mcnemar([[0, 3], [1, 0]], exact=True).pvalue)
    assert not result["powered"] and not result["evidence"] and "judge score" in result["compared"]
    # branches without a signal or a verdict sit out
    partial = signal_evidence(tasks + ["a"], signals + [None], outcomes + [True])
    assert partial["n"] == result["n"]


def test_auc_and_spearman_match_scipy():
    rng = np.random.default_rng(11)
    tasks = np.repeat(np.arange(12), 5).astype(str)
    outcomes = rng.random(60) < 0.5
    signals = rng.integers(0, 6, 60).astype(float) + outcomes
    result = signal_evidence(tasks.tolist(), signals.tolist(), outcomes.tolist())
    u = stats.mannwhitneyu(signals[outcomes], signals[~outcomes]).statistic
    assert result["auc_pooled"] == pytest.approx(u / (outcomes.sum() * (~outcomes).sum()))
    assert result["spearman"] == pytest.approx(stats.spearmanr(signals, outcomes).statistic)
    won = pairs = 0.0
    for task in np.unique(tasks):
        here = tasks == task
        for s_pass in signals[here & outcomes]:
            for s_fail in signals[here & ~outcomes]:
                won += (s_pass > s_fail) + 0.5 * (s_pass == s_fail)
                pairs += 1
    assert result["auc_within_task"] == pytest.approx(won / pairs) and result["auc_pairs"] == pairs


def test_a_judge_that_prefers_failing_branches_is_not_evidence():
    outcomes = np.tile([True, True, False, False], (15, 1))
    judge = np.where(outcomes, 0.1, 0.9)
    stats_ = RANKER.evidence_of(records(outcomes, judge))
    assert stats_["significant"] and stats_["powered"] and not stats_["evidence"]
    assert stats_["direction"] == "bottom passes more" and "prefers failing branches" in stats_["verdict"]
    good = RANKER.evidence_of(records(outcomes, 1 - judge))
    assert good["evidence"] and good["direction"] == "top passes more" and good["auc_within_task"] == 1.0


def test_outcome_summary_matches_statsmodels_and_counts_usable_pairs():
    tasks = list("aaaa") + list("bbbb") + list("ccc")
    outcomes = [True, False, True, False, True, True, True, True, False, None, False]
    summary = outcome_summary(tasks, outcomes)
    assert (summary["verified"], summary["unverified"], summary["passed"]) == (10, 1, 6)
    assert summary["pass_rate_ci"] == pytest.approx(list(proportion_confint(6, 10, method="wilson")))
    assert summary["usable_tasks"] == 1 and summary["usable_pairs"] == 4  # only task a has both: 2 x 2
    assert summary["pass_at_k"] == {"1": pytest.approx((0.5 + 1 + 0) / 3),
                                    "2": pytest.approx((float(pass_at_k(4, 2, 2)) + 1 + 0) / 3)}
    per_task = {t["task_id"]: t for t in summary["tasks"]}
    assert per_task["c"]["verified"] == 2 and per_task["c"]["ci"][0] == 0.0
    assert per_task["a"]["ci"] == pytest.approx(list(proportion_confint(2, 4, method="wilson")))
