"""The browser verifier's plan stage: a planner's reply repaired where unambiguous, a failed one recorded, never fatal.

The end-to-end case runs one real verification (headless Chromium in a bwrap sandbox) with replay models: a
planner that answers what the embedded model once did (action names, not actions) and a judge that passes
the page only when the trace shows the count responding to the fallback exploration's clicks; it skips where
no Chromium is installed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from factory.models import ModelOptions, create_model
from factory.tasks import load_tasks
from factory.verifiers import BranchOutput, BrowserVerifier, Criterion, VerifyContext, find_chromium, run_verifier
from factory.verifiers._browser import ChecklistItem
from factory.verifiers._browser_plan import ACTIONS, default_exploration, plan_system_prompt, read_plan
from factory.verifiers._browser_runner import ACTIONS as RUNNER_ACTIONS

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "examples" / "frontend"
needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="no chromium here: install Debian's chromium package (make setup does) to run the browser tests")

COUNTER = [ChecklistItem("C1", "critical", "Clicking Increment raises the shown count by one."),
           ChecklistItem("C2", "critical", "Clicking Decrement lowers the count by one, and at 0 it stays 0."),
           ChecklistItem("D1", "detail", "Reset returns the count to 0.")]


def test_a_strict_plan_is_read_as_given_and_the_prompt_shows_the_schema_with_one_example():
    plan = {"actions": [{"action": "click", "target": {"role": "button", "name": "Add"}, "item": "C1"}]}
    reading = read_plan(json.dumps(plan))
    assert (reading.status, reading.actions, reading.repairs, reading.failed_steps) == \
        ("parsed", plan["actions"], [], [])
    prompt = plan_system_prompt(12)
    assert '{"actions": [ACTION, ...]}' in prompt and "at most 12" in prompt and '"target"' in prompt
    example = json.loads(prompt.rsplit("\n", 1)[-1])
    assert read_plan(json.dumps(example)).status == "parsed"  # the example obeys the schema it shows
    assert ACTIONS == RUNNER_ACTIONS  # the runner runs in the sandbox without the package: the two lists agree


def test_unambiguous_slips_are_repaired_and_named_and_a_bare_action_name_is_a_failed_step():
    reply = ('Here is the plan:\n{"actions": ["click Increment", "click the Decrement button", "press Escape", '
             '{"click": {"role": "button", "name": "Reset"}}, {"type": "click", "target": "#add"}, '
             '{"action": "Type", "name": "New item", "value": "milk"}, "click", {"action": "type", "text": "x"}]}')
    reading = read_plan(reply)
    assert reading.status == "partial"
    assert reading.actions == [
        {"action": "click", "target": {"name": "Increment"}},
        {"action": "click", "target": {"role": "button", "name": "Decrement"}},
        {"action": "key", "key": "Escape"},
        {"action": "click", "target": {"role": "button", "name": "Reset"}},
        {"action": "click", "target": {"selector": "#add"}},
        {"action": "type", "target": {"name": "New item"}, "text": "milk"}]
    assert "reply: read the JSON object inside prose" in reading.repairs
    assert "step 5: type's 'value' read as its text" in reading.repairs
    assert [(f["step"], f["problem"]) for f in reading.failed_steps] == [
        (6, "a bare action name ('click') with nothing to act on"),
        (7, "a type with no target (a role and name, or a selector)")]
    assert read_plan('[{"action": "wait", "ms": 200}]').status == "repaired"  # a bare list of actions
    only_names = read_plan('{"actions": ["click", "type", "key"]}')  # what the embedded model answered
    assert only_names.status == "failed" and only_names.actions == [] and len(only_names.failed_steps) == 3
    assert read_plan("I would click the buttons.").status == "failed"


def test_default_exploration_acts_on_what_each_checklist_item_names():
    controls = [{"tag": "button", "id": None, "role": None, "type": None, "text": name, "visible": True,
                 "disabled": False} for name in ("Increment", "Decrement", "Reset", "Help")]
    controls.append({"tag": "input", "id": "note", "role": None, "type": "text", "text": "", "visible": True,
                     "disabled": False})
    actions = default_exploration(COUNTER, {"dom": {"controls": controls}}, 20)
    assert [(a["action"], a["target"]["name"], a["item"]) for a in actions] == [
        ("click", "Increment", "C1"), ("click", "Decrement", "C2"), ("click", "Reset", "D1")]
    assert len(default_exploration(COUNTER, {"dom": {"controls": controls}}, 2)) == 2
    unnamed = default_exploration([ChecklistItem("C1", "critical", "It works.")], {"dom": {"controls": controls}}, 20)
    assert [a["target"]["name"] for a in unnamed] == ["Increment", "Decrement", "Reset", "Help"]  # every button


@needs_chromium
def test_an_unparseable_plan_is_recorded_and_the_checklist_exploration_still_gets_a_verdict(tmp_path):
    planner = tmp_path / "planner.jsonl"
    planner.write_text(json.dumps({"response": {"text": '{"actions": ["click", "type", "key"]}'}}) + "\n")
    judge = tmp_path / "judge.jsonl"  # passes only when the trace shows the exploration's Decrement working

    def items(passed, frames):
        return {"response": {"text": json.dumps({"items": [
            {"id": key, "pass": passed, "frame": frame, "reason": "seen"} for key, frame in zip(("C1", "C2", "D1"),
                                                                                             frames)]})}}
    judge.write_text(json.dumps({"prompt_contains": '"item": "C2"} -> ok\naccessibility-tree change:\n'
                                                    '-- paragraph: "Count: 1"\n+- paragraph: "Count: 0"',
                                 **items(True, (1, 2, 3))}) + "\n" + json.dumps(items(False, (None,) * 3)) + "\n")
    task = load_tasks(FIXTURES / "tasks.jsonl")["fe-counter"]
    files = {"index.html": (FIXTURES / "counter" / "honest" / "index.html").read_bytes()}
    verifier = BrowserVerifier(create_model(f"replay:{judge}", ModelOptions()),
                               planner=create_model(f"replay:{planner}", ModelOptions()), k=1,
                               artifact_dir=tmp_path / "artifacts")

    async def go():
        try:
            return await run_verifier(verifier, VerifyContext(task, BranchOutput(None), Criterion(
                "browser", "", "browser", task.rubric), None, files))
        finally:
            await verifier.aclose()

    verdict = asyncio.run(go())
    plan = verdict.details["plan"]
    assert plan["status"] == "failed" and plan["exploration"].startswith("default")
    assert [step["problem"] for step in plan["failed_steps"]] == [
        f"a bare action name ({name!r}) with nothing to act on" for name in ("click", "type", "key")]
    assert plan["raw"] == '{"actions": ["click", "type", "key"]}'
    assert [(a["action"]["target"], a["action"]["item"], a["ok"]) for a in verdict.details["actions"]] == [
        ({"selector": "#inc"}, "C1", True), ({"selector": "#dec"}, "C2", True), ({"selector": "#reset"}, "D1", True)]
    # the judge saw the count respond to the exploration's clicks and passed the honest page
    assert verdict.status == "pass" and verdict.details["code"] == "ok", verdict.details["items"]
    assert Path(tmp_path / "artifacts" / verdict.details["frames"]["1"]).is_file()
