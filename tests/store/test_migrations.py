"""Schema migrations on a bare DuckDB connection: applied once, in order, recorded, and refused when unknown."""

from __future__ import annotations

import duckdb
import pytest

from factory.errors import MigrationError
from factory.store import MIGRATIONS, Migration, applied_migrations, migrate

STEPS = (
    Migration("0001_items", "CREATE TABLE items (id INTEGER PRIMARY KEY, name VARCHAR)"),
    Migration("0002_item_size", "ALTER TABLE items ADD COLUMN size INTEGER"),
)


@pytest.fixture
def con(tmp_path):
    connection = duckdb.connect(str(tmp_path / "m.duckdb"))
    yield connection
    connection.close()


def columns(con, table: str) -> list[str]:
    return [row[0] for row in con.execute(f"SELECT column_name FROM (DESCRIBE {table})").fetchall()]


def test_a_blank_database_has_no_migrations(con):
    assert applied_migrations(con) == []


def test_pending_migrations_are_applied_in_order_and_recorded(con):
    assert migrate(con, STEPS[:1]) == ["0001_items"]
    assert applied_migrations(con) == ["0001_items"]
    assert migrate(con, STEPS) == ["0002_item_size"]
    assert applied_migrations(con) == ["0001_items", "0002_item_size"]
    assert columns(con, "items") == ["id", "name", "size"]
    assert migrate(con, STEPS) == []  # idempotent
    ledger = con.execute("SELECT seq, name, applied_at IS NOT NULL FROM factory_migrations ORDER BY seq").fetchall()
    assert ledger == [(1, "0001_items", True), (2, "0002_item_size", True)]


def test_a_database_from_a_newer_factory_is_refused(con):
    migrate(con, STEPS)
    with pytest.raises(MigrationError, match=r"does not know \(0002_item_size\).*upgrade factory"):
        migrate(con, STEPS[:1])


def test_reordered_history_is_refused(con):
    migrate(con, STEPS)
    with pytest.raises(MigrationError, match="reordered"):
        migrate(con, (STEPS[1], STEPS[0]))


def test_a_failing_migration_is_rolled_back_and_not_recorded(con):
    broken = (*STEPS, Migration("0003_broken", "ALTER TABLE items ADD COLUMN extra INTEGER; SELECT * FROM nowhere"))
    with pytest.raises(MigrationError, match="migration 0003_broken failed"):
        migrate(con, broken)
    assert applied_migrations(con) == ["0001_items", "0002_item_size"]
    assert "extra" not in columns(con, "items")


def test_the_shipped_migrations_build_the_schema_on_a_bare_connection(con):
    assert migrate(con) == [m.name for m in MIGRATIONS]
    assert applied_migrations(con) == [m.name for m in MIGRATIONS]
    tables = {row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert {"runs", "branches", "factory_migrations"} <= tables


def test_shipped_migration_names_are_unique_and_numbered_in_order():
    names = [m.name for m in MIGRATIONS]
    assert len(set(names)) == len(names)
    numbers = [int(name.split("_", 1)[0]) for name in names]
    assert numbers == sorted(numbers) and all(len(name.split("_", 1)[0]) == 4 for name in names)
