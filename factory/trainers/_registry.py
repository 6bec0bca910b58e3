"""Trainers by name: ``factory train NAME`` -> the trainer's config class and train function.

Registered in :data:`TRAINERS` as ``"module:attribute"`` strings so that the CLI can list and
describe trainers without importing torch or TRL; :func:`load_trainer`
imports one when it is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from factory.errors import ConfigError
from factory.registry import Registry

__all__ = ["TRAINERS", "TrainerEntry", "load_trainer", "register_trainer", "trainer_entry", "trainer_names"]


@dataclass(frozen=True)
class TrainerEntry:
    """A registered trainer.

    Attributes:
        name: Its name (``factory train NAME``).
        config: ``"module:Class"`` of its config (a TRL config with :class:`TrainerSettings`).
        train: ``"module:function"`` of its ``train_x(config) -> TrainResult``.
        reads: The export format it trains on.
        summary: One line for ``--help``.
    """

    name: str
    config: str
    train: str
    reads: str
    summary: str


#: Trainers by name (``factory train NAME``); entries name their modules, so listing imports no TRL.
TRAINERS: Registry[TrainerEntry] = Registry("trainer")


def register_trainer(entry: TrainerEntry) -> None:
    """Register (or replace) a trainer under ``entry.name``."""
    TRAINERS.register(entry.name, entry)


def trainer_names() -> list[str]:
    """Registered trainer names."""
    return TRAINERS.names()


def trainer_entry(name: str) -> TrainerEntry:
    """The registration of trainer ``name`` (no import of TRL).

    Raises:
        ConfigError: Unknown trainer.
    """
    if name not in TRAINERS:  # this message predates the registry's; scripts may match it
        raise ConfigError(f"unknown trainer {name!r} (use one of: {', '.join(trainer_names())})")
    return TRAINERS.get(name)


def _resolve(target: str) -> Any:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def load_trainer(name: str) -> tuple[type, Callable[[Any], Any], TrainerEntry]:
    """The config class and train function of trainer ``name`` (imports TRL).

    Raises:
        ConfigError: Unknown trainer, or the ``train`` extra is not installed.
    """
    entry = trainer_entry(name)
    try:
        return _resolve(entry.config), _resolve(entry.train), entry
    except ImportError as exc:
        raise ConfigError(f"training needs the 'train' extra ({exc.name} is missing): "
                          "pip install 'factory-rlaif[train]'") from exc


for _entry in (
    TrainerEntry("dpo", "factory.trainers._dpo:DPOConfig", "factory.trainers._dpo:train_dpo", "dpo",
                 "Direct preference optimisation on a DPO export (prompt, chosen, rejected)."),
    TrainerEntry("kto", "factory.trainers._kto:KTOConfig", "factory.trainers._kto:train_kto", "kto",
                 "KTO on a KTO export (prompt, completion, label), class weights from its manifest."),
    TrainerEntry("sft", "factory.trainers._sft:SFTConfig", "factory.trainers._sft:train_sft", "sft",
                 "Supervised fine-tuning on the winners' conversations (messages), loss on assistant turns."),
    TrainerEntry("reward", "factory.trainers._reward:RewardConfig", "factory.trainers._reward:train_reward",
                 "reward", "A reward model: Bradley-Terry on pairs with margins, or regression on the scalar file."),
    TrainerEntry("hint", "factory.trainers._hint:HintConfig", "factory.trainers._hint:train_hint", "hints",
                 "Hint distillation: the policy without a turn's hint pulled toward itself with the hint (KL on that "
                 "turn's tokens only)."),
    TrainerEntry("rw-sft", "factory.trainers._rwsft:RWSFTConfig", "factory.trainers._rwsft:train_rw_sft", "spans",
                 "Reward-weighted SFT on a spans export: each assistant token's cross-entropy weighted by its span's "
                 "polarity."),
    TrainerEntry("span-kto", "factory.trainers._spankto:SpanKTOConfig", "factory.trainers._spankto:train_span_kto",
                 "spans", "Span-KTO: positive and negative spans scored by their log-ratio to a frozen reference, "
                          "CE on neutral tokens."),
    TrainerEntry("grpo", "factory.trainers._grpo:GRPOConfig", "factory.trainers._grpo:train_grpo", "grpo",
                 "GRPO on a GRPO export, each completion rewarded by the task's verifiers in a sandbox."),
):
    register_trainer(_entry)
