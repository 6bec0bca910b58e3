"""Multi-turn GRPO in our sandboxes: TRL's ``environment_factory`` with the fork agent's tools.

TRL 1.16's ``GRPOTrainer`` runs the tool loop itself: it renders each
environment's public methods as tools, parses the policy's tool calls, calls
the methods, appends their results as ``tool`` messages and generates again;
the tool-result tokens are masked out of the loss (``tool_mask``), so the
policy learns only from the tokens it wrote. This module supplies the
environments (``environment_factory`` as a dict, routed by an ``environment``
column of the rows):

- ``workspace`` (:class:`WorkspaceEnvironment`), for tasks with files, tests
  or a build: its tools are exactly the fork agent's (``read_file``,
  ``write_file``, ``list_files``, ``run``, ``submit``, carried out by
  :func:`factory.rollouts.execute_tool`), in a fresh sandbox that ``reset``
  starts for every rollout, seeded with the task's files and the tests
  read-only, as ``factory fork`` starts a branch's; every result passes
  through the fork agent's summary (:func:`factory.sandbox.summarize_tool_output`
  with its byte budget), so training and inference see the same text;
- ``answer`` (:class:`AnswerEnvironment`), for answer-only tasks: no tools,
  as the fork runs them single-turn.

:class:`Episodes` owns what the rollouts share: one event loop thread where
every sandbox lives, the verification pipeline ``factory fork`` builds
(:func:`factory.verifiers.build_pipeline`: the isolated tests run, its hack
penalty and the behaviour monitor), and every environment made, so that
:meth:`Episodes.close` sweeps whatever sandbox is still open, also after the
trainer failed. Its :meth:`Episodes.reward` is the reward function: after
each episode it collects the workspace, closes the episode's sandbox and
verifies the result in fresh sandboxes, as the fork runner does; the reward
is the mean score of the verdicts, None where the infrastructure failed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from factory.errors import ConfigError, SandboxError
from factory.tasks import Task

__all__ = ["ANSWER_ENVIRONMENT", "WORKSPACE_ENVIRONMENT", "AnswerEnvironment", "Episodes", "WorkspaceEnvironment",
           "environment_of", "policy_token_counts"]

#: The ``environment`` column's values: which environment a row's rollouts run in.
WORKSPACE_ENVIRONMENT = "workspace"
ANSWER_ENVIRONMENT = "answer"

T = TypeVar("T")


def environment_of(task: Task) -> str:
    """The environment a task's rollouts run in: where the fork agent runs it single-turn (answer-only), none."""
    from factory.rollouts import ToolCallingAgent

    # The fork's own rule (no files, no tests, no build: single-turn); the agent needs no model to say so.
    return ANSWER_ENVIRONMENT if ToolCallingAgent(None).single_turn(task) else WORKSPACE_ENVIRONMENT  # type: ignore[arg-type]


class _LoopThread:
    """An event loop on a thread of its own: TRL calls the tools synchronously, sandboxes are asyncio objects.

    Every sandbox is made, used and closed on this one loop (asyncio subprocesses belong to the loop that
    started them), whichever thread TRL calls from.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="factory-grpo-sandboxes", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        if self.loop.is_closed():
            return

        async def settle() -> None:  # what is still running on the loop (a warm runner's keeper) ends first
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(settle(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class Episodes:
    """What every rollout of a multi-turn GRPO run shares; a context manager that closes every sandbox at the end.

    Args:
        sandbox: The sandbox backend (``bwrap``, ``docker``...).
        verifiers: Only these objective verifiers score (default: each task's own).
        concurrency: Episodes verified at once.
        tool_timeout_s: Longest a ``run`` tool call may take (the fork agent's default).
        summary_bytes: Byte budget of a tool result (the fork agent's default).
        hack_penalty: Subtracted from the tests score where tampering is detected (``factory fork``'s default).

    Attributes:
        counts: Running totals for the training result: episodes scored, objective passes, unscored, tool calls,
            infrastructure errors, sandboxes started and closed, passes per verifier.
        seconds: Wall time in the sandboxes: ``start`` (reset), ``tools``, ``verify`` (collect, close, verify).
        owner: The sandbox folder label of this run's sandboxes (see :func:`factory.sandbox.sandbox_owner`).
    """

    __name__ = "verifiers"  # the reward function's name: TRL logs rewards/verifiers/mean, as single-turn GRPO does

    def __init__(self, sandbox: str = "bwrap", *, verifiers: Sequence[str] | None = None, concurrency: int = 2,
                 tool_timeout_s: float | None = None, summary_bytes: int | None = None, hack_penalty: float = 0.4):
        from factory.rollouts import AgentConfig
        from factory.sandbox import SandboxLimits
        from factory.trainers._rewards import objective_selection
        from factory.verifiers import build_pipeline

        chosen = objective_selection(sandbox, verifiers)
        agent = AgentConfig()
        self.sandbox = sandbox
        self.limits = SandboxLimits()
        self.tool_timeout_s = agent.tool_timeout_s if tool_timeout_s is None else tool_timeout_s
        self.summary_bytes = agent.summary_bytes if summary_bytes is None else summary_bytes
        self.pipeline = build_pipeline(sandbox, self.limits, hack_penalty=hack_penalty)
        if chosen is not None:
            self.pipeline.only = frozenset(chosen)
        self.concurrency = max(1, concurrency)
        self.owner = f"grpo-{uuid.uuid4().hex[:8]}"
        self.counts: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()
        self._loop: _LoopThread | None = None
        self._made: list[WorkspaceEnvironment | AnswerEnvironment] = []
        self._tasks: dict[str, Task] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ plumbing

    def run(self, coroutine: Coroutine[Any, Any, T], clock: str | None = None) -> T:
        """Run ``coroutine`` on the sandboxes' loop (started on first use), adding its wall time to ``clock``."""
        with self._lock:
            if self._loop is None:
                self._loop = _LoopThread()
        started = time.perf_counter()
        try:
            return self._loop.run(coroutine)
        finally:
            if clock is not None:
                self.seconds[clock] += time.perf_counter() - started

    def task(self, spec: str) -> Task:
        """The task of a row's ``task_spec`` (parsed once)."""
        if spec not in self._tasks:
            try:
                self._tasks[spec] = Task.model_validate(json.loads(spec))
            except ValueError as exc:
                raise ConfigError(f"a GRPO row's task_spec is not a task: {exc}") from exc
        return self._tasks[spec]

    def factories(self) -> dict[str, Any]:
        """TRL's ``environment_factory``: a maker per environment name, each instance kept for the final sweep."""

        def make(kind: type) -> Any:
            def factory() -> Any:
                environment = kind(self)
                self._made.append(environment)
                return environment

            return factory

        return {WORKSPACE_ENVIRONMENT: make(WorkspaceEnvironment), ANSWER_ENVIRONMENT: make(AnswerEnvironment)}

    def open_sandboxes(self) -> int:
        """How many episodes' sandboxes are open now."""
        return sum(1 for env in self._made if getattr(env, "_sandbox", None) is not None)

    def close(self) -> None:
        """Close every sandbox still open (an episode the trainer never scored) and stop the loop."""
        try:
            if self._loop is not None:
                for environment in self._made:
                    if isinstance(environment, WorkspaceEnvironment):
                        environment._close()
                self.run(self.pipeline.aclose())  # the tests verifier's warm runners, as `factory fork` closes them
        finally:
            if self._loop is not None:
                self._loop.close()
                self._loop = None

    def __enter__(self) -> Episodes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -------------------------------------------------------------- reward

    def __call__(self, prompts: list[Any], completions: list[Any], environments: list[Any] | None = None,
                 **kwargs: Any) -> list[float | None]:
        """TRL's reward function: each episode verified after it ended (its sandbox closed first)."""
        if environments is None or len(environments) != len(completions):
            raise ConfigError("multi-turn GRPO scores episodes through their environments (environment_factory)")
        transcripts = [list(p or []) + list(c) if isinstance(c, list) else list(p or []) for p, c in
                       zip(prompts, completions)]

        async def all_of() -> list[float | None]:
            gate = asyncio.Semaphore(self.concurrency)

            async def one(environment: Any, messages: list[dict[str, Any]], completion: Any) -> float | None:
                async with gate:
                    return await environment._score(messages, completion)

            return list(await asyncio.gather(*(one(e, m, c) for e, m, c in
                                               zip(environments, transcripts, completions))))

        return self.run(all_of(), "verify")

    def record(self, verdicts: Sequence[Any]) -> float:
        """Count the verdicts of one scored episode; its reward (the mean verdict score)."""
        from factory.verifiers import objective_pass

        self.counts["scored"] += 1
        self.counts["objective_passes"] += bool(objective_pass(verdicts))
        for verdict in verdicts:
            self.counts[f"{verdict.verifier}_passes"] += verdict.ok
            self.counts[f"{verdict.verifier}_errors"] += verdict.status == "error"
        return sum(v.score for v in verdicts) / len(verdicts)


def _final_reply(completion: Any) -> tuple[str | None, bool]:
    """The episode's last assistant message: (its text when it called no tool, whether any message called one)."""
    if isinstance(completion, str):
        return completion, False
    called = any(m.get("tool_calls") for m in completion if m.get("role") == "assistant")
    last = completion[-1] if completion else None
    if last is not None and last.get("role") == "assistant" and not last.get("tool_calls"):
        return str(last.get("content") or ""), called
    return None, called


class _Environment:
    """What both environments share: the row's task, and scoring an episode with the run's pipeline."""

    def __init__(self, episodes: Episodes):
        self._episodes = episodes
        self._task: Task | None = None
        self._infra: str | None = None

    def _begin(self, row: dict[str, Any]) -> Task:
        spec = row.get("task_spec")
        if not spec:
            raise ConfigError("the GRPO data has no 'task_spec' column: export it with `factory export grpo`")
        self._task = self._episodes.task(spec)
        self._infra = None
        return self._task

    def _verdicts_to_reward(self, verdicts: Sequence[Any]) -> float | None:
        episodes = self._episodes
        if any(v.status == "error" for v in verdicts):  # a verifier that could not run is not an outcome
            episodes.counts["infra_errors"] += 1
            return None
        return episodes.record(verdicts)


class AnswerEnvironment(_Environment):
    """An answer-only task's episode: no tools (the fork runs these single-turn); the reply is the answer."""

    def reset(self, **row: Any) -> None:
        """Start an episode of the row's task (``task_spec``)."""
        self._begin(row)

    async def _score(self, messages: list[dict[str, Any]], completion: Any) -> float | None:
        from factory.rollouts import BranchStatus
        from factory.verifiers import BranchOutput, verify_in_fresh_sandbox

        episodes, task = self._episodes, self._task
        assert task is not None, "reset() was not called"
        if not episodes.pipeline.criteria(task):
            episodes.counts["unscored"] += 1
            return None
        reply, called = _final_reply(completion)
        # A tool call where none was offered is the policy's own action (the fork's invalid_action): a fail.
        status = BranchStatus.INVALID_ACTION if called else BranchStatus.OK
        try:
            verdicts = await verify_in_fresh_sandbox(episodes.pipeline, task, BranchOutput(
                None if called else reply, messages, status), episodes.sandbox, limits=episodes.limits)
        except SandboxError:
            episodes.counts["infra_errors"] += 1
            return None
        return self._verdicts_to_reward(verdicts)


class WorkspaceEnvironment(_Environment):
    """One rollout's workspace: the fork agent's tools in a fresh sandbox that ``reset`` starts.

    The tools' names, arguments and descriptions are the agent's (:data:`factory.rollouts.AGENT_TOOLS`), and
    each result is what the fork agent would have shown the model. ``submit`` ends the task: later calls change
    nothing.
    """

    def __init__(self, episodes: Episodes):
        super().__init__(episodes)
        self._sandbox: Any = None
        self._submitted: str | None = None
        self._calls = itertools.count()

    # ------------------------------------------------------------- episode

    def reset(self, **row: Any) -> None:
        """Start an episode of the row's task (``task_spec``): a fresh sandbox with its files, tests read-only."""
        from factory.sandbox import SandboxSpec, create_sandbox, sandbox_owner

        self._close()  # an episode the trainer never scored (it failed meanwhile): its sandbox goes now
        task = self._begin(row)
        self._submitted = None
        # Hidden tests are never in the policy's sandbox; they join only at verification (as in `factory fork`).
        spec = SandboxSpec(files=task.files, readonly_files=task.tests, limits=self._episodes.limits, image=task.image)

        async def start() -> Any:
            with sandbox_owner(self._episodes.owner):
                sandbox = create_sandbox(self._episodes.sandbox, spec)
                try:
                    await sandbox.start()
                except BaseException:
                    await sandbox.close()
                    raise
                return sandbox

        try:
            self._sandbox = self._episodes.run(start(), "start")
            self._episodes.counts["sandboxes_started"] += 1
        except Exception as exc:  # the infrastructure's failure: the episode runs on, and is not scored
            self._infra = f"the sandbox did not start: {type(exc).__name__}: {exc}"

    def _close(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            try:
                self._episodes.run(sandbox.close(), "verify")
            finally:
                self._episodes.counts["sandboxes_closed"] += 1

    def _tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Carry out one tool call as the fork agent does; the summarized result the model sees."""
        from factory.models import ToolCall
        from factory.rollouts import execute_tool
        from factory.sandbox import summarize_tool_output

        episodes = self._episodes
        episodes.counts["tool_calls"] += 1
        if self._submitted is not None:
            return "error: the task was submitted; nothing more is carried out"
        if self._sandbox is None:
            return f"error: {self._infra or 'no sandbox (reset was not called)'}"
        call = ToolCall(f"call-{next(self._calls)}", name, {k: v for k, v in arguments.items() if v is not None})
        try:
            outcome = episodes.run(execute_tool(call, self._sandbox, episodes.tool_timeout_s), "tools")
        except SandboxError as exc:  # the sandbox died: not the policy's doing
            self._infra = f"the sandbox failed: {exc}"
            return f"error: {self._infra}"
        if outcome.submitted is not None:
            self._submitted = outcome.submitted
        return summarize_tool_output(outcome.output, max_bytes=episodes.summary_bytes)

    async def _score(self, messages: list[dict[str, Any]], completion: Any) -> float | None:
        from factory.rollouts import BranchStatus
        from factory.sandbox import snapshot_of
        from factory.verifiers import BranchOutput, verify_in_fresh_sandbox

        episodes, task = self._episodes, self._task
        assert task is not None, "reset() was not called"
        sandbox, self._sandbox = self._sandbox, None
        collected = None
        try:
            if sandbox is not None and self._infra is None:
                collected = await sandbox.collect_workspace()
        except SandboxError as exc:
            self._infra = f"the workspace could not be collected: {exc}"
        finally:
            if sandbox is not None:  # closed before verification: none of the policy's processes outlive it
                try:
                    await sandbox.close()
                finally:
                    episodes.counts["sandboxes_closed"] += 1
        if self._infra is not None or collected is None:
            episodes.counts["infra_errors"] += 1
            return None
        if not episodes.pipeline.criteria(task):
            episodes.counts["unscored"] += 1
            return None
        if self._submitted is not None:
            answer, status = self._submitted, BranchStatus.OK
        else:
            reply, _ = _final_reply(completion)
            # No submit: a reply without a tool call is the answer (as in the fork); else the turns ran out.
            answer, status = (reply, BranchStatus.OK) if reply is not None else (None, BranchStatus.MAX_TURNS)
        try:
            verdicts = await verify_in_fresh_sandbox(
                episodes.pipeline, task, BranchOutput(answer, messages, status), episodes.sandbox,
                snapshot_of(collected, task), files=collected.files, limits=episodes.limits)
        except SandboxError:
            episodes.counts["infra_errors"] += 1
            return None
        return self._verdicts_to_reward(verdicts)

    # --------------------------------------------------------------- tools
    # The fork agent's tools (factory.rollouts.AGENT_TOOLS): TRL renders these methods' signatures and
    # docstrings as the tool schema, and a test checks they match the agent's.

    def read_file(self, path: str) -> str:
        """Read a text file from the workspace.

        Args:
            path: Path relative to the workspace.
        """
        return self._tool("read_file", {"path": path})

    def write_file(self, path: str, content: str) -> str:
        """Create or overwrite a file in the workspace.

        Args:
            path: Path relative to the workspace.
            content: The file's new text.
        """
        return self._tool("write_file", {"path": path, "content": content})

    def list_files(self, path: str | None = None) -> str:
        """List files in the workspace (recursively).

        Args:
            path: Directory; default the workspace root.
        """
        return self._tool("list_files", {"path": path})

    def run(self, command: str, timeout: float | None = None) -> str:
        """Run a shell command in the workspace sandbox (no network).

        Args:
            command: The shell command.
            timeout: Seconds (capped by the sandbox limit).
        """
        return self._tool("run", {"command": command, "timeout": timeout})

    def submit(self, answer: str) -> str:
        """Submit the final answer; this ends the task.

        Args:
            answer: The final answer (for code tasks, a one-line summary of the fix).
        """
        return self._tool("submit", {"answer": answer})


def policy_token_counts(completions: Sequence[Any], completion_ids: Sequence[Sequence[int]],
                        tokenizer: Any) -> list[int]:
    """The tokens the policy itself wrote in each multi-turn completion: its ids less the tool results' tokens.

    TRL builds a multi-turn completion as the policy's turns with, after each
    tool-calling turn, the tool messages rendered by the chat template
    (``GRPOTrainer._get_tool_suffix_ids``: the template's text for the tool
    messages and the next assistant header); those tokens are masked out of
    the loss, and so they are left out of the length the hacking detector
    watches. Counted the same way here.
    """
    counts = []
    for completion, ids in zip(completions, completion_ids):
        tool_tokens = 0
        if not isinstance(completion, str):
            block: list[dict[str, Any]] = []
            for message in [*completion, {"role": "end"}]:
                if message.get("role") == "tool":
                    block.append(message)
                elif block:
                    tool_tokens += _tool_suffix_length(block, tokenizer)
                    block = []
        counts.append(max(0, len(ids) - tool_tokens))
    return counts


def _tool_suffix_length(tool_messages: list[dict[str, Any]], tokenizer: Any) -> int:
    dummy = [{"role": "user", "content": "dummy"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "function": {"name": tool_messages[0].get("name") or "tool", "arguments": {}}}]}]
    messages = [{"role": "tool", "name": m.get("name"), "content": m.get("content")} for m in tool_messages]
    prefix = tokenizer.apply_chat_template(dummy, add_generation_prompt=False, tokenize=True, return_dict=False)
    full = tokenizer.apply_chat_template(dummy + messages, add_generation_prompt=True, tokenize=True,
                                         return_dict=False)
    # As TRL does: the boundary is the assistant turn's end-of-turn token, not what the template puts after it.
    ends = [i for i, token in enumerate(prefix) if token == tokenizer.eos_token_id]
    return len(full) - (ends[-1] + 1 if ends else len(prefix))


def wants_multi_turn(dataset: Any, choice: bool | None) -> bool:
    """Whether GRPO runs multi-turn: ``choice`` where given, else exactly when a row's task has a workspace."""
    if choice is not None:
        return bool(choice)
    if "task_spec" not in dataset.column_names:
        return False  # the reward function names what is missing
    return any(environment_of(Task.model_validate(json.loads(spec))) == WORKSPACE_ENVIRONMENT
               for spec in set(dataset["task_spec"]) if spec)


def multi_turn_rows(dataset: Any, path: Any) -> Any:
    """The rows with their ``environment`` column (TRL routes each row's rollouts by it).

    Raises:
        ConfigError: No ``task_spec`` column, or prompts that are plain text (the tool loop needs messages).
    """
    if "task_spec" not in dataset.column_names:
        raise ConfigError(f"{path}: the GRPO data has no 'task_spec' column: export it with `factory export grpo`")
    if len(dataset) and isinstance(dataset[0]["prompt"], str):
        raise ConfigError(f"{path}: field 'prompt' is plain text; multi-turn GRPO needs conversational prompts "
                          "(export without --format standard), or train single-turn with --set multi_turn=false")
    kinds = {spec: environment_of(Task.model_validate(json.loads(spec))) for spec in set(dataset["task_spec"])}
    if "environment" in dataset.column_names:
        dataset = dataset.remove_columns("environment")
    return dataset.add_column("environment", [kinds[spec] for spec in dataset["task_spec"]])


def parse_tool_calls_with(tokenizer: Any) -> Any:
    """``tokenizer`` able to read tool calls back (TRL's ``parse_response``), for templates TRL does not know.

    TRL sets a response template for the chat templates it knows; for another template that writes tool
    calls as ``<tool_call>{json}</tool_call>`` blocks and ends turns with ``<|im_end|>`` (ChatML: the tiny
    model's, the embedded Qwen's), the Qwen3 one reads them as they are written.

    Raises:
        ConfigError: The template writes tool calls some other way.
    """
    from trl.chat_template_utils import add_response_schema, qwen3_template

    if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None):
        return tokenizer
    try:
        tokenizer = add_response_schema(tokenizer)
    except ValueError:  # a template TRL does not know: read as ChatML below, where it writes calls that way
        pass
    else:
        return tokenizer
    template = str(getattr(tokenizer, "chat_template", "") or "")
    if "<tool_call>" not in template or "<|im_end|>" not in template:
        raise ConfigError("multi-turn GRPO: the policy's chat template writes tool calls in a way this trainer "
                          "cannot read back (no <tool_call> blocks); train single-turn with --set multi_turn=false")
    tokenizer.response_template = qwen3_template
    return tokenizer
