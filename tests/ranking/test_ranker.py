"""RolloutRanker, arm pairing, and the rank / power commands on a real store."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys

import pytest

from factory.errors import ConfigError
from factory.models import create_model
from factory.ranking import BranchRecord, PairwiseOutcome, RolloutRanker, pair_arms, split_by_field
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


def test_stats_pair_top_and_bottom_halves_by_task():
    separated = [record(f"t{t}", i, i < 2) for t in range(12) for i in range(4)]
    stats = RolloutRanker(bootstrap_rounds=20).rank(separated).stats
    assert stats["n"] == 24 and stats["n_tasks"] == 12
    assert stats["top_pass_rate"] == 1.0 and stats["bottom_pass_rate"] == 0.0
    assert stats["mcnemar_p"] == pytest.approx(2 * 0.5 ** 24) and stats["powered"] and stats["evidence"]
    few = RolloutRanker(bootstrap_rounds=20).rank(separated[:8]).stats
    assert few["n"] == 4 and not few["powered"] and not few["evidence"]
    assert few["verdict"].startswith("not powered")


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
    assert data["stats"]["n"] == 24 and data["stats"]["evidence"] is True
    with Store.open(verified_run, read_only=True) as store:
        rankings = store.rankings("rk")
        assert rankings.height == 48
        top = rankings.filter(rankings["rank"] == 1)
        assert set(top["branch_index"].to_list()) == {0}
    text = cli("rank", "rk", "--db", verified_run, "--bootstrap", 20)
    assert "evidence: powered and significant" in text.stdout


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
    assert result.returncode == 2 and "give --runs R1 R2" in result.stderr


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
