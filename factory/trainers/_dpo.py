"""``factory train dpo``: TRL's DPOTrainer on a DPO export (``prompt``, ``chosen``, ``rejected``)."""

from __future__ import annotations

from dataclasses import dataclass

import trl

from factory.trainers._config import TrainerSettings
from factory.trainers._run import TrainResult, frozen_reference, run_training

__all__ = ["DPOConfig", "train_dpo"]


@dataclass
class DPOConfig(TrainerSettings, trl.DPOConfig):
    """TRL's ``DPOConfig`` with the data, the policy, LoRA and CPU-safe defaults (see :class:`TrainerSettings`).

    With LoRA the reference model is the policy with its adapter switched off, so no second copy is held.
    """


def _build(config: DPOConfig, model, tokenizer, data) -> trl.DPOTrainer:
    return trl.DPOTrainer(model=model, ref_model=frozen_reference(model), args=config, train_dataset=data.dataset,
                          processing_class=tokenizer)


def train_dpo(config: DPOConfig) -> TrainResult:
    """Train ``config.model_name_or_path`` with DPO on ``config.data_file``; see :func:`run_training`."""
    return run_training("dpo", config, "dpo", _build)
