"""``factory train dpo|kto|sft|reward|grpo|hint|rw-sft|span-kto``: training on an export file, result beside it."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from factory.cli._detect import detector_outcome
from factory.cli._options import FiniteFloat, check_writable, dump_json, json_option, resolve_db
from factory.trainers import CONFIG_FIELDS, FieldDoc

__all__ = ["train"]


@click.group()
def train() -> None:
    """Train on exported data (DPO, KTO, SFT, reward model, GRPO; hint, RW-SFT, Span-KTO on feedback); LoRA optional.

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


@dataclass(frozen=True)
class _FieldOption:
    """A command-line option that sets one config field; its help and default are the field's own.

    Only the trainers whose config has the field get the option. The help and
    default come from :data:`~factory.trainers._fields.CONFIG_FIELDS`, the
    configs' field metadata written out, so that ``--help`` imports no TRL.

    Attributes:
        decls: The option's names.
        field: The config field it sets.
        type: What the command line accepts where it is narrower than the field (checked before TRL sees it).
        flag: A switch: given sets True; absent leaves the field to ``--config`` and its default.
        required: Whether it must be given.
        pass_default: Absent, it still passes the field's default (overriding ``--config``).
        show_default: Say the field's default in the help.
        note: What the option does beyond setting its field.
    """

    decls: tuple[str, ...]
    field: str
    type: Any = None
    flag: bool = False
    required: bool = False
    pass_default: bool = False
    show_default: bool = True
    note: str = ""

    def decorator(self, doc: FieldDoc) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        text = f"{doc.help} {self.note}".strip()
        if self.flag:
            return click.option(*self.decls, self.field, is_flag=True, help=text)
        if self.pass_default:
            return click.option(*self.decls, self.field, type=self.type, default=doc.default, show_default=True,
                                help=text)
        if self.show_default and not self.required and doc.default is not None:
            text += f" [default: {doc.default}]"
        return click.option(*self.decls, self.field, type=self.type, required=self.required, default=None, help=text)

    def value(self, given: Any) -> Any:
        """What the option passes to the config (None: nothing)."""
        if self.flag:
            return given or None
        return str(given) if isinstance(given, Path) else given


_FIELD_OPTIONS = (
    _FieldOption(("--data",), "data_file", click.Path(path_type=Path, dir_okay=False), required=True),
    _FieldOption(("--model",), "model_name_or_path", pass_default=True),
    _FieldOption(("--output", "-o"), "output_dir", click.Path(path_type=Path, file_okay=False), required=True,
                 note="It holds model/, adapter/ (with --lora), train_result.json and loss.png."),
    _FieldOption(("--lora",), "use_lora", flag=True),
    _FieldOption(("--max-steps",), "max_steps", click.IntRange(min=1), show_default=False),  # -1: by epochs
    _FieldOption(("--epochs",), "num_train_epochs", FiniteFloat(min=0, min_open=True)),
    _FieldOption(("--lr",), "learning_rate", FiniteFloat(min=0, min_open=True)),
    _FieldOption(("--batch-size",), "per_device_train_batch_size", click.IntRange(min=1)),
    _FieldOption(("--grad-accum",), "gradient_accumulation_steps", click.IntRange(min=1)),
    _FieldOption(("--seed",), "seed", int),
    # A checkpoint every N steps needs save_strategy=steps too (off by default): the option sets both.
    _FieldOption(("--save-steps",), "save_steps", click.IntRange(min=1), show_default=False,
                 note="Checkpoints are written only with this option, so that --resume can continue after a crash."),
    _FieldOption(("--resume",), "resume", flag=True),
    _FieldOption(("--max-length",), "max_length", click.IntRange(min=8)),
    _FieldOption(("--allow-unmasked",), "allow_unmasked", flag=True),
    _FieldOption(("--objective",), "objective", click.Choice(["auto", "pairwise", "regression"])),
    _FieldOption(("--sandbox",), "sandbox"),
    _FieldOption(("--num-generations",), "num_generations", click.IntRange(min=2)),
    _FieldOption(("--max-completion-length",), "max_completion_length", click.IntRange(min=1)),
    _FieldOption(("--hacking-detector",), "hacking_detector", click.Choice(["off", "warn", "stop"])),
    _FieldOption(("--ensemble",), "ensemble", click.IntRange(min=1)),
    _FieldOption(("--reward-model",), "reward_model", click.Path(path_type=Path, file_okay=False, exists=True)),
    _FieldOption(("--uncertainty-penalty",), "uncertainty_penalty", FiniteFloat(min=0)),
    _FieldOption(("--multi-turn",), "multi_turn", flag=True),
)


def _command(name: str, summary: str) -> click.Command:
    docs = CONFIG_FIELDS.get(name, {})
    options = [option for option in _FIELD_OPTIONS if option.field in docs]

    def run(config_file: Path | None, settings: tuple[str, ...], as_json: bool, db: Path | None,
            **given_fields: Any) -> None:
        from factory.errors import ConfigError
        from factory.trainers import load_trainer

        check_writable(given_fields["output_dir"], "--output")  # before minutes of training, not at the save
        config_cls, train_fn, _ = load_trainer(name)
        fields = {f.name for f in dataclasses.fields(config_cls) if f.init}
        values = _yaml_values(config_file, fields, config_cls.__name__) if config_file else {}
        values.update(_set_values(settings, fields, config_cls.__name__))
        given = {option.field: option.value(given_fields[option.field]) for option in options}
        if given.get("save_steps") is not None:
            given["save_strategy"] = "steps"
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
        _record(resolve_db(db), result)
        if as_json:
            click.echo(dump_json({k: v for k, v in result.to_dict().items() if k != "log_history"}))
        else:
            _print(result)
        detector_outcome(result.metrics.get("hacking_detector"), quiet=as_json)  # exit 4 where it stopped training

    params: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        *(option.decorator(docs[option.field]) for option in options),
        click.option("--config", "config_file", type=click.Path(path_type=Path, dir_okay=False, exists=True),
                     default=None, help="YAML of config fields (any TRL / TrainingArguments field); options win."),
        click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
                     help="Set any config field, e.g. --set beta=0.05 (repeatable; YAML values)."),
        click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="The store holding the runs the data was exported from: the trained model is recorded "
                          "there for `factory view` [default: $FACTORY_DB or ./factory.duckdb]."),
        json_option,
    ]
    command = run
    for param in reversed(params):
        command = param(command)
    return click.command(name=name, help=summary)(command)


#: The figures of train_result.json a model's artifact row carries (what the viewer shows of it).
_HEADLINE = ("steps", "train_seconds", "steps_per_second", "train_loss", "first_loss", "last_loss", "loss_moved",
             "first_reward", "last_reward")


def _record(db: Path, result) -> None:
    """Record the output folder under the runs its data was exported from, where the store holds them.

    Nothing is said where the data names no run (a file made elsewhere) or there is no store at ``db``.
    """
    from factory.cli._artifacts import record_outputs
    from factory.store import artifact_rows, companion, utc_now

    data = result.provenance.get("data") or {}
    run_ids = [r for r in data.get("run_ids") or [] if r]
    if not run_ids:
        return
    files = [companion("train_result.json", result.output_dir / "train_result.json"),
             companion("loss curve", result.plot_path)]
    meta = {"trainer": result.trainer, "model_dir": str(result.model_dir) if result.model_dir else None,
            "adapter_dir": str(result.adapter_dir) if result.adapter_dir else None,
            "metrics": {k: result.metrics[k] for k in _HEADLINE if k in result.metrics},
            "data": {k: data.get(k) for k in ("file", "file_sha256", "rows", "dataset_hash", "run_ids")},
            "warnings": result.warnings, "files": [f for f in files if f is not None]}

    def rows(store):
        stored = [r for r in run_ids if store.run(r) is not None]
        if not stored:
            from factory.errors import StoreError

            raise StoreError(f"{store.path} holds none of the runs the data came from ({', '.join(run_ids)}); "
                             "pass the store they are in with --db")
        return artifact_rows(stored, "model", result.output_dir, meta, created_at=utc_now())

    record_outputs(db, f"the model in {result.output_dir}", rows, missing_ok=True)


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
    if m.get("ensemble"):  # factory train reward --ensemble K
        click.echo(f"ensemble of {m['ensemble']['members']} reward models: {m['ensemble']['manifest']} (reward GRPO "
                   f"with it: factory train grpo --reward-model {result.output_dir} --uncertainty-penalty 0.3)")
    click.echo(f"result: {result.output_dir / 'train_result.json'}" +
               (f"; loss curve: {result.plot_path}" if result.plot_path else ""))
    mask = m.get("loss_mask")
    if mask:  # DPO, KTO: which tokens the loss saw
        seen = (f"the assistant's tokens only ({mask['loss_tokens']} of {mask['completion_tokens']} completion "
                "tokens)" if mask["assistant_only"] else "every completion token (--allow-unmasked or plain text)")
        click.echo(f"loss on {seen}")
    precision = m.get("precision") or {}
    if precision.get("moved_share") is not None:
        click.echo(f"weights {precision['trainable_dtype']} (compute {precision['compute_dtype']}); "
                   f"{precision['moved_share']:.2%} of the trainable elements moved")
    if m.get("prompt_fit_summary"):
        click.echo(m["prompt_fit_summary"])
    data = result.provenance["data"]
    click.echo(f"data: {data['rows']} row(s), dataset {data['dataset_hash'] or 'unknown (no manifest)'}")
    for warning in result.warnings:
        click.secho(f"WARNING: {warning}", fg="yellow", err=True)


def _register() -> None:
    from factory.trainers import trainer_entry, trainer_names  # names and summaries only: no TRL

    for name in trainer_names():
        train.add_command(_command(name, trainer_entry(name).summary))
    from factory.cli._detect import detect  # the reward-hacking detector's replay of a logged run

    train.add_command(detect)


_register()
