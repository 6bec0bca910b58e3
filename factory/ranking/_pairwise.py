"""Pairwise judging: the LLM judge compares a run's branches two at a time, in both orders.

The stored comparisons are what :func:`~factory.ranking.load_pairwise` reads
and the ranker fits Bradley-Terry strengths on; asking both orders lets the
calibration report measure the judge's position bias (swap inconsistency).
"""

from __future__ import annotations

import itertools
import json

from factory.models import ModelOptions, ResilientModel, create_model
from factory.store import Store
from factory.tasks import Task
from factory.verifiers import BranchOutput, Criterion, ScalarLLMJudgeVerifier, VerificationPipeline

__all__ = ["judge_pairwise"]


async def judge_pairwise(store: Store, run_id: str, judge_spec: str, pairs_per_task: int,
                      options: ModelOptions | None = None) -> int:
    """Ask the judge to compare up to ``pairs_per_task`` pairs of each task's branches and store the judgments.

    Only tasks with a rubric are judged. Adjacent branches are paired first
    (0-1, 1-2, ...), then the rest, so that every branch meets another early.
    Each pair is asked in both orders.

    Args:
        store: An open, writable store holding the run.
        run_id: The run whose branches are compared.
        judge_spec: The judge model's spec (``openai:MODEL`` ...); it is closed when done.
        pairs_per_task: Most pairs compared per task.
        options: Options for the judge model.

    Returns:
        The number of pairs compared.
    """
    tasks = {row["task_id"]: Task.model_validate(json.loads(row["spec"]))
             for row in store.tasks(run_id).iter_rows(named=True)}
    judge = ScalarLLMJudgeVerifier(ResilientModel(create_model(judge_spec, options or ModelOptions())))
    done = 0
    try:
        for task_id, group in itertools.groupby(store.branches(run_id).iter_rows(named=True),
                                                key=lambda row: row["task_id"]):
            task = tasks[task_id]
            if not task.rubric:
                continue
            rows = list(group)
            candidates = sorted(itertools.combinations(range(len(rows)), 2), key=lambda p: (p[1] - p[0], p))
            for i, j in candidates[:pairs_per_task]:
                a, b = rows[i], rows[j]
                judgment = await judge.compare_pair(
                    Criterion(judge.name, "pairwise preference", judge.name, task.rubric), task,
                    BranchOutput(a["final_answer"]), BranchOutput(b["final_answer"]))
                VerificationPipeline.store_pairwise(store, run_id, task_id, a["branch_index"], b["branch_index"],
                                                    judgment)
                done += 1
    finally:
        await judge.model.aclose()
    return done
