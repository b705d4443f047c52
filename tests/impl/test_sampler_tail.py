"""Deep-tail test: tokens 25 (and 30) logits below the head are sampled at their exact rate.

The row is one head token at logit 0 and ``V - 1`` tail tokens at ``-gap``.  The exact aggregate
tail probability is ``p = (V-1) e^-gap / (1 + (V-1) e^-gap)`` (float64).  Over ``n`` draws (rows x
calls, every draw at its own noise position) the number of tail tokens is Binomial(n, p); the
test asks for enough draws to expect >= 50 tail hits and applies `scipy.stats.binomtest`.

A sampler whose Gumbel noise comes from 32-bit uniforms caps the noise near 22.9 and so (almost)
never reaches a token 25 logits down: the planted-bug test below simulates exactly that sampler
(by the order statistics of its uniforms, which is cheap on CPU) and checks the test rejects it,
while the same simulation with the spec's 64-bit uniforms passes.
"""
from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import binomtest

from runnercheck.impl.device import Device
from runnercheck.impl.interface import SamplingParams
from runnercheck.impl.sample import Sampler, SamplingState
from test_sampler_harness import RowRequest, admit

VOCAB = 151936
MIN_EXPECTED_HITS = 50
ALPHA = 1e-4


def tail_probability(vocab: int, gap: float) -> float:
    weight = (vocab - 1) * math.exp(-gap)
    return weight / (1.0 + weight)


def draws_needed(vocab: int, gap: float, expected_hits: float = 60.0) -> int:
    return math.ceil(expected_hits / tail_probability(vocab, gap))


def tail_rate_pvalue(hits: int, draws: int, vocab: int, gap: float) -> float:
    """Two-sided binomial p-value of ``hits`` tail tokens in ``draws`` draws."""
    expected = draws * tail_probability(vocab, gap)
    if expected < MIN_EXPECTED_HITS:
        raise ValueError(f"only {expected:.1f} tail hits expected: too few draws for a meaningful test")
    return binomtest(hits, draws, tail_probability(vocab, gap)).pvalue


def _gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log1p(-u))


def simulated_tail_hits(draws: int, vocab: int, gap: float, uniform_bits: int, seed: int) -> int:
    """Tail hits of a Gumbel-max sampler whose uniforms live on a ``2^-uniform_bits`` grid.

    Per draw only the head's noise and the largest tail noise matter; the largest tail noise
    comes from the smallest of ``vocab - 1`` grid uniforms, sampled by inversion
    (``P(min >= x) = (1 - x)^(vocab-1)``) and then rounded onto the grid as the sampler would.
    """
    gen = torch.Generator().manual_seed(seed)
    grid = 2.0 ** -uniform_bits
    hits = 0
    for start in range(0, draws, 1 << 22):
        n = min(1 << 22, draws - start)
        head_u = (torch.floor(torch.rand(n, generator=gen, dtype=torch.float64) / grid) + 0.5) * grid
        v = torch.rand(n, generator=gen, dtype=torch.float64)
        tail_min = -torch.expm1(torch.log1p(-v) / (vocab - 1))  # inverse CDF of the minimum
        tail_u = (torch.floor(tail_min / grid) + 0.5) * grid
        tail_wins = _gumbel_from_uniform(tail_u) - gap > _gumbel_from_uniform(head_u)
        hits += int(tail_wins.sum())
    return hits


@pytest.mark.parametrize("gap", [25.0])
def test_planted_32bit_uniform_sampler_is_caught(gap):
    draws = draws_needed(VOCAB, gap)
    planted = simulated_tail_hits(draws, VOCAB, gap, uniform_bits=32, seed=1)
    assert planted <= 2
    assert tail_rate_pvalue(planted, draws, VOCAB, gap) < ALPHA


@pytest.mark.parametrize("gap", [25.0])
def test_64bit_uniform_model_passes(gap):
    """Calibration: the spec's resolution (2^-64 grid) gives the exact tail rate."""
    draws = draws_needed(VOCAB, gap)
    hits = simulated_tail_hits(draws, VOCAB, gap, uniform_bits=64, seed=2)
    assert tail_rate_pvalue(hits, draws, VOCAB, gap) > ALPHA


def test_too_few_draws_is_refused():
    with pytest.raises(ValueError, match="too few draws"):
        tail_rate_pvalue(0, 1000, VOCAB, 25.0)


def _kernel_tail_hits(gap: float, rows: int = 256) -> tuple[int, int]:
    dev = Device("cuda")
    sampler = Sampler(dev, VOCAB, max_logprobs=0, max_num_rows=rows)
    state = SamplingState(dev, 1, VOCAB)
    admit(dev, state, {0: RowRequest(SamplingParams(temperature=1.0), 20240611, (0,))})
    head = 77_777
    logits = torch.full((rows, VOCAB), -gap, dtype=torch.float32, device=dev.torch_device)
    logits[:, head] = 0.0
    state_rows = torch.zeros(rows, dtype=torch.int32, device=dev.torch_device)
    positions = torch.arange(rows, dtype=torch.int64, device=dev.torch_device)
    hits = torch.zeros((), dtype=torch.int64, device=dev.torch_device)
    calls = math.ceil(draws_needed(VOCAB, gap) / rows)

    def one_call() -> None:
        out = sampler.sample(logits, state, state_rows, positions, num_rows=rows)
        hits.add_((out.tokens != head).sum())
        positions.add_(rows)  # every draw at a fresh noise position

    for _ in range(calls):
        dev.enqueue(one_call, "tail draw")
    dev.synchronize()
    return int(hits), calls * rows


@pytest.mark.gpu
def test_kernel_samples_tokens_25_logits_down_at_the_exact_rate():
    hits, draws = _kernel_tail_hits(25.0)
    expected = draws * tail_probability(VOCAB, 25.0)
    print(f"\ndeep tail (gap 25): {hits} hits in {draws} draws, expected {expected:.1f}")
    assert tail_rate_pvalue(hits, draws, VOCAB, 25.0) > ALPHA


@pytest.mark.gpu
@pytest.mark.slow
def test_kernel_samples_tokens_30_logits_down_at_the_exact_rate():
    hits, draws = _kernel_tail_hits(30.0)
    expected = draws * tail_probability(VOCAB, 30.0)
    print(f"\ndeep tail (gap 30): {hits} hits in {draws} draws, expected {expected:.1f}")
    assert tail_rate_pvalue(hits, draws, VOCAB, 30.0) > ALPHA
