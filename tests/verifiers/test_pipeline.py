"""Verification inside the fork, stored verdicts, and re-verification from the stored workspace."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import ClassVar

from factory.rollouts import ForkConfig, RolloutForkRunner
from factory.models import create_model
from factory.store import Store
from factory.verifiers import AnswerVerifier, TestsVerifier, VerificationPipeline, verify_stored_run
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
