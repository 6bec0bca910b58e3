"""``factory query`` is a door that cannot write: every class of statement that could is refused.

Each refused statement exits 2 with one ``error:`` line, and afterwards the
store's bytes, a second store's bytes and the folder's listing are exactly
what they were: no statement wrote to the store, to another file or to
another database.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from factory.errors import QueryError
from factory.store import Store, utc_now


def _fill(path: Path) -> Path:
    with Store.open(path) as store:
        store.write_run({"run_id": "r1", "created_at": utc_now(), "status": "finished", "model": "replay:a",
                         "n_branches": 2})
        store.write_branches(
            [{"run_id": "r1", "task_id": "t1", "branch_index": i, "session_id": f"s{i}", "status": "ok"}
             for i in range(2)],
            [{"run_id": "r1", "task_id": "t1", "branch_index": i, "seq": 0, "ts": utc_now(),
              "kind": "model_call", "payload": {"i": i}} for i in range(2)],
        )
    return path


@pytest.fixture(scope="module")
def filled_store(tmp_path_factory) -> Path:
    return _fill(tmp_path_factory.mktemp("query-door") / "store.duckdb")


@pytest.fixture
def folder(tmp_path, monkeypatch, filled_store) -> Path:
    """A folder holding the store, a second store and a CSV file; relative paths in SQL land here."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copyfile(filled_store, work / "store.duckdb")
    shutil.copyfile(filled_store, work / "other.duckdb")
    (work / "data.csv").write_text("x\n1\n")
    monkeypatch.chdir(work)
    return work


def _state(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (recursively) by relative path, with the sha256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


WRITES = {
    # DDL
    "create table": "CREATE TABLE t (x INTEGER)",
    "create table as": "CREATE TABLE t AS SELECT * FROM branches",
    "create temp table": "CREATE TEMP TABLE t AS SELECT 1 AS x",
    "create view": "CREATE VIEW v AS SELECT 1 AS x",
    "create macro": "CREATE MACRO m(x) AS x + 1",
    "create sequence": "CREATE SEQUENCE s",
    "drop table": "DROP TABLE branches",
    "alter table": "ALTER TABLE branches ADD COLUMN y INTEGER",
    # DML
    "insert": "INSERT INTO runs (run_id, created_at) VALUES ('x', now())",
    "update": "UPDATE branches SET status = 'error'",
    "delete": "DELETE FROM branches",
    "truncate": "TRUNCATE branches",
    "delete in a transaction": "BEGIN; DELETE FROM branches; COMMIT",
    # COPY and EXPORT: files anywhere, the store itself included
    "copy over the store": "COPY (SELECT 42 AS x) TO 'store.duckdb' (FORMAT csv)",
    "copy to a file": "COPY branches TO 'dump.csv'",
    "copy to parquet": "COPY (SELECT 1 AS x) TO 'dump.parquet' (FORMAT parquet)",
    "copy from a file": "COPY runs FROM 'data.csv'",
    "export database": "EXPORT DATABASE 'dump'",
    "import database": "IMPORT DATABASE 'dump'",
    # other databases
    "attach read-write and delete": "ATTACH 'other.duckdb' AS o (READ_WRITE); DELETE FROM o.branches",
    "attach a new file": "ATTACH 'new.duckdb' AS n",
    "attach in memory": "ATTACH ':memory:' AS m",
    "detach": "DETACH store",
    "use": "USE other",
    # extensions
    "install": "INSTALL httpfs",
    "force install": "FORCE INSTALL json",
    "load": "LOAD httpfs",
    "load a built-in": "LOAD json",
    # settings that would re-open access
    "set external access": "SET enable_external_access = true",
    "set global external access": "SET GLOBAL enable_external_access = true",
    "reset external access": "RESET enable_external_access",
    "unlock configuration": "SET lock_configuration = false",
    "pragma external access": "PRAGMA enable_external_access = true",
    "pragma": "PRAGMA show_tables",
    "set temp directory": "SET temp_directory = 'spill'",
    "profiling output": "PRAGMA profiling_output = 'profile.json'",
    # maintenance and calls
    "checkpoint": "CHECKPOINT",
    "vacuum": "VACUUM",
    "call": "CALL checkpoint()",
    "create secret": "CREATE SECRET s (TYPE s3, KEY_ID 'k', SECRET 's')",
    # a write hidden behind a read
    "select then copy": "SELECT 1; COPY branches TO 'dump.csv'",
}


@pytest.mark.parametrize("sql", list(WRITES.values()), ids=list(WRITES))
def test_a_writing_statement_is_refused_and_changes_nothing(cli, folder, sql):
    before = _state(folder)
    result = cli("query", sql, "--db", folder / "store.duckdb")
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and len(result.output.strip().splitlines()) == 1, result.output
    assert _state(folder) == before  # the store, the other store, and no new file


READS_OUTSIDE = {
    "read_csv": "SELECT * FROM read_csv('data.csv')",
    "a file as a table": "SELECT * FROM 'data.csv'",
    "another store": "SELECT * FROM 'other.duckdb'",
    "read_text": "SELECT * FROM read_text('/etc/hostname')",
    "glob": "SELECT * FROM glob('*')",
}


@pytest.mark.parametrize("sql", list(READS_OUTSIDE.values()), ids=list(READS_OUTSIDE))
def test_a_reading_statement_reaches_no_file_but_the_store(cli, folder, sql):
    """A SELECT passes the statement check; the sealed connection still keeps it to the store."""
    before = _state(folder)
    result = cli("query", sql, "--db", folder / "store.duckdb")
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and len(result.output.strip().splitlines()) == 1
    assert _state(folder) == before


def test_the_connection_is_sealed(cli, folder):
    """Read through the door itself: read-only, no external access, no extension autoload, settings locked."""
    result = cli("query", "SELECT name, value FROM duckdb_settings() WHERE name IN ('access_mode', "
                          "'enable_external_access', 'lock_configuration', 'autoinstall_known_extensions', "
                          "'autoload_known_extensions', 'python_enable_replacements') ORDER BY name",
                 "--db", folder / "store.duckdb", "--format", "csv")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1:] == [
        "access_mode,read_only", "autoinstall_known_extensions,false", "autoload_known_extensions,false",
        "enable_external_access,false", "lock_configuration,true", "python_enable_replacements,false"]


@pytest.mark.parametrize("sql", [
    "SELECT count(*) AS n FROM branches",
    "WITH b AS (SELECT * FROM branches) SELECT count(*) AS n FROM b",
    "FROM branches SELECT count(*) AS n",
    "SELECT 1 AS n; SELECT count(*) AS n FROM branches",
])
def test_reading_the_store_still_works(cli, folder, sql):
    before = _state(folder)
    result = cli("query", sql, "--db", folder / "store.duckdb", "--format", "csv")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["n", "2"]
    for describe in ("DESCRIBE branches", "SHOW TABLES", "SUMMARIZE branches"):
        assert cli("query", describe, "--db", folder / "store.duckdb").exit_code == 0
    assert _state(folder) == before


def test_the_python_door_refuses_writes_on_a_writable_store_too(folder):
    """``Store.query`` checks the statements whatever the store was opened for."""
    with Store.open(folder / "store.duckdb") as store:
        with pytest.raises(QueryError, match="read-only: DELETE refused"):
            store.query("SELECT 1; DELETE FROM branches")
        with pytest.raises(QueryError, match="COPY refused"):
            store.query("COPY branches TO 'dump.csv'")
        assert store.branches("r1").height == 2
    assert not (folder / "dump.csv").exists()
