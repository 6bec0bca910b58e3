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
@click.option("--timeout", "timeout_s", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Ceiling of each test run, in seconds (default: a fork's, with its inactivity window).")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Tasks checked at once.")
@json_option
def check(file: Path, solutions: Path | None, sandbox: str, timeout_s: float | None, jobs: int, as_json: bool) -> None:
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


@tasks.command("import")
@click.argument("fmt", metavar="FORMAT")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="Task file to write (JSONL), atomically; with any import problem nothing is written.")
@click.option("--map", "map_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="YAML map of columns to task fields (the `mapped` format).")
@click.option("--repos", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder of repository snapshots, <instance_id>/ or <instance_id>.tar.gz (the `swe` format; "
                   "default: repos/ beside SOURCE).")
@click.option("--split", default=None, help="Split of a saved DatasetDict folder.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Import only the first N rows.")
@click.option("--id-prefix", default=None, help="Ids of formats without one: PREFIX-<row> (default: the format).")
@click.option("--skip-invalid", is_flag=True,
              help="Leave out rows with problems (each reported) instead of failing the import.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Verify every reference solution (isolated and bare) and starter after writing.")
@click.option("--sandbox", default="bwrap", show_default=True, help="Sandbox backend of the check.")
@click.option("--timeout", "timeout_s", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Ceiling of each test run of the check, in seconds (default: a fork's, with its inactivity window).")
@click.option("--jobs", type=click.IntRange(min=1), default=2, show_default=True, help="Tasks checked at once.")
@json_option
def import_(fmt: str, source: Path, out: Path, map_file: Path | None, repos: Path | None, split: str | None,
            limit: int | None, id_prefix: str | None, skip_invalid: bool, check: bool, sandbox: str,
            timeout_s: float | None, jobs: int, as_json: bool) -> None:
    """Import a benchmark's rows from SOURCE as tasks in FORMAT's layout.

    FORMAT is humaneval, mbpp (tests tasks), gsm8k, math (answer tasks), swe (SWE-bench-style instances with
    repository snapshots) or mapped (any layout, with --map FILE.yaml). SOURCE is a JSONL (or .jsonl.gz),
    JSON, Parquet file or a saved `datasets` folder. Every task records the format and SOURCE's sha256;
    the same SOURCE gives the same tasks. Then, where tasks carry reference solutions, each reference is
    verified isolated and bare and each starter alone, as `factory tasks check` does: tasks whose reference
    does not pass, or whose starter already passes, are listed and the command exits 1 (the file is kept).
    Import problems (every one named by file, row and field) exit 2 and write nothing.
    """
    import asyncio

    from factory.errors import ConfigError
    from factory.sandbox import sandbox_names
    from factory.tasks import import_tasks, write_tasks

    if check and sandbox not in sandbox_names():
        raise ConfigError(f"--sandbox: unknown sandbox '{sandbox}' (choose from: {', '.join(sandbox_names())})")
    options = {key: value for key, value in (("map_file", map_file), ("repos", repos), ("id_prefix", id_prefix))
               if value is not None}
    report = import_tasks(fmt, source, skip_invalid=skip_invalid, split=split, limit=limit, **options)
    write_tasks(report.tasks, out)
    err = click.get_text_stream("stderr")
    if not as_json:
        click.echo(f"{source}: {len(report.tasks)} task(s) imported as {fmt} from {report.rows} row(s) "
                   f"({report.source_sha256[:19]}...) -> {out}; dataset {report.dataset_hash}")
        for skipped in report.skipped:
            for problem in skipped.problems:
                click.echo(f"skipped: {problem}")
    checkable = [task for task in report.tasks if task.all_tests]
    checks = []
    if check and checkable:  # tasks without a reference still get their starter checked
        from factory.verifiers import check_tasks

        checks = asyncio.run(_check_with_progress(check_tasks, checkable, sandbox, timeout_s, jobs, err))
    summary = _check_summary(checks)
    if as_json:
        click.echo(dump_json({**report.to_dict(), "out": str(out), "checked": bool(checks), "check": summary,
                              "tasks": [{**c.to_dict(), "problem": c.problem} for c in checks]}))
    elif checks:
        for c in checks:
            if c.kind not in ("same", "no_solution"):
                detail = f" (isolated {c.isolated.describe()}, bare {c.bare.describe()})" if c.isolated else ""
                reason = c.isolated.reason if c.isolated and c.isolated.reason else None
                click.echo(f"{out}: {c.task_id}  reference {c.kind}{detail}" + (f": {reason}" if reason else ""))
            if c.starter is not None and c.starter.status != "fail":
                click.echo(f"{out}: {c.task_id}  starter {c.starter.describe()}: "
                           + ("the starter files already pass" if c.starter_passes else "could not be verified"))
        click.echo(", ".join(f"{key.replace('_', ' ')} {value}" for key, value in summary.items())
                   + f"; {len(checks)} task(s) checked on {sandbox}")
    elif check and not as_json:
        click.echo("no task has tests: nothing to check (answer tasks are checked by validation alone)")
    if any(c.problem for c in checks):
        raise SystemExit(1)


async def _check_with_progress(check_tasks, tasks, sandbox: str, timeout_s: float | None, jobs: int, err) -> list:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=err)
    with Progress(TextColumn("check"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  disable=not err.isatty()) as progress:
        bar = progress.add_task("check", total=len(tasks))
        return await check_tasks(tasks, sandbox=sandbox, timeout_s=timeout_s, jobs=jobs, starter=True,
                                 on_done=lambda _: progress.update(bar, advance=1))


def _check_summary(checks: list) -> dict[str, int]:
    return {
        "reference_pass": sum(c.kind == "same" for c in checks),
        "reference_differs": sum(c.kind == "differs" for c in checks),
        "reference_fail": sum(c.kind == "fails" for c in checks),
        "reference_error": sum(c.kind == "error" for c in checks),
        "no_reference": sum(c.kind == "no_solution" for c in checks),
        "starter_fail": sum(c.starter is not None and c.starter.status == "fail" for c in checks),
        "starter_pass": sum(c.starter_passes for c in checks),
        "starter_error": sum(c.starter is not None and c.starter.status == "error" for c in checks),
    }
