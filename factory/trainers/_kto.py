"""``factory train kto``: TRL's KTOTrainer on a KTO export, with the class weights from its manifest.

The export balances desirable against undesirable rows through
``desirable_weight`` / ``undesirable_weight``, so that weight x count is
about equal for both classes (TRL advises a ratio between 1 and 4/3). The manifest carries them; a file without one gets
them computed from its labels. A weight the user set in the config wins. As for DPO, the loss (and the KL
estimate) sees only the assistant's tokens, and the length limit comes from the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trl

from factory.trainers._config import PreferenceSettings, TrainerSettings
from factory.trainers._data import TrainingData
from factory.trainers._preference import build_preference_trainer
from factory.trainers._run import TrainResult, run_training

__all__ = ["KTOConfig", "kto_class_weights", "train_kto"]


@dataclass
class KTOConfig(PreferenceSettings, TrainerSettings, trl.KTOConfig):
    """TRL's ``KTOConfig`` with the data, the policy, LoRA and CPU-safe defaults (see :class:`TrainerSettings`).

    ``desirable_weight`` / ``undesirable_weight`` default to None: taken from the export manifest.
    """

    desirable_weight: float | None = field(default=None, metadata={
        "help": "Weight of desirable rows' loss (default: the export manifest's, else from the labels)."})
    undesirable_weight: float | None = field(default=None, metadata={
        "help": "Weight of undesirable rows' loss (default: the export manifest's, else from the labels)."})

    def __post_init__(self) -> None:
        # TRL validates the weights as numbers; until the data is read they stay unset (1.0 stands in).
        self._weights_set = (self.desirable_weight, self.undesirable_weight)
        self.desirable_weight = 1.0 if self.desirable_weight is None else self.desirable_weight
        self.undesirable_weight = 1.0 if self.undesirable_weight is None else self.undesirable_weight
        super().__post_init__()


def kto_class_weights(data: TrainingData) -> tuple[dict[str, float], str]:
    """KTO's class weights for ``data``, and where they came from (``manifest`` or ``labels``)."""
    from factory.export import kto_weights

    recorded = data.manifest.kto if data.manifest is not None else None
    if recorded is not None:
        return {"desirable_weight": recorded.desirable_weight,
                "undesirable_weight": recorded.undesirable_weight}, "manifest"
    labels = data.dataset["label"]
    desirable = sum(bool(label) for label in labels)
    computed = kto_weights(desirable, len(labels) - desirable)
    return {k: float(computed[k]) for k in ("desirable_weight", "undesirable_weight")}, "labels"


def _build(config: KTOConfig, model, tokenizer, data: TrainingData, notes: dict[str, Any]) -> trl.KTOTrainer:
    weights, origin = kto_class_weights(data)
    desirable, undesirable = config._weights_set
    config.desirable_weight = weights["desirable_weight"] if desirable is None else desirable
    config.undesirable_weight = weights["undesirable_weight"] if undesirable is None else undesirable
    if desirable is None or undesirable is None:
        data.warnings.append(f"KTO class weights from the {origin}: desirable_weight={config.desirable_weight}, "
                             f"undesirable_weight={config.undesirable_weight}")
    return build_preference_trainer("kto", config, model, tokenizer, data, notes)


def train_kto(config: KTOConfig) -> TrainResult:
    """Train ``config.model_name_or_path`` with KTO on ``config.data_file``; see :func:`run_training`."""
    notes: dict[str, Any] = {}
    return run_training("kto", config, "kto", lambda *args: _build(*args, notes), extra_metrics=lambda: notes)
