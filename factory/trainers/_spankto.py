"""``factory train span-kto``: KTO on the spans of a ``spans`` export, plus cross-entropy on the neutral ones.

Each assistant message of a trajectory is a span s with a polarity (``positive``, ``neutral``, ``negative``).
A positive or negative span is scored by its summed log-ratio between the policy π_θ and a frozen reference
π_ref (the policy with its LoRA adapter switched off, or a frozen copy of the starting weights)::

    ρ_s = Σ_{i ∈ s} (log π_θ(y_i | y_<i) - log π_ref(y_i | y_<i))

against a reference point z_ref, an exponential moving average of the batches' mean span score (no gradient;
0 before the first batch, where π_θ = π_ref)::

    z_ref ← d · z_ref + (1 - d) · mean_s ρ_s          (d: reference_point_decay, after each batch's loss)

with KTO's separate value functions for desirable (positive) and undesirable (negative) spans::

    positive:  L_s = λ_w · (1 - σ(β (ρ_s - z_ref)))
    negative:  L_s = λ_l · (1 - σ(β (z_ref - ρ_s)))

and the neutral assistant tokens kept as they are by their cross-entropy, with weight γ::

    loss = mean_{s positive or negative} L_s + γ · mean_{i neutral} (-log π_θ(y_i | y_<i))

Prompts, tool results and the template's headers are in neither term. The same batch's spans give the
reference point, so it tracks how far the policy moved on average, and a span is rewarded for moving
further than that in its own direction (Ethayarajh et al.'s KTO, with spans in place of whole completions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers

from factory.errors import ConfigError
from factory.trainers._config import TrainerSettings
from factory.trainers._data import TrainingData
from factory.trainers._feedback import (
    FeedbackSettings,
    FeedbackTrainer,
    SpanCollator,
    adapters_off,
    span_rows,
    token_logps,
)
from factory.trainers._run import TrainResult, frozen_reference, run_training

__all__ = ["SpanKTOConfig", "SpanKTOTrainer", "span_kto_loss", "span_logps", "train_span_kto"]


@dataclass
class SpanKTOConfig(FeedbackSettings, TrainerSettings, transformers.TrainingArguments):
    """Span-level KTO: transformers' ``TrainingArguments`` with the data, the policy, LoRA and CPU-safe defaults
    (see :class:`TrainerSettings`), and KTO's settings per span (the module's formulas).
    """

    beta: float = field(default=0.1, metadata={"help": "KTO's β: how sharply a span's log-ratio is valued."})
    desirable_weight: float = field(default=1.0, metadata={"help": "λ_w: weight of the positive spans' loss."})
    undesirable_weight: float = field(default=1.0, metadata={"help": "λ_l: weight of the negative spans' loss."})
    neutral_weight: float = field(default=1.0, metadata={
        "help": "γ: weight of the cross-entropy on neutral assistant tokens (0: none)."})
    reference_point_decay: float = field(default=0.9, metadata={
        "help": "d: the reference point z_ref is the moving average d * z_ref + (1 - d) * (batch's mean span "
                "log-ratio)."})
    learning_rate: float = field(default=1e-6, metadata={"help": "The initial learning rate for AdamW."})

    def __post_init__(self) -> None:
        for name in ("beta", "desirable_weight", "undesirable_weight"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ConfigError(f"{name} must be a positive number, got {getattr(self, name)!r}")
        if not (math.isfinite(self.neutral_weight) and self.neutral_weight >= 0):
            raise ConfigError(f"neutral_weight must be 0 or more, got {self.neutral_weight!r}")
        if not 0 <= self.reference_point_decay < 1:
            raise ConfigError(f"reference_point_decay must be in [0, 1), got {self.reference_point_decay!r}")
        super().__post_init__()


def span_logps(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probabilities ``(B, T-1)`` of a :class:`SpanCollator` batch, and their sum per span ``(S,)``."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    logps = token_logps(logits[:, :-1], batch["labels"])
    return logps, span_sums(logps, batch)


def span_sums(values: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``values`` ``(B, T-1)`` summed over each span of the batch: ``(S,)``."""
    span = batch["span"]
    inside = span >= 0
    sums = torch.zeros(batch["polarity"].shape[0], dtype=values.dtype, device=values.device)
    return sums.index_add(0, span[inside], values[inside])


def span_kto_loss(policy: torch.Tensor, reference: torch.Tensor, batch: dict[str, torch.Tensor], z_ref: float,
                  config: SpanKTOConfig) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The module's loss from per-token log-probabilities of the policy and the reference.

    Returns:
        ``(loss, ρ per span, figures)``: figures are the KTO term, the neutral cross-entropy and the mean ρ of
        the positive and the negative spans, where the batch has them.
    """
    ratio = span_sums(policy - reference, batch)
    sign = batch["polarity"]
    positive, negative = sign > 0, sign < 0
    values = torch.zeros_like(ratio)
    values = torch.where(positive, config.desirable_weight * (1 - torch.sigmoid(config.beta * (ratio - z_ref))),
                         values)
    values = torch.where(negative, config.undesirable_weight * (1 - torch.sigmoid(config.beta * (z_ref - ratio))),
                         values)
    scored = positive | negative
    kto = values[scored].mean() if scored.any() else ratio.sum() * 0
    span = batch["span"]
    neutral = (span >= 0) & (sign[span.clamp(min=0)] == 0)
    ce = -policy[neutral].mean() if neutral.any() else policy.sum() * 0
    figures = {"kto_loss": kto.detach(), "neutral_nll": ce.detach()}
    if positive.any():
        figures["rho_positive"] = ratio.detach()[positive].mean()
    if negative.any():
        figures["rho_negative"] = ratio.detach()[negative].mean()
    return kto + config.neutral_weight * ce, ratio, figures


class SpanKTOTrainer(FeedbackTrainer):
    """KTO on positive and negative spans against a moving reference point, CE on neutral tokens.

    Args:
        *args: transformers ``Trainer``'s.
        ref_model: A frozen copy of the starting policy; None under LoRA (the adapter is switched off instead).
        **kwargs: transformers ``Trainer``'s; ``args`` is a :class:`SpanKTOConfig`.
    """

    def __init__(self, *args: Any, ref_model: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ref_model = ref_model.to(self.args.device) if ref_model is not None else None
        self.z_ref = 0.0

    def _reference_logps(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            if self.ref_model is not None:
                return span_logps(self.ref_model, inputs)[0]
            with adapters_off(self.accelerator.unwrap_model(model)):
                return span_logps(model, inputs)[0]

    def compute_loss(self, model: Any, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        config: SpanKTOConfig = self.args
        reference = self._reference_logps(model, inputs)
        policy, _ = span_logps(model, inputs)
        loss, ratio, figures = span_kto_loss(policy, reference, inputs, self.z_ref, config)
        scored = inputs["polarity"] != 0
        if scored.any():  # the batch's mean span score, the same on every process
            batch_mean = self.accelerator.reduce(ratio.detach()[scored].mean(), reduction="mean")
            self.z_ref = config.reference_point_decay * self.z_ref + (1 - config.reference_point_decay) * float(
                batch_mean)
        self.record(z_ref=self.z_ref, **figures)
        return (loss, {"rho": ratio}) if return_outputs else loss


def train_span_kto(config: SpanKTOConfig) -> TrainResult:
    """Train ``config.model_name_or_path`` with Span-KTO on ``config.data_file``; see :func:`run_training`.

    ``train_result.json`` records the rows and the spans and tokens per polarity (``metrics.span_rows``), the
    final reference point (``metrics.z_ref``) and, per logging step, the mean log-ratio of the positive and the
    negative spans, the KTO term and the neutral cross-entropy.
    """
    notes: dict[str, Any] = {}
    built: list[SpanKTOTrainer] = []

    def build(config: SpanKTOConfig, model: Any, tokenizer: Any, data: TrainingData) -> SpanKTOTrainer:
        rows = span_rows(config, model, tokenizer, data, notes)
        trainer = SpanKTOTrainer(model=model, ref_model=frozen_reference(model), args=config, train_dataset=rows,
                                 data_collator=SpanCollator(tokenizer.pad_token_id), processing_class=tokenizer)
        built.append(trainer)
        return trainer

    return run_training("span-kto", config, "spans", build,
                        extra_metrics=lambda: {**notes, "z_ref": built[0].z_ref if built else None})
