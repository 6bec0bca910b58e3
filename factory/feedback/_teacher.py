"""A teacher model writes the hint of a failed turn from the trajectory and the verifier's details.

Any model of the registry (``anthropic:``, ``openai:``, ``local``,
``replay:`` in tests) is asked once per negative proposal: the task, the
trajectory up to and including the turn, and the proposal's evidence go in;
one or two sentences come back, which become the proposal's ``hint`` (the
rule's own hint stays in the evidence as ``rule_hint``). An empty reply keeps
the rule's hint; a model error stops the proposals (nothing is written).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from factory.feedback._branch import BranchView
from factory.store import FeedbackRecord

__all__ = ["TEACHER_SYSTEM_PROMPT", "teacher_prompt", "write_teacher_hints"]

#: What the teacher is told before each trajectory (its reply is the hint).
TEACHER_SYSTEM_PROMPT = (
    "You are a teacher reviewing a coding agent's trajectory. The agent went wrong at one turn. Write a hint "
    "for that turn: one or two sentences that would have steered the agent to the right next action, "
    "grounded in the evidence shown. Do not give the whole solution. Reply with the hint alone."
)
_CONTENT_CHARS = 1500


def _render(message: dict[str, Any]) -> str:
    text = str(message.get("content") or "")[:_CONTENT_CHARS]
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True)
        text += f"\n<tool_call name={function.get('name')!r}>{arguments[:_CONTENT_CHARS]}</tool_call>"
    return f"[{message.get('role')}] {text.strip()}"


def teacher_prompt(view: BranchView, record: FeedbackRecord) -> list[dict[str, str]]:
    """The messages the teacher is sent for one turn's proposal."""
    assert record.turn is not None
    upto = view.turns[record.turn]
    trajectory = "\n\n".join(f"#{i} {_render(m)}" for i, m in enumerate(view.messages[: upto + 1]))
    evidence = json.dumps((record.evidence or {}).get("findings", []), indent=1, sort_keys=True)[:4000]
    user = (f"Trajectory of branch {view.branch_index} of task {view.task_id} (messages #0-#{upto}; the turn "
            f"to fix is #{upto}, assistant turn {record.turn}):\n\n{trajectory}\n\n"
            f"What the verifiers found at that turn:\n{evidence}\n\nWrite the hint for assistant turn {record.turn}.")
    return [{"role": "system", "content": TEACHER_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def write_teacher_hints(spec: str, items: Sequence[tuple[BranchView, FeedbackRecord]]) -> list[FeedbackRecord]:
    """The records with the teacher's hints (negative turn proposals only; the others come back as they were).

    Args:
        spec: The teacher model (``PREFIX:NAME``, as ``--model`` takes).
        items: Each proposal with its branch.

    Raises:
        ModelError: The model could not be built or a call failed after its retries.
    """
    from factory.models import create_model

    async def ask_all() -> list[FeedbackRecord]:
        model = create_model(spec)
        try:
            out = []
            for view, record in items:
                if record.polarity != "negative" or record.turn is None:
                    out.append(record)
                    continue
                reply = await model.chat(teacher_prompt(view, record), None, temperature=0.0, seed=0,
                                         max_tokens=256)
                hint = " ".join(reply.text.split())
                if not hint:
                    out.append(record)
                    continue
                evidence = {**(record.evidence or {}), "teacher": {"model": spec}, "rule_hint": record.hint}
                out.append(record.model_copy(update={"hint": hint, "evidence": evidence}))
            return out
        finally:
            await model.aclose()

    return asyncio.run(ask_all())
