"""``factory train dpo|kto|sft|reward|grpo``: TRL training on an export file, with the result saved beside the model."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from factory.cli._options import dump_json, json_option

__all__ = ["train"]


@click.group()
def train() -> None:
    """Train on exported data with TRL (DPO, KTO, SFT, reward model, GRPO); LoRA optional.

    Example: factory train dpo --data data/dpo.jsonl --model local --lora --max-steps 50 --output out/dpo

    Every trainer writes OUTPUT/model (a full checkpoint: `factory fork --model hf:OUTPUT/model`), with --lora
    also OUTPUT/adapter, and OUTPUT/train_result.json (metrics, loss curve, what the model depends on).
    On several GPUs: accelerate launch --multi_gpu --num_processes N -m factory.cli train dpo ...
    """


def _yaml_values(path: Path, fields: set[str], config_name: str) -> dict[str, Any]:
    """The config file's settings; an unknown key is named with its file and line."""
    import yaml

    from factory.errors import ConfigError

    try:
        text = path.read_text(encoding="utf-8")
        node = yaml.compose(text)
        values = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from exc
    if values is None:
        return {}
    if not isinstance(values, dict) or not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{path}:1: the config must be a mapping of {config_name} fields to values")
    for key_node, _ in node.value:
        if key_node.value not in fields:
            raise ConfigError(f"{path}:{key_node.start_mark.line + 1}: field '{key_node.value}': "
                              f"not a {config_name} field")
    return values


def _set_values(pairs: tuple[str, ...], fields: set[str], config_name: str) -> dict[str, Any]:
    import yaml

    from factory.errors import ConfigError

    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set {pair!r}: expected KEY=VALUE")
        if key not in fields:
            raise ConfigError(f"--set {pair!r}: field '{key}': not a {config_name} field")
        values[key] = yaml.safe_load(raw) if raw else None
    return values


def _command(name: str, summary: str) -> click.Command:
    def run(data: Path, model: str, output: Path, lora: bool, max_steps: int | None, epochs: float | None,
            lr: float | None, batch_size: int | None, grad_accum: int | None, seed: int | None,
            save_steps: int | None, resume: bool, config_file: Path | None,
            settings: tuple[str, ...], as_json: bool, **specific: Any) -> None:
        from factory.errors import ConfigError
        from factory.trainers import load_trainer

        config_cls, train_fn, _ = load_trainer(name)
        fields = {f.name for f in dataclasses.fields(config_cls) if f.init}
        values = _yaml_values(config_file, fields, config_cls.__name__) if config_file else {}
        values.update(_set_values(settings, fields, config_cls.__name__))
        given = {
            "data_file": str(data), "model_name_or_path": model, "output_dir": str(output),
            "use_lora": lora or None, "max_steps": max_steps, "num_train_epochs": epochs, "learning_rate": lr,
            "per_device_train_batch_size": batch_size, "gradient_accumulation_steps": grad_accum,
            "seed": seed, "resume": resume or None,
            **specific,  # --max-length, --objective, --sandbox, --num-generations ... where the trainer has them
        }
        if save_steps is not None:
            given.update(save_strategy="steps", save_steps=save_steps)
        given = {k: v for k, v in given.items() if v is not None}
        stray = sorted(set(given) - fields)
        if stray:
            raise ConfigError(f"{', '.join(stray)}: not a {config_cls.__name__} field (factory train {name})")
        values.update(given)
        try:
            config = config_cls(**values)
        except (TypeError, ValueError) as exc:  # TRL / transformers validate their own fields
            raise ConfigError(f"{config_cls.__name__}: {exc}") from exc
        # TRL's progress bar and log lines go to stderr with --json, so that stdout is one JSON document.
        redirect = contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()
        with redirect:
            result = train_fn(config)
        if not result.main_process:  # accelerate launch: one report, from the main process
            return
        if as_json:
            click.echo(dump_json({k: v for k, v in result.to_dict().items() if k != "log_history"}))
            return
        _print(result)

    params: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option("--data", required=True, type=click.Path(path_type=Path, dir_okay=False),
                     help=f"The export file (factory export {'reward' if name == 'reward' else name} ...)."),
        click.option("--model", default="local", show_default=True,
                     help="Policy: a model folder, hf:DIR, a hub id (needs network), a .gguf file, or local "
                          "(the embedded default GGUF, dequantized)."),
        click.option("--output", "-o", required=True, type=click.Path(path_type=Path, file_okay=False),
                     help="Output folder: model/, adapter/ (with --lora), train_result.json, loss.png."),
        click.option("--lora", is_flag=True, help="Train a LoRA adapter (saved, and merged into model/)."),
        click.option("--max-steps", type=click.IntRange(min=1), default=None, help="Optimizer steps."),
        click.option("--epochs", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Epochs over the data (when --max-steps is not given)."),
        click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Learning rate [default: the TRL trainer's]."),
        click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Rows per device per step."),
        click.option("--grad-accum", type=click.IntRange(min=1), default=None, help="Gradient accumulation steps."),
        click.option("--seed", type=int, default=None, help="Seed (data order, dropout, new heads) [default: 42]."),
        click.option("--save-steps", type=click.IntRange(min=1), default=None,
                     help="Write a checkpoint every N steps (so --resume can continue after a crash)."),
        click.option("--resume", is_flag=True, help="Continue from the newest checkpoint in --output."),
        click.option("--config", "config_file", type=click.Path(path_type=Path, dir_okay=False, exists=True),
                     default=None, help="YAML of config fields (any TRL / TrainingArguments field); options win."),
        click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
                     help="Set any config field, e.g. --set beta=0.05 (repeatable; YAML values)."),
        json_option,
    ]
    if name != "grpo":  # GRPO bounds completions instead (--max-completion-length)
        params.append(click.option("--max-length", type=click.IntRange(min=8), default=None,
                                   help="Tokens per row (truncated)."))
    if name == "reward":
        params.append(click.option("--objective", type=click.Choice(["auto", "pairwise", "regression"]),
                                   default=None, help="pairwise (Bradley-Terry with margins) or regression "
                                                      "(MSE on the scalar file) [default: from the file]."))
    if name == "grpo":
        params += [
            click.option("--sandbox", default=None, help="Sandbox for the completions' tool calls and tests "
                                                         "[default: bwrap]."),
            click.option("--num-generations", type=click.IntRange(min=2), default=None,
                         help="Completions per prompt (the group) [default: TRL's]."),
            click.option("--max-completion-length", type=click.IntRange(min=1), default=None,
                         help="Tokens per completion [default: TRL's]."),
        ]
    command = run
    for param in reversed(params):
        command = param(command)
    return click.command(name=name, help=summary)(command)


def _print(result) -> None:
    m = result.metrics
    click.echo(f"trained {result.trainer}: {m['steps']} step(s) in {m['train_seconds']:.1f} s "
               f"({m['steps_per_second']} steps/s); loss {m['first_loss']} -> {m['last_loss']} "
               f"(train loss {m['train_loss']})")
    if "last_reward" in m:
        click.echo(f"reward {m['first_reward']} -> {m['last_reward']}")
    if result.model_dir:  # a reward model scores conversations; only a policy can be forked
        hint = "" if result.trainer == "reward" else f"  (fork it: factory fork TASKS --model hf:{result.model_dir})"
        click.echo(f"model: {result.model_dir}{hint}")
    if result.adapter_dir:
        click.echo(f"adapter: {result.adapter_dir}")
    click.echo(f"result: {result.output_dir / 'train_result.json'}" +
               (f"; loss curve: {result.plot_path}" if result.plot_path else ""))
    data = result.provenance["data"]
    click.echo(f"data: {data['rows']} row(s), dataset {data['dataset_hash'] or 'unknown (no manifest)'}")
    for warning in result.warnings:
        click.secho(f"WARNING: {warning}", fg="yellow", err=True)


def _register() -> None:
    from factory.trainers import trainer_entry, trainer_names  # names and summaries only: no TRL

    for name in trainer_names():
        train.add_command(_command(name, trainer_entry(name).summary))


_register()
