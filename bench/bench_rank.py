"""Ranking statistics speed: Bradley–Terry against choix, Wilson and McNemar against per-item scipy calls.

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

Usage: python bench/bench_rank.py [--only bt,bootstrap,stats] [--sizes 50:100000,1000:1000000] [--repeat 3]
       [--choix-timeout 300] [--rounds 100] [--stats-n 100000] [--sample 5000] [--quick]
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

from factory.ranking._bradley_terry import fit_bradley_terry
from factory.ranking._stats import mcnemar_exact_many, wilson_interval

NAMES = ("bt", "bootstrap", "stats")
SPEED_GOAL = 10.0
SPEARMAN_SLACK = 0.001
BOOTSTRAP_GOAL_S = 30.0
SAME_NUMBERS = 1e-9


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

    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, choix {importlib.metadata.version('choix')}, "
          f"{os.cpu_count()} CPUs{' (quick)' if args.quick else ''}")
    if "bt" in chosen:
        bench_bt(sizes, args.repeat, args.choix_timeout, args.seed)
    if "bootstrap" in chosen:
        bench_bootstrap(boot_items, boot_comparisons, args.rounds, args.seed)
    if "stats" in chosen:
        bench_stats(args.stats_n, args.sample, args.seed)
    print_table()


if __name__ == "__main__":
    main()
