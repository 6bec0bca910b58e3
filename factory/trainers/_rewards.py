"""Reward functions for GRPO built from our verifiers: online RL from the rewards that made the data.

:class:`VerifierReward` has TRL's reward-function signature
``(prompts, completions, **kwargs) -> list[float | None]`` and reads the
``task_spec`` column the GRPO export carries (TRL passes extra columns as
keyword arguments). Each completion is treated as one agent turn:

1. its ``<tool_call>`` blocks (the agent's tools: ``write_file``, ``run``,
   ``submit``...) are carried out, in order, in a fresh sandbox seeded with
   the task's files (tests read-only), exactly as the fork runner would;
2. the task's objective verifiers run on the result: ``answer`` on the
   submitted (or written) answer, ``tests`` / ``build`` in that sandbox,
   ``schema`` and ``rules`` on the answer; the LLM judge never runs here;
3. the reward is the mean score of those verdicts (the ranker's objective
   score; the tests verifier's tamper penalty included), or None for a task
   no objective verifier applies to, and None where the infrastructure failed
   (a sandbox that did not start or died, a verifier that could not run):
   TRL leaves None out of the mean, so no completion is taught a zero it
   did not earn.

Model-written code never runs outside the sandbox.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from factory.errors import ConfigError, SandboxError
from factory.tasks import Task

__all__ = ["VerifierReward", "completion_text"]


def completion_text(completion: Any) -> str:
    """A completion's text: a plain string, or the assistant contents of a message list."""
    if isinstance(completion, str):
        return completion
    return "\n".join(str(m.get("content") or "") for m in completion if m.get("role", "assistant") == "assistant")


def _run_coroutine(coroutine: Any) -> Any:
    """Run ``coroutine`` to the end from synchronous code, even where an event loop is already running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(coroutine)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=run, name="factory-verifier-reward")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def objective_selection(sandbox: str, verifiers: Sequence[str] | None) -> set[str] | None:
    """The verifiers a reward may use, checked: a known sandbox, and only objective verifiers (None: all of them).

    Raises:
        ConfigError: An unknown sandbox, or an opinion (the LLM judge) among ``verifiers``.
    """
    from factory.sandbox import sandbox_names
    from factory.verifiers import is_objective

    if sandbox not in sandbox_names():
        raise ConfigError(f"unknown sandbox {sandbox!r} (use one of: {', '.join(sandbox_names())})")
    chosen = set(verifiers) if verifiers is not None else None
    opinions = sorted(name for name in chosen or () if not is_objective(name))
    if opinions:
        raise ConfigError(f"{', '.join(opinions)}: an opinion (the LLM judge), not an objective verifier; "
                          "GRPO rewards come from objective ones")
    return chosen


class VerifierReward:
    """A TRL reward function that scores completions with the task's objective verifiers.

    Args:
        sandbox: The sandbox backend for tool calls and tests (``bwrap``, ``docker``...).
        verifiers: Only these objective verifiers (default: every one the task's fields select).
        concurrency: Completions verified at once (each may hold a sandbox).
        tool_timeout_s: Longest a ``run`` tool call may take.

    Attributes:
        counts: Running totals: completions scored, objective passes, unscored (no verifier), tool calls run,
            and passes per verifier, for the training result.
    """

    __name__ = "verifiers"  # TRL logs each reward function's mean under rewards/<__name__>

    def __init__(self, sandbox: str = "bwrap", *, verifiers: Sequence[str] | None = None, concurrency: int = 2,
                 tool_timeout_s: float = 30.0):
        from factory.rollouts import AGENT_TOOLS
        from factory.verifiers import VerificationPipeline

        chosen = objective_selection(sandbox, verifiers)
        self.sandbox = sandbox
        self.pipeline = VerificationPipeline(only=frozenset(chosen) if chosen is not None else None)
        self.concurrency = max(1, concurrency)
        self.tool_timeout_s = tool_timeout_s
        self._tool_names = frozenset(tool.name for tool in AGENT_TOOLS)
        self._tasks: dict[str, Task] = {}
        self.counts: Counter[str] = Counter()

    def _task(self, spec: str) -> Task:
        if spec not in self._tasks:
            self._tasks[spec] = Task.model_validate(json.loads(spec))
        return self._tasks[spec]

    async def _score(self, task: Task, text: str, gate: asyncio.Semaphore) -> float | None:
        from factory.models import parse_text_tool_calls
        from factory.rollouts import execute_tool
        from factory.verifiers import BranchOutput, objective_pass, verify_in_fresh_sandbox

        # The pipeline holds no judge model, so every criterion it checks is an objective one.
        if not self.pipeline.criteria(task):
            self.counts["unscored"] += 1
            return None
        prose, calls = parse_text_tool_calls(text, known_tools=self._tool_names)
        message = {"role": "assistant", "content": prose,
                   "tool_calls": [call.as_message_part() for call in calls] or None}

        async def carry_out(box) -> BranchOutput | None:
            """The completion's tool calls, in order; a submitted answer is what gets verified."""
            for call in calls:
                outcome = await execute_tool(call, box, self.tool_timeout_s)
                self.counts["tool_calls"] += 1
                if outcome.submitted is not None:
                    return BranchOutput(outcome.submitted, [message], "ok")  # submit ends a branch
            return None

        try:
            async with gate:
                verdicts = await verify_in_fresh_sandbox(self.pipeline, task, BranchOutput(prose, [message], "ok"),
                                                         self.sandbox, replay=carry_out if calls else None)
        except SandboxError:
            # The sandbox failed to start or died: the infrastructure's failure, not the completion's. None
            # leaves it out of the group's mean (TRL's convention) instead of teaching a zero.
            self.counts["infra_errors"] += 1
            return None
        if any(v.status == "error" for v in verdicts):  # a verifier that could not run is not an outcome either
            self.counts["infra_errors"] += 1
            return None
        self.counts["scored"] += 1
        self.counts["objective_passes"] += bool(objective_pass(verdicts))
        for verdict in verdicts:
            self.counts[f"{verdict.verifier}_passes"] += verdict.ok
            self.counts[f"{verdict.verifier}_errors"] += verdict.status == "error"
        return sum(v.score for v in verdicts) / len(verdicts)

    async def _score_all(self, texts: list[str], specs: list[str]) -> list[float | None]:
        gate = asyncio.Semaphore(self.concurrency)
        return list(await asyncio.gather(*(self._score(self._task(spec), text, gate)
                                           for text, spec in zip(texts, specs))))

    def __call__(self, prompts: list[Any], completions: list[Any], task_spec: list[str] | None = None,
                 **kwargs: Any) -> list[float | None]:
        """Score each completion against its row's task (``task_spec``, a column of the GRPO export)."""
        if task_spec is None:
            raise ConfigError("the GRPO data has no 'task_spec' column: export it with `factory export grpo`")
        if len(task_spec) != len(completions):
            raise ConfigError(f"{len(completions)} completions but {len(task_spec)} task specs")
        return _run_coroutine(self._score_all([completion_text(c) for c in completions], list(task_spec)))
