"""``factory train rw-sft``: reward-weighted SFT on a ``spans`` export, each token weighted by its span's polarity.

A ``spans`` row is a whole trajectory with a polarity per message (``positive``, ``neutral``, ``negative``;
only assistant messages carry anything but ``neutral``). Every assistant token's cross-entropy is weighted by
its message's polarity weight; the prompt, the tool results and the template's headers are never in the loss::

    w(i) = w_pos | w_neu | w_neg           (the polarity of the assistant message token i belongs to)
    loss = Σ_i w(i) · (-log π_θ(y_i | y_<i)) / N

where i runs over the assistant tokens of the batch and N is their count, whatever their weights: the
normaliser does not depend on the weights, so a span of weight 0 contributes exactly nothing, to the loss
and to the gradient (the tests check the gradient at its logits is 0). A negative ``w_neg`` pushes those
tokens' probability down (unlikelihood-style; unbounded, so use it with a small learning rate); the default 0
only stops learning them.
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
from factory.trainers._feedback import FeedbackSettings, FeedbackTrainer, SpanCollator, span_rows, token_logps
from factory.trainers._run import TrainResult, run_training

__all__ = ["RWSFTConfig", "RWSFTTrainer", "rw_sft_loss", "train_rw_sft"]


@dataclass
class RWSFTConfig(FeedbackSettings, TrainerSettings, transformers.TrainingArguments):
    """Reward-weighted SFT: transformers' ``TrainingArguments`` with the data, the policy, LoRA and CPU-safe
    defaults (see :class:`TrainerSettings`), and a weight per polarity (the module's formula).
    """

    w_pos: float = field(default=1.0, metadata={"help": "Weight of the cross-entropy of positive spans' tokens."})
    w_neu: float = field(default=0.5, metadata={"help": "Weight of the cross-entropy of neutral assistant tokens."})
    w_neg: float = field(default=0.0, metadata={
        "help": "Weight of the cross-entropy of negative spans' tokens (0: not learnt; below 0: pushed down)."})
    learning_rate: float = field(default=2e-5, metadata={"help": "The initial learning rate for AdamW."})

    def __post_init__(self) -> None:
        for name in ("w_pos", "w_neu", "w_neg"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"{name} must be a finite number, got {getattr(self, name)!r}")
        super().__post_init__()

    def weights(self) -> torch.Tensor:
        """The weight of each polarity sign, indexed by sign + 1 (negative, neutral, positive)."""
        return torch.tensor([self.w_neg, self.w_neu, self.w_pos], dtype=torch.float32)


def rw_sft_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor], weights: torch.Tensor
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The module's loss for ``logits`` ``(B, T, V)`` of a :class:`SpanCollator` batch, and per-polarity mean CE.

    Args:
        logits: The policy's logits over the batch's ``input_ids``.
        batch: The collator's batch.
        weights: Per polarity sign + 1 (see :meth:`RWSFTConfig.weights`).
    """
    labels, span = batch["labels"], batch["span"]
    inside = span >= 0
    nll = -token_logps(logits[:, :-1], labels)
    sign = batch["polarity"][span.clamp(min=0)]
    weight = torch.where(inside, weights.to(logits.device)[sign + 1], torch.zeros((), device=logits.device))
    loss = (weight * nll).sum() / inside.sum().clamp(min=1)
    figures = {}
    for name, value in zip(("negative", "neutral", "positive"), (-1, 0, 1), strict=True):
        chosen = inside & (sign == value)
        if chosen.any():
            figures[f"nll_{name}"] = nll.detach()[chosen].mean()
    return loss, figures


class RWSFTTrainer(FeedbackTrainer):
    """Cross-entropy on the assistant's tokens, each weighted by its span's polarity (see the module docstring).

    Args:
        *args: transformers ``Trainer``'s.
        **kwargs: transformers ``Trainer``'s; ``args`` is an :class:`RWSFTConfig`.
    """

    def compute_loss(self, model: Any, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False)
        loss, figures = rw_sft_loss(outputs.logits, inputs, self.args.weights())
        self.record(**figures)
        return (loss, outputs) if return_outputs else loss


def train_rw_sft(config: RWSFTConfig) -> TrainResult:
    """Fine-tune ``config.model_name_or_path`` on ``config.data_file`` with span weights; see :func:`run_training`.

    ``train_result.json`` records the rows and the tokens per polarity (``metrics.span_rows``) and, per logging
    step, each polarity's mean cross-entropy.
    """
    notes: dict[str, Any] = {}

    def build(config: RWSFTConfig, model: Any, tokenizer: Any, data: TrainingData) -> RWSFTTrainer:
        rows = span_rows(config, model, tokenizer, data, notes)
        return RWSFTTrainer(model=model, args=config, train_dataset=rows,
                            data_collator=SpanCollator(tokenizer.pad_token_id), processing_class=tokenizer)

    return run_training("rw-sft", config, "spans", build, extra_metrics=lambda: notes)
