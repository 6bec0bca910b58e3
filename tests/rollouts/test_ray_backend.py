"""``--backend ray`` on a real Ray cluster on loopback: a head and a worker node, each a ``ray start`` process.

One cluster for the module (starting one costs seconds); every test's driver
joins it and leaves. No mocks: real workers, real sandboxes, a real store,
replay models on the workers.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import duckdb
import pytest

from factory.errors import ConfigError
from factory.rollouts import BackendOptions, ForkConfig, LocalRayCluster, RolloutForkRunner, create_backend
from factory.sandbox import sandbox_root
from factory.store import RunManifest, Store
from factory.tasks import Task
from factory.verifiers import build_pipeline
from tests.rollouts.conftest import FIX_FACTORIAL
from tests.rollouts.test_agent import FACTORIAL

ray = pytest.importorskip("ray", reason="Ray is not installed (the ray extra: pip install 'factory-rlaif[ray]')")

ANSWERS = [{"prompt_contains": f"{i} + {i}", "response": {"text": f"Final: {2 * i}", "usage": {
    "input_tokens": 5, "output_tokens": 2}}} for i in range(8)]
TASKS = [Task(id=f"t{i}", prompt=f"What is {i} + {i}?", answer=str(2 * i)) for i in range(8)]


@pytest.fixture(scope="module")
def cluster():
    """A head (1 CPU) and one worker node (1 CPU) on 127.0.0.1; stopped, every process of it, at the end."""
    nodes = LocalRayCluster(workers=1, head_cpus=1, cpus_per_worker=1)
    try:
        nodes.start()
    except Exception as exc:  # no ray CLI, no sockets, a sandboxed CI: say why, run nothing
        pytest.skip(f"a local Ray cluster cannot start here: {str(exc)[-300:]}")
    try:
        yield nodes
    finally:
        nodes.stop()


def run_fork(store: Store, run_id: str, replay: Path, tasks: list[Task], backend: str, address: str | None = None,
             *, sandbox: str = "none", branches: int = 2, concurrency: int = 4, during=None):
    """Fork ``tasks`` with ``backend``; ``during(backend)`` runs once the first branch is stored."""
    recipe = partial(build_pipeline, sandbox)  # what each worker builds its own verification pipeline from
    engine = create_backend(backend, BackendOptions(address=address, pipeline=recipe))
    model = engine.model(f"replay:{replay}")
    config = ForkConfig(branches=branches, concurrency=concurrency, temperatures=(0.5, 0.9), sandbox=sandbox)
    runner = RolloutForkRunner(model, store, config, run_id=run_id, pipeline=recipe(), backend=engine)

    async def go():
        results = []
        try:
            async for result in runner.run(tasks):
                results.append(result)
                if during is not None and len(results) == 1:
                    await during(engine)
        finally:
            await runner.pipeline.aclose()
            await engine.aclose()
        return results

    return asyncio.run(go()), engine


def branch_rows(store: Store, run_id: str) -> dict[tuple[str, int], dict]:
    rows = store.branches(run_id).to_dicts()
    keys = [(row["task_id"], row["branch_index"]) for row in rows]
    assert len(keys) == len(set(keys)), "a (task, branch) was stored twice"
    return {key: row for key, row in zip(keys, rows)}


def verdicts(store: Store, run_id: str) -> list[tuple]:
    frame = store.query(f"SELECT task_id, branch_index, verifier, status, score FROM verdicts "
                        f"WHERE run_id = '{run_id}' ORDER BY ALL")
    return [tuple(row) for row in frame.iter_rows()]


def test_ray_stores_every_branch_once_and_equals_local(cluster, tmp_path, replay_file):
    replay = replay_file(ANSWERS + FIX_FACTORIAL)
    tasks = [*TASKS[:4], FACTORIAL]
    with Store.open(tmp_path / "run.duckdb") as store:
        run_fork(store, "local", replay, tasks, "local", sandbox="bwrap")
        results, engine = run_fork(store, "ray", replay, tasks, "ray", cluster.address, sandbox="bwrap")
        local, remote = branch_rows(store, "local"), branch_rows(store, "ray")
        assert len(remote) == len(tasks) * 2 == len(results)
        compared = ("status", "final_answer", "temperature", "seed", "input_tokens", "output_tokens", "error")
        assert {k: tuple(row[c] for c in compared) for k, row in remote.items()} == \
               {k: tuple(row[c] for c in compared) for k, row in local.items()}
        for key, row in remote.items():  # the agent's turns too (tool outputs hold timings), and the workspace
            assert _turns(row) == _turns(local[key]), key
            assert row["workspace"] == local[key]["workspace"], key
        assert verdicts(store, "ray") == verdicts(store, "local")
        assert {v[3] for v in verdicts(store, "ray") if v[0] == "fix-factorial"} == {"pass"}
        # Counted per node (a worker that starts late on a busy host may get none); the manifest says where.
        assert 1 <= len(engine.node_counts) <= 2 and sum(engine.node_counts.values()) == len(results)
        assert all(r.node in engine.node_counts for r in results)
        backend = RunManifest.from_stored(store.run("ray")["config"]).backend
        assert backend == {"name": "ray", "address": cluster.address, "workers": None}
        assert RunManifest.from_stored(store.run("local")["config"]).backend == {"name": "local"}


def _turns(row: dict) -> list[dict]:
    return [message for message in json.loads(row["trajectory"]) if message["role"] != "tool"]


def _slow(entries: list[dict], delay_s: float) -> list[dict]:
    return [{**entry, "delay_s": delay_s} for entry in entries]


@pytest.mark.slow  # a worker's restart and its re-run branches: 68 s here at load 16 (opt in: -m slow)
def test_worker_killed_mid_branch_is_rerun_and_stored_once(cluster, tmp_path, replay_file):
    """kill -9 a worker process while its branches (bwrap sandboxes open) are in flight."""
    replay = replay_file(_slow(FIX_FACTORIAL, 0.4) + _slow(ANSWERS, 0.4))
    tasks = [FACTORIAL, *TASKS[:3]]
    killed: list[tuple[str, int]] = []

    async def kill_one(engine):
        node, pid = engine.worker_processes()[0]  # one that is up, and running this run's branches
        os.kill(pid, signal.SIGKILL)
        killed.append((node, pid))

    with Store.open(tmp_path / "run.duckdb") as store:
        results, engine = run_fork(store, "k", replay, tasks, "ray", cluster.address, sandbox="bwrap",
                                   concurrency=4, during=kill_one)
        rows = branch_rows(store, "k")
        assert len(rows) == len(results) == 8
        assert {row["status"] for row in rows.values()} == {"ok"}  # re-run, not an infra_error
        assert {v[3] for v in verdicts(store, "k") if v[0] == "fix-factorial"} == {"pass"}
    assert killed
    # The dead worker's sandboxes did not leak: its bwrap processes died with it, its folder was swept.
    pid = killed[0][1]
    assert not list(sandbox_root().glob(f"k-{pid}*"))
    ps = subprocess.run(["ps", "-eo", "pid,cmd"], capture_output=True, text=True).stdout
    assert not [line for line in ps.splitlines() if "bwrap" in line and f"k-{pid}" in line]


def _stored(db: Path, run_id: str) -> int:
    try:
        con = duckdb.connect(str(db), read_only=True)
    except duckdb.Error:  # the fork holds it: look again
        return 0
    try:
        return con.execute("SELECT count(*) FROM branches WHERE run_id = ?", [run_id]).fetchall()[0][0]
    except duckdb.Error:
        return 0
    finally:
        con.close()


@pytest.mark.slow  # two fork processes, each joining the cluster: 46-133 s here at load 16 (opt in: -m slow)
def test_driver_killed_then_resume_stores_each_branch_once(cluster, tmp_path, replay_file):
    replay = replay_file(_slow(ANSWERS, 0.5))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": t.id, "prompt": t.prompt, "answer": t.answer}) + "\n" for t in TASKS))
    db = tmp_path / "f.duckdb"
    fork = [sys.executable, "-m", "factory.cli", "fork", "--model", f"replay:{replay}", "--db", str(db)]
    # Its stderr is a terminal, so it draws its progress bar ("3/16"): killed once 2 branches are stored.
    leader, follower = pty.openpty()
    proc = subprocess.Popen([*fork, str(tasks), "--run-id", "d", "--backend", "ray", "--ray-address",
                             cluster.address, "--sandbox", "none", "-n", "2", "-c", "2"],
                            stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.2)[0]:
                seen += os.read(leader, 65536)
            done = [int(n) for n in re.findall(rb"(\d+)/16", seen)]
            if done and max(done) >= 2:
                break
        assert proc.poll() is None, seen.decode(errors="replace")[-2000:]  # 16 branches of 0.5 s: still running
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        os.close(leader)
    before = _stored(db, "d")
    assert 2 <= before < 16
    # No --backend: a resume runs where its run ran (the manifest's ray, at the recorded address).
    done = subprocess.run([*fork, "--resume", "d", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["status"] == "finished" and summary["branches"] == 16 and summary["errors"] == 0
    assert summary["backend"] == "ray" and sum(summary["nodes"].values()) == 16 - before
    with Store.open(db, read_only=True) as store:
        assert len(branch_rows(store, "d")) == 16


def test_a_node_that_cannot_run_the_branches_stops_the_run_naming_it(cluster, tmp_path, replay_file):
    replay = replay_file(ANSWERS)
    engine = create_backend("ray", BackendOptions(address=cluster.address))
    model = engine.model(f"replay:{replay}")  # read here; gone before the nodes look for it
    replay.unlink()
    with Store.open(tmp_path / "run.duckdb") as store:
        runner = RolloutForkRunner(model, store, ForkConfig(branches=1, sandbox="none"), run_id="n", backend=engine)

        async def go():
            try:
                return [result async for result in runner.run(TASKS[:1])]
            finally:
                await engine.aclose()

        with pytest.raises(ConfigError, match=r"^ray node \S+ \(.+\): the replay file .+ is not readable there"):
            asyncio.run(go())
        assert store.run("n") is None  # refused before the run was written
