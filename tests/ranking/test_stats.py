"""Ranking statistics, against independent references (statsmodels, scipy, exact integers) and by properties."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import proportion_confint

from factory.errors import ConfigError
from factory.ranking import (
    PowerPolicy,
    _stats,  # its pass@k grid limit, patched to check both code paths
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

TOL = 1e-9
FAST = settings(max_examples=150, deadline=None)

alphas = st.sampled_from([0.001, 0.01, 0.05, 0.1, 0.2, 0.5])


@st.composite
def k_of_n(draw, max_n: int = 500) -> tuple[int, int]:
    n = draw(st.integers(1, max_n))
    return draw(st.integers(0, n)), n


# --------------------------------------------------------------------------- Wilson


@pytest.mark.parametrize("alpha", [0.001, 0.01, 0.05, 0.1, 0.32])
def test_wilson_matches_statsmodels(alpha):
    n = np.repeat(np.arange(1, 61), 61)
    k = np.tile(np.arange(61), 60)
    keep = k <= n
    k, n = k[keep], n[keep]
    low, high = wilson_interval(k, n, alpha)
    ref_low, ref_high = proportion_confint(k, n, alpha=alpha, method="wilson")
    np.testing.assert_allclose(low, ref_low, rtol=0, atol=TOL)
    np.testing.assert_allclose(high, ref_high, rtol=0, atol=TOL)
    np.testing.assert_allclose(wilson_half_width(k, n, alpha), (ref_high - ref_low) / 2, rtol=0, atol=TOL)


def test_wilson_scalars_give_floats_and_empty_sample_gives_unit_interval():
    low, high = wilson_interval(7, 20)
    assert type(low) is float and type(high) is float
    ref = proportion_confint(7, 20, alpha=0.05, method="wilson")
    assert low == pytest.approx(ref[0], abs=TOL) and high == pytest.approx(ref[1], abs=TOL)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval([0, 3], [0, 10])
    assert isinstance(low, np.ndarray) and (low[0], high[0]) == (0.0, 1.0)
    assert wilson_half_width(0, 0) == 0.5


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5, float("nan"), "x"])
def test_wilson_rejects_alpha_outside_unit_interval(alpha):
    with pytest.raises(ConfigError, match="alpha"):
        wilson_interval(3, 10, alpha)


@pytest.mark.parametrize(("k", "n"), [(-1, 10), (11, 10), (3, -1)])
def test_wilson_rejects_impossible_counts(k, n):
    with pytest.raises(ConfigError):
        wilson_interval(k, n)


@FAST
@given(k_of_n(), alphas)
def test_wilson_contains_rate_and_lies_in_unit_interval(kn, alpha):
    k, n = kn
    low, high = wilson_interval(k, n, alpha)
    assert 0.0 <= low <= k / n <= high <= 1.0


@FAST
@given(k_of_n(), alphas, alphas)
def test_wilson_is_wider_at_higher_confidence(kn, alpha_1, alpha_2):
    k, n = kn
    strict, loose = sorted((alpha_1, alpha_2))
    low_strict, high_strict = wilson_interval(k, n, strict)
    low_loose, high_loose = wilson_interval(k, n, loose)
    assert low_strict <= low_loose + TOL and high_strict >= high_loose - TOL
    assert wilson_half_width(k, n, strict) >= wilson_half_width(k, n, loose) - TOL


# --------------------------------------------------------------------------- McNemar


def test_mcnemar_matches_statsmodels_and_binomtest():
    b, c = np.meshgrid(np.arange(41), np.arange(41), indexing="ij")
    b, c = b.ravel(), c.ravel()
    ours = mcnemar_exact_many(b, c, n=np.full(b.shape, 80))
    for bi, ci, p in zip(b.tolist(), c.tolist(), ours.tolist()):
        table = [[10, bi], [ci, 10]]
        assert p == pytest.approx(sm_mcnemar(table, exact=True).pvalue, abs=TOL)
        expected = 1.0 if bi + ci == 0 else stats.binomtest(bi, bi + ci, 0.5).pvalue
        assert p == pytest.approx(expected, abs=TOL)
        assert mcnemar_exact(bi, ci, 80) == pytest.approx(expected, abs=TOL)


def test_mcnemar_large_counts_match_binomtest():
    for b, c in [(480, 520), (300, 700), (1000, 1003), (5, 2000)]:
        assert mcnemar_exact(b, c) == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue, abs=TOL)


def test_mcnemar_is_none_below_four_paired_items_and_one_without_discordance():
    assert mcnemar_exact(0, 3) is None  # n defaults to b + c
    assert mcnemar_exact(1, 1, n=3) is None
    assert mcnemar_exact(0, 3, n=4) == pytest.approx(0.25)
    assert mcnemar_exact(0, 0, n=4) == 1.0
    assert mcnemar_exact(0, 0, n=200) == 1.0
    many = mcnemar_exact_many([0, 0, 2], [3, 3, 2], n=[3, 10, 4])
    assert math.isnan(many[0]) and many[1] == pytest.approx(0.25) and many[2] == 1.0


@pytest.mark.parametrize(("b", "c", "n"), [(-1, 2, None), (1.5, 2, None), (3, 4, 6)])
def test_mcnemar_rejects_impossible_counts(b, c, n):
    with pytest.raises(ConfigError):
        mcnemar_exact(b, c, n)


@FAST
@given(st.integers(0, 3000), st.integers(0, 3000), st.integers(0, 100))
def test_mcnemar_is_symmetric_and_a_probability(b, c, concordant):
    n = b + c + concordant
    p = mcnemar_exact(b, c, n)
    assert p == mcnemar_exact(c, b, n)
    if n < 4:
        assert p is None
    else:
        assert 0.0 <= p <= 1.0


# --------------------------------------------------------------------------- pass@k


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def _pass_at_k_grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = [(n, c, k) for n in range(1, 41) for c in range(n + 1) for k in range(1, n + 1)]
    rows += [(200, c, k) for c in (0, 1, 2, 50, 150, 199, 200) for k in (1, 2, 10, 100, 199, 200)]
    n, c, k = (np.array(column) for column in zip(*rows))
    return n, c, k


@pytest.mark.parametrize("grid_limit", [_stats._PASS_AT_K_GRID_LIMIT, 0], ids=["product", "log-gamma"])
def test_pass_at_k_matches_exact_integers(monkeypatch, grid_limit):
    monkeypatch.setattr(_stats, "_PASS_AT_K_GRID_LIMIT", grid_limit)
    n, c, k = _pass_at_k_grid()
    ours = pass_at_k(n, c, k)
    expected = np.array([brute_pass_at_k(*row) for row in zip(n.tolist(), c.tolist(), k.tolist())])
    np.testing.assert_allclose(ours, expected, rtol=0, atol=TOL)


def test_pass_at_k_scalars_edges_and_large_n():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert type(pass_at_k(10, 3, 1)) is float
    assert pass_at_k(10, 0, 5) == 0.0 and math.copysign(1.0, pass_at_k(10, 0, 5)) == 1.0
    assert pass_at_k(10, 8, 5) == 1.0  # n - c < k
    assert pass_at_k(10, 10, 1) == 1.0
    # Binomials this large overflow floats; the product form does not.
    assert pass_at_k(100_000, 3, 1000) == pytest.approx(brute_pass_at_k(100_000, 3, 1000), rel=1e-12)
    # A tiny pass@k keeps its relative precision.
    assert pass_at_k(10_000, 1, 1) == pytest.approx(1e-4, rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(10, 11, 1), (10, 3, 0), (10, 3, 11), (10, -1, 1), (10, 2.5, 1)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ConfigError):
        pass_at_k(n, c, k)


@FAST
@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_non_decreasing_in_k_and_c(args):
    n, c, k = args
    value = pass_at_k(n, c, k)
    assert 0.0 <= value <= 1.0
    if k < n:
        assert pass_at_k(n, c, k + 1) >= value - 1e-12
    if c < n:
        assert pass_at_k(n, c + 1, k) >= value - 1e-12


# --------------------------------------------------------------------------- sample size and detectable difference


def connor_reference(delta: float, psi: float, alpha: float, power: float) -> int:
    """Connor (1987) re-derived: the least n whose normal-approximation power reaches the target."""
    z_a, z_b = stats.norm.isf(alpha / 2), stats.norm.ppf(power)
    psi = max(psi, delta)
    exact = (z_a * math.sqrt(psi) + z_b * math.sqrt(psi - delta**2)) ** 2 / delta**2
    return math.ceil(exact - 1e-9)


def mcnemar_normal_power(n: float, delta: float, psi: float, alpha: float) -> float:
    """Power of the normal-approximation McNemar test: Φ((δ√n − z_α√ψ) / √(ψ − δ²))."""
    z_a = stats.norm.isf(alpha / 2)
    psi = max(psi, delta)
    return float(stats.norm.cdf((delta * math.sqrt(n) - z_a * math.sqrt(psi)) / math.sqrt(psi - delta**2)))


@pytest.mark.parametrize("alpha", [0.01, 0.05, 0.1])
@pytest.mark.parametrize("power", [0.5, 0.8, 0.9])
@pytest.mark.parametrize("delta_pp", [1, 5, 12.5, 30, 60])
@pytest.mark.parametrize("psi", [0.0, 0.03, 0.1, 0.4, 0.9])
def test_paired_sample_size_matches_connor_and_round_trips(alpha, power, delta_pp, psi):
    delta = delta_pp / 100
    n = paired_sample_size(delta_pp, p_discordant=psi, alpha=alpha, power=power)
    assert n == connor_reference(delta, psi, alpha, power)
    # Plugging n back in detects δ; one task fewer does not (unless n is already the floor of 1).
    mdd = min_detectable_delta_pp(n, 0.5, alpha=alpha, power=power, discordant=psi)
    assert mdd <= delta_pp * (1 + TOL)
    if n > 1 and delta < 1:
        assert min_detectable_delta_pp(n - 1, 0.5, alpha=alpha, power=power, discordant=psi) > delta_pp * (1 - TOL)


@FAST
@given(
    st.integers(4, 5000),
    st.floats(0.0, 1.0),
    st.sampled_from([0.01, 0.05, 0.1]),
    st.sampled_from([0.5, 0.8, 0.95]),
)
def test_min_detectable_delta_has_the_stated_power(n, psi, alpha, power):
    mdd = min_detectable_delta_pp(n, 0.5, alpha=alpha, power=power, discordant=psi)
    if math.isinf(mdd):
        assert n < stats.norm.isf(alpha / 2) ** 2
        return
    delta = mdd / 100
    assert 0 < delta <= 1
    if delta < 1:
        assert mcnemar_normal_power(n, delta, psi, alpha) == pytest.approx(power, abs=1e-9)


def test_sample_size_from_rates_uses_independent_discordance():
    p_a, p_b = 0.7, 0.75
    psi = p_a * (1 - p_b) + p_b * (1 - p_a)
    assert paired_sample_size(5, p_a=p_a, p_b=p_b) == connor_reference(0.05, psi, 0.05, 0.8)
    assert paired_sample_size(5, p_a=0.6) == connor_reference(0.05, 2 * 0.6 * 0.4, 0.05, 0.8)
    assert paired_sample_size(5) == connor_reference(0.05, 0.5, 0.05, 0.8)
    assert min_detectable_delta_pp(500, p_a, p_b) == pytest.approx(
        min_detectable_delta_pp(500, 0.0, discordant=psi), rel=1e-12
    )


@pytest.mark.parametrize("alpha", [0.01, 0.05])
@pytest.mark.parametrize(("p_a", "p_b"), [(0.5, 0.5), (0.3, 0.6), (0.9, 0.8)])
@pytest.mark.parametrize("n", [30, 100, 1000])
def test_unpaired_min_detectable_delta_matches_statsmodels(alpha, p_a, p_b, n):
    variance = p_a * (1 - p_a) + p_b * (1 - p_b)
    # Equal-variance two-sample z-test: Var(difference) = 2σ²/n with σ² = v/2.
    effect = NormalIndPower().solve_power(nobs1=n, alpha=alpha, power=0.8, ratio=1.0)
    expected = 100 * effect * math.sqrt(variance / 2)
    ours = min_detectable_delta_pp(n, p_a, p_b, alpha=alpha, paired=False)
    # statsmodels also counts the far rejection tail, which moves δ by < 1e-5 relative here.
    assert ours == pytest.approx(expected, rel=1e-5)


def test_min_detectable_delta_is_not_zero_for_rates_at_the_edges():
    assert min_detectable_delta_pp(100, 0.0, 0.0) > 0
    assert min_detectable_delta_pp(100, 1.0, discordant=0.0) > 0
    assert min_detectable_delta_pp(100, 0.0, 1.0, paired=False) > 0
    assert math.isinf(min_detectable_delta_pp(0, 0.5))
    assert math.isinf(min_detectable_delta_pp(3, 0.5))


def test_min_detectable_delta_vectorizes_over_n():
    n = np.array([10, 100, 1000])
    many = min_detectable_delta_pp(n, 0.6, 0.7, discordant=0.2)
    assert isinstance(many, np.ndarray)
    np.testing.assert_allclose(many, [min_detectable_delta_pp(int(x), 0.6, 0.7, discordant=0.2) for x in n])
    assert type(min_detectable_delta_pp(10, 0.6)) is float


@pytest.mark.parametrize(
    "kwargs",
    [{"alpha": 0.0}, {"alpha": 1.0}, {"power": 1.0}, {"power": 0.3}, {"paired": False, "discordant": 0.2}],
)
def test_min_detectable_delta_rejects_bad_arguments(kwargs):
    with pytest.raises(ConfigError):
        min_detectable_delta_pp(100, 0.5, **kwargs)


@pytest.mark.parametrize("delta_pp", [0, -5, 101])
def test_paired_sample_size_rejects_impossible_differences(delta_pp):
    with pytest.raises(ConfigError, match="delta_pp"):
        paired_sample_size(delta_pp)


@FAST
@given(
    st.integers(0, 3000),
    st.integers(1, 3000),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.one_of(st.none(), st.floats(0.0, 1.0)),
    st.booleans(),
)
def test_min_detectable_delta_decreases_with_n(n, extra, p_a, p_b, discordant, paired):
    if not paired:
        discordant = None
    smaller = min_detectable_delta_pp(n, p_a, p_b, paired=paired, discordant=discordant)
    larger = min_detectable_delta_pp(n + extra, p_a, p_b, paired=paired, discordant=discordant)
    assert larger <= smaller * (1 + 1e-12)
    assert 0 < larger <= 100 or math.isinf(larger)


# --------------------------------------------------------------------------- powered


@FAST
@given(st.integers(0, 200), st.integers(0, 200), st.floats(1.0, 60.0))
def test_powered_is_false_below_min_n(n, min_n, max_half_width_pp):
    if n < min_n:
        assert powered(n, min_n=min_n, max_half_width_pp=max_half_width_pp) is False
        assert powered(n, n // 3, min_n=min_n, max_half_width_pp=max_half_width_pp) is False


def test_powered_follows_the_half_width_rule():
    # Worst case p = 0.5 at n = 10: half-width 26.3 pp, so the defaults pass it.
    assert wilson_half_width(5, 10) * 100 == pytest.approx(26.3, abs=0.05)
    assert powered(10) is True
    assert powered(9) is False
    assert powered(10, max_half_width_pp=26.0) is False
    assert powered(10, 0, max_half_width_pp=26.0) is True  # 0 of 10 is a much tighter interval
    assert powered(50, 25, max_half_width_pp=30.0) is True
    assert list(powered(np.array([5, 10, 40]), np.array([2, 5, 20]))) == [False, True, True]
    policy = PowerPolicy(min_n=20, max_half_width_pp=15.0)
    assert not policy.is_powered(20, 10) and policy.is_powered(60, 30)


@pytest.mark.parametrize(
    "kwargs", [{"min_n": -1}, {"min_n": 2.5}, {"max_half_width_pp": 0}, {"alpha": 0.0}, {"alpha": 1.2}]
)
def test_power_policy_rejects_bad_settings(kwargs):
    with pytest.raises(ConfigError):
        PowerPolicy(**kwargs)


# --------------------------------------------------------------------------- compare_paired


def arms(both: int, only_a: int, only_b: int, neither: int) -> tuple[list[bool], list[bool]]:
    a = [True] * both + [True] * only_a + [False] * only_b + [False] * neither
    b = [True] * both + [False] * only_a + [True] * only_b + [False] * neither
    return a, b


def test_compare_paired_powered_and_significant():
    a, b = arms(both=20, only_a=1, only_b=13, neither=16)
    report = compare_paired(a, b)
    assert (report.n, report.k_a, report.k_b, report.b, report.c) == (50, 21, 33, 1, 13)
    assert report.p_value == pytest.approx(stats.binomtest(1, 14).pvalue, abs=TOL)
    assert report.delta_pp == pytest.approx(24.0)
    assert report.powered and report.significant and report.evidence
    assert report.verdict == f"powered and significant: arm B passes 24.0 pp more (p={report.p_value:.3g})"
    assert report.verdict == "powered and significant: arm B passes 24.0 pp more (p=0.00183)"
    assert report.ci_a == pytest.approx(proportion_confint(21, 50, method="wilson"), abs=TOL)
    assert report.min_detectable_delta_pp == pytest.approx(
        min_detectable_delta_pp(50, 21 / 50, 33 / 50, discordant=14 / 50)
    )
    assert report.min_detectable_delta_pp < 24.0


def test_compare_paired_names_arm_a_when_it_is_ahead():
    a, b = arms(both=20, only_a=13, only_b=1, neither=16)
    assert compare_paired(a, b).verdict.startswith("powered and significant: arm A passes 24.0 pp more")


def test_compare_paired_not_powered_with_few_tasks():
    a, b = arms(both=2, only_a=0, only_b=2, neither=2)
    report = compare_paired(a, b, target_delta_pp=5)
    needed = paired_sample_size(5, p_discordant=2 / 6)
    assert needed > 10
    assert not report.powered and not report.evidence
    assert report.tasks_needed == needed
    assert (
        report.verdict == f"not powered (6 tasks, fewer than 10): about {needed - 6} more tasks needed to detect 5 pp"
    )


def test_compare_paired_not_powered_by_a_wide_interval():
    a, b = arms(both=10, only_a=3, only_b=4, neither=13)
    report = compare_paired(a, b, policy=PowerPolicy(max_half_width_pp=15.0), target_delta_pp=40)
    half_pp = 100 * wilson_half_width(14, 30)
    assert not report.powered
    assert report.verdict == (
        f"not powered (Wilson half-width {half_pp:.1f} pp, limit 15 pp): "
        f"about {report.tasks_needed - 30} more tasks needed to detect 40 pp"
    )
    # Sized by the interval rule here: the least n at which both observed rates are tight enough.
    needed = report.tasks_needed
    assert needed > paired_sample_size(40, p_discordant=7 / 30)
    assert all(wilson_half_width(needed * k / 30, needed) * 100 < 15.0 for k in (13, 14))
    assert wilson_half_width((needed - 1) * 14 / 30, needed - 1) * 100 >= 15.0


def test_compare_paired_powered_but_not_significant():
    a, b = arms(both=30, only_a=4, only_b=6, neither=20)
    report = compare_paired(a, b)
    assert report.powered and not report.significant and not report.evidence
    assert report.delta_pp == pytest.approx(2 / 60 * 100)
    needed = paired_sample_size(report.delta_pp, p_discordant=10 / 60)
    assert report.target_delta_pp == pytest.approx(report.delta_pp)
    assert report.verdict == (
        f"powered but not significant: arm B passes 3.3 pp more (p={report.p_value:.3g}); "
        f"about {needed - 60} more tasks needed to detect 3.3 pp"
    )


def test_compare_paired_identical_arms():
    a, _ = arms(both=12, only_a=0, only_b=0, neither=8)
    report = compare_paired(a, a)
    assert report.p_value == 1.0 and report.delta_pp == 0.0 and report.target_delta_pp == 5.0
    assert report.verdict.startswith("powered but not significant: both arms pass at the same rate (p=1); about ")


def test_compare_paired_report_is_json_ready_and_validates_input():
    a, b = arms(both=1, only_a=0, only_b=1, neither=0)
    data = compare_paired(a, b).to_dict()
    assert json.loads(json.dumps(data, allow_nan=False)) == data
    assert data["p_value"] is None and data["min_detectable_delta_pp"] is None and data["powered"] is False
    empty = compare_paired([], [])
    assert empty.rate_a is None and empty.ci_a == (0.0, 1.0) and not empty.powered
    with pytest.raises(ConfigError, match="length"):
        compare_paired([True, False], [True])
    with pytest.raises(ConfigError, match="booleans"):
        compare_paired(["False", "True"], [True, True])
    with pytest.raises(ConfigError, match="alpha"):
        compare_paired(a, b, alpha=1.0)
