"""reference/spec_verify.py: the oracle of speculative verification (docs/SAMPLING.md)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from runnercheck.checks.chisq import stats
from runnercheck.impl.interface import (
    SpecLayoutError,
    SpecProbabilityError,
    SpecTooManyDraftsError,
    SpecVerifyError,
    SpecVocabMismatchError,
)
from runnercheck.reference import spec_verify
from runnercheck.reference.rng import DRAFT_STREAM, gumbel_from_bits, philox_64bits
from runnercheck.reference.spec_verify import accept_uniform, resample, verify


def _rows(seed: int, rows: int, vocab: int, zeros: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.rand(rows, vocab, generator=gen, dtype=torch.float64) + 0.05
    if zeros:
        w[:, :zeros] = 0.0
    return w / w.sum(dim=1, keepdim=True)


def _draft(q_row: torch.Tensor, seed: int, position: int) -> int:
    """The proposer's sample from ``q_row``: Gumbel-max with the draft stream."""
    hi, lo = philox_64bits(seed, position, torch.arange(q_row.numel()), DRAFT_STREAM)
    scores = torch.where(q_row > 0, torch.log(q_row) + gumbel_from_bits(hi, lo), torch.tensor(-math.inf, dtype=torch.float64))
    return int(torch.argmax(scores))


def test_p_equal_q_accepts_every_draft() -> None:
    for seed in range(40):
        q = _rows(seed, 3, 9)
        p = torch.cat([q, _rows(seed + 100, 1, 9)])
        drafts = [_draft(q[i], seed, 50 + i) for i in range(3)]
        out = verify(p, drafts, q, seed=seed, position=50, temperature=1.0)
        assert out.accepted == 3 and out.tokens[:3] == tuple(drafts) and len(out.tokens) == 4
        assert out.tokens[3] == resample(p[3], seed, 53)[0]  # the bonus token, from the resample stream


def test_draft_mass_where_the_target_has_none_is_always_rejected() -> None:
    """q puts mass on tokens 0..2, p none: drafting one of them is rejected and never emitted."""
    p = _rows(1, 2, 8, zeros=3)
    q = _rows(2, 1, 8)
    for seed in range(60):
        out = verify(p, [seed % 3], q, seed=seed, position=7, temperature=0.8)
        assert out.accepted == 0 and out.tokens[0] >= 3
        assert out.tokens[0] == resample(torch.clamp(p[0] - q[0], min=0), seed, 7)[0]


def test_accept_rule_is_u_times_q_below_p() -> None:
    p, q = _rows(3, 3, 6), _rows(4, 2, 6)
    for seed in range(30):
        drafts = [seed % 6, (seed * 5) % 6]
        out = verify(p, drafts, q, seed=seed, position=11, temperature=1.0)
        first = accept_uniform(seed, 11) * float(q[0, drafts[0]]) < float(p[0, drafts[0]])
        assert (out.accepted >= 1) == first


def test_zero_residual_falls_back_to_the_target_row() -> None:
    """p = q / 2 (unnormalised: p <= q everywhere): a rejection's residual is zero, so sample p."""
    q = _rows(5, 1, 7)
    p = torch.cat([q / 2, _rows(6, 1, 7)])
    rejected = 0
    for seed in range(40):
        out = verify(p, [seed % 7], q, seed=seed, position=3, temperature=1.0)
        if out.accepted == 0:
            rejected += 1
            assert out.tokens == (resample(p[0], seed, 3)[0],)
    assert 0 < rejected < 40


def test_greedy_accepts_the_matching_prefix_then_the_targets_token() -> None:
    p = torch.full((4, 5), 0.1, dtype=torch.float64)
    for i, t in enumerate((2, 4, 1, 3)):
        p[i, t] = 0.6
    q = torch.full((3, 5), 0.2, dtype=torch.float64)
    assert verify(p, [2, 4, 1], q, seed=0, position=0, temperature=0.0).tokens == (2, 4, 1, 3)
    out = verify(p, [2, 0, 1], q, seed=0, position=0, temperature=0.0)
    assert out.tokens == (2, 4) and out.accepted == 1
    assert verify(p, [1, 4, 1], q, seed=0, position=0, temperature=0.0).tokens == (2,)
    assert verify(p[:1], [], q[:0], seed=0, position=0, temperature=0.0).tokens == (2,)


def test_greedy_ties_go_to_the_lowest_index() -> None:
    p = torch.tensor([[0.1, 0.4, 0.4, 0.1], [0.25] * 4], dtype=torch.float64)
    q = torch.full((1, 4), 0.25, dtype=torch.float64)
    assert verify(p, [2], q, seed=0, position=0, temperature=0.0).tokens == (1,)
    assert verify(p, [1], q, seed=0, position=0, temperature=0.0).tokens == (1, 0)


def test_resample_is_gumbel_max_over_the_support() -> None:
    w = torch.tensor([0.0, 0.3, 0.0, 0.7], dtype=torch.float64)
    picks = {resample(w, s, 9)[0] for s in range(50)}
    assert picks == {1, 3}
    assert resample(torch.tensor([0.0, 2.0, 0.0]), 4, 1) == (1, math.inf)


@pytest.mark.parametrize(
    "make, error",
    [
        (lambda p, q: (p, [0] * 5, torch.rand(5, 6)), SpecTooManyDraftsError),
        (lambda p, q: (p, [0, 1], torch.full((2, 7), 1 / 7)), SpecVocabMismatchError),
        (lambda p, q: (p, [0, 1], torch.tensor([[0.5, -0.1, 0.6, 0, 0, 0]] * 2)), SpecProbabilityError),
        (lambda p, q: (p, [0, 1], torch.tensor([[math.nan, 0.5, 0.5, 0, 0, 0]] * 2)), SpecProbabilityError),
        (lambda p, q: (p, [0, 1], torch.zeros(2, 6)), SpecProbabilityError),
        (lambda p, q: (p[:2], [0, 1], q), SpecLayoutError),
        (lambda p, q: (p, [0], q), SpecLayoutError),
        (lambda p, q: (p, [0, 6], q), SpecLayoutError),
        (lambda p, q: (p, [0, 1.0], q), SpecLayoutError),
    ],
)
def test_bad_inputs_raise_typed_errors(make, error) -> None:
    p, q = _rows(7, 3, 6), _rows(8, 2, 6)
    target, drafts, draft_probs = make(p, q)
    with pytest.raises(error):
        verify(target, drafts, draft_probs, seed=1, position=0, temperature=1.0, max_spec_tokens=4)


def test_bad_keys_raise() -> None:
    p, q = _rows(7, 2, 6), _rows(8, 1, 6)
    for kw in (dict(seed=-1, position=0, temperature=1.0), dict(seed=0, position=-2, temperature=1.0),
               dict(seed=0, position=0, temperature=math.nan)):
        with pytest.raises(SpecVerifyError):
            verify(p, [0], q, **kw)


# --------------------------------------------------------------------------- exact statistics


def _first_tokens(n: int, p: torch.Tensor, q: torch.Tensor, seed: int) -> np.ndarray:
    """The first emitted token of ``n`` requests (k = 2, drafts from q by the draft stream)."""
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        position = 1000 + 3 * i
        drafts = [_draft(q[j], seed, position + j) for j in range(2)]
        out[i] = verify(p, drafts, q, seed=seed, position=position, temperature=1.0).tokens[0]
    return out


FIRST_P = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05, 0.0]] * 3, dtype=torch.float64)
FIRST_Q = torch.tensor([[0.05, 0.1, 0.1, 0.15, 0.3, 0.3]] * 2, dtype=torch.float64)


def test_first_emitted_token_has_the_targets_marginal() -> None:
    """Chi-square of the first token against p[0] (q far from p: most drafts are rejected)."""
    tokens = _first_tokens(2500, FIRST_P, FIRST_Q, seed=12)
    result = stats.chisquare_test(stats.token_counts(tokens, 6), FIRST_P[0].numpy(), name="first-token", alpha=0.001)
    assert result.passed, result


def test_first_token_test_catches_an_accept_test_that_always_passes(monkeypatch) -> None:
    """Planted bias: an accept uniform of 0 accepts every draft, so the first token follows q[0]."""
    monkeypatch.setattr(spec_verify, "accept_uniform", lambda seed, position: 0.0)
    tokens = _first_tokens(2500, FIRST_P, FIRST_Q, seed=12)
    result = stats.chisquare_test(stats.token_counts(tokens, 6), FIRST_P[0].numpy(), name="first-token", alpha=0.001)
    assert not result.passed
