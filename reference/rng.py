"""The sampling RNG in plain PyTorch: the float64 twin of `impl/kernels/rng.py`.

The specification (runnercheck RNG v1) is stated once, in `runnercheck.impl.kernels.rng`'s docstring:
Philox4x32-10 keyed by ``(seed lo, seed hi)`` with counter ``(token_id, position, 0, stream)``,
64 bits ``(hi, lo) = (c0, c1)``, ``u = hi 2^-32 + (lo + 0.5) 2^-64`` clamped to ``1 - 2^-24``,
Gumbel noise ``-log(-log1p(-u))``.  This file reproduces the bits exactly, one 32-bit word at a
time in int64 arithmetic (products wrap mod 2^64, which keeps the 64-bit product's bits intact),
and computes the uniform and the noise in float64.
"""
from __future__ import annotations

import torch

M0 = 0xD2511F53
M1 = 0xCD9E8D57
W0 = 0x9E3779B9
W1 = 0xBB67AE85
MASK32 = 0xFFFFFFFF
NOISE_STREAM = 0
# docs/SAMPLING.md, "Probabilistic speculative verification": the proposer's own draft noise,
# the accept test's uniforms and the residual/bonus resample each have their own stream.
DRAFT_STREAM = 1
ACCEPT_STREAM = 2
RESAMPLE_STREAM = 3


def _mullo(a: torch.Tensor, m: int) -> torch.Tensor:
    return (a * m) & MASK32


def _mulhi(a: torch.Tensor, m: int) -> torch.Tensor:
    # a < 2^32 and m < 2^32: the true product has 64 bits; int64 multiplication wraps mod 2^64,
    # so bits 32..63 of the wrapped result are the high word.
    return ((a * m) >> 32) & MASK32


def philox_64bits(seed: int, position: int | torch.Tensor, token_ids: torch.Tensor, stream: int = NOISE_STREAM) -> tuple[torch.Tensor, torch.Tensor]:
    """The 64 random bits ``(hi, lo)`` (int64 tensors holding uint32 values) for each token id."""
    token_ids = torch.as_tensor(token_ids, dtype=torch.int64)
    k0 = seed & MASK32
    k1 = (seed >> 32) & MASK32
    c0 = token_ids & MASK32
    c1 = torch.as_tensor(position, dtype=torch.int64).expand_as(c0) & MASK32
    c2 = torch.zeros_like(c0)
    c3 = torch.full_like(c0, stream)
    for rnd in range(10):
        hi0, lo0 = _mulhi(c0, M0), _mullo(c0, M0)
        hi1, lo1 = _mulhi(c2, M1), _mullo(c2, M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        if rnd < 9:
            k0 = (k0 + W0) & MASK32
            k1 = (k1 + W1) & MASK32
    return c0, c1


def uniform_from_bits(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """float64 uniform in (0, 1): ``hi 2^-32 + (lo + 0.5) 2^-64``, clamped to ``1 - 2^-24``."""
    u = hi.to(torch.float64) * 2.0**-32 + (lo.to(torch.float64) + 0.5) * 2.0**-64
    return torch.clamp(u, max=1.0 - 2.0**-24)


def gumbel_from_bits(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    u = uniform_from_bits(hi, lo)
    return -torch.log(-torch.log1p(-u))


def gumbel_noise(seed: int, position: int, vocab_size: int) -> torch.Tensor:
    """float64 Gumbel noise for every token id of the vocabulary at (seed, position)."""
    hi, lo = philox_64bits(seed, position, torch.arange(vocab_size, dtype=torch.int64))
    return gumbel_from_bits(hi, lo)
