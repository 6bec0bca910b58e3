"""``factory rank`` and ``factory power``: order branches, and say whether a difference is powered."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from factory.cli._options import (
    FiniteFloat,
    check_writable,
    db_option,
    dump_json,
    json_option,
    request_timeout_option,
    resolve_db,
)

__all__ = ["power", "rank"]

_plot_option = click.option("--plot", type=click.Path(path_type=Path, dir_okay=False), default=None,
                            help="Also write a PNG plot to FILE.")


@click.command()
@click.argument("run_id")
@db_option
@click.option("--judge-pairs", type=click.IntRange(min=0), default=0, show_default=True,
              help="Ask the judge to compare K pairs per task (both orders) before ranking.")
@click.option("--judge", "judge_spec", default=None, help="Judge model for --judge-pairs.")
@click.option("--bootstrap", type=click.IntRange(min=10), default=200, show_default=True,
              help="Bootstrap rounds for the strengths' confidence intervals.")
@request_timeout_option
@_plot_option
@json_option
def rank(run_id: str, db: Path | None, judge_pairs: int, judge_spec: str | None, bootstrap: int,
         request_timeout_s: float, plot: Path | None, as_json: bool) -> None:
    """Rank each task's branches of RUN_ID, store the ranking, and test what can be tested about it.

    Reward: objective 1.0 + judge 0.3 x score/10. Strengths: Bradley-Terry on the
    judge's pairwise comparisons within a task, or on the rewards when there are none.
    Evidence: whether the judge alone predicts the objective outcome (an order that is
    the objective outcome itself gets no test, and says so).
    """
    from factory.errors import ConfigError
    from factory.models import ModelOptions
    from factory.outputs import OutputFiles
    from factory.ranking import (
        RolloutRanker,
        boundary_limited,
        check_plot_file,
        excluded_branches,
        judge_pairwise,
        load_pairwise,
        load_records,
        plot_strengths,
    )
    from factory.store import Store

    if judge_pairs and not judge_spec:
        raise ConfigError("--judge-pairs needs --judge MODEL")
    path = resolve_db(db)
    outputs = OutputFiles({"the store (--db)": path}, "rank --plot")
    if plot is not None:  # before anything is stored: a plot that cannot be drawn fails the command unchanged
        outputs.check(plot)
        check_plot_file(plot)
        check_writable(plot.parent, "--plot")
    with Store.open(path, create=False) as store:
        if store.run(run_id) is None:
            raise ConfigError(f"no run {run_id} in {store.path}")
        if judge_pairs:
            judge_options = ModelOptions(timeout_s=request_timeout_s)
            asyncio.run(judge_pairwise(store, run_id, judge_spec, judge_pairs, judge_options))
        records = load_records(store, run_id)
        excluded = excluded_branches(store, run_id)  # infrastructure failures: not records, counted apart
        boundary = boundary_limited(records)
        result = RolloutRanker(bootstrap_rounds=bootstrap).rank(records, load_pairwise(store, run_id))
        with outputs:  # the plot lands once the ranking is stored, and is removed if storing it fails
            if plot is not None:
                plot_strengths([vars(r) for r in result.ranked], outputs.stage(plot),
                               f"run {run_id}: strengths within each task")
            store.replace_rankings(run_id, [r.row(run_id) for r in result.ranked])
        if plot is not None:  # in place now: recorded so `factory view` shows it with the ranking it drew
            from factory.cli._artifacts import record_with
            from factory.store import artifact_rows, utc_now

            record_with(store, f"the plot {plot}", lambda: artifact_rows(
                [run_id], "rank_plot", plot, _ranking_meta(result, bootstrap, excluded), created_at=utc_now()))
    if as_json:
        click.echo(dump_json({"run_id": run_id, **result.to_dict(), "excluded": excluded,
                              "boundary_limited": boundary, "plot": str(plot) if plot else None}))
        return
    _print_ranking(run_id, result)
    _print_boundary(boundary)
    _print_excluded(excluded)
    if plot is not None:
        click.echo(f"plot: {plot}")


def _ranking_meta(result, bootstrap: int, excluded: dict) -> dict:
    """What a rank plot's artifact row says of the ranking it drew: the summary `factory rank` prints."""
    tasks = {r.task_id for r in result.ranked}
    return {"branches": len(result.ranked), "tasks": len(tasks), "bootstrap": bootstrap,
            "infra_failures": excluded.get("infra_failures", 0), "stats": result.stats}


def _print_boundary(boundary: dict) -> None:
    """One line naming each task with boundary-limited branches (nothing when there are none)."""
    if not boundary["branches"]:
        return
    tasks = ", ".join(f"{task} {n}" for task, n in boundary["per_task"].items() if n)
    click.echo(f"boundary-limited: {boundary['branches']} branch(es) failed a test only because something could "
               f"not cross the isolation boundary ({tasks}); `factory tasks check TASKS` shows which tasks "
               "pass bare but not isolated")


def _print_excluded(excluded: dict) -> None:
    if excluded["infra_failures"]:
        click.echo(f"excluded: {excluded['infra_failures']} branch(es) as infrastructure failures "
                   f"({', '.join(excluded['reasons']) or 'no reason recorded'}): not outcomes, in no rate above")


def _print_ranking(run_id: str, result) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"ranking of {run_id}")
    for column in ("task", "rank", "branch", "reward", "strength [95% CI]", "objective", "hack"):
        table.add_column(column, justify="left" if column in ("task", "objective") else "right")
    last = None
    for r in result.ranked:
        interval = "(one branch)" if r.ci_low is None else f"[{r.ci_low:+.2f}, {r.ci_high:+.2f}]"
        table.add_row(r.task_id if r.task_id != last else "", str(r.rank), f"b{r.branch_index}", f"{r.reward:.2f}",
                      f"{r.strength:+.2f} {interval}",
                      {True: "pass", False: "fail"}.get(r.objective_pass, "-"), "yes" if r.hack_detected else "")
        last = r.task_id
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    stats, seen = result.stats, result.stats["outcomes"]
    low, high = seen["pass_rate_ci"]
    rate = "n/a" if seen["pass_rate"] is None else f"{100 * seen['pass_rate']:.1f}%"
    at_k = ", ".join(f"pass@{k} {v:.2f}" for k, v in list(seen["pass_at_k"].items())[:4])
    click.echo(f"outcomes: {seen['passed']}/{seen['verified']} verified branches pass ({rate}, 95% Wilson "
               f"[{100 * low:.1f}, {100 * high:.1f}]); {seen['usable_tasks']} of {seen['n_tasks']} tasks have "
               f"passing and failing branches ({seen['usable_pairs']} usable pairs){'; ' + at_k if at_k else ''}")
    if stats["test"] is None:
        click.echo(f"no evidence test: {stats['reason']}")
        return

    def number(value, spec):
        return "n/a" if value is None else format(value, spec)

    mdd = stats["min_detectable_delta_pp"]
    click.echo(f"does the {stats['signal']} predict the objective outcome? top vs bottom half by the signal alone, "
               f"paired by task: n={stats['n']} pairs ({stats['ties_left_out']} tied, left out), McNemar "
               f"p={number(stats['mcnemar_p'], '.4g')}, AUC within task {number(stats['auc_within_task'], '.3f')} "
               f"(pooled {number(stats['auc_pooled'], '.3f')}), Spearman {number(stats['spearman'], '+.3f')}, "
               f"min detectable difference {'n/a' if mdd is None else f'{mdd:.1f} pp'}, powered={stats['powered']}")
    click.echo(("evidence: " if stats["evidence"] else "not evidence: ") + stats["verdict"])


@click.command()
@db_option
@click.option("--runs", nargs=2, default=None, metavar="R1 R2",
              help="Compare two runs over the same tasks (arm A = R1, arm B = R2).")
@click.option("--run", "run_id", default=None, help="The run whose branches are split into two arms (with --by).")
@click.option("--by", "field", default=None, help="Branch field that splits one run into arms, e.g. temperature.")
@click.option("--a", "a_value", default=None, help="Value of --by for arm A.")
@click.option("--b", "b_value", default=None, help="Value of --by for arm B.")
@click.option("--select", type=click.Choice(["best-worst"]), default=None,
              help="Choose the arms from the data (with --by, no --a/--b): on a random half of the tasks, tested "
                   "on the other half (cross-fitting).")
@click.option("--split-seed", type=int, default=0, show_default=True, help="Seed of --select's split of the tasks.")
@click.option("--target-delta", type=FiniteFloat(0, 100, min_open=True), default=None,
              help="Difference to plan for, in percentage points.")
@click.option("--alpha", type=FiniteFloat(0, 1, min_open=True, max_open=True), default=0.05, show_default=True,
              help="Significance level.")
@click.option("--check", is_flag=True, help="Exit 0 only when powered and significant (1 otherwise), for CI scripts.")
@_plot_option
@json_option
def power(db: Path | None, runs: tuple[str, str] | None, run_id: str | None, field: str | None,
          a_value: str | None, b_value: str | None, select: str | None, split_seed: int,
          target_delta: float | None, alpha: float, check: bool, plot: Path | None, as_json: bool) -> None:
    """Compare two arms paired by task: pass rates with Wilson intervals, McNemar exact p, and a verdict.

    Arms are branches of one run split by a field (--run RUN --by temperature --a 0.5 --b 0.9),
    or two runs over the same tasks (--runs R1 R2). Within a task, the i-th verified
    branch of arm A is paired with the i-th of arm B. Arms chosen by looking at the data
    (--by temperature --select best-worst) are chosen on a random half of the tasks and
    compared on the other half, which the choice never saw.
    """
    from factory.errors import ConfigError
    from factory.outputs import OutputFiles
    from factory.ranking import (
        check_plot_file,
        compare_paired,
        excluded_branches,
        excluded_in_arms,
        load_records,
        merge_excluded,
        pair_arms,
        plot_pass_rates,
        select_arms,
        split_by_field,
    )
    from factory.store import Store

    chosen = None
    path = resolve_db(db)
    outputs = OutputFiles({"the store (--db)": path}, "power --plot")
    if plot is not None:
        outputs.check(plot)
        check_plot_file(plot)
        check_writable(plot.parent, "--plot")
    with Store.open(path, read_only=True) as store:
        if runs:
            for rid in runs:
                if store.run(rid) is None:
                    raise ConfigError(f"no run {rid} in {store.path}")
            paired = pair_arms(load_records(store, runs[0]), load_records(store, runs[1]), runs[0], runs[1])
            excluded = merge_excluded({rid: excluded_branches(store, rid) for rid in dict.fromkeys(runs)})
        elif field and (select or (a_value is not None and b_value is not None)):
            if run_id is None:
                latest = store.runs()
                if latest.height == 0:
                    raise ConfigError(f"no runs in {store.path}")
                run_id = latest["run_id"][0]
            elif store.run(run_id) is None:
                raise ConfigError(f"no run {run_id} in {store.path}")
            if select:
                chosen = select_arms(load_records(store, run_id), field, select, split_seed)
                paired = chosen.paired
                excluded = excluded_branches(store, run_id)  # any value of the field could have been chosen
            else:
                arm_a, arm_b = split_by_field(load_records(store, run_id), field, a_value, b_value)
                paired = pair_arms(arm_a, arm_b, f"{field}={a_value}", f"{field}={b_value}")
                excluded = excluded_in_arms(store, run_id, field, [a_value, b_value])
        else:
            raise ConfigError("give --runs R1 R2, or --by FIELD --a VALUE --b VALUE [--run RUN], "
                              "or --by FIELD --select best-worst")
    if not paired.a:
        raise ConfigError("the two arms share no verified task to pair")
    report = compare_paired(paired.a, paired.b, alpha=alpha, target_delta_pp=target_delta)
    verdict = report.verdict.replace("arm A", paired.label_a).replace("arm B", paired.label_b)
    if chosen is not None:
        verdict = f"{verdict} [{chosen.note()}]"
    if plot is not None:
        with outputs:
            plot_pass_rates([
                {"label": paired.label_a, "k": report.k_a, "n": report.n, "rate": report.rate_a,
                 "low": report.ci_a[0], "high": report.ci_a[1]},
                {"label": paired.label_b, "k": report.k_b, "n": report.n, "rate": report.rate_b,
                 "low": report.ci_b[0], "high": report.ci_b[1]},
            ], outputs.stage(plot), f"{paired.label_a} vs {paired.label_b}, paired by task and branch (n={report.n})",
                verdict)
    _record_power(path, runs or (run_id,), report, verdict, paired, chosen, excluded, field, plot)
    if as_json:
        click.echo(dump_json({**report.to_dict(), "verdict": verdict, "arm_a": paired.label_a,
                              "arm_b": paired.label_b, "selection": chosen.to_dict() if chosen else None,
                              "excluded": excluded, "plot": str(plot) if plot else None}))
    else:
        for label, k, rate, (low, high) in ((paired.label_a, report.k_a, report.rate_a, report.ci_a),
                                            (paired.label_b, report.k_b, report.rate_b, report.ci_b)):
            click.echo(f"{label:<24} {k:>4}/{report.n:<4} pass {100 * rate:5.1f}%  "
                       f"95% Wilson [{100 * low:5.1f}, {100 * high:5.1f}]")
        p = "n/a (fewer than 4 pairs)" if report.p_value is None else f"{report.p_value:.4g}"
        mdd = report.min_detectable_delta_pp
        click.echo(f"discordant pairs: {report.b} ({paired.label_a} only) / {report.c} ({paired.label_b} only); "
                   f"McNemar exact p = {p}; min detectable difference "
                   f"{'n/a' if mdd is None or mdd == float('inf') else f'{mdd:.1f} pp'}")
        click.echo(verdict)
        _print_excluded(excluded)
        if plot is not None:
            click.echo(f"plot: {plot}")
    if check and not report.evidence:
        raise SystemExit(1)


def _record_power(db: Path, run_ids: tuple[str, ...], report, verdict: str, paired, chosen, excluded: dict,
                  field: str | None, plot: Path | None) -> None:
    """Record the comparison (its verdict and numbers, and its plot if any) under each run it drew on.

    The same comparison (the same runs and arms) made again updates its row, with or without a plot.
    """
    from factory.cli._artifacts import record_outputs
    from factory.store import artifact_rows, utc_now

    meta = {**report.to_dict(), "verdict": verdict, "arm_a": paired.label_a, "arm_b": paired.label_b,
            "runs": list(run_ids), "by": field, "selection": chosen.to_dict() if chosen else None,
            "excluded": excluded}
    key = ["power", list(run_ids), field, paired.label_a, paired.label_b]
    record_outputs(db, "the power verdict" + (f" and its plot {plot}" if plot is not None else ""),
                   lambda store: artifact_rows(run_ids, "power", plot, meta, key=key, created_at=utc_now()))
