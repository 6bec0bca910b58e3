"""``factory export FORMAT``: verified, ranked branches -> training data TRL reads as is; ``export validate``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from factory.cli._options import FiniteFloat, check_writable, db_option, dump_json, json_option, resolve_db

__all__ = ["export"]

FORMAT_HELP = {
    "dpo": "Preference pairs (prompt, chosen, rejected) for TRL's DPOTrainer.",
    "kto": "Every verified branch with label = clean objective pass, for TRL's KTOTrainer.",
    "reward": "Pairs with a margin for TRL's RewardTrainer, plus a scalar-reward file (FILE.scalar.EXT).",
    "sft": "The winners' conversations as messages, for TRL's SFTTrainer (rejection-sampling fine-tuning).",
    "grpo": "Prompt-only rows carrying each task's verifier spec, for TRL's GRPOTrainer reward functions.",
    "ppo": "Prompt, completion and scalar reward per verified branch: what a PPO/RLOO-style trainer consumes.",
    "hints": "Accepted turn hints: prompt before turn t, the same with the hint, turn t's message (factory train "
             "hint).",
    "spans": "Branches with accepted feedback: messages, a polarity per message, the spans (factory train rw-sft, "
             "span-kto).",
}
PAIR_FORMATS = ("dpo", "reward")


@click.group()
def export() -> None:
    """Write training data (DPO / KTO / reward / SFT / GRPO / PPO) from runs, with a manifest and dataset card.

    Example: factory export dpo --run RUN --out data/dpo.jsonl --strategy all-pairs --min-margin 0.5
    """


def _split_runs(run_id: str | None, runs: str | None) -> list[str]:
    from factory.errors import ConfigError

    if bool(run_id) == bool(runs):
        raise ConfigError("give exactly one of --run RUN or --runs R1,R2,...")
    return [run_id] if run_id else [r.strip() for r in runs.split(",") if r.strip()]


def _format_command(name: str) -> click.Command:
    pairs = name in PAIR_FORMATS

    def run(run_id: str | None, runs: str | None, rolling: int | None, out: Path, db: Path | None,
            conversational: str, dedupe: bool, as_json: bool, **pair_options: Any) -> None:
        from factory.export import ExportOptions, PairOptions
        from factory.export import export as do_export
        from factory.store import Store

        length_balance = pair_options.pop("length_balance", False)
        top_confidence = pair_options.pop("top_confidence", None)
        all_passing = pair_options.pop("all_passing", False)
        options = ExportOptions(pairs=PairOptions(**pair_options) if pairs else PairOptions(),
                                conversational=conversational == "conversational", length_balance=length_balance,
                                top_confidence=top_confidence, dedupe=dedupe, sft_all_passing=all_passing)
        check_writable(out.parent, "--out")
        path = resolve_db(db)
        with Store.open(path, read_only=True) as store:
            result = do_export(store, name, _split_runs(run_id, runs), out, options, rolling=rolling)
        manifest = result.manifest.document()  # as written to the manifest file
        _record(path, result, manifest)
        if as_json:
            click.echo(dump_json({"path": str(result.path), "manifest_path": str(result.manifest_path),
                                  "card_path": str(result.card_path),
                                  "extra_paths": {k: str(v) for k, v in result.extra_paths.items()},
                                  "manifest": manifest}))
            return
        _print(result)

    params: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option("--run", "run_id", default=None, help="The run to export."),
        click.option("--runs", default=None, help="Several runs, oldest iteration first: R1,R2,R3."),
        click.option("--rolling", type=click.IntRange(min=1), default=None,
                     help="With --runs: keep only the last N runs (iterative DPO)."),
        click.option("--out", required=True, type=click.Path(path_type=Path, dir_okay=False),
                     help="Output file: .jsonl or .parquet (a manifest and README.md are written beside it)."),
        db_option,
        click.option("--format", "conversational", type=click.Choice(["conversational", "standard"]),
                     default="conversational", show_default=True,
                     help="Message lists (with tool calls) or plain strings."),
        click.option("--dedupe", is_flag=True, help="Drop rows whose content repeats an earlier row's."),
        json_option,
    ]
    if pairs:
        params += [
            click.option("--strategy", type=click.Choice(["best-worst", "pass-fail", "all-pairs"]),
                         default="best-worst", show_default=True, help="How pairs are chosen within a task."),
            click.option("--min-margin", type=FiniteFloat(min=0), default=0.0, show_default=True,
                         help="Keep pairs whose margin (reward or strength difference) is at least this."),
            click.option("--margin-by", type=click.Choice(["reward", "strength"]), default="reward",
                         show_default=True, help="What the margin is a difference of (strength: Bradley-Terry)."),
            click.option("--ci-separated", is_flag=True,
                         help="Keep only pairs whose strength confidence intervals do not overlap."),
            click.option("--hacks-as-rejected", is_flag=True,
                         help="Pair branches with a detected hack as rejected against a clean pass."),
            click.option("--max-pairs-per-task", type=click.IntRange(min=1), default=None,
                         help="At most this many pairs per task, largest margins first."),
            click.option("--length-balance", is_flag=True,
                         help="Drop pairs until the chosen side is longer as often as shorter."),
            click.option("--top-confidence", type=FiniteFloat(0, 1, min_open=True), default=None,
                         help="Keep this top fraction of pairs by margin."),
        ]
    if name == "sft":
        params.append(click.option("--all-passing", is_flag=True,
                                   help="Every clean pass, not only each task's best-ranked one."))
    command = run
    for param in reversed(params):
        command = param(command)
    return click.command(name=name, help=FORMAT_HELP[name])(command)


def _record(db: Path, result, manifest: dict[str, Any]) -> None:
    """Record the export (data file, manifest, dataset card, side files, with their hashes) under each run."""
    from factory.cli._artifacts import record_outputs
    from factory.store import artifact_rows, companion, utc_now

    files = [companion("manifest", result.manifest_path), companion("dataset card", result.card_path),
             *(companion(tag, extra) for tag, extra in result.extra_paths.items())]
    meta = {"format": manifest["format"], "rows": manifest.get("rows"), "out_dir": str(result.path.parent.resolve()),
            "files": [f for f in files if f is not None], "manifest": manifest}
    record_outputs(db, f"the export {result.path}", lambda store: artifact_rows(
        manifest.get("run_ids") or [], "export", result.path, meta, created_at=utc_now()))


def _print(result) -> None:
    m = result.manifest.document()
    counts = m["counts"]
    click.echo(f"wrote {m['rows']} {m['format']} row(s) to {result.path} (for {m['trainer']})")
    for tag, path in result.extra_paths.items():
        click.echo(f"wrote {counts.get(f'{tag}_rows', '?')} {tag} row(s) to {path}")
    if m.get("strategy"):
        bias = m.get("length_bias") or {}
        click.echo(f"pairs: strategy {m['strategy']}, {counts.get('pairs_built')} built, {m['rows']} kept; "
                   f"chosen longer in {bias.get('chosen_longer_share')} of pairs, "
                   f"mean length ratio {bias.get('mean_length_ratio')}")
    if m.get("kto"):
        kto = m["kto"]
        click.echo(f"class balance: {kto['desirable']} desirable / {kto['undesirable']} undesirable "
                   f"({kto['desirable_share']:.0%} desirable); desirable_weight={kto['desirable_weight']}, "
                   f"undesirable_weight={kto['undesirable_weight']} (in the manifest for the trainer)")
    agreement = m["judge_objective_agreement"]
    if agreement["n"]:
        click.echo(f"judge-objective agreement {agreement['agreement']} (AUC {agreement['auc']}, n {agreement['n']})")
    verdicts = "; ".join(f"{r['run_id']}: {(r['ranking'] or {}).get('verdict', 'no ranking')}" for r in m["runs"])
    click.echo(f"ranking powered: {m['powered']} ({verdicts})")
    click.echo(f"manifest {result.manifest_path}; dataset card {result.card_path}")


for _name in FORMAT_HELP:
    export.add_command(_format_command(_name))


@export.command()
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--format", "format_name", type=click.Choice(sorted(FORMAT_HELP)), required=True,
              help="The format the file should follow.")
@json_option
def validate(file: Path, format_name: str, as_json: bool) -> None:
    """Check an export FILE: schema, one format per file, no empty fields, chosen != rejected (errors name lines)."""
    from factory.export import validate_file

    rows = validate_file(file, format_name)
    if as_json:
        click.echo(dump_json({"file": str(file), "format": format_name, "rows": rows, "ok": True}))
    else:
        click.echo(f"{file}: {rows} valid {format_name} row(s)")
