"""``RolloutRanker.evidence_of_frame``: the statistics of ``evidence_of``, from a frame, without a record per branch."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from factory.ranking import PairwiseOutcome, RolloutRanker, records_of


def branch_frame(seed: int, n_tasks: int = 40, branches: int = 4, judge_share: float = 0.5,
                 unverified_share: float = 0.1) -> pl.DataFrame:
    """Rows shaped like ``Store.branch_records``, shuffled: outcomes (some null), judge scores (some null)."""
    rng = np.random.default_rng(seed)
    n = n_tasks * branches
    passed = rng.random(n) < 0.5
    outcome = [None if u else bool(p) for u, p in zip(rng.random(n) < unverified_share, passed)]
    judge = [float(round(s, 1)) if j else None
             for s, j in zip(np.clip(passed * 0.3 + rng.random(n) * 0.7, 0, 1), rng.random(n) < judge_share)]
    frame = pl.DataFrame({
        "task_id": [f"t{i // branches:03d}" for i in range(n)], "branch_index": [i % branches for i in range(n)],
        "temperature": [0.8] * n, "seed": list(range(n)), "model": ["m"] * n, "status": ["ok"] * n,
        "objective_pass": outcome, "objective_score": [None if o is None else float(o) for o in outcome],
        "judge_score": judge, "hack": [False] * n, "suspected": [False] * n, "boundary_limited": [False] * n},
        schema_overrides={"branch_index": pl.Int32, "objective_pass": pl.Boolean, "judge_score": pl.Float64,
                          "objective_score": pl.Float64})
    return frame.sample(fraction=1.0, shuffle=True, seed=seed)


def pairwise_of(frame: pl.DataFrame, tasks: list[str], seed: int) -> list[PairwiseOutcome]:
    rng = np.random.default_rng(seed)
    return [PairwiseOutcome(task, a, b, float(rng.choice([0.0, 0.5, 1.0])))
            for task in tasks for a in range(3) for b in range(a + 1, 3)]


@pytest.mark.parametrize(("judge_share", "pairwise_tasks"), [
    (0.0, []),                    # no signal: ordered by the outcome
    (0.6, []),                    # the judge's scores are the signal
    (0.6, ["t001", "t007"]),      # pairwise strengths where compared, scores elsewhere
    (0.0, ["t003"]),              # pairwise strengths only
])
def test_the_frame_gives_the_records_statistics(judge_share, pairwise_tasks):
    frame = branch_frame(3, judge_share=judge_share)
    pairwise = pairwise_of(frame, pairwise_tasks, 5)
    ranker = RolloutRanker()
    want = ranker.evidence_of(records_of(frame), pairwise)
    assert ranker.evidence_of_frame(frame, pairwise) == want
    light = ranker.evidence_of_frame(frame, pairwise, per_task=False)  # an export's: no list per task
    assert "tasks" not in light["outcomes"] and light["outcomes"] == {k: v for k, v in want["outcomes"].items()
                                                                      if k != "tasks"}
    assert (want["test"] is None) == (judge_share == 0.0 and not pairwise_tasks)


def test_every_reward_in_the_signal_and_a_custom_reward_function():
    frame = branch_frame(7, judge_share=0.5)
    every = RolloutRanker(objective_rewards=())  # objective score (0 when null) + 0.3 judge
    assert every.evidence_of_frame(frame) == every.evidence_of(records_of(frame))
    custom = RolloutRanker(rewards={"objective": (1.0, lambda r: r.objective_score),
                                    "seeded": (1.0, lambda r: (r.fields["seed"] % 5) / 5)})
    assert custom.evidence_of_frame(frame) == custom.evidence_of(records_of(frame))


def task_counts(frame: pl.DataFrame) -> pl.DataFrame:
    """The rows ``Store.run_outcome_counts`` gives (one per task, by task id), from the same branch rows."""
    passed = pl.col("objective_pass")
    return (frame.group_by("task_id").agg(passed.count().alias("verified"), passed.sum().alias("passed"),
                                          passed.null_count().alias("unverified"),
                                          pl.col("judge_score").count().alias("judge_scores"),
                                          pl.col("objective_score").count().alias("objective_scores"))
            .sort("task_id").drop("task_id"))


@pytest.mark.parametrize("unverified_share", [0.0, 0.1])
def test_per_task_counts_give_the_statistics_when_no_branch_has_a_signal(unverified_share):
    frame = branch_frame(11, n_tasks=60, judge_share=0.0, unverified_share=unverified_share)
    ranker = RolloutRanker()
    light = ranker.evidence_of_task_counts(task_counts(frame))
    assert light is not None and light["test"] is None
    assert light == ranker.evidence_of_frame(frame, per_task=False)
    # A signal to test: the branches are needed (the caller reads them), never a count's guess.
    assert ranker.evidence_of_task_counts(task_counts(branch_frame(11, judge_share=0.3))) is None
    assert RolloutRanker(objective_rewards=()).evidence_of_task_counts(task_counts(frame)) is None
    custom = RolloutRanker(rewards={"objective": (1.0, lambda r: r.objective_score), "len": (1.0, lambda r: 1.0)})
    assert custom.evidence_of_task_counts(task_counts(frame)) is None
