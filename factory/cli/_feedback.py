"""``factory feedback``: turn- and span-level feedback on branches (add, import, propose, list, decide)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from factory.cli._options import db_option, dump_json, json_option, resolve_db

if TYPE_CHECKING:
    from factory.store import FeedbackRecord

__all__ = ["feedback"]

_POLARITIES = click.Choice(["positive", "neutral", "negative"])


def _span(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    from factory.feedback import parse_span

    try:
        return parse_span(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _line(record: FeedbackRecord) -> str:
    rules = ",".join(f["rule"] for f in (record.evidence or {}).get("findings", []))
    hint = f"  hint: {record.hint}" if record.hint else ""
    return (f"{record.feedback_id}  {record.status:<8} {record.source:<8} {record.polarity:<8} "
            f"{record.task_id}/{record.branch_index} {record.target()}" + (f"  [{rules}]" if rules else "") + hint)


@click.group()
def feedback() -> None:
    """Turn- and span-level feedback on branches: polarities and hints for the hints and spans exports.

    \b
    A turn is an assistant message, counted from 0 (turn t has t assistant
    messages before it); a span is a message range A:B, [A, B). Proposals
    (factory feedback propose) wait for accept, reject or override; people's
    feedback (add, import) is accepted as given. Only accepted feedback is
    exported (factory export hints|spans).
    """


@feedback.command()
@click.argument("run_id")
@click.argument("task_id")
@click.argument("branch", type=click.IntRange(min=0))
@click.option("--turn", type=click.IntRange(min=0), default=None, help="The assistant turn (from 0).")
@click.option("--span", callback=_span, default=None, metavar="A:B", help="A message range [A, B) instead.")
@click.option("--polarity", type=_POLARITIES, required=True, help="What a trainer does with it.")
@click.option("--hint", default=None, help="A corrective hint for the turn (what a teacher is shown).")
@click.option("--note", default=None, help="A note for people.")
@db_option
def add(run_id: str, task_id: str, branch: int, turn: int | None, span: tuple[int, int] | None, polarity: str,
        hint: str | None, note: str | None, db: Path | None) -> None:
    """Add your feedback on one turn or span of a branch (source user, accepted)."""
    from factory.feedback import add_feedback
    from factory.store import Store

    with Store.open(resolve_db(db)) as store:
        record = add_feedback(store, run_id, task_id, branch, turn=turn, span=span, polarity=polarity, hint=hint,
                              note=note)
    click.echo(_line(record))


@feedback.command(name="import")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@db_option
def import_(file: Path, db: Path | None) -> None:
    """Import feedback from a JSONL file, all or nothing.

    \b
    One object a line: run_id, task_id, branch_index, turn (int) or span
    ("A:B" or [A, B]), polarity; optional hint, note, source (user), status
    (accepted). Every bad line is reported as FILE:LINE: field 'NAME' and
    nothing is written until all are good; importing again changes nothing.
    """
    from factory.feedback import import_feedback
    from factory.store import Store

    with Store.open(resolve_db(db)) as store:
        records = import_feedback(store, file)
    click.echo(f"imported {len(records)} feedback row(s) from {file}")


@feedback.command()
@click.argument("run_id")
@click.option("--task", "task_id", default=None, help="Only this task's branches.")
@click.option("--teacher", default=None, metavar="MODEL",
              help="A model (as --model takes: anthropic:..., openai:..., local, replay:FILE) that writes the "
                   "hints of the negative proposals from the trajectory and the verifier's details.")
@db_option
@json_option
def propose(run_id: str, task_id: str | None, teacher: str | None, db: Path | None, as_json: bool) -> None:
    """Propose feedback from the run's trajectories and verdicts (status proposed).

    \b
    Rules: the turn whose test run first failed (with the failing assertion),
    tool errors, the behaviour monitor's hack evidence and detected tampering
    (negative, source verifier); the last edit of a branch whose tests failed;
    the turns of a clean passing branch that wrote the final fix (positive).
    Proposing again rewrites only rows still proposed.
    """
    from factory.feedback import propose_feedback
    from factory.store import Store

    with Store.open(resolve_db(db)) as store:
        result = propose_feedback(store, run_id, task_id=task_id, teacher=teacher)
    if as_json:
        click.echo(dump_json({"run_id": run_id, "branches": result.branches, "written": len(result.written),
                              "new": result.new, "kept": result.kept,
                              "proposals": [r.model_dump(mode="json") for r in result.written]}))
        return
    for record in result.written:
        click.echo(_line(record))
    click.echo(f"{len(result.written)} proposal(s) from {result.branches} branch(es): {result.new} new, "
               f"{len(result.written) - result.new} refreshed, {result.kept} already decided (kept)")


@feedback.command(name="list")
@click.argument("run_id")
@click.option("--task", "task_id", default=None, help="Only this task's feedback.")
@click.option("--status", type=click.Choice(["proposed", "accepted", "rejected"]), default=None,
              help="Only rows with this status.")
@db_option
@json_option
def list_(run_id: str, task_id: str | None, status: str | None, db: Path | None, as_json: bool) -> None:
    """List a run's feedback, by branch and turn."""
    from factory.feedback import list_feedback
    from factory.store import Store

    with Store.open(resolve_db(db), read_only=True) as store:
        records = list_feedback(store, run_id, task_id=task_id, status=status)
    if as_json:
        click.echo(dump_json([r.model_dump(mode="json") for r in records]))
    elif not records:
        click.echo(f"no feedback on run {run_id} (add some: factory feedback add, import or propose)")
    else:
        for record in records:
            click.echo(_line(record))


def _decide(ids: tuple[str, ...], db: Path | None, status: str) -> None:
    from factory.feedback import set_feedback_status
    from factory.store import Store

    with Store.open(resolve_db(db)) as store:
        records = set_feedback_status(store, ids, status)
    for record in records:
        click.echo(_line(record))


@feedback.command()
@click.argument("ids", nargs=-1, required=True)
@db_option
def accept(ids: tuple[str, ...], db: Path | None) -> None:
    """Accept feedback rows by id (all or none: an unknown id changes nothing)."""
    _decide(ids, db, "accepted")


@feedback.command()
@click.argument("ids", nargs=-1, required=True)
@db_option
def reject(ids: tuple[str, ...], db: Path | None) -> None:
    """Reject feedback rows by id (all or none: an unknown id changes nothing)."""
    _decide(ids, db, "rejected")


@feedback.command()
@click.argument("feedback_id")
@click.option("--polarity", type=_POLARITIES, default=None, help="The corrected polarity.")
@click.option("--hint", default=None, help="The corrected hint ('' removes it).")
@click.option("--note", default=None, help="A note for people ('' removes it).")
@db_option
def override(feedback_id: str, polarity: str | None, hint: str | None, note: str | None, db: Path | None) -> None:
    """Correct a row's polarity, hint or note; it is accepted, and what it replaced kept in its evidence."""
    from factory.feedback import override_feedback
    from factory.store import Store

    with Store.open(resolve_db(db)) as store:
        record = override_feedback(store, feedback_id, polarity=polarity, hint=hint, note=note)
    click.echo(_line(record))
