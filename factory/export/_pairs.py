"""Preference pairs within a task: which branch is chosen over which (DPO and reward exports).

Pairs are built per (run, task), never across runs or tasks, so both sides
answer the same prompt. Every strategy obeys two rules:

- a branch with a detected hack is never chosen; with ``hacks_as_rejected`` it
  may be rejected, and then only against a clean objective pass;
- the chosen side is strictly better: ``margin > 0``, where the margin is the
  difference in reward (default) or in Bradley–Terry strength.

Strategies:

- ``best-worst``: per task, the best-ranked clean branch against the
  worst-ranked one it beats (one pair per task at most);
- ``pass-fail``: every (objective pass, objective fail) pair;
- ``all-pairs``: every ordered pair with ``margin >= min_margin``, optionally
  only those whose strength intervals do not overlap (``ci_separated``), so N
  ranked branches yield up to N(N−1)/2 pairs.

The self-join, the filters and the sort run on the light columns only (row
number, keys, scores, ranks); the message lists are fetched once per
surviving pair with a gather. Joining the messages as well would
copy them branches² times per task: at a million pairs that took 43 s and
23 GB, against seconds and a fraction of the memory this way
(``bench/bench_export.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from factory.errors import ConfigError

__all__ = ["PAIR_STRATEGIES", "PairOptions", "build_pairs"]

#: How branches of a task become chosen/rejected pairs (``--pairs``).
PAIR_STRATEGIES = ("best-worst", "pass-fail", "all-pairs")

#: Branch columns each side of a pair carries (as ``chosen_<col>`` / ``rejected_<col>``): the light ones
#: take part in the join and filters, the heavy ones are fetched for the pairs that survive them.
_LIGHT = ("branch_index", "objective_pass", "hack_detected", "hack_suspected", "reward", "strength", "ci_low",
          "ci_high", "rank")
_HEAVY = ("completion_messages", "completion_chars", "objective_score", "judge_score", "verifier_versions",
          "final_answer", "mode")


@dataclass(frozen=True)
class PairOptions:
    """How pairs are chosen.

    Attributes:
        strategy: One of :data:`PAIR_STRATEGIES`.
        margin_by: ``reward`` or ``strength`` (Bradley–Terry), the quantity the margin is a difference of.
        min_margin: Keep pairs whose margin is at least this (all-pairs; every pair needs margin > 0).
        ci_separated: Keep only pairs whose strength intervals do not overlap (chosen's low > rejected's high).
        hacks_as_rejected: Pair branches with a detected hack as rejected against a clean pass.
        max_pairs_per_task: Keep at most this many pairs per task, largest margins first.
    """

    strategy: str = "best-worst"
    margin_by: str = "reward"
    min_margin: float = 0.0
    ci_separated: bool = False
    hacks_as_rejected: bool = False
    max_pairs_per_task: int | None = None

    def __post_init__(self) -> None:
        if self.strategy not in PAIR_STRATEGIES:
            raise ConfigError(f"unknown pair strategy '{self.strategy}' (choose from: {', '.join(PAIR_STRATEGIES)})")
        if self.margin_by not in ("reward", "strength"):
            raise ConfigError(f"--margin-by must be reward or strength, not '{self.margin_by}'")
        if self.min_margin < 0:
            raise ConfigError(f"--min-margin must be >= 0, got {self.min_margin}")


def _side(frame: pl.DataFrame, prefix: str) -> pl.DataFrame:
    return frame.select("run_id", "task_id", pl.col("_row").alias(f"{prefix}__row"),
                        *[pl.col(c).alias(f"{prefix}_{c}") for c in _LIGHT])


def _fetch(heavy: pl.DataFrame, rows: pl.Series, prefix: str) -> pl.DataFrame:
    """The heavy columns of these branch rows (a Polars gather: no per-row Python, no Arrow round trip), prefixed.

    A gather of the nested message lists is about 3x faster than ``to_arrow`` + Arrow ``take`` + ``from_arrow``.
    """
    return heavy[rows].rename({c: f"{prefix}_{c}" for c in heavy.columns if c in _HEAVY})


def build_pairs(branches: pl.DataFrame, options: PairOptions) -> pl.DataFrame:
    """Pairs of branches of the same task, chosen over rejected, with a ``margin`` column.

    Args:
        branches: One row per branch (see :func:`~factory.export.load_source`).
        options: Strategy and filters.

    Returns:
        One row per pair: ``run_id``, ``task_id``, ``prompt_messages``, ``margin`` and
        ``chosen_*`` / ``rejected_*`` columns; sorted by run, task, chosen and rejected branch.
    """
    verified = (branches.filter(pl.col("objective_pass").is_not_null() & pl.col("rank").is_not_null())
                .with_row_index("_row"))
    # A branch the behaviour monitor suspects is never chosen, even when it passed: it is data for the negative side.
    chosen = _side(verified.filter(~pl.col("hack_detected") & ~pl.col("hack_suspected")), "chosen")
    pool = verified if options.hacks_as_rejected else verified.filter(~pl.col("hack_detected"))
    rejected = _side(pool, "rejected")
    pairs = chosen.join(rejected, on=["run_id", "task_id"])
    pairs = pairs.filter(pl.col("chosen_branch_index") != pl.col("rejected_branch_index"))
    pairs = pairs.with_columns(
        (pl.col(f"chosen_{options.margin_by}") - pl.col(f"rejected_{options.margin_by}")).alias("margin"))
    keep = (pl.col("margin") > 1e-12) & (pl.col("margin") >= options.min_margin)
    # a hacked branch is rejected only against a clean pass
    keep &= ~pl.col("rejected_hack_detected") | pl.col("chosen_objective_pass")
    keep &= ~pl.col("rejected_hack_suspected") | pl.col("chosen_objective_pass")
    if options.strategy == "pass-fail":
        keep &= pl.col("chosen_objective_pass") & ~pl.col("rejected_objective_pass")
    if options.ci_separated:
        keep &= pl.col("chosen_ci_low") > pl.col("rejected_ci_high")
    pairs = pairs.filter(keep)
    group = ["run_id", "task_id"]
    if options.strategy == "best-worst":
        pairs = pairs.filter(pl.col("chosen_rank") == pl.col("chosen_rank").min().over(group))
        pairs = pairs.filter(pl.col("rejected_rank") == pl.col("rejected_rank").max().over(group))
    if options.max_pairs_per_task is not None:
        pairs = pairs.sort([*group, "margin"], descending=[False, False, True])
        pairs = pairs.filter(pl.int_range(pl.len()).over(group) < options.max_pairs_per_task)
    pairs = pairs.sort([*group, "chosen_branch_index", "rejected_branch_index"])
    heavy = verified.select("prompt_messages", *_HEAVY)
    chosen_heavy = _fetch(heavy, pairs["chosen__row"], "chosen")  # the prompt comes with the chosen side
    rejected_heavy = _fetch(heavy.drop("prompt_messages"), pairs["rejected__row"], "rejected")
    return pl.concat([pairs.drop("chosen__row", "rejected__row"), chosen_heavy, rejected_heavy], how="horizontal")
