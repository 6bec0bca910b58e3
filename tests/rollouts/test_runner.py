"""RolloutForkRunner: N branches per task, stored as they finish, resumable."""

from __future__ import annotations

import asyncio
import contextlib
import json

import polars as pl
import pytest

from factory.errors import ConfigError, RunError
from factory.models import create_model
from factory.rollouts import BranchPrimer, ForkConfig, RolloutForkRunner, StoredRun, branch_sampling
from factory.store import Store
from factory.tasks import Task, dataset_hash
from tests.rollouts.conftest import FIX_FACTORIAL
from tests.rollouts.test_agent import ADD, FACTORIAL

ANSWERS = [
    {"prompt_contains": "17 + 25", "response": {"text": "Final: 42", "usage": {"input_tokens": 5, "output_tokens": 2}}},
    {"prompt_contains": "17 + 25", "response": {"text": "Final: 41", "usage": {"input_tokens": 5, "output_tokens": 2}}},
]


def collect(runner, tasks, *args, **kwargs):
    async def go():
        return [result async for result in runner.run(tasks, *args, **kwargs)]

    return asyncio.run(go())


def test_branch_sampling_lists_ranges_and_errors():
    assert branch_sampling(4, [0.5, 0.6, 0.7, 0.8], None) == ([0.5, 0.6, 0.7, 0.8], [0, 1, 2, 3])
    assert branch_sampling(4, [0.2, 0.9], None, base_seed=10) == ([0.2, 0.9, 0.2, 0.9], [10, 11, 12, 13])
    assert branch_sampling(2, None, [7, 9]) == ([0.7, 0.7], [7, 9])
    with pytest.raises(ConfigError):
        branch_sampling(2, [0.1, 0.2, 0.3], None)
    with pytest.raises(ConfigError):
        branch_sampling(2, None, [1])


def test_runs_every_branch_in_its_own_sandbox_and_stores_it(tmp_path, replay_file):
    model = create_model(f"replay:{replay_file(ANSWERS + FIX_FACTORIAL)}")
    config = ForkConfig(branches=3, concurrency=4, temperatures=(0.5, 0.7, 0.9), base_seed=100, sandbox="bwrap")
    with Store.open(tmp_path / "run.duckdb") as store:
        runner = RolloutForkRunner(model, store, config, run_id="r1")
        results = collect(runner, [ADD, FACTORIAL], task_file="t.jsonl")
        assert sorted((r.task_id, r.branch_index) for r in results) == [
            ("add", 0), ("add", 1), ("add", 2), ("fix-factorial", 0), ("fix-factorial", 1), ("fix-factorial", 2)]
        branches = store.branches("r1")
        assert branches.height == 6
        row = branches.filter((pl.col("task_id") == "add") & (pl.col("branch_index") == 1)).row(0, named=True)
        assert (row["temperature"], row["seed"], row["status"]) == (0.7, 101, "ok")
        assert row["final_answer"] in ("Final: 42", "Final: 41")
        assert row["session_id"].startswith(row["rollout_id"] + "-b1-")
        assert len(set(branches["rollout_id"])) == 2 and len(set(branches["session_id"])) == 6
        assert json.loads(row["usage"])["input_tokens"] == 5
        fixed = branches.filter(pl.col("task_id") == "fix-factorial")
        assert set(fixed["final_answer"]) == {"base case fixed"}
        events = store.events("r1", "fix-factorial", 2)
        assert events["kind"].to_list()[0] == "run_start" and events["seq"].to_list() == list(range(events.height))
        run = store.run("r1")
        manifest = json.loads(run["config"])
        assert run["status"] == "finished" and run["dataset_hash"] == dataset_hash([ADD, FACTORIAL])
        assert manifest["sampling"] == {"temperatures": [0.5, 0.7, 0.9], "seeds": [100, 101, 102], "max_tokens": 1024}
        assert manifest["model"] == model.spec and manifest["sandbox"] == "bwrap"
        assert manifest["package_version"] and "git_sha" in manifest
        assert store.tasks("r1")["task_id"].to_list() == ["add", "fix-factorial"]


def test_model_and_sandbox_errors_are_recorded_never_lost(tmp_path, replay_file, monkeypatch):
    """Infrastructure failures are stored whole, and never appear as the policy's failures anywhere."""
    from factory.export import export
    from factory.memory import candidates_from_run
    from factory.ranking import RolloutRanker, excluded_branches, load_records
    from factory.verifiers import VerificationPipeline, opinion_verifiers

    model = create_model(f"replay:{replay_file(ANSWERS)}")  # no entries for the factorial task: the provider fails
    with Store.open(tmp_path / "run.duckdb") as store:
        runner = RolloutForkRunner(model, store, ForkConfig(branches=2, sandbox="bwrap"), run_id="r1",
                                   pipeline=VerificationPipeline())
        collect(runner, [ADD, FACTORIAL])
        statuses = dict(store.query(
            "SELECT task_id, list(status ORDER BY branch_index) FROM branches GROUP BY 1").iter_rows())
        assert statuses == {"add": ["ok", "ok"], "fix-factorial": ["infra_error", "infra_error"]}
        errors = store.branches("r1", "fix-factorial")["error"].to_list()
        assert all("ReplayMissError" in e for e in errors)
        # never verified, so never a failing verdict; not a record to rank, pair, power-check or remember
        assert store.verdicts("r1")["task_id"].unique().to_list() == ["add"]
        assert {r.task_id for r in load_records(store, "r1")} == {"add"}
        assert {r.task_id for r in RolloutRanker().rank(load_records(store, "r1")).ranked} == {"add"}
        assert excluded_branches(store, "r1")["infra_failures"] == 2
        infra = [c for c in candidates_from_run(store, "r1") if c.task_id == "fix-factorial"]
        assert infra and all(c.infra_error and c.objective_score is None for c in infra)
        summaries = store.task_summaries("r1", opinions=opinion_verifiers())
        assert summaries.filter(pl.col("task_id") == "fix-factorial").select(
            "errors", "verified", "passed").row(0) == (2, 0, 0)
        exported = export(store, "kto", ["r1"], tmp_path / "kto.jsonl")  # not one undesirable row from them
        assert {json.loads(line)["task_id"] for line in (tmp_path / "kto.jsonl").read_text().splitlines()} == {"add"}
        assert exported.manifest.counts["excluded_infra_failures"] == 2
        # a sandbox that cannot start: every branch recorded as an infrastructure failure, with the reason
        monkeypatch.setenv("PATH", "/nonexistent")
        runner = RolloutForkRunner(model, store, ForkConfig(branches=2, sandbox="bwrap"), run_id="r2",
                                   pipeline=VerificationPipeline())
        collect(runner, [FACTORIAL])
        rows = store.branches("r2")
        assert rows["status"].to_list() == ["infra_error", "infra_error"]
        assert all("apt-get install bubblewrap" in e for e in rows["error"].to_list())
        assert store.verdicts("r2").is_empty() and load_records(store, "r2") == []


def test_resume_runs_only_unfinished_branches(tmp_path, replay_file):
    path = replay_file([{**entry, "delay_s": 0.05} for entry in ANSWERS + FIX_FACTORIAL])
    tasks = [ADD, FACTORIAL]
    with Store.open(tmp_path / "run.duckdb") as store:
        runner = RolloutForkRunner(create_model(f"replay:{path}"), store, ForkConfig(branches=4, concurrency=2,
                                                                                     sandbox="none"), run_id="r1")

        async def stop_after(n):
            seen = 0
            async with contextlib.aclosing(runner.run(tasks)) as results:
                async for _ in results:
                    seen += 1
                    if seen == n:
                        break

        with pytest.warns(UserWarning):
            asyncio.run(stop_after(3))
        assert store.run("r1")["status"] == "interrupted"
        first = store.branches("r1")
        assert 3 <= first.height < 8
        resumed = RolloutForkRunner(create_model(f"replay:{path}"), store,
                                    ForkConfig(branches=4, concurrency=2, sandbox="none"), run_id="r1")
        with pytest.warns(UserWarning):
            again = collect(resumed, resumed.stored_tasks(), resume=True)
        assert len(again) == 8 - first.height
        assert not {(r.task_id, r.branch_index) for r in again} & set(zip(first["task_id"], first["branch_index"]))
        counts = store.query("SELECT count(*) AS n, count(DISTINCT (task_id, branch_index)) AS d FROM branches")
        assert counts.row(0) == (8, 8)
        assert store.run("r1")["status"] == "finished"


class RecordedPrimer:
    """A branch primer that adds nothing and records how to reopen it, as memory does."""

    def prime(self, task_text: str, k: int) -> str:
        return ""

    def describe(self) -> dict:
        return {"embedder": "hashing", "backend": "duckdb"}


def test_stored_run_reopens_the_manifest_and_resume_reruns_only_what_is_left(tmp_path, replay_file):
    assert isinstance(RecordedPrimer(), BranchPrimer)
    first_replies = replay_file(ANSWERS, "first.jsonl")  # nothing for the factorial task: its branches fail
    config = ForkConfig(branches=2, concurrency=2, temperatures=(0.3, 0.9), base_seed=5, sandbox="bwrap", memory_k=2)
    with Store.open(tmp_path / "run.duckdb") as store:
        first = RolloutForkRunner(create_model(f"replay:{first_replies}"), store, config, run_id="r1",
                                  memory=RecordedPrimer())
        collect(first, [ADD, FACTORIAL])
        with pytest.raises(ConfigError, match="no run nope"):
            StoredRun.load(store, "nope", concurrency=1)
        stored = StoredRun.load(store, "r1", concurrency=3)
        assert stored.config == ForkConfig(branches=2, concurrency=3, temperatures=(0.3, 0.9), seeds=(5, 6),
                                           base_seed=0, sandbox="bwrap", memory_k=2)
        assert stored.model == f"replay:{first_replies}" and [t.id for t in stored.tasks] == ["add", "fix-factorial"]
        assert stored.primer == {"k": 2, "embedder": "hashing", "backend": "duckdb"}
        # the same file name, now with every reply: resuming needs the run's own model spec
        replay_file(ANSWERS + FIX_FACTORIAL, "first.jsonl")
        runner = RolloutForkRunner(create_model(stored.model), store, stored.config, run_id=stored.run_id,
                                   memory=RecordedPrimer())

        async def resume(**kwargs):
            return [r async for r in runner.resume(**kwargs)]

        assert asyncio.run(resume()) == []  # errors are finished branches unless retried
        again = asyncio.run(resume(retry_errors=True))
        assert sorted((r.task_id, r.status) for r in again) == [("fix-factorial", "ok"), ("fix-factorial", "ok")]
        assert store.branches("r1").height == 4 and store.run("r1")["status"] == "finished"


def test_resume_refuses_other_tasks_or_model_and_new_run_refuses_existing(tmp_path, replay_file):
    path = replay_file(ANSWERS)
    with Store.open(tmp_path / "run.duckdb") as store:
        collect(RolloutForkRunner(create_model(f"replay:{path}"), store, ForkConfig(branches=1, sandbox="bwrap"),
                                  run_id="r1"), [ADD])
        other = Task(id="other", prompt="different")
        runner = RolloutForkRunner(create_model(f"replay:{path}"), store, ForkConfig(branches=1), run_id="r1")
        with pytest.raises(RunError, match="other tasks"):
            collect(runner, [other], resume=True)
        with pytest.raises(RunError, match="already exists"):
            collect(runner, [ADD])
        with pytest.raises(RunError, match="no run"):
            collect(RolloutForkRunner(create_model(f"replay:{path}"), store, ForkConfig(), run_id="nope"), [ADD],
                    resume=True)


def test_run_arguments_override_the_config(tmp_path, replay_file):
    with Store.open(tmp_path / "run.duckdb") as store:
        runner = RolloutForkRunner(create_model(f"replay:{replay_file(ANSWERS)}"), store, ForkConfig(), run_id="r1")
        results = collect(runner, [ADD], 3, 2, [0.1, 0.2, 0.3], [5, 6, 7])
        assert sorted((r.branch_index, r.temperature, r.seed) for r in results) == [
            (0, 0.1, 5), (1, 0.2, 6), (2, 0.3, 7)]
        assert json.loads(store.run("r1")["config"])["branches"] == 3
