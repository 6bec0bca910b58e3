"""Trainers: TRL-based DPO / KTO / SFT / reward-model / GRPO training on exported data.

Each trainer is a TRL config subclass (``DPOConfig`` ...) and a ``train_x(config)``
function; :func:`run_training` is the shape they share. Importing this package
stays light: the trainer modules subclass TRL's configs, so they (and torch)
are imported only when one of their names is first used.
"""

from factory._lazy_exports import lazy_exports
from factory.trainers._config import TrainerSettings, device_defaults
from factory.trainers._data import TrainingData, load_training_data
from factory.trainers._registry import (
    TRAINERS,
    TrainerEntry,
    load_trainer,
    register_trainer,
    trainer_entry,
    trainer_names,
)
from factory.trainers._run import RESULT_FILE, TrainResult, frozen_reference, run_training
from factory.trainers._tiny import CHAT_TEMPLATE, build_tiny_model

# Names whose modules import TRL (and the policy loader's), resolved on first use (PEP 562).
_LAZY = {
    "DPOConfig": "_dpo", "train_dpo": "_dpo",
    "KTOConfig": "_kto", "kto_class_weights": "_kto", "train_kto": "_kto",
    "SFTConfig": "_sft", "train_sft": "_sft",
    "REWARD_OBJECTIVES": "_reward", "RewardConfig": "_reward", "load_reward_model": "_reward",
    "train_reward": "_reward",
    "GRPOConfig": "_grpo", "train_grpo": "_grpo",
    # light, but resolved on use as well
    "PolicySource": "_models", "apply_lora": "_models", "load_policy": "_models", "resolve_policy": "_models",
    "save_policy": "_models", "is_peft_model": "_models",
    "VerifierReward": "_rewards", "completion_text": "_rewards",
}

__all__ = [
    "CHAT_TEMPLATE",
    "DPOConfig",
    "GRPOConfig",
    "KTOConfig",
    "RESULT_FILE",
    "REWARD_OBJECTIVES",
    "RewardConfig",
    "SFTConfig",
    "TRAINERS",
    "PolicySource",
    "TrainResult",
    "TrainerEntry",
    "TrainerSettings",
    "TrainingData",
    "VerifierReward",
    "apply_lora",
    "build_tiny_model",
    "completion_text",
    "device_defaults",
    "frozen_reference",
    "is_peft_model",
    "kto_class_weights",
    "load_policy",
    "load_reward_model",
    "load_trainer",
    "load_training_data",
    "register_trainer",
    "resolve_policy",
    "run_training",
    "save_policy",
    "train_dpo",
    "train_grpo",
    "train_kto",
    "train_reward",
    "train_sft",
    "trainer_entry",
    "trainer_names",
]


__getattr__ = lazy_exports(__name__, _LAZY)
