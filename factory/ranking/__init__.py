"""Ranking: Bradley–Terry strengths, evidence tests whose outcome the ranking did not use, paired arm comparisons."""

from factory.ranking._arms import SELECTION_RULES, excluded_in_arms, pair_arms, select_arms, split_by_field
from factory.ranking._bradley_terry import BTFit, comparisons_from_winners, fit_bradley_terry
from factory.ranking._evidence import ORDERED_BY_OUTCOME, describe_evidence, outcome_summary, signal_evidence
from factory.ranking._pairwise import judge_pairwise
from factory.ranking._plots import check_plot_file, plot_pass_rates, plot_strengths
from factory.ranking._ranker import DEFAULT_REWARDS, RankedBranch, RewardFunction, RolloutRanker
from factory.ranking._records import (
    BranchRecord,
    PairwiseOutcome,
    boundary_limited,
    excluded_branches,
    load_pairwise,
    load_records,
    merge_excluded,
    records_of,
)
from factory.ranking._stats import (
    PowerPolicy,
    compare_paired,
    mcnemar_exact,
    mcnemar_exact_many,
    min_detectable_delta_pp,
    paired_sample_size,
    pass_at_k,
    powered,
    wilson_half_width,
    wilson_interval,
)

__all__ = [
    "DEFAULT_REWARDS",
    "ORDERED_BY_OUTCOME",
    "SELECTION_RULES",
    "BTFit",
    "BranchRecord",
    "PairwiseOutcome",
    "PowerPolicy",
    "RankedBranch",
    "RewardFunction",
    "RolloutRanker",
    "boundary_limited",
    "check_plot_file",
    "compare_paired",
    "comparisons_from_winners",
    "describe_evidence",
    "excluded_branches",
    "excluded_in_arms",
    "fit_bradley_terry",
    "judge_pairwise",
    "load_pairwise",
    "load_records",
    "mcnemar_exact",
    "mcnemar_exact_many",
    "merge_excluded",
    "min_detectable_delta_pp",
    "outcome_summary",
    "pair_arms",
    "paired_sample_size",
    "pass_at_k",
    "plot_pass_rates",
    "plot_strengths",
    "powered",
    "records_of",
    "select_arms",
    "signal_evidence",
    "split_by_field",
    "wilson_half_width",
    "wilson_interval",
]
