"""Trainers: TRL-based DPO / KTO / SFT / reward-model / GRPO training on exported data, and hint distillation,
RW-SFT and Span-KTO on turn- and span-level feedback.

Each trainer is a TRL config subclass (``DPOConfig`` ...) and a ``train_x(config)``
function, registered by name in :data:`TRAINERS`. Importing this package
stays light: the trainer modules subclass TRL's configs, so they (and torch)
are imported only when one of their names is first used.
"""

from factory._lazy_exports import lazy_exports
from factory.trainers._data import load_training_data
from factory.trainers._fields import CONFIG_FIELDS, FieldDoc, describe_fields
from factory.trainers._registry import (
    TRAINERS,
    TrainerEntry,
    load_trainer,
    register_trainer,
    trainer_entry,
    trainer_names,
)
from factory.trainers._tiny import CHAT_TEMPLATE, build_tiny_model, ensure_tiny_model, tiny_model_dir

# Names whose modules import TRL (and the policy loader's), resolved on first use (PEP 562).
_LAZY = {
    "DPOConfig": "_dpo", "train_dpo": "_dpo",
    "KTOConfig": "_kto", "train_kto": "_kto",
    "SFTConfig": "_sft", "train_sft": "_sft",
    "RewardConfig": "_reward", "train_reward": "_reward",
    "GRPOConfig": "_grpo", "train_grpo": "_grpo",
    # the feedback trainers: their configs (train functions are reached by name, through load_trainer)
    "HintConfig": "_hint", "RWSFTConfig": "_rwsft", "SpanKTOConfig": "_spankto",
    # light, but resolved on use as well
    "PolicySource": "_models", "apply_lora": "_models", "load_policy": "_models", "resolve_policy": "_models",
    "save_policy": "_models",
    "VerifierReward": "_rewards", "completion_text": "_rewards",
}

__all__ = [
    "CHAT_TEMPLATE",
    "CONFIG_FIELDS",
    "DPOConfig",
    "FieldDoc",
    "GRPOConfig",
    "HintConfig",
    "KTOConfig",
    "RWSFTConfig",
    "RewardConfig",
    "SFTConfig",
    "SpanKTOConfig",
    "TRAINERS",
    "PolicySource",
    "TrainerEntry",
    "VerifierReward",
    "apply_lora",
    "build_tiny_model",
    "completion_text",
    "describe_fields",
    "ensure_tiny_model",
    "load_policy",
    "load_trainer",
    "load_training_data",
    "register_trainer",
    "resolve_policy",
    "save_policy",
    "train_dpo",
    "train_grpo",
    "train_kto",
    "train_reward",
    "tiny_model_dir",
    "train_sft",
    "trainer_entry",
    "trainer_names",
]


# The reward-hacking detector (numpy) and its TRL callback (transformers), resolved on use as well.
_LAZY.update({
    "DetectorReport": "_hacking", "DetectorSettings": "_hacking", "DetectorStatus": "_hacking",
    "HackingDetector": "_hacking", "StepObservation": "_hacking", "plot_detector": "_hacking",
    "read_detector_log": "_hacking", "replay_detector": "_hacking", "reward_bins": "_hacking", "reward_kl": "_hacking",
    "watch_rewards": "_hacking_callback", "compare_runs": "_hacking",
})
__all__ += [
    "DetectorReport", "DetectorSettings", "DetectorStatus", "HackingDetector", "StepObservation", "plot_detector",
    "read_detector_log", "replay_detector", "reward_bins", "reward_kl", "watch_rewards", "compare_runs",
]

# The reward-model ensemble (peft adapters on one base) and its GRPO reward, resolved on use as well.
_LAZY.update({"RewardEnsemble": "_ensemble", "EnsembleReward": "_ensemble"})
__all__ += ["EnsembleReward", "RewardEnsemble"]

__getattr__ = lazy_exports(__name__, _LAZY)
