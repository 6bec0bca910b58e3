"""``factory verify``: re-verify a stored run, run golden sets, calibrate the judge."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from factory.cli._options import (
    FiniteFloat,
    db_option,
    dump_json,
    json_option,
    request_timeout_option,
    resolve_db,
    warnings_shown,
)

__all__ = ["verify"]


class _DefaultToRun(click.Group):
    """``factory verify RUN`` means ``factory verify run RUN``; subcommands keep their names."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().resolve_command(ctx, args)


@click.group(cls=_DefaultToRun)
def verify() -> None:
    """Verify stored branches again, check verifiers on golden sets, calibrate the judge.

    factory verify RUN [--verifier NAME] re-verifies a run (same as `verify run RUN`).
    """


def _pipeline(verifiers: tuple[str, ...], judge_spec: str | None, samples: int, sandbox: str, policy: str | None,
              hack_penalty: float = 0.4, *, request_timeout_s: float, planner_spec: str | None = None,
              artifact_dir: Path | None = None):
    from factory.errors import ConfigError
    from factory.sandbox import sandbox_names
    from factory.verifiers import VERIFIERS, JudgeSameAsPolicyWarning, build_pipeline, is_objective, verifier_names

    for name in verifiers:  # an unknown name would select nothing, and the command would report success
        if name not in verifier_names():
            raise ConfigError(f"--verifier {name}: unknown verifier (choose from: {', '.join(verifier_names())})")
        if not is_objective(name) and not judge_spec:
            raise ConfigError(f"--verifier {name}: an opinion needs its model: give --judge MODEL")
        if getattr(VERIFIERS.get(name), "needs_model", False) and not judge_spec:
            raise ConfigError(f"--verifier {name}: it asks a judge model: give --judge MODEL")
    if sandbox not in sandbox_names():
        raise ConfigError(f"--sandbox {sandbox}: unknown sandbox (choose from: {', '.join(sandbox_names())})")
    with warnings_shown(JudgeSameAsPolicyWarning):
        pipeline = build_pipeline(sandbox, policy_spec=policy, judge_spec=judge_spec, judge_samples=samples,
                                  hack_penalty=hack_penalty, request_timeout_s=request_timeout_s,
                                  planner_spec=planner_spec, artifact_dir=artifact_dir)
    if verifiers:
        pipeline.only = frozenset(verifiers)
    return pipeline


@verify.command("run")
@click.argument("run_id")
@db_option
@click.option("--verifier", "verifiers", multiple=True, help="Only this verifier (repeatable) [default: all].")
@click.option("--judge", "judge_spec", default=None, help="Judge model, for tasks with a rubric.")
@click.option("--judge-samples", type=click.IntRange(min=1), default=3, show_default=True,
              help="Judge samples per branch.")
@click.option("--planner", "planner_spec", default=None,
              help="Planner model of the browser verifier (front-end tasks) [default: the judge].")
@click.option("--sandbox", default=None, help="Sandbox for verifiers that run code [default: the run's].")
@click.option("--hack-penalty", type=FiniteFloat(0, 1), default=0.4, show_default=True,
              help="Subtracted from the tests score when tampering is detected (floored at 0).")
@request_timeout_option
@json_option
def run_command(run_id: str, db: Path | None, verifiers: tuple[str, ...], judge_spec: str | None,
                judge_samples: int, planner_spec: str | None, sandbox: str | None, hack_penalty: float,
                request_timeout_s: float, as_json: bool) -> None:
    """Re-verify every branch of RUN_ID from its stored final workspace.

    A verifier whose version changed adds new verdict rows; the old ones stay.
    """
    from factory.errors import ConfigError
    from factory.store import Store
    from factory.verifiers import verify_stored_run

    with Store.open(resolve_db(db), create=False) as store:
        run = store.run(run_id)
        if run is None:
            raise ConfigError(f"no run {run_id} in {store.path}")
        pipeline = _pipeline(verifiers, judge_spec, judge_samples, sandbox or run["sandbox"] or "bwrap", run["model"],
                             hack_penalty, request_timeout_s=request_timeout_s, planner_spec=planner_spec,
                             artifact_dir=store.path.with_name(f"{store.path.stem}-artifacts"))
        async def go():
            try:
                return await verify_stored_run(store, run_id, pipeline, sandbox or run["sandbox"] or "bwrap")
            finally:
                await pipeline.aclose()

        result = asyncio.run(go())
    if as_json:
        click.echo(dump_json(result))
    else:
        click.echo(f"verified {result['branches']} branches of {run_id}: {result['verdicts']} verdicts, "
                   f"{result['passed']}/{result['verified']} pass objectively")


@verify.command()
@click.option("--verifier", "verifier_name", required=True, help="The verifier under test (e.g. tests, answer).")
@click.option("--correct", type=click.Path(path_type=Path, dir_okay=False, exists=True), required=True,
              help="JSONL of cases that must pass.")
@click.option("--exploits", type=click.Path(path_type=Path, dir_okay=False, exists=True), required=True,
              help="JSONL of exploit cases that must not pass.")
@click.option("--sandbox", default="bwrap", show_default=True, help="Sandbox for verifiers that run code.")
@click.option("--judge", "judge_spec", default=None,
              help="Judge model, for the browser verifier's golden sets (a replay: file keeps them offline).")
@click.option("--planner", "planner_spec", default=None, help="The browser verifier's planner [default: the judge].")
@json_option
def golden(verifier_name: str, correct: Path, exploits: Path, sandbox: str, judge_spec: str | None,
           planner_spec: str | None, as_json: bool) -> None:
    """Report false negatives (correct cases failing) and false positives (exploits passing).

    Exits with status 1 when there is any.
    """
    from factory.errors import ConfigError
    from factory.models import DEFAULT_REQUEST_TIMEOUT_S
    from factory.verifiers import is_objective, load_golden, run_golden, verifier_names

    if verifier_name in verifier_names() and not is_objective(verifier_name):
        raise ConfigError(f"--verifier {verifier_name}: golden sets check objective verifiers; "
                          "the judge is checked with `factory verify calibrate RUN`")
    pipeline = _pipeline((verifier_name,), judge_spec, 1, sandbox, None, request_timeout_s=DEFAULT_REQUEST_TIMEOUT_S,
                         planner_spec=planner_spec)
    report = asyncio.run(run_golden(verifier_name, pipeline, load_golden(correct), load_golden(exploits), sandbox))
    if as_json:
        click.echo(dump_json(report.to_dict()))
    else:
        click.echo(f"{verifier_name}: {report.correct} correct cases, {report.exploits} exploits")
        for case in report.caught:
            click.echo(f"  caught  {case['id']:<32} {case['why']}")
        for case in report.false_negatives:
            click.echo(f"  FALSE NEGATIVE {case['id']} (line {case['line']}): {case['status']}")
        for case in report.false_positives:
            click.echo(f"  FALSE POSITIVE {case['id']} (line {case['line']}): passed")
        click.echo(f"false negatives {len(report.false_negatives)}, false positives {len(report.false_positives)}")
    if not report.clean:
        raise SystemExit(1)


@verify.command()
@click.argument("run_id")
@db_option
@json_option
def calibrate(run_id: str, db: Path | None, as_json: bool) -> None:
    """Judge calibration for RUN_ID: AUC and Spearman against objective pass, self-agreement, swap consistency."""
    from factory.errors import ConfigError
    from factory.store import Store
    from factory.verifiers import calibrate_run

    with Store.open(resolve_db(db), read_only=True) as store:
        if store.run(run_id) is None:
            raise ConfigError(f"no run {run_id} in {store.path}")
        report = calibrate_run(store, run_id)
    if as_json:
        click.echo(dump_json(report))
        return

    def show(value):
        return "n/a" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)

    click.echo(f"calibration of {run_id}: {report['n_branches']} branches, "
               f"{report['n_objective_pass']} objective passes")
    click.echo(f"  judge AUC vs objective pass     {show(report['auc'])}")
    click.echo(f"  judge Spearman vs objective     {show(report['spearman'])}")
    for key, value in (report.get("self_agreement") or {}).items():
        click.echo(f"  self-agreement {key:<17} {show(value)}")
    click.echo(f"  swap inconsistency (pairwise)   {show(report['swap_inconsistency'])} "
               f"over {report['n_pairwise']} comparisons")
