"""searchjax.eval.stats against independent references: published/hand-computed values, the quadratic that
defines the Wilson bounds, binomial sums with math.comb, brute-force enumeration of 2x2 tables, an explicit
per-resample bootstrap loop, and the normal-approximation interval on a large sample."""

import itertools
import math

import numpy as np
import pytest

from searchjax.eval import stats

Z95 = 1.959963984540054  # Phi^-1(0.975)


# --- Wilson -----------------------------------------------------------------------------------------------

def _wilson_by_quadratic(k, n, z):
    """The Wilson bounds are the p0 with (k/n - p0)^2 = z^2 p0 (1 - p0) / n: roots of a quadratic in p0."""
    p = k / n
    # (1 + z^2/n) p0^2 - (2p + z^2/n) p0 + p^2 = 0
    roots = np.roots([1 + z * z / n, -(2 * p + z * z / n), p * p])
    return tuple(sorted(float(np.real(r)) for r in roots))


def test_wilson_8_of_10_hand_value():
    low, high = stats.wilson_interval(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)  # the textbook value for 8/10 at 95%
    assert (low, high) == pytest.approx(_wilson_by_quadratic(8, 10, Z95), abs=1e-12)


@pytest.mark.parametrize("k, n, confidence", [(1, 3, 0.95), (37, 120, 0.9), (499, 1000, 0.99), (5, 5, 0.8)])
def test_wilson_matches_quadratic_roots(k, n, confidence):
    from scipy.stats import norm
    z = norm.ppf(1 - (1 - confidence) / 2)
    assert stats.wilson_interval(k, n, confidence) == pytest.approx(_wilson_by_quadratic(k, n, z), abs=1e-10)


def test_wilson_edges_and_symmetry():
    low, high = stats.wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(Z95 ** 2 / (10 + Z95 ** 2), abs=1e-12)  # k = 0 closed form
    low, high = stats.wilson_interval(3, 17)
    mirror = stats.wilson_interval(14, 17)
    assert (low, high) == pytest.approx((1 - mirror[1], 1 - mirror[0]), abs=1e-12)
    for bad in [(0, 0), (11, 10), (-1, 10), (1.5, 10)]:
        with pytest.raises(ValueError):
            stats.wilson_interval(*bad)
    with pytest.raises(ValueError, match="n = 0"):
        stats.wilson_interval(0, 0)
    with pytest.raises(ValueError, match="confidence"):
        stats.wilson_interval(1, 2, confidence=1.0)


# --- McNemar ----------------------------------------------------------------------------------------------

def _mcnemar_by_comb(b, c):
    n = b + c
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def test_mcnemar_exact_against_binomial_sums():
    assert stats.mcnemar_exact(1, 9) == pytest.approx(22 / 1024, abs=1e-15)  # 2 * (C(10,0) + C(10,1)) / 2^10
    for b, c in itertools.product(range(0, 13), range(0, 13)):
        if b + c:
            assert stats.mcnemar_exact(b, c) == pytest.approx(_mcnemar_by_comb(b, c), rel=1e-12), (b, c)
    assert stats.mcnemar_exact(0, 0) == 1.0
    assert stats.mcnemar_exact(40, 70) == pytest.approx(_mcnemar_by_comb(40, 70), rel=1e-9)
    with pytest.raises(ValueError):
        stats.mcnemar_exact(-1, 3)


# --- Fisher -----------------------------------------------------------------------------------------------

def _fisher_by_enumeration(table, alternative):
    (a, b), (c, d) = table
    row1, col1, n = a + b, a + c, a + b + c + d

    def prob(x):  # hypergeometric P(A = x) with the margins fixed
        return math.comb(col1, x) * math.comb(n - col1, row1 - x) / math.comb(n, row1)
    support = range(max(0, row1 + col1 - n), min(row1, col1) + 1)
    observed = prob(a)
    if alternative == "greater":
        return sum(prob(x) for x in support if x >= a)
    if alternative == "less":
        return sum(prob(x) for x in support if x <= a)
    return min(1.0, sum(prob(x) for x in support if prob(x) <= observed * (1 + 1e-7)))


def test_fisher_tea_tasting_hand_values():
    assert stats.fisher_exact([[3, 1], [1, 3]], "greater") == pytest.approx(17 / 70, abs=1e-12)
    assert stats.fisher_exact([[3, 1], [1, 3]]) == pytest.approx(34 / 70, abs=1e-12)


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_fisher_against_enumeration(alternative):
    rng = np.random.default_rng(0)
    tables = [[[0, 0], [0, 0]], [[5, 0], [0, 5]], [[0, 7], [3, 0]], [[2, 9], [8, 1]]]
    tables += [rng.integers(0, 9, size=(2, 2)).tolist() for _ in range(40)]
    for table in tables:
        if sum(map(sum, table)) == 0:
            assert stats.fisher_exact(table, alternative) == 1.0
            continue
        assert stats.fisher_exact(table, alternative) == pytest.approx(
            _fisher_by_enumeration(table, alternative), rel=1e-9, abs=1e-12), table


def test_fisher_bad_input():
    for bad in ([[1, 2, 3], [4, 5, 6]], [[1, -2], [3, 4]], [[1, 2]], 5):
        with pytest.raises(ValueError):
            stats.fisher_exact(bad)
    with pytest.raises(ValueError, match="alternative"):
        stats.fisher_exact([[1, 2], [3, 4]], "two_sided")


# --- paired bootstrap -------------------------------------------------------------------------------------

def _slow_bootstrap(strata, confidence, resamples, seed):
    """One resample at a time, one stratum at a time, from the documented per-stratum streams."""
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(len(strata))]
    draws = [[] for _ in strata]
    for _ in range(resamples):
        for k, (a, b) in enumerate(strata):
            d = np.asarray(a, float) - np.asarray(b, float)
            idx = rngs[k].integers(0, len(d), size=len(d))
            draws[k].append(sum(d[i] for i in idx) / len(d))
    macro = np.mean(np.asarray(draws), axis=0)
    ordered = np.sort(macro)
    alpha = 1 - confidence

    def percentile(q):  # numpy's "linear" definition written out: position q * (R - 1)
        pos = q * (resamples - 1)
        lo = int(math.floor(pos))
        hi = min(lo + 1, resamples - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
    point = np.mean([np.mean(np.asarray(a, float) - np.asarray(b, float)) for a, b in strata])
    return point, percentile(alpha / 2), percentile(1 - alpha / 2)


def test_paired_bootstrap_matches_explicit_loop():
    rng = np.random.default_rng(3)
    a = rng.random(57)
    b = np.clip(a - 0.1 + 0.3 * rng.standard_normal(57), 0, 1)
    got = stats.paired_bootstrap_ci(a, b, confidence=0.9, resamples=700, seed=11)
    assert got == pytest.approx(_slow_bootstrap([(a, b)], 0.9, 700, 11), rel=1e-12, abs=1e-12)
    assert got[1] < got[0] < got[2]


def test_paired_bootstrap_blocks_do_not_change_the_stream(monkeypatch):
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, 2, 40), rng.integers(0, 2, 40)
    whole = stats.paired_bootstrap_ci(a, b, resamples=500, seed=2)
    monkeypatch.setattr(stats, "_BLOCK_ELEMENTS", 40 * 7)  # blocks of 7 resamples
    assert stats.paired_bootstrap_ci(a, b, resamples=500, seed=2) == whole


def test_paired_bootstrap_macro_matches_explicit_loop_and_one_stratum_case():
    rng = np.random.default_rng(5)
    strata = [(rng.integers(0, 2, n), rng.integers(0, 2, n)) for n in (13, 30, 8)]
    got = stats.paired_bootstrap_macro_ci(strata, resamples=400, seed=7)
    assert got == pytest.approx(_slow_bootstrap(strata, 0.95, 400, 7), rel=1e-12, abs=1e-12)
    a, b = strata[1]
    assert stats.paired_bootstrap_macro_ci([(a, b)], resamples=300, seed=1) == \
        stats.paired_bootstrap_ci(a, b, resamples=300, seed=1)


def test_paired_bootstrap_agrees_with_normal_approximation_on_a_large_sample():
    rng = np.random.default_rng(6)
    n = 4000
    a = (rng.random(n) < 0.55).astype(float)
    flip = rng.random(n) < 0.3  # system b differs from a on 30% of questions
    b = np.where(flip, 1 - a, a)
    d = a - b
    half = Z95 * d.std(ddof=1) / math.sqrt(n)
    mean, low, high = stats.paired_bootstrap_ci(a, b, resamples=4000, seed=0)
    assert mean == pytest.approx(d.mean(), abs=1e-15)
    assert low == pytest.approx(d.mean() - half, abs=0.1 * half)
    assert high == pytest.approx(d.mean() + half, abs=0.1 * half)


def test_paired_bootstrap_edge_cases():
    mean, low, high = stats.paired_bootstrap_ci(np.full(30, 0.3), np.full(30, 0.1))
    assert low == mean == high  # all-equal differences: zero width
    assert mean == pytest.approx(0.2)
    assert stats.paired_bootstrap_ci([1, 0, 1], [1, 0, 1]) == (0.0, 0.0, 0.0)
    one = stats.paired_bootstrap_ci([1.0], [0.0], resamples=10)
    assert one == (1.0, 1.0, 1.0)
    x = np.random.default_rng(0).random(20)
    assert stats.paired_bootstrap_ci(x, x[::-1], seed=1) == stats.paired_bootstrap_ci(x, x[::-1], seed=1)
    assert stats.paired_bootstrap_ci(x, x[::-1], seed=1) != stats.paired_bootstrap_ci(x, x[::-1], seed=2)
    with pytest.raises(ValueError, match="same questions"):
        stats.paired_bootstrap_ci([1, 0], [1, 0, 1])
    with pytest.raises(ValueError, match="no questions"):
        stats.paired_bootstrap_ci([], [])
    with pytest.raises(ValueError, match="NaN"):
        stats.paired_bootstrap_ci([1, float("nan")], [0, 0])
    with pytest.raises(ValueError, match="resamples"):
        stats.paired_bootstrap_ci([1, 0], [0, 0], resamples=0)
    with pytest.raises(ValueError, match="no strata"):
        stats.paired_bootstrap_macro_ci([])


# --- transitions and macro averages -----------------------------------------------------------------------

def test_transition_counts_by_hand():
    before = [True, True, False, False, False, True, False]
    after = [True, False, True, True, False, False, False]
    t = stats.transition_counts(before, after)
    assert t == stats.Transitions(failure_to_valid=2, valid_to_failure=2, stayed_valid=1, stayed_failure=2)
    assert sum(t) == len(before)
    assert stats.mcnemar_exact(t.failure_to_valid, t.valid_to_failure) == 1.0
    assert stats.transition_counts([], []) == (0, 0, 0, 0)
    with pytest.raises(ValueError, match="same length"):
        stats.transition_counts([True], [True, False])
    with pytest.raises(ValueError, match="booleans"):
        stats.transition_counts([0.5, 1], [1, 1])


def test_macro_average():
    values = {"nq": 0.4, "triviaqa": 0.6, "popqa": 0.2, "hotpotqa": None}
    assert stats.macro_average(values, ["nq", "triviaqa", "popqa"]) == pytest.approx(0.4)
    assert stats.macro_average(values, ["nq", "hotpotqa"]) is None
    assert stats.macro_average(values, ["nq", "musique"]) is None
    with pytest.raises(ValueError):
        stats.macro_average(values, [])
