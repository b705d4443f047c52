"""Goodness of fit between sampled token counts and an exact float64 expected distribution.

Three tests, each returning a `TestResult`:

* `chisquare_test`: Pearson chi-square (``scipy.stats.chisquare``) over bins whose expected count
  is at least ``min_expected`` (5 by default).  Tokens expected that often keep their own bin; the
  rest are pooled from the lowest probability upwards into "pooled tail" bins.  A sampled token
  whose expected probability is exactly 0 is an *impossible token*: the test fails at once with
  ``p = 0`` (no amount of pooling may hide it).
* `tail_mass_test`: exact binomial test (``scipy.stats.binomtest``) of how many draws fell in a
  low-probability token set (named explicitly, or all tokens below a probability threshold).
  Chi-square pools such tokens into one bin whose expected count may be dominated by the head;
  the binomial test looks at the tail alone, which is what truncated Gumbel noise gets wrong.
* `independence_test`: chi-square of the joint counts of two rows drawn together (a target row
  and a draft row of one request) against the product of their expected marginals.

Multiple testing across a run: `apply_correction` fills ``adjusted_p_value`` and ``passed``
(Holm's step-down, or Benjamini-Hochberg via ``scipy.stats.false_discovery_control``).
Self-tests of the tests: `binomial_band` gives the range of rejection counts a calibrated test
shows over many runs; `CalibrationResult` and `PowerResult` carry those results.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np
from scipy import stats as sps

# The result records live in checks.stats_results; re-exported here, where callers have always found them.
from runnercheck.checks.chisq.stats_results import BinCount, CalibrationResult, PowerResult, RunSummary, TestResult, share_wall_time  # noqa: F401

DEFAULT_MIN_EXPECTED = 5.0
CORRECTIONS = ("holm", "bh", "none")


class StatsInputError(ValueError):
    """Counts/probabilities that cannot be tested (shape mismatch, negative, not a distribution)."""


# --------------------------------------------------------------------------- input checks


def _as_counts(counts: Sequence[int] | np.ndarray, name: str = "counts") -> np.ndarray:
    arr = np.asarray(counts)
    if arr.ndim != 1:
        raise StatsInputError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size and (not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0):
        raise StatsInputError(f"{name} must be non-negative integers")
    return arr.astype(np.int64)


def _as_probs(probs: Sequence[float] | np.ndarray, size: int) -> np.ndarray:
    arr = np.asarray(probs, dtype=np.float64)
    if arr.shape != (size,):
        raise StatsInputError(f"expected probabilities of shape ({size},), got {arr.shape}")
    if not np.all(np.isfinite(arr)) or arr.min(initial=0.0) < 0:
        raise StatsInputError("expected probabilities must be finite and >= 0")
    total = arr.sum()
    if not abs(total - 1.0) < 1e-9:
        raise StatsInputError(f"expected probabilities sum to {total!r}, not 1")
    return arr / total


def token_counts(tokens: np.ndarray | Sequence[int], vocab_size: int) -> np.ndarray:
    """Histogram of sampled token ids; ids outside ``[0, vocab_size)`` raise."""
    arr = np.asarray(tokens, dtype=np.int64).ravel()
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        bad = arr[(arr < 0) | (arr >= vocab_size)][0]
        raise StatsInputError(f"sampled token id {bad} outside [0, {vocab_size})")
    return np.bincount(arr, minlength=vocab_size)


# --------------------------------------------------------------------------- binning


def pool_bins(expected_counts: np.ndarray, min_expected: float = DEFAULT_MIN_EXPECTED) -> list[np.ndarray]:
    """Group token ids with positive expectation into bins each expecting >= ``min_expected``.

    Tokens expected at least ``min_expected`` times are singleton bins.  The others are walked from
    the lowest expectation upwards and cut into pooled bins as soon as a bin reaches the minimum; a
    remainder that never reaches it joins the last pooled bin, or, if there is none, the singleton
    bin with the smallest expectation.  Returns index arrays, largest bins first.
    """
    positive = np.flatnonzero(expected_counts > 0)
    order = positive[np.argsort(expected_counts[positive], kind="stable")]  # ascending
    big = order[expected_counts[order] >= min_expected]
    small = order[expected_counts[order] < min_expected]
    bins: list[np.ndarray] = [np.array([t]) for t in big[::-1]]
    pooled: list[np.ndarray] = []
    if small.size:
        cumulative = np.cumsum(expected_counts[small])
        start, base = 0, 0.0
        # Cut points: the first index at which the running total since the last cut reaches the minimum.
        while start < small.size:
            stop = int(np.searchsorted(cumulative, base + min_expected, side="left"))
            if stop >= small.size:
                break
            pooled.append(small[start : stop + 1])
            base = cumulative[stop]
            start = stop + 1
        remainder = small[start:]
        if remainder.size:
            if pooled:
                pooled[-1] = np.concatenate([pooled[-1], remainder])
            elif bins:
                bins[-1] = np.concatenate([bins[-1], remainder])
            else:
                pooled.append(remainder)
    return bins + pooled[::-1]


def _bin_label(tokens: np.ndarray) -> str:
    if tokens.size == 1:
        return f"token {int(tokens[0])}"
    return f"pooled tail ({tokens.size} tokens)"


def _bins_for_report(groups: list[np.ndarray], observed: np.ndarray, expected: np.ndarray, label_fn=_bin_label) -> list[BinCount]:
    return [
        BinCount(
            label=label_fn(g),
            observed=int(observed[g].sum()),
            expected=float(expected[g].sum()),
            num_tokens=int(g.size),
            token_ids=tuple(int(t) for t in g[:8]),
        )
        for g in groups
    ]


# --------------------------------------------------------------------------- tests


def chisquare_test(
    counts: Sequence[int] | np.ndarray,
    probs: Sequence[float] | np.ndarray,
    *,
    name: str,
    config: dict[str, Any] | None = None,
    alpha: float = 0.01,
    min_expected: float = DEFAULT_MIN_EXPECTED,
    kind: str = "chisq",
    label_fn=_bin_label,
) -> TestResult:
    """Pearson chi-square of ``counts`` (per token) against exact ``probs`` with sparse bins pooled."""
    observed = _as_counts(counts)
    p = _as_probs(probs, observed.size)
    n = int(observed.sum())
    config = dict(config or {})
    if n == 0:
        raise StatsInputError(f"{name}: no samples")
    impossible = np.flatnonzero((p == 0) & (observed > 0))
    expected = p * n
    groups = pool_bins(expected, min_expected)
    if impossible.size:
        groups = groups + [impossible]
        return TestResult(
            name=name, kind=kind, config=config, statistic=math.inf, dof=max(len(groups) - 2, 0), p_value=0.0,
            n_samples=n, bins=_bins_for_report(groups, observed, expected, label_fn), passed=False,
            impossible_tokens=tuple(int(t) for t in impossible[:16]),
            notes=f"impossible token: {int(observed[impossible].sum())} draw(s) of {impossible.size} token(s) with probability 0",
        )
    f_obs = np.array([observed[g].sum() for g in groups], dtype=np.float64)
    f_exp = np.array([expected[g].sum() for g in groups], dtype=np.float64)
    if len(groups) < 2:
        # One bin holds all the mass (greedy, or a tail too sparse to bin apart from its head):
        # nothing random to test here; a tail gets its own exact test (`tail_mass_test`).
        only = groups[0] if groups else np.array([], dtype=np.int64)
        notes = ("single bin: one possible token" if only.size == 1
                 else f"single bin: all {only.size} possible tokens pooled, nothing to test")
        return TestResult(name=name, kind=kind, config=config, statistic=0.0, dof=0, p_value=1.0, n_samples=n,
                          bins=_bins_for_report(groups, observed, expected, label_fn), passed=True, notes=notes)
    f_exp *= f_obs.sum() / f_exp.sum()  # scipy insists the totals agree to ~1e-8 relative
    statistic, p_value = sps.chisquare(f_obs, f_exp)
    return TestResult(
        name=name, kind=kind, config=config, statistic=float(statistic), dof=len(groups) - 1,
        p_value=float(p_value), n_samples=n, bins=_bins_for_report(groups, observed, expected, label_fn),
        passed=bool(p_value >= alpha),
    )


def tail_mass_test(
    counts: Sequence[int] | np.ndarray,
    probs: Sequence[float] | np.ndarray,
    *,
    name: str,
    tail_tokens: Sequence[int] | np.ndarray | None = None,
    threshold: float | None = None,
    config: dict[str, Any] | None = None,
    alpha: float = 0.01,
    alternative: str = "two-sided",
) -> TestResult:
    """Exact binomial test of the number of draws that fell in the tail token set.

    The tail is ``tail_tokens`` when given, else every token with ``0 < p < threshold``.  Draws of
    tail tokens whose probability is 0 make the test fail with ``p = 0``.
    """
    observed = _as_counts(counts)
    p = _as_probs(probs, observed.size)
    n = int(observed.sum())
    if n == 0:
        raise StatsInputError(f"{name}: no samples")
    if (tail_tokens is None) == (threshold is None):
        raise StatsInputError(f"{name}: give exactly one of tail_tokens and threshold")
    if tail_tokens is not None:
        tail = np.unique(np.asarray(tail_tokens, dtype=np.int64))
        if tail.size and (tail.min() < 0 or tail.max() >= observed.size):
            raise StatsInputError(f"{name}: tail token ids outside [0, {observed.size})")
        description = f"{tail.size} named tail tokens"
    else:
        tail = np.flatnonzero((p > 0) & (p < threshold))
        description = f"{tail.size} tokens with 0 < p < {threshold:g}"
    hits = int(observed[tail].sum())
    mass = float(p[tail].sum())
    config = dict(config or {})
    bins = [BinCount("tail", hits, mass * n, int(tail.size), tuple(int(t) for t in tail[:8])),
            BinCount("rest", n - hits, (1.0 - mass) * n, int(observed.size - tail.size))]
    impossible = tail[(p[tail] == 0) & (observed[tail] > 0)]
    if mass == 0.0:
        passed = hits == 0
        return TestResult(name=name, kind="tail", config=config, statistic=float(hits), dof=0,
                          p_value=1.0 if passed else 0.0, n_samples=n, bins=bins, passed=passed,
                          impossible_tokens=tuple(int(t) for t in impossible[:16]),
                          notes=f"{description}; tail mass 0, {hits} hit(s)")
    result = sps.binomtest(hits, n, min(mass, 1.0), alternative=alternative)
    p_value = 0.0 if impossible.size else float(result.pvalue)
    notes = f"{description}; expected {mass * n:.4g} hits, observed {hits}"
    if impossible.size:
        notes = "impossible token in tail; " + notes
    return TestResult(name=name, kind="tail", config=config, statistic=float(hits), dof=0, p_value=p_value,
                      n_samples=n, bins=bins, passed=p_value >= alpha,
                      impossible_tokens=tuple(int(t) for t in impossible[:16]), notes=notes)


def independence_test(
    first: np.ndarray,
    second: np.ndarray,
    probs_first: Sequence[float] | np.ndarray,
    probs_second: Sequence[float] | np.ndarray,
    *,
    name: str,
    config: dict[str, Any] | None = None,
    alpha: float = 0.01,
    min_expected: float = DEFAULT_MIN_EXPECTED,
) -> TestResult:
    """Chi-square of the joint (first, second) token counts against ``outer(p_first, p_second)``.

    Rows of one request at different noise positions must be independent given their logits; rows
    that share noise are strongly dependent even though each marginal is exact.
    """
    a = np.asarray(first, dtype=np.int64).ravel()
    b = np.asarray(second, dtype=np.int64).ravel()
    if a.shape != b.shape:
        raise StatsInputError(f"{name}: paired samples differ in length ({a.size} vs {b.size})")
    pa = np.asarray(probs_first, dtype=np.float64)
    pb = np.asarray(probs_second, dtype=np.float64)
    vb = pb.size
    token_counts(a, pa.size)  # raises on ids outside the vocabulary
    token_counts(b, vb)
    counts = np.bincount(a * vb + b, minlength=pa.size * vb)
    product = np.outer(pa, pb).ravel()

    def label(group: np.ndarray) -> str:
        if group.size == 1:
            i, j = divmod(int(group[0]), vb)
            return f"pair ({i}, {j})"
        return f"pooled pairs ({group.size})"

    return chisquare_test(counts, product / product.sum(), name=name, config=config, alpha=alpha,
                          min_expected=min_expected, kind="independence", label_fn=label)


# --------------------------------------------------------------------------- multiple testing


def holm_adjust(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control, any dependence)."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted


def bh_adjust(p_values: Sequence[float]) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (false discovery rate)."""
    p = np.asarray(p_values, dtype=np.float64)
    if p.size == 0:
        return p
    return np.asarray(sps.false_discovery_control(p, method="bh"))


def apply_correction(results: Iterable[TestResult], method: str = "holm", alpha: float = 0.01) -> list[TestResult]:
    """Fill ``adjusted_p_value`` and ``passed`` over the whole family of ``results``."""
    results = list(results)
    if method not in CORRECTIONS:
        raise StatsInputError(f"unknown correction {method!r}; choose one of {CORRECTIONS}")
    raw = [r.p_value for r in results]
    if method == "holm":
        adjusted = holm_adjust(raw)
    elif method == "bh":
        adjusted = bh_adjust(raw)
    else:
        adjusted = np.asarray(raw, dtype=np.float64)
    for r, adj in zip(results, adjusted):
        r.adjusted_p_value = float(adj)
        r.passed = bool(adj >= alpha) and not r.impossible_tokens
    return results


def family_min_p(results: Sequence[TestResult]) -> float:
    """Bonferroni-adjusted smallest p-value of one configuration's tests (rejects the configuration)."""
    if not results:
        return 1.0
    return min(1.0, min(r.p_value for r in results) * len(results))


# --------------------------------------------------------------------------- calibration


def binomial_band(runs: int, alpha: float, coverage: float = 0.999) -> tuple[int, int]:
    """Rejection counts a test of level ``alpha`` shows in ``runs`` runs with probability >= coverage."""
    lo, hi = sps.binom.interval(coverage, runs, alpha)
    return int(lo), int(hi)


def calibration_result(
    p_values: Sequence[float], *, alpha: float, config_name: str, sampler: str, coverage: float = 0.999
) -> CalibrationResult:
    """Judge the p-values of ``len(p_values)`` runs of a correct sampler."""
    p = [float(x) for x in p_values]
    runs = len(p)
    if runs == 0:
        raise StatsInputError("calibration needs at least one run")
    rejections = sum(x < alpha for x in p)
    band = binomial_band(runs, alpha, coverage)
    ks = float(sps.kstest(p, "uniform").pvalue)
    return CalibrationResult(config_name=config_name, sampler=sampler, runs=runs, alpha=alpha,
                             rejections=rejections, band=band, coverage=coverage, p_values=p,
                             ks_p_value=ks, passed=band[0] <= rejections <= band[1])
