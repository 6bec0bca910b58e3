"""``factory train grpo``: TRL's GRPOTrainer on a GRPO export, rewarded by our verifiers.

The export holds one prompt per task and the task's spec; every group of
``num_generations`` completions is scored by :class:`VerifierReward` (the
task's answer / tests / build / schema / rules verifiers, tool calls and
tests run in a sandbox), so the policy is trained online on the same checks
that made the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import trl

from factory.errors import ConfigError
from factory.trainers._config import TrainerSettings
from factory.trainers._data import TrainingData
from factory.trainers._models import is_peft_model
from factory.trainers._rewards import VerifierReward
from factory.trainers._run import TrainResult, run_training

__all__ = ["GRPOConfig", "train_grpo"]


@dataclass
class GRPOConfig(TrainerSettings, trl.GRPOConfig):
    """TRL's ``GRPOConfig`` with the data, the policy, LoRA, CPU-safe defaults and the verifier reward's settings.

    Attributes:
        sandbox: Sandbox backend for the completions' tool calls and the tests.
        reward_verifiers: Only these objective verifiers score (default: each task's own).
        reward_concurrency: Completions verified at once.
    """

    sandbox: str = field(default="bwrap", metadata={
        "help": "Sandbox backend where completions' tool calls and the task's tests run."})
    reward_verifiers: list[str] | None = field(default=None, metadata={
        "help": "Objective verifiers that score completions (default: every one the task's fields select)."})
    reward_concurrency: int = field(default=2, metadata={"help": "Completions verified at once."})


def train_grpo(config: GRPOConfig) -> TrainResult:
    """Train ``config.model_name_or_path`` with GRPO on ``config.data_file``'s prompts; see :func:`run_training`."""
    reward = VerifierReward(config.sandbox, verifiers=config.reward_verifiers, concurrency=config.reward_concurrency)

    def build(config: GRPOConfig, model, tokenizer, data: TrainingData) -> trl.GRPOTrainer:
        source = Path(getattr(model.config, "_name_or_path", "") or ".")
        if config.beta != 0.0 and not is_peft_model(model) and not (source / "config.json").is_file():
            # TRL reloads the KL reference from the policy's folder, and a GGUF's folder holds no config.json
            raise ConfigError(f"GRPO with beta={config.beta} on {config.model_name_or_path}: use --lora "
                              "(the reference is the policy without its adapter) or --set beta=0")
        return trl.GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=data.dataset,
                               processing_class=tokenizer)

    return run_training("grpo", config, "grpo", build,
                        extra_metrics=lambda: {f"reward_{key}": value for key, value in sorted(reward.counts.items())})
