"""The DuckDB store: migrations, idempotent writes, locking, Polars reads."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import polars as pl
import pytest

import factory
from factory.errors import MigrationError, QueryError, StoreError, StoreLockedError, StoreNotFoundError
from factory.store import MIGRATIONS, Migration, Store, utc_now

TABLES = {"runs", "tasks", "branches", "events", "verdicts", "judgments", "rankings", "memory"}


def run_row(run_id: str = "r1", **extra) -> dict:
    return {"run_id": run_id, "created_at": utc_now(), "status": "running", "model": "replay:x", **extra}


def branch_row(index: int, task: str = "t1", run_id: str = "r1", **extra) -> dict:
    return {
        "run_id": run_id, "task_id": task, "branch_index": index,
        "session_id": f"{run_id}-b{index}-0000", "status": "ok",
        "trajectory": [{"role": "assistant", "content": f"answer {index}"}],
        "usage": {"input_tokens": 10, "output_tokens": 5}, "started_at": utc_now(), **extra,
    }


def event_rows(index: int, count: int, task: str = "t1", run_id: str = "r1") -> list[dict]:
    return [
        {"run_id": run_id, "task_id": task, "branch_index": index, "seq": seq, "ts": utc_now(),
         "kind": "model_call", "payload": {"seq": seq, "text": "x" * seq}}
        for seq in range(count)
    ]


def test_blank_database_gets_every_migration_once(tmp_path):
    path = tmp_path / "blank.duckdb"
    with Store.open(path) as store:
        assert store.migrations() == [m.name for m in MIGRATIONS]
        assert set(store.tables()) >= TABLES
    with Store.open(path) as store:  # reopening applies nothing twice
        assert store.migrations() == [m.name for m in MIGRATIONS]
        ledger = store.query("SELECT count(*) AS n, count(DISTINCT name) AS d FROM factory_migrations").row(0)
        assert ledger == (len(MIGRATIONS), len(MIGRATIONS))


def test_database_written_by_previous_schema_is_upgraded_in_place(tmp_path):
    path = tmp_path / "old.duckdb"
    with Store.open(path, migrations=MIGRATIONS[:1]) as old:
        assert "verdicts" not in old.tables()
        old.write_run(run_row())
        old.write_branches([branch_row(0)], event_rows(0, 3))
    with Store.open(path) as store:
        assert store.migrations() == [m.name for m in MIGRATIONS]
        assert store.branches("r1").height == 1
        assert store.events("r1").height == 3
        store.write_verdicts([{
            "run_id": "r1", "task_id": "t1", "branch_index": 0, "verifier": "answer", "version": "1",
            "ok": True, "score": 1.0, "status": "pass", "details": {"code": "ok"}, "created_at": utc_now(),
        }])
        assert store.verdicts("r1")["status"].to_list() == ["pass"]


def test_database_from_a_newer_version_is_refused(tmp_path):
    path = tmp_path / "new.duckdb"
    Store.open(path).close()
    with pytest.raises(MigrationError, match="newer version"):
        Store.open(path, migrations=MIGRATIONS[:2])


def test_failing_migration_is_rolled_back(tmp_path):
    path = tmp_path / "bad.duckdb"
    broken = (*MIGRATIONS, Migration("0999_broken", "CREATE TABLE half (a INT); SELECT * FROM no_such_table;"))
    with pytest.raises(MigrationError, match="0999_broken failed"):
        Store.open(path, migrations=broken)
    with Store.open(path) as store:
        assert "half" not in store.tables()
        assert store.migrations()[-1] == MIGRATIONS[-1].name


def test_rewriting_a_branch_replaces_it_and_its_events(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        store.write_run(run_row())
        store.write_branches([branch_row(0), branch_row(1)], event_rows(0, 5) + event_rows(1, 4))
        store.write_branches([branch_row(0), branch_row(1)], event_rows(0, 5) + event_rows(1, 4))
        assert store.branches("r1").height == 2
        assert store.events("r1").height == 9
        # a resumed branch that ends differently: one row, only its new events
        store.write_branches([branch_row(0, status="error", error="sandbox died")], event_rows(0, 2))
        branches = store.branches("r1")
        assert branches.height == 2
        assert branches.filter(pl.col("branch_index") == 0)["error"].to_list() == ["sandbox died"]
        events = store.events("r1")
        assert events.filter(pl.col("branch_index") == 0)["seq"].to_list() == [0, 1]
        assert events.filter(pl.col("branch_index") == 1).height == 4


def test_idempotent_rewrites_of_every_keyed_table(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        for _ in range(3):
            store.write_run(run_row())
            store.write_tasks([{"run_id": "r1", "task_id": "t1", "task_hash": "sha256:1", "prompt": "p",
                                "verifiers": ["answer"], "spec": {"id": "t1"}}])
            store.write_verdicts([{"run_id": "r1", "task_id": "t1", "branch_index": 0, "verifier": "answer",
                                   "version": "1", "ok": False, "score": 0.0, "status": "fail",
                                   "created_at": utc_now()}])
            store.write_judgments([{"run_id": "r1", "task_id": "t1", "judge": "replay:j", "kind": "pairwise",
                                    "branch_a": 0, "branch_b": 1, "sample_index": 0, "swapped": False,
                                    "preference": "a", "status": "pass", "created_at": utc_now()}])
            store.write_rankings([{"run_id": "r1", "task_id": "t1", "branch_index": 0, "rank": 1,
                                   "strength": 0.7, "created_at": utc_now()}])
        counts = {t: store.query(f"SELECT count(*) FROM {t}").item() for t in
                  ("runs", "tasks", "verdicts", "judgments", "rankings")}
        assert counts == {"runs": 1, "tasks": 1, "verdicts": 1, "judgments": 1, "rankings": 1}
        # a new verifier version adds a row and keeps the old one
        store.write_verdicts([{"run_id": "r1", "task_id": "t1", "branch_index": 0, "verifier": "answer",
                               "version": "2", "ok": True, "score": 1.0, "status": "pass",
                               "created_at": utc_now()}])
        assert store.verdicts("r1")["version"].to_list() == ["1", "2"]


def test_failed_batch_writes_nothing(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        store.write_branches([branch_row(0)], event_rows(0, 3))
        bad_events = event_rows(1, 2) + [{"run_id": "r1", "task_id": "t1", "branch_index": 1, "seq": 9,
                                          "ts": utc_now(), "kind": None}]  # kind is NOT NULL
        with pytest.raises(StoreError, match="events"):
            store.write_branches([branch_row(1)], bad_events)
        assert store.branches("r1")["branch_index"].to_list() == [0]
        assert store.events("r1").height == 3


def test_unknown_column_is_a_clear_error(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store, pytest.raises(StoreError, match="no column.*colour"):
        store.write_run(run_row(colour="red"))


def test_reads_return_polars_frames_with_json_text(tmp_path):
    path = tmp_path / "s.duckdb"
    with factory.open(path) as store:
        store.write_run(run_row(config={"temperatures": [0.5, 0.7]}))
        store.write_branches([branch_row(0)], event_rows(0, 2))
    with factory.open(path, read_only=True) as store:
        branches = store.branches("r1")
        assert isinstance(branches, pl.DataFrame)
        assert branches["session_id"].to_list() == ["r1-b0-0000"]
        usage = json.loads(branches["usage"].item())
        assert usage == {"input_tokens": 10, "output_tokens": 5}
        assert store.run("r1")["status"] == "running"
        assert store.run("nope") is None
        summary = store.run_summaries().row(0, named=True)
        assert (summary["branches"], summary["events"], summary["errors"]) == (1, 2, 0)
        with pytest.raises(StoreError, match="read-only"):
            store.write_run(run_row("r2"))


def test_query_errors_are_one_line(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        with pytest.raises(QueryError) as info:
            store.query("SELEC 1")
        assert "\n" not in str(info.value) and "syntax error" in str(info.value)


def test_read_only_open_of_missing_file(tmp_path):
    with pytest.raises(StoreNotFoundError, match="no database at"):
        Store.open(tmp_path / "none.duckdb", read_only=True)
    with pytest.raises(StoreError, match="does not exist"):
        Store.open(tmp_path / "no-dir" / "x.duckdb")


def test_not_a_duckdb_file(tmp_path):
    path = tmp_path / "text.duckdb"
    path.write_text("hello, not a database\n" * 100)
    with pytest.raises(StoreError, match="cannot open"):
        Store.open(path)


def test_second_writer_gets_a_clear_error_and_data_survives(tmp_path):
    path = tmp_path / "locked.duckdb"
    with Store.open(path) as store:
        store.write_run(run_row())
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from factory.store import Store
            store = Store.open({str(path)!r})
            print("ready", flush=True)
            sys.stdin.readline()
            store.close()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreLockedError, match=rf"PID {holder.pid}"):
            Store.open(path)
    finally:
        holder.communicate("done\n", timeout=30)
    with Store.open(path, read_only=True) as store:
        assert store.runs()["run_id"].to_list() == ["r1"]


def test_default_path_comes_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FACTORY_DB", str(tmp_path / "env.duckdb"))
    with factory.open() as store:
        assert store.path == tmp_path / "env.duckdb"
    monkeypatch.delenv("FACTORY_DB")
    monkeypatch.chdir(tmp_path)
    with factory.open() as store:
        assert store.path == tmp_path / "factory.duckdb"
