"""Crashes leave nothing behind: sandbox folders belong to a live process, or the next fork removes them.

Each process keeps its sandboxes' host directories in
``<tmp>/factory-sandboxes/<run>-<pid>/`` and holds a lock on it while it
lives. A fork (new or ``--resume``) first removes the folders whose lock is
free; a live process's folders, locked, are never touched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from factory.sandbox import sandbox_folder, sandbox_owner, sandbox_root, sweep_sandbox_folders

HOLD = """
import sys
from factory.sandbox import sandbox_folder, sandbox_owner
with sandbox_owner(sys.argv[1]):
    folder = sandbox_folder()
(folder / "workspace").mkdir()
print(folder, flush=True)
sys.stdin.read()  # hold the folder until the test lets go (or kills this process)
"""


@pytest.fixture
def tmpdir_root(tmp_path, monkeypatch) -> Path:
    """A temp folder of the test's own, for this process (tempfile.tempdir) and its children (TMPDIR)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


def _holder(owner: str) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, owner], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    return proc, Path(proc.stdout.readline().strip())


def test_folders_are_per_owner_and_process_under_one_root(tmpdir_root):
    with sandbox_owner("run/1"):
        folder = sandbox_folder()
        assert sandbox_folder() == folder
    assert folder.parent == sandbox_root() == tmpdir_root / "factory-sandboxes"
    assert folder.name == f"run_1-{os.getpid()}"
    assert sandbox_folder().name == f"adhoc-{os.getpid()}"


def test_the_sweep_never_removes_a_live_process_folders_and_removes_a_dead_ones(tmpdir_root):
    mine = sandbox_folder()
    (mine / "workspace").mkdir()
    alive, alive_folder = _holder("alive")
    dead, dead_folder = _holder("dead")
    try:
        assert alive_folder.name == f"alive-{alive.pid}" and dead_folder.name == f"dead-{dead.pid}"
        assert sweep_sandbox_folders() == []  # three live owners: nothing goes
        assert all(f.is_dir() for f in (mine, alive_folder, dead_folder))
        dead.kill()
        dead.wait()
        assert dead_folder.is_dir()  # kill -9 left it behind
        assert sweep_sandbox_folders() == [dead_folder]
        assert not dead_folder.exists()
        assert mine.is_dir() and (mine / "workspace").is_dir() and alive_folder.is_dir()
    finally:
        alive.kill()
        alive.wait()
        dead.wait()
    assert sweep_sandbox_folders() == [alive_folder]


def test_a_process_that_exits_removes_its_folder(tmpdir_root):
    proc, folder = _holder("done")
    proc.communicate("")  # let it exit normally
    assert proc.returncode == 0 and not folder.exists()


def test_a_folder_left_with_a_recycled_pid_is_taken_over_only_when_free(tmpdir_root):
    """A dead process's folder with this process's name (its pid reused) is emptied and reused."""
    root = sandbox_root()
    root.mkdir(parents=True, exist_ok=True)
    stale = root / f"recycled-{os.getpid()}"
    (stale / "old-workspace").mkdir(parents=True)
    with sandbox_owner("recycled"):
        assert sandbox_folder() == stale
    assert list(stale.iterdir()) == []


def _write_fork_inputs(folder: Path) -> tuple[Path, Path]:
    tests = {"test_solution.py": "from solution import f\n\n\ndef test_f():\n    assert f() == 1\n"}
    tasks = folder / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i:02d}", "prompt": f"Task {i}: make f() return 1.",
                                         "files": {"solution.py": "def f():\n    return 0\n"}, "tests": tests,
                                         "test_command": "python -m pytest -q"}) + "\n" for i in range(8)))
    replies = folder / "replies.jsonl"
    replies.write_text(
        json.dumps({"turn": 0, "delay_s": 0.3, "response": {"text": "", "tool_calls": [
            {"name": "run", "arguments": {"command": "sleep 0.5"}}]}}) + "\n"
        + json.dumps({"turn": 1, "response": {"text": "", "tool_calls": [
            {"name": "submit", "arguments": {"answer": "done"}}]}}) + "\n")
    return tasks, replies


def _wait_for_sandboxes(proc: subprocess.Popen, root: Path, timeout: float = 120.0) -> Path:
    """The process's sandbox folder, once sandboxes are in it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        folders = [p for p in root.glob(f"*-{proc.pid}") if p.is_dir()] if root.is_dir() else []
        if folders and any(folders[0].iterdir()):
            return folders[0]
        time.sleep(0.1)
    raise AssertionError("the fork made no sandbox in time")


def test_kill_9_mid_run_then_resume_leaves_no_sandbox_folder(tmp_path, tmpdir_root):
    """kill -9 a fork three times while its sandboxes are open; each resume sweeps the dead one's folder."""
    tasks, replies = _write_fork_inputs(tmp_path)
    db = tmp_path / "litter.duckdb"
    root = sandbox_root()
    fork = [sys.executable, "-m", "factory.cli", "fork", "--db", str(db)]
    dead: list[Path] = []
    for attempt in range(3):
        args = [str(tasks), "--model", f"replay:{replies}", "--run-id", "litter", "-n", 2, "-c", 4] if attempt == 0 \
            else ["--resume", "litter"]
        proc = subprocess.Popen([*fork, *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        folder = _wait_for_sandboxes(proc, root)
        assert folder.name == f"litter-{proc.pid}"
        # The live fork swept the folders of those killed before it, and its own is the only one left.
        assert not any(f.exists() for f in dead)
        assert sorted(root.iterdir()) == [folder]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert folder.is_dir() and any(folder.iterdir())  # what kill -9 leaves: the next fork's to remove
        dead.append(folder)
    result = subprocess.run([*fork, "--resume", "litter", "--json"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["branches"] == 16
    # Under the test's long TMPDIR every verification still reaches its warm runner (a socket path over 108
    # bytes once made each one an infrastructure error after a 60 s wait): all 16 are judged, as failures.
    import duckdb

    with duckdb.connect(str(db), read_only=True) as connection:
        assert connection.execute("SELECT status, count(*) FROM verdicts GROUP BY 1").fetchall() == [("fail", 16)]
    assert list(root.iterdir()) == []  # the dead forks' folders swept, the finished one's removed at exit
    assert [p.name for p in tmpdir_root.iterdir() if p.name.startswith("factory-")] == ["factory-sandboxes"]
