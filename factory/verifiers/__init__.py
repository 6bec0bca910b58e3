"""Verifiers: objective checks, reward-hack detection and the k-of-N LLM judge, composed into a pipeline."""

from factory.verifiers._base import (
    VERIFIERS,
    BranchOutput,
    Criterion,
    Verdict,
    Verifier,
    VerifyContext,
    create_verifier,
    criteria_for,
    register_verifier,
    run_verifier,
    verifier_names,
)
from factory.verifiers._browser import BrowserVerifier, find_chromium, strip_comments
from factory.verifiers._build import build_pipeline
from factory.verifiers._calibration import (
    calibrate_run,
    judge_auc,
    judge_spearman,
    self_agreement,
    swap_inconsistency,
)
from factory.verifiers._judge import JudgeSameAsPolicyWarning, ScalarLLMJudgeVerifier
from factory.verifiers._monitor import (
    MONITOR_RULES,
    MONITOR_VERSION,
    MonitorConfig,
    MonitorFinding,
    MonitorReport,
    scan_solution,
)
from factory.verifiers._objective import (
    AnswerVerifier,
    BuildPassesVerifier,
    BuildVerifier,
    JsonSchemaVerifier,
    RulesVerifier,
    VisualAssertVerifier,
    check_final_answer,
)
from factory.verifiers._pipeline import (
    VerificationPipeline,
    is_objective,
    objective_pass,
    opinion_verifiers,
    verdict_events,
    verify_in_fresh_sandbox,
)
from factory.verifiers._rerun import GoldenCase, load_golden, run_golden, verify_stored_run
from factory.verifiers._task_check import (
    CHECK_KINDS,
    TaskCheck,
    check_tasks,
    load_solutions,
)
from factory.verifiers._tests import TestsVerifier, parse_junit_xml

__all__ = [
    "CHECK_KINDS",
    "MONITOR_RULES",
    "MONITOR_VERSION",
    "VERIFIERS",
    "AnswerVerifier",
    "BranchOutput",
    "BrowserVerifier",
    "BuildPassesVerifier",
    "BuildVerifier",
    "Criterion",
    "GoldenCase",
    "JsonSchemaVerifier",
    "JudgeSameAsPolicyWarning",
    "MonitorConfig",
    "MonitorFinding",
    "MonitorReport",
    "RulesVerifier",
    "ScalarLLMJudgeVerifier",
    "TaskCheck",
    "TestsVerifier",
    "Verdict",
    "VerificationPipeline",
    "Verifier",
    "VerifyContext",
    "VisualAssertVerifier",
    "build_pipeline",
    "calibrate_run",
    "check_final_answer",
    "check_tasks",
    "create_verifier",
    "criteria_for",
    "find_chromium",
    "is_objective",
    "judge_auc",
    "judge_spearman",
    "load_golden",
    "load_solutions",
    "objective_pass",
    "opinion_verifiers",
    "parse_junit_xml",
    "register_verifier",
    "run_golden",
    "run_verifier",
    "scan_solution",
    "self_agreement",
    "strip_comments",
    "swap_inconsistency",
    "verdict_events",
    "verifier_names",
    "verify_in_fresh_sandbox",
    "verify_stored_run",
]
