"""Helpers for rollout tests: scripted replay files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def replay_file(tmp_path: Path):
    """Write scripted replay entries to a JSONL file and return its path."""

    def write(entries: list[dict], name: str = "replay.jsonl") -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
        return path

    return write


FIX_FACTORIAL = [
    {"prompt_contains": "factorial", "turn": 0,
     "response": {"text": "", "tool_calls": [{"name": "read_file", "arguments": {"path": "solution.py"}}]}},
    {"prompt_contains": "factorial", "turn": 1,
     "response": {"text": "", "tool_calls": [{"name": "write_file", "arguments": {
         "path": "solution.py",
         "content": "def factorial(n):\n    if n <= 1:\n        return 1\n    return n * factorial(n - 1)\n"}}]}},
    {"prompt_contains": "factorial", "turn": 2,
     "response": {"text": "", "tool_calls": [{"name": "run", "arguments": {"command": "python -m pytest -q"}}]}},
    {"prompt_contains": "factorial", "turn": 3,
     "response": {"text": "fixed", "tool_calls": [{"name": "submit", "arguments": {"answer": "base case fixed"}}]}},
]
