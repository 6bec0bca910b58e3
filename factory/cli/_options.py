"""Options and output shared by several commands."""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from collections.abc import Iterator
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    import polars as pl

__all__ = [
    "db_option",
    "dump_json",
    "json_option",
    "memory_backend_option",
    "render_frame",
    "resolve_db",
    "warnings_shown",
]

db_option = click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="DuckDB file [default: $FACTORY_DB or ./factory.duckdb].",
)

memory_backend_option = click.option(
    "--memory-backend", "backend_spec", default=None, metavar="SPEC",
    help="Where memories live: duckdb (default: the --db file) or lance[:DIR] (ANN index; the memory-ann extra).")

json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")


def resolve_db(db: Path | None) -> Path:
    """The store path: ``--db`` if given, else the environment default."""
    from factory.settings import default_db_path

    return db if db is not None else default_db_path()


@contextlib.contextmanager
def warnings_shown(category: type[Warning]) -> Iterator[None]:
    """Show each warning of ``category`` raised in the block as a yellow ``WARNING:`` line on stderr.

    The library warns with Python warnings; a user of the command needs the
    message, not the file and line Python's own form adds. Other warnings are
    shown as usual.
    """
    with warnings.catch_warnings():
        show = warnings.showwarning

        def shown(message: Warning | str, kind: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
            if issubclass(kind, category):
                click.secho(f"WARNING: {message}", fg="yellow", err=True)
            else:
                show(message, kind, filename, lineno, file, line)

        warnings.showwarning = shown
        warnings.simplefilter("always", category)
        yield


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return str(value)


def dump_json(data: Any, *, indent: int | None = 2) -> str:
    """JSON text for ``--json`` output (datetimes as ISO 8601)."""
    return json.dumps(data, indent=indent, ensure_ascii=False, default=_json_default)


def render_frame(frame: pl.DataFrame, fmt: str, *, title: str | None = None) -> None:
    """Print a frame as a table, CSV or a JSON array of objects."""
    import polars as pl

    if fmt == "json":
        click.echo(dump_json(frame.to_dicts()))
        return
    if fmt == "csv":
        nested = [name for name, dtype in frame.schema.items() if dtype.is_nested()]
        flat = frame.with_columns(
            pl.col(name).map_elements(
                lambda v: dump_json(v.to_list() if isinstance(v, pl.Series) else v, indent=None),
                return_dtype=pl.String,
            )
            for name in nested
        )
        click.echo(flat.write_csv(), nl=False)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for name in frame.columns:
        table.add_column(name, overflow="fold")
    for row in frame.iter_rows():
        table.add_row(*("" if value is None else str(value) for value in row))
    # Piped output is not wrapped to 80 columns: a script or pager gets whole rows.
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 100_000)
    console.print(table)
    click.echo(f"({frame.height} row{'s' if frame.height != 1 else ''})")
