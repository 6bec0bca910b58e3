"""Verification inside the fork, stored verdicts, and re-verification from the stored workspace."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import ClassVar

from factory.rollouts import ForkConfig, RolloutForkRunner
from factory.rollouts.models import create_model
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
