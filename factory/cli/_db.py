"""``factory db``: create, upgrade and describe the store."""

from __future__ import annotations

from pathlib import Path

import click

from factory.cli._options import db_option, dump_json, json_option

__all__ = ["db"]


@click.group()
def db() -> None:
    """Create, upgrade and describe the DuckDB store."""


@db.command()
@db_option
@json_option
def migrate(db: Path | None, as_json: bool) -> None:
    """Create the store if needed and apply pending schema migrations."""
    from factory.cli._options import resolve_db
    from factory.store import Store

    path = resolve_db(db)
    existed = path.exists()
    with Store.open(path) as store:
        applied = store.migrations()
    if as_json:
        click.echo(dump_json({"db": str(path), "created": not existed, "migrations": applied}))
        return
    click.echo(f"{'opened' if existed else 'created'} {path}; schema at {applied[-1]} ({len(applied)} migrations)")


@db.command()
@db_option
@json_option
def info(db: Path | None, as_json: bool) -> None:
    """Show the store's path, size, applied migrations and row counts."""
    from factory.cli._options import resolve_db
    from factory.store import Store

    path = resolve_db(db)
    with Store.open(path, read_only=True) as store:
        counts = store.table_counts()
        migrations = store.migrations()
    summary = {"db": str(path), "bytes": path.stat().st_size, "migrations": migrations, "rows": counts}
    if as_json:
        click.echo(dump_json(summary))
        return
    click.echo(f"{path}  ({summary['bytes'] / 1e6:.1f} MB, schema {migrations[-1] if migrations else 'none'})")
    for table, count in counts.items():
        click.echo(f"  {table:<10} {count:>10,} rows")
