"""Assistant-only preference losses: DPO and KTO learn from the policy's own tokens, not from what the tools wrote.

A conversational DPO or KTO row's completion is the rest of an agent's run:
assistant turns (text and tool calls) and the tool results the environment
wrote between them. TRL's ``DPOTrainer`` and ``KTOTrainer`` put every
completion token into the loss, tool results included, so a pair whose
branches saw different tool outputs moves the implicit reward on text the
policy never wrote. Here the loss covers only what the chat template marks
as the assistant's (``{% generation %}`` ... ``{% endgeneration %}``): each
row is rendered once more with ``return_assistant_tokens_mask=True``, the
mark is checked to line up token for token with TRL's own tokenization,
and the collator multiplies TRL's completion mask by it. Tool and user
tokens stay in the sequence (the policy still reads them); they only leave
the loss.

The marks come from the tokenizer's own template where it has them (the
tiny model's does) or from the training version TRL ships for common
families (Qwen, Llama, Gemma...). Where neither exists, training stops with
a :class:`~factory.errors.ConfigError` unless ``allow_unmasked`` is set; the
choice is recorded in the training result (:meth:`LossMaskPlan.to_dict`).

This module imports torch and TRL: it is loaded only by the DPO and KTO trainers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
import trl
from trl.trainer.dpo_trainer import DataCollatorForPreference
from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference
from trl.trainer.utils import pad

from factory.errors import ConfigError

__all__ = [
    "AssistantOnlyDPOTrainer",
    "AssistantOnlyKTOTrainer",
    "LossMaskPlan",
    "MaskedPreferenceCollator",
    "MaskedUnpairedPreferenceCollator",
    "assistant_template",
    "mask_columns",
    "mask_counts",
    "plan_loss_mask",
]

#: Per trainer, the completion columns of a row and the mask column each gets.
_MASK_COLUMNS = {"dpo": {"chosen": "chosen_loss_mask", "rejected": "rejected_loss_mask"},
                 "kto": {"completion": "completion_loss_mask"}}
_ALLOW = "pass --allow-unmasked to train on every completion token, tool results included"


@dataclass(frozen=True)
class LossMaskPlan:
    """Which completion tokens a preference loss learns from.

    Attributes:
        assistant_only: True: only the tokens the chat template marks as the assistant's.
        template_source: Where the marks come from: ``own`` (the tokenizer's template), ``trl`` (TRL's training
            version of it), or None where nothing marks them.
        template: The marked template (None where the loss is not masked).
        allow_unmasked: Whether the user allowed an unmasked loss.
        reason: Why the loss is not masked (None where it is).
    """

    assistant_only: bool
    template_source: str | None
    template: str | None
    allow_unmasked: bool
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """What ``train_result.json`` records (the template by its source, not its text)."""
        return {"assistant_only": self.assistant_only, "template_source": self.template_source,
                "allow_unmasked": self.allow_unmasked, "reason": self.reason}


def assistant_template(tokenizer: Any) -> tuple[str | None, str | None]:
    """A chat template that marks the assistant's turns for ``tokenizer``, and where it comes from.

    Returns:
        ``(template, "own")`` where the tokenizer's template has ``{% generation %}`` marks, ``(template, "trl")``
        where TRL ships a marked training version of it, else ``(None, None)``.
    """
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not template:
        return None, None
    if has_generation_markers(template):
        return template, "own"
    try:
        twin = get_training_chat_template(tokenizer)
    except ValueError:  # "patching is not supported for this template"
        return None, None
    return (twin, "trl") if twin else (None, None)


def plan_loss_mask(tokenizer: Any, dataset: Any, *, allow_unmasked: bool) -> LossMaskPlan:
    """Decide which completion tokens the loss covers for these rows and this tokenizer.

    Args:
        tokenizer: The policy's tokenizer.
        dataset: The rows (conversational rows can be masked; plain-text rows cannot).
        allow_unmasked: Train on every completion token where the assistant's cannot be marked.

    Raises:
        ConfigError: Conversational rows, a template that cannot mark the assistant's turns, and no
            ``allow_unmasked``.
    """
    from trl.data_utils import is_conversational

    first = dataset[0] if len(dataset) else {}
    if first and not is_conversational(first):
        # A plain-text completion has no turn boundaries to mark; rows made with --format standard say so.
        return LossMaskPlan(False, None, None, allow_unmasked,
                            "plain-text rows: the completion cannot be split into the assistant's turns and tool "
                            "output, so every completion token is in the loss (export conversational rows to mask)")
    template, source = assistant_template(tokenizer)
    if template is not None:
        return LossMaskPlan(True, source, template, allow_unmasked)
    reason = ("the chat template marks no assistant turns ({% generation %}) and TRL has no marked training "
              "version of it")
    if not allow_unmasked:
        raise ConfigError(f"{reason}, so the loss cannot be limited to the policy's own tokens; give the tokenizer "
                          f"a template with {{% generation %}} marks around assistant turns, or {_ALLOW}")
    return LossMaskPlan(False, None, None, True, f"{reason}; --allow-unmasked: every completion token is in the loss")


def _tools(row: dict[str, Any]) -> Any:
    tools = row.get("tools")
    return json.loads(tools) if isinstance(tools, str) else tools


def _completion_mask(tokenizer: Any, template: str, row: dict[str, Any], column: str, prompt_ids: list[int],
                     completion_ids: list[int], index: int) -> list[int]:
    """The assistant marks of ``row[column]``'s tokens, checked against TRL's tokenization of the same row."""
    rendered = tokenizer.apply_chat_template(
        list(row["prompt"]) + list(row[column]), tools=_tools(row), chat_template=template, tokenize=True,
        return_dict=True, return_assistant_tokens_mask=True, **(row.get("chat_template_kwargs") or {}))
    ids, marks = list(rendered["input_ids"]), list(rendered["assistant_masks"])
    cut = len(prompt_ids)
    if ids[:cut] != list(prompt_ids) or ids[cut:] != list(completion_ids):
        raise ConfigError(f"row {index}: the marked chat template renders {column!r} differently from the "
                          f"tokenizer's own, so its assistant marks do not line up with the trained tokens; {_ALLOW}")
    mask = [int(bool(m)) for m in marks[cut:]]
    if completion_ids and not any(mask):
        raise ConfigError(f"row {index}: the chat template marks none of {column!r}'s tokens as the assistant's; "
                          f"{_ALLOW}")
    return mask


def _add_masks(dataset: Any, tokenizer: Any, template: str, columns: dict[str, str], id_key: Any) -> Any:
    """``dataset`` with a 0/1 loss mask beside each completion's token ids (``id_key(column)`` names them)."""

    def add(row: dict[str, Any], index: int) -> dict[str, list[int]]:
        return {mask: _completion_mask(tokenizer, template, row, column, row["prompt_ids"], row[id_key(column)],
                                       index)
                for column, mask in columns.items()}

    if not len(dataset):  # TRL dropped every row for length: the trainer says so, not a missing column
        return dataset
    return dataset.map(add, with_indices=True, desc="Marking the assistant's tokens")


def mask_columns(kind: str) -> dict[str, str]:
    """The loss-mask column of each completion column, for ``dpo`` or ``kto``."""
    return dict(_MASK_COLUMNS[kind])


def mask_counts(dataset: Any, columns: dict[str, str]) -> dict[str, int]:
    """Completion tokens and those in the loss, over every completion of ``dataset``."""
    total = kept = 0
    for mask in columns.values():
        if mask not in dataset.column_names:  # no rows left
            continue
        for row in dataset[mask]:
            total += len(row)
            kept += sum(row)
    return {"completion_tokens": total, "loss_tokens": kept}


def _masked(ids_mask: torch.Tensor, prompts: list[int], masks: list[list[int]], *, max_length: int | None,
            keep_end: bool, pad_to_multiple_of: int | None) -> torch.Tensor:
    """TRL's completion mask times the assistant marks, laid out (truncated, padded) as TRL lays out the ids."""
    rows = [[0] * prompt + list(mask) for prompt, mask in zip(prompts, masks, strict=True)]
    if max_length is not None:
        rows = [row[-max_length:] if keep_end else row[:max_length] for row in rows]
    marks = pad([torch.tensor(row, dtype=ids_mask.dtype) for row in rows], padding_value=0, padding_side="right",
                pad_to_multiple_of=pad_to_multiple_of)
    return ids_mask * marks


@dataclass
class MaskedPreferenceCollator(DataCollatorForPreference):
    """TRL's DPO collator, its completion mask limited to the assistant's tokens where rows carry their marks."""

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        output = super().torch_call(examples)
        if "chosen_loss_mask" not in examples[0]:
            return output
        prompts = [len(e["prompt_ids"]) for e in examples] * 2  # chosen rows, then rejected rows, as TRL stacks them
        masks = [e["chosen_loss_mask"] for e in examples] + [e["rejected_loss_mask"] for e in examples]
        output["completion_mask"] = _masked(output["completion_mask"], prompts, masks, max_length=self.max_length,
                                            keep_end=self.truncation_mode == "keep_end",
                                            pad_to_multiple_of=self.pad_to_multiple_of)
        return output


@dataclass
class MaskedUnpairedPreferenceCollator(DataCollatorForUnpairedPreference):
    """TRL's KTO collator, its completion masks (the KL ones too) limited to the assistant's tokens."""

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        output = super().torch_call(examples)
        for prefix in ("", "KL_"):
            key = f"{prefix}completion_loss_mask"
            if key in examples[0] and f"{prefix}completion_mask" in output:
                output[f"{prefix}completion_mask"] = _masked(
                    output[f"{prefix}completion_mask"], [len(e["prompt_ids"]) for e in examples],
                    [e[key] for e in examples], max_length=self.max_length, keep_end=False,
                    pad_to_multiple_of=self.pad_to_multiple_of)
        return output


def _mirror_pad_token(model: Any, tokenizer: Any, args: Any) -> int:
    """The pad token TRL would pick, set on the tokenizer and the model as TRL does when it builds its collator."""
    pad_token = getattr(args, "pad_token", None) or tokenizer.pad_token or tokenizer.eos_token
    if pad_token not in tokenizer.get_vocab():
        raise ConfigError(f"pad token {pad_token!r} is not in the tokenizer's vocabulary")
    tokenizer.pad_token = pad_token
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.pad_token_id = tokenizer.pad_token_id
    return tokenizer.pad_token_id


class AssistantOnlyDPOTrainer(trl.DPOTrainer):
    """TRL's ``DPOTrainer`` whose loss sees only the assistant's tokens of each completion.

    Args:
        loss_template: A chat template with ``{% generation %}`` marks (see :func:`assistant_template`).
        *args: ``trl.DPOTrainer``'s.
        **kwargs: ``trl.DPOTrainer``'s; ``model``, ``args`` and ``processing_class`` are required by keyword.
    """

    def __init__(self, *args: Any, loss_template: str, **kwargs: Any) -> None:
        self._loss_template = loss_template  # read by _prepare_dataset, which TRL calls from its __init__
        config = kwargs["args"]
        if kwargs.get("data_collator") is None:
            kwargs["data_collator"] = MaskedPreferenceCollator(
                pad_token_id=_mirror_pad_token(kwargs["model"], kwargs["processing_class"], config),
                max_length=config.max_length, truncation_mode=config.truncation_mode,
                pad_to_multiple_of=config.pad_to_multiple_of)
        super().__init__(*args, **kwargs)

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        dataset = super()._prepare_dataset(dataset, processing_class, args, dataset_name)
        return _add_masks(dataset, self._tokenizer, self._loss_template, _MASK_COLUMNS["dpo"],
                          lambda column: f"{column}_ids")

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        self._signature_columns = [*self._signature_columns, *_MASK_COLUMNS["dpo"].values()]


class AssistantOnlyKTOTrainer(trl.KTOTrainer):
    """TRL's ``KTOTrainer`` whose loss (and KL estimate) sees only the assistant's tokens of each completion.

    Args:
        loss_template: A chat template with ``{% generation %}`` marks (see :func:`assistant_template`).
        *args: ``trl.KTOTrainer``'s.
        **kwargs: ``trl.KTOTrainer``'s; ``model``, ``args`` and ``processing_class`` are required by keyword.
    """

    def __init__(self, *args: Any, loss_template: str, **kwargs: Any) -> None:
        self._loss_template = loss_template
        config = kwargs["args"]
        if kwargs.get("data_collator") is None:
            kwargs["data_collator"] = MaskedUnpairedPreferenceCollator(
                pad_token_id=_mirror_pad_token(kwargs["model"], kwargs["processing_class"], config),
                max_length=config.max_length, pad_to_multiple_of=config.pad_to_multiple_of)
        super().__init__(*args, **kwargs)

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        dataset = super()._prepare_dataset(dataset, processing_class, args, dataset_name)
        dataset = _add_masks(dataset, self._tokenizer, self._loss_template, _MASK_COLUMNS["kto"],
                             lambda column: f"{column}_ids")
        if "KL_completion_ids" in dataset.column_names and "completion_loss_mask" in dataset.column_names:
            # TRL pairs each prompt with its batch neighbour's completion (a rotation by one within batches of
            # per_device_train_batch_size); the marks rotate the same way, so they stay with their tokens.
            def rotate(batch: dict[str, list]) -> dict[str, list]:
                marks = batch["completion_loss_mask"]
                return {"KL_completion_loss_mask": [marks[-1], *marks[:-1]]}

            dataset = dataset.map(rotate, batched=True, batch_size=args.per_device_train_batch_size,
                                  desc="Marking the KL completions")
            for index, (ids, marks) in enumerate(zip(dataset["KL_completion_ids"],
                                                     dataset["KL_completion_loss_mask"], strict=True)):
                if len(ids) != len(marks):
                    raise ConfigError(f"row {index}: the KL completion's marks do not line up with its tokens")
        return dataset

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        self._signature_columns = [*self._signature_columns, "completion_loss_mask", "KL_completion_loss_mask"]
