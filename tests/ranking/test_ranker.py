"""RolloutRanker, arm pairing, and the rank / power commands on a real store."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import subprocess
import sys

import pytest

from factory.errors import ConfigError
from factory.models import create_model
from factory.ranking import (
    ORDERED_BY_OUTCOME,
    BranchRecord,
    PairwiseOutcome,
    RankedBranch,
    RolloutRanker,
    pair_arms,
    split_by_field,
)
from factory.rollouts import ForkConfig, RolloutForkRunner
from factory.store import Store
from factory.tasks import Task
from factory.verifiers import VerificationPipeline


def record(task, index, passed, score=None, judge=None, temperature=0.5):
    return BranchRecord(task, index, passed, float(passed) if score is None else score, judge, False,
                        {"temperature": temperature, "seed": index, "model": "m", "status": "ok"})


def test_order_is_reward_then_strength_then_branch_index():
    records = [record("t", 0, False), record("t", 1, True), record("t", 2, True), record("t", 3, False, judge=0.9)]
    ranked = RolloutRanker(bootstrap_rounds=20).rank(records).ranked
    assert [(r.branch_index, r.rank) for r in ranked] == [(1, 1), (2, 2), (3, 3), (0, 4)]
    assert ranked[2].components == {"objective": 0.0, "judge": pytest.approx(0.27)}
    # the same input in another order gives the same ranking
    again = RolloutRanker(bootstrap_rounds=20).rank(list(reversed(records))).ranked
    assert [(r.task_id, r.branch_index, r.rank) for r in again] == [(r.task_id, r.branch_index, r.rank) for r in ranked]


def test_judge_pairs_order_branches_of_equal_reward():
    records = [record("t", i, True) for i in range(3)]
    pairs = [PairwiseOutcome("t", 2, 0, 1.0), PairwiseOutcome("t", 2, 1, 1.0), PairwiseOutcome("t", 1, 0, 1.0)]
    ranked = RolloutRanker(bootstrap_rounds=50).rank(records, pairs).ranked
    assert [r.branch_index for r in ranked] == [2, 1, 0]
    assert ranked[0].strength > ranked[1].strength > ranked[2].strength
    assert all(r.ci_low <= r.strength <= r.ci_high for r in ranked)


def test_custom_reward_functions():
    ranker = RolloutRanker(rewards={"short": (1.0, lambda r: -r.branch_index)}, bootstrap_rounds=20)
    ranked = ranker.rank([record("t", i, True) for i in range(3)]).ranked
    assert [r.branch_index for r in ranked] == [0, 1, 2]


def test_an_order_by_the_objective_itself_is_not_tested_and_says_so():
    """Ranked by reward = objective, the top half passes by construction: no test, the reason, and the outcomes."""
    separated = [record(f"t{t}", i, i < 2) for t in range(12) for i in range(4)]
    stats = RolloutRanker(bootstrap_rounds=20).rank(separated).stats
    assert stats["test"] is None and stats["evidence"] is False and stats["powered"] is False
    assert stats["reason"] == ORDERED_BY_OUTCOME and stats["verdict"].startswith(ORDERED_BY_OUTCOME)
    assert "12 of 12 tasks have both passing and failing branches (48 usable pairs)" in stats["verdict"]
    seen = stats["outcomes"]
    assert (seen["verified"], seen["passed"], seen["usable_tasks"], seen["usable_pairs"]) == (48, 24, 12, 48)
    assert seen["pass_at_k"]["1"] == 0.5 and seen["pass_at_k"]["2"] == pytest.approx(5 / 6)
    assert len(seen["tasks"]) == 12 and seen["tasks"][0]["ci"][0] < 0.5 < seen["tasks"][0]["ci"][1]
    assert stats["n_tasks"] == 12 and "evidence" in stats["definitions"] and "reward (objective 1" in stats["order"]


def test_a_judge_that_predicts_the_outcome_is_tested_on_the_judge_alone():
    # passing branches 0, 1 score 0.8, failing 2, 3 score 0.3: the judge alone splits them
    judged = [record(f"t{t}", i, i < 2, judge=0.8 if i < 2 else 0.3) for t in range(12) for i in range(4)]
    stats = RolloutRanker(bootstrap_rounds=20).rank(judged).stats
    assert stats["test"] == "signal predicts the objective outcome" and stats["reason"] is None
    assert stats["signal"] == "rewards without the objective: judge"
    assert stats["n"] == 24 and stats["n_tasks"] == 12 and stats["n_tasks_tested"] == 12
    assert stats["top_pass_rate"] == 1.0 and stats["bottom_pass_rate"] == 0.0
    assert stats["mcnemar_p"] == pytest.approx(2 * 0.5 ** 24) and stats["powered"] and stats["evidence"]
    assert stats["auc_within_task"] == 1.0 and stats["spearman"] == pytest.approx(1.0)
    few = RolloutRanker(bootstrap_rounds=20).rank(judged[:8]).stats
    assert few["n"] == 4 and not few["powered"] and not few["evidence"]
    assert few["verdict"].startswith("not powered")
    # the same passes, and a judge that scores every branch alike: every pair ties, nothing is tested
    flat = RolloutRanker(bootstrap_rounds=20).rank([record(f"t{t}", i, i < 2, judge=0.5) for t in range(12)
                                                   for i in range(4)]).stats
    assert flat["n"] == 0 and flat["ties_left_out"] == 24 and not flat["evidence"]


def test_the_signal_excludes_what_reads_the_objective():
    """A user's reward that reads the objective, declared so, is not a signal; one that does not, is."""
    records_ = [record(f"t{t}", i, i < 2) for t in range(12) for i in range(4)]
    rewards = {"objective": (1.0, lambda r: r.objective_score), "tests": (1.0, lambda r: float(r.objective_pass))}
    declared = RolloutRanker(rewards=rewards, objective_rewards=("objective", "tests"), bootstrap_rounds=20)
    assert declared.rank(records_).stats["test"] is None
    short = RolloutRanker(rewards={**rewards, "short": (0.1, lambda r: -r.branch_index)},
                          objective_rewards=("objective", "tests"), bootstrap_rounds=20)
    stats = short.rank(records_).stats
    assert stats["signal"] == "rewards without the objective: short" and stats["evidence"]


def test_pairwise_strengths_are_the_signal_where_the_judge_compared():
    recs = [record(f"t{t}", i, i == 0) for t in range(12) for i in range(2)]
    pairs = [PairwiseOutcome(f"t{t}", 0, 1, 1.0) for t in range(12)]
    result = RolloutRanker(bootstrap_rounds=20).rank(recs, pairs)
    assert result.stats["signal"] == "judge pairwise strengths" and result.stats["evidence"]
    assert all(r.signal_source == "judge pairwise strengths" for r in result.ranked)
    assert result.stats == {**RolloutRanker().evidence_of(recs, pairs)}


def test_stats_of_ranked_branches_reads_their_signals_never_their_order():
    judged = RolloutRanker(bootstrap_rounds=20).rank(
        [record(f"t{t}", i, i < 2, judge=0.8 if i < 2 else 0.3) for t in range(12) for i in range(4)])
    # the same branches with their ranks reversed: the statistics do not change, the order was never tested
    flipped = [RankedBranch(**{**vars(r), "rank": 5 - r.rank}) for r in judged.ranked]
    assert RolloutRanker().stats_of(flipped) == judged.stats
    # branches built without a signal (as before signals existed): the order is the objective's, no test
    bare = [RankedBranch(r.task_id, r.branch_index, r.rank, r.reward, {}, r.strength, r.ci_low, r.ci_high,
                         r.objective_pass, r.hack_detected) for r in judged.ranked]
    assert RolloutRanker().stats_of(bare)["reason"] == ORDERED_BY_OUTCOME


def test_intervals_are_never_zero_width_and_a_lone_branch_has_none():
    """The issue's +1.67 [+1.67, +1.67]: two branches, one comparison. Now the interval shows what is unknown."""
    ranked = RolloutRanker(bootstrap_rounds=50).rank([record("t", 0, True), record("t", 1, False),
                                                      record("solo", 0, True)]).ranked
    pair = [r for r in ranked if r.task_id == "t"]
    assert pair[0].strength == pytest.approx(1.67, abs=0.01)
    assert all(r.ci_high - r.ci_low > 1.0 and r.ci_low <= r.strength <= r.ci_high for r in pair)
    solo = next(r for r in ranked if r.task_id == "solo")
    assert (solo.strength, solo.ci_low, solo.ci_high) == (0.0, None, None)


def test_arms_pair_ith_branch_of_each_arm_within_a_task():
    records = [record("t1", 0, True, temperature=0.5), record("t1", 1, False, temperature=0.9),
               record("t1", 2, True, temperature=0.5), record("t1", 3, True, temperature=0.9),
               record("t2", 0, False, temperature=0.5), record("t3", 0, True, temperature=0.9)]
    arm_a, arm_b = split_by_field(records, "temperature", "0.5", "0.9")
    paired = pair_arms(arm_a, arm_b, "0.5", "0.9")
    assert paired.items == [("t1", 0, 1), ("t1", 2, 3)]
    assert (paired.a, paired.b) == ([True, True], [False, True])
    with pytest.raises(ConfigError, match="no branch has temperature = 0.7"):
        split_by_field(records, "temperature", "0.5", "0.7")
    with pytest.raises(ConfigError, match="unknown field 'colour'"):
        split_by_field(records, "colour", "a", "b")


@pytest.fixture(scope="module")
def verified_run(tmp_path_factory):
    """A real run: 12 answer tasks x 4 branches; branches at temperature 0.2 answer right, 0.9 wrong."""
    path = tmp_path_factory.mktemp("rank")
    tasks = [Task(id=f"q{i:02d}", prompt=f"What is {i} + {i}?", answer=str(2 * i)) for i in range(12)]
    replay = path / "replay.jsonl"
    lines = []
    for i in range(12):
        lines.append({"prompt_contains": f"What is {i} + {i}?", "response": {"text": f"Final: {2 * i}"}})
        lines.append({"prompt_contains": f"What is {i} + {i}?", "response": {"text": "Final: -1"}})
    replay.write_text("".join(json.dumps(line) + "\n" for line in lines))
    db = path / "r.duckdb"
    with Store.open(db) as store:
        # seeds 0, 2 pick the right answer, 1, 3 the wrong one; temperatures alternate with them
        runner = RolloutForkRunner(create_model(f"replay:{replay}"), store,
                                   ForkConfig(branches=4, temperatures=(0.2, 0.9), sandbox="bwrap"),
                                   run_id="rk", pipeline=VerificationPipeline())

        async def go():
            return [r async for r in runner.run(tasks)]

        asyncio.run(go())
    return db


needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                      reason="plots need matplotlib (the 'plot' extra)")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "factory.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_rank_command_stores_rankings(verified_run):
    result = cli("rank", "rk", "--db", verified_run, "--json", "--bootstrap", 50)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    stats = data["stats"]
    # ordered by the answers' own verdicts (no judge): no test, the reason, n and the definitions beside it
    assert stats["test"] is None and stats["evidence"] is False and stats["reason"] == ORDERED_BY_OUTCOME
    assert stats["n"] == 0 and stats["outcomes"]["verified"] == 48 and stats["outcomes"]["usable_pairs"] == 48
    assert set(stats["definitions"]) >= {"evidence", "signal_test", "usable_pairs", "pass_at_k"}
    # no interval of zero width anywhere
    assert all(r["ci_high"] - r["ci_low"] > 0 for r in data["ranked"])
    with Store.open(verified_run, read_only=True) as store:
        rankings = store.rankings("rk")
        assert rankings.height == 48
        top = rankings.filter(rankings["rank"] == 1)
        assert set(top["branch_index"].to_list()) == {0}
        assert (rankings["ci_high"] - rankings["ci_low"]).min() > 0
    text = cli("rank", "rk", "--db", verified_run, "--bootstrap", 20)
    assert f"no evidence test: {ORDERED_BY_OUTCOME}" in text.stdout
    assert "outcomes: 24/48 verified branches pass (50.0%" in text.stdout
    assert re.search(r"([+-]\d+\.\d\d) \[\1, \1\]", text.stdout) is None  # e.g. +1.67 [+1.67, +1.67]


def test_power_command_by_field_and_check(verified_run):
    result = cli("power", "--run", "rk", "--by", "temperature", "--a", "0.2", "--b", "0.9", "--db", verified_run,
                 "--check", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["n"], report["k_a"], report["k_b"]) == (24, 24, 0)
    assert report["powered"] and report["significant"]
    assert report["verdict"].startswith("powered and significant")
    same = cli("power", "--runs", "rk", "rk", "--db", verified_run, "--check")
    assert same.returncode == 1 and "not significant" in same.stdout


def test_power_selects_best_and_worst_on_half_the_tasks(verified_run):
    result = cli("power", "--run", "rk", "--by", "temperature", "--select", "best-worst", "--db", verified_run,
                 "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    selection = report["selection"]
    assert (report["arm_a"], report["arm_b"]) == ("temperature=0.2 (best)", "temperature=0.9 (worst)")
    assert len(selection["selection_tasks"]) == len(selection["test_tasks"]) == 6
    assert report["n"] == 12 and (report["k_a"], report["k_b"]) == (12, 0)  # the test half only
    assert "tested on the other 6 (cross-fitting" in report["verdict"]
    text = cli("power", "--run", "rk", "--by", "temperature", "--select", "best-worst", "--db", verified_run)
    assert text.returncode == 0 and "cross-fitting" in text.stdout


@needs_matplotlib
def test_rank_and_power_commands_draw_plots(verified_run, tmp_path):
    strengths, rates = tmp_path / "strengths.png", tmp_path / "pass.png"
    ranked = cli("rank", "rk", "--db", verified_run, "--plot", strengths, "--bootstrap", 20)
    assert ranked.returncode == 0, ranked.stderr
    assert strengths.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and strengths.stat().st_size > 10_000
    power = cli("power", "--run", "rk", "--by", "temperature", "--a", "0.2", "--b", "0.9", "--db", verified_run,
                "--plot", rates)
    assert power.returncode == 0, power.stderr
    assert rates.read_bytes()[:4] == b"\x89PNG"


def test_power_needs_arms(verified_run):
    result = cli("power", "--db", verified_run)
    assert result.returncode == 2 and "give --runs R1 R2" in result.stderr and "--select" in result.stderr


def test_rank_with_judge_pairs_uses_swapped_comparisons(tmp_path):
    """--judge-pairs: the judge compares branches in both orders; consistent preferences order equal rewards."""
    pytest.importorskip("openai", reason="the judge reaches the wire server through the openai SDK ('openai' extra)")
    import os

    from tests.rollouts.wire_server import Reply, WireServer

    task = Task(id="poem", prompt="Write a line about the sea.", rubric="vivid and concise")
    replay = tmp_path / "replay.jsonl"
    replay.write_text("".join(json.dumps({"response": {"text": text}}) + "\n"
                              for text in ("The sea breathes silver.", "Sea is water.")))
    db = tmp_path / "j.duckdb"
    with Store.open(db) as store:
        runner = RolloutForkRunner(create_model(f"replay:{replay}"), store, ForkConfig(branches=2, sandbox="bwrap"),
                                   run_id="jp")

        async def go():
            return [r async for r in runner.run([task])]

        asyncio.run(go())
    with WireServer() as server:
        # order AB: prefers A (branch 0); order BA (swapped): prefers B, i.e. branch 0 again -> consistent
        server.push(Reply.ok('{"preference": "A", "reason": "vivid"}'), Reply.ok('{"preference": "B", "reason": "x"}'))
        env = {**os.environ, "OPENAI_BASE_URL": f"{server.url}/v1", "OPENAI_API_KEY": "t"}
        result = subprocess.run([sys.executable, "-m", "factory.cli", "rank", "jp", "--db", str(db), "--judge-pairs",
                                 "1", "--judge", "openai:judge", "--json", "--bootstrap", "20"],
                                capture_output=True, text=True, timeout=300, env=env)
        bodies = server.bodies
    assert result.returncode == 0, result.stderr
    assert len(bodies) == 2
    ranked = json.loads(result.stdout)["ranked"]
    assert [r["branch_index"] for r in ranked] == [0, 1] and ranked[0]["strength"] > ranked[1]["strength"]
    with Store.open(db, read_only=True) as store:
        judgments = store.judgments("jp")
        assert judgments["kind"].to_list() == ["pairwise", "pairwise"]
        assert sorted(judgments["swapped"].to_list()) == [False, True]
        assert set(judgments["preference"].to_list()) == {"a"}
