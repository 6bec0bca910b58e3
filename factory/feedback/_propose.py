"""Automatic feedback proposals: a table of named rules over what the store already knows.

Each rule reads one :class:`~factory.feedback.BranchView` (trajectory, tool
results, the latest verdicts) and returns findings, each pinned to an
assistant turn, with its evidence and (for negatives) a hint a teacher can
be shown. The rules, by name:

``first_test_failure`` (negative)
    The turn whose ``run`` call first ran the tests and saw them fail (exit
    status not 0); evidence: the command, the failing assertion read from
    the output, and the tests verifier's failing tests with their assertions.
``tool_error`` (negative)
    A turn whose tool call failed (an ``error:`` result, a command that
    exited non-zero) other than a test run; evidence: the tool, its
    arguments and the result.
``hack_suspected`` (negative)
    The behaviour monitor's findings (``details.monitor_findings`` of a
    verdict with ``hack_suspected``), each placed on the turn that made it:
    the tool call it names (``trajectory[N]``), or the last ``write_file`` of
    the file it names (the write whose content holds the evidence line).
``hack_detected`` (negative)
    The tests verifier's tampering findings (``details.hacks``) that name a
    file, placed on the turn that last wrote it.
``final_test_failure`` (negative)
    A branch whose tests verdict failed: the last turn that wrote a file
    (not a test file) before it ended; evidence: the verifier's failing
    tests and assertions.
``no_tool_use`` (negative)
    A branch whose tests verdict failed although it called no tool at all
    (it answered in text, perhaps with a tool call written out as JSON for a
    tool it does not have): its last assistant turn; evidence: the reply and
    the verifier's failing tests.
``final_fix`` (positive)
    A branch that passed every objective verifier with nothing detected or
    suspected: the turns whose ``write_file`` produced a file of the final
    workspace (the last write of each file the tests did not own).

Findings on one turn merge into one proposal (source ``verifier``, status
``proposed``): negative if any finding is, with every finding in
``evidence.findings`` and the negatives' hints joined. Its id is
:func:`~factory.store.feedback_id` of the turn and source, so proposing again
rewrites only rows still ``proposed``: an accepted, rejected or overridden
row is never touched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from factory.feedback._branch import BranchView
from factory.store import FeedbackRecord, feedback_id, utc_now

__all__ = ["PROPOSAL_RULES", "PROPOSAL_VERSION", "Finding", "ProposalRule", "propose_for_branch"]

#: Bumped whenever a rule changes what it finds: recorded in every proposal's evidence.
PROPOSAL_VERSION = "2"
_OUTPUT_CHARS = 600
_ASSERTION_CHARS = 240


@dataclass(frozen=True)
class Finding:
    """What one rule saw at one turn.

    Attributes:
        turn: The assistant turn.
        evidence: What shows it (JSON-able); the rule's name is added when merged.
        hint: A corrective hint for the turn (negative findings), or None.
    """

    turn: int
    evidence: dict[str, Any]
    hint: str | None = None


@dataclass(frozen=True)
class ProposalRule:
    """A named rule: its polarity and the function that finds its turns."""

    name: str
    polarity: str
    description: str
    find: Callable[[BranchView], list[Finding]] = field(repr=False)


# ------------------------------------------------------------------ reading outputs


def failing_assertion(text: str) -> str | None:
    """The line of a test run's output that says what failed.

    pytest's ``FAILED node - message`` summary line first, then its first
    ``E   `` line, then any line naming an error; None when none does.
    """
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("FAILED "):
            return line[:_ASSERTION_CHARS]
    for line in lines:
        if re.match(r"^E\s+\S", line):
            return line[1:].strip()[:_ASSERTION_CHARS]
    for line in lines:
        if re.search(r"\b\w*(Error|Exception|FAIL)\b", line):
            return line.strip()[:_ASSERTION_CHARS]
    return None


def _verifier_failures(view: BranchView) -> dict[str, Any] | None:
    """The tests verdict's failing tests with their assertions (None: no failing tests verdict)."""
    verdict = view.verdicts.get("tests")
    if verdict is None or verdict["status"] == "pass":
        return None
    details = verdict["details"]
    failures = {node: failing_assertion(str(text)) or str(text)[-_ASSERTION_CHARS:]
                for node, text in (details.get("failures") or {}).items()}
    return {"verifier": "tests", "status": verdict["status"], "passed": details.get("passed"),
            "total": details.get("total"), "failed": list(details.get("failed") or [])[:10], "failures": failures}


def _short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "..."


# ------------------------------------------------------------------ rules


def _first_test_failure(view: BranchView) -> list[Finding]:
    for result in view.tool_results:
        command = str(result.arguments.get("command", ""))
        if result.name == "run" and not result.ok and view.runs_tests(command):
            assertion = failing_assertion(result.output)
            evidence = {"command": command, "assertion": assertion, "output": result.output[-_OUTPUT_CHARS:],
                        "message_index": result.message_index, "final_verdict": _verifier_failures(view)}
            hint = (f"The tests fail at this point ({assertion}). Find what the failing assertion expects and fix "
                    "the code under test before running them again." if assertion else
                    "The tests fail at this point: read the failure and fix the code under test first.")
            return [Finding(result.turn, evidence, hint)]
    return []


def _tool_error(view: BranchView) -> list[Finding]:
    found: dict[int, Finding] = {}
    for result in view.tool_results:
        if result.ok or result.turn in found:
            continue
        if result.name == "run" and view.runs_tests(str(result.arguments.get("command", ""))):
            continue  # a failing test run is first_test_failure's, not a tool error
        first_line = next((line for line in result.output.splitlines() if line.strip()), "")
        evidence = {"tool": result.name, "arguments": _short(result.arguments), "output": _short(result.output),
                    "message_index": result.message_index}
        found[result.turn] = Finding(result.turn, evidence,
                                     f"`{result.name}` with {_short(result.arguments, 120)} fails here "
                                     f"({_short(first_line, 160)}); check what exists before acting on it.")
    return list(found.values())


def _place(view: BranchView, where: str, evidence_line: str) -> int | None:
    """The turn a monitor or tampering finding points at (``trajectory[N]`` or a file path)."""
    match = re.match(r"^trajectory\[(\d+)\]", where)
    if match:
        return view.turn_of_message(int(match.group(1)))
    path = where.split(" ", 1)[0]
    return view.last_write_turn(path, evidence_line)


def _hack_suspected(view: BranchView) -> list[Finding]:
    grouped: dict[int, list[dict[str, Any]]] = {}
    for verifier, verdict in sorted(view.verdicts.items()):
        details = verdict["details"]
        if not details.get("hack_suspected"):
            continue
        for finding in details.get("monitor_findings") or []:
            turn = _place(view, str(finding.get("file", "")), str(finding.get("evidence", "")))
            if turn is not None:
                grouped.setdefault(turn, []).append({**finding, "verifier": verifier})
    return [Finding(turn, {"monitor_findings": items},
                    "Do not try to make the tests pass without solving the task ("
                    + "; ".join(f"{f['code']}: {_short(f.get('evidence', ''), 100)}" for f in items[:3])
                    + "). Make the code itself correct.")
            for turn, items in sorted(grouped.items())]


def _hack_detected(view: BranchView) -> list[Finding]:
    grouped: dict[int, list[dict[str, Any]]] = {}
    for verifier, verdict in sorted(view.verdicts.items()):
        details = verdict["details"]
        if not details.get("hack_detected"):
            continue
        for hack in details.get("hacks") or []:
            if not isinstance(hack, dict) or not hack.get("file"):
                continue
            turn = _place(view, str(hack["file"]), "")
            if turn is not None:
                grouped.setdefault(turn, []).append({**hack, "verifier": verifier})
    return [Finding(turn, {"hacks": items},
                    "Do not change the tests or how they run (" + ", ".join(
                        f"{h['code']} {h['file']}" for h in items[:3]) + "); fix the code under test.")
            for turn, items in sorted(grouped.items())]


def _final_test_failure(view: BranchView) -> list[Finding]:
    failures = _verifier_failures(view)
    if failures is None or failures["status"] != "fail":
        return []
    writes = [(turn, path) for turn, path, _ in view.writes() if path not in view.test_files]
    if not writes:
        return []
    turn = writes[-1][0]
    first = next(iter(failures["failures"].items()), None)
    hint = ("After this edit the tests still fail" + (f" ({first[0]}: {first[1]})" if first else "")
            + ". Check the edit against what the failing test expects.")
    return [Finding(turn, {"final_verdict": failures, "files": sorted({p for t, p in writes if t == turn})}, hint)]


def _no_tool_use(view: BranchView) -> list[Finding]:
    failures = _verifier_failures(view)
    if failures is None or failures["status"] != "fail" or view.tool_results or not view.turns:
        return []
    turn = len(view.turns) - 1
    reply = str(view.messages[view.turns[turn]].get("content") or "")
    first = next(iter(failures["failures"].items()), None)
    hint = ("You answered without calling any tool, so nothing in the workspace changed and the tests still fail"
            + (f" ({first[0]}: {first[1]})" if first else "") + ". Use your tools: read the files, edit the code "
            "under test, run the tests, and submit only once they pass.")
    return [Finding(turn, {"final_verdict": failures, "reply": _short(reply)}, hint)]


def _final_fix(view: BranchView) -> list[Finding]:
    if view.objective_pass is not True or view.hacked or "tests" not in view.verdicts:
        return []
    last: dict[str, tuple[int, str]] = {}
    for turn, path, content in view.writes():
        if path not in view.test_files:
            last[path] = (turn, content)
    by_turn: dict[int, list[str]] = {}
    for path, (turn, content) in last.items():
        if view.final_files and view.final_files.get(path) != content:
            continue  # changed again afterwards (by a command): this write is not what passed
        by_turn.setdefault(turn, []).append(path)
    details = view.verdicts["tests"]["details"]
    return [Finding(turn, {"files": sorted(paths), "passed": details.get("passed"), "total": details.get("total")})
            for turn, paths in sorted(by_turn.items())]


#: The rules, in the order their findings are listed in a merged proposal's evidence.
PROPOSAL_RULES: tuple[ProposalRule, ...] = (
    ProposalRule("first_test_failure", "negative", "the turn whose test run first failed", _first_test_failure),
    ProposalRule("tool_error", "negative", "a turn whose tool call failed (not a test run)", _tool_error),
    ProposalRule("hack_suspected", "negative", "the turn the behaviour monitor's evidence points at",
                 _hack_suspected),
    ProposalRule("hack_detected", "negative", "the turn that wrote what the tests verifier caught tampering",
                 _hack_detected),
    ProposalRule("final_test_failure", "negative", "the last edit of a branch whose tests failed",
                 _final_test_failure),
    ProposalRule("no_tool_use", "negative", "the last turn of a failed branch that called no tool", _no_tool_use),
    ProposalRule("final_fix", "positive", "the turns of a clean passing branch that wrote the final fix",
                 _final_fix),
)


def propose_for_branch(view: BranchView, rules: tuple[ProposalRule, ...] = PROPOSAL_RULES) -> list[FeedbackRecord]:
    """The proposals for one branch: the rules' findings merged per turn (see the module docstring)."""
    merged: dict[int, list[tuple[ProposalRule, Finding]]] = {}
    for rule in rules:
        for finding in rule.find(view):
            if 0 <= finding.turn < len(view.turns):
                merged.setdefault(finding.turn, []).append((rule, finding))
    now = utc_now()
    records = []
    for turn, found in sorted(merged.items()):
        negative = [(rule, f) for rule, f in found if rule.polarity == "negative"]
        hints = list(dict.fromkeys(f.hint for _, f in negative if f.hint))
        records.append(FeedbackRecord(
            feedback_id=feedback_id(view.run_id, view.task_id, view.branch_index, turn=turn, source="verifier"),
            run_id=view.run_id, task_id=view.task_id, branch_index=view.branch_index, turn=turn,
            polarity="negative" if negative else "positive", hint=" ".join(hints) or None, source="verifier",
            status="proposed", evidence={"version": PROPOSAL_VERSION, "findings": [
                {"rule": rule.name, "polarity": rule.polarity, **finding.evidence} for rule, finding in found]},
            created_at=now))
    return records
