"""``factory tasks``: inspect and validate task files."""

from __future__ import annotations

from pathlib import Path

import click

from factory.cli._options import dump_json, json_option

__all__ = ["tasks"]


@click.group()
def tasks() -> None:
    """Inspect and validate task files (JSONL or YAML)."""


@tasks.command()
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@json_option
def validate(file: Path, as_json: bool) -> None:
    """Check FILE and print, per task, the verifiers that apply.

    Every problem is reported as FILE:LINE: field 'NAME': message, and the
    command exits with status 2 if there is any.
    """
    from factory.tasks import load_tasks

    task_set = load_tasks(file)
    if as_json:
        click.echo(dump_json({
            "path": str(file),
            "dataset_hash": task_set.dataset_hash,
            "tasks": [
                {"id": t.id, "line": task_set.lines[t.id], "verifiers": list(t.verifiers)} for t in task_set
            ],
        }))
        return
    width = max(len(t.id) for t in task_set)
    for task in task_set:
        verifiers = ", ".join(task.verifiers) or "(none: only judged by ranking)"
        click.echo(f"{file}:{task_set.lines[task.id]}: {task.id:<{width}}  {verifiers}")
    click.echo(f"{len(task_set)} task(s) valid; dataset {task_set.dataset_hash}")
