"""The verifier extension point: a verifier of our own, registered by name, runs like the built-ins."""

from __future__ import annotations

import asyncio

import pytest

from factory.errors import ConfigError
from factory.tasks import Task
from factory.verifiers import (
    VERIFIERS,
    BranchOutput,
    Criterion,
    Verdict,
    Verifier,
    VerifyContext,
    create_verifier,
    register_verifier,
    run_verifier,
    verifier_names,
)

TASK = Task(id="shout", prompt="Say hello loudly.")


@pytest.fixture
def shouting(monkeypatch):
    """A verifier that passes answers written in capitals, registered for this test only."""
    monkeypatch.setattr(VERIFIERS, "_entries", dict(VERIFIERS._entries))

    @register_verifier("shouting")
    class Shouting:
        version = "1"
        needs_sandbox = False
        objective = True

        def __init__(self, minimum: int = 1):
            self.minimum = minimum

        async def __call__(self, ctx: VerifyContext) -> Verdict:
            answer = ctx.branch.final_answer or ""
            loud = sum(ch.isupper() for ch in answer)
            status = "pass" if loud >= self.minimum and answer == answer.upper() else "fail"
            return Verdict.make(self, status, 1.0 if status == "pass" else 0.0, capitals=loud)

    return Shouting


def check(verifier, answer):
    ctx = VerifyContext(TASK, BranchOutput(answer), Criterion("loud", "answers in capitals", "shouting"))
    return asyncio.run(run_verifier(verifier, ctx))


def test_the_built_in_verifiers_are_registered():
    assert {"tests", "answer", "json-schema", "rules", "judge"} <= set(verifier_names())
    assert verifier_names() == VERIFIERS.names()
    assert all(isinstance(create_verifier(name), Verifier) for name in ("answer", "rules"))


def test_our_own_verifier_is_created_by_name_with_options(shouting):
    assert "shouting" in verifier_names() and shouting.name == "shouting"  # the decorator names the class
    verifier = create_verifier("shouting", minimum=3)
    assert isinstance(verifier, Verifier) and verifier.minimum == 3
    loud = check(verifier, "HELLO")
    assert (loud.ok, loud.status, loud.score, loud.details, loud.verifier, loud.version) == \
        (True, "pass", 1.0, {"capitals": 5}, "shouting", "1")
    assert check(verifier, "Hello").status == "fail"
    assert check(verifier, "HI").status == "fail"  # below the minimum


def test_unknown_verifier_names_list_the_registered_ones():
    with pytest.raises(ConfigError, match="answer"):
        create_verifier("no-such-verifier")
