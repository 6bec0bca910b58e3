"""The verification pipeline of a run: the objective verifiers, plus the LLM judge when a judge model is given."""

from __future__ import annotations

from pathlib import Path

from factory.models import DEFAULT_REQUEST_TIMEOUT_S, ModelOptions, ResilientModel, create_model
from factory.sandbox import SandboxLimits
from factory.verifiers._browser import BrowserVerifier
from factory.verifiers._judge import JudgeBudget, ScalarLLMJudgeVerifier
from factory.verifiers._pipeline import VerificationPipeline
from factory.verifiers._tests import DEFAULT_CEILING_S, TestsVerifier

__all__ = ["build_pipeline"]


def build_pipeline(sandbox: str, limits: SandboxLimits | None = None, *, policy_spec: str | None = None,
                   judge_spec: str | None = None, judge_samples: int = 3, judge_budget: int | None = None,
                   base_url: str | None = None, hack_penalty: float = 0.4,
                   request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S, planner_spec: str | None = None,
                   artifact_dir: Path | None = None) -> VerificationPipeline:
    """The pipeline ``factory fork`` and ``factory verify`` verify branches with.

    The tests verifier gets the run's sandbox backend and limits (its
    reference run of the untouched tests uses them too) and at least two
    minutes per test run; every other objective verifier is made on demand
    with its defaults. The judge, and the browser verifier of front-end tasks (the judge model judging,
    the planner model planning), are added only when ``judge_spec`` is given; they share one budget.

    Args:
        sandbox: The run's sandbox backend.
        limits: The run's sandbox limits (default: :class:`SandboxLimits`'s).
        policy_spec: The policy's model spec, so that a judge that is the policy is warned about.
        judge_spec: The judge model's spec (None: no judge).
        judge_samples: Judge samples per branch (median aggregated).
        judge_budget: Cap on judge calls (None: no cap).
        base_url: Server URL for the judge model.
        hack_penalty: Subtracted from the tests score when tampering is detected.
        request_timeout_s: Longest one judge call may take before it is abandoned and retried.
        planner_spec: The browser verifier's planner model (default: the judge model).
        artifact_dir: Where the browser verifier writes frames (default: beside the default store).

    Warns:
        JudgeSameAsPolicyWarning: The judge is the policy model (callers show it to the user).
    """
    limits = limits or SandboxLimits()
    # The test runs' own ceiling (CPU follows it), not the branch's per-command limit: a real suite that keeps
    # finishing tests must not be cut off (the inactivity window stops a hung one sooner).
    verifiers = {"tests": TestsVerifier(penalty=hack_penalty, timeout_s=max(DEFAULT_CEILING_S, limits.timeout_s),
                                        reference_sandbox=sandbox, limits=limits)}
    if judge_spec:
        options = ModelOptions(base_url=base_url, timeout_s=request_timeout_s)
        judge = ResilientModel(create_model(judge_spec, options))
        budget = JudgeBudget(judge_budget) if judge_budget is not None else None
        verifiers["judge"] = ScalarLLMJudgeVerifier(judge, k=judge_samples, budget=budget, policy_spec=policy_spec)
        planner = ResilientModel(create_model(planner_spec, options)) if planner_spec else None
        verifiers["browser"] = BrowserVerifier(judge, planner=planner, k=judge_samples, budget=budget, sandbox=sandbox,
                                               artifact_dir=artifact_dir)
    return VerificationPipeline(verifiers)
