"""``factory tasks``: inspect and validate task files."""

from __future__ import annotations

from pathlib import Path

import click

from factory.cli._options import FiniteFloat, dump_json, json_option

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


@tasks.command()
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--solutions", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help='Reference solutions, JSONL: {"id": TASK_ID, "files": {PATH: TEXT}} a line; they take '
                   "precedence over the tasks' own `solution` fields.")
@click.option("--sandbox", default="bwrap", show_default=True, help="Sandbox backend both verifications use.")
@click.option("--timeout", "timeout_s", type=FiniteFloat(min=0, min_open=True), default=120.0, show_default=True,
              help="Wall-clock limit of each test run, in seconds.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Tasks checked at once.")
@json_option
def check(file: Path, solutions: Path | None, sandbox: str, timeout_s: float, jobs: int, as_json: bool) -> None:
    """Verify each task's reference solution isolated and bare, and list the tasks where the two differ.

    Isolated is the default verification a fork uses (the solution in its own sandbox, behind the
    boundary); bare runs pytest and the solution in one process. A task whose honest solution passes
    bare but fails isolated has a test the boundary cannot carry: its correct branches would be
    labelled failures. Tasks whose reference solution fails either way are listed too. Exits 1 when
    any task differs, fails or could not be verified; tasks without a reference solution are skipped.
    """
    import asyncio

    from factory.errors import ConfigError
    from factory.sandbox import sandbox_names
    from factory.tasks import load_tasks
    from factory.verifiers import CHECK_KINDS, check_tasks, load_solutions

    if sandbox not in sandbox_names():
        raise ConfigError(f"--sandbox: unknown sandbox '{sandbox}' (choose from: {', '.join(sandbox_names())})")
    task_set = load_tasks(file)
    given = load_solutions(solutions, task_set.tasks) if solutions is not None else {}
    if not given and not any(task.solution for task in task_set):
        raise ConfigError(f"no task in {file} has a reference solution: add a `solution` field (path -> text) "
                          "to the tasks, or give --solutions FILE")
    checks = asyncio.run(check_tasks(task_set, given, sandbox=sandbox, timeout_s=timeout_s,
                                     solutions_source=str(solutions), jobs=jobs))
    counts = {kind: sum(c.kind == kind for c in checks) for kind in CHECK_KINDS}
    if as_json:
        click.echo(dump_json({"path": str(file), "sandbox": sandbox, "counts": counts,
                              "tasks": [{**c.to_dict(), "line": task_set.lines[c.task_id]} for c in checks]}))
    else:
        for c in checks:
            click.echo(f"{file}:{task_set.lines[c.task_id]}: {c.task_id}  {c.kind}: {CHECK_KINDS[c.kind]}" + (
                f" (isolated {c.isolated.describe()}, bare {c.bare.describe()})" if c.isolated and c.bare else ""))
            for d in c.differences:
                why = f": {d.why}" if d.why else ""
                click.echo(f"    {d.test}: isolated {d.isolated}{why}; bare {d.bare}")
            for b in (c.isolated.boundary if c.isolated and c.kind == "fails" else []):
                click.echo(f"    {b['test']}: could not cross: {b['what']}")
        click.echo(", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in counts.items() if n)
                   + f"; {len(checks)} task(s) in {file}")
    if any(c.problem for c in checks):
        raise SystemExit(1)
