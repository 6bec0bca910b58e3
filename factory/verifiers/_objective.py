"""Objective verifiers that read the branch's output: ``answer``, ``json-schema``, ``rules``,
plus ``build`` (a command in the sandbox) and the external-result adapters.
"""

from __future__ import annotations

import inspect
import json
import re
import unicodedata
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from factory.sandbox import summarize_tool_output
from factory.verifiers._base import Verdict, VerifyContext, register_verifier

__all__ = [
    "AnswerVerifier",
    "BuildPassesVerifier",
    "BuildVerifier",
    "ExternalResult",
    "JsonSchemaVerifier",
    "RulesVerifier",
    "VisualAssertVerifier",
    "check_final_answer",
]

_FINAL = re.compile(r"^Final:")
HOLLOW_AFFIRMATIONS = ("great question", "excellent question", "what a great", "i'd be happy to help",
                       "i hope this helps", "certainly!", "absolutely!")


def check_final_answer(text: str | None, expected: str) -> tuple[bool, str, dict[str, Any]]:
    """Strict ``Final: <answer>`` check on the last line.

    Returns:
        (passed, code, evidence) with code one of ``ok``, ``missing_prefix``,
        ``extra_whitespace``, ``leading_zeros``, ``not_single_line``,
        ``multiple_finals``, ``non_ascii_digits``, ``wrong_answer``.
    """
    if not text or not text.strip():
        return False, "missing_prefix", {"last_line": ""}
    lines = text.rstrip("\n").split("\n")
    finals = [line for line in lines if line.lstrip().startswith("Final:")]
    if len(finals) > 1:
        return False, "multiple_finals", {"count": len(finals)}
    last = lines[-1]
    if not _FINAL.match(last.lstrip()):
        if finals:
            return False, "not_single_line", {"last_line": last[:200]}
        return False, "missing_prefix", {"last_line": last[:200]}
    if last != last.strip() and last.strip().startswith("Final:"):
        return False, "extra_whitespace", {"last_line": last[:200]}
    value = last.strip()[len("Final:"):]
    if value != " " + value.strip() and value.strip():
        return False, "extra_whitespace", {"last_line": last[:200]}
    got = value.strip()
    if any(ch.isdigit() and not ("0" <= ch <= "9") for ch in got) or any(
            unicodedata.category(ch) == "Nd" and not ch.isascii() for ch in got):
        return False, "non_ascii_digits", {"got": got}
    want = expected.strip()
    if got == want:
        return True, "ok", {"got": got}
    if got.lstrip("0") == want.lstrip("0") and got.isdigit() and want.isdigit() and got != want:
        return False, "leading_zeros", {"got": got, "expected": want}
    return False, "wrong_answer", {"got": got[:200], "expected": want}


@register_verifier("answer")
class AnswerVerifier:
    """``Final: <answer>`` alone on the last line; strip, then exact match. Nothing fuzzy."""

    version: ClassVar[str] = "1"
    needs_sandbox: ClassVar[bool] = False
    objective: ClassVar[bool] = True

    async def __call__(self, ctx: VerifyContext) -> Verdict:
        expected = ctx.criterion.arg if ctx.criterion.arg is not None else ctx.task.answer
        if expected is None:
            return Verdict.make(self, "error", 0.0, code="no_expected_answer")
        passed, code, evidence = check_final_answer(ctx.branch.final_answer, str(expected))
        return Verdict.make(self, "pass" if passed else "fail", 1.0 if passed else 0.0, code=code, **evidence)


def _json_payload(text: str) -> str:
    """The JSON part of an answer: the whole text, or a single fenced ```json block in it."""
    fenced = re.findall(r"```(?:json)?\s*\n(.*?)\n```", text, re.DOTALL)
    return fenced[0] if len(fenced) == 1 else text


@register_verifier("json-schema")
class JsonSchemaVerifier:
    """The output (or its one fenced JSON block) is valid JSON matching the task's schema."""

    version: ClassVar[str] = "1"
    needs_sandbox: ClassVar[bool] = False
    objective: ClassVar[bool] = True

    async def __call__(self, ctx: VerifyContext) -> Verdict:
        import jsonschema

        schema = ctx.criterion.arg if ctx.criterion.arg is not None else ctx.task.json_schema
        if not isinstance(schema, dict):
            return Verdict.make(self, "error", 0.0, code="no_schema")
        try:
            validator_cls = jsonschema.validators.validator_for(schema)
            validator_cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            return Verdict.make(self, "error", 0.0, code="invalid_schema", message=exc.message[:300])
        text = ctx.branch.final_answer or ""
        try:
            data = json.loads(_json_payload(text))
        except (json.JSONDecodeError, RecursionError) as exc:
            return Verdict.make(self, "fail", 0.0, code="invalid_json", message=str(exc)[:200])
        errors = sorted(validator_cls(schema).iter_errors(data), key=lambda e: list(e.absolute_path))
        if errors:
            return Verdict.make(self, "fail", 0.0, code="schema_mismatch", errors=[
                {"path": "/".join(map(str, e.absolute_path)), "message": e.message[:200]} for e in errors[:10]])
        return Verdict.make(self, "pass", 1.0, code="ok")


@register_verifier("rules")
class RulesVerifier:
    """Programmatic rules with a continuous score: the share of rules followed.

    Rules: ``max_chars``, ``min_chars``, ``banned_phrases`` (case-insensitive;
    hollow affirmations like "Great question!" are always banned) and
    ``required_phrases``. Passes only when every rule holds.
    """

    version: ClassVar[str] = "1"
    needs_sandbox: ClassVar[bool] = False
    objective: ClassVar[bool] = True

    async def __call__(self, ctx: VerifyContext) -> Verdict:
        rules = ctx.criterion.arg if isinstance(ctx.criterion.arg, dict) else (
            ctx.task.rules.model_dump() if ctx.task.rules else {})
        text = ctx.branch.final_answer or ""
        folded = text.casefold()
        checks: list[dict[str, Any]] = []
        if rules.get("max_chars") is not None:
            checks.append({"rule": "max_chars", "ok": len(text) <= rules["max_chars"], "value": len(text)})
        if rules.get("min_chars") is not None:
            checks.append({"rule": "min_chars", "ok": len(text) >= rules["min_chars"], "value": len(text)})
        banned = {*(p.casefold() for p in rules.get("banned_phrases") or ()), *HOLLOW_AFFIRMATIONS}
        for phrase in sorted(banned):
            checks.append({"rule": f"banned:{phrase}", "ok": phrase not in folded})
        for phrase in rules.get("required_phrases") or ():
            checks.append({"rule": f"required:{phrase}", "ok": phrase.casefold() in folded})
        failed = [c["rule"] for c in checks if not c["ok"]]
        score = 1.0 - len(failed) / len(checks) if checks else 1.0
        return Verdict.make(self, "fail" if failed else "pass", score, code="violations" if failed else "ok",
                            failed=failed, checked=len(checks))


@register_verifier("build")
class BuildVerifier:
    """The exit code of the task's build or compile command, run in the branch's sandbox."""

    version: ClassVar[str] = "1"
    needs_sandbox: ClassVar[bool] = True
    objective: ClassVar[bool] = True

    def __init__(self, timeout_s: float = 300.0):
        self.timeout_s = timeout_s

    async def __call__(self, ctx: VerifyContext) -> Verdict:
        command = ctx.criterion.arg or ctx.task.build_command
        if not command:
            return Verdict.make(self, "error", 0.0, code="no_build_command")
        if ctx.sandbox is None:
            return Verdict.make(self, "error", 0.0, code="no_sandbox")
        result = await ctx.sandbox.exec(command, timeout=self.timeout_s)
        status = "pass" if result.ok else "fail"
        return Verdict.make(self, status, 1.0 if result.ok else 0.0, code="ok" if result.ok else "build_failed",
                            exit_code=result.exit_code, timed_out=result.timed_out,
                            output=summarize_tool_output(result.describe()))


#: What an external-result callback returns: a status (``pass``, ``fail``,
#: ``running``, ``unknown``, ``error``) and optional evidence.
ExternalResult = tuple[str, dict[str, Any]]


class _ExternalResultVerifier:
    """Reads a result produced elsewhere through an injected callback.

    Only ``pass`` passes: ``running`` and ``unknown`` (the result is not in
    yet) fail and say so; anything unexpected is ``error``.
    """

    version: ClassVar[str] = "1"
    needs_sandbox: ClassVar[bool] = False
    objective: ClassVar[bool] = True
    name: ClassVar[str]

    def __init__(self, fetch: Callable[[VerifyContext], ExternalResult | Awaitable[ExternalResult]]):
        self._fetch = fetch

    async def __call__(self, ctx: VerifyContext) -> Verdict:
        outcome = self._fetch(ctx)
        if inspect.isawaitable(outcome):
            outcome = await outcome
        status, evidence = outcome if isinstance(outcome, tuple) else (outcome, {})
        if status == "pass":
            return Verdict.make(self, "pass", 1.0, code="ok", **dict(evidence))
        if status in ("running", "unknown"):
            return Verdict.make(self, "fail", 0.0, code=f"result_{status}", external_status=status, **dict(evidence))
        if status == "fail":
            return Verdict.make(self, "fail", 0.0, code="external_fail", **dict(evidence))
        return Verdict.make(self, "error", 0.0, code="external_error", external_status=str(status)[:50])


@register_verifier("build-passes")
class BuildPassesVerifier(_ExternalResultVerifier):
    """A CI/build system's verdict, fetched by a callback (e.g. from a CI API)."""


@register_verifier("visual-assert")
class VisualAssertVerifier(_ExternalResultVerifier):
    """A visual check (screenshot diff, rendered page assertion) run elsewhere, fetched by a callback."""
