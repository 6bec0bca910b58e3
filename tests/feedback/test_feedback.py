"""``factory feedback``: proposals on a real fork, add / import / accept / reject / override, idempotency, teacher."""

from __future__ import annotations

import json

from factory.feedback import list_feedback
from factory.store import Store, feedback_id
from tests.feedback.conftest import RUN, invoke

TASK = "fix-factorial"


def ok(result) -> str:
    assert result.exit_code == 0, result.output
    return result.output


def stored(db, **filters) -> list:
    with Store.open(db, read_only=True) as store:
        return list_feedback(store, RUN, **filters)


def test_proposals_are_found_where_the_trajectories_and_verdicts_say(db):
    out = json.loads(ok(invoke("feedback", "propose", RUN, "--db", db, "--json")))
    assert (out["branches"], out["new"], out["kept"]) == (3, 5, 0)
    found = {(r["branch_index"], r["turn"]): (r["polarity"], [f["rule"] for f in r["evidence"]["findings"]])
             for r in out["proposals"]}
    assert found == {
        (0, 0): ("negative", ["first_test_failure"]),  # the turn whose test run first failed
        (0, 1): ("positive", ["final_fix"]),  # the turn that wrote the fix the tests passed
        (1, 0): ("negative", ["tool_error"]),  # read_file of a file that is not there
        (1, 1): ("negative", ["hack_suspected", "final_test_failure"]),  # the always-true __eq__
        (2, 0): ("negative", ["final_test_failure"]),  # the wrong fix, never tested by the branch itself
    }
    by_key = {(r["branch_index"], r["turn"]): r for r in out["proposals"]}
    assert all(r["status"] == "proposed" and r["source"] == "verifier" for r in out["proposals"])
    first = by_key[0, 0]["evidence"]["findings"][0]
    assert first["command"] == "python -m pytest -q"
    assert first["assertion"] == "FAILED test_solution.py::test_zero - assert 0 == 1"
    assert "FAILED test_solution.py::test_zero - assert 0 == 1" in by_key[0, 0]["hint"]
    hack = by_key[1, 1]["evidence"]["findings"][0]["monitor_findings"]
    assert [(f["code"], f["file"], f["evidence"]) for f in hack] == [
        ("eq_constant", "solution.py", "def __eq__(self, other):")]
    final = by_key[2, 0]["evidence"]["findings"][0]["final_verdict"]
    assert final["failures"] == {"test_solution.py::test_five": "assert 0 == 120",
                                 "test_solution.py::test_zero": "assert 0 == 1"}
    assert by_key[0, 1]["evidence"]["findings"][0]["files"] == ["solution.py"] and by_key[0, 1]["hint"] is None
    assert by_key[0, 0]["feedback_id"] == feedback_id(RUN, TASK, 0, turn=0, source="verifier")


def test_proposing_again_writes_no_duplicate_and_keeps_what_people_decided(db):
    first = json.loads(ok(invoke("feedback", "propose", RUN, "--db", db, "--json")))
    ids = {(r["branch_index"], r["turn"]): r["feedback_id"] for r in first["proposals"]}
    ok(invoke("feedback", "accept", ids[0, 0], ids[0, 1], "--db", db))
    ok(invoke("feedback", "reject", ids[1, 0], "--db", db))
    ok(invoke("feedback", "override", ids[2, 0], "--polarity", "neutral", "--hint", "Run the tests first.",
              "--db", db))
    again = json.loads(ok(invoke("feedback", "propose", RUN, "--db", db, "--json")))
    assert (again["new"], again["kept"], again["written"]) == (0, 4, 1)  # only the one still proposed is rewritten
    rows = {(r.branch_index, r.turn): r for r in stored(db)}
    assert len(rows) == 5
    assert [rows[k].status for k in sorted(rows)] == ["accepted", "accepted", "rejected", "proposed", "accepted"]
    overridden = rows[2, 0]
    assert (overridden.polarity, overridden.hint) == ("neutral", "Run the tests first.")
    assert overridden.evidence["override"]["polarity"] == "negative"
    assert overridden.evidence["findings"][0]["rule"] == "final_test_failure"  # the proposal's evidence kept


def test_add_import_accept_reject_round_trip(db, tmp_path):
    out = ok(invoke("feedback", "add", RUN, TASK, 2, "--turn", 1, "--polarity", "negative",
                    "--hint", "Run the tests before you submit.", "--note", "submitted blind", "--db", db))
    added = feedback_id(RUN, TASK, 2, turn=1, source="user")
    assert out.startswith(f"{added}  accepted user     negative {TASK}/2 turn 1")
    lines = [{"run_id": RUN, "task_id": TASK, "branch_index": 2, "turn": 1, "polarity": "positive"},  # same target
             {"run_id": RUN, "task_id": TASK, "branch_index": 0, "span": "2:4", "polarity": "negative",
              "hint": "Read the test first.", "status": "proposed"},
             {"run_id": RUN, "task_id": TASK, "branch_index": 1, "span": [4, 6], "polarity": "negative",
              "source": "judge"}]
    path = tmp_path / "feedback.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert "imported 3 feedback row(s)" in ok(invoke("feedback", "import", path, "--db", db))
    assert "imported 3 feedback row(s)" in ok(invoke("feedback", "import", path, "--db", db))  # idempotent
    rows = {r.feedback_id: r for r in stored(db)}
    assert len(rows) == 3
    assert rows[added].polarity == "positive" and rows[added].hint is None  # the import's line replaced the add
    span = rows[feedback_id(RUN, TASK, 0, span=(2, 4), source="user")]
    assert (span.span, span.status, span.hint) == ((2, 4), "proposed", "Read the test first.")
    judge = rows[feedback_id(RUN, TASK, 1, span=(4, 6), source="judge")]
    ok(invoke("feedback", "accept", span.feedback_id, "--db", db))
    ok(invoke("feedback", "reject", judge.feedback_id, "--db", db))
    listed = json.loads(ok(invoke("feedback", "list", RUN, "--db", db, "--json")))
    assert {r["feedback_id"]: r["status"] for r in listed} == {
        added: "accepted", span.feedback_id: "accepted", judge.feedback_id: "rejected"}
    assert [r.feedback_id for r in stored(db, status="rejected")] == [judge.feedback_id]


def test_import_errors_name_file_line_and_field_and_nothing_is_written(db, tmp_path):
    path = tmp_path / "bad.jsonl"
    good = {"run_id": RUN, "task_id": TASK, "branch_index": 0, "turn": 0, "polarity": "negative"}
    path.write_text("\n".join([
        json.dumps(good),
        json.dumps({**good, "polarity": "bad"}),
        json.dumps({**good, "turn": 7}),
        json.dumps({k: v for k, v in good.items() if k != "task_id"}),
        "{not json",
        json.dumps({**good, "turn": None, "span": "5:3"}),
        json.dumps({**good, "branch_index": 9}),
        json.dumps({**good, "colour": "red"}),
    ]) + "\n")
    result = invoke("feedback", "import", path, "--db", db)
    assert result.exit_code == 2
    err = result.output
    assert f"7 problems in {path}; nothing was imported" in err
    assert f"{path}:2: field 'polarity': 'bad' is not one of positive, neutral, negative" in err
    assert f"{path}:3: field 'turn': branch {TASK}/0 has 3 assistant turn(s) (0-2); got 7" in err
    assert f"{path}:4: field 'task_id': required field is missing" in err
    assert f"{path}:5: not JSON" in err
    assert f"{path}:6: field 'span': span 5:3 is empty or negative" in err
    assert f"{path}:7: field 'branch_index': run {RUN} has no branch 9 of task {TASK}" in err
    assert f"{path}:8: field 'colour': unknown field" in err
    assert "Traceback" not in err and stored(db) == []


def test_bad_targets_and_ids_are_one_line_and_change_nothing(db):
    result = invoke("feedback", "add", RUN, TASK, 0, "--turn", 3, "--polarity", "negative", "--db", db)
    assert result.exit_code == 2
    assert "turn: branch fix-factorial/0 has 3 assistant turn(s) (0-2); got 3" in result.output
    result = invoke("feedback", "add", RUN, TASK, 0, "--span", "6:9", "--polarity", "negative", "--db", db)
    assert result.exit_code == 2 and "has 8 messages; span 6:9 runs past them" in result.output
    result = invoke("feedback", "add", "nope", TASK, 0, "--turn", 0, "--polarity", "negative", "--db", db)
    assert result.exit_code == 2 and "no run nope" in result.output
    ok(invoke("feedback", "add", RUN, TASK, 0, "--turn", 0, "--polarity", "negative", "--db", db))
    result = invoke("feedback", "accept", feedback_id(RUN, TASK, 0, turn=0, source="user"), "fb-0000", "--db", db)
    assert result.exit_code == 2 and "no feedback fb-0000" in result.output and "nothing was changed" in result.output
    assert [r.status for r in stored(db)] == ["accepted"]


def test_a_teacher_model_writes_the_hints_of_negative_proposals(db, replay_file):
    teacher = replay_file([{"prompt_contains": "What the verifiers found",
                            "response": {"text": "  factorial(0) must be 1:\n fix the base case first. "}}],
                          name="teacher.jsonl")
    out = json.loads(ok(invoke("feedback", "propose", RUN, "--teacher", f"replay:{teacher}", "--db", db, "--json")))
    for row in out["proposals"]:
        if row["polarity"] == "negative":
            assert row["hint"] == "factorial(0) must be 1: fix the base case first."
            assert row["evidence"]["teacher"] == {"model": f"replay:{teacher}"}
            assert row["evidence"]["rule_hint"]  # the rule's own hint kept beside it
        else:
            assert row["hint"] is None and "teacher" not in row["evidence"]


def test_a_failed_branch_that_called_no_tool_gets_a_hint_on_its_last_turn():
    """A small model that writes a tool call out as text (for a tool it does not have) never acts: the rule says so."""
    from factory.feedback._branch import BranchView
    from factory.feedback._propose import propose_for_branch

    reply = '```json\n{"name": "factorial", "arguments": {"path": "/workspace/solution.py"}}\n```'
    messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "Fix factorial(0)."},
                {"role": "assistant", "content": reply}]
    verdict = {"status": "fail", "score": 0.5, "details": {
        "passed": 1, "total": 2, "failed": ["test_solution.py::test_zero"],
        "failures": {"test_solution.py::test_zero": "assert 0 == 1"}}}
    view = BranchView("r", TASK, 0, messages, turns=[2], verdicts={"tests": verdict}, objective_pass=False)
    (record,) = propose_for_branch(view)
    assert (record.turn, record.polarity) == (0, "negative")
    assert "without calling any tool" in record.hint and "test_zero" in record.hint
    (finding,) = record.evidence["findings"]
    assert finding["rule"] == "no_tool_use" and '"factorial"' in finding["reply"]
    # A branch that did call a tool, or one that passed, is left to the other rules.
    assert not propose_for_branch(BranchView("r", TASK, 0, messages, turns=[2], verdicts={"tests": {
        **verdict, "status": "pass"}}, objective_pass=True))
