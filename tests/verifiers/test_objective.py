"""Objective verifiers: strict answers, JSON schema, rules, build, external results; all total."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factory.sandbox import SandboxSpec, create_sandbox
from factory.tasks import Task
from factory.verifiers import (
    VERIFIERS,
    AnswerVerifier,
    BranchOutput,
    BuildPassesVerifier,
    BuildVerifier,
    Criterion,
    JsonSchemaVerifier,
    RulesVerifier,
    Verdict,
    VerifyContext,
    VisualAssertVerifier,
    check_final_answer,
    criteria_for,
    run_verifier,
)

ADD = Task(id="add", prompt="What is 17 + 25?", answer="42")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"], "additionalProperties": False}
JSON_TASK = Task(id="person", prompt="Describe a person as JSON.", json_schema=SCHEMA)


def verify(verifier, task, answer, sandbox=None, arg=None):
    criterion = Criterion(verifier.name, "", verifier.name, arg)
    return asyncio.run(run_verifier(verifier, VerifyContext(task, BranchOutput(answer), criterion, sandbox)))


@pytest.mark.parametrize(("answer", "code"), [
    ("Final: 42", "ok"), ("Work: 17+25\nFinal: 42\n", "ok"), ("42", "missing_prefix"), ("", "missing_prefix"),
    ("Final: 42 ", "extra_whitespace"), ("Final:  42", "extra_whitespace"), ("Final: 042", "leading_zeros"),
    ("Final: 42\nbye", "not_single_line"), ("Final: 1\nFinal: 42", "multiple_finals"),
    ("Final: ４２", "non_ascii_digits"), ("Final: ٤٢", "non_ascii_digits"), ("Final: 43", "wrong_answer"),
])
def test_answer_detail_codes(answer, code):
    verdict = verify(AnswerVerifier(), ADD, answer)
    assert verdict.details["code"] == code
    assert verdict.ok == (code == "ok") and verdict.status == ("pass" if code == "ok" else "fail")
    assert (verdict.verifier, verdict.version) == ("answer", "1")


def test_only_pass_is_ok_and_statuses_are_closed():
    with pytest.raises(ValueError):
        Verdict(ok=True, score=1.0, status="unknown", details={}, verifier="x", version="1")
    with pytest.raises(ValueError):
        Verdict(ok=False, score=0.0, status="maybe", details={}, verifier="x", version="1")


@pytest.mark.parametrize(("answer", "code", "ok"), [
    ('{"name": "Ada", "age": 36}', "ok", True),
    ('Here you go:\n```json\n{"name": "Ada", "age": 36}\n```', "ok", True),
    ('{"name": "Ada"}', "schema_mismatch", False),
    ('{"name": "Ada", "age": -1}', "schema_mismatch", False),
    ('{"name": "Ada", "age": 36, "x": 1}', "schema_mismatch", False),
    ("not json", "invalid_json", False),
    ("[" * 100000, "invalid_json", False),
])
def test_json_schema(answer, code, ok):
    verdict = verify(JsonSchemaVerifier(), JSON_TASK, answer)
    assert (verdict.details["code"], verdict.ok) == (code, ok)


def test_json_schema_invalid_schema_is_an_error_not_a_pass():
    verdict = verify(JsonSchemaVerifier(), JSON_TASK, "{}", arg={"type": "no-such-type"})
    assert verdict.status == "error" and verdict.details["code"] == "invalid_schema"


def test_rules_score_is_continuous_and_bans_hollow_affirmations():
    task = Task(id="t", prompt="p", rules={"max_chars": 40, "banned_phrases": ["as an AI"],
                                           "required_phrases": ["Paris"]})
    good = verify(RulesVerifier(), task, "The capital is Paris.")
    assert good.ok and good.score == 1.0
    bad = verify(RulesVerifier(), task, "Great question! As an AI I think it is Lyon, definitely Lyon.")
    assert not bad.ok and 0.0 < bad.score < 1.0
    assert {"max_chars", "banned:great question", "banned:as an ai", "required:Paris"} <= set(bad.details["failed"])


def test_build_runs_in_the_sandbox():
    task = Task(id="b", prompt="p", files={"main.py": "print('hi')\n"}, build_command="python -m py_compile main.py")

    async def go(content):
        async with create_sandbox("bwrap", SandboxSpec(files={"main.py": content})) as sandbox:
            return await run_verifier(BuildVerifier(), VerifyContext(
                task, BranchOutput("done"), criteria_for(task)[0], sandbox))

    assert asyncio.run(go("print('hi')\n")).ok
    broken = asyncio.run(go("print('hi'\n"))
    assert broken.status == "fail" and broken.details["exit_code"] != 0 and "SyntaxError" in broken.details["output"]


@pytest.mark.parametrize("cls", [BuildPassesVerifier, VisualAssertVerifier])
@pytest.mark.parametrize(("external", "status"), [
    ("pass", "pass"), ("fail", "fail"), ("running", "fail"), ("unknown", "fail"), ("weird", "error")])
def test_external_result_adapters_never_default_to_pass(cls, external, status):
    async def fetch(ctx):
        return external, {"source": "ci"}

    verdict = verify(cls(fetch), ADD, "x")
    assert verdict.status == status
    if external in ("running", "unknown"):
        assert verdict.details["code"] == f"result_{external}"


def test_a_crashing_verifier_is_an_error_verdict():
    def fetch(ctx):
        raise RuntimeError("CI API down")

    verdict = verify(BuildPassesVerifier(fetch), ADD, "x")
    assert verdict.status == "error" and "CI API down" in verdict.details["exception"]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.text(max_size=300)), st.text(min_size=1, max_size=20))
def test_answer_check_is_total_and_deterministic(answer, expected):
    first = check_final_answer(answer, expected)
    assert first == check_final_answer(answer, expected)
    assert first[0] == (first[1] == "ok")


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.none(), st.text(max_size=400)))
def test_output_verifiers_are_total_on_adversarial_text(answer):
    task = Task(id="t", prompt="p", answer="7", json_schema=SCHEMA, rules={"max_chars": 50})
    for verifier in (AnswerVerifier(), JsonSchemaVerifier(), RulesVerifier()):
        verdict = verify(verifier, task, answer)
        assert verdict.status in ("pass", "fail", "error") and 0.0 <= verdict.score <= 1.0


@pytest.mark.parametrize("name", VERIFIERS.names())
def test_every_registered_verifier_declares_its_name_version_and_sandbox_need(name):
    verifier = VERIFIERS.get(name)
    assert verifier.name == name
    assert isinstance(verifier.version, str) and verifier.version
    assert isinstance(verifier.needs_sandbox, bool)
