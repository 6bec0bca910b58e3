"""Reward functions: the defaults, and functions of our own composed with them."""

from __future__ import annotations

import pytest

from factory.ranking import DEFAULT_REWARDS, BranchRecord, RewardFunction, RolloutRanker


def record(index: int, passed: bool, judge: float | None = None, tokens: int = 100) -> BranchRecord:
    return BranchRecord("t", index, passed, float(passed), judge, False, {"output_tokens": tokens})


def test_the_default_reward_is_objective_plus_three_tenths_of_the_judge():
    assert {name: weight for name, (weight, _) in DEFAULT_REWARDS.items()} == {"objective": 1.0, "judge": 0.3}
    ranker = RolloutRanker()
    assert ranker.components(record(0, True, judge=0.5)) == {"objective": 1.0, "judge": pytest.approx(0.15)}
    assert ranker.components(record(1, False)) == {"objective": 0.0, "judge": 0.0}  # not judged: no judge reward


def test_a_function_of_our_own_adds_to_the_defaults_with_its_weight():
    brevity: RewardFunction = lambda r: -r.fields["output_tokens"] / 1000  # noqa: E731
    ranker = RolloutRanker(rewards={**DEFAULT_REWARDS, "brevity": (0.5, brevity)}, bootstrap_rounds=20)
    long_pass, short_pass = record(0, True, tokens=800), record(1, True, tokens=100)
    short_fail = record(2, False, tokens=10)
    assert ranker.components(long_pass) == {"objective": 1.0, "judge": 0.0, "brevity": pytest.approx(-0.4)}
    ranked = ranker.rank([long_pass, short_pass, short_fail]).ranked
    assert [r.branch_index for r in ranked] == [1, 0, 2]  # brevity orders the passes; it cannot lift a failure
    assert ranked[0].reward == pytest.approx(1.0 - 0.05)


def test_replacing_the_defaults_drops_them():
    ranker = RolloutRanker(rewards={"judge_only": (1.0, lambda r: r.judge_score or 0.0)}, bootstrap_rounds=20)
    ranked = ranker.rank([record(0, True, judge=0.2), record(1, False, judge=0.9)]).ranked
    assert [r.branch_index for r in ranked] == [1, 0]
    assert set(ranked[0].components) == {"judge_only"}
