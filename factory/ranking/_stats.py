"""Statistics that decide whether a comparison is evidence: Wilson, McNemar, power, pass@k.

The definitions are the contract of DESIGN.md ("Statistics"):

- **Wilson score interval** for k of n at confidence 1 − α.
- **McNemar exact test** for two arms run on the same items: ``b`` items where
  arm A passed and arm B failed, ``c`` where A failed and B passed; p is the
  two-sided exact binomial test of b in b + c at ½ (p = 1 when b + c = 0),
  reported as ``None`` when fewer than 4 items are paired.
- **Minimum detectable difference** (percentage points): the smallest true
  difference in pass rate a two-sided test at α detects with the given power
  (defaults 0.05 and 80 %), for n items and the observed rates; see
  :func:`min_detectable_delta_pp` for the approximation.
- **powered**: false when n < 10 or the Wilson half-width ≥ 30 pp (defaults,
  configurable through :class:`PowerPolicy`). A comparison is evidence only
  when it is powered and p < α.
- **pass@k**: the unbiased estimator 1 − C(n−c, k) / C(n, k).

Units: rates and probabilities are fractions in [0, 1]; every name ending in
``_pp`` is in percentage points (0–100). Array functions broadcast their
arguments and return floats for scalar input, arrays for array input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

# scipy.special rather than scipy.stats: it gives the same normal quantiles and
# binomial tails and imports in a fraction of the time.
from scipy import special

from factory.errors import ConfigError

__all__ = [
    "PowerPolicy",
    "PowerReport",
    "compare_paired",
    "mcnemar_exact",
    "mcnemar_exact_many",
    "min_detectable_delta_pp",
    "paired_sample_size",
    "pass_at_k",
    "powered",
    "wilson_half_width",
    "wilson_interval",
]

# Items paired below which the McNemar p-value is reported as None (DESIGN.md).
MCNEMAR_MIN_PAIRED = 4

# Above this many cells, pass_at_k's padded product grid would cost more memory
# than it is worth; the log-gamma form is used instead.
_PASS_AT_K_GRID_LIMIT = 1 << 22


# --------------------------------------------------------------------------- validation


def _check_level(value: float, name: str, low: float = 0.0) -> float:
    """A probability-like argument strictly inside (low, 1)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number in ({low:g}, 1), got {value!r}") from None
    if not (low < number < 1.0):
        raise ConfigError(f"{name} must be in ({low:g}, 1), got {value!r}")
    return number


def _check_power(power: float) -> float:
    # Below 50 % power the normal-approximation solutions below pick the wrong
    # root, and no one plans for a test that misses more often than it hits.
    number = _check_level(power, "power")
    if number < 0.5:
        raise ConfigError(f"power must be in [0.5, 1), got {power!r}")
    return number


def _as_float(values: ArrayLike, name: str) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be numeric, got {values!r}") from None
    if not np.all(np.isfinite(array)):
        raise ConfigError(f"{name} must be finite, got {values!r}")
    return array


def _as_rate(values: ArrayLike, name: str) -> np.ndarray:
    array = _as_float(values, name)
    if np.any((array < 0) | (array > 1)):
        raise ConfigError(f"{name} must be a rate in [0, 1], got {values!r}")
    return array


def _as_count(values: ArrayLike, name: str) -> np.ndarray:
    array = _as_float(values, name)
    if np.any(array < 0) or np.any(array != np.floor(array)):
        raise ConfigError(f"{name} must be a non-negative integer count, got {values!r}")
    return array.astype(np.int64)


def _counts_k_of_n(k: ArrayLike, n: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    # Wilson is defined for any 0 <= k <= n, not only whole k: the worst-case
    # half-width uses k = n / 2.
    k_arr, n_arr = np.broadcast_arrays(_as_float(k, "k"), _as_float(n, "n"))
    if np.any(n_arr < 0):
        raise ConfigError(f"n must be >= 0, got {n!r}")
    if np.any((k_arr < 0) | (k_arr > n_arr)):
        raise ConfigError(f"k must be in [0, n], got k={k!r}, n={n!r}")
    return k_arr, n_arr


def _scalar_or_array(result: np.ndarray, *inputs: Any) -> Any:
    if all(np.ndim(x) == 0 for x in inputs):
        return float(result)
    return result


def _z_two_sided(alpha: float) -> float:
    # -ndtri(α/2) rather than ndtri(1 - α/2): no cancellation for small α.
    return float(-special.ndtri(alpha / 2.0))


# --------------------------------------------------------------------------- Wilson


def _wilson_parts(k: np.ndarray, n: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Centre and half-width of the Wilson interval; (0.5, 0.5) where n == 0."""
    z = _z_two_sided(alpha)
    z2 = z * z
    with np.errstate(divide="ignore", invalid="ignore"):
        p_hat = k / n
        denom = 1.0 + z2 / n
        centre = (p_hat + z2 / (2.0 * n)) / denom
        half = z * np.sqrt(p_hat * (1.0 - p_hat) / n + z2 / (4.0 * n * n)) / denom
    empty = n == 0
    return np.where(empty, 0.5, centre), np.where(empty, 0.5, half)


def wilson_interval(k: ArrayLike, n: ArrayLike, alpha: float = 0.05) -> tuple[Any, Any]:
    """Wilson score interval for k successes in n trials at confidence 1 − α.

    With z = Φ⁻¹(1 − α/2) and p̂ = k/n::

        centre = (p̂ + z²/2n) / (1 + z²/n)
        half   = z / (1 + z²/n) · sqrt(p̂(1 − p̂)/n + z²/4n²)

    The interval is ``centre ± half``, which always lies in [0, 1] and contains
    p̂; its ends are set exactly to 0 when k = 0 and to 1 when k = n, so that
    rounding cannot push p̂ outside it.

    Args:
        k: Successes; any value in [0, n] (scalar or array).
        n: Trials, >= 0 (scalar or array, broadcast with ``k``).
        alpha: 1 − confidence, in (0, 1).

    Returns:
        ``(low, high)``: floats for scalar input, arrays otherwise. ``(0, 1)``
        where n == 0: no trials, no information.

    Raises:
        ConfigError: alpha outside (0, 1), n < 0, or k outside [0, n].
    """
    alpha = _check_level(alpha, "alpha")
    k_arr, n_arr = _counts_k_of_n(k, n)
    centre, half = _wilson_parts(k_arr, n_arr, alpha)
    empty = n_arr == 0
    low = np.where(empty | (k_arr == 0), 0.0, np.clip(centre - half, 0.0, 1.0))
    high = np.where(empty | (k_arr == n_arr), 1.0, np.clip(centre + half, 0.0, 1.0))
    return _scalar_or_array(low, k, n), _scalar_or_array(high, k, n)


def wilson_half_width(k: ArrayLike, n: ArrayLike, alpha: float = 0.05) -> Any:
    """Half the width of the Wilson interval, as a fraction (not percentage points).

    Args:
        k: Successes in [0, n].
        n: Trials, >= 0.
        alpha: 1 − confidence, in (0, 1).

    Returns:
        ``(high − low) / 2`` of :func:`wilson_interval`; 0.5 where n == 0.
        A float for scalar input, an array otherwise.

    Raises:
        ConfigError: As for :func:`wilson_interval`.
    """
    alpha = _check_level(alpha, "alpha")
    k_arr, n_arr = _counts_k_of_n(k, n)
    _, half = _wilson_parts(k_arr, n_arr, alpha)
    return _scalar_or_array(half, k, n)


def _wilson_min_n(rate: np.ndarray, max_half_width: float, alpha: float) -> np.ndarray:
    """Smallest whole n whose Wilson half-width at ``rate`` is below ``max_half_width``.

    The half-width z·sqrt(pq·n + z²/4) / (n + z²) falls strictly as n grows, so
    the answer is one more than the larger root of h²(n + z²)² = z²(pq·n + z²/4).
    """
    z2 = _z_two_sided(alpha) ** 2
    h2 = max_half_width**2
    pq = rate * (1.0 - rate)
    lin = 2.0 * h2 * z2 - z2 * pq
    const = h2 * z2 * z2 - z2 * z2 / 4.0
    root = (-lin + np.sqrt(np.maximum(lin * lin - 4.0 * h2 * const, 0.0))) / (2.0 * h2)
    return np.maximum(np.floor(root) + 1.0, 1.0).astype(np.int64)


# --------------------------------------------------------------------------- McNemar


def mcnemar_exact_many(b: ArrayLike, c: ArrayLike, n: ArrayLike | None = None) -> np.ndarray:
    """Exact McNemar p-values for many paired comparisons at once.

    Args:
        b: Items where arm A passed and arm B failed (non-negative integers).
        c: Items where arm A failed and arm B passed (broadcast with ``b``).
        n: Items paired (concordant ones included), >= b + c; defaults to b + c.

    Returns:
        A float array of two-sided p-values, ``min(1, 2·P(X ≤ min(b, c)))`` for
        X ~ Binomial(b + c, ½) — the p-value ``scipy.stats.binomtest`` gives, as
        the distribution is symmetric; 1 where b + c = 0; NaN where n < 4.

    Raises:
        ConfigError: A negative or fractional count, or n < b + c.
    """
    b_arr, c_arr = _as_count(b, "b"), _as_count(c, "c")
    if n is None:
        b_arr, c_arr = np.broadcast_arrays(b_arr, c_arr)
        paired = b_arr + c_arr
    else:
        b_arr, c_arr, paired = np.broadcast_arrays(b_arr, c_arr, _as_count(n, "n"))
    discordant = b_arr + c_arr
    if np.any(paired < discordant):
        raise ConfigError(f"n (items paired) must be >= b + c, got n={n!r}, b={b!r}, c={c!r}")
    tail = special.bdtr(np.minimum(b_arr, c_arr), np.maximum(discordant, 1), 0.5)
    p_value = np.where(discordant == 0, 1.0, np.minimum(1.0, 2.0 * tail))
    return np.where(paired < MCNEMAR_MIN_PAIRED, np.nan, p_value).astype(float)


def mcnemar_exact(b: int, c: int, n: int | None = None) -> float | None:
    """Exact McNemar test of two arms run on the same items.

    Only the discordant items carry information: under the null hypothesis
    that both arms pass at the same rate, each is equally likely to favour
    either arm, so b ~ Binomial(b + c, ½).

    Args:
        b: Items where arm A passed and arm B failed.
        c: Items where arm A failed and arm B passed.
        n: Items paired, concordant ones included (>= b + c). Defaults to
            b + c, which is right only when no concordant items are known.

    Returns:
        The two-sided exact p-value ``min(1, 2·P(X ≤ min(b, c)))``, X ~
        Binomial(b + c, ½) (equal to ``scipy.stats.binomtest(b, b + c).pvalue``);
        1.0 when b + c = 0; None when n < 4, too few items to report.

    Raises:
        ConfigError: A negative or fractional count, or n < b + c.
    """
    if any(np.ndim(x) != 0 for x in (b, c, n)):
        raise ConfigError("mcnemar_exact takes scalar counts; use mcnemar_exact_many for arrays")
    p_value = float(mcnemar_exact_many(b, c, n))
    return None if math.isnan(p_value) else p_value


# --------------------------------------------------------------------------- power


def _independent_discordance(p_a: np.ndarray, p_b: np.ndarray) -> np.ndarray:
    """Discordance rate of two arms whose outcomes on an item are independent."""
    return p_a * (1.0 - p_b) + p_b * (1.0 - p_a)


def _connor_n(delta: np.ndarray, discordance: np.ndarray, z_alpha: float, z_beta: float) -> np.ndarray:
    """Connor (1987) paired sample size, with the discordance rate floored at δ."""
    # A true difference δ needs at least a fraction δ of discordant items, so
    # an observed rate below δ (even 0) cannot make the test look stronger.
    rate = np.maximum(discordance, delta)
    return (z_alpha * np.sqrt(rate) + z_beta * np.sqrt(rate - delta * delta)) ** 2 / (delta * delta)


def _connor_min_delta(n: np.ndarray, discordance: np.ndarray, z_alpha: float, z_beta: float) -> np.ndarray:
    """Inverse of :func:`_connor_n` in δ: the δ in (0, 1] where it equals n, inf if none.

    f(δ) = N(δ, max(ψ, δ)) falls strictly from +inf to f(1) = z_α², so each
    n >= z_α² has one solution. For δ <= ψ it is a root of a quadratic in δ;
    for δ > ψ (then ψ is replaced by δ) a quadratic in u = sqrt(1 − δ).
    """
    a2 = z_alpha * z_alpha
    b2 = z_beta * z_beta
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # δ·sqrt(n) = z_α·sqrt(ψ) + z_β·sqrt(ψ − δ²), squared and solved for δ.
        at_rate = (
            z_alpha * np.sqrt(discordance * n) + z_beta * np.sqrt(np.maximum(discordance * (n + b2 - a2), 0.0))
        ) / (n + b2)
        # δ·n = (z_α + z_β·u)² with δ = 1 − u², solved for u >= 0.
        u = (-z_alpha * z_beta + np.sqrt(np.maximum(n * (n + b2 - a2), 0.0))) / (n + b2)
        above_rate = 1.0 - u * u
        f_at_rate = (z_alpha + z_beta * np.sqrt(1.0 - discordance)) ** 2 / discordance
    delta = np.where((discordance > 0) & (f_at_rate <= n), at_rate, above_rate)
    return np.where(n < a2, np.inf, delta)


def min_detectable_delta_pp(
    n: ArrayLike,
    p_a: ArrayLike,
    p_b: ArrayLike | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
    paired: bool = True,
    discordant: ArrayLike | None = None,
) -> Any:
    """Smallest true pass-rate difference a two-sided test at α detects with the given power.

    Normal approximations, with z_α = Φ⁻¹(1 − α/2) and z_β = Φ⁻¹(power):

    - ``paired=True`` (McNemar; Connor 1987): with ψ the discordance rate, the
      δ solving ``n = (z_α·sqrt(ψ) + z_β·sqrt(ψ − δ²))² / δ²`` — the exact
      inverse of :func:`paired_sample_size`. ψ is ``discordant`` when given,
      else ``p_a(1 − p_b) + p_b(1 − p_a)``, the rate for arms that pass or fail
      independently of each other (variance of the difference = the sum of
      the p(1 − p) terms); arms that succeed on the same items disagree less,
      so without ``discordant`` the answer is an upper bound for them.
    - ``paired=False`` (two independent samples of n each, unpooled variance):
      ``δ = (z_α + z_β)·sqrt((p_a(1 − p_a) + p_b(1 − p_b)) / n)``.

    In both, the variance term is floored at the least any two true rates δ
    apart can have (ψ >= δ; p(1 − p) terms >= δ(1 − δ)), so rates observed at
    0 or 1 do not claim that any difference is detectable. The exact McNemar
    test is somewhat more conservative than its normal approximation at small
    b + c.

    Args:
        n: Items (paired) or items per arm (independent); >= 0.
        p_a: Observed pass rate of arm A, in [0, 1]. Unused when paired and
            ``discordant`` is given.
        p_b: Observed pass rate of arm B; defaults to ``p_a``.
        alpha: Two-sided significance level, in (0, 1).
        power: Probability of detecting the difference, in [0.5, 1).
        paired: Whether both arms ran on the same items.
        discordant: Fraction of paired items on which the arms disagree,
            (b + c) / n. Only with ``paired=True``.

    Returns:
        The difference in percentage points (0–100), decreasing as n grows;
        ``inf`` when no difference up to 100 pp is detectable (paired: n < z_α²,
        e.g. n <= 3 at α = 0.05; always at n = 0).
        A float for scalar input, an array otherwise.

    Raises:
        ConfigError: A level or rate out of range, n < 0, or ``discordant``
            with ``paired=False``.
    """
    alpha = _check_level(alpha, "alpha")
    power = _check_power(power)
    n_arr = _as_float(n, "n")
    if np.any(n_arr < 0):
        raise ConfigError(f"n must be >= 0, got {n!r}")
    rate_a = _as_rate(p_a, "p_a")
    rate_b = rate_a if p_b is None else _as_rate(p_b, "p_b")
    z_alpha = _z_two_sided(alpha)
    z_beta = float(special.ndtri(power))
    if paired:
        psi = _independent_discordance(rate_a, rate_b) if discordant is None else _as_rate(discordant, "discordant")
        n_b, psi_b = np.broadcast_arrays(n_arr, psi)
        delta = _connor_min_delta(n_b, psi_b, z_alpha, z_beta)
    else:
        if discordant is not None:
            raise ConfigError("discordant applies only to paired comparisons (paired=True)")
        z = z_alpha + z_beta
        variance = rate_a * (1.0 - rate_a) + rate_b * (1.0 - rate_b)
        with np.errstate(divide="ignore", invalid="ignore"):
            # δ >= z·sqrt(max(v, δ(1 − δ)) / n) holds exactly when δ clears both terms.
            delta = np.maximum(z * np.sqrt(variance / n_arr), z * z / (n_arr + z * z))
        delta = np.where((n_arr == 0) | (delta > 1.0), np.inf, delta)
    return _scalar_or_array(100.0 * delta, n, p_a, p_b, discordant)


def paired_sample_size(
    delta_pp: float,
    p_discordant: float | None = None,
    p_a: float | None = None,
    p_b: float | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
) -> int:
    """Paired items needed for a McNemar test to detect a pass-rate difference δ.

    Connor (1987), normal approximation to McNemar's test, with ψ the
    discordance rate, z_α = Φ⁻¹(1 − α/2) and z_β = Φ⁻¹(power)::

        n = ⌈ (z_α·sqrt(ψ) + z_β·sqrt(ψ − δ²))² / δ² ⌉

    ψ is raised to δ when smaller: a true difference δ needs at least a
    fraction δ of discordant items.

    Args:
        delta_pp: The difference to detect, percentage points in (0, 100].
        p_discordant: Expected fraction of items on which the arms disagree.
        p_a: Pass rate of arm A; used, with ``p_b``, when ``p_discordant`` is
            not given, as ψ = p_a(1 − p_b) + p_b(1 − p_a) (independent arms,
            an upper bound for arms that succeed on the same items).
        p_b: Pass rate of arm B; defaults to ``p_a``. With neither rate nor
            ``p_discordant``, ψ = 0.5 (both arms at 50 %, independent).
        alpha: Two-sided significance level, in (0, 1).
        power: Probability of detecting δ, in [0.5, 1).

    Returns:
        The number of paired items, >= 1.

    Raises:
        ConfigError: delta_pp outside (0, 100], or a level or rate out of range.
    """
    alpha = _check_level(alpha, "alpha")
    power = _check_power(power)
    try:
        delta = float(delta_pp) / 100.0
    except (TypeError, ValueError):
        raise ConfigError(f"delta_pp must be a number in (0, 100], got {delta_pp!r}") from None
    if not (0.0 < delta <= 1.0):
        raise ConfigError(f"delta_pp must be in (0, 100], got {delta_pp!r}")
    if p_discordant is not None:
        psi = float(_as_rate(p_discordant, "p_discordant"))
    elif p_a is not None or p_b is not None:
        rate_a = float(_as_rate(p_a if p_a is not None else p_b, "p_a"))
        rate_b = rate_a if p_b is None else float(_as_rate(p_b, "p_b"))
        psi = float(_independent_discordance(np.float64(rate_a), np.float64(rate_b)))
    else:
        psi = 0.5
    size = float(_connor_n(np.float64(delta), np.float64(psi), _z_two_sided(alpha), float(special.ndtri(power))))
    # A hair under the ceiling so that a size that is whole up to rounding stays whole.
    return max(1, math.ceil(size * (1.0 - 1e-12)))


def powered(
    n: ArrayLike,
    k: ArrayLike | None = None,
    alpha: float = 0.05,
    min_n: int = 10,
    max_half_width_pp: float = 30.0,
) -> Any:
    """Whether n trials are enough for a pass rate to mean something.

    Args:
        n: Trials (items).
        k: Successes; when None, the worst case p̂ = ½ (widest interval).
        alpha: 1 − confidence of the Wilson interval, in (0, 1).
        min_n: Fewest trials that can be powered.
        max_half_width_pp: Wilson half-widths at or above this many
            percentage points are not powered.

    Returns:
        False when n < min_n or the Wilson half-width at k/n is >= max_half_width_pp;
        True otherwise. A bool for scalar input, a bool array otherwise.

    Raises:
        ConfigError: alpha outside (0, 1), min_n < 0, max_half_width_pp <= 0,
            or counts out of range.
    """
    alpha = _check_level(alpha, "alpha")
    if min_n < 0:
        raise ConfigError(f"min_n must be >= 0, got {min_n!r}")
    if not max_half_width_pp > 0:
        raise ConfigError(f"max_half_width_pp must be > 0, got {max_half_width_pp!r}")
    n_arr = _as_float(n, "n")
    successes = n_arr / 2.0 if k is None else k
    half_pp = 100.0 * np.asarray(wilson_half_width(successes, n_arr, alpha))
    result = (n_arr >= min_n) & (half_pp < max_half_width_pp)
    if np.ndim(n) == 0 and np.ndim(k) == 0:
        return bool(result)
    return result


@dataclass(frozen=True)
class PowerPolicy:
    """When a sample is large enough to count as evidence (DESIGN.md defaults).

    Attributes:
        min_n: Fewest items that can be powered.
        max_half_width_pp: Wilson half-width, in percentage points, at or above
            which a pass rate is not powered.
        alpha: 1 − confidence of the Wilson interval the half-width is taken from.
    """

    min_n: int = 10
    max_half_width_pp: float = 30.0
    alpha: float = 0.05

    def __post_init__(self) -> None:
        if isinstance(self.min_n, bool) or not isinstance(self.min_n, int) or self.min_n < 0:
            raise ConfigError(f"min_n must be an integer >= 0, got {self.min_n!r}")
        if not (0.0 < float(self.max_half_width_pp) <= 100.0):
            raise ConfigError(f"max_half_width_pp must be in (0, 100], got {self.max_half_width_pp!r}")
        _check_level(self.alpha, "alpha")

    def is_powered(self, n: ArrayLike, k: ArrayLike | None = None) -> Any:
        """:func:`powered` under this policy."""
        return powered(n, k, alpha=self.alpha, min_n=self.min_n, max_half_width_pp=self.max_half_width_pp)


# --------------------------------------------------------------------------- pass@k


def pass_at_k(n: ArrayLike, c: ArrayLike, k: ArrayLike) -> Any:
    """Unbiased pass@k estimate from n samples of which c passed: 1 − C(n−c, k) / C(n, k).

    Computed as a product, never as binomials (which overflow): the ratio is
    ∏_{j<c} (1 − k/(n − j)) = ∏_{j<k} (1 − c/(n − j)); the shorter product is
    summed in log space with log1p and the result taken with expm1, so small
    pass@k values keep their relative precision. Very long products fall back
    to the same ratio through log-gamma.

    Args:
        n: Samples drawn per task, >= 1.
        c: Samples that passed, in [0, n].
        k: Samples allowed, in [1, n].

    Returns:
        pass@k in [0, 1] (1 when n − c < k): a float for scalar input, an
        array (broadcast over n, c, k) otherwise.

    Raises:
        ConfigError: Non-integer counts, c outside [0, n], or k outside [1, n].
    """
    n_arr, c_arr, k_arr = np.broadcast_arrays(_as_count(n, "n"), _as_count(c, "c"), _as_count(k, "k"))
    if np.any(c_arr > n_arr):
        raise ConfigError(f"c must be in [0, n], got c={c!r}, n={n!r}")
    if np.any((k_arr < 1) | (k_arr > n_arr)):
        raise ConfigError(f"k must be in [1, n], got k={k!r}, n={n!r}")
    certain = n_arr - c_arr < k_arr
    # Where the answer is 1 the product would have a zero factor; give those
    # entries a harmless stand-in (c = 0) and overwrite them at the end.
    c_safe = np.where(certain, 0, c_arr)
    terms = np.minimum(c_safe, k_arr)
    other = np.maximum(c_safe, k_arr)
    longest = int(terms.max()) if terms.size else 0
    if terms.size * longest <= _PASS_AT_K_GRID_LIMIT:
        j = np.arange(longest)
        denom = n_arr[..., None] - j
        with np.errstate(divide="ignore", invalid="ignore"):
            factors = np.log1p(-other[..., None] / denom)
        log_ratio = np.where(j < terms[..., None], factors, 0.0).sum(axis=-1)
    else:
        log_ratio = (
            special.gammaln(n_arr - c_safe + 1)
            - special.gammaln(n_arr - c_safe - k_arr + 1)
            - special.gammaln(n_arr + 1)
            + special.gammaln(n_arr - k_arr + 1)
        )
    # 0.0 - x rather than -x: an all-fail task reads 0.0, not -0.0.
    result = np.where(certain, 1.0, 0.0 - np.expm1(log_ratio))
    return _scalar_or_array(result, n, c, k)


# --------------------------------------------------------------------------- paired comparison


@dataclass(frozen=True)
class PowerReport:
    """Two arms run on the same items, compared with the statistics of this module.

    Attributes:
        n: Items paired.
        k_a: Items arm A passed.
        k_b: Items arm B passed.
        rate_a: k_a / n, or None when n = 0.
        rate_b: k_b / n, or None when n = 0.
        ci_a: Wilson interval of arm A's pass rate at 1 − alpha.
        ci_b: Wilson interval of arm B's pass rate at 1 − alpha.
        b: Items where arm A passed and arm B failed.
        c: Items where arm A failed and arm B passed.
        p_value: Exact McNemar p-value, None when n < 4.
        delta_pp: rate_b − rate_a in percentage points (positive: B passes
            more), None when n = 0.
        min_detectable_delta_pp: Smallest true difference a test at alpha detects
            with 80 % power at this n and the observed discordance (see
            :func:`min_detectable_delta_pp`), None when none up to 100 pp is.
        powered: Both arms powered under the policy.
        significant: p_value < alpha.
        alpha: Significance level of the test and the intervals.
        target_delta_pp: The difference ``tasks_needed`` is sized for.
        tasks_needed: Paired items needed to be powered and to detect
            target_delta_pp with 80 % power (may be <= n).
        verdict: The conclusion in plain words.
    """

    n: int
    k_a: int
    k_b: int
    rate_a: float | None
    rate_b: float | None
    ci_a: tuple[float, float]
    ci_b: tuple[float, float]
    b: int
    c: int
    p_value: float | None
    delta_pp: float | None
    min_detectable_delta_pp: float | None
    powered: bool
    significant: bool
    alpha: float
    target_delta_pp: float
    tasks_needed: int
    verdict: str

    @property
    def evidence(self) -> bool:
        """Whether the comparison counts as evidence: powered and p < alpha."""
        return self.powered and self.significant

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (intervals as two-element lists), ``evidence`` included."""
        return {
            "n": self.n,
            "k_a": self.k_a,
            "k_b": self.k_b,
            "rate_a": self.rate_a,
            "rate_b": self.rate_b,
            "ci_a": list(self.ci_a),
            "ci_b": list(self.ci_b),
            "b": self.b,
            "c": self.c,
            "p_value": self.p_value,
            "delta_pp": self.delta_pp,
            "min_detectable_delta_pp": self.min_detectable_delta_pp,
            "powered": self.powered,
            "significant": self.significant,
            "evidence": self.evidence,
            "alpha": self.alpha,
            "target_delta_pp": self.target_delta_pp,
            "tasks_needed": self.tasks_needed,
            "verdict": self.verdict,
        }


def _outcomes(values: Sequence[bool], name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ConfigError(f"{name} must be a flat sequence of pass/fail outcomes")
    if array.dtype == bool:
        return array
    # Refuse anything but booleans and 0/1: np.asarray(["False"], bool) is True.
    if array.size and not (np.issubdtype(array.dtype, np.integer) and np.all((array == 0) | (array == 1))):
        raise ConfigError(f"{name} must hold booleans (or 0/1), got dtype {array.dtype}")
    return array.astype(bool)


def _format_p(p_value: float) -> str:
    return "p<0.0001" if p_value < 1e-4 else f"p={p_value:.3g}"


def _format_pp(value: float) -> str:
    return f"{round(value, 1):g}"


def compare_paired(
    a: Sequence[bool],
    b: Sequence[bool],
    alpha: float = 0.05,
    policy: PowerPolicy | None = None,
    target_delta_pp: float | None = None,
) -> PowerReport:
    """Compare two arms run on the same items (item i of ``a`` and of ``b`` is one task).

    Args:
        a: Arm A's pass/fail per item.
        b: Arm B's pass/fail per item, in the same item order.
        alpha: Significance level of the McNemar test and the Wilson intervals.
        policy: When a sample is powered; ``PowerPolicy()`` (n >= 10, Wilson
            half-width < 30 pp) when None. Both arms must be powered.
        target_delta_pp: The difference, in percentage points, to size
            ``tasks_needed`` for; defaults to the observed difference, or 5 pp
            when there is none.

    Returns:
        The report. Its verdict reads, for example, ``"powered and significant:
        arm B passes 12 pp more (p=0.003)"`` or ``"not powered (6 tasks, fewer
        than 10): about 57 more tasks needed to detect 5 pp"``. Sample sizes
        assume the observed discordance rate (see :func:`paired_sample_size`).

    Raises:
        ConfigError: The arms differ in length or hold non-boolean values, or
            alpha or target_delta_pp is out of range.
    """
    alpha = _check_level(alpha, "alpha")
    policy = PowerPolicy() if policy is None else policy
    arm_a, arm_b = _outcomes(a, "a"), _outcomes(b, "b")
    if arm_a.shape != arm_b.shape:
        raise ConfigError(f"paired arms differ in length: {arm_a.size} != {arm_b.size}")
    n = int(arm_a.size)
    k_a, k_b = int(arm_a.sum()), int(arm_b.sum())
    only_a, only_b = int((arm_a & ~arm_b).sum()), int((~arm_a & arm_b).sum())

    low_a, high_a = wilson_interval(k_a, n, alpha)
    low_b, high_b = wilson_interval(k_b, n, alpha)
    rate_a = k_a / n if n else None
    rate_b = k_b / n if n else None
    delta_pp = 100.0 * (k_b - k_a) / n if n else None
    p_value = mcnemar_exact(only_a, only_b, n)
    significant = p_value is not None and p_value < alpha
    is_powered = bool(policy.is_powered(n, k_a)) and bool(policy.is_powered(n, k_b))

    discordance = (only_a + only_b) / n if n else None
    rates = (rate_a or 0.0, rate_b or 0.0) if n else (0.5, 0.5)
    mdd = float(min_detectable_delta_pp(n, rates[0], rates[1], alpha=alpha, discordant=discordance))

    if target_delta_pp is None:
        target_delta_pp = abs(delta_pp) if delta_pp else 5.0
    target = float(target_delta_pp)
    needed = paired_sample_size(target, p_discordant=discordance, alpha=alpha)
    for_wilson = int(_wilson_min_n(np.asarray(rates), policy.max_half_width_pp / 100.0, policy.alpha).max())
    needed = max(needed, policy.min_n, for_wilson)
    more = needed - n
    to_detect = f"about {more} more tasks needed to detect {_format_pp(target)} pp"

    if delta_pp:
        ahead = "B" if delta_pp > 0 else "A"
        difference = f"arm {ahead} passes {abs(delta_pp):.1f} pp more"
    else:
        difference = "both arms pass at the same rate"

    if not is_powered:
        if n < policy.min_n:
            reason = f"{n} tasks, fewer than {policy.min_n}"
        else:
            half = 100.0 * max(wilson_half_width(k_a, n, policy.alpha), wilson_half_width(k_b, n, policy.alpha))
            reason = f"Wilson half-width {half:.1f} pp, limit {_format_pp(policy.max_half_width_pp)} pp"
        verdict = f"not powered ({reason}): {to_detect}"
    elif significant:
        verdict = f"powered and significant: {difference} ({_format_p(p_value)})"
    else:
        shown = "n/a" if p_value is None else _format_p(p_value)
        if more > 0:
            verdict = f"powered but not significant: {difference} ({shown}); {to_detect}"
        else:
            verdict = (
                f"powered but not significant: {difference} ({shown}); "
                f"{n} tasks detect differences of {mdd:.1f} pp or more"
            )

    return PowerReport(
        n=n,
        k_a=k_a,
        k_b=k_b,
        rate_a=rate_a,
        rate_b=rate_b,
        ci_a=(float(low_a), float(high_a)),
        ci_b=(float(low_b), float(high_b)),
        b=only_a,
        c=only_b,
        p_value=p_value,
        delta_pp=delta_pp,
        min_detectable_delta_pp=mdd if math.isfinite(mdd) else None,
        powered=is_powered,
        significant=significant,
        alpha=alpha,
        target_delta_pp=target,
        tasks_needed=needed,
        verdict=verdict,
    )
