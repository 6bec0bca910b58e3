"""How long a preference row may be, and how a multi-turn prompt over that is cut.

A row from an agent run is long: the system message carries every tool's
schema, and a prompt may hold earlier turns. TRL drops a row whose prompt
alone fills ``max_length`` and cuts completions at it, so a fixed default
(1024) silently trains on nothing for a typical export. Here:

* **the limit comes from the data and the model**: unless ``max_length`` is
  given, it is the longest row (prompt plus its longest completion, in the
  policy's tokens), capped at the model's context (``max_position_embeddings``
  and the tokenizer's ``model_max_length``);
* **a prompt over it is cut from the left at message boundaries**, keeping
  the system message, the task prompt (the first user message) and the most
  recent turns: whole turns (a user message, or an assistant message with
  the tool results that answer it) go, oldest first, until the row fits or
  only the last turn is left. What is still too long then is TRL's to
  truncate (the end of a completion) or to drop (a prompt that fills the
  limit alone), and the trainer counts those drops.

How many rows, messages and tokens were cut is returned as a
:class:`PromptFit` for ``train_result.json`` and the console.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["PromptFit", "fit_prompts", "model_context"]

# transformers' stand-in for "no limit" in tokenizer.model_max_length (int(1e30)); anything this large is not one
_NO_LIMIT = 10**9


@dataclass(frozen=True)
class PromptFit:
    """The length limit a trainer used, and what cutting prompts to it took.

    Attributes:
        max_length: The limit, in tokens (prompt plus completion).
        source: ``option`` (given), ``data`` (the longest row), or ``context`` (the model's context, shorter than the
            longest row).
        context: The model's context length, where the model or tokenizer says it.
        longest_row: The longest row before cutting (prompt plus its longest completion), in tokens.
        rows_cut: Rows whose prompt lost messages.
        messages_cut: Messages removed, over all rows.
        tokens_cut: Prompt tokens removed, over all rows.
        rows_over: Rows still over the limit after cutting (TRL truncates their completions or drops them).
    """

    max_length: int
    source: str
    context: int | None
    longest_row: int
    rows_cut: int = 0
    messages_cut: int = 0
    tokens_cut: int = 0
    rows_over: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the training result."""
        return asdict(self)

    def summary(self) -> str:
        """One line for the console."""
        head = f"max length {self.max_length} tokens ({self.source}; longest row {self.longest_row})"
        if not self.rows_cut:
            return f"{head}; no prompt cut"
        return (f"{head}; {self.rows_cut} prompt(s) cut from the left at message boundaries: {self.messages_cut} "
                f"message(s), {self.tokens_cut} token(s)")


def model_context(model: Any, tokenizer: Any) -> int | None:
    """The longest sequence the model takes: the smaller of its position limit and the tokenizer's, where known."""
    limits = []
    config = getattr(model, "config", None)
    if config is not None:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        positions = getattr(text, "max_position_embeddings", None)
        if isinstance(positions, int) and positions > 0:
            limits.append(positions)
    tokens = getattr(tokenizer, "model_max_length", None)
    if isinstance(tokens, int) and 0 < tokens < _NO_LIMIT:
        limits.append(tokens)
    return min(limits) if limits else None


def _tools(row: dict[str, Any]) -> Any:
    tools = row.get("tools")
    return json.loads(tools) if isinstance(tools, str) else tools


def _length(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, *, prompt: bool) -> int:
    return len(tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                             add_generation_prompt=prompt)["input_ids"])


def _turns(prompt: list[dict[str, Any]]) -> tuple[int, list[tuple[int, int]]]:
    """How many leading messages are kept whatever happens (system, task prompt), and the turns after them.

    A turn is a user message, or an assistant message with the tool results that follow it: cutting inside one
    would leave a tool result without its call.
    """
    keep = 1 if prompt and prompt[0].get("role") == "system" else 0
    if keep < len(prompt) and prompt[keep].get("role") == "user":
        keep += 1
    turns: list[tuple[int, int]] = []
    for index in range(keep, len(prompt)):
        if prompt[index].get("role") == "tool" and turns:
            turns[-1] = (turns[-1][0], index + 1)
        else:
            turns.append((index, index + 1))
    return keep, turns


def fit_prompts(dataset: Any, tokenizer: Any, completions: tuple[str, ...], *, max_length: int | None,
                context: int | None) -> tuple[Any, PromptFit]:
    """Decide the length limit for conversational preference rows and cut the prompts over it.

    Args:
        dataset: The rows (``prompt`` and the ``completions`` columns, message lists; plain-text rows are measured
            but never cut).
        tokenizer: The policy's tokenizer, with its chat template.
        completions: The completion columns (``chosen``, ``rejected`` for DPO; ``completion`` for KTO).
        max_length: The limit the user gave, or None to take it from the data and the model's context.
        context: The model's context length (see :func:`model_context`), or None where unknown.

    Returns:
        The rows (prompts cut where needed) and what was done.
    """
    from trl.data_utils import is_conversational

    rows = len(dataset)
    if rows == 0 or "prompt" not in dataset.column_names:  # no rows, or TRL's implicit prompts: nothing to cut here
        return dataset, PromptFit(max_length or context or 0, "option" if max_length else "data", context, 0)
    conversational = is_conversational(dataset[0])
    prompt_lengths: list[int] = []
    completion_lengths: list[int] = []  # each row's longest completion
    for row in dataset:
        if conversational:
            tools = _tools(row)
            prompt_length = _length(tokenizer, list(row["prompt"]), tools, prompt=True)
            full = max(_length(tokenizer, list(row["prompt"]) + list(row[c]), tools, prompt=False)
                       for c in completions)
        else:
            prompt_length = len(tokenizer(row["prompt"], add_special_tokens=False)["input_ids"])
            full = prompt_length + max(len(tokenizer(row[c], add_special_tokens=False)["input_ids"]) + 1
                                       for c in completions)  # TRL appends EOS to a plain-text completion
        prompt_lengths.append(prompt_length)
        completion_lengths.append(full - prompt_length)
    longest = max(p + c for p, c in zip(prompt_lengths, completion_lengths, strict=True))
    if max_length is not None:
        limit, source = max_length, "option"
    elif context is not None and longest > context:
        limit, source = context, "context"
    else:
        limit, source = longest, "data"
    over = [i for i in range(rows) if prompt_lengths[i] + completion_lengths[i] > limit]
    if not over or not conversational:
        return dataset, PromptFit(limit, source, context, longest, rows_over=len(over))

    cuts: dict[int, tuple[list[dict[str, Any]], int, int]] = {}  # row -> (prompt, messages cut, tokens cut)
    still_over = 0
    for index in over:
        row = dataset[index]
        prompt, tools = list(row["prompt"]), _tools(row)
        keep, turns = _turns(prompt)
        budget = limit - completion_lengths[index]
        length, dropped = prompt_lengths[index], 0
        while length > budget and dropped < len(turns) - 1:  # the most recent turn always stays
            dropped += 1
            start = turns[dropped][0]
            candidate = prompt[:keep] + prompt[start:]
            length = _length(tokenizer, candidate, tools, prompt=True)
        if dropped:
            cut = prompt[:keep] + prompt[turns[dropped][0]:]
            cuts[index] = (cut, len(prompt) - len(cut), prompt_lengths[index] - length)
        if length > budget:
            still_over += 1
    if cuts:
        def replace(row: dict[str, Any], index: int) -> dict[str, Any]:
            return {"prompt": cuts[index][0]} if index in cuts else {"prompt": row["prompt"]}

        dataset = dataset.map(replace, with_indices=True, desc="Cutting long prompts at message boundaries")
    return dataset, PromptFit(limit, source, context, longest, rows_cut=len(cuts),
                              messages_cut=sum(c[1] for c in cuts.values()),
                              tokens_cut=sum(c[2] for c in cuts.values()), rows_over=still_over)
