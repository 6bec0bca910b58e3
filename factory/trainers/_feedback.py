"""Feedback rows for the hint, RW-SFT and Span-KTO trainers: read exactly, checked, tokenized with their marks.

The ``hints`` and ``spans`` exports (``factory export hints|spans``) are
conversations with something attached to single assistant turns: a hint for
turn t, or a polarity per message. The trainers need to know which tokens
belong to which assistant message, so each row is rendered once with the
chat template's ``{% generation %}`` marks (``return_assistant_tokens_mask``,
see :mod:`factory.trainers._masks`): the k-th contiguous run of marked tokens
is the k-th assistant message. A row whose runs do not match its assistant
messages one for one is refused (the template does not mark every assistant
turn), never guessed.

Rows are read from the file as written (not through ``datasets``, which
unifies the keys of every message and of every tool call's arguments, and
would render a tool call with other rows' argument names set to null).

This module imports torch: only the three trainers load it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers

from factory.errors import ConfigError
from factory.trainers._data import TrainingData
from factory.trainers._lengths import model_context

__all__ = [
    "POLARITIES",
    "FeedbackSettings",
    "FeedbackTrainer",
    "HintExample",
    "SpanCollator",
    "SpanExample",
    "adapters_off",
    "assistant_runs",
    "fit_length",
    "hint_examples",
    "left_pad",
    "read_rows",
    "right_pad",
    "span_examples",
    "span_rows",
    "template_for",
    "token_logps",
]

#: The polarities a ``spans`` row gives its messages.
POLARITIES = ("positive", "neutral", "negative")


def read_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """Every row of an export file as written, with its 1-based line (the file was validated already)."""
    from factory.export import iter_records

    return [(line, record) for line, record, _ in iter_records(Path(path)) if record is not None]


def _messages(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value or not all(isinstance(m, dict) for m in value):
        raise ConfigError(f"{where}: expected a non-empty list of chat messages")
    return [dict(m) for m in value]


def _render(tokenizer: Any, template: str, messages: list[dict[str, Any]], tools: Any) -> tuple[list[int], list[int]]:
    rendered = tokenizer.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=True,
                                             return_dict=True, return_assistant_tokens_mask=True)
    return list(rendered["input_ids"]), [int(bool(m)) for m in rendered["assistant_masks"]]


def assistant_runs(marks: list[int]) -> list[tuple[int, int]]:
    """The ``[start, end)`` token ranges of the contiguous runs of marked tokens, in order."""
    runs: list[tuple[int, int]] = []
    start = None
    for index, mark in enumerate([*marks, 0]):
        if mark and start is None:
            start = index
        elif not mark and start is not None:
            runs.append((start, index))
            start = None
    return runs


def _tokenize(tokenizer: Any, template: str, messages: list[dict[str, Any]], tools: Any,
              where: str) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """Token ids of a conversation, and each assistant message's token range (message index -> range)."""
    ids, marks = _render(tokenizer, template, messages, tools)
    runs = assistant_runs(marks)
    assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if len(runs) != len(assistant):
        raise ConfigError(f"{where}: the chat template marks {len(runs)} run(s) of assistant tokens for "
                          f"{len(assistant)} assistant message(s), so tokens cannot be told apart by message; "
                          "give the tokenizer a template with {% generation %} around every assistant turn")
    return ids, dict(zip(assistant, runs, strict=True))


def _tools(row: dict[str, Any]) -> Any:
    tools = row.get("tools")
    return json.loads(tools) if isinstance(tools, str) else tools


@dataclass
class HintExample:
    """One hinted turn, tokenized twice: without the hint (the student's input) and with it (the teacher's).

    Attributes:
        student_ids: ``prompt`` + ``completion``.
        teacher_ids: ``teacher_prompt`` + ``completion``.
        target: 0/1 per student token: the completion's assistant tokens (turn t), where the loss is.
        teacher_target: The same for the teacher's tokens (the same token ids, at the teacher's positions).
        line: The row's line in the file.
        rollout: ``(run_id, task_id, branch_index)``.
        turn: The hinted turn's index.
    """

    student_ids: list[int]
    teacher_ids: list[int]
    target: list[int]
    teacher_target: list[int]
    line: int
    rollout: tuple[Any, Any, Any]
    turn: int


def _completion_mask(ids: list[int], ranges: dict[int, tuple[int, int]], first: int) -> list[int]:
    mask = [0] * len(ids)
    for index, (start, end) in ranges.items():
        if index >= first:
            mask[start:end] = [1] * (end - start)
    return mask


def hint_examples(rows: list[tuple[int, dict[str, Any]]], tokenizer: Any, template: str,
                  path: Path) -> list[HintExample]:
    """Tokenize ``hints`` rows; the completion must render to the same tokens with and without the hint.

    Raises:
        ConfigError: A row that breaks the format's contract, named by file, line and field.
    """
    examples = []
    for line, row in rows:
        where = f"{path}:{line}"
        prompt = _messages(row.get("prompt"), f"{where}: field 'prompt'")
        teacher = _messages(row.get("teacher_prompt"), f"{where}: field 'teacher_prompt'")
        completion = _messages(row.get("completion"), f"{where}: field 'completion'")
        if any(m.get("role") != "assistant" for m in completion):
            raise ConfigError(f"{where}: field 'completion': every message must be the assistant's (turn t)")
        turn = row.get("turn")
        if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
            raise ConfigError(f"{where}: field 'turn': expected a turn index (an integer >= 0), got {turn!r}")
        tools = _tools(row)
        student_ids, student_ranges = _tokenize(tokenizer, template, prompt + completion, tools, where)
        teacher_ids, teacher_ranges = _tokenize(tokenizer, template, teacher + completion, tools, where)
        target = _completion_mask(student_ids, student_ranges, len(prompt))
        teacher_target = _completion_mask(teacher_ids, teacher_ranges, len(teacher))
        student_first, teacher_first = target.index(1), teacher_target.index(1)
        if student_ids[student_first:] != teacher_ids[teacher_first:]:
            raise ConfigError(f"{where}: field 'completion': renders to other tokens after 'teacher_prompt' than "
                              "after 'prompt', so the teacher's and the student's distributions cannot be "
                              "compared token by token")
        examples.append(HintExample(student_ids, teacher_ids, target, teacher_target, line,
                                    (row.get("run_id"), row.get("task_id"), row.get("branch_index")), turn))
    return examples


@dataclass
class SpanExample:
    """One ``spans`` row, tokenized: each assistant message is a span with the polarity the row gives it.

    Attributes:
        ids: The conversation's token ids.
        span: Per token, the index into ``polarity`` of the assistant message it belongs to; -1 outside them
            (prompts, tool results, the template's headers).
        polarity: Per assistant message (span), its polarity.
        line: The row's line in the file.
    """

    ids: list[int]
    span: list[int]
    polarity: list[str]
    line: int
    counts: dict[str, int] = field(default_factory=dict)


def span_examples(rows: list[tuple[int, dict[str, Any]]], tokenizer: Any, template: str,
                  path: Path) -> list[SpanExample]:
    """Tokenize ``spans`` rows, every assistant token tagged with its message's polarity.

    Raises:
        ConfigError: A row that breaks the format's contract (a polarity per message, only the assistant's
            messages polarised), named by file, line and field.
    """
    examples = []
    for line, row in rows:
        where = f"{path}:{line}"
        messages = _messages(row.get("messages"), f"{where}: field 'messages'")
        polarity = row.get("polarity")
        if not isinstance(polarity, list) or len(polarity) != len(messages):
            raise ConfigError(f"{where}: field 'polarity': expected one of {list(POLARITIES)} per message "
                              f"({len(messages)}), got {polarity!r}")
        for index, (message, value) in enumerate(zip(messages, polarity, strict=True)):
            if value not in POLARITIES:
                raise ConfigError(f"{where}: field 'polarity[{index}]': {value!r} is not one of {list(POLARITIES)}")
            if message.get("role") != "assistant" and value != "neutral":
                raise ConfigError(f"{where}: field 'polarity[{index}]': {value!r} on a {message.get('role')!r} "
                                  "message; only the assistant's messages are trained on, the others are neutral")
        ids, ranges = _tokenize(tokenizer, template, messages, _tools(row), where)
        span = [-1] * len(ids)
        kept: list[str] = []
        for index, (start, end) in sorted(ranges.items()):
            span[start:end] = [len(kept)] * (end - start)
            kept.append(polarity[index])
        counts = {p: sum(end - start for i, (start, end) in ranges.items() if polarity[i] == p) for p in POLARITIES}
        examples.append(SpanExample(ids, span, kept, line, counts))
    return examples


def left_pad(rows: list[list[int]], value: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows padded on the left: ``(ids, attention_mask, position_ids)``; positions count real tokens only.

    Left padding puts every row's end at the same place, so the completions line up at the right edge and a
    model asked for its last K positions' logits (``logits_to_keep``) computes no more than it needs.
    """
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), value, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def right_pad(rows: list[list[Any]], value: Any, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Rows padded on the right with ``value``."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, :len(row)] = torch.tensor(row, dtype=dtype)
    return out


def adapters_off(model: Any) -> Any:
    """A context in which a LoRA-wrapped policy computes with its base weights alone (nothing for a plain model)."""
    import contextlib

    from factory.trainers._models import is_peft_model

    return model.disable_adapter() if is_peft_model(model) else contextlib.nullcontext()


def token_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of each label under ``logits`` (same leading shape); a label of -100 gives 0."""
    flat = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                             labels.reshape(-1), reduction="none", ignore_index=-100)
    return -flat.view(labels.shape)


def template_for(tokenizer: Any) -> str:
    """The chat template that marks the assistant's turns for ``tokenizer`` (its own, or TRL's training twin).

    Raises:
        ConfigError: Neither marks them: tokens could not be attributed to messages.
    """
    from factory.trainers._masks import assistant_template

    template, _ = assistant_template(tokenizer)
    if template is None:
        raise ConfigError("the chat template marks no assistant turns ({% generation %}) and TRL has no marked "
                          "training version of it, so tokens cannot be attributed to turns; give the tokenizer a "
                          "template with {% generation %} around assistant turns")
    return template


def fit_length(examples: list[Any], lengths: list[int], max_length: int, path: Path,
               warnings: list[str]) -> list[Any]:
    """The examples no longer than ``max_length`` tokens; the others are left out with a warning, never cut.

    Raises:
        ConfigError: Every example is too long.
    """
    kept = [e for e, n in zip(examples, lengths, strict=True) if n <= max_length]
    if not kept:
        raise ConfigError(f"--max-length {max_length}: all {len(examples)} row(s) of {path} are longer "
                          f"(longest {max(lengths)} tokens); raise --max-length")
    if len(kept) < len(examples):
        lines = [e.line for e, n in zip(examples, lengths, strict=True) if n > max_length]
        warnings.append(f"--max-length {max_length}: {len(lines)} row(s) of {path} left out as longer (lines "
                        f"{', '.join(map(str, lines[:10]))}{' ...' if len(lines) > 10 else ''}); raise --max-length "
                        "to keep them")
    return kept


@dataclass
class FeedbackSettings:
    """Fields the hint, RW-SFT and Span-KTO configs share.

    Attributes:
        max_length: Longest row in tokens; longer rows are left out (not cut), with a warning.
        remove_unused_columns: Off: the trainers batch their own tokenized rows.
    """

    max_length: int | None = field(default=None, metadata={
        "help": "Longest row in tokens (the hinted teacher's prompt + turn for `hint`); longer rows are left out "
                "with a warning, never cut (default: the model's context)."})
    remove_unused_columns: bool = field(default=False, metadata={
        "help": "Kept off: these trainers batch their own tokenized rows."})


class FeedbackTrainer(transformers.Trainer):
    """A transformers ``Trainer`` whose ``compute_loss`` is the subclass's own, with its figures logged as means.

    The loss a subclass returns is a mean over its batch, so ``training_step`` divides it by the gradient
    accumulation steps (``loss_is_scaled_for_ga``). Rows left out for length are counted by the trainer itself
    (``counts_own_drops``), not by :func:`~factory.trainers._run.run_training`'s check of TRL's drops.
    """

    loss_is_scaled_for_ga = False
    counts_own_drops = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._figures: dict[str, list[float]] = defaultdict(list)

    def record(self, **figures: float | torch.Tensor) -> None:
        """Figures of one batch, averaged into the next log line."""
        for name, value in figures.items():
            self._figures[name].append(float(value.detach()) if isinstance(value, torch.Tensor) else float(value))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:  # a training log line: the figures since the last one
            logs.update({name: sum(values) / len(values) for name, values in self._figures.items() if values})
            self._figures.clear()
        super().log(logs, start_time)


@dataclass
class SpanCollator:
    """Batches ``spans`` rows, right-padded, each predicted token tagged with its span across the whole batch.

    The batch holds ``input_ids`` and ``attention_mask`` ``(B, T)``, ``labels`` ``(B, T-1)`` (the next token,
    -100 outside every assistant message), ``span`` ``(B, T-1)`` (the span of each label, numbered across the
    batch; -1 outside) and ``polarity`` ``(S,)`` (+1 positive, 0 neutral, -1 negative per span).

    Attributes:
        pad_token_id: The tokenizer's pad token.
    """

    pad_token_id: int

    def __call__(self, examples: list[SpanExample]) -> dict[str, torch.Tensor]:
        ids = right_pad([e.ids for e in examples], self.pad_token_id)
        mask = right_pad([[1] * len(e.ids) for e in examples], 0)
        offset, spans, signs = 0, [], []
        for e in examples:
            spans.append([s + offset if s >= 0 else -1 for s in e.span[1:]])
            signs += [{"positive": 1, "neutral": 0, "negative": -1}[p] for p in e.polarity]
            offset += len(e.polarity)
        span = right_pad(spans, -1)
        labels = torch.where(span >= 0, ids[:, 1:], torch.full_like(span, -100))
        return {"input_ids": ids, "attention_mask": mask, "labels": labels, "span": span,
                "polarity": torch.tensor(signs, dtype=torch.long)}


def span_notes(examples: list[Any], kept: list[Any], max_length: int) -> dict[str, Any]:
    """What ``train_result.json`` records of the span rows: rows kept and assistant tokens per polarity."""
    return {"rows": len(examples), "trained": len(kept), "max_length": max_length,
            "spans": {p: sum(e.polarity.count(p) for e in kept) for p in POLARITIES},
            "tokens": {p: sum(e.counts[p] for e in kept) for p in POLARITIES}}


def span_rows(config: Any, model: Any, tokenizer: Any, data: TrainingData, notes: dict[str, Any]) -> list[Any]:
    """The ``spans`` rows of ``data``, tokenized, those over ``max_length`` left out; ``notes`` says how many."""
    path = Path(data.path)
    examples = span_examples(read_rows(path), tokenizer, template_for(tokenizer), path)
    max_length = config.max_length or model_context(model, tokenizer) or max(len(e.ids) for e in examples)
    kept = fit_length(examples, [len(e.ids) for e in examples], max_length, path, data.warnings)
    notes["span_rows"] = span_notes(examples, kept, max_length)
    return kept
