"""Scripted agent turns shared by rollout and verifier tests (the replay_file fixture is in tests/conftest.py)."""

from __future__ import annotations

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
