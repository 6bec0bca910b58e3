"""Bradley–Terry fits: against choix and closed forms, and by properties (order, ties, priors, intervals)."""

from __future__ import annotations

import json

import choix
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from factory.errors import ConfigError
from factory.ranking import (
    BTFit,
    _bradley_terry,  # its batch size, patched to check batching changes nothing
    comparisons_from_winners,
    fit_bradley_terry,
)


def synthetic(n_items: int, n_comparisons: int, seed: int, tie_rate: float = 0.0,
              spread: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Centred true log-strengths and comparisons of random pairs drawn from them.

    A comparison is a tie with probability ``tie_rate``; otherwise i wins with
    probability σ(θ_i − θ_j).
    """
    rng = np.random.default_rng(seed)
    theta = rng.normal(0.0, spread, n_items)
    theta -= theta.mean()
    i = rng.integers(0, n_items, n_comparisons)
    j = (i + rng.integers(1, n_items, n_comparisons)) % n_items
    won = rng.random(n_comparisons) < special.expit(theta[i] - theta[j])
    outcome = np.where(rng.random(n_comparisons) < tie_rate, 0.5, won.astype(float))
    return theta, np.column_stack([i, j, outcome])


def as_choix(comparisons: np.ndarray) -> list[tuple[int, int]]:
    """The same data as (winner, loser) pairs choix reads: every decisive comparison twice, a tie once each way.

    Doubling squares our likelihood (a tie's σ^½·σ^½ becomes σ·σ), which has the same maximiser.
    """
    pairs: list[tuple[int, int]] = []
    for i, j, outcome in comparisons.tolist():
        i, j = int(i), int(j)
        if outcome == 1.0:
            pairs += [(i, j), (i, j)]
        elif outcome == 0.0:
            pairs += [(j, i), (j, i)]
        else:
            pairs += [(i, j), (j, i)]
    return pairs


# Both fits converge to the unique optimum of the same strictly concave
# objective: ours until every item's expected score matches its observed one
# within a relative 1e-10, choix until successive iterates differ by < 1e-10
# in L1. Measured agreement is ~1e-13; 1e-6 leaves room for conditioning.
CHOIX_TOL = 1e-6


# --------------------------------------------------------------------------- accuracy


def test_recovers_known_strengths():
    theta, comparisons = synthetic(30, 20_000, seed=1)
    fit = fit_bradley_terry(comparisons, ci=None)
    assert fit.converged
    assert stats.spearmanr(fit.strengths, theta).statistic > 0.95
    # Each item plays ~1,300 games: standard errors ~0.06, so 0.3 is five of them.
    assert np.max(np.abs(fit.strengths - theta)) < 0.3
    assert fit.strengths.mean() == pytest.approx(0.0, abs=1e-12)


def test_agrees_with_choix_maximum_likelihood():
    _, comparisons = synthetic(15, 1_500, seed=2, tie_rate=0.2)
    ours = fit_bradley_terry(comparisons, prior=0.0, ci=None, tol=1e-10)
    reference = choix.ilsr_pairwise(15, as_choix(comparisons), alpha=0.0, tol=1e-10, max_iter=1000)
    # Both scales: centred log-strengths with P(i beats j) = σ(θ_i − θ_j).
    np.testing.assert_allclose(ours.strengths, reference - reference.mean(), atol=CHOIX_TOL)


def test_agrees_with_choix_under_the_same_prior():
    """prior=1 is a tie against a reference item: in choix's doubled data, one win each way against an extra item.

    choix's own ``alpha`` is a different regulariser (a constant added to its Markov chain's rates, not a
    likelihood term), so the reference item is spelled out as data instead.
    """
    _, comparisons = synthetic(10, 400, seed=3, tie_rate=0.1)
    undefeated = np.array([[0, k, 1.0] for k in range(1, 10)])  # item 0 wins every game it plays
    comparisons = np.concatenate([comparisons[(comparisons[:, 0] != 0) & (comparisons[:, 1] != 0)], undefeated])
    ours = fit_bradley_terry(comparisons, prior=1.0, ci=None, tol=1e-10)
    reference_item = 10
    data = as_choix(comparisons) + [(k, reference_item) for k in range(10)] + [(reference_item, k) for k in range(10)]
    reference = choix.ilsr_pairwise(11, data, tol=1e-10, max_iter=1000)[:10]
    np.testing.assert_allclose(ours.strengths, reference - reference.mean(), atol=CHOIX_TOL)


@pytest.mark.parametrize("prior", [0.0, 0.1])
def test_newton_and_mm_reach_the_same_optimum(prior):
    _, comparisons = synthetic(40, 4_000, seed=4, tie_rate=0.1)
    newton = fit_bradley_terry(comparisons, prior=prior, ci="fisher", method="newton", tol=1e-10)
    mm = fit_bradley_terry(comparisons, prior=prior, ci="fisher", method="mm", tol=1e-10)
    assert newton.converged and mm.converged
    assert newton.iterations < 15 < mm.iterations
    np.testing.assert_allclose(mm.strengths, newton.strengths, atol=1e-8)
    np.testing.assert_allclose(mm.ci_high, newton.ci_high, atol=1e-8)


# --------------------------------------------------------------------------- order invariance


@st.composite
def comparison_lists(draw) -> list[tuple[int, int, float]]:
    n_items = draw(st.integers(2, 6))
    rows = []
    for _ in range(draw(st.integers(1, 40))):
        i = draw(st.integers(0, n_items - 1))
        j = draw(st.integers(0, n_items - 2))
        rows.append((i, j + (j >= i), draw(st.sampled_from([0.0, 0.5, 1.0]))))
    return rows


@settings(max_examples=40, deadline=None)
@given(rows=comparison_lists(), data=st.data())
def test_shuffled_or_mirrored_rows_give_the_identical_fit(rows, data):
    order = data.draw(st.permutations(range(len(rows))))
    mirror = data.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)))
    # (i, j, o) and (j, i, 1 − o) record the same comparison.
    shuffled = [(rows[k][1], rows[k][0], 1.0 - rows[k][2]) if flip else rows[k] for k, flip in zip(order, mirror)]
    n_items = max(max(i, j) for i, j, _ in rows) + 1
    for ci in ("bootstrap", "auto"):
        a = fit_bradley_terry(rows, n_items, ci=ci, bootstrap_rounds=20, seed=7, min_bootstrap_comparisons=3)
        b = fit_bradley_terry(shuffled, n_items, ci=ci, bootstrap_rounds=20, seed=7, min_bootstrap_comparisons=3)
        assert np.array_equal(a.strengths, b.strengths)
        assert np.array_equal(a.ci_low, b.ci_low) and np.array_equal(a.ci_high, b.ci_high)
        assert a.iterations == b.iterations


# --------------------------------------------------------------------------- ties and closed forms


@pytest.mark.parametrize("prior", [0.0, 0.1])
def test_only_ties_give_equal_strengths(prior):
    fit = fit_bradley_terry([(0, 1, 0.5)] * 5, prior=prior, ci="fisher")
    assert np.array_equal(fit.strengths, [0.0, 0.0])
    assert list(fit.order()) == [0, 1]


def test_a_tie_is_half_a_win_for_each_side():
    two_ties = fit_bradley_terry([(0, 1, 0.5), (2, 0, 1.0), (0, 1, 0.5)], bootstrap_rounds=30)
    one_win_each = fit_bradley_terry([(0, 1, 1.0), (2, 0, 1.0), (1, 0, 1.0)], bootstrap_rounds=30)
    assert np.array_equal(two_ties.strengths, one_win_each.strengths)


@pytest.mark.parametrize(("rows", "score", "games"), [
    ([(0, 1, 1.0), (0, 1, 0.5)], 1.5, 2),  # one win and one tie: odds 1.5 : 0.5 = 3
    ([(0, 1, 1.0)] * 7 + [(1, 0, 1.0)] * 3, 7, 10),
    ([(1, 0, 0.0)] * 2 + [(0, 1, 0.0)] + [(0, 1, 0.5)] * 3, 3.5, 6),
])
def test_two_items_match_the_closed_form(rows, score, games):
    # The MLE sets σ(θ0 − θ1) = score / games, so θ0 − θ1 is the log-odds; Var(θ0 − θ1) = 1 / (games·p·(1 − p)).
    fit = fit_bradley_terry(rows, prior=0.0, ci="fisher", tol=1e-12)
    p = score / games
    assert fit.strengths[0] - fit.strengths[1] == pytest.approx(np.log(p / (1 - p)), abs=1e-9)
    # Centred strengths are ±(θ0 − θ1)/2, so each has half the difference's standard error.
    half_width = special.ndtri(0.975) * 0.5 / np.sqrt(games * p * (1 - p))
    np.testing.assert_allclose(fit.ci_high - fit.strengths, half_width, rtol=1e-8)


def test_an_undefeated_item_gets_a_finite_strength():
    rows = [(0, k, 1.0) for k in range(1, 5)] * 5 + [(1, 2, 1.0), (2, 3, 0.5), (3, 1, 1.0), (4, 3, 0.0)]
    for ci in ("bootstrap", "fisher"):
        fit = fit_bradley_terry(rows, ci=ci)
        assert fit.converged
        assert np.all(np.isfinite(fit.strengths)) and np.all(np.isfinite(fit.ci_low))
        assert np.all(np.isfinite(fit.ci_high))
        assert fit.order()[0] == 0 and fit.strengths[0] > fit.strengths[1:].max() + 1.0
    with pytest.raises(ConfigError, match="does not exist"):
        fit_bradley_terry(rows, prior=0.0, ci="fisher")


def test_items_never_compared_get_the_prior_alone():
    fit = fit_bradley_terry([(0, 1, 1.0), (1, 0, 1.0)] * 20, n_items=4, ci="fisher")
    np.testing.assert_allclose(fit.strengths, 0.0, atol=1e-12)
    # Items 2 and 3 have only the prior's tenth of a game. Every interval is wide, rightly: nothing ties
    # the group {0, 1} to the group {2, 3} but the prior, and centred strengths compare each item to all.
    width = fit.ci_high - fit.ci_low
    assert np.all(width[2:] > width[:2]) and np.all(width > 10)
    assert fit_bradley_terry([], n_items=1).strengths.tolist() == [0.0]


# --------------------------------------------------------------------------- intervals


@pytest.mark.parametrize("ci", ["bootstrap", "fisher"])
def test_intervals_contain_the_estimate_and_shrink_with_more_data(ci):
    _, small = synthetic(10, 500, seed=5, tie_rate=0.1)
    _, large = synthetic(10, 5_000, seed=5, tie_rate=0.1)
    widths = []
    for comparisons in (small, large):
        fit = fit_bradley_terry(comparisons, ci=ci, bootstrap_rounds=100)
        assert np.all(fit.ci_low <= fit.strengths) and np.all(fit.strengths <= fit.ci_high)
        widths.append(np.mean(fit.ci_high - fit.ci_low))
    # Ten times the data: widths shrink by about sqrt(10), to ~0.32.
    assert widths[1] / widths[0] < 0.45


@pytest.mark.parametrize(("ci", "simulations"), [("fisher", 300), ("bootstrap", 60)])
def test_intervals_cover_the_true_strengths(ci, simulations):
    hits = total = 0
    for seed in range(simulations):
        theta, comparisons = synthetic(6, 300, seed=100 + seed, tie_rate=0.1, spread=0.7)
        fit = fit_bradley_terry(comparisons, ci=ci, bootstrap_rounds=100, seed=seed)
        hits += int(np.sum((fit.ci_low <= theta) & (theta <= fit.ci_high)))
        total += theta.size
    # Nominal 95 %; with 360 to 1,800 item-intervals (correlated within a fit) the rate is within a few points.
    assert 0.90 <= hits / total <= 0.99


# --------------------------------------------------------------------------- honest intervals (ci="auto")


@settings(max_examples=80, deadline=None)
@given(rows=comparison_lists(), extra_items=st.integers(0, 2))
def test_auto_intervals_never_have_zero_width(rows, extra_items):
    """Whatever the data (one comparison, all ties, an undefeated item, items never compared), width > 0."""
    n_items = max(max(i, j) for i, j, _ in rows) + 1 + extra_items
    fit = fit_bradley_terry(rows, n_items, bootstrap_rounds=20, min_bootstrap_comparisons=5)
    width = fit.ci_high - fit.ci_low
    assert np.all(np.isfinite(width)) and np.all(width > 0)
    assert np.all(fit.ci_low <= fit.strengths) and np.all(fit.strengths <= fit.ci_high)


def test_one_comparison_is_not_certainty():
    """The issue's example: two branches, one comparison. The bare bootstrap repeats it (zero width); auto does not."""
    bare = fit_bradley_terry([(0, 1, 1.0)], ci="bootstrap", bootstrap_rounds=50)
    assert np.array_equal(bare.ci_low, bare.ci_high)  # the defect auto exists to avoid
    fit = fit_bradley_terry([(0, 1, 1.0)])
    assert fit.ci_method == "auto" and not fit.ci_bootstrapped.any()
    assert fit.strengths[0] == pytest.approx(1.67, abs=0.01)
    # one win says the winner is probably ahead, not by how much: the interval spans zero and is wide
    assert fit.ci_low[0] < 0 < fit.ci_high[0] and fit.ci_high[0] - fit.ci_low[0] > 5
    single = fit_bradley_terry([], n_items=1)
    assert np.isnan(single.ci_low).all() and np.isnan(single.ci_high).all()


def test_auto_bootstraps_only_items_with_enough_varied_comparisons():
    # items 0 and 1 split 60 games; item 2 lost all 60 it played, item 3 played 4
    rows = [(0, 1, 1.0)] * 30 + [(1, 0, 1.0)] * 30 + [(1, 2, 1.0)] * 60 + [(3, 0, 1.0), (0, 3, 1.0)] * 2
    fit = fit_bradley_terry(rows, bootstrap_rounds=50)
    assert fit.ci_bootstrapped.tolist() == [True, True, False, False] and fit.bootstrap_rounds == 50
    fisher = fit_bradley_terry(rows, ci="fisher")
    # Fisher where the rule says so; never narrower than Fisher where bootstrapped
    np.testing.assert_array_equal(fit.ci_low[2:], fisher.ci_low[2:])
    assert np.all(fit.ci_low[:2] <= fisher.ci_low[:2]) and np.all(fit.ci_high[:2] >= fisher.ci_high[:2])
    # prior 0 cannot be bootstrapped (a resample may have no MLE): auto is Fisher throughout
    connected = [(0, 1, 1.0), (1, 0, 1.0)] * 40
    assert not fit_bradley_terry(connected, prior=0.0).ci_bootstrapped.any()


@pytest.mark.parametrize("games", [1, 2, 5, 10])
def test_auto_width_shrinks_as_comparisons_grow(games):
    """The same mixed record repeated k times (more comparisons, same rates): every interval narrows."""
    base = [(0, 1, 1.0), (0, 1, 1.0), (1, 0, 1.0), (1, 2, 1.0), (2, 1, 0.5), (2, 0, 1.0), (0, 2, 1.0)] * games
    fits = [fit_bradley_terry(base * k, bootstrap_rounds=40) for k in (1, 2, 4, 16)]
    widths = [fit.ci_high - fit.ci_low for fit in fits]
    for narrow, wide in zip(widths[1:], widths[:-1]):
        assert np.all(narrow < wide)


@pytest.mark.parametrize(("n_items", "n_comparisons", "simulations", "regime"), [
    (6, 60, 200, "fisher"),  # 20 comparisons per item: Fisher intervals
    (4, 200, 40, "bootstrap"),  # 100 per item: bootstrap, never narrower than Fisher
])
def test_auto_intervals_cover_the_true_strengths_within_3pp(n_items, n_comparisons, simulations, regime):
    hits = total = bootstrapped = 0
    for seed in range(simulations):
        theta, comparisons = synthetic(n_items, n_comparisons, seed=2000 + seed, spread=0.8)
        fit = fit_bradley_terry(comparisons, n_items, bootstrap_rounds=100, seed=seed)
        hits += int(np.sum((fit.ci_low <= theta) & (theta <= fit.ci_high)))
        bootstrapped += int(fit.ci_bootstrapped.sum())
        total += theta.size
    assert bootstrapped == (total if regime == "bootstrap" else 0)
    # measured: 96.2 % (1,200 intervals) and 95.4 % (240)
    assert abs(hits / total - 0.95) <= 0.03


def test_auto_intervals_with_few_comparisons_err_on_the_wide_side():
    hits = total = 0
    for seed in range(150):
        theta, comparisons = synthetic(6, 20, seed=3000 + seed, spread=0.8)  # ~7 comparisons per item
        fit = fit_bradley_terry(comparisons, 6)
        hits += int(np.sum((fit.ci_low <= theta) & (theta <= fit.ci_high)))
        total += theta.size
    assert hits / total >= 0.95


def test_bootstrap_and_fisher_agree_when_data_are_plentiful():
    _, comparisons = synthetic(12, 20_000, seed=6)
    boot = fit_bradley_terry(comparisons, ci="bootstrap", bootstrap_rounds=200)
    fisher = fit_bradley_terry(comparisons, ci="fisher")
    ratio = (boot.ci_high - boot.ci_low) / (fisher.ci_high - fisher.ci_low)
    assert 0.8 < np.median(ratio) < 1.2


def test_bootstrap_is_seeded():
    _, comparisons = synthetic(8, 300, seed=7)
    first = fit_bradley_terry(comparisons, ci="bootstrap", bootstrap_rounds=50, seed=11)
    again = fit_bradley_terry(comparisons, ci="bootstrap", bootstrap_rounds=50, seed=11)
    other = fit_bradley_terry(comparisons, ci="bootstrap", bootstrap_rounds=50, seed=12)
    assert np.array_equal(first.ci_low, again.ci_low) and np.array_equal(first.ci_high, again.ci_high)
    assert not np.array_equal(first.ci_low, other.ci_low)
    assert np.array_equal(first.strengths, other.strengths)


def test_bootstrap_batches_do_not_change_the_rounds(monkeypatch):
    """Rounds refit many per batch (small problems) or one at a time (large ones): the same resamples, same fits."""
    _, comparisons = synthetic(8, 400, seed=8, tie_rate=0.1)
    batched = fit_bradley_terry(comparisons, ci="bootstrap", bootstrap_rounds=40, seed=3)
    monkeypatch.setattr(_bradley_terry, "_BATCH_CELLS", 1)
    one_by_one = fit_bradley_terry(comparisons, ci="bootstrap", bootstrap_rounds=40, seed=3)
    np.testing.assert_allclose(one_by_one.ci_low, batched.ci_low, atol=1e-7)
    np.testing.assert_allclose(one_by_one.ci_high, batched.ci_high, atol=1e-7)


def test_mm_bootstrap_agrees_with_newton_bootstrap():
    _, comparisons = synthetic(8, 400, seed=9)
    newton = fit_bradley_terry(comparisons, ci="bootstrap", bootstrap_rounds=40, method="newton")
    mm = fit_bradley_terry(comparisons, ci="bootstrap", bootstrap_rounds=40, method="mm")
    np.testing.assert_allclose(mm.ci_low, newton.ci_low, atol=1e-6)
    np.testing.assert_allclose(mm.ci_high, newton.ci_high, atol=1e-6)


# --------------------------------------------------------------------------- the result object


def test_order_is_strongest_first_and_equal_strengths_keep_index_order():
    # Items 0, 1 and 2 are interchangeable: their fitted strengths agree up to rounding noise.
    rows = [(3, 2, 1.0), (3, 1, 1.0), (3, 0, 1.0), (2, 1, 0.5), (1, 0, 0.5), (0, 2, 0.5), (4, 3, 1.0)] * 3
    fit = fit_bradley_terry(rows, ci=None)
    assert fit.strengths[0] == pytest.approx(fit.strengths[1], abs=1e-12)
    assert fit.strengths[1] == pytest.approx(fit.strengths[2], abs=1e-12)
    assert list(fit.order()) == [4, 3, 0, 1, 2]


def test_to_dict_is_json_ready():
    fit = fit_bradley_terry([(0, 1, 1.0), (1, 2, 0.5), (2, 0, 0.0)], ci="bootstrap", bootstrap_rounds=20)
    out = json.loads(json.dumps(fit.to_dict(), allow_nan=False))
    assert out["strengths"] == pytest.approx(fit.strengths.tolist())
    assert out["order"] == fit.order().tolist() and out["n_items"] == 3 and out["n_comparisons"] == 3
    assert out["ci_method"] == "bootstrap" and out["bootstrap_rounds"] == 20
    assert out["ci_bootstrapped"] == [True, True, True]
    auto = json.loads(json.dumps(fit_bradley_terry([(0, 1, 1.0)]).to_dict(), allow_nan=False))
    assert auto["ci_method"] == "auto" and auto["ci_bootstrapped"] == [False, False] and auto["bootstrap_rounds"] == 0
    no_ci = fit_bradley_terry([(0, 1, 1.0)], ci=None).to_dict()
    assert no_ci["ci_low"] == [None, None]


def test_fit_is_read_only():
    fit = fit_bradley_terry([(0, 1, 1.0)], ci=None)
    assert isinstance(fit, BTFit)
    with pytest.raises(ValueError):
        fit.strengths[0] = 5.0
    with pytest.raises(AttributeError):
        fit.converged = False  # type: ignore[misc]


def test_too_few_iterations_is_reported_not_hidden():
    _, comparisons = synthetic(10, 1_000, seed=10)
    fit = fit_bradley_terry(comparisons, ci=None, max_iter=1)
    assert not fit.converged and fit.iterations == 1


# --------------------------------------------------------------------------- input


def test_comparisons_from_winners_builds_the_rows():
    rows = comparisons_from_winners([2, 0, 1], [0, 1, 2], tied=[False, True, False])
    np.testing.assert_array_equal(rows, [[2, 0, 1.0], [0, 1, 0.5], [1, 2, 1.0]])
    assert np.array_equal(fit_bradley_terry(rows, ci=None).strengths,
                          fit_bradley_terry([(2, 0, 1), (1, 0, 0.5), (2, 1, 0)], ci=None).strengths)
    with pytest.raises(ConfigError):
        comparisons_from_winners([0, 1], [1])


@pytest.mark.parametrize(("rows", "options", "message"), [
    ([(0, 1)], {}, "shape"),
    ([(0, 0, 1.0)], {}, "itself"),
    ([(0, 1, 0.3)], {}, "outcome"),
    ([(0, 1, np.nan)], {}, "outcome"),
    ([(-1, 1, 1.0)], {}, ">= 0"),
    ([(0.5, 1, 1.0)], {}, "whole"),
    ([(0, 3, 1.0)], {"n_items": 3}, "out of range"),
    ([(0, 1, 1.0)], {"alpha": 1.0}, "alpha"),
    ([(0, 1, 1.0)], {"prior": -0.1}, "prior"),
    ([(0, 1, 1.0)], {"ci": "wald"}, "ci"),
    ([(0, 1, 1.0)], {"method": "lbfgs"}, "method"),
    ([(0, 1, 1.0)], {"bootstrap_rounds": 0}, "bootstrap_rounds"),
    ([(0, 1, 1.0), (1, 0, 1.0)], {"prior": 0.0, "ci": "bootstrap"}, "bootstrapped"),
    ([(0, 1, 1.0)], {"min_bootstrap_comparisons": 0}, "min_bootstrap_comparisons"),
])
def test_rejects_malformed_input(rows, options, message):
    with pytest.raises(ConfigError, match=message):
        fit_bradley_terry(rows, **options)
