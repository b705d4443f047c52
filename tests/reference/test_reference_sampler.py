"""The oracle sampler against brute-force enumeration of docs/SAMPLING.md on small vocabularies."""
from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats

from runnercheck.impl.interface import SamplingParams, SamplingParamsError, TokenOutOfVocabError
from runnercheck.reference.rng import gumbel_noise
from runnercheck.reference.sampler import (
    BOUNDARY_RTOL,
    TIE_TOLERANCE,
    SamplerInputError,
    apply_penalties,
    expected_distribution,
    filtered_scores,
    sample,
    token_logprobs,
)

INF = math.inf
GRID = [x / 2 for x in range(-8, 9)]  # coarse values, so ties are frequent


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# --------------------------------------------------------------------------- brute force


def brute_penalties(logits, params, prompt, outputs):
    out = list(logits)
    counts = Counter(outputs)
    for tok in range(len(out)):
        if params.repetition_penalty != 1.0 and (tok in prompt or tok in outputs):
            out[tok] = out[tok] / params.repetition_penalty if out[tok] > 0 else out[tok] * params.repetition_penalty
        out[tok] -= params.frequency_penalty * counts[tok]
        out[tok] -= params.presence_penalty * (1 if counts[tok] > 0 else 0)
    return out


def brute_min_p(s, kept, min_p):
    """Probability form: p_t >= min_p * p_max."""
    if min_p == 0:
        return kept
    top = max(s[t] for t in kept)
    for t in kept:  # keep away from the exact boundary, where float forms may round differently
        if s[t] < top:
            assume(abs(math.exp(s[t] - top) - min_p) > 1e-9)
    return {t for t in kept if math.exp(s[t] - top) >= min_p}


def brute_top_k(s, kept, k):
    """Counting form: keep t when fewer than k kept tokens score strictly higher."""
    if k == -1:
        return kept
    return {t for t in kept if sum(1 for j in kept if s[j] > s[t]) < k}


def brute_top_p(s, kept, top_p):
    """Enumerate every subset; the answer is the lightest upward-closed one holding >= top_p."""
    if top_p >= 1.0:
        return kept
    kept = sorted(kept)
    z = sum(math.exp(s[t]) for t in kept)
    best, best_mass = None, INF
    for size in range(1, len(kept) + 1):
        for subset in itertools.combinations(kept, size):
            chosen = set(subset)
            upward_closed = all(j in chosen for t in chosen for j in kept if s[j] >= s[t])
            if not upward_closed:
                continue
            mass = sum(math.exp(s[t]) for t in chosen) / z
            assume(abs(mass - top_p) > 1e-9)
            if mass >= top_p and mass < best_mass:
                best, best_mass = chosen, mass
    return best


def brute_kept(logits, params, prompt=(), outputs=()):
    penalised = brute_penalties(logits, params, prompt, outputs)
    s = [x / params.temperature for x in penalised]
    kept = {t for t in range(len(s)) if s[t] > -INF}
    kept = brute_min_p(s, kept, params.min_p)
    kept = brute_top_k(s, kept, params.top_k)
    kept = brute_top_p(s, kept, params.top_p)
    return s, kept


@st.composite
def filter_cases(draw):
    vocab = draw(st.integers(6, 12))
    logits = draw(st.lists(st.sampled_from(GRID), min_size=vocab, max_size=vocab))
    params = SamplingParams(
        temperature=draw(st.sampled_from([0.5, 1.0, 1.7])),
        top_k=draw(st.sampled_from([-1, 1, 2, 3, 5, vocab - 1, vocab])),
        top_p=draw(st.sampled_from([1.0, 0.2, 0.5, 0.75, 0.9, 0.99])),
        min_p=draw(st.sampled_from([0.0, 0.05, 0.2, 0.6, 1.0])),
        repetition_penalty=draw(st.sampled_from([1.0, 0.8, 1.3])),
        frequency_penalty=draw(st.sampled_from([0.0, 0.5, -0.25])),
        presence_penalty=draw(st.sampled_from([0.0, 0.5, -1.0])),
    )
    prompt = draw(st.lists(st.integers(0, vocab - 1), max_size=5))
    outputs = draw(st.lists(st.integers(0, vocab - 1), max_size=5))
    return logits, params, prompt, outputs


@settings(max_examples=300)
@given(filter_cases())
def test_filters_match_brute_force(case) -> None:
    logits, params, prompt, outputs = case
    s, kept = brute_kept(logits, params, prompt, outputs)
    got = filtered_scores(t64(logits), params, prompt, outputs)
    assert {t for t in range(len(logits)) if got[t] > -INF} == kept
    for t in kept:
        assert got[t].item() == pytest.approx(s[t], rel=1e-12, abs=1e-12)
    dist = expected_distribution(t64(logits), params, prompt, outputs)
    z = sum(math.exp(s[t]) for t in kept)
    for t in range(len(logits)):
        assert dist[t].item() == pytest.approx(math.exp(s[t]) / z if t in kept else 0.0, rel=1e-12, abs=1e-15)


@settings(max_examples=100)
@given(filter_cases(), st.integers(0, 2**63 - 1), st.integers(0, 10_000))
def test_sample_is_gumbel_argmax_over_kept(case, seed, position) -> None:
    logits, params, prompt, outputs = case
    s, kept = brute_kept(logits, params, prompt, outputs)
    noise = gumbel_noise(seed, position, len(logits)).tolist()
    final = {t: s[t] + noise[t] for t in kept}
    best = max(final.values())
    expected_token = min(t for t in kept if final[t] == best)
    result = sample(t64(logits), params, seed, position, prompt, outputs)
    assert result.token == expected_token
    others = sorted((v for t, v in final.items() if t != expected_token), reverse=True)
    expected_gap = best - others[0] if others else INF
    assert result.gap == pytest.approx(expected_gap, rel=1e-12, abs=1e-12)
    assert not result.nan_flag


def test_top_k_ties_at_threshold_are_all_kept() -> None:
    logits = t64([3.0, 2.0, 2.0, 2.0, 1.0, 0.0])
    kept = filtered_scores(logits, SamplingParams(top_k=2), [], []) > -INF
    assert kept.tolist() == [True, True, True, True, False, False]
    kept = filtered_scores(logits, SamplingParams(top_k=4), [], []) > -INF
    assert kept.tolist() == [True, True, True, True, False, False]
    # top_k at or beyond the number of candidates is off
    kept = filtered_scores(t64([1.0, -INF, 0.0]), SamplingParams(top_k=2), [], []) > -INF
    assert kept.tolist() == [True, False, True]


def test_top_p_keeps_every_tie_at_tau() -> None:
    # probabilities ~ [0.42, 0.16, 0.16, 0.16, 0.06, 0.06]: 0.5 falls inside the tied group
    logits = t64([1.0, 0.0, 0.0, 0.0, -1.0, -1.0])
    kept = filtered_scores(logits, SamplingParams(top_p=0.5), [], []) > -INF
    assert kept.tolist() == [True, True, True, True, False, False]
    kept = filtered_scores(logits, SamplingParams(top_p=0.3), [], []) > -INF
    assert kept.tolist() == [True, False, False, False, False, False]


def test_min_p_keeps_relative_probability() -> None:
    logits = t64([0.0, math.log(0.5), math.log(0.09), math.log(0.11)])
    kept = filtered_scores(logits, SamplingParams(min_p=0.1), [], []) > -INF
    assert kept.tolist() == [True, True, False, True]


def test_greedy_ties_take_the_lowest_index() -> None:
    logits = t64([1.0, 5.0, 5.0, 2.0])
    greedy = SamplingParams(temperature=0.0, top_k=1, top_p=0.1)
    result = sample(logits, greedy, seed=3, position=7)
    assert (result.token, result.gap, result.runner_up, result.fragile) == (1, 0.0, 2, False)
    assert expected_distribution(logits, greedy).tolist() == [0.0, 1.0, 0.0, 0.0]
    # greedy scores are the penalised logits, unfiltered
    assert filtered_scores(logits, greedy, [], []).tolist() == [1.0, 5.0, 5.0, 2.0]
    # penalties can move the argmax
    penalised = SamplingParams(temperature=0.0, repetition_penalty=3.0)
    assert sample(logits, penalised, 0, 0, output_ids=[1, 2]).token == 3


def test_greedy_gap_is_score_difference() -> None:
    result = sample(t64([0.5, 2.25, -1.0, 2.0]), SamplingParams(temperature=0.0), 0, 0)
    assert (result.token, result.runner_up) == (1, 3)
    assert result.gap == pytest.approx(0.25)
    assert sample(t64([0.5]), SamplingParams(temperature=0.0), 0, 0).gap == INF


# --------------------------------------------------------------------------- non-finite rule


@pytest.mark.parametrize(
    "row, token, flagged",
    [
        ([0.0, math.nan, 5.0, 1.0], None, True),  # NaN counts as -inf; sampled normally
        ([0.0, INF, 2.0, math.nan, INF], 1, True),  # lowest +inf wins
        ([math.nan, 0.0, 9.0, INF], 3, True),
        ([-INF, -INF, -INF], 0, False),
        ([math.nan, -INF, math.nan], 0, True),
    ],
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_non_finite_rule(row, token, flagged, temperature) -> None:
    params = SamplingParams(temperature=temperature, top_k=2, repetition_penalty=2.0)
    result = sample(t64(row), params, seed=11, position=4, prompt_ids=[0, 1, 2])
    assert result.nan_flag is flagged
    if token is not None:
        assert result.token == token and result.gap == INF and not result.fragile
        one_hot = [0.0] * len(row)
        one_hot[token] = 1.0
        assert expected_distribution(t64(row), params, [0, 1, 2]).tolist() == one_hot
    else:
        clean = t64([-INF if math.isnan(x) else x for x in row])
        assert result.token == sample(clean, params, 11, 4, [0, 1, 2]).token
        assert result.token != 1
        assert expected_distribution(t64(row), params, [0, 1, 2])[1].item() == 0.0


def test_logprobs_of_nan_row_treat_nan_as_minus_inf() -> None:
    lp = token_logprobs(t64([0.0, math.nan, 0.0]), 0, 3)
    assert lp.logprob == pytest.approx(math.log(0.5))
    assert lp.top_token_ids == (0, 2, 1) and lp.top_logprobs[2] == -INF


# --------------------------------------------------------------------------- penalties


def test_penalties_by_hand() -> None:
    logits = t64([2.0, -2.0, 1.0, 0.0, 3.0, -1.0])
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    got = apply_penalties(logits, params, prompt_ids=[0, 1, 1], output_ids=[2, 2, 3])
    # 0: prompt, positive -> /2; 1: prompt, negative -> *2; 2: out x2, positive -> /2 - 2*0.5 - 0.25;
    # 3: out x1, zero (not > 0) -> *2 - 0.5 - 0.25; 4, 5: untouched.
    assert got.tolist() == [1.0, -4.0, 0.5 - 1.0 - 0.25, 0.0 - 0.5 - 0.25, 3.0, -1.0]
    assert logits.tolist() == [2.0, -2.0, 1.0, 0.0, 3.0, -1.0], "input must not be modified"


def test_frequency_and_presence_ignore_prompt_tokens() -> None:
    logits = t64([1.0, 1.0, 1.0])
    params = SamplingParams(frequency_penalty=1.0, presence_penalty=1.0)
    assert apply_penalties(logits, params, [0, 0, 1], []).tolist() == [1.0, 1.0, 1.0]
    assert apply_penalties(logits, params, [0], [1, 1]).tolist() == [1.0, -2.0, 1.0]


def test_repetition_below_one_and_negative_logits() -> None:
    got = apply_penalties(t64([-3.0, 3.0, -3.0]), SamplingParams(repetition_penalty=0.5), [0], [1])
    assert got.tolist() == [-1.5, 6.0, -3.0]


@settings(max_examples=100)
@given(filter_cases())
def test_penalties_match_brute_force(case) -> None:
    logits, params, prompt, outputs = case
    got = apply_penalties(t64(logits), params, prompt, outputs).tolist()
    assert got == pytest.approx(brute_penalties(logits, params, prompt, outputs), rel=1e-15, abs=1e-15)


# --------------------------------------------------------------------------- logprobs


@settings(max_examples=150)
@given(st.data())
def test_token_logprobs_match_brute_force(data) -> None:
    vocab = data.draw(st.integers(2, 12))
    logits = data.draw(st.lists(st.sampled_from(GRID + [-INF]), min_size=vocab, max_size=vocab))
    assume(any(x > -INF for x in logits))
    token = data.draw(st.integers(0, vocab - 1))
    num_top = data.draw(st.integers(0, vocab))
    got = token_logprobs(t64(logits), token, num_top)
    log_z = math.log(sum(math.exp(x) for x in logits))
    assert got.token_id == token
    assert got.logprob == pytest.approx(logits[token] - log_z, rel=1e-12, abs=1e-12)
    assert got.rank == 1 + sum(1 for x in logits if x > logits[token])
    order = sorted(range(vocab), key=lambda t: (-logits[t], t))[:num_top]
    assert got.top_token_ids == tuple(order)
    assert got.top_logprobs == pytest.approx([logits[t] - log_z for t in order], rel=1e-12, abs=1e-12)


def test_logprobs_ignore_penalties_and_ties_rank_equal() -> None:
    lp = token_logprobs(t64([1.0, 3.0, 3.0, 0.0]), 2, 2)
    assert (lp.rank, lp.top_token_ids) == (1, (1, 2))
    assert token_logprobs(t64([1.0, 3.0, 3.0, 0.0]), 0, 0).rank == 3
    assert token_logprobs(t64([1.0, 3.0, 3.0, 0.0]), 0, 0).top_token_ids == ()


# --------------------------------------------------------------------------- gap and fragility


def test_gap_is_best_minus_second_final_score() -> None:
    logits = t64([0.3, 0.1, -0.4, 0.9, 0.0])
    params = SamplingParams(temperature=0.7)
    result = sample(logits, params, seed=5, position=12)
    final = (logits / 0.7 + gumbel_noise(5, 12, 5)).tolist()
    ranked = sorted(range(5), key=lambda t: -final[t])
    assert (result.token, result.runner_up) == (ranked[0], ranked[1])
    assert result.gap == pytest.approx(final[ranked[0]] - final[ranked[1]], rel=1e-12)


@pytest.mark.parametrize(
    "logits, params, fragile",
    [
        ([3.0, 2.0, 2.0 - 1e-6, 0.0], SamplingParams(top_k=2), True),  # near-tie just below t_k
        ([3.0, 2.0, 2.0, 0.0], SamplingParams(top_k=2), False),  # exact tie: all kept, stable
        ([3.0, 2.0, 1.9, 0.0], SamplingParams(top_k=2), False),
        ([0.0, math.log(0.2) + 1e-6, -5.0], SamplingParams(min_p=0.2), True),
        ([0.0, math.log(0.2) - 1e-6, -5.0], SamplingParams(min_p=0.2), True),
        ([0.0, math.log(0.3), -5.0], SamplingParams(min_p=0.2), False),
        ([0.0, 0.0, -9.0], SamplingParams(min_p=1.0), False),  # top ties never drop out
        ([0.0, math.log(0.5), math.log(0.25)], SamplingParams(top_p=4 / 7 + 1e-6), True),  # mass above tau
        ([0.0, math.log(0.5), math.log(0.25)], SamplingParams(top_p=4 / 7 - 1e-6), True),  # mass at tau
        ([0.0, math.log(0.5), math.log(0.5) - 1e-6], SamplingParams(top_p=0.6), True),  # score near tau
        ([0.0, math.log(0.5), math.log(0.25)], SamplingParams(top_p=0.7), False),
    ],
)
def test_fragile_boundaries(logits, params, fragile) -> None:
    assert sample(t64(logits), params, seed=1, position=0).fragile is fragile


def test_tolerances_are_the_documented_values() -> None:
    assert (TIE_TOLERANCE, BOUNDARY_RTOL) == (1e-3, 1e-4)


# --------------------------------------------------------------------------- empirical frequencies

CHI_LOGITS = [1.2, 0.4, 0.0, -0.3, 2.0, -2.5, 0.9, -0.8, 0.1, -6.0]
CHI_PARAMS = SamplingParams(temperature=0.8, top_k=8, min_p=0.01, repetition_penalty=1.2, frequency_penalty=0.2)
CHI_PROMPT, CHI_OUTPUTS = [0, 3], [4, 4, 6]
CHI_DRAWS = 3000


def _draw_counts(params: SamplingParams, seed: int) -> np.ndarray:
    logits = t64(CHI_LOGITS)
    counts = np.zeros(len(CHI_LOGITS))
    for position in range(CHI_DRAWS):
        counts[sample(logits, params, seed, position, CHI_PROMPT, CHI_OUTPUTS).token] += 1
    return counts


def _chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Goodness of fit with bins of expected count < 5 pooled; zero-probability bins must be empty."""
    expected = probs * counts.sum()
    assert counts[expected == 0].sum() == 0, "sampled a token the filters removed"
    order = np.argsort(expected)
    obs_bins, exp_bins, pool_obs, pool_exp = [], [], 0.0, 0.0
    for t in order:
        if expected[t] == 0:
            continue
        pool_obs += counts[t]
        pool_exp += expected[t]
        if pool_exp >= 5:
            obs_bins.append(pool_obs)
            exp_bins.append(pool_exp)
            pool_obs = pool_exp = 0.0
    if pool_exp:
        obs_bins[-1] += pool_obs
        exp_bins[-1] += pool_exp
    return float(stats.chisquare(obs_bins, exp_bins).pvalue)


def test_gumbel_max_frequencies_follow_expected_distribution() -> None:
    probs = expected_distribution(t64(CHI_LOGITS), CHI_PARAMS, CHI_PROMPT, CHI_OUTPUTS).numpy()
    assert (probs == 0).sum() >= 2  # the filters are active in this case
    assert _chi_square_pvalue(_draw_counts(CHI_PARAMS, seed=2024), probs) > 1e-3


def test_chi_square_catches_a_sampler_with_the_wrong_temperature() -> None:
    """Planted bug: draws made at temperature 1.2 must fail against the 0.8 distribution."""
    probs = expected_distribution(t64(CHI_LOGITS), CHI_PARAMS, CHI_PROMPT, CHI_OUTPUTS).numpy()
    wrong = SamplingParams(**{**vars(CHI_PARAMS), "temperature": 1.2})
    assert _chi_square_pvalue(_draw_counts(wrong, seed=2024), probs) < 1e-6


def test_chi_square_catches_a_sampler_that_ignores_the_filters() -> None:
    probs = expected_distribution(t64(CHI_LOGITS), CHI_PARAMS, CHI_PROMPT, CHI_OUTPUTS).numpy()
    unfiltered = SamplingParams(**{**vars(CHI_PARAMS), "top_k": -1, "min_p": 0.0})
    with pytest.raises(AssertionError, match="filters removed"):
        _chi_square_pvalue(_draw_counts(unfiltered, seed=7), probs)


# --------------------------------------------------------------------------- bad input


def test_bad_inputs_raise_typed_errors() -> None:
    row = t64([0.0, 1.0, 2.0])
    ok = SamplingParams()
    with pytest.raises(SamplerInputError):
        sample(row[None, :], ok, 0, 0)
    with pytest.raises(SamplerInputError):
        sample(torch.tensor([1, 2, 3]), ok, 0, 0)
    with pytest.raises(SamplerInputError):
        sample(t64([]), ok, 0, 0)
    with pytest.raises(SamplerInputError):
        sample(row, ok, -1, 0)
    with pytest.raises(SamplerInputError):
        sample(row, ok, 0, -5)
    with pytest.raises(TokenOutOfVocabError):
        sample(row, ok, 0, 0, prompt_ids=[3])
    with pytest.raises(TokenOutOfVocabError):
        apply_penalties(row, ok, [], [-1])
    with pytest.raises(SamplingParamsError):
        sample(row, SamplingParams(temperature=-1.0), 0, 0)
    with pytest.raises(SamplingParamsError):
        expected_distribution(row, SamplingParams(top_p=0.0))
    with pytest.raises(SamplerInputError):
        token_logprobs(row, 0, 4)
    with pytest.raises(TokenOutOfVocabError):
        token_logprobs(row, 3, 1)
