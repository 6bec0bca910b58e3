"""``factory train hint``: turn-level hint distillation on a ``hints`` export.

A branch failed at assistant turn t; a corrective hint for that turn was written (by a user, a verifier's
evidence or a judge). The **teacher** is the policy with the hint in its context (``teacher_prompt``: the
messages before turn t, then a user message ``Hint: ...``); the **student** is the same policy without it
(``prompt``). Both read the same turn-t tokens y (``completion``); the student is pulled toward the teacher's
next-token distribution on those tokens only. Every other turn's tokens are outside the loss.

For each target token i (the assistant tokens of turn t, as the chat template marks them), with teacher
logits ``a_i`` (no gradient; under LoRA with the adapter switched off, i.e. the base weights, which LoRA leaves
untouched) and student logits ``b_i``, at temperature τ::

    p_i = softmax(a_i / τ)        q_i = softmax(b_i / τ)
    forward KL:  k_i = Σ_v p_i(v) (log p_i(v) - log q_i(v))      (KL(teacher || student), the default)
    reverse KL:  k_i = Σ_v q_i(v) (log q_i(v) - log p_i(v))      (KL(student || teacher), mode-seeking)
    clipped:     k̃_i = min(k_i, kl_clip)                        (a token past the clip gives no gradient)
    loss = kl_coef · τ² · Σ_i k̃_i / N                            (N: target tokens in the batch)

τ² keeps the gradient's size comparable across temperatures (Hinton et al.'s distillation). The temperature
follows a schedule over the optimizer steps s = 0 .. S-1: ``constant`` (τ = ``temperature``), or ``linear`` /
``cosine`` from ``temperature`` to ``final_temperature``::

    linear:  τ_s = τ_0 + (τ_1 - τ_0) · s / (S - 1)
    cosine:  τ_s = τ_1 + (τ_0 - τ_1) · (1 + cos(π s / (S - 1))) / 2

``max_target_turns_per_rollout`` keeps at most that many hinted turns of one rollout (run, task, branch), the
earliest first: later turns were written after the first mistake, so their context is already off course.

Rows are left-padded, so every row's turn t ends at the same place and both passes compute the output layer
only for the last positions (``logits_to_keep``): the teacher costs one forward pass, the student a forward and a
backward, over the same turn tokens (``bench/bench_hint.py`` measures it against a plain SFT step).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers

from factory.errors import ConfigError
from factory.trainers._config import TrainerSettings
from factory.trainers._data import TrainingData
from factory.trainers._feedback import (
    FeedbackSettings,
    FeedbackTrainer,
    HintExample,
    adapters_off,
    fit_length,
    hint_examples,
    left_pad,
    read_rows,
    template_for,
)
from factory.trainers._lengths import model_context
from factory.trainers._run import TrainResult, run_training

__all__ = ["HintCollator", "HintConfig", "HintTrainer", "hint_kl", "limit_turns", "train_hint"]

KL_DIRECTIONS = ("forward", "reverse")
TEMPERATURE_SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class HintConfig(FeedbackSettings, TrainerSettings, transformers.TrainingArguments):
    """Turn-level hint distillation: transformers' ``TrainingArguments`` with the data, the policy, LoRA and
    CPU-safe defaults (see :class:`TrainerSettings`), and the distillation's own settings (the module's formulas).
    """

    kl_direction: str = field(default="forward", metadata={
        "help": "forward: KL(teacher || student), the student covers what the hinted teacher would write; "
                "reverse: KL(student || teacher), mode-seeking."})
    kl_coef: float = field(default=1.0, metadata={"help": "Coefficient of the KL loss."})
    kl_clip: float | None = field(default=10.0, metadata={
        "help": "Clip each token's KL at this many nats (a clipped token gives no gradient); None: no clip."})
    temperature: float = field(default=1.0, metadata={
        "help": "Softmax temperature of both distributions (the schedule's start)."})
    final_temperature: float | None = field(default=None, metadata={
        "help": "The schedule's end temperature (default: the same as temperature)."})
    temperature_schedule: str = field(default="constant", metadata={
        "help": "constant, linear or cosine, from temperature to final_temperature over the optimizer steps."})
    max_target_turns_per_rollout: int | None = field(default=None, metadata={
        "help": "Train on at most this many hinted turns of one rollout (run, task, branch), the earliest first "
                "(default: every one)."})
    learning_rate: float = field(default=1e-5, metadata={"help": "The initial learning rate for AdamW."})

    def __post_init__(self) -> None:
        if self.kl_direction not in KL_DIRECTIONS:
            raise ConfigError(f"kl_direction must be forward or reverse, got {self.kl_direction!r}")
        if self.temperature_schedule not in TEMPERATURE_SCHEDULES:
            raise ConfigError(f"temperature_schedule must be one of {', '.join(TEMPERATURE_SCHEDULES)}, "
                              f"got {self.temperature_schedule!r}")
        for name in ("temperature", "final_temperature", "kl_clip"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a positive number, got {value!r}")
        if self.max_target_turns_per_rollout is not None and self.max_target_turns_per_rollout < 1:
            raise ConfigError(f"max_target_turns_per_rollout must be at least 1, got "
                              f"{self.max_target_turns_per_rollout}")
        super().__post_init__()

    def temperature_at(self, step: int, steps: int) -> float:
        """τ at optimizer step ``step`` (0-based) of ``steps``."""
        start = self.temperature
        end = start if self.final_temperature is None else self.final_temperature
        if self.temperature_schedule == "constant" or steps <= 1:
            return start
        progress = min(max(step / (steps - 1), 0.0), 1.0)
        if self.temperature_schedule == "linear":
            return start + (end - start) * progress
        return end + (start - end) * (1 + math.cos(math.pi * progress)) / 2


def limit_turns(examples: list[HintExample], limit: int | None) -> list[HintExample]:
    """At most ``limit`` examples per rollout, the earliest turns first (file order otherwise kept)."""
    if limit is None:
        return examples
    by_rollout: dict[Any, list[HintExample]] = defaultdict(list)
    for example in examples:
        by_rollout[example.rollout].append(example)
    keep = {id(e) for group in by_rollout.values() for e in sorted(group, key=lambda e: e.turn)[:limit]}
    return [e for e in examples if id(e) in keep]


@dataclass
class HintCollator:
    """Batches hinted turns: student and teacher rows left-padded, and the target marks of the last K positions.

    Attributes:
        pad_token_id: The tokenizer's pad token.
    """

    pad_token_id: int

    def __call__(self, examples: list[HintExample]) -> dict[str, torch.Tensor]:
        # K: from the earliest target token of any row to the end; a row's window holds only its turn's tokens
        # when its tail is shorter, and prompt tokens (masked out) otherwise.
        window = max(len(e.student_ids) - e.target.index(1) for e in examples)
        student, student_mask, student_pos = left_pad([e.student_ids for e in examples], self.pad_token_id)
        teacher, teacher_mask, teacher_pos = left_pad([e.teacher_ids for e in examples], self.pad_token_id)
        target = torch.zeros((len(examples), window), dtype=torch.bool)
        for i, e in enumerate(examples):
            tail = e.target[-window:]
            # the teacher's turn-t tokens sit at the same distance from the end (hint_examples checked them)
            target[i, window - len(tail):] = torch.tensor(tail, dtype=torch.bool)
        return {"input_ids": student, "attention_mask": student_mask, "position_ids": student_pos,
                "teacher_input_ids": teacher, "teacher_attention_mask": teacher_mask,
                "teacher_position_ids": teacher_pos, "target": target}


def hint_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor, *, temperature: float,
            direction: str) -> torch.Tensor:
    """Per-token KL between the teacher's and the student's distributions at ``temperature`` (the module's k_i).

    Args:
        teacher_logits: ``(N, V)``.
        student_logits: ``(N, V)``.
        temperature: τ.
        direction: ``forward`` (KL(teacher || student)) or ``reverse`` (KL(student || teacher)).
    """
    teacher = torch.log_softmax(teacher_logits.float() / temperature, dim=-1)
    student = torch.log_softmax(student_logits.float() / temperature, dim=-1)
    if direction == "forward":
        return (teacher.exp() * (teacher - student)).sum(-1)
    return (student.exp() * (student - teacher)).sum(-1)


def _last_logits(model: Any, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 window: int) -> torch.Tensor:
    """Logits that predict the last ``window`` tokens of each left-padded row: ``(B, window, V)``."""
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=window + 1,
                   use_cache=False).logits
    return logits[:, :-1]


class HintTrainer(FeedbackTrainer):
    """The student pulled toward the hinted teacher on turn t's tokens (see the module docstring).

    Args:
        *args: transformers ``Trainer``'s.
        **kwargs: transformers ``Trainer``'s; ``args`` is a :class:`HintConfig`.
    """

    def compute_loss(self, model: Any, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        config: HintConfig = self.args
        target = inputs["target"]
        window = target.shape[1]
        temperature = config.temperature_at(self.state.global_step, max(self.state.max_steps, 1))
        with torch.no_grad(), adapters_off(self.accelerator.unwrap_model(model)):
            teacher = _last_logits(model, inputs["teacher_input_ids"], inputs["teacher_attention_mask"],
                                   inputs["teacher_position_ids"], window)[target]
        student = _last_logits(model, inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"],
                               window)[target]
        kl = hint_kl(teacher, student, temperature=temperature, direction=config.kl_direction)
        clipped = kl if config.kl_clip is None else kl.clamp(max=config.kl_clip)
        loss = config.kl_coef * temperature ** 2 * clipped.mean()
        self.record(kl=kl.mean(), kl_clipped_share=(clipped < kl).float().mean(), temperature=temperature,
                    target_tokens=kl.numel())
        return (loss, {"kl": kl}) if return_outputs else loss


def build_hint_trainer(config: HintConfig, model: Any, tokenizer: Any, data: TrainingData,
                       notes: dict[str, Any]) -> HintTrainer:
    """Tokenize the hinted turns of ``data`` and build the trainer; ``notes`` gets what was kept and why."""
    path = Path(data.path)
    examples = hint_examples(read_rows(path), tokenizer, template_for(tokenizer), path)
    limited = limit_turns(examples, config.max_target_turns_per_rollout)
    if len(limited) < len(examples):
        data.warnings.append(f"max_target_turns_per_rollout={config.max_target_turns_per_rollout}: "
                             f"{len(examples) - len(limited)} later hinted turn(s) left out")
    max_length = config.max_length or model_context(model, tokenizer) or max(len(e.teacher_ids) for e in limited)
    kept = fit_length(limited, [len(e.teacher_ids) for e in limited], max_length, path, data.warnings)
    notes["hint_rows"] = {"rows": len(examples), "after_turn_limit": len(limited), "trained": len(kept),
                          "target_tokens": sum(sum(e.target) for e in kept),
                          "rollouts": len({e.rollout for e in kept}), "max_length": max_length}
    return HintTrainer(model=model, args=config, train_dataset=kept,
                       data_collator=HintCollator(tokenizer.pad_token_id), processing_class=tokenizer)


def train_hint(config: HintConfig) -> TrainResult:
    """Distil hinted turns of ``config.data_file`` into ``config.model_name_or_path``; see :func:`run_training`.

    ``train_result.json`` records the rows kept (``metrics.hint_rows``) and, per logging step, the mean KL at the
    target tokens before clipping, the clipped share and the temperature.
    """
    notes: dict[str, Any] = {}
    return run_training("hint", config, "hints", lambda *args: build_hint_trainer(*args, notes),
                        extra_metrics=lambda: notes)
