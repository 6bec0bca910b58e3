"""``factory train reward``: a reward model, from preference pairs or from scalar rewards.

* **pairwise** (the reward export, ``chosen`` / ``rejected`` / ``margin``):
  TRL's RewardTrainer fits a Bradley-Terry reward model; the margin enters
  the loss (``-log sigmoid(r_chosen - r_rejected - margin)``), so pairs the
  verifiers separated widely must be separated widely.
* **regression** (the export's scalar file, ``prompt`` / ``completion`` /
  ``reward``): TRL has no trainer for scalar rewards, so a plain transformers
  ``Trainer`` fits the same one-output head with a mean squared error.

Both start from the policy's weights with a fresh one-output head
(``AutoModelForSequenceClassification``, ``num_labels=1``) and save a model
that scores a conversation with one forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trl

from factory.errors import ConfigError
from factory.trainers._config import TrainerSettings
from factory.trainers._data import TrainingData, load_training_data
from factory.trainers._models import PolicySource, load_policy
from factory.trainers._run import TrainResult, run_training

__all__ = ["REWARD_OBJECTIVES", "RewardConfig", "load_reward_model", "train_reward"]

REWARD_OBJECTIVES = ("auto", "pairwise", "regression")


@dataclass
class RewardConfig(TrainerSettings, trl.RewardConfig):
    """TRL's ``RewardConfig`` with the data, the policy, LoRA and CPU-safe defaults (see :class:`TrainerSettings`).

    Attributes:
        objective: ``pairwise`` (Bradley-Terry on pairs), ``regression`` (MSE on scalar rewards), or ``auto``:
            from the file (the reward export's scalar file, or rows with ``reward`` and no ``chosen``, regress).
        ensemble: Reward models to train (K >= 2: an ensemble of LoRA members, see :mod:`factory.trainers._ensemble`).
    """

    objective: str = field(default="auto", metadata={
        "help": "pairwise (RewardTrainer on chosen/rejected/margin), regression (MSE on the scalar file), or auto."})
    ensemble: int = field(default=1, metadata={
        "help": "Train K reward models as one ensemble (K >= 2): LoRA adapters with their own heads on one frozen "
                "base, member k with seed seed+k on a bootstrap resample of the rows; OUTPUT/ensemble.json lists "
                "them. `factory train grpo --reward-model OUTPUT --uncertainty-penalty λ` rewards mean - λ·std."})

    def __post_init__(self) -> None:
        if self.objective not in REWARD_OBJECTIVES:
            raise ConfigError(f"reward objective must be one of {', '.join(REWARD_OBJECTIVES)}, got {self.objective!r}")
        if self.ensemble < 1:
            raise ConfigError(f"ensemble must be at least 1 (one reward model), got {self.ensemble}")
        super().__post_init__()


def load_reward_model(source: PolicySource, *, dtype: Any = None) -> tuple[Any, Any]:
    """The policy's backbone under a fresh one-output scoring head, and its tokenizer.

    Loading the causal LM first and moving its weights over works for every source the policy loader reads
    (folders, hub ids, GGUF files); only the head (``score``) starts from random.

    Args:
        source: The policy.
        dtype: The dtype to load in (see :func:`~factory.trainers._models.load_policy`).
    """
    import torch
    from transformers import AutoModelForSequenceClassification

    causal, tokenizer = load_policy(source, dtype=dtype)
    config = causal.config
    config.num_labels = 1
    config.pad_token_id = tokenizer.pad_token_id
    scorer = AutoModelForSequenceClassification.from_config(config, dtype=causal.dtype)
    missing, _ = scorer.load_state_dict(causal.state_dict(), strict=False)
    stray = [name for name in missing if not name.startswith("score.")]
    if stray:
        raise ConfigError(f"{source.spec}: the scoring model lacks backbone weights {stray[:3]}...")
    with torch.no_grad():  # a small head: the first rewards are near 0 instead of the embedding's scale
        scorer.score.weight.normal_(0.0, 1.0 / config.hidden_size**0.5)
    del causal
    return scorer, tokenizer


def _objective(config: RewardConfig, data: TrainingData) -> str:
    if config.objective != "auto":
        return config.objective
    return "regression" if data.format == "reward-scalar" or (
        "reward" in data.dataset.column_names and "chosen" not in data.dataset.column_names) else "pairwise"


def _pairwise(config: RewardConfig, model, tokenizer, data: TrainingData) -> trl.RewardTrainer:
    return trl.RewardTrainer(model=model, args=config, train_dataset=data.dataset, processing_class=tokenizer)


def _scalar_text(tokenizer, prompt: Any, completion: Any) -> str:
    if isinstance(prompt, list):  # conversational: the chat template, tool calls included
        return tokenizer.apply_chat_template(list(prompt) + list(completion), tokenize=False)
    return f"{prompt}{completion}"


def _regression(config: RewardConfig, model, tokenizer, data: TrainingData):
    from transformers import DataCollatorWithPadding, Trainer

    model.config.problem_type = "regression"  # num_labels=1 + float labels: mean squared error

    def encode(row: dict[str, Any]) -> dict[str, Any]:
        encoded = tokenizer(_scalar_text(tokenizer, row["prompt"], row["completion"]), truncation=True,
                            max_length=config.max_length, add_special_tokens=False)
        return {**encoded, "labels": float(row["reward"])}

    columns = data.dataset.column_names
    encoded = data.dataset.map(encode, remove_columns=columns, desc="tokenizing scalar rewards")
    config.remove_unused_columns = False
    return Trainer(model=model, args=config, train_dataset=encoded, processing_class=tokenizer,
                   data_collator=DataCollatorWithPadding(tokenizer))


def train_reward(config: RewardConfig) -> TrainResult:
    """Train a reward model on ``config.data_file`` (pairs or scalar rewards); see :func:`run_training`."""
    if not config.data_file:
        raise ConfigError("no training data: give --data FILE (an export from `factory export reward`)")
    data = load_training_data(config.data_file, ("reward", "reward-scalar"))
    objective = _objective(config, data)
    if objective == "regression" and "reward" not in data.dataset.column_names:
        raise ConfigError(f"{data.path}: field 'reward': missing; regression needs the reward export's scalar file "
                          f"({data.path.stem}.scalar{data.path.suffix})")
    if objective == "pairwise" and "chosen" not in data.dataset.column_names:
        raise ConfigError(f"{data.path}: field 'chosen': missing; pairwise training needs the reward export's pairs")
    build = _regression if objective == "regression" else _pairwise
    if config.ensemble > 1:
        from factory.trainers._ensemble import train_reward_ensemble

        return train_reward_ensemble(config, data, build, objective)
    return run_training("reward", config, ("reward", "reward-scalar"), build, load_model=load_reward_model,
                        lora_task_type="SEQ_CLS", data=data,
                        extra_metrics={"objective": objective})
