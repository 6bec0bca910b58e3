"""The columns each built-in export format writes, and their kinds: the contract TRL's trainers read.

Kept apart from the format implementations (which need polars and the store)
so that checking a file, as ``factory export validate`` and every trainer do,
imports neither.
"""

from __future__ import annotations

__all__ = ["FORMAT_COLUMNS", "SIDE_FILE_COLUMNS"]

_PAIR = {"prompt": "messages|text", "chosen": "messages|text", "rejected": "messages|text"}

#: format -> column -> kind (``messages``, ``text``, ``messages|text``, ``number``, ``bool``, ``list``).
FORMAT_COLUMNS: dict[str, dict[str, str]] = {
    "dpo": _PAIR,
    "kto": {"prompt": "messages|text", "completion": "messages|text", "label": "bool"},
    "reward": {**_PAIR, "margin": "number"},
    "sft": {"messages": "messages"},
    "grpo": {"prompt": "messages|text"},
    # turn-level hints and span-level polarities (factory.export._feedback; checked further by _feedback_rows)
    "hints": {"prompt": "messages", "teacher_prompt": "messages", "completion": "messages", "hint": "text",
              "turn": "number"},
    "spans": {"messages": "messages", "polarity": "list", "spans": "list"},
    "ppo": {"prompt": "messages|text", "completion": "messages|text", "reward": "number"},
}

#: ``FORMAT-TAG`` of a side file written beside a format's main file -> its columns: the reward format's
#: scalar file (``data.scalar.jsonl``), which regression reward models train on.
SIDE_FILE_COLUMNS: dict[str, dict[str, str]] = {
    "reward-scalar": {"prompt": "messages|text", "completion": "messages|text", "reward": "number"},
}
