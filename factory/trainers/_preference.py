"""What DPO and KTO share: the length limit and prompt cuts, the loss mask, and the trainer that applies them."""

from __future__ import annotations

from typing import Any

import trl

from factory.trainers._data import TrainingData
from factory.trainers._lengths import fit_prompts, model_context
from factory.trainers._masks import (
    AssistantOnlyDPOTrainer,
    AssistantOnlyKTOTrainer,
    mask_columns,
    mask_counts,
    plan_loss_mask,
)
from factory.trainers._run import frozen_reference

__all__ = ["build_preference_trainer"]

_TRAINERS = {"dpo": (trl.DPOTrainer, AssistantOnlyDPOTrainer, ("chosen", "rejected")),
             "kto": (trl.KTOTrainer, AssistantOnlyKTOTrainer, ("completion",))}


def build_preference_trainer(kind: str, config: Any, model: Any, tokenizer: Any, data: TrainingData,
                             notes: dict[str, Any]) -> Any:
    """Build the DPO or KTO trainer: prompts fitted to the length limit, the loss on the assistant's tokens.

    Args:
        kind: ``dpo`` or ``kto``.
        config: The trainer's config (``max_length`` None: from the data; ``allow_unmasked``).
        model: The policy (LoRA-wrapped where asked).
        tokenizer: Its tokenizer.
        data: The training rows; warnings about them are added here.
        notes: Filled with ``loss_mask`` and ``prompt_fit``, for the training result.

    Raises:
        ConfigError: The template cannot mark the assistant's turns and ``allow_unmasked`` is off, or its marks do
            not line up with the trained tokens.
    """
    plain, masked, completions = _TRAINERS[kind]
    plan = plan_loss_mask(tokenizer, data.dataset, allow_unmasked=config.allow_unmasked)
    dataset, fit = fit_prompts(data.dataset, tokenizer, completions, max_length=config.max_length,
                               context=model_context(model, tokenizer))
    config.max_length = fit.max_length
    notes["prompt_fit"] = fit.to_dict()
    notes["prompt_fit_summary"] = fit.summary()
    if plan.reason:
        data.warnings.append(plan.reason)
    kwargs: dict[str, Any] = {"model": model, "ref_model": frozen_reference(model), "args": config,
                              "train_dataset": dataset, "processing_class": tokenizer}
    if plan.assistant_only:
        trainer = masked(loss_template=plan.template, **kwargs)
        notes["loss_mask"] = {**plan.to_dict(), **mask_counts(trainer.train_dataset, mask_columns(kind))}
    else:
        trainer = plain(**kwargs)
        notes["loss_mask"] = plan.to_dict()
    return trainer
