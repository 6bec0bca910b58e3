"""``factory fork`` end to end: real CLI process, real store, real sandboxes, replay model."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb

from factory.store import Store

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def fork_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "factory.cli", "fork", *map(str, args)]


def write_replay(path: Path, delay_s: float = 0.0) -> Path:
    entries = [{"response": {"text": "thinking...\nFinal: 42", "usage": {"input_tokens": 20, "output_tokens": 6}},
                "delay_s": delay_s}]
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path


def write_tasks(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"t{i:03d}", "prompt": f"What is {i} + {i}?", "answer": str(2 * i)})
                            + "\n" for i in range(count)))
    return path


def test_fork_json_summary_and_store(tmp_path):
    db = tmp_path / "f.duckdb"
    replay = write_replay(tmp_path / "r.jsonl")
    result = subprocess.run(fork_cmd(EXAMPLES / "tasks.jsonl", "--model", f"replay:{replay}", "--db", db,
                                     "-n", 4, "--temperatures", "0.5:0.8", "--json"),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["status"] == "finished" and summary["tasks"] == 11 and summary["branches"] == 44
    assert summary["errors"] == 0 and summary["input_tokens"] == 44 * 20
    with Store.open(db, read_only=True) as store:
        temps = store.query("SELECT DISTINCT temperature FROM branches ORDER BY 1")["temperature"].to_list()
        assert temps == [0.5, 0.6, 0.7, 0.8]
        assert store.run(summary["run_id"])["sandbox"] == "bwrap"


def test_fork_without_verification_reports_zero_passes(tmp_path):
    db = tmp_path / "f.duckdb"
    replay = write_replay(tmp_path / "r.jsonl")
    result = subprocess.run(fork_cmd(write_tasks(tmp_path / "t.jsonl", 2), "--model", f"replay:{replay}", "--db", db,
                                     "-n", 2, "--no-verify", "--json"), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["branches"], summary["verified"], summary["passed"], summary["hacks"]) == (4, 0, 0, 0)


def test_malformed_task_file_is_rejected_before_any_branch(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "ok"}\n{"id": "b"}\n')
    db = tmp_path / "never.duckdb"
    result = subprocess.run(fork_cmd(bad, "--model", "replay:/nonexistent", "--db", db),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"{bad}:2: field 'prompt': required field is missing" in result.stderr
    assert "Traceback" not in result.stderr
    assert not db.exists()


def test_sandbox_none_warns_loudly(tmp_path):
    replay = write_replay(tmp_path / "r.jsonl")
    result = subprocess.run(fork_cmd(write_tasks(tmp_path / "t.jsonl", 2), "--model", f"replay:{replay}",
                                     "--sandbox", "none", "--db", tmp_path / "f.duckdb", "-n", 1),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    assert "NO isolation" in result.stderr


def test_a_judge_that_is_the_policy_is_one_warning_line(tmp_path):
    replay = write_replay(tmp_path / "r.jsonl")
    result = subprocess.run(fork_cmd(write_tasks(tmp_path / "t.jsonl", 1), "--model", f"replay:{replay}",
                                     "--judge", f"replay:{replay}", "--db", tmp_path / "f.duckdb", "-n", 1),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"WARNING: the judge replay:{replay} is also the policy" in result.stderr
    assert "JudgeSameAsPolicyWarning" not in result.stderr  # not Python's file:line form


def _interrupt_a_fork(tmp_path: Path, tasks: Path, replay: Path, wait_s: float) -> tuple[Path, int]:
    """Start a fork, send SIGINT ``wait_s`` after its first write, and return its store and kept branches."""
    db = tmp_path / f"f-{wait_s:g}.duckdb"
    proc = subprocess.Popen(fork_cmd(tasks, "--model", f"replay:{replay}", "--db", db, "-n", 2, "-c", 2,
                                     "--run-id", "ctrlc"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Interrupt once the run is under way (it needs about 8 s): its first write makes the store's WAL. A fixed
    # sleep is not enough on a loaded machine, where start-up alone can take seconds.
    wal, deadline = Path(f"{db}.wal"), time.monotonic() + 120
    while not wal.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(wait_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Resume with: factory fork --resume ctrlc" in err and "Traceback" not in err
    with Store.open(db, read_only=True) as store:
        assert store.run("ctrlc")["status"] == "interrupted"
        return db, store.branches("ctrlc").height


def test_ctrl_c_keeps_finished_branches_and_resume_completes(tmp_path):
    tasks = write_tasks(tmp_path / "t.jsonl", 30)
    replay = write_replay(tmp_path / "r.jsonl", delay_s=0.25)
    # On a machine so loaded that no branch finished before the interrupt, nothing was there to keep: the same
    # run is interrupted again later (a machine that slow does not finish all 60 branches in twice the time).
    for wait_s in (3, 6, 12, 24):
        db, kept = _interrupt_a_fork(tmp_path, tasks, replay, wait_s)
        if kept:
            break
    assert 0 < kept < 60
    result = subprocess.run(fork_cmd("--resume", "ctrlc", "--model", f"replay:{replay}", "--db", db, "--json"),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["branches"] == 60


def test_kill_9_at_random_moments_loses_nothing_and_duplicates_nothing(tmp_path):
    """kill -9 the fork process five times, resuming each time; every (task, branch) is stored exactly once."""
    db = tmp_path / "f.duckdb"
    tasks = write_tasks(tmp_path / "t.jsonl", 60)
    replay = write_replay(tmp_path / "r.jsonl", delay_s=0.2)  # about 12 s of work at concurrency 4
    rng = random.Random(1234)
    kills = 0
    for _attempt in range(12):
        exists = db.exists() and _run_exists(db, "k9")
        args = ["--resume", "k9"] if exists else [tasks, "--run-id", "k9"]
        proc = subprocess.Popen(fork_cmd(*args, "--model", f"replay:{replay}", "--db", db, "-n", 4, "-c", 4),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if kills < 5:
            time.sleep(rng.uniform(1.0, 2.5))
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                kills += 1
            proc.wait(timeout=30)
            continue
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        break
    assert kills == 5
    with Store.open(db, read_only=True) as store:
        counts = store.query("SELECT count(*), count(DISTINCT (task_id, branch_index)) FROM branches").row(0)
        assert counts == (240, 240)
        assert store.run("k9")["status"] == "finished"
        events = store.query(
            "SELECT task_id, branch_index, count(*) AS n, count(DISTINCT seq) AS d, max(seq) AS top "
            "FROM events GROUP BY ALL")
        assert events.height == 240
        assert (events["n"] == events["d"]).all() and (events["top"] == events["n"] - 1).all()


def _run_exists(db: Path, run_id: str) -> bool:
    try:
        con = duckdb.connect(str(db), read_only=True)
    except duckdb.Error:
        return False
    try:
        return bool(con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0])
    except duckdb.Error:
        return False
    finally:
        con.close()


def test_provider_failing_30_percent_with_429_and_500_still_completes_the_run(tmp_path):
    """The real openai SDK against a local server that fails 30% of calls; every branch still succeeds."""
    from tests.rollouts.wire_server import Reply, WireServer

    with WireServer() as server:
        server.flaky(0.3, statuses=(429, 500), seed=7, default=Reply.ok("Final: 4", usage=(9, 3)))
        result = subprocess.run(
            fork_cmd(write_tasks(tmp_path / "t.jsonl", 10), "--model", "openai:test-model",
                     "--base-url", f"{server.url}/v1", "--db", tmp_path / "f.duckdb", "-n", 3, "-c", 6, "--json"),
            capture_output=True, text=True, timeout=300, env={**os.environ, "OPENAI_API_KEY": "test"})
        failures = sum(1 for r in server.requests if r.status != 200)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["branches"] == 30 and summary["ok"] == 30 and summary["errors"] == 0
    assert failures >= 3 and summary["retries"] == failures
    assert summary["input_tokens"] == 30 * 9


def test_record_then_replay_reproduces_a_run_exactly(tmp_path):
    """Record the openai provider's answers, then re-run from the recording alone: same answers per branch."""
    from tests.rollouts.wire_server import Reply, WireServer

    tasks = write_tasks(tmp_path / "t.jsonl", 4)
    record = tmp_path / "recorded.jsonl"
    with WireServer() as server:
        server.push(*(Reply.ok(f"Final: {i}") for i in range(8)))
        first = subprocess.run(
            fork_cmd(tasks, "--model", "openai:test-model", "--base-url", f"{server.url}/v1", "--record", record,
                     "--db", tmp_path / "a.duckdb", "-n", 2, "-c", 1, "--temperatures", "0.3,0.9", "--json"),
            capture_output=True, text=True, timeout=120, env={**os.environ, "OPENAI_API_KEY": "test"})
    assert first.returncode == 0, first.stderr
    second = subprocess.run(fork_cmd(tasks, "--model", f"replay:{record}", "--db", tmp_path / "b.duckdb", "-n", 2,
                                     "--temperatures", "0.3,0.9", "--json"),
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr

    def answers(db, run_id):
        with Store.open(db, read_only=True) as store:
            return {(r["task_id"], r["branch_index"]): r["final_answer"]
                    for r in store.branches(run_id).iter_rows(named=True)}

    recorded = answers(tmp_path / "a.duckdb", json.loads(first.stdout)["run_id"])
    replayed = answers(tmp_path / "b.duckdb", json.loads(second.stdout)["run_id"])
    assert len(recorded) == 8 and len(set(recorded.values())) == 8
    assert replayed == recorded
