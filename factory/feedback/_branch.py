"""``BranchView``: one stored branch as the feedback rules read it (trajectory, tool results, verdicts, task).

Built from the store alone (branches, events, latest verdicts, tasks): a
rule never re-runs anything. Tool results are placed by position: the k-th
``tool`` message after an assistant message answers that message's k-th tool
call, and the k-th ``tool_result`` event of the branch is the k-th ``tool``
message (the agent records both as it goes), which gives each result its
``ok`` flag (exit status 0 for ``run``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from factory.store import Store, assistant_message_indexes

__all__ = ["BranchView", "ToolResult", "load_branch_views"]

#: A ``run`` command that runs tests, when the task names no test command of its own (or besides it).
_TEST_RUNNERS = re.compile(r"\b(pytest|py\.test|unittest|tox|nox)\b|\bmake\s+(test|check)\b|\btest_\w*\.py\b")


@dataclass(frozen=True)
class ToolResult:
    """One tool call of the policy's and what came back.

    Attributes:
        message_index: Where the ``tool`` message sits in the trajectory.
        turn: The assistant turn that made the call.
        name: The tool.
        arguments: Its arguments, parsed.
        ok: Whether it did what was asked (exit status 0 for ``run``).
        output: The summarized result the policy saw.
    """

    message_index: int
    turn: int
    name: str
    arguments: dict[str, Any]
    ok: bool
    output: str


@dataclass
class BranchView:
    """A branch with what the feedback rules need.

    Attributes:
        run_id: The run.
        task_id: The task.
        branch_index: The branch.
        messages: The trajectory (tool-call arguments as stored: objects).
        turns: Message index of each assistant turn (:func:`~factory.store.assistant_message_indexes`).
        tool_results: Every tool call with its result, in order.
        verdicts: Latest verdict per verifier: ``{"status", "score", "details"}``.
        objective_pass: Every objective verdict passed (None: unverified or a verifier error).
        test_command: The task's test command, if any.
        test_files: The task's test files (never a fix).
        final_files: The final workspace's files (empty when no snapshot was stored).
    """

    run_id: str
    task_id: str
    branch_index: int
    messages: list[dict[str, Any]]
    turns: list[int]
    tool_results: list[ToolResult] = field(default_factory=list)
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    objective_pass: bool | None = None
    test_command: str | None = None
    test_files: frozenset[str] = frozenset()
    final_files: dict[str, str] = field(default_factory=dict)

    def turn_of_message(self, index: int) -> int | None:
        """The assistant turn a message belongs to: its own, or the latest one before it (None before any)."""
        turn = None
        for t, message_index in enumerate(self.turns):
            if message_index > index:
                break
            turn = t
        return turn

    def runs_tests(self, command: str) -> bool:
        """Whether a ``run`` command runs the task's tests."""
        if self.test_command and " ".join(self.test_command.split()) in " ".join(command.split()):
            return True
        return bool(_TEST_RUNNERS.search(command))

    def writes(self) -> list[tuple[int, str, str]]:
        """``(turn, path, content)`` of every ``write_file`` call, in order."""
        found = []
        for turn, index in enumerate(self.turns):
            for call in self.messages[index].get("tool_calls") or []:
                function = call.get("function") or {}
                if function.get("name") != "write_file":
                    continue
                arguments = _arguments(function.get("arguments"))
                path = str(arguments.get("path", "")).removeprefix("./")
                if path:
                    found.append((turn, path, str(arguments.get("content", ""))))
        return found

    def last_write_turn(self, path: str, containing: str | None = None) -> int | None:
        """The last turn that wrote ``path`` (with ``containing`` in its content, when that finds one)."""
        writes = [(turn, content) for turn, p, content in self.writes() if p == path.removeprefix("./")]
        if containing:
            matching = [turn for turn, content in writes if containing.strip() and containing.strip() in content]
            if matching:
                return matching[-1]
        return writes[-1][0] if writes else None

    @property
    def hacked(self) -> bool:
        """A verifier detected tampering or the monitor suspects a hack attempt."""
        return any((v["details"] or {}).get("hack_detected") or (v["details"] or {}).get("hack_suspected")
                   for v in self.verdicts.values())


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    return dict(raw) if isinstance(raw, Mapping) else {}


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def _tool_results(messages: list[dict[str, Any]], turns: list[int], oks: list[bool]) -> list[ToolResult]:
    results: list[ToolResult] = []
    turn, calls, position = -1, [], 0
    for index, message in enumerate(messages):
        if message.get("role") == "assistant":
            turn += 1
            calls, position = message.get("tool_calls") or [], 0
            continue
        if message.get("role") != "tool" or turn < 0:
            continue
        call = calls[position] if position < len(calls) else {}
        position += 1
        function = call.get("function") or {}
        content = str(message.get("content") or "")
        k = len(results)
        # Without events (never in a branch the agent wrote), the agent's own error prefix says it.
        ok = oks[k] if k < len(oks) else not content.startswith("error:")
        results.append(ToolResult(index, turn, str(function.get("name") or message.get("name") or ""),
                                  _arguments(function.get("arguments")), ok, content))
    return results


def load_branch_views(store: Store, run_id: str, task_id: str | None = None) -> list[BranchView]:
    """Every branch of a run (or of one of its tasks) that is an outcome, as the feedback rules read it."""
    from factory.verifiers import opinion_verifiers

    branches = store.branches(run_id, task_id)
    if branches.is_empty():
        return []
    records = store.branch_records(run_id, opinions=opinion_verifiers())
    outcomes = {(r["task_id"], r["branch_index"]): r for r in records.iter_rows(named=True)}
    events = store.events(run_id, task_id).filter(pl.col("kind") == "tool_result")
    oks: dict[tuple[str, int], list[bool]] = {}
    for row in events.iter_rows(named=True):
        oks.setdefault((row["task_id"], row["branch_index"]), []).append(bool(_json(row["payload"]).get("ok")))
    verdicts: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for row in store.latest_verdicts(run_id).iter_rows(named=True):
        verdicts.setdefault((row["task_id"], row["branch_index"]), {})[row["verifier"]] = {
            "status": row["status"], "score": row["score"], "details": _json(row["details"]) or {}}
    specs = {row["task_id"]: _json(row["spec"]) or {} for row in store.tasks(run_id).iter_rows(named=True)}
    views = []
    for row in branches.iter_rows(named=True):
        key = (row["task_id"], row["branch_index"])
        if key not in outcomes:  # an infrastructure failure says nothing about the policy
            continue
        messages = _json(row["trajectory"]) or []
        turns = assistant_message_indexes(messages)
        spec = specs.get(row["task_id"], {})
        workspace = _json(row.get("workspace")) or {}
        views.append(BranchView(
            run_id=run_id, task_id=row["task_id"], branch_index=int(row["branch_index"]), messages=messages,
            turns=turns, tool_results=_tool_results(messages, turns, oks.get(key, [])),
            verdicts=verdicts.get(key, {}), objective_pass=outcomes[key]["objective_pass"],
            test_command=spec.get("test_command"), test_files=frozenset(spec.get("tests") or {}),
            final_files={path: content for path, content in (workspace.get("files") or {}).items()
                         if isinstance(content, str)}))
    return views
