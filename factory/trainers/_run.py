"""The shape every trainer shares: data -> policy (+ LoRA) -> TRL trainer -> train -> saved model and result.

A trainer module supplies only what differs: which export formats it reads
and how to build its TRL trainer. :func:`run_training` does the rest: loads
and checks the data, loads the policy (a folder, a hub id, or a GGUF file
dequantized for training), wraps it with LoRA when asked, trains with TRL's
own progress bar, writes the adapter and the merged checkpoint, and records
a :class:`TrainResult` (``output_dir/train_result.json``, and ``loss.png``
where matplotlib is installed) with what the model depends on.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factory.errors import ConfigError, OutputSpaceError
from factory.outputs import (
    TRAINED_MARKER,
    disk_full,
    refuse_protected,
    staged_lock,
    staged_name,
    sweep_staged,
    write_output,
)
from factory.trainers._data import TrainingData, load_training_data
from factory.trainers._precision import (
    MOVED_WARNING_SHARE,
    MovementProbe,
    compute_dtype,
    keep_float32_master_weights,
    weight_dtypes,
)

if TYPE_CHECKING:
    from factory.trainers._models import PolicySource

__all__ = ["RESULT_FILE", "TrainOutputs", "TrainResult", "frozen_reference", "run_training"]

RESULT_FILE = "train_result.json"


class TrainOutputs:
    """A training run's final outputs, staged in one folder and moved into the output folder once complete.

    The model, adapter, plot and report are written to a staged folder
    (``OUTPUT/.final.<pid>-<hex>.tmp``, ``flock``'ed while its writer lives)
    and moved in by :meth:`commit`, ``train_result.json`` last (an earlier
    one is removed first), so a folder holding a ``model/`` without a
    ``train_result.json`` is one whose training was killed while moving in:
    the model folders carry a marker (:data:`MARKER`), and the ``hf:`` loader
    refuses such a folder, and a staged one. Staged folders of dead
    processes are swept when the next training stages its outputs here.

    Args:
        output_dir: The run's output folder.
        operation: What is written, for the message of a full disk (``train sft``).
    """

    #: The marker file put in each model folder written here.
    MARKER = TRAINED_MARKER
    #: What lands, in this order: the report last.
    NAMES = ("adapter", "model", "loss.png", RESULT_FILE)

    def __init__(self, output_dir: Path, operation: str = "train"):
        self.output_dir = Path(output_dir)
        self.operation = operation
        self.staged: Path | None = None
        self._fd: int | None = None
        self._made = False

    def stage(self) -> Path:
        """Make (and lock) the staged folder, sweeping those dead processes left; return it.

        Raises:
            OutputSpaceError: The disk is full.
        """
        try:
            if not self.output_dir.is_dir():
                self.output_dir.mkdir(parents=True)
                self._made = True
            sweep_staged(self.output_dir)
            staged = staged_name(self.output_dir / "final")
            staged.mkdir()
            self.staged, self._fd = staged, staged_lock(staged)
        except OSError as exc:
            self.discard()
            self.fail(exc)
            raise ConfigError(f"cannot write to {self.output_dir}: {exc.strerror or exc}") from exc
        return staged

    def final(self, staged_path: str | Path) -> Path:
        """Where ``staged_path`` (under the staged folder) lands."""
        return self.output_dir / Path(staged_path).relative_to(self.staged)

    def commit(self) -> None:
        """Move everything staged into the output folder, the report last; remove the staged folder."""
        staged = self.staged
        for name in ("adapter", "model"):
            if (staged / name).is_dir():
                (staged / name / self.MARKER).touch()
        (self.output_dir / RESULT_FILE).unlink(missing_ok=True)  # until the new one lands, nothing looks finished
        for name in self.NAMES:
            source, target = staged / name, self.output_dir / name
            if not source.exists():
                continue
            if target.is_dir() and not target.is_symlink():  # an earlier run's folder: moved aside, then removed
                target.rename(staged / f".earlier-{name}")
            os.replace(source, target)
        self.discard()

    def discard(self) -> None:
        """Remove the staged folder (and the output folder, when it was made for this run and is empty)."""
        if self.staged is not None:
            shutil.rmtree(self.staged, ignore_errors=True)
            self.staged = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._made:
            try:
                self.output_dir.rmdir()
            except OSError:  # checkpoints or logs are in it: not empty, kept
                pass
            self._made = False

    def fail(self, exc: BaseException) -> None:
        """Raise :class:`OutputSpaceError` naming the output folder if ``exc`` is a full disk; else return.

        Raises:
            OutputSpaceError: ``exc`` (or its cause) is a full disk or quota.
        """
        why = disk_full(exc)
        if why is not None and not isinstance(exc, OutputSpaceError):
            raise OutputSpaceError(self.operation, str(self.output_dir), why) from exc
        if isinstance(exc, OutputSpaceError) and self.staged is None and exc.path.startswith(
                str(self.output_dir)):
            raise OutputSpaceError(self.operation, str(self.output_dir), exc.detail) from exc


@dataclass
class TrainResult:
    """What a training run produced and what it depends on.

    Attributes:
        trainer: The trainer's name (``dpo``, ``kto``, ``sft``, ``reward``, ``grpo``).
        output_dir: Where everything was written.
        model_dir: The full checkpoint (merged, with LoRA) that ``factory fork --model hf:DIR`` loads; None for an
            adapter saved without merging, and in the processes that do not write (see ``main_process``).
        adapter_dir: The LoRA adapter, when one was trained.
        metrics: Final figures: steps, train loss, first and last logged loss, runtime, steps/s, peak memory.
        log_history: Every log entry TRL wrote (loss, rewards, learning rate... per logging step).
        provenance: Data (file hash, dataset hash, runs), policy (spec, GGUF sha256), config, seed, versions.
        warnings: What the user should know about the data.
        plot_path: ``loss.png``, when matplotlib is installed.
        main_process: False in the other processes of a multi-GPU run (only the main one writes and reports).
    """

    trainer: str
    output_dir: Path
    model_dir: Path | None
    adapter_dir: Path | None
    metrics: dict[str, Any]
    log_history: list[dict[str, Any]]
    provenance: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    plot_path: Path | None = None
    main_process: bool = True

    def to_dict(self) -> dict[str, Any]:
        """Plain data (``train_result.json``, ``--json`` output)."""
        return {"trainer": self.trainer, "output_dir": str(self.output_dir),
                "model_dir": str(self.model_dir) if self.model_dir else None,
                "adapter_dir": str(self.adapter_dir) if self.adapter_dir else None, "metrics": self.metrics,
                "warnings": self.warnings, "plot_path": str(self.plot_path) if self.plot_path else None,
                "provenance": self.provenance, "log_history": self.log_history}


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _peak_rss_mb() -> float | None:
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def _last_checkpoint(output_dir: Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in ("factory-rlaif", "torch", "transformers", "trl", "peft", "accelerate", "datasets"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _plot_losses(history: list[dict[str, Any]], path: Path, title: str, protected: dict[str, Path]) -> Path | None:
    """loss (and reward, where logged) against step; None without matplotlib or without logged losses.

    Written atomically, never over a ``protected`` path (the training data).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    points = [(entry["step"], entry["loss"]) for entry in history if "loss" in entry and "step" in entry]
    rewards = [(entry["step"], entry["reward"]) for entry in history if "reward" in entry and "step" in entry]
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(*zip(*points), marker="o" if len(points) < 30 else None, label="loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    if rewards:
        twin = ax.twinx()
        twin.plot(*zip(*rewards), color="tab:green", label="reward")
        twin.set_ylabel("mean reward")
    ax.set_title(title)
    fig.tight_layout()
    try:
        write_output(path, lambda staged: fig.savefig(staged, dpi=110), protected)
    finally:
        plt.close(fig)
    return path


def _summary(history: list[dict[str, Any]], train_metrics: dict[str, Any], steps: int, seconds: float) -> dict:
    losses = [entry["loss"] for entry in history if "loss" in entry]
    metrics = {
        "steps": steps,
        "train_loss": train_metrics.get("train_loss"),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "loss_moved": bool(losses) and len(losses) > 1 and losses[0] != losses[-1],
        "train_seconds": round(seconds, 3),
        "steps_per_second": round(steps / seconds, 4) if seconds > 0 else None,
        "samples_per_second": train_metrics.get("train_samples_per_second"),
        "peak_rss_mb": _peak_rss_mb(),
    }
    import torch

    if torch.cuda.is_available():
        metrics["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    rewards = [entry["reward"] for entry in history if "reward" in entry]
    if rewards:
        metrics.update(first_reward=rewards[0], last_reward=rewards[-1])
    return metrics


def frozen_reference(model: Any) -> Any | None:
    """The reference model for DPO / KTO: None under LoRA (TRL switches the adapter off), else a frozen copy.

    TRL would otherwise reload the reference from ``config._name_or_path``, which fails for a policy loaded
    from a GGUF file (its folder holds no ``config.json``) and reads the disk again for the others.
    """
    import copy

    from factory.trainers._models import is_peft_model

    if is_peft_model(model):
        return None
    reference = copy.deepcopy(model)
    reference.eval()
    reference.requires_grad_(False)
    return reference


BuildTrainer = Callable[[Any, Any, Any, TrainingData], Any]


def _check_length_drops(trainer: Any, data: TrainingData, config: Any) -> None:
    """Count the rows TRL left out for ``max_length``: every one is an error, some a warning on ``data``.

    TRL's trainers drop, while preparing their dataset, the rows that would
    leave nothing to learn from once cut at ``max_length`` (DPO and KTO: a
    prompt that alone fills it; reward: a side longer than it; SFT: no
    completion token left). When that is every row, training would stop on
    an empty dataset with a sampler error; the count says what happened and
    which option to raise.

    Raises:
        ConfigError: TRL dropped every row.
    """
    max_length = getattr(config, "max_length", None)
    prepared = getattr(trainer, "train_dataset", None)
    if max_length is None or prepared is None or getattr(config, "packing", False):
        return  # packing changes the row count for reasons of its own
    if getattr(trainer, "counts_own_drops", False):  # the feedback trainers leave rows out and say so themselves
        return
    try:
        total, kept = len(data.dataset), len(prepared)
    except TypeError:  # a streamed dataset has no length
        return
    dropped = total - kept
    if dropped <= 0:
        return
    if kept == 0:
        raise ConfigError(f"--max-length {max_length}: all {total} row(s) of {data.path} are too long for it "
                          "(TRL drops a row that would leave nothing to learn from once cut), so nothing is left "
                          "to train on; raise --max-length")
    data.warnings.append(f"--max-length {max_length}: TRL dropped {dropped} of {total} row(s) of {data.path} as too "
                         "long; raise --max-length to keep them")


def run_training(name: str, config: Any, formats: str | tuple[str, ...], build_trainer: BuildTrainer, *,
                 load_model: Callable[[PolicySource], tuple[Any, Any]] | None = None,
                 lora_task_type: str = "CAUSAL_LM", data: TrainingData | None = None,
                 extra_metrics: dict[str, Any] | Callable[[], dict[str, Any]] | None = None) -> TrainResult:
    """Train with TRL on an export file and save what came out.

    Args:
        name: The trainer's name, for the result.
        config: The trainer's ``XConfig`` (a TRL config with :class:`TrainerSettings`).
        formats: The export format(s) this trainer reads.
        build_trainer: ``(config, model, tokenizer, data) -> trainer``; the model is already LoRA-wrapped if asked.
        load_model: Loads the policy from its source (default: a causal LM and its tokenizer); for full fine-tuning
            it is called with ``dtype="float32"`` (float32 master weights; one that loads in half precision anyway
            is upcast), with LoRA without a dtype (the device's default for the frozen base).
        lora_task_type: peft's task type for ``--lora`` (``SEQ_CLS`` for a reward model).
        data: Data already loaded (a trainer that had to look at it first); else loaded from ``config.data_file``.
        extra_metrics: Figures the trainer adds to the result's metrics (or a function read after training).

    Raises:
        ConfigError: No data file, unusable data or model.
        ExportValidationError: Rows that break their format.
    """
    from factory.trainers._models import apply_lora, load_policy, resolve_policy, save_policy

    if data is None:
        if not config.data_file:
            raise ConfigError("no training data: give --data FILE (an export from `factory export`)")
        data = load_training_data(config.data_file, formats)
    output_dir = Path(config.output_dir)
    inputs = {"the training data (--data)": data.path}
    for target in (output_dir / "loss.png", output_dir / RESULT_FILE):  # refused now, not after training
        refuse_protected(target, inputs)
    resume_from = None
    if config.resume:
        resume_from = _last_checkpoint(output_dir)
        if resume_from is None:
            raise ConfigError(f"--resume: no checkpoint-N folder in {output_dir} (checkpoints need --save-steps)")
    source = resolve_policy(config.model_name_or_path)
    load = load_model or load_policy
    # Full fine-tuning keeps float32 master weights (bf16 compute comes from autocast); LoRA's frozen base loads in
    # the device's default dtype and peft keeps the adapters in float32.
    model, tokenizer = load(source) if config.use_lora else load(source, dtype="float32")
    loaded = weight_dtypes(model)["trainable"]
    upcast = None if config.use_lora else keep_float32_master_weights(model)
    if config.use_lora:
        model = apply_lora(model, r=config.lora_r, alpha=config.lora_alpha, dropout=config.lora_dropout,
                           target_modules=config.lora_target_modules, task_type=lora_task_type)
    trainer = build_trainer(config, model, tokenizer, data)
    _check_length_drops(trainer, data, config)
    probe = MovementProbe(trainer.model, seed=int(config.seed))
    precision = {"loaded_dtype": loaded, "upcast_from": upcast, **{f"{k}_dtype": v for k, v in
                                                                  weight_dtypes(trainer.model).items()},
                 "compute_dtype": compute_dtype(config), "trainable_elements": probe.total,
                 "sampled_elements": probe.sampled}
    started = time.perf_counter()
    try:
        output = trainer.train(resume_from_checkpoint=resume_from)
    except BaseException as exc:  # a checkpoint (--save-steps) on a full disk: one line too
        TrainOutputs(output_dir, f"train {name}").fail(exc)
        raise
    seconds = time.perf_counter() - started
    precision["moved_share"] = probe.moved_share(trainer.model)
    if precision["moved_share"] is not None and trainer.state.global_step > 0 and (
            precision["moved_share"] < MOVED_WARNING_SHARE):
        data.warnings.append(f"only {precision['moved_share']:.1%} of the trainable elements changed in training "
                             f"(weights {precision['trainable_dtype']}): updates smaller than the weights' "
                             "precision are lost; train float32 weights or raise the learning rate")
    main_process = trainer.is_world_process_zero()
    paths: dict[str, str] = {}
    staging = TrainOutputs(output_dir, f"train {name}")
    if main_process:  # under accelerate every process holds the model; one writes it
        staged = staging.stage()
        try:
            paths = {kind: str(staging.final(path)) for kind, path in save_policy(
                trainer.model, getattr(trainer, "processing_class", None) or tokenizer, staged,
                merge=config.merge_adapter).items()}
        except BaseException as exc:
            staging.discard()
            staging.fail(exc)
            raise
    history = _json_safe(list(trainer.state.log_history))
    metrics = _json_safe({**_summary(history, dict(output.metrics), int(trainer.state.global_step), seconds),
                          "precision": precision,
                          **((extra_metrics() if callable(extra_metrics) else extra_metrics) or {})})
    provenance = {
        "data": data.provenance(),
        "policy": source.to_dict(),
        "seed": config.seed,
        "config": _json_safe({**config.factory_settings(), **{k: getattr(config, k) for k in (
            "learning_rate", "max_steps", "num_train_epochs", "per_device_train_batch_size",
            "gradient_accumulation_steps", "use_cpu", "bf16", "gradient_checkpointing", "seed")}}),
        "trl_config": _json_safe(config.to_dict()),
        "resumed_from": resume_from,
        "world_size": int(config.world_size),
        "versions": _versions(),
    }
    result = TrainResult(name, output_dir, Path(paths["model"]) if paths.get("model") else None,
                         Path(paths["adapter"]) if paths.get("adapter") else None, metrics, history, provenance,
                         list(data.warnings), main_process=main_process)
    if main_process:
        try:
            plot = _plot_losses(history, staging.staged / "loss.png", f"factory train {name}: {data.path.name}",
                                inputs)
            result.plot_path = staging.final(plot) if plot is not None else None
            report = json.dumps(result.to_dict(), indent=2) + "\n"
            (staging.staged / RESULT_FILE).write_text(report, encoding="utf-8")
            staging.commit()
        except BaseException as exc:
            staging.discard()
            staging.fail(exc)
            raise
    return result
