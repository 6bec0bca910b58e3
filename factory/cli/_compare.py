"""``factory runs --compare RUN_A RUN_B``: did the second fork drift from the first (final-answer length, scores)?"""

from __future__ import annotations

from pathlib import Path

import click

from factory.cli._options import dump_json, resolve_db

__all__ = ["compare_command"]


def compare_command(db: Path | None, run_a: str, run_b: str, as_json: bool) -> None:
    """Compare two runs' final-answer lengths (characters) and verifier scores per branch; print whether b drifted.

    Raises:
        ConfigError: A run that is not in the store.
    """
    import polars as pl

    from factory.errors import ConfigError
    from factory.store import Store
    from factory.trainers import compare_runs

    lengths, scores = [], []
    with Store.open(resolve_db(db), read_only=True) as store:
        for run_id in (run_a, run_b):
            if store.run(run_id) is None:
                raise ConfigError(f"--compare: no run {run_id!r} in the store (see `factory runs`)")
            answers = [a for a in store.branches(run_id)["final_answer"].to_list() if a is not None]
            lengths.append([len(a) for a in answers])
            verdicts = store.latest_verdicts(run_id)
            per_branch = verdicts.drop_nulls("score").group_by(["task_id", "branch_index"]).agg(pl.col("score").mean())
            scores.append([float(x) for x in per_branch["score"].to_list()] if per_branch.height else [])
    result = compare_runs(run_a, run_b, (lengths[0], lengths[1]), (scores[0], scores[1]))
    if as_json:
        click.echo(dump_json(result.model_dump(mode="json")))
        return

    def show(value: float | None, form: str) -> str:
        return format(value, form) if value is not None else "-"

    click.echo(f"{run_a} -> {run_b}: {result.branches[0]} vs {result.branches[1]} branch(es) with a final answer")
    click.echo(f"final-answer length: {show(result.mean_length[0], '.1f')} -> {show(result.mean_length[1], '.1f')} "
               f"chars (z {show(result.length_z, '+.2f')}, KL {show(result.length_kl, '.3f')})")
    click.echo(f"verifier score: {show(result.mean_score[0], '.3f')} -> {show(result.mean_score[1], '.3f')} "
               f"(KL {show(result.score_kl, '.3f')})")
    click.echo(f"{run_b} drifted: " + "; ".join(result.reasons) if result.drifted else f"{run_b}: no drift")
