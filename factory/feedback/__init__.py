"""Feedback: turn- and span-level annotations of branches (polarities and hints), and where they come from.

A person adds them (``factory feedback add``, or a JSONL file with
``factory feedback import``); the rules propose them from what the store
already knows (the turn where a test run first failed, a tool error, the
behaviour monitor's evidence, the turns that wrote a passing fix); a teacher
model can write the hints. Proposals wait for a person's accept, reject or
override; the ``hints`` and ``spans`` exports read accepted rows only. What a
turn and a span are is defined once, in :mod:`factory.store._feedback`.
"""

from factory.feedback._ledger import (
    add_feedback,
    import_feedback,
    list_feedback,
    override_feedback,
    parse_span,
    propose_feedback,
    set_feedback_status,
)
from factory.feedback._teacher import teacher_prompt

__all__ = [
    "add_feedback",
    "import_feedback",
    "list_feedback",
    "override_feedback",
    "parse_span",
    "propose_feedback",
    "set_feedback_status",
    "teacher_prompt",
]
