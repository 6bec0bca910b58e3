"""Ranking statistics: evidence rates in simulated worlds, interval coverage, and speed against choix and scipy.

Each benchmark against a baseline measured in the same run:

1. ``bt``: Bradley–Terry fits on synthetic comparisons drawn from known
   strengths (θ ~ N(0, 1), pairs uniform at random, decisive outcomes:
   choix has no ties) at 50 items / 100,000 comparisons and 1,000 items /
   1,000,000. ``fit_bradley_terry(ci=None)`` on the ``(i, j, outcome)``
   array, aggregation included (median of ``--repeat`` runs), against
   ``choix.ilsr_pairwise`` (one run, default tolerance) on the same
   comparisons as the list of ``(winner, loser)`` tuples it takes; neither
   side's input conversion is timed. choix runs under an alarm of
   ``--choix-timeout`` seconds; past it, its time is reported as a lower
   bound (``>``), so the ratio is one too. Both fits are scored by Spearman
   correlation with the true strengths.
   Goals: >= 10x faster than choix at 1,000,000 comparisons; Spearman equal
   to choix's within +-0.001 (ours keeps its default prior of 0.1).
2. ``bootstrap``: ``fit_bradley_terry`` with 100 bootstrap rounds at 1,000
   items / 1,000,000 comparisons, point fit included; Fisher intervals for
   reference. Goal: <= 30 s (2 cores).
3. ``wilson`` / ``mcnemar``: ``wilson_interval`` and ``mcnemar_exact_many``
   over 100,000 proportions / paired counts in one call, against per-item
   ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")`` and
   ``binomtest(b, b + c, 0.5).pvalue`` in a Python loop. The loop is timed
   on a ``--sample`` (5,000) subsample and scaled to the full count
   (labelled ``scaled``); both sides' results are compared on that sample.
   Goal: the same numbers (max |difference| <= 1e-9).
4. ``evidence``: how often "evidence" is claimed over ``--runs`` (200)
   simulated runs of 30 tasks x 4 branches, through
   ``RolloutRanker.rank(...).stats["evidence"]``. Null worlds (passes are
   fair coins, or depend on the task's difficulty only; the judge's scores
   or pairwise preferences are independent of the passes within a task):
   goal <= alpha + 3 pp (the old top-vs-bottom-by-reward test claimed it in
   100 % of runs). Informative worlds (a judge with within-task AUC ~0.75;
   a pairwise judge right 3 times in 4): goal >= 80 %. Arms of ``factory
   power --select best-worst`` (4 temperatures x 2 branches, equal pass
   rates) through ``select_arms`` (cross-fitted): goal <= alpha + 3 pp,
   beside the naive choice tested on the data that chose it (no goal: it
   shows why cross-fitting is there).
5. ``coverage``: Bradley–Terry intervals (``ci="auto"``, 95 %) against the
   true centred strengths of comparisons simulated from the model, with
   few, moderate and plentiful comparisons per item; the bare percentile
   bootstrap beside them. Goals: auto within 3 pp of 95 % where data are
   moderate or plentiful, >= 92 % with few (there it errs wide), and no
   interval of zero width.

Usage: python bench/bench_rank.py [--only bt,bootstrap,stats,evidence,coverage] [--sizes 50:100000,1000:1000000]
       [--repeat 3] [--choix-timeout 300] [--rounds 100] [--stats-n 100000] [--sample 5000] [--runs 200] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import choix
import numpy as np
from _results import print_table, record, verdict  # bench/ is on sys.path
from scipy import special, stats

from factory.ranking import (
    BranchRecord,
    PairwiseOutcome,
    RolloutRanker,
    compare_paired,
    fit_bradley_terry,
    mcnemar_exact_many,
    pair_arms,
    select_arms,
    split_by_field,
    wilson_interval,
)

NAMES = ("bt", "bootstrap", "stats", "evidence", "coverage")
SPEED_GOAL = 10.0
SPEARMAN_SLACK = 0.001
BOOTSTRAP_GOAL_S = 30.0
SAME_NUMBERS = 1e-9
ALPHA = 0.05
FALSE_EVIDENCE_SLACK = 0.03
POWER_GOAL = 0.80
COVERAGE_SLACK = 0.03
TASKS, BRANCHES = 30, 4
TEMPERATURES = (0.2, 0.5, 0.8, 1.1)


class ChoixTimeout(Exception):
    """choix ran past --choix-timeout."""


def synthetic(n_items: int, n_comparisons: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """True strengths, our ``(i, j, outcome)`` rows, and the same comparisons as choix's (winner, loser) list."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(0.0, 1.0, n_items)
    i = rng.integers(0, n_items, n_comparisons)
    j = (i + rng.integers(1, n_items, n_comparisons)) % n_items
    won = rng.random(n_comparisons) < special.expit(theta[i] - theta[j])
    winners, losers = np.where(won, i, j), np.where(won, j, i)
    return theta, np.column_stack([i, j, won.astype(np.float64)]), list(zip(winners.tolist(), losers.tolist()))


def run_choix(n_items: int, pairs: list[tuple[int, int]], timeout_s: int) -> tuple[float, np.ndarray | None]:
    """Seconds choix took (or the timeout, as a lower bound) and its strengths (None when it timed out)."""

    def expire(signum: int, frame: Any) -> None:
        raise ChoixTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(timeout_s)
    start = time.perf_counter()
    try:
        params = choix.ilsr_pairwise(n_items, pairs)
        return time.perf_counter() - start, params
    except ChoixTimeout:
        return time.perf_counter() - start, None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def median_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def spearman(estimate: np.ndarray, truth: np.ndarray) -> float:
    return float(stats.spearmanr(estimate, truth).statistic)


def bench_bt(sizes: list[tuple[int, int]], repeat: int, timeout_s: int, seed: int) -> None:
    print(f"\n[bt] Bradley–Terry fit: fit_bradley_terry(ci=None), median of {repeat}, vs choix.ilsr_pairwise (1 run)")
    for n_items, n_comparisons in sizes:
        label = f"bt {n_items}/{n_comparisons:,}"
        theta, rows, pairs = synthetic(n_items, n_comparisons, seed)
        ours_s, fit = median_time(lambda rows=rows: fit_bradley_terry(rows, ci=None), repeat)
        choix_s, params = run_choix(n_items, pairs, timeout_s)
        timed_out = params is None
        ratio = choix_s / ours_s
        rho = spearman(fit.strengths, theta)
        at_goal_size = n_comparisons >= 1_000_000
        # A timed-out choix gives a lower bound on the ratio: it can show the goal met, never missed.
        speed_ok = True if ratio >= SPEED_GOAL else (None if timed_out else False)
        bound = ">" if timed_out else ""
        judged = "unjudged (a lower bound)" if speed_ok is None else verdict(speed_ok)
        speed_goal = f"  (goal >= {SPEED_GOAL:g}x: {judged})" if at_goal_size else ""
        print(f"    {n_items:>5} items {n_comparisons:>10,} comparisons: ours {ours_s:8.4f} s "
              f"({fit.iterations} Newton steps, converged {fit.converged}); choix {bound}{choix_s:8.3f} s"
              f"{' (timed out: a lower bound)' if timed_out else ''}; speed-up {bound}{ratio:6.1f}x{speed_goal}")
        record(label, "fit seconds", f"{ours_s:.4f}", f"{bound}{choix_s:.3f} choix", f"{bound}{ratio:.1f}x",
               f">= {SPEED_GOAL:g}x" if at_goal_size else "", speed_ok if at_goal_size else None)
        if timed_out:
            print(f"    {'':5} Spearman to the true strengths: ours {rho:.6f}; choix timed out, no comparison")
            record(label, "Spearman vs truth", f"{rho:.6f}", "choix timed out", "", f"±{SPEARMAN_SLACK}", None)
            continue
        rho_choix = spearman(params, theta)
        rho_ok = abs(rho - rho_choix) <= SPEARMAN_SLACK
        gap = float(np.max(np.abs(fit.strengths - (params - params.mean()))))
        print(f"    {'':5} Spearman to the true strengths: ours {rho:.6f}, choix {rho_choix:.6f} "
              f"(difference {rho - rho_choix:+.6f}; goal ±{SPEARMAN_SLACK}: {verdict(rho_ok)}); "
              f"max |θ ours − θ choix| {gap:.2e}")
        record(label, "Spearman vs truth", f"{rho:.6f}", f"{rho_choix:.6f} choix", f"{rho - rho_choix:+.6f}",
               f"±{SPEARMAN_SLACK}", rho_ok)
        record(label, "max |θ ours − θ choix|", f"{gap:.2e}", "", "", "", None)


def bench_bootstrap(n_items: int, n_comparisons: int, rounds: int, seed: int) -> None:
    print(f"\n[bootstrap] fit_bradley_terry(ci='bootstrap', bootstrap_rounds={rounds}) at {n_items} items / "
          f"{n_comparisons:,} comparisons, point fit included")
    _, rows, _ = synthetic(n_items, n_comparisons, seed)
    point_s, _ = median_time(lambda: fit_bradley_terry(rows, ci=None), 1)
    start = time.perf_counter()
    fit = fit_bradley_terry(rows, ci="bootstrap", bootstrap_rounds=rounds, seed=seed)
    boot_s = time.perf_counter() - start
    start = time.perf_counter()
    fisher = fit_bradley_terry(rows, ci="fisher")
    fisher_s = time.perf_counter() - start
    goal = BOOTSTRAP_GOAL_S * rounds / 100
    ok = boot_s <= goal and fit.converged
    width_ratio = float(np.median((fit.ci_high - fit.ci_low) / (fisher.ci_high - fisher.ci_low)))
    print(f"    {rounds} rounds: {boot_s:6.2f} s ({(boot_s - point_s) / rounds * 1000:.0f} ms a round after a "
          f"{point_s:.2f} s point fit; all converged {fit.converged}) (goal <= {goal:g} s: {verdict(ok)})")
    print(f"    Fisher intervals: {fisher_s:6.2f} s; median width bootstrap / Fisher {width_ratio:.3f}")
    record("bootstrap", f"{rounds} rounds, {n_items}/{n_comparisons:,} (s)", f"{boot_s:.2f}", "", "",
           f"<= {goal:g} s", ok)
    record("bootstrap", "ms a round", f"{(boot_s - point_s) / rounds * 1000:.0f}", "", "", "", None)
    record("fisher", f"{n_items}/{n_comparisons:,} (s)", f"{fisher_s:.2f}", "", "", "", None)
    record("fisher", "width bootstrap / Fisher (median)", f"{width_ratio:.3f}", "", "", "", None)


def bench_stats(count: int, sample: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    sample = min(sample, count)
    scale = count / sample
    scaled = f"{sample:,} timed, x{scale:g}" if scale != 1 else "all timed"

    print(f"\n[wilson] {count:,} Wilson intervals (95 %): wilson_interval in one call vs a binomtest loop ({scaled})")
    n = rng.integers(1, 500, count)
    k = rng.binomial(n, rng.random(count))
    start = time.perf_counter()
    low, high = wilson_interval(k, n, alpha=0.05)
    ours_s = time.perf_counter() - start
    start = time.perf_counter()
    reference = [stats.binomtest(int(k[m]), int(n[m])).proportion_ci(confidence_level=0.95, method="wilson")
                 for m in range(sample)]
    scipy_s = (time.perf_counter() - start) * scale
    diff = max(float(np.max(np.abs(low[:sample] - [r.low for r in reference]))),
               float(np.max(np.abs(high[:sample] - [r.high for r in reference]))))
    report("wilson", count, ours_s, scipy_s, scaled, diff)

    print(f"\n[mcnemar] {count:,} exact McNemar tests: mcnemar_exact_many in one call vs a binomtest loop ({scaled})")
    b, c = rng.integers(0, 60, count), rng.integers(0, 60, count)
    paired = b + c + rng.integers(4, 100, count)  # >= 4 items paired, so every p-value is reported
    start = time.perf_counter()
    p_values = mcnemar_exact_many(b, c, paired)
    ours_s = time.perf_counter() - start
    start = time.perf_counter()
    reference_p = [1.0 if b[m] + c[m] == 0 else stats.binomtest(int(b[m]), int(b[m] + c[m]), 0.5).pvalue
                   for m in range(sample)]
    scipy_s = (time.perf_counter() - start) * scale
    report("mcnemar", count, ours_s, scipy_s, scaled, float(np.max(np.abs(p_values[:sample] - reference_p))))


def report(name: str, count: int, ours_s: float, scipy_s: float, scaled: str, diff: float) -> None:
    ok = diff <= SAME_NUMBERS
    print(f"    vectorised {ours_s * 1000:9.1f} ms   scipy loop {scipy_s:8.2f} s ({scaled})   "
          f"speed-up {scipy_s / ours_s:8.0f}x   max |difference| {diff:.1e} (goal <= {SAME_NUMBERS:g}: {verdict(ok)})")
    record(f"{name} {count:,}", "seconds", f"{ours_s:.4f}", f"{scipy_s:.2f} scipy ({scaled})",
           f"{scipy_s / ours_s:.0f}x", "", None)
    record(f"{name} {count:,}", "max |ours − scipy|", f"{diff:.1e}", "", "", f"<= {SAME_NUMBERS:g}", ok)


# --------------------------------------------------------------------------- evidence in simulated worlds


def branch_records(outcomes: np.ndarray, judge: np.ndarray | None = None,
                   temperatures: tuple[float, ...] | None = None) -> list[BranchRecord]:
    tasks, branches = outcomes.shape
    return [BranchRecord(f"t{t:02d}", b, bool(outcomes[t, b]), float(outcomes[t, b]),
                         None if judge is None else float(judge[t, b]), False,
                         {"temperature": None if temperatures is None else temperatures[b % len(temperatures)],
                          "seed": b, "model": "m", "status": "ok"})
            for t in range(tasks) for b in range(branches)]


def pairwise_judgments(rng: np.random.Generator, outcomes: np.ndarray, accuracy: float,
                       tie_rate: float = 0.2) -> list[PairwiseOutcome]:
    """Every pair judged once: a tie at tie_rate; else the passing branch preferred with probability accuracy where
    the outcomes differ, a coin where they agree."""
    tasks, branches = outcomes.shape
    a, b = np.triu_indices(branches, 1)
    tie = rng.random((tasks, a.size)) < tie_rate
    differ = outcomes[:, a] != outcomes[:, b]
    right = rng.random((tasks, a.size)) < accuracy
    a_wins = np.where(differ, right == outcomes[:, a], rng.random((tasks, a.size)) < 0.5)
    result = np.where(tie, 0.5, a_wins.astype(float))
    return [PairwiseOutcome(f"t{t:02d}", int(a[k]), int(b[k]), float(result[t, k]))
            for t in range(tasks) for k in range(a.size)]


def coins(rng: np.random.Generator) -> np.ndarray:
    return rng.random((TASKS, BRANCHES)) < 0.5


def world_no_judge(rng):
    return branch_records(coins(rng)), []


def world_random_judge(rng):
    return branch_records(coins(rng), rng.integers(0, 11, (TASKS, BRANCHES)) / 10), []


def world_difficulty_judge(rng):
    rate = rng.uniform(0.05, 0.95, (TASKS, 1))
    judge = np.clip(np.round(rate + rng.normal(0.0, 0.15, (TASKS, BRANCHES)), 1), 0.0, 1.0)
    return branch_records(rng.random((TASKS, BRANCHES)) < rate, judge), []


def world_random_pairwise(rng):
    outcomes = coins(rng)
    return branch_records(outcomes), pairwise_judgments(rng, outcomes, 0.5)


def world_informative_judge(rng):
    outcomes = coins(rng)
    judge = np.round(special.expit(0.5 * (2 * outcomes - 1) + rng.normal(0.0, 1.0, (TASKS, BRANCHES))), 1)
    return branch_records(outcomes, judge), []


def world_informative_pairwise(rng):
    outcomes = coins(rng)
    return branch_records(outcomes), pairwise_judgments(rng, outcomes, 0.75)


WORLDS = [  # name, make, null?
    ("coin flips, no judge (order = objective)", world_no_judge, True),
    ("coin flips, random judge scores", world_random_judge, True),
    ("task difficulty only, judge sees difficulty", world_difficulty_judge, True),
    ("coin flips, random pairwise judge", world_random_pairwise, True),
    ("informative judge scores (AUC ~0.75)", world_informative_judge, False),
    ("informative pairwise judge (right 3 in 4)", world_informative_pairwise, False),
]


def old_rule_evidence(records: list[BranchRecord]) -> bool:
    """The rule this replaces: top vs bottom half by reward (objective first), on the objective outcome."""
    top, bottom = [], []
    for task in sorted({r.task_id for r in records}):
        order = sorted((r for r in records if r.task_id == task), key=lambda r: (-r.objective_score, r.branch_index))
        half = len(order) // 2
        top += [bool(r.objective_pass) for r in order[:half]]
        bottom += [bool(r.objective_pass) for r in order[len(order) - half:]]
    return compare_paired(top, bottom, alpha=ALPHA).evidence


def bench_evidence(runs: int, seed: int) -> None:
    print(f"\n[evidence] RolloutRanker.rank(...).stats['evidence'] over {runs} simulated runs of {TASKS} tasks x "
          f"{BRANCHES} branches (alpha {ALPHA})")
    ranker = RolloutRanker(alpha=ALPHA, bootstrap_rounds=20)
    for name, make, null in WORLDS:
        rng = np.random.default_rng(seed)
        start = time.perf_counter()
        claimed = old = 0
        aucs = []
        for _ in range(runs):
            records, pairs = make(rng)
            stats_ = ranker.rank(records, pairs).stats
            claimed += bool(stats_["evidence"])
            old += old_rule_evidence(records) if make is world_no_judge else 0
            if stats_["auc_within_task"] is not None:
                aucs.append(stats_["auc_within_task"])
        rate = claimed / runs
        ok = rate <= ALPHA + FALSE_EVIDENCE_SLACK if null else rate >= POWER_GOAL
        goal = f"<= {100 * (ALPHA + FALSE_EVIDENCE_SLACK):g}%" if null else f">= {100 * POWER_GOAL:g}%"
        auc = f"{np.mean(aucs):.3f}" if aucs else "n/a (no test)"
        print(f"    {name:<46} evidence in {100 * rate:5.1f}% of runs (goal {goal}: {verdict(ok)}); "
              f"mean AUC within task {auc}  [{time.perf_counter() - start:.1f} s]")
        record("evidence", f"{'null' if null else 'informative'}: {name}", f"{100 * rate:.1f}%", "", "", goal, ok)
        if make is world_no_judge:
            print(f"    {'':<46} the old rule (top vs bottom by reward, on the objective): {100 * old / runs:.1f}%")
            record("evidence", "old rule on coin flips", f"{100 * old / runs:.1f}%", "", "", "", None)

    rng = np.random.default_rng(seed)
    for label, rates, null in (("equal temperatures", np.full(4, 0.5), True),
                               ("one temperature at 0.8, three at 0.4", np.array([0.8, 0.4, 0.4, 0.4]), False)):
        crossfit = naive = 0
        for run in range(runs):
            records = branch_records(rng.random((TASKS, 8)) < np.tile(rates, 2), temperatures=TEMPERATURES)
            chosen = select_arms(records, "temperature", "best-worst", seed=run)
            crossfit += compare_paired(chosen.paired.a, chosen.paired.b, alpha=ALPHA).evidence
            seen = {t: np.mean([r.objective_pass for r in records if r.fields["temperature"] == t])
                    for t in TEMPERATURES}
            best, worst = max(seen, key=seen.get), min(seen, key=seen.get)
            paired = pair_arms(*split_by_field(records, "temperature", str(best), str(worst)), "best", "worst")
            naive += compare_paired(paired.a, paired.b, alpha=ALPHA).evidence
        goal = f"<= {100 * (ALPHA + FALSE_EVIDENCE_SLACK):g}%" if null else ""
        ok = crossfit / runs <= ALPHA + FALSE_EVIDENCE_SLACK if null else None
        print(f"    best vs worst of 4 temperatures, {label:<36} cross-fitted {100 * crossfit / runs:5.1f}%"
              f"{f' (goal {goal}: {verdict(ok)})' if null else ' (power)'}; chosen and tested on the same tasks "
              f"{100 * naive / runs:5.1f}%")
        record("arms", f"best-worst, {label}: cross-fitted", f"{100 * crossfit / runs:.1f}%",
               f"{100 * naive / runs:.1f}% naive", "", goal, ok)


# --------------------------------------------------------------------------- interval coverage


def true_comparisons(n_items: int, n_comparisons: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Centred true strengths θ ~ N(0, 0.8²) and comparisons of random pairs drawn from them (no ties)."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(0.0, 0.8, n_items)
    theta -= theta.mean()
    i = rng.integers(0, n_items, n_comparisons)
    j = (i + rng.integers(1, n_items, n_comparisons)) % n_items
    won = rng.random(n_comparisons) < special.expit(theta[i] - theta[j])
    return theta, np.column_stack([i, j, won.astype(float)])


def bench_coverage(simulations: int, rounds: int, seed: int) -> None:
    print(f"\n[coverage] 95% Bradley–Terry intervals covering the true centred strengths ({simulations} fits per "
          f"row, {rounds} bootstrap rounds)")
    regimes = [("few", 2, 1), ("few", 6, 20), ("moderate", 6, 60), ("moderate", 6, 150), ("plentiful", 4, 200),
               ("plentiful", 6, 600)]
    for regime, n_items, n_comparisons in regimes:
        covered = {"auto": 0, "bootstrap": 0}
        zero = {"auto": 0, "bootstrap": 0}
        boot_share = total = 0
        for s in range(simulations):
            theta, rows = true_comparisons(n_items, n_comparisons, seed + 1000 * n_items + s)
            for ci in ("auto", "bootstrap"):
                fit = fit_bradley_terry(rows, n_items, ci=ci, bootstrap_rounds=rounds, seed=s)
                covered[ci] += int(np.sum((fit.ci_low <= theta) & (theta <= fit.ci_high)))
                zero[ci] += int(np.sum(fit.ci_high - fit.ci_low <= 0))
                if ci == "auto":
                    boot_share += int(fit.ci_bootstrapped.sum())
            total += n_items
        auto, bare = covered["auto"] / total, covered["bootstrap"] / total
        ok = (auto >= 0.95 - COVERAGE_SLACK if regime == "few" else abs(auto - 0.95) <= COVERAGE_SLACK) \
            and zero["auto"] == 0
        goal = ">= 92%, no zero width" if regime == "few" else "95% ± 3 pp, no zero width"
        per_item = 2 * n_comparisons / n_items
        print(f"    {regime:<9} {n_items} items x {n_comparisons:>3} comparisons ({per_item:5.1f} per item): auto "
              f"{100 * auto:5.1f}% ({100 * boot_share / total:3.0f}% of items bootstrapped, {zero['auto']} zero-width)"
              f" (goal {goal}: {verdict(ok)}); bare bootstrap {100 * bare:5.1f}% ({zero['bootstrap']} zero-width)")
        record("coverage", f"{n_items} items x {n_comparisons} ({regime})", f"{100 * auto:.1f}%",
               f"{100 * bare:.1f}% bare bootstrap", f"{zero['bootstrap']} zero-width", goal, ok)


def parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for part in text.split(","):
        items, comparisons = part.split(":")
        sizes.append((int(items), int(comparisons)))
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(NAMES), help=f"comma list of: {', '.join(NAMES)}")
    parser.add_argument("--sizes", default="50:100000,1000:1000000", help="bt: ITEMS:COMPARISONS, comma list")
    parser.add_argument("--repeat", type=int, default=3, help="bt: runs of our fit (median reported)")
    parser.add_argument("--choix-timeout", type=int, default=300, help="bt: seconds before choix is stopped")
    parser.add_argument("--rounds", type=int, default=100, help="bootstrap: rounds (goal scales from 30 s / 100)")
    parser.add_argument("--bootstrap-size", default="1000:1000000", help="bootstrap: ITEMS:COMPARISONS")
    parser.add_argument("--stats-n", type=int, default=100_000, help="wilson/mcnemar: proportions and pairs")
    parser.add_argument("--sample", type=int, default=5_000, help="wilson/mcnemar: items the scipy loop times")
    parser.add_argument("--runs", type=int, default=200, help="evidence: simulated runs per world")
    parser.add_argument("--simulations", type=int, default=200, help="coverage: fits per regime")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run: too small to judge goals)")
    args = parser.parse_args()
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in NAMES]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)} (choose from {', '.join(NAMES)})")
    sizes, (boot_items, boot_comparisons) = parse_sizes(args.sizes), parse_sizes(args.bootstrap_size)[0]
    if args.quick:
        sizes, boot_items, boot_comparisons = [(50, 10_000), (200, 50_000)], 200, 50_000
        args.rounds, args.stats_n, args.sample = 20, 10_000, 500
        args.runs, args.simulations = 40, 40

    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, choix {importlib.metadata.version('choix')}, "
          f"{os.cpu_count()} CPUs{' (quick)' if args.quick else ''}")
    if "bt" in chosen:
        bench_bt(sizes, args.repeat, args.choix_timeout, args.seed)
    if "bootstrap" in chosen:
        bench_bootstrap(boot_items, boot_comparisons, args.rounds, args.seed)
    if "stats" in chosen:
        bench_stats(args.stats_n, args.sample, args.seed)
    if "evidence" in chosen:
        bench_evidence(args.runs, args.seed)
    if "coverage" in chosen:
        bench_coverage(args.simulations, args.rounds, args.seed)
    print_table()


if __name__ == "__main__":
    main()
