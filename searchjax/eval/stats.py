"""Statistics for the papers' tables: rate intervals, paired tests, paired bootstrap intervals, transitions.

Every function takes plain numbers or 1-D arrays and returns plain floats/ints, so results go straight into
JSON and markdown. Where scipy has the test we call it (`scipy.stats.binomtest`, `scipy.stats.fisher_exact`,
`scipy.stats.norm.ppf`); the formulas are written out here so a reader can check them by hand.

* `wilson_interval(k, n, confidence)`: the Wilson score interval for a rate p = k / n (Dr.Free's audits).
  With z = Phi^-1(1 - alpha/2), alpha = 1 - confidence,

      centre     = (p + z^2 / 2n) / (1 + z^2 / n)
      half-width = z * sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n)

  and the interval is [centre - half, centre + half] (inside [0, 1] by construction; clipped against
  rounding). Unlike the normal interval p +- z sqrt(p(1-p)/n) it never collapses to zero width at k = 0 or
  k = n.
* `mcnemar_exact(b, c)`: McNemar's exact test on the discordant counts of paired binary outcomes (b = only
  system A right, c = only system B right). Under H0 the b + c discordant pairs split Binomial(b + c, 1/2),
  and the two-sided p = min(1, 2 * sum_{k <= min(b, c)} C(b + c, k) / 2^(b + c)), computed by
  `scipy.stats.binomtest`. p = 1 when b + c = 0 (no evidence either way).
* `fisher_exact(table, alternative)`: Fisher's exact test on a 2x2 table [[a, b], [c, d]]. With the margins
  fixed, a is hypergeometric; "two-sided" sums the probabilities of all tables no more likely than the
  observed one, "greater" is P(A >= a) (odds ratio > 1), "less" is P(A <= a) (scipy's conventions).
* `paired_bootstrap_ci(a, b)`: the paired percentile bootstrap of the mean difference of per-question
  scores of two systems on the same questions (EM, F1, judge accuracy): d_i = a_i - b_i; resample r draws
  n indices with replacement and takes mean(d[idx_r]); the interval is the (alpha/2, 1 - alpha/2)
  quantiles of the R resampled means (numpy's linear interpolation). Resampling questions (not systems)
  keeps each question's pair together, so the interval reflects how much the gain depends on which
  questions were asked, with the correlation between the two systems accounted for.
* `paired_bootstrap_macro_ci(strata)`: the same for a macro average over benchmarks (the papers' single-hop
  and multi-hop averages): each resample draws within every benchmark separately (stratified), and the
  statistic is the unweighted mean over benchmarks of the per-benchmark mean difference.
  Random draws: stratum k uses its own stream, `numpy.random.default_rng(SeedSequence(seed).spawn(K)[k])`,
  drawing one row of n_k indices per resample in order (in blocks of rows, to bound memory at ~32 MB; the
  block size does not change the stream). So `paired_bootstrap_ci(a, b)` is exactly the one-stratum case,
  and an explicit per-resample loop with the same streams reproduces the vectorised result.
* `transition_counts(before, after)`: failure -> valid and valid -> failure counts between two paired runs
  (EviBack reports them); `mcnemar_exact(failure_to_valid, valid_to_failure)` tests them.
* `macro_average(values, members)`: the unweighted mean of per-benchmark numbers over a group.
"""

from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Sequence

import numpy as np
from scipy import stats as _scipy_stats

_BLOCK_ELEMENTS = 1 << 22  # bootstrap indices drawn per block: 4M int64 = 32 MB


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(_scipy_stats.norm.ppf(1.0 - (1.0 - confidence) / 2.0))


def _count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer count, got {value!r}")
    return int(value)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """(low, high) Wilson score interval for successes / n (module docstring); n = 0 raises ValueError."""
    k, n = _count(successes, "successes"), _count(n, "n")
    if n == 0:
        raise ValueError("wilson_interval: n = 0 trials; a rate needs at least one trial")
    if k > n:
        raise ValueError(f"wilson_interval: successes={k} > n={n}")
    z = _z(confidence)
    p = k / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts b, c (binomial test of b ~ Bin(b + c, 1/2))."""
    b, c = _count(b, "b"), _count(c, "c")
    if b + c == 0:
        return 1.0
    return float(_scipy_stats.binomtest(b, b + c, 0.5, alternative="two-sided").pvalue)


def fisher_exact(table, alternative: str = "two-sided") -> float:
    """Fisher's exact p-value for a 2x2 table of counts [[a, b], [c, d]].

    alternative: "two-sided", "greater" (odds ratio > 1) or "less"."""
    if alternative not in ("two-sided", "greater", "less"):
        raise ValueError(f"fisher_exact: alternative {alternative!r} is not one of 'two-sided', 'greater', 'less'")
    try:
        rows = [list(r) for r in table]
    except TypeError:
        raise ValueError(f"fisher_exact: table must be 2x2 counts [[a, b], [c, d]], got {table!r}") from None
    if len(rows) != 2 or any(len(r) != 2 for r in rows):
        raise ValueError(f"fisher_exact: table must be 2x2 counts [[a, b], [c, d]], got {table!r}")
    counts = [[_count(x, "fisher_exact table entry") for x in r] for r in rows]
    return float(_scipy_stats.fisher_exact(counts, alternative=alternative).pvalue)


# --- paired bootstrap ---------------------------------------------------------------------------------------

def _paired_differences(a, b, where: str) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"{where}: scores must be 1-D arrays, got shapes {a.shape} and {b.shape}")
    if a.shape != b.shape:
        raise ValueError(f"{where}: the two systems have {a.size} and {b.size} scores; paired scores need the "
                         "same questions in the same order")
    if a.size == 0:
        raise ValueError(f"{where}: no questions (empty score arrays)")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError(f"{where}: scores contain NaN or infinity")
    return a - b


def _stratum_means(d: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """[resamples] means of d over indices drawn with replacement, one row of len(d) draws per resample."""
    n = d.size
    block = max(1, _BLOCK_ELEMENTS // n)
    out = np.empty(resamples, np.float64)
    for start in range(0, resamples, block):
        rows = min(block, resamples - start)
        idx = rng.integers(0, n, size=(rows, n))  # [rows, n]
        out[start:start + rows] = d[idx].mean(axis=1)
    return out


def paired_bootstrap_macro_ci(strata: Sequence[tuple[Sequence[float], Sequence[float]]], *,
                              confidence: float = 0.95, resamples: int = 10_000,
                              seed: int = 0) -> tuple[float, float, float]:
    """(macro mean difference, low, high): stratified paired percentile bootstrap (module docstring).

    strata: one (a_k, b_k) pair of per-question score arrays per benchmark; the statistic is
    mean_k mean_i (a_k,i - b_k,i)."""
    _z(confidence)
    if isinstance(resamples, bool) or not isinstance(resamples, (int, np.integer)) or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")
    if not strata:
        raise ValueError("paired_bootstrap_macro_ci: no strata")
    diffs = [_paired_differences(a, b, f"paired bootstrap stratum {k}") for k, (a, b) in enumerate(strata)]
    streams = np.random.SeedSequence(seed).spawn(len(diffs))
    total = np.zeros(int(resamples), np.float64)
    for d, stream in zip(diffs, streams):
        total += _stratum_means(d, np.random.default_rng(stream), int(resamples))
    means = total / len(diffs)
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2.0, 1.0 - alpha / 2.0])
    # The point estimate is summed in the same order as the resamples, so all-equal differences give
    # low == point == high exactly (a zero-width interval).
    point = 0.0
    for d in diffs:
        point += d.mean()
    return float(point / len(diffs)), float(low), float(high)


def paired_bootstrap_ci(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95,
                        resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """(mean(a - b), low, high): paired percentile bootstrap interval of the mean difference a - b of two
    systems' per-question scores on the same questions (module docstring); deterministic given seed."""
    return paired_bootstrap_macro_ci([(a, b)], confidence=confidence, resamples=resamples, seed=seed)


# --- transitions and macro averages -------------------------------------------------------------------------

class Transitions(NamedTuple):
    """Paired outcome changes from a `before` run to an `after` run on the same questions."""

    failure_to_valid: int
    valid_to_failure: int
    stayed_valid: int
    stayed_failure: int


def transition_counts(before_valid: Sequence[bool], after_valid: Sequence[bool]) -> Transitions:
    """Counts of failure -> valid, valid -> failure, valid -> valid, failure -> failure over paired questions."""
    before = np.asarray(before_valid)
    after = np.asarray(after_valid)
    if before.ndim != 1 or before.shape != after.shape:
        raise ValueError(f"transition_counts: need two 1-D outcome arrays of the same length, got shapes "
                         f"{before.shape} and {after.shape}")
    for name, x in (("before_valid", before), ("after_valid", after)):
        if x.size and not np.all((x == 0) | (x == 1)):
            bad = x[~((x == 0) | (x == 1))][:3]
            raise ValueError(f"transition_counts: {name} must hold booleans (or 0/1), got {bad!r}")
    before, after = before.astype(bool), after.astype(bool)
    return Transitions(failure_to_valid=int(np.sum(~before & after)), valid_to_failure=int(np.sum(before & ~after)),
                       stayed_valid=int(np.sum(before & after)), stayed_failure=int(np.sum(~before & ~after)))


def macro_average(values: Mapping[str, float | None], members: Sequence[str]) -> float | None:
    """Unweighted mean of values[m] over members; None when a member is missing or None (a macro average over
    part of a group would not be comparable between systems)."""
    if not members:
        raise ValueError("macro_average: empty group")
    picked = [values.get(m) for m in members]
    if any(v is None for v in picked):
        return None
    return float(np.mean(picked))
