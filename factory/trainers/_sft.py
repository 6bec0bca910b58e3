"""``factory train sft``: TRL's SFTTrainer on an SFT export (``messages``), the loss on the assistant's turns.

Rejection-sampling fine-tuning: the rows are the winners' whole conversations,
tool results included. The loss is taken on what the assistant wrote, not on
the prompt or the tool outputs, where the chat template marks the assistant's
turns (``{% generation %}``, as the tiny model's does) or where TRL has a
marked training version of the template; otherwise the loss falls back to
every token and the result says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trl

from factory.trainers._config import TrainerSettings
from factory.trainers._data import TrainingData
from factory.trainers._run import TrainResult, run_training

__all__ = ["SFTConfig", "train_sft"]


@dataclass
class SFTConfig(TrainerSettings, trl.SFTConfig):
    """TRL's ``SFTConfig`` with the data, the policy, LoRA and CPU-safe defaults (see :class:`TrainerSettings`).

    ``assistant_only_loss`` defaults to None: on where the chat template marks the assistant's turns.
    """

    assistant_only_loss: bool | None = field(default=None, metadata={
        "help": "Loss on assistant turns only (default: where the chat template has {% generation %} marks)."})


def _marks_assistant_turns(tokenizer) -> bool:
    """Whether the loss can be limited to assistant turns: the template marks them, or TRL has a training twin."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return False
    if has_generation_markers(template):
        return True
    # TRL ships marked training versions of common templates (Qwen, Llama, Gemma...) and swaps them in itself;
    # for any other template it raises ValueError ("patching is not supported for this template").
    try:
        return get_training_chat_template(tokenizer) is not None
    except ValueError:
        return False


def _build(config: SFTConfig, model, tokenizer, data: TrainingData) -> trl.SFTTrainer:
    if config.assistant_only_loss is None:
        config.assistant_only_loss = _marks_assistant_turns(tokenizer)
        if not config.assistant_only_loss:
            data.warnings.append("the chat template does not mark assistant turns ({% generation %}): "
                                 "the loss covers every token, prompts and tool outputs included")
    return trl.SFTTrainer(model=model, args=config, train_dataset=data.dataset, processing_class=tokenizer)


def train_sft(config: SFTConfig) -> TrainResult:
    """Fine-tune ``config.model_name_or_path`` on ``config.data_file``; see :func:`run_training`."""
    return run_training("sft", config, "sft", _build)
