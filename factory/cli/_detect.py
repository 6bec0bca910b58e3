"""``factory train detect LOG.jsonl``: replay a logged training series through the reward-hacking detector."""

from __future__ import annotations

from pathlib import Path

import click

from factory.cli._options import FiniteFloat, dump_json, json_option

__all__ = ["detect", "detector_outcome"]


@click.command()
@click.argument("log", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--warmup-steps", type=click.IntRange(min=2), default=None,
              help="Checkpoints in the warm-up baseline. [default: 20]")
@click.option("--window", type=click.IntRange(min=1), default=None,
              help="Checkpoints pooled for the current length level and reward histogram. [default: 5]")
@click.option("--length-z", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Length z-score that fires the length rule. [default: 2.5]")
@click.option("--reward-kl", type=FiniteFloat(min=0, min_open=True), default=None,
              help="KL(warm-up rewards || current) the trend rule must exceed, in nats. [default: 0.15]")
@click.option("--trend", "trend_checkpoints", type=click.IntRange(min=1), default=None,
              help="Rises in a row the KL trend rule needs (and checkpoints in a row for HARD_STOP). [default: 3]")
@click.option("--plot", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Also draw the series to this PNG.")
@json_option
def detect(log: Path, warmup_steps: int | None, window: int | None, length_z: float | None,
           reward_kl: float | None, trend_checkpoints: int | None, plot: Path | None, as_json: bool) -> None:
    """Replay a training log through the reward-hacking detector: the status per step and the first alarm.

    LOG holds one JSON object a line: {"step": N, "lengths": [token counts], "rewards": [total rewards],
    "rewards_by_function": {name: [...]} (optional)}. Every `factory train grpo` run writes one beside
    train_result.json (hacking_log.jsonl). Exit status 0 whatever the detector says; --json prints the
    detector's report (settings, baseline, per-step readings, events, first alarm).

    Example: factory train detect out/grpo/hacking_log.jsonl
    """
    from factory.trainers import DetectorSettings, plot_detector, read_detector_log, replay_detector

    chosen = {"warmup_steps": warmup_steps, "window": window, "length_z": length_z, "reward_kl": reward_kl,
              "trend_checkpoints": trend_checkpoints}
    settings = DetectorSettings(**{k: v for k, v in chosen.items() if v is not None})
    if plot is not None:
        from factory.ranking import check_plot_file

        check_plot_file(plot)
    report = replay_detector(read_detector_log(log), settings)
    if plot is not None:
        plot_detector(report, plot, f"factory train detect: {log.name}", {"the log": log})
    if as_json:
        click.echo(dump_json(report.model_dump(mode="json")))
        return
    for reading in report.steps:
        z = f"{reading.length_z:+.2f}" if reading.length_z is not None else "   -  "
        kl = f"{reading.reward_kl:.3f}" if reading.reward_kl is not None else "  -  "
        reward = f"{reading.mean_reward:.3f}" if reading.mean_reward is not None else "-"
        fired = f"  ({', '.join(reading.fired)})" if reading.fired else ""
        click.echo(f"step {reading.step:>6}  {reading.status.value:<9} length {reading.mean_length:8.1f}  z {z}  "
                   f"reward {reward}  KL {kl}{fired}")
    first = report.first_alarm
    if first is None:
        click.echo(f"no alarm in {len(report.steps)} step(s) (warm-up: the first {settings.warmup_steps})")
    else:
        click.echo(f"first alarm at step {first.step}: {first.status.value} ({', '.join(first.signals)}): "
                   f"{first.message}")
    if plot is not None:
        click.echo(f"plot: {plot}")


def detector_outcome(outcome: dict | None, *, quiet: bool) -> None:
    """After ``factory train grpo``: the detector's final status on stderr, and exit status 4 where it stopped training.

    Args:
        outcome: ``metrics["hacking_detector"]`` of the training result (None: the detector was off).
        quiet: Print nothing (``--json``: the outcome is in the JSON already).

    Raises:
        TrainingStoppedError: The detector ended training (``--hacking-detector stop``).
    """
    from factory.errors import TrainingStoppedError

    if not outcome:
        return
    if not quiet:
        report = outcome["report"]
        first = report.get("first_alarm")
        alarm = (f"first alarm at step {first['step']}: {first['status']} ({', '.join(first['signals'])})" if first
                 else "no alarm")
        click.echo(f"hacking detector ({outcome['mode']}): {outcome['final_status']} after {len(report['steps'])} "
                   f"logging step(s); {alarm}; log: {outcome['log']}"
                   + (f"; plot: {outcome['plot']}" if outcome.get("plot") else ""), err=True)
    if outcome.get("stop_reason"):
        raise TrainingStoppedError(outcome["stop_reason"] + " (the model and a checkpoint were saved)")
