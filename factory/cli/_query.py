"""``factory query`` and ``factory runs``: read the store."""

from __future__ import annotations

from pathlib import Path

import click

from factory.cli._options import db_option, dump_json, json_option, render_frame, resolve_db

__all__ = ["query", "runs"]


@click.command()
@click.argument("sql")
@db_option
@click.option(
    "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
    help="Output format.",
)
def query(sql: str, db: Path | None, fmt: str) -> None:
    """Run reading SQL against the store and print the last statement's rows.

    \b
    Allowed: SELECT in all its forms (WITH, FROM-first, VALUES), DESCRIBE,
    SHOW and SUMMARIZE, on the store's tables. Every other statement (CREATE,
    INSERT, UPDATE, DELETE, COPY, EXPORT, ATTACH, INSTALL, LOAD, SET, PRAGMA,
    CALL...) is refused before any statement runs (exit 2). The store is
    opened read-only with external access off and its settings locked, so no
    query reads or writes any other file (read_csv, COPY TO) or database.

    Tables: runs, tasks, branches, events, verdicts, judgments, rankings,
    memory. Example: factory query "SELECT status, count(*) FROM branches GROUP BY 1"
    """
    from factory.store import Store

    with Store.open(resolve_db(db), read_only=True) as store:
        frame = store.query(sql)
    render_frame(frame, fmt)


@click.command()
@db_option
@click.option("--compare", nargs=2, metavar="RUN_A RUN_B", default=None,
              help="Instead: compare two runs' final-answer lengths and verifier scores; say whether RUN_B drifted.")
@json_option
def runs(db: Path | None, compare: tuple[str, str] | None, as_json: bool) -> None:
    """List runs, newest first, with task, branch, error and event counts (or --compare two of them)."""
    from factory.store import Store

    if compare:
        from factory.cli._compare import compare_command

        compare_command(db, compare[0], compare[1], as_json)
        return

    with Store.open(resolve_db(db), read_only=True) as store:
        frame = store.run_summaries()
    if as_json:
        click.echo(dump_json(frame.to_dicts()))
    elif frame.height == 0:
        click.echo("no runs yet")
    else:
        render_frame(frame, "table")
