"""checks/chisq/stats.py: binning, the three tests, corrections and calibration, on numpy-made samples.

Every test that exists to catch something is shown catching it (a planted excess, an impossible
token, dependent pairs, miscalibrated p-values); calibration of the chi-square itself is checked
over many multinomial samples with sparse bins.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats as sps

from runnercheck.checks.chisq import stats


def _probs(seed: int, vocab: int, scale: float = 2.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = np.exp(rng.normal(0, scale, vocab))
    return w / w.sum()


# --------------------------------------------------------------------------- binning


@pytest.mark.parametrize("seed", range(6))
def test_pool_bins_partition_and_minimum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = _probs(seed, 300, scale=3.0)
    p[rng.choice(300, 20, replace=False)] = 0.0
    p /= p.sum()
    n = int(rng.integers(200, 20_000))
    groups = stats.pool_bins(p * n)
    flat = np.concatenate(groups)
    assert sorted(flat.tolist()) == np.flatnonzero(p > 0).tolist()  # each possible token exactly once
    assert all((p[g] * n).sum() >= stats.DEFAULT_MIN_EXPECTED - 1e-9 for g in groups)
    singles = [g for g in groups if g.size == 1]
    assert all(p[g[0]] * n >= stats.DEFAULT_MIN_EXPECTED for g in singles)


def test_pool_bins_when_everything_is_sparse() -> None:
    groups = stats.pool_bins(np.full(10, 0.3))  # total 3 < 5: one pooled bin
    assert len(groups) == 1 and groups[0].size == 10


# --------------------------------------------------------------------------- chi-square


def test_chisquare_accepts_exact_counts_and_rejects_a_shift() -> None:
    p = _probs(1, 50)
    n = 100_000
    exact = np.round(p * n).astype(np.int64)
    assert stats.chisquare_test(exact, p, name="exact").p_value > 0.99
    shifted = exact.copy()
    middle = int(np.argsort(p)[p.size // 2])
    shifted[middle] += n // 100  # 1% of the draws moved onto a mid-probability token
    result = stats.chisquare_test(shifted, p, name="shifted")
    assert result.p_value < 1e-10 and not result.passed


def test_impossible_token_fails_with_p_zero_even_in_a_pooled_tail() -> None:
    p = _probs(2, 40)
    p[7] = 0.0
    p /= p.sum()
    counts = np.random.default_rng(0).multinomial(10_000, p)
    counts[7] = 1  # one draw of a token the distribution forbids
    result = stats.chisquare_test(counts, p, name="impossible")
    assert result.p_value == 0.0 and not result.passed
    assert result.impossible_tokens == (7,)
    assert "impossible token" in result.notes
    assert any(7 in b.token_ids for b in result.bins)


def test_single_bin_is_a_trivial_pass() -> None:
    p = np.zeros(5)
    p[2] = 1.0
    result = stats.chisquare_test(np.array([0, 0, 50, 0, 0]), p, name="greedy")
    assert result.passed and result.p_value == 1.0 and result.dof == 0


@pytest.mark.parametrize(
    "counts, probs, error",
    [
        (np.array([1, 2]), np.array([0.5, 0.6]), "sum to"),
        (np.array([1, -2]), np.array([0.5, 0.5]), "non-negative"),
        (np.array([1, 2, 3]), np.array([0.5, 0.5]), "shape"),
        (np.array([0, 0]), np.array([0.5, 0.5]), "no samples"),
        (np.array([1.5, 2.0]), np.array([0.5, 0.5]), "non-negative integers"),
        (np.array([1, 2]), np.array([np.nan, 1.0]), "finite"),
    ],
)
def test_chisquare_bad_input_is_a_typed_error(counts, probs, error) -> None:
    with pytest.raises(stats.StatsInputError, match=error):
        stats.chisquare_test(counts, probs, name="bad")


def test_token_counts_rejects_out_of_vocab_ids() -> None:
    with pytest.raises(stats.StatsInputError, match="outside"):
        stats.token_counts(np.array([0, 3, 9]), 5)


def test_chisquare_is_calibrated_with_sparse_bins() -> None:
    """Over 600 multinomial samples with many sparse tokens, rejections at 5% stay in the 99.9% band."""
    rng = np.random.default_rng(123)
    p = _probs(3, 400, scale=2.5)  # most tokens expected < 5 times at n = 3000: heavy pooling
    runs, alpha = 600, 0.05
    p_values = [stats.chisquare_test(rng.multinomial(3000, p), p, name="calib").p_value for _ in range(runs)]
    lo, hi = stats.binomial_band(runs, alpha)
    assert lo <= sum(x < alpha for x in p_values) <= hi


# --------------------------------------------------------------------------- tail mass


def test_tail_mass_consistent_then_planted_excess_and_deficit() -> None:
    vocab = 1001
    p = np.full(vocab, 1e-5)
    p[0] = 1.0 - 1e-5 * (vocab - 1)
    n = 200_000  # 2000 expected tail hits
    rng = np.random.default_rng(5)
    counts = rng.multinomial(n, p)
    tail = np.arange(1, vocab)
    assert stats.tail_mass_test(counts, p, tail_tokens=tail, name="ok").passed
    half_tail = p.copy()
    half_tail[1:] /= 2  # what truncated noise does to a deep tail: too few hits
    half_tail[0] = 1.0 - half_tail[1:].sum()
    truncated = rng.multinomial(n, half_tail)
    deficit = stats.tail_mass_test(truncated, p, tail_tokens=tail, name="half the tail")
    assert deficit.p_value < 1e-10 and not deficit.passed
    excess = counts.copy()
    excess[5] += 300
    excess[0] -= 300
    assert stats.tail_mass_test(excess, p, threshold=1e-4, name="excess").p_value < 1e-6


def test_tail_mass_zero_probability_hits_fail() -> None:
    p = np.array([1.0, 0.0, 0.0])
    result = stats.tail_mass_test(np.array([99, 1, 0]), p, tail_tokens=[1, 2], name="zero tail")
    assert not result.passed and result.p_value == 0.0
    assert stats.tail_mass_test(np.array([100, 0, 0]), p, tail_tokens=[1, 2], name="zero tail ok").passed


def test_tail_mass_needs_exactly_one_tail_definition() -> None:
    p = np.array([0.5, 0.5])
    with pytest.raises(stats.StatsInputError, match="exactly one"):
        stats.tail_mass_test(np.array([1, 1]), p, name="both", tail_tokens=[1], threshold=0.1)
    with pytest.raises(stats.StatsInputError, match="exactly one"):
        stats.tail_mass_test(np.array([1, 1]), p, name="neither")


# --------------------------------------------------------------------------- independence


def test_independence_passes_independent_pairs_and_catches_shared_noise() -> None:
    rng = np.random.default_rng(9)
    pa, pb = _probs(4, 12, 1.0), _probs(5, 12, 1.0)
    n = 20_000
    a = rng.choice(12, n, p=pa)
    b = rng.choice(12, n, p=pb)
    assert stats.independence_test(a, b, pa, pb, name="independent").p_value > 1e-3
    # Shared uniforms: inverse-CDF draws of both rows from one uniform, the marginals stay exact.
    u = rng.random(n)
    a_shared = np.minimum(np.searchsorted(np.cumsum(pa), u), 11)
    b_shared = np.minimum(np.searchsorted(np.cumsum(pb), u), 11)
    assert stats.chisquare_test(np.bincount(b_shared, minlength=12), pb, name="marginal").p_value > 1e-4
    assert stats.independence_test(a_shared, b_shared, pa, pb, name="shared").p_value < 1e-50


# --------------------------------------------------------------------------- multiple testing


def test_holm_matches_its_definition() -> None:
    p = np.array([0.01, 0.04, 0.03, 0.005, 0.5])
    order = np.argsort(p)
    m = p.size
    expected = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        expected[i] = running
    np.testing.assert_allclose(stats.holm_adjust(p), expected)


def test_bh_matches_its_definition() -> None:
    p = np.array([0.01, 0.04, 0.03, 0.005, 0.5, 0.2])
    m = p.size
    order = np.argsort(p)
    ranked = p[order] * m / np.arange(1, m + 1)
    adjusted_sorted = np.minimum.accumulate(ranked[::-1])[::-1]
    expected = np.empty(m)
    expected[order] = np.minimum(adjusted_sorted, 1.0)
    np.testing.assert_allclose(stats.bh_adjust(p), expected)


def test_apply_correction_sets_passed_over_the_family() -> None:
    results = [stats.TestResult(name=f"t{i}", kind="chisq", config={}, statistic=1.0, dof=1, p_value=p, n_samples=10)
               for i, p in enumerate([0.004, 0.02, 0.3])]
    stats.apply_correction(results, "holm", alpha=0.05)
    assert [r.passed for r in results] == [False, False, True]  # adjusted 0.012, 0.04, 0.3 vs 0.05
    assert results[0].adjusted_p_value == pytest.approx(0.012)
    stats.apply_correction(results, "none", alpha=0.01)
    assert [r.passed for r in results] == [False, True, True]
    with pytest.raises(stats.StatsInputError, match="unknown correction"):
        stats.apply_correction(results, "bonferonni")


# --------------------------------------------------------------------------- calibration and power


def test_calibration_result_flags_a_miscalibrated_test() -> None:
    rng = np.random.default_rng(0)
    good = stats.calibration_result(rng.random(400), alpha=0.05, config_name="c", sampler="s")
    assert good.passed and good.band[0] <= good.rejections <= good.band[1]
    # An anti-conservative test (p-values squashed towards 0) rejects far too often.
    bad = stats.calibration_result(rng.random(400) ** 3, alpha=0.05, config_name="c", sampler="s")
    assert not bad.passed
    assert sps.binom.cdf(bad.band[1], 400, 0.05) >= 0.999


def test_result_dicts_are_json_ready() -> None:
    p = _probs(6, 20)
    r = stats.chisquare_test(np.random.default_rng(1).multinomial(500, p), p, name="j", config={"vocab": 20})
    power = stats.PowerResult("b", "c", 2, 2, 0.01, 1.0, [0.0, 1e-9])
    summary = stats.RunSummary("s", "cpu", True, 0, 0.01, "holm", [r], power=[power])
    text = json.dumps(summary.to_dict(), allow_nan=False)
    assert json.loads(text)["tests"][0]["name"] == "j"
    assert summary.passed
