"""DuckDB store: schema, migrations, idempotent writes, Polars reads, and every SQL statement the stages run."""

from factory.store._migrations import MIGRATIONS, Migration, applied_migrations, migrate
from factory.store._store import Store, utc_now

__all__ = [
    "MIGRATIONS",
    "Migration",
    "Store",
    "applied_migrations",
    "migrate",
    "utc_now",
]
