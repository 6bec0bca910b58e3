"""A failed command changes nothing: arguments, extras and inputs are checked before the first write.

A command that only reads never creates a store: a ``--db`` that does not
exist is an error naming the path, and no file appears. Only ``fork`` (a new
run) and ``db migrate`` create one, and a fork that fails before its run
begins leaves no empty store behind.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from factory.store import Store


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def store_copy(exported_run, tmp_path) -> Path:
    """A private copy of the exported run's store (tests/_runs.py: run r1, not ranked)."""
    folder = tmp_path / "work"
    folder.mkdir()
    return Path(shutil.copyfile(exported_run, folder / "store.duckdb"))


def test_rank_without_the_plot_extra_stores_nothing(cli, store_copy, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the plot extra is not installed: import fails
    before = digest(store_copy)
    result = cli("rank", "r1", "--db", store_copy, "--plot", store_copy.with_name("x.png"))
    assert result.exit_code == 2
    assert result.output.strip() == "error: plots need matplotlib: pip install 'factory-rlaif[plot]'"
    assert digest(store_copy) == before
    with Store.open(store_copy, read_only=True) as store:
        assert store.rankings("r1").height == 0
    assert not store_copy.with_name("x.png").exists()


MISTYPED = {
    # commands that update a store
    "rank": ["rank", "r1"],
    "fork --resume": ["fork", "--resume", "r1"],
    "memory add": ["memory", "add", "r1"],
    "memory clear": ["memory", "clear", "--yes"],
    "verify run": ["verify", "run", "r1"],
    # commands that only read
    "query": ["query", "SELECT 1"],
    "runs": ["runs"],
    "db info": ["db", "info"],
    "export": ["export", "sft", "--run", "r1", "--out", "{tmp}/out.jsonl"],
    "power": ["power", "--runs", "r1", "r2"],
    "memory search": ["memory", "search", "text"],
    "memory stats": ["memory", "stats"],
    "verify calibrate": ["verify", "calibrate", "r1"],
}


@pytest.mark.parametrize("args", list(MISTYPED.values()), ids=list(MISTYPED))
def test_a_mistyped_db_is_an_error_naming_it_and_creates_nothing(cli, tmp_path, args):
    db = tmp_path / "mistyped.duckdb"
    before = sorted(tmp_path.iterdir())
    result = cli(*(a.format(tmp=tmp_path) for a in args), "--db", db)
    assert result.exit_code == 1, result.output
    assert result.output.strip() == f"error: no database at {db} (run `factory fork` first, or pass --db)"
    assert sorted(tmp_path.iterdir()) == before


def test_a_new_fork_that_fails_before_its_run_leaves_no_store(cli, tmp_path, write_jsonl):
    tasks = write_jsonl([{"id": "t1", "prompt": "What is 1 + 1?", "answer": "2"}])
    db = tmp_path / "new.duckdb"
    result = cli("fork", tasks, "--model", "replay:", "--db", db)
    assert result.exit_code == 2 and result.output.startswith("error: replay: needs a file")
    assert not db.exists() and not db.with_name("new.duckdb.wal").exists()


def test_a_fork_that_fails_on_an_existing_store_keeps_it_unchanged(cli, store_copy, write_jsonl, replay_file):
    tasks = write_jsonl([{"id": "t1", "prompt": "What is 1 + 1?", "answer": "2"}])
    replay = replay_file([{"response": {"text": "Final: 2"}}])
    before = digest(store_copy)
    result = cli("fork", tasks, "--model", f"replay:{replay}", "--run-id", "r1", "--db", store_copy)
    assert result.exit_code == 1 and "run r1 already exists" in result.output
    assert digest(store_copy) == before


@pytest.mark.parametrize("target", ["store", "tasks", "replay"])
def test_fork_never_records_over_the_store_or_an_input(cli, store_copy, write_jsonl, replay_file, target):
    tasks = write_jsonl([{"id": "t1", "prompt": "What is 1 + 1?", "answer": "2"}])
    replay = replay_file([{"response": {"text": "Final: 2"}}])
    record = {"store": store_copy, "tasks": tasks, "replay": replay}[target]
    before = {p: digest(p) for p in (store_copy, tasks, replay)}
    result = cli("fork", tasks, "--model", f"replay:{replay}", "--record", record, "--db", store_copy)
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: refusing to write {record}: it is the")
    assert {p: digest(p) for p in before} == before


def test_db_migrate_and_fork_still_create_a_store(cli, tmp_path, write_jsonl, replay_file):
    assert cli("db", "migrate", "--db", tmp_path / "a.duckdb").exit_code == 0
    assert (tmp_path / "a.duckdb").is_file()
    tasks = write_jsonl([{"id": "t1", "prompt": "What is 1 + 1?", "answer": "2"}])
    replay = replay_file([{"response": {"text": "Final: 2"}}])
    result = cli("fork", tasks, "--model", f"replay:{replay}", "-n", "1", "--db", tmp_path / "b.duckdb", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["branches"] == 1
