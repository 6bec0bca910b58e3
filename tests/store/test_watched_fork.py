"""A store being written is readable: real ``factory fork`` processes, real readers, one DuckDB file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from factory.errors import StoreLockedError
from factory.store import Store, utc_now


def factory_cmd(*args: object) -> list[str]:
    return [sys.executable, "-m", "factory.cli", *map(str, args)]


def write_run_files(tmp_path: Path, plain: int, delay_s: float) -> tuple[Path, Path, Path]:
    """Tasks, replay and gate of a fork that cannot finish before the test opens its gate.

    ``plain`` answer-only tasks answer after ``delay_s``; the last task is agentic
    and its branches wait, in a ``run`` tool call (sandbox ``none``), for the gate
    file to exist. So the run is certainly still going while readers look, and
    its length does not depend on how busy the machine is.
    """
    gate = tmp_path / "gate"
    rows = [{"id": f"t{i:03d}", "prompt": f"plain task: what is {i} + {i}?", "answer": str(2 * i)}
            for i in range(plain)]
    rows.append({"id": "gate", "prompt": "gate task: wait, then answer 42.", "answer": "42",
                 "files": {"note.txt": "wait for the gate\n"}})
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    wait = f"while [ ! -e {gate} ]; do sleep 0.05; done; echo open"
    entries = [
        {"prompt_contains": "plain task", "delay_s": delay_s,
         "response": {"text": "thinking...\nFinal: 42", "usage": {"input_tokens": 20, "output_tokens": 6}}},
        {"prompt_contains": "gate task", "turn": 0,
         "response": {"text": "", "tool_calls": [{"name": "run", "arguments": {"command": wait}}]}},
        {"prompt_contains": "gate task", "turn": 1,
         "response": {"text": "", "tool_calls": [{"name": "submit", "arguments": {"answer": "42"}}]}},
    ]
    replay = tmp_path / "r.jsonl"
    replay.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return tasks, replay, gate


def fork_args(replay: Path, db: Path) -> tuple[object, ...]:
    return ("--model", f"replay:{replay}", "--db", db, "-n", 2, "-c", 4, "--sandbox", "none",
            "--timeout", 300)


#: One reader's look at the store: branches stored, distinct (task, branch) keys, and branches stored without
#: their events or verdicts (a half-written batch: must always be 0).
LOOK = """
    SELECT (SELECT count(*) FROM branches) AS branches,
           (SELECT count(DISTINCT (task_id, branch_index)) FROM branches) AS keys,
           (SELECT count(*) FROM branches b WHERE NOT EXISTS (SELECT 1 FROM events e
               WHERE e.run_id = b.run_id AND e.task_id = b.task_id AND e.branch_index = b.branch_index)
            OR NOT EXISTS (SELECT 1 FROM verdicts v
               WHERE v.run_id = b.run_id AND v.task_id = b.task_id AND v.branch_index = b.branch_index)) AS partial
"""


def look(db: Path) -> tuple[int, int, int]:
    """Open the store read-only (from this process, not the fork's), read, close."""
    with Store.open(db, read_only=True) as store:
        return store.query(LOOK).row(0)


class Poller:
    """Reads the store every few hundred ms in a thread, as a watcher would; every look must succeed."""

    def __init__(self, db: Path):
        self.db = db
        self.looks: list[tuple[int, int, int]] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.3):
            if not self.db.exists():
                continue
            try:
                self.looks.append(look(self.db))
            except BaseException as exc:  # noqa: BLE001 - recorded, the test asserts there is none
                self.errors.append(exc)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def wait_for_branches(db: Path, proc: subprocess.Popen, at_least: int, timeout_s: float = 120) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if db.exists():
            n = look(db)[0]
            if n >= at_least:
                return n
        time.sleep(0.1)
    raise AssertionError(f"the fork stored fewer than {at_least} branches (exit {proc.poll()})")


def test_runs_and_query_work_while_a_fork_writes_and_every_branch_lands_once(tmp_path):
    db = tmp_path / "watched.duckdb"
    tasks, replay, gate = write_run_files(tmp_path, plain=12, delay_s=0.8)  # 24 plain branches, 4 at a time
    total = 26
    fork = subprocess.Popen(factory_cmd("fork", tasks, *fork_args(replay, db), "--run-id", "w1", "--json"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with Poller(db) as poller:
            assert wait_for_branches(db, fork, 1) < total
            # Three other processes at once while the fork writes: two readers and a second writer.
            others = {
                "runs": factory_cmd("runs", "--json", "--db", db),
                "query": factory_cmd("query", "SELECT status, (SELECT count(*) FROM branches) AS n FROM runs",
                                     "--format", "json", "--db", db),
                "fork": factory_cmd("fork", tasks, *fork_args(replay, db), "--run-id", "w2"),
            }
            procs = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for name, argv in others.items()}
            done = {name: (*proc.communicate(timeout=120), proc.returncode) for name, proc in procs.items()}
            wait_for_branches(db, fork, total - 2)  # every plain branch: the gate's two are waiting
            assert fork.poll() is None
            gate.touch()
            out, err = fork.communicate(timeout=120)
    finally:
        gate.touch()
        if fork.poll() is None:
            fork.kill()
    assert fork.returncode == 0, err
    assert json.loads(out)["branches"] == total
    runs_out, runs_err, code = done["runs"]
    assert code == 0, runs_err
    (run,) = json.loads(runs_out)
    assert run["run_id"] == "w1" and run["status"] == "running" and 0 < run["branches"] < total
    query_out, query_err, code = done["query"]
    assert code == 0, query_err
    assert json.loads(query_out)[0]["status"] == "running" and 0 < json.loads(query_out)[0]["n"] < total
    fork_out, fork_err, code = done["fork"]
    assert code == 3, fork_out + fork_err
    assert f"open for writing by another process (PID {fork.pid})" in fork_err
    assert not poller.errors, poller.errors[:3]
    seen = [branches for branches, _, _ in poller.looks]
    assert seen == sorted(seen)
    during = set(seen) | {run["branches"], json.loads(query_out)[0]["n"]}
    assert len(during - {0, total}) >= 2, (seen, during)  # readers saw the run grow, not just its ends
    assert all(branches == keys and partial == 0 for branches, keys, partial in poller.looks), poller.looks
    assert look(db) == (total, total, 0)
    with Store.open(db, read_only=True) as store:
        assert store.run("w1")["status"] == "finished"
        assert store.query("SELECT count(*) FROM runs").item() == 1  # the refused writer wrote nothing
    assert not Path(f"{db}.lock").exists()


def test_kill_9_mid_run_then_resume_completes_exactly_once_while_a_reader_polls(tmp_path):
    db = tmp_path / "k9.duckdb"
    tasks, replay, gate = write_run_files(tmp_path, plain=8, delay_s=0.3)
    total = 18
    with Poller(db) as poller:
        fork = subprocess.Popen(factory_cmd("fork", tasks, *fork_args(replay, db), "--run-id", "k9"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_for_branches(db, fork, 4)
        finally:
            os.kill(fork.pid, signal.SIGKILL)
            fork.wait(timeout=30)
        kept = look(db)[0]  # a reader gets in after the writer died mid-run (its write-ahead log replayed)
        assert 4 <= kept < total
        gate.touch()
        resumed = subprocess.run(factory_cmd("fork", "--resume", "k9", *fork_args(replay, db), "--json"),
                                 capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["branches"] == total
    assert not poller.errors, poller.errors[:3]
    assert all(branches == keys and partial == 0 for branches, keys, partial in poller.looks), poller.looks
    assert look(db) == (total, total, 0)
    with Store.open(db, read_only=True) as store:
        assert store.run("k9")["status"] == "finished"
        events = store.query("SELECT count(*) AS n, count(DISTINCT seq) AS d FROM events GROUP BY task_id, "
                             "branch_index")
        assert events.height == total and (events["n"] == events["d"]).all()


HOLDER = """
    import sys
    from factory.store import Store, utc_now
    store = Store.open({path!r})
    for line in sys.stdin:  # each line: write one run, then say so
        store.write_run({{"run_id": line.strip(), "created_at": utc_now(), "status": "running", "model": "m"}})
        print("wrote", flush=True)
"""


def test_an_idle_writer_lets_a_reader_in_and_a_reader_left_open_steps_aside_for_it(tmp_path):
    path = tmp_path / "held.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDER.format(path=str(path)))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        holder.stdin.write("a\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "wrote"
        with Store.open(path, read_only=True) as reader:  # held open between reads, as a server holds it
            assert reader.runs()["run_id"].to_list() == ["a"]
            start = time.monotonic()
            holder.stdin.write("b\n")
            holder.stdin.flush()
            assert holder.stdout.readline().strip() == "wrote"  # the writer got back in past the open reader
            assert time.monotonic() - start < 10
            assert sorted(reader.runs()["run_id"].to_list()) == ["a", "b"]  # and the reader back in after it
        with pytest.raises(StoreLockedError, match=rf"open for writing by another process \(PID {holder.pid}\)"):
            Store.open(path)  # a second writer, while the first is idle
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert not Path(f"{path}.lock").exists()


def test_a_reader_that_never_gets_in_says_why(tmp_path):
    path = tmp_path / "foreign.duckdb"
    with Store.open(path) as store:
        store.write_run({"run_id": "r", "created_at": utc_now(), "status": "running", "model": "m"})
    # A writer that is not a factory store (DuckDB itself) never lets readers in.
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, sys\ncon = duckdb.connect({str(path)!r})\n"
                               "print('ready', flush=True)\nsys.stdin.readline()\n"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        start = time.monotonic()
        with pytest.raises(StoreLockedError, match=r"did not let readers in within 0\.5 s"):
            Store.open(path, read_only=True, wait_s=0.5)
        assert time.monotonic() - start < 5
    finally:
        holder.communicate("\n", timeout=30)
