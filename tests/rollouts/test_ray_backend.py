"""``--backend ray`` on a real Ray cluster on loopback: a head and a worker node, each a ``ray start`` process.

One cluster for the module (starting one costs seconds); every test's driver
joins it and leaves. No mocks: real workers, real sandboxes, a real store,
replay models on the workers.
"""

from __future__ import annotations

import asyncio
import json
import logging
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
from factory.models import ModelOptions
from factory.rollouts import AgentConfig, BackendOptions, ForkConfig, LocalRayCluster, RolloutForkRunner, create_backend
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
    """A head (1 CPU) and one worker node (1 CPU) on 127.0.0.1; stopped, every process of it, at the end.

    This process joins it once, as the driver of every test's backend (a backend uses the session it
    finds and leaves it open): the tests share one Ray job, so a worker process one test's node check
    started serves the next test's instead of a new one importing factory again.
    """
    nodes = LocalRayCluster(workers=1, head_cpus=1, cpus_per_worker=1)
    try:
        nodes.start()
    except Exception as exc:  # no ray CLI, no sockets, a sandboxed CI: say why, run nothing
        pytest.skip(f"a local Ray cluster cannot start here: {str(exc)[-300:]}")
    try:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address=nodes.address, log_to_driver=False, logging_level=logging.WARNING, namespace="factory")
        yield nodes
    finally:
        ray.shutdown()
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


QUESTIONS = [Task(id=f"q{i}", prompt=f"What is {i} + {i}?", answer=str(2 * i)) for i in range(3)]


def _engines_under(folder: Path) -> dict[int, int]:
    """Engine processes (``factory.models._engine_host``) descended from a process whose command line
    names ``folder`` (a cluster's raylets do: its temp folder), each with its parent; Linux ``/proc``."""
    procs: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            procs[int(entry.name)] = (parent, (entry / "cmdline").read_bytes().decode(errors="replace"))
        except (OSError, ValueError, IndexError):
            continue

    def in_cluster(pid: int) -> bool:
        while pid in procs and pid > 1:
            pid, command = procs[pid]
            if str(folder) in command:
                return True
        return False

    return {pid: parent for pid, (parent, command) in procs.items()
            if "factory.models._engine_host" in command and in_cluster(pid)}


def test_an_in_process_model_is_loaded_once_in_a_model_host_and_answers_as_local(cluster, tmp_path, tiny_model,
                                                                                 one_torch_thread):
    """``hf:`` under ray: one engine in one ModelHost actor serves every worker; answers equal local's.

    The tiny model is random, so its answers are nonsense, but they are the same nonsense: greedy at
    temperature 0, and at temperature 1 seeded per branch (one torch thread in both engines), so
    every branch's text and token counts must match the local backend's exactly.
    """
    spec = f"hf:{tiny_model}"
    config = ForkConfig(branches=2, concurrency=4, temperatures=(0.0, 1.0), sandbox="none",
                        agent=AgentConfig(max_tokens=6))
    seen: dict = {}

    async def fork(store, run_id, engine, model, during=None):
        runner = RolloutForkRunner(model, store, config, run_id=run_id, backend=engine)
        try:
            async for _ in runner.run(QUESTIONS):
                if during is not None and not seen:
                    during(engine)
            if during is not None:
                seen["calls"] = engine.model_host()["calls"]
        finally:
            await model.aclose()
            await engine.aclose()

    def look(engine):  # mid-run (the host lives until the backend closes): where the engine is
        seen["host"] = engine.model_host()
        seen["engines"] = _engines_under(cluster.temp_dir)

    with Store.open(tmp_path / "run.duckdb") as store:
        # local: the same engine in this process (torch is loaded here already; a child would load it again)
        local = create_backend("local", BackendOptions(model_options=ModelOptions(threads=1, in_process=True)))
        asyncio.run(fork(store, "local", local, local.model(spec)))
        remote = create_backend("ray", BackendOptions(address=cluster.address,
                                                      model_options=ModelOptions(threads=1)))
        model = remote.model(spec)  # the host actor has loaded it by now
        assert model.spec == spec
        asyncio.run(fork(store, "ray", remote, model, during=look))
        rows, expected = branch_rows(store, "ray"), branch_rows(store, "local")
        assert len(rows) == len(QUESTIONS) * 2
        compared = ("status", "final_answer", "temperature", "seed", "input_tokens", "output_tokens", "model")
        assert {k: tuple(row[c] for c in compared) for k, row in rows.items()} == \
               {k: tuple(row[c] for c in compared) for k, row in expected.items()}
        assert {row["output_tokens"] for row in rows.values()} != {0}  # it generated
    host = seen["host"]
    # One engine in the whole cluster, a child of the model host (none under a worker), and it served
    # every branch's call.
    assert seen["engines"] == {host["engine_pid"]: host["pid"]}
    assert seen["calls"] == len(QUESTIONS) * 2  # one turn per branch (answer-only tasks), every one served there


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


#: A branch that holds its sandbox in a long command: the first try is killed in it, the re-run's
#: command times out (tool_timeout_s) and the branch then submits.
HOLD = Task(id="hold", prompt="Wait for the build, then submit.", files={"notes.txt": "wait\n"})


def hold_turns(command: str) -> list[dict]:
    return [{"prompt_contains": "Wait for the build", "turn": 0,
             "response": {"text": "", "tool_calls": [{"name": "run", "arguments": {"command": command}}]}},
            {"prompt_contains": "Wait for the build", "turn": 1,
             "response": {"text": "", "tool_calls": [{"name": "submit", "arguments": {"answer": "built"}}]}}]


def _processes() -> dict[int, str]:
    """Every process's command line (arguments joined by spaces); Linux ``/proc``."""
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def _docker_containers(folder_prefix: str) -> list[str]:
    """Sandbox containers (running or not) whose folder label starts with ``folder_prefix``."""
    listed = subprocess.run(["docker", "ps", "-a", "--filter", "label=factory.sandbox", "--format",
                             '{{.ID}} {{.Label "factory.sandbox.folder"}}'],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    rows = [line.split() for line in listed.splitlines()]
    return [row[0] for row in rows if len(row) == 2 and row[1].startswith(folder_prefix)]


def kill_worker_holding_a_sandbox(cluster, tmp_path, replay_file, sandbox: str) -> dict:
    """Fork HOLD on one Ray worker; kill -9 that worker while its branch runs in its sandbox.

    Returns what was seen when it was killed (its pid, sandbox folder, the sandbox's processes) and the
    stored branches, after the run ended.
    """
    unique = time.monotonic_ns() % 10**6  # its own folders and command line, whoever else runs this
    run_id, command = f"leak-{sandbox}-{os.getpid()}-{unique}", f"sleep 29.{unique:06d}"
    prefix = str(sandbox_root() / f"{run_id}-")
    replay = replay_file(hold_turns(command))
    engine = create_backend("ray", BackendOptions(address=cluster.address, workers=1))
    model = engine.model(f"replay:{replay}")
    config = ForkConfig(branches=1, concurrency=1, sandbox=sandbox, agent=AgentConfig(max_turns=3, tool_timeout_s=2))
    seen: dict = {}

    async def kill_in_sandbox(command_line=command):
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            folders = [f for f in sandbox_root().glob(f"{run_id}-*")
                       if re.fullmatch(rf"{re.escape(run_id)}-\d+", f.name)]
            sleeping = [pid for pid, command in _processes().items() if command.strip() == command_line]
            if folders and sleeping:  # the branch's command runs in its sandbox
                folder = folders[0]
                worker = int(folder.name.rsplit("-", 1)[1])
                held = {pid: command for pid, command in _processes().items() if str(folder) in command}
                containers = _docker_containers(str(folder)) if sandbox == "docker" else []
                os.kill(worker, signal.SIGKILL)
                seen.update(worker=worker, folder=folder, held=held, containers=containers, sleeping=sleeping)
                return
            await asyncio.sleep(0.05)

    with Store.open(tmp_path / "run.duckdb") as store:
        runner = RolloutForkRunner(model, store, config, run_id=run_id, backend=engine)

        async def go():
            killer = asyncio.create_task(kill_in_sandbox())
            try:
                return [result async for result in runner.run([HOLD])]
            finally:
                killer.cancel()
                await model.aclose()
                await engine.aclose()

        results = asyncio.run(go())
        seen["rows"] = branch_rows(store, run_id)
    seen["results"] = results
    seen["prefix"] = prefix
    return seen


def assert_rerun_once_and_nothing_left(seen: dict) -> None:
    assert "worker" in seen, "the branch never ran its command in a sandbox"
    rows = seen["rows"]
    assert list(rows) == [("hold", 0)] and len(seen["results"]) == 1
    row = rows[("hold", 0)]
    assert row["status"] == "ok" and row["final_answer"] == "built"  # re-run on the restarted worker
    assert "timed out" in json.dumps(json.loads(row["tool_call_sequence"])[0]).lower()
    # Nothing of the dead worker's sandbox is left: no folder of the run, no process in or on it.
    assert not [f for f in sandbox_root().glob(f"{Path(seen['prefix']).name}*")]
    assert not [pid for pid, command in _processes().items()
                if str(seen["folder"]) in command or pid in seen["sleeping"]]


def test_a_killed_workers_bwrap_sandbox_does_not_leak(cluster, tmp_path, replay_file):
    seen = kill_worker_holding_a_sandbox(cluster, tmp_path, replay_file, "bwrap")
    # It was killed holding a live sandbox: bwrap processes running on its folder.
    assert any("bwrap" in command for command in seen.get("held", {}).values()), seen.get("held")
    assert_rerun_once_and_nothing_left(seen)


@pytest.mark.slow  # a container per try and the engine's round trips: opt in with -m slow
def test_a_killed_workers_docker_sandbox_does_not_leak(cluster, tmp_path, replay_file):
    from factory.sandbox import docker_available, docker_image_status

    ok, why = docker_available()
    if not ok:
        pytest.skip(f"no docker engine: {why}")
    ok, why = docker_image_status()
    if not ok:
        pytest.skip(f"the sandbox image is missing: {why}")
    seen = kill_worker_holding_a_sandbox(cluster, tmp_path, replay_file, "docker")
    assert seen.get("containers"), "the killed worker held no container"
    assert_rerun_once_and_nothing_left(seen)
    assert _docker_containers(seen["prefix"]) == []  # no container of the run, running or stopped


JUDGED = [Task(id=f"j{i}", prompt=f"Name the number {i}.", rubric="Names the number.") for i in range(8)]


@pytest.mark.slow  # a third ray run, with two workers and a judge (opt in: -m slow)
def test_the_judge_budget_caps_the_whole_run_not_each_worker(cluster, tmp_path, replay_file):
    """--judge-budget 3 over 8 branches on two workers: 3 judge calls in all, 5 refused, counted once."""
    policy = replay_file(_slow([{"response": {"text": "Final: a number", "usage": {
        "input_tokens": 5, "output_tokens": 3}}}], 2.0))  # 8 s of branches: both workers are up before the end
    judge = tmp_path / "judge.jsonl"
    judge.write_text(json.dumps({"response": {"text": '{"score": 8, "reason": "named"}'}}) + "\n")
    recipe = partial(build_pipeline, "none", judge_spec=f"replay:{judge}", judge_samples=1, judge_budget=3)
    engine = create_backend("ray", BackendOptions(address=cluster.address, pipeline=recipe, workers=2))
    model = engine.model(f"replay:{policy}")
    pipeline = recipe()
    with Store.open(tmp_path / "run.duckdb") as store:
        runner = RolloutForkRunner(model, store, ForkConfig(branches=1, concurrency=2, sandbox="none"),
                                   run_id="b", pipeline=pipeline, backend=engine)

        async def go():
            try:
                return [result async for result in runner.run(JUDGED)]
            finally:
                await pipeline.aclose()
                await engine.aclose()

        results = asyncio.run(go())
        samples = store.judgments("b")
        assert len(branch_rows(store, "b")) == len(results) == 8
    statuses = sorted(samples["status"].to_list())
    assert statuses == ["budget_exhausted"] * 5 + ["ok"] * 3, statuses
    budget = pipeline.verifiers["judge"].budget  # the driver's summary reads the cluster's count
    assert (budget.used, budget.exhausted, budget.remaining) == (3, 5, 0)
    # Two workers verified (each with a budget of 3 of its own, more than 3 calls would have been made).
    assert len({result.node for result in results}) == 2, engine.node_counts


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
