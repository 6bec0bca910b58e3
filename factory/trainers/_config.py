"""What every trainer's config adds to TRL's: the data, the policy, LoRA, and defaults that are safe on a CPU.

Each trainer's ``XConfig`` is a dataclass subclass of TRL's config with this
mixin in front (``class DPOConfig(TrainerSettings, trl.DPOConfig)``), so every
TRL and ``TrainingArguments`` field still works, from Python, from
``--config FILE.yaml`` and under ``accelerate launch``.

Device defaults are decided when the config is made, not at import:

* no GPU (or ``use_cpu``): ``use_cpu=True``, bf16 off, no gradient
  checkpointing (TRL turns it on by default; on a CPU it only costs time);
* a GPU: bf16 where the GPU supports it, TRL's gradient checkpointing, and
  accelerate spreads the work over every GPU the launcher gives it.

A field a user set explicitly is never overridden.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["PreferenceSettings", "TrainerSettings", "device_defaults"]


def device_defaults(*, use_cpu: bool | None) -> dict[str, Any]:
    """What ``use_cpu``, ``bf16`` and ``gradient_checkpointing`` default to on this machine."""
    import torch

    gpu = torch.cuda.is_available() and not use_cpu
    return {"use_cpu": not gpu, "bf16": bool(gpu and torch.cuda.is_bf16_supported()), "gradient_checkpointing": gpu}


@dataclass
class TrainerSettings:
    """Fields `factory` adds to a TRL config, and CPU-safe defaults for some of TRL's own.

    Attributes:
        data_file: The export file to train on.
        model_name_or_path: The policy to start from.
        use_lora: Train a LoRA adapter instead of every weight.
        lora_r: LoRA rank.
        lora_alpha: LoRA alpha.
        lora_dropout: LoRA dropout.
        lora_target_modules: Modules that get an adapter.
        merge_adapter: Also write the merged checkpoint.
        resume: Resume from the newest checkpoint in ``output_dir``.
    """

    data_file: str | None = field(default=None, metadata={
        "help": "The export file to train on (.jsonl or .parquet from `factory export`; its manifest is read too)."})
    model_name_or_path: str = field(default="local", metadata={
        "help": "The policy: a Hugging Face model folder, `hf:DIR`, a hub id (needs the network), a .gguf file, "
                "`local` for the embedded default GGUF (dequantized to train), or `tiny` for a tiny offline model "
                "that trains in seconds (built once, cached)."})
    use_lora: bool = field(default=False, metadata={
        "help": "Train a LoRA adapter; the output holds the adapter and the merged checkpoint."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha (scale = alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(default=None, metadata={
        "help": "Modules that get an adapter (default: every linear layer but the output head)."})
    merge_adapter: bool = field(default=True, metadata={
        "help": "With LoRA: also write the merged full checkpoint (output_dir/model) beside the adapter."})
    resume: bool = field(default=False, metadata={
        "help": "Resume from the newest checkpoint-N in output_dir (checkpoints are written every save_steps)."})

    # TRL's own fields, with defaults that fit a CPU and this tool's output layout. None: decided per machine.
    use_cpu: bool | None = field(default=None, metadata={
        "help": "Train on the CPU even where a GPU is present (default: only where none is)."})
    bf16: bool | None = field(default=None, metadata={
        "help": "bf16 mixed precision (default: on a GPU that supports it; off on the CPU)."})
    gradient_checkpointing: bool | None = field(default=None, metadata={
        "help": "Recompute activations to save memory (default: on a GPU; off on the CPU, where it only costs time)."})
    logging_steps: float = field(default=1, metadata={"help": "Log every N optimizer steps."})
    save_strategy: str = field(default="no", metadata={
        "help": "When to write checkpoint-N folders (`steps` with save_steps to make runs resumable)."})
    report_to: str | list[str] = field(default="none", metadata={
        "help": "Experiment trackers to report to (none: the metrics land in output_dir/train_result.json)."})

    def __post_init__(self) -> None:
        defaults = device_defaults(use_cpu=self.use_cpu)
        if hasattr(self, "activation_checkpointing"):  # transformers >= 5.2 renamed it; the old name warns
            checkpointing = defaults.pop("gradient_checkpointing")
            if self.gradient_checkpointing is None and self.activation_checkpointing is None:
                self.activation_checkpointing = checkpointing
        for name, value in defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        super().__post_init__()  # type: ignore[misc]  (TRL's config, next in the MRO)

    def factory_settings(self) -> dict[str, Any]:
        """The fields this mixin adds, for the training result."""
        return {name: getattr(self, name) for name in (
            "data_file", "model_name_or_path", "use_lora", "lora_r", "lora_alpha", "lora_dropout",
            "lora_target_modules", "merge_adapter", "resume")}


@dataclass
class PreferenceSettings:
    """Fields the DPO and KTO configs add: which tokens the loss sees, and a length limit read from the data.

    Attributes:
        allow_unmasked: Train on every completion token where the chat template cannot mark the assistant's.
        max_length: The length limit; None takes it from the data, capped at the model's context.
    """

    allow_unmasked: bool = field(default=False, metadata={
        "help": "Where the chat template cannot mark the assistant's turns, train on every completion token (tool "
                "results included) instead of stopping; recorded in train_result.json."})
    max_length: int | None = field(default=None, metadata={
        "help": "Longest row in tokens (prompt + completion); longer prompts are cut from the left at message "
                "boundaries, keeping the system message, the task prompt and the latest turns (default: the "
                "longest row, up to the model's context)."})
