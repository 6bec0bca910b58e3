"""``ToolCallingAgent``: one branch's agent loop over a model and a sandbox.

Every step becomes a timestamped event (``run_start``, ``model_call``,
``tool_call``, ``tool_result``, ``final_answer``, ``error``). Tool outputs
are summarized once and that text is both stored and shown to the model.

A branch ends when the model calls ``submit``, or answers without calling a
tool (its text is the answer), or hits the turn cap (status ``max_turns``),
or fails (status ``error``, with the reason). Answer-only tasks (no files,
no tests, no build) run single-turn by default: no tools, the reply is the
answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from factory.errors import FactoryError, ModelError, ProviderUnavailableError, SandboxError
from factory.models import ChatModel, Message, Usage
from factory.rollouts._tools import AGENT_TOOLS, execute_tool
from factory.sandbox import Sandbox, summarize_tool_output
from factory.store import (
    BranchEvent,
    ErrorEvent,
    FinalAnswerEvent,
    ModelCallEvent,
    RunStartEvent,
    ToolCallEvent,
    ToolResultEvent,
)
from factory.tasks import Task

__all__ = ["AgentConfig", "AgentResult", "BranchStatus", "ToolCallingAgent"]

TOOL_SYSTEM_PROMPT = (
    "You are a careful software engineer working in a sandboxed workspace with no network. "
    "Use the tools to inspect files, edit them and run commands. "
    "When you are done, call submit with your final answer (for code tasks, a one-line summary of the fix)."
)
ANSWER_SYSTEM_PROMPT = (
    "You are a careful problem solver. Think briefly, then give the answer alone on the last line "
    "in the form `Final: <answer>`."
)


class BranchStatus:
    """Terminal statuses of a branch (strings, as stored).

    Agent outcomes — what the policy did, verified and counted: ``ok`` (it
    answered), ``max_turns`` (it ran out of turns), ``invalid_action`` (it
    asked for something it cannot do, e.g. a tool in a single-turn task).
    Not outcomes — excluded and counted wherever a pass rate is used:
    ``infra_error`` (the provider gave up after its retries or timed out, the
    sandbox failed to start or died, a harness file was missing), with the
    reason in ``error``; and ``error``, what runs before this split stored
    for either kind, read conservatively as not an outcome.
    """

    OK = "ok"
    MAX_TURNS = "max_turns"
    INVALID_ACTION = "invalid_action"
    INFRA_ERROR = "infra_error"
    ERROR = "error"
    #: Statuses that say nothing about the policy: never verified as fails, excluded from every rate.
    NOT_OUTCOMES = frozenset({INFRA_ERROR, ERROR})


@dataclass(frozen=True)
class AgentConfig:
    """How the agent runs.

    Attributes:
        max_turns: Model calls per branch.
        max_tokens: Tokens per model call.
        single_turn: Force single-turn (True) or tool mode (False); None: single-turn
            exactly for answer-only tasks.
        tool_timeout_s: Cap on one ``run`` command.
        system_prompt: Overrides the default system prompt for the chosen mode.
        summary_bytes: Byte budget of summarized tool outputs.
    """

    max_turns: int = 8
    max_tokens: int = 1024
    single_turn: bool | None = None
    tool_timeout_s: float = 60.0
    system_prompt: str | None = None
    summary_bytes: int = 800


@dataclass
class AgentResult:
    """What a branch produced.

    Attributes:
        status: One of :class:`BranchStatus`.
        final_answer: The submitted (or replied) answer, if any.
        messages: The whole conversation (the trajectory).
        tool_call_sequence: Tool calls with their summarized results.
        events: Timestamped steps, typed by kind.
        usage: Tokens and cost summed over the branch.
        error: Why the branch failed, for status ``error``.
        fatal: The provider is gone for the whole run (a crashed engine, an endpoint that does not
            answer): the runner stops the run after this branch.
    """

    status: str
    final_answer: str | None
    messages: list[Message]
    tool_call_sequence: list[dict[str, Any]]
    events: list[BranchEvent]
    usage: Usage
    error: str | None = None
    fatal: ProviderUnavailableError | None = None


@dataclass
class _Recorder:
    events: list[BranchEvent] = field(default_factory=list)

    def add(self, event_type: type[BranchEvent], **fields: Any) -> None:
        """Append an event of ``event_type``, numbered and timestamped here (fields are validated)."""
        self.events.append(event_type(seq=len(self.events), ts=datetime.now(timezone.utc).replace(tzinfo=None),
                                      **fields))


def answer_only(task: Task) -> bool:
    """A task with nothing in a workspace to act on."""
    return not task.files and not task.tests and task.build_command is None


class ToolCallingAgent:
    """Drives one model through one task in one sandbox."""

    def __init__(self, model: ChatModel, config: AgentConfig | None = None):
        self.model = model
        self.config = config or AgentConfig()

    def single_turn(self, task: Task) -> bool:
        """Whether ``task`` runs single-turn under this config."""
        return self.config.single_turn if self.config.single_turn is not None else answer_only(task)

    def opening(self, task: Task, primer: str | None = None) -> list[Message]:
        """The system and user messages a branch starts from."""
        single = self.single_turn(task)
        system = self.config.system_prompt or (ANSWER_SYSTEM_PROMPT if single else TOOL_SYSTEM_PROMPT)
        if primer:
            system = f"{system}\n\n{primer}"
        user = task.prompt
        if not single and task.files:
            user += "\n\nWorkspace files: " + ", ".join(sorted({*task.files, *task.tests}))
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    async def run(
        self,
        task: Task,
        sandbox: Sandbox | None,
        *,
        temperature: float,
        seed: int | None,
        primer: str | None = None,
    ) -> AgentResult:
        """Run the branch to its end; never raises for model or sandbox failures.

        Args:
            task: The task.
            sandbox: A started sandbox (None only for single-turn tasks).
            temperature: Sampling temperature for every model call.
            seed: Sampling seed for every model call.
            primer: Extra system text (e.g. retrieved memories), recorded in ``run_start``.
        """
        recorder = _Recorder()
        messages = self.opening(task, primer)
        single = self.single_turn(task)
        recorder.add(RunStartEvent, task_id=task.id, model=self.model.spec, temperature=temperature, seed=seed,
                     mode="single-turn" if single else "tools", max_turns=self.config.max_turns,
                     primer=primer, system_prompt=messages[0]["content"])
        sequence: list[dict[str, Any]] = []
        usage = Usage()
        tools = None if single else list(AGENT_TOOLS)
        try:
            for turn in range(1 if single else self.config.max_turns):
                started = time.monotonic()
                response = await self.model.chat(messages, tools, temperature=temperature, seed=seed,
                                                 max_tokens=self.config.max_tokens)
                usage = usage + response.usage
                recorder.add(ModelCallEvent, turn=turn, latency_s=round(time.monotonic() - started, 4),
                             input_tokens=response.usage.input_tokens, output_tokens=response.usage.output_tokens,
                             finish_reason=response.finish_reason, text=response.text,
                             tool_calls=[c.name for c in response.tool_calls])
                assistant: Message = {"role": "assistant", "content": response.text}
                if response.tool_calls:
                    assistant["tool_calls"] = [call.as_message_part() for call in response.tool_calls]
                messages.append(assistant)
                if not response.tool_calls:
                    recorder.add(FinalAnswerEvent, answer=response.text, via="reply")
                    return AgentResult(BranchStatus.OK, response.text, messages, sequence, recorder.events, usage)
                if sandbox is None:  # the policy called a tool where it has none: its own action, not our failure
                    recorder.add(ErrorEvent, type="invalid_action",
                                 message="tool call in a single-turn task (no tools were offered)")
                    return AgentResult(BranchStatus.INVALID_ACTION, None, messages, sequence, recorder.events,
                                       usage, error="tool call in a single-turn task")
                for call in response.tool_calls:
                    recorder.add(ToolCallEvent, id=call.id, name=call.name, arguments=call.arguments, error=call.error,
                                 origin=call.origin)
                    outcome = await execute_tool(call, sandbox, self.config.tool_timeout_s)
                    summary = summarize_tool_output(outcome.output, max_bytes=self.config.summary_bytes)
                    recorder.add(ToolResultEvent, id=call.id, name=call.name, ok=outcome.ok, output=summary)
                    sequence.append({"name": call.name, "arguments": call.arguments, "ok": outcome.ok,
                                     "result": summary})
                    messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": summary})
                    if outcome.submitted is not None:
                        recorder.add(FinalAnswerEvent, answer=outcome.submitted, via="submit")
                        return AgentResult(BranchStatus.OK, outcome.submitted, messages, sequence,
                                           recorder.events, usage)
            recorder.add(ErrorEvent, type="max_turns", message=f"no answer after {self.config.max_turns} turns")
            return AgentResult(BranchStatus.MAX_TURNS, None, messages, sequence, recorder.events, usage,
                               error=f"no answer after {self.config.max_turns} turns")
        except (ModelError, SandboxError, FactoryError) as exc:
            # The provider gave up after its retries, the sandbox died: the infrastructure's failure, not the
            # policy's (tool errors the policy caused come back to it as tool results, above).
            recorder.add(ErrorEvent, type=type(exc).__name__, message=str(exc))
            return AgentResult(BranchStatus.INFRA_ERROR, None, messages, sequence, recorder.events, usage,
                               error=f"{type(exc).__name__}: {exc}",
                               fatal=exc if isinstance(exc, ProviderUnavailableError) else None)
