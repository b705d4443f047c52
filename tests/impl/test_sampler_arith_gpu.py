"""Compiled, the sampler's two arithmetic shortcuts give the bits of what they replace.

* `load_row_scores` scales a row by one reciprocal and a multiply a token where the temperature is a normal float
  (docs/SAMPLING.md step 3): the bits of ``logit / T`` as Triton compiles it (``div.full.f32``, whose range
  scalings are off for such a divisor); any other temperature still divides.
* `_noisy_chunk_argmax` reads a penalty-free reference's logit again and scales it unfused
  (`scale_by_temperature(..., UNFUSED=True)`): its key ``score + noise`` has the bits of the chunk's own score plus
  the noise, which the product contracted into the add (one rounding; the planted bug) does not give.
* `_key_bounds` takes ``exp2((m - s) log2 e)`` (one ``ex2.approx.ftz``): the bits of ``tl.exp(m - s)`` (``ex2.approx``
  with a guard for results below 2^-126), since ``m - s >= 0``.

The interpreter evaluates both with numpy, not with these instructions, so only a GPU can check them: skipped
without CUDA.
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from runnercheck.impl.kernels.rng import gumbel_noise, noise_exp_lower
from runnercheck.impl.kernels.sampling import _key_bounds
from runnercheck.impl.kernels.sampling_select import load_row_scores, scale_by_temperature

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

WIDTH = 4096

# Normal temperatures, the range's two ends included (the multiply), then a subnormal one and one above 2^126 (the
# division).
TEMPERATURES = (2.0**-126, 1e-30, 0.013, 0.3, 0.7, 1.0, 1.7, 3.3, 1e30, 2.0**126, 1e-40, 3e38)


@triton.jit
def _row_scores(logits_ptr, temperature_ptr, row, WIDTH: tl.constexpr):
    """``(offs, temperature, logits_row, score, raw)`` of a penalty-free row, scored by `load_row_scores`."""
    offs = tl.arange(0, WIDTH)
    temperature = tl.load(temperature_ptr + row)
    logits_row = logits_ptr + row * WIDTH
    score, raw = load_row_scores(logits_row, offs, offs < WIDTH, temperature, False, 1.0, 0.0, 0.0, logits_row,
                                 logits_row, logits_row, 0, True)
    return offs, temperature, logits_row, score, raw


@triton.jit
def _scores_kernel(logits_ptr, temperature_ptr, score_ptr, divided_ptr, WIDTH: tl.constexpr):
    row = tl.program_id(0)
    offs, temperature, logits_row, score, raw = _row_scores(logits_ptr, temperature_ptr, row, WIDTH)
    tl.store(score_ptr + row * WIDTH + offs, score)
    tl.store(divided_ptr + row * WIDTH + offs, raw / temperature)


@triton.jit
def _bounds_kernel(score_ptr, hi_ptr, bound_ptr, expected_ptr, WIDTH: tl.constexpr):
    row = tl.program_id(0)
    offs = row * WIDTH + tl.arange(0, WIDTH)
    score = tl.load(score_ptr + offs)
    hi = tl.load(hi_ptr + offs).to(tl.uint32)
    valid = score > float("-inf")
    m = tl.max(score, axis=0)
    bound = _key_bounds(score, valid, hi, m)
    w = tl.exp(m - score)
    tl.store(bound_ptr + offs, bound)
    tl.store(expected_ptr + offs, tl.where(valid & (w < float("inf")), noise_exp_lower(hi) * w, float("inf")))


def test_the_reciprocal_multiply_gives_the_divisions_bits_for_every_temperature() -> None:
    gen = torch.Generator().manual_seed(8)
    rows = len(TEMPERATURES)
    logits = torch.randn(rows, WIDTH, generator=gen) * torch.logspace(-3, 3, WIDTH)  # small to large magnitudes
    logits[:, :4] = torch.tensor([0.0, -0.0, 1e-38, -3e38])
    logits = logits.cuda()
    temperature = torch.tensor(TEMPERATURES, dtype=torch.float32).cuda()
    score, divided = torch.empty_like(logits), torch.empty_like(logits)
    _scores_kernel[(rows,)](logits, temperature, score, divided, WIDTH=WIDTH)
    same = score.view(torch.int32) == divided.view(torch.int32)
    assert bool(same.all()), [TEMPERATURES[r] for r in sorted(set(same.logical_not().nonzero()[:, 0].tolist()))]
    assert not bool(score.isnan().any())  # 0 / a subnormal T is 0 (the division), never 0 * inf


@triton.jit
def _reference_key_kernel(logits_ptr, temperature_ptr, picked_ptr, reloaded_ptr, WIDTH: tl.constexpr,
                          CONTRACTED: tl.constexpr):
    """Program (row, j): token j's key from the block's scores (picked out by a reduction) and from its logit
    read again and scaled alone (CONTRACTED, the planted bug: the product fused into the noise's add), each plus
    the same noise."""
    row = tl.program_id(0)
    j = tl.program_id(1)
    offs, temperature, logits_row, score, raw = _row_scores(logits_ptr, temperature_ptr, row, WIDTH)
    noise = gumbel_noise((row + 77).to(tl.int64), row + 5, j)
    tl.store(picked_ptr + row * WIDTH + j, tl.max(tl.where(offs == j, score, float("-inf")), axis=0) + noise)
    if CONTRACTED:
        key = tl.fma(tl.load(logits_row + j), 1.0 / temperature, noise)
    else:
        key = scale_by_temperature(tl.load(logits_row + j), temperature, True) + noise
    tl.store(reloaded_ptr + row * WIDTH + j, key)


def _reference_keys(contracted: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = 1024
    normal = [t for t in TEMPERATURES if 2.0**-126 <= t <= 2.0**126]
    temps = TEMPERATURES if not contracted else normal
    logits = torch.randn(len(temps), width, generator=torch.Generator().manual_seed(10)) * 4.0
    logits = logits.cuda()
    temperature = torch.tensor(temps, dtype=torch.float32).cuda()
    picked, reloaded = torch.empty_like(logits), torch.empty_like(logits)
    _reference_key_kernel[(len(temps), width)](logits, temperature, picked, reloaded, WIDTH=width,
                                               CONTRACTED=contracted)
    return picked, reloaded


def _same_bits(picked: torch.Tensor, reloaded: torch.Tensor) -> bool:
    finite = picked.isfinite()
    assert bool(finite.any()) and torch.equal(finite, reloaded.isfinite())
    return torch.equal(picked[finite].view(torch.int32), reloaded[finite].view(torch.int32))


def test_a_reloaded_reference_keeps_the_blocks_key_bits() -> None:
    assert _same_bits(*_reference_keys(contracted=False))


def test_a_contracted_reload_is_caught() -> None:
    """The planted bug: the product fused into the noise's add (one rounding, what a compiler may make of a plain
    multiply) differs from the block's key in some lanes, which the test above would catch."""
    assert not _same_bits(*_reference_keys(contracted=True))


def test_the_bounds_exp2_gives_exps_bits() -> None:
    gen = torch.Generator().manual_seed(9)
    rows = 8
    score = torch.randn(rows, WIDTH, generator=gen) * torch.linspace(0.0, 30.0, rows)[:, None]  # spreads up to ~120
    score[:, 1] = score[:, 0] - 88.72  # exp near overflow
    score[:, 2] = score[:, 0] - 89.0   # overflows: the lane cannot win (bound +inf)
    score[1:3, 3] = float("-inf")
    score[3] = float("-inf")           # no valid lane
    hi = torch.randint(0, 2**32, (rows, WIDTH), generator=gen, dtype=torch.int64)
    hi[:, :16] = torch.arange(16) * 37  # below 2^9: e_lo = 0
    score, hi = score.cuda(), hi.cuda()
    bound, expected = torch.empty_like(score), torch.empty_like(score)
    _bounds_kernel[(rows,)](score, hi, bound, expected, WIDTH=WIDTH)
    assert torch.equal(bound.view(torch.int32), expected.view(torch.int32))
    assert bool(bound.isinf().any()) and bool((bound == 0).any())
