"""The last step of `runnercheck.checks.chisq.samplers.GumbelSampler` fused into one Triton kernel, for CUDA runs.

Deep-tail tests need ~1e12 (row, token) noise draws; eager PyTorch materialises ~130 int64
temporaries per draw for the Philox rounds (~1.5e9 draws/s on an H200), a fused kernel keeps them
in registers.  Same math as the PyTorch path (`runnercheck.checks.chisq.samplers.gumbel_noise`): every token's full
64 bits under RNG contract v2 (`runnercheck.impl.kernels.rng`: hi words four tokens per Philox call,
lo words from their own stream; no interval bounds, no refinement, so this is the dense fp32
argmax the runner's refined sampler must equal bit for bit), then the uniform of the chosen variant, the spec's Gumbel transform,
and ``argmax(scores + noise)`` with the lowest index winning exact ties.  Precision variants that
need fp16/bf16 arithmetic stay on the PyTorch path (`FUSED_VARIANTS` lists what runs here).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from runnercheck.impl.kernels.rng import neg_log1p_neg, noise_hi_at, noise_hi_chunk, noise_lo, uniform_from_bits

FUSED_VARIANTS = {"u64": 0, "u32": 1, "floor31": 2, "u24": 3}


@triton.jit
def _variant_noise(hi, lo, VARIANT: tl.constexpr):
    if VARIANT == 1:  # 32-bit uniform, midpoint: never 0, noise capped at 33 ln 2
        u = tl.minimum((hi.to(tl.float32) + 0.5) * 2.3283064365386963e-10, 0.99999994039535522)
    elif VARIANT == 3:  # 24-bit uniform like fp32 torch.rand: 0 happens, noise +inf
        u = tl.minimum((hi >> 8).to(tl.float32) * 5.9604644775390625e-08, 0.99999994039535522)
    else:
        u = uniform_from_bits(hi, lo)
        if VARIANT == 2:  # floored at 2^-31: noise capped at 31 ln 2
            u = tl.maximum(u, 4.656612873077393e-10)
    return -tl.log(neg_log1p_neg(u))


@triton.jit
def _gumbel_argmax_kernel(scores_ptr, stride, seeds_ptr, positions_ptr, out_ptr, vocab,
                          VARIANT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    seed = tl.load(seeds_ptr + row)
    position = tl.load(positions_ptr + row)
    # Per-lane running best; a later block replaces a lane's best only when strictly greater, so
    # among equal values the lowest index survives, and the final min over lanes keeps that rule.
    lane = tl.arange(0, BLOCK)
    best = tl.full((BLOCK,), float("-inf"), tl.float32)
    best_index = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + lane
        mask = offs < vocab
        s = tl.load(scores_ptr + row * stride + offs, mask=mask, other=float("-inf"))
        if BLOCK >= 4:
            hi = noise_hi_chunk(seed, position, start, BLOCK)
        else:
            hi = noise_hi_at(seed, position, offs)
        lo = noise_lo(seed, position, offs)
        value = tl.where(mask & (s > float("-inf")), s + _variant_noise(hi, lo, VARIANT), float("-inf"))
        take = value > best
        best_index = tl.where(take, offs, best_index)
        best = tl.where(take, value, best)
    top = tl.max(best, axis=0)
    winner = tl.min(tl.where(best == top, best_index, vocab), axis=0)
    tl.store(out_ptr + row, winner.to(tl.int64))


def gumbel_argmax(scores: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, variant: str = "u64") -> torch.Tensor:
    """``argmax(scores + noise)`` per row; ``scores`` float32 ``[N, V]`` with -inf for filtered tokens.

    A row whose kept scores plus noise are all -inf yields 0 (as ``torch.argmax`` of an all -inf row).
    """
    if variant not in FUSED_VARIANTS:
        raise ValueError(f"variant {variant!r} is not fused; fused: {sorted(FUSED_VARIANTS)}")
    rows, vocab = scores.shape
    scores = scores.contiguous()
    out = torch.empty(rows, dtype=torch.int64, device=scores.device)
    if rows:
        block = min(1024, triton.next_power_of_2(vocab))
        _gumbel_argmax_kernel[(rows,)](scores, scores.stride(0), seeds.contiguous(), positions.contiguous(), out, vocab,
                                       VARIANT=FUSED_VARIANTS[variant], BLOCK=block)
    return out


@triton.jit
def _noise_from_bits_kernel(hi_ptr, lo_ptr, out_ptr, n, VARIANT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    hi = tl.load(hi_ptr + offs, mask=mask, other=0).to(tl.uint32)
    lo = tl.load(lo_ptr + offs, mask=mask, other=0).to(tl.uint32)
    tl.store(out_ptr + offs, _variant_noise(hi, lo, VARIANT), mask=mask)


def noise_from_bits(hi: torch.Tensor, lo: torch.Tensor, variant: str = "u64") -> torch.Tensor:
    """Test helper: the fused kernel's noise for given 64-bit draws (int64 tensors holding uint32)."""
    flat_hi, flat_lo = hi.reshape(-1).contiguous(), lo.reshape(-1).contiguous()
    out = torch.empty(flat_hi.shape, dtype=torch.float32, device=hi.device)
    block = 256
    _noise_from_bits_kernel[(triton.cdiv(flat_hi.numel(), block),)](flat_hi, flat_lo, out, flat_hi.numel(),
                                                                    VARIANT=FUSED_VARIANTS[variant], BLOCK=block)
    return out.reshape(hi.shape)
