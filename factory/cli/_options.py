"""Options and output shared by several commands."""

from __future__ import annotations

import contextlib
import json
import math
import os
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
    "FiniteFloat",
    "base_url_option",
    "check_writable",
    "db_option",
    "dump_json",
    "json_option",
    "memory_backend_option",
    "render_frame",
    "request_timeout_option",
    "resolve_db",
    "warnings_shown",
]


class FiniteFloat(click.FloatRange):
    """A number in a range that is also finite.

    click's own range lets ``nan`` through (every comparison with it is
    false) and ``inf`` wherever a side is open-ended; a timeout of ``nan`` or
    a penalty of ``inf`` is never what a user meant.
    """

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def _base_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from factory.errors import ModelConfigError
    from factory.models import check_base_url

    try:
        return check_base_url(value)
    except ModelConfigError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


base_url_option = click.option(
    "--base-url", default=None, callback=_base_url,
    help="Server URL for openai:/anthropic: (any OpenAI-compatible server), with its scheme: http://HOST:PORT/v1.")

#: The default is ``factory.models.DEFAULT_REQUEST_TIMEOUT_S``, written out so that ``--help`` imports no model code.
request_timeout_option = click.option(
    "--request-timeout", "request_timeout_s", type=FiniteFloat(min=0, min_open=True), default=60.0,
    show_default=True, metavar="SECONDS",
    help="Longest one call to a model server (openai:, anthropic:) may take; past it the call is abandoned and "
         "retried, and a branch whose retries run out is an infrastructure failure.")

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


def check_writable(folder: Path, flag: str) -> None:
    """Refuse, before any work, a ``folder`` that output cannot be written in (or created in).

    The nearest folder that exists must be a writable folder: otherwise the
    command would fail at its very end, after the work, on its first write.

    Raises:
        ConfigError: Naming ``flag``, the folder and why (a read-only file system, or permissions).
    """
    from factory.errors import ConfigError

    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{flag}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        why = "it is on a read-only file system" if read_only else "permission denied"
        raise ConfigError(f"{flag}: cannot write in {existing}: {why}")


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
