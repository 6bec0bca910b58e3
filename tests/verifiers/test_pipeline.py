"""Verification inside the fork, stored verdicts, and re-verification from the stored workspace."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import ClassVar

import pytest

from factory.models import create_model
from factory.rollouts import ForkConfig, RolloutForkRunner
from factory.sandbox import SandboxLimits
from factory.store import Store
from factory.verifiers import (
    AnswerVerifier,
    BranchOutput,
    JudgeSameAsPolicyWarning,
    ScalarLLMJudgeVerifier,
    TestsVerifier,
    Verdict,
    VerificationPipeline,
    build_pipeline,
    is_objective,
    objective_pass,
    verify_in_fresh_sandbox,
    verify_stored_run,
)
from tests.rollouts.conftest import FIX_FACTORIAL
from tests.rollouts.test_agent import ADD, FACTORIAL

ANSWERS = [{"prompt_contains": "17 + 25", "response": {"text": "Final: 42"}},
           {"prompt_contains": "17 + 25", "response": {"text": "Final: 41"}}]


def fork(tmp_path, replay_file, pipeline):
    model = create_model(f"replay:{replay_file(ANSWERS + FIX_FACTORIAL)}")
    store = Store.open(tmp_path / "v.duckdb")
    runner = RolloutForkRunner(model, store, ForkConfig(branches=2, sandbox="bwrap"), run_id="r1", pipeline=pipeline)

    async def go():
        return [r async for r in runner.run([ADD, FACTORIAL])]

    return store, asyncio.run(go())


def test_fork_verifies_each_branch_in_its_sandbox_and_stores_verdicts(tmp_path, replay_file):
    store, results = fork(tmp_path, replay_file, VerificationPipeline())
    with store:
        by_branch = {(r.task_id, r.branch_index): r for r in results}
        assert by_branch[("add", 0)].objective_pass is True and by_branch[("add", 1)].objective_pass is False
        assert by_branch[("fix-factorial", 0)].objective_pass is True
        verdicts = store.verdicts("r1")
        assert set(zip(verdicts["task_id"], verdicts["verifier"])) == {("add", "answer"), ("fix-factorial", "tests")}
        details = json.loads(verdicts.filter(verdicts["verifier"] == "tests")["details"][0])
        assert details["passed"] == details["total"] == 1 and details["hack_detected"] is False
        events = store.events("r1", "fix-factorial", 0)["kind"].to_list()
        assert events[-1] == "verdict"
        workspace = json.loads(store.branches("r1", "fix-factorial")["workspace"][0])
        assert "return 1" in workspace["files"]["solution.py"] and workspace["deleted"] == []


def test_objective_pass_counts_only_objective_verifiers():
    right, wrong = Verdict.make(AnswerVerifier, "pass", 1.0), Verdict.make(AnswerVerifier, "fail", 0.0)
    judged = Verdict.make(ScalarLLMJudgeVerifier, "fail", 0.2)
    assert (AnswerVerifier.objective, TestsVerifier.objective, ScalarLLMJudgeVerifier.objective) == (True, True, False)
    assert is_objective("answer") and not is_objective("judge")
    assert is_objective("a-plugin-not-loaded-here")  # every verifier but an opinion is a check
    assert objective_pass([right, judged]) is True and objective_pass([right, wrong, judged]) is False
    assert objective_pass([judged]) is None and objective_pass([]) is None
    # an opinion runs only when configured with its model: none by default
    assert VerificationPipeline().verifier("judge") is None
    assert isinstance(VerificationPipeline().verifier("answer"), AnswerVerifier)


def test_build_pipeline_adds_the_judge_only_when_given_and_warns_when_it_is_the_policy(replay_file):
    plain = build_pipeline("bwrap", SandboxLimits(timeout_s=900.0), hack_penalty=0.25)
    assert set(plain.verifiers) == {"tests"}
    tests = plain.verifiers["tests"]
    assert (tests.penalty, tests.timeout_s, tests.reference_sandbox) == (0.25, 900.0, "bwrap")
    # the test runs' own ceiling, not a branch's shorter per-command limit: a real suite must not be cut off
    assert build_pipeline("none", SandboxLimits(timeout_s=60.0)).verifiers["tests"].timeout_s == 600.0
    judge = f"replay:{replay_file(ANSWERS)}"
    with pytest.warns(JudgeSameAsPolicyWarning, match="also the policy"):
        judged = build_pipeline("bwrap", policy_spec=judge, judge_spec=judge, judge_samples=5, judge_budget=7)
    assert judged.verifiers["judge"].k == 5 and judged.verifiers["judge"].budget.max_judge_calls_per_batch == 7
    asyncio.run(judged.aclose())


def test_verify_in_fresh_sandbox_starts_one_only_when_needed_and_replays_first():
    pipeline = VerificationPipeline()
    # no verifier of ADD runs code and nothing is replayed: no sandbox starts (this backend does not exist)
    verdicts = asyncio.run(verify_in_fresh_sandbox(pipeline, ADD, BranchOutput("Final: 42"), "no-such-backend"))
    assert [(v.verifier, v.ok) for v in verdicts] == [("answer", True)]
    seen = []

    async def replay(sandbox):
        seen.append((await sandbox.exec("cat solution.py")).stdout)
        return BranchOutput("Final: 42")  # what the branch submitted replaces the given output

    verdicts = asyncio.run(verify_in_fresh_sandbox(pipeline, ADD, BranchOutput("Final: 41"), "bwrap", replay=replay))
    assert [(v.verifier, v.ok) for v in verdicts] == [("answer", True)] and seen == [""]
    # the workspace is applied over the task's files: the stored fix passes the tests
    fixed = {"files": {"solution.py": FACTORIAL.files["solution.py"].replace("return n\n", "return 1\n", 1)},
             "deleted": []}
    verdicts = asyncio.run(verify_in_fresh_sandbox(
        VerificationPipeline({"tests": TestsVerifier(reference_sandbox="bwrap")}), FACTORIAL, BranchOutput(None),
        "bwrap", fixed))
    assert [(v.verifier, v.ok) for v in verdicts] == [("tests", True)]


class AnswerV2(AnswerVerifier):
    version: ClassVar[str] = "2"


def test_reverify_from_stored_workspace_adds_new_versions_and_keeps_old(tmp_path, replay_file):
    store, _ = fork(tmp_path, replay_file, VerificationPipeline())
    with store:
        before = store.verdicts("r1").height
        same = asyncio.run(verify_stored_run(store, "r1", VerificationPipeline(
            {"tests": TestsVerifier(reference_sandbox="bwrap")}), "bwrap"))
        assert same["verified"] == 4 and store.verdicts("r1").height == before  # same versions: replaced
        asyncio.run(verify_stored_run(store, "r1", VerificationPipeline({"answer": AnswerV2()},
                                                                        only=frozenset({"answer"})), "bwrap"))
        versions = store.query("SELECT version, count(*) FROM verdicts WHERE verifier = 'answer' GROUP BY 1 ORDER BY 1")
        assert versions.rows() == [("1", 2), ("2", 2)]


def test_verify_cli_reverifies_a_run(tmp_path, replay_file):
    store, _ = fork(tmp_path, replay_file, None)
    store.close()
    result = subprocess.run([sys.executable, "-m", "factory.cli", "verify", "r1", "--db", str(tmp_path / "v.duckdb"),
                             "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"run_id": "r1", "branches": 4, "verdicts": 4, "verified": 4, "passed": 3}


GOLDEN = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "golden"


def test_verify_golden_cli_reports_false_negatives_and_positives():
    ok = subprocess.run([sys.executable, "-m", "factory.cli", "verify", "golden", "--verifier", "answer",
                         "--correct", str(GOLDEN / "answer-correct.jsonl"),
                         "--exploits", str(GOLDEN / "answer-exploits.jsonl"), "--json"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["clean"] and report["exploits"] == len(report["caught"]) == 13
    # swapped files: every correct case is now a "false positive" and every exploit a "false negative"
    swapped = subprocess.run([sys.executable, "-m", "factory.cli", "verify", "golden", "--verifier", "answer",
                              "--correct", str(GOLDEN / "answer-exploits.jsonl"),
                              "--exploits", str(GOLDEN / "answer-correct.jsonl")],
                             capture_output=True, text=True, timeout=120)
    assert swapped.returncode == 1
    assert "false negatives 13, false positives 4" in swapped.stdout


def test_verify_calibrate_cli_on_a_judged_run(tmp_path, replay_file):
    from factory.models import ModelOptions
    from factory.verifiers import ScalarLLMJudgeVerifier
    from tests.rollouts.wire_server import Reply, WireServer

    with WireServer() as server:
        # judge scores: high for the right answer's branch, low for the wrong one (3 samples each)
        server.push(*[Reply.ok('{"score": 9, "reason": "right"}')] * 3, *[Reply.ok('{"score": 2, "reason": "no"}')] * 3)
        judge = ScalarLLMJudgeVerifier(create_model("openai:judge", ModelOptions(base_url=f"{server.url}/v1",
                                                                                  api_key="t")))
        task = ADD.model_copy(update={"rubric": "right number"})
        model = create_model(f"replay:{replay_file(ANSWERS)}")
        with Store.open(tmp_path / "c.duckdb") as store:
            runner = RolloutForkRunner(model, store, ForkConfig(branches=2, concurrency=1, sandbox="bwrap"),
                                       run_id="cal", pipeline=VerificationPipeline({"judge": judge}))

            async def go():
                return [r async for r in runner.run([task])]

            asyncio.run(go())
    result = subprocess.run([sys.executable, "-m", "factory.cli", "verify", "calibrate", "cal", "--db",
                             str(tmp_path / "c.duckdb"), "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["n_branches"] == 2 and report["n_objective_pass"] == 1
    assert report["auc"] == 1.0
    assert report["self_agreement"]["share_within_1"] == 1.0
