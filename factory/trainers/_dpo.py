"""``factory train dpo``: TRL's DPOTrainer on a DPO export (``prompt``, ``chosen``, ``rejected``).

The loss sees only the assistant's tokens of each completion (not the tool results between them), and the length
limit comes from the data; see :mod:`factory.trainers._masks` and :mod:`factory.trainers._lengths`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trl

from factory.trainers._config import PreferenceSettings, TrainerSettings
from factory.trainers._preference import build_preference_trainer
from factory.trainers._run import TrainResult, run_training

__all__ = ["DPOConfig", "train_dpo"]


@dataclass
class DPOConfig(PreferenceSettings, TrainerSettings, trl.DPOConfig):
    """TRL's ``DPOConfig`` with the data, the policy, LoRA and CPU-safe defaults (see :class:`TrainerSettings`).

    With LoRA the reference model is the policy with its adapter switched off, so no second copy is held.
    ``max_length`` defaults to the longest row (up to the model's context) and ``allow_unmasked`` to False (see
    :class:`PreferenceSettings`).
    """


def train_dpo(config: DPOConfig) -> TrainResult:
    """Train ``config.model_name_or_path`` with DPO on ``config.data_file``; see :func:`run_training`.

    ``train_result.json`` records which tokens the loss saw (``metrics.loss_mask``) and the length limit with the
    prompts cut to fit it (``metrics.prompt_fit``).
    """
    notes: dict[str, Any] = {}

    def build(config: DPOConfig, model: Any, tokenizer: Any, data: Any) -> trl.DPOTrainer:
        return build_preference_trainer("dpo", config, model, tokenizer, data, notes)

    return run_training("dpo", config, "dpo", build, extra_metrics=lambda: notes)
