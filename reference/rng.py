"""The sampling RNG in plain PyTorch: the float64 twin of `impl/kernels/rng.py`.

The specification (runnercheck RNG v2) is stated once, in `runnercheck.impl.kernels.rng`'s docstring
and docs/SAMPLING.md ("RNG contract v2"):

* `philox4x32` -- Philox4x32-10 keyed by ``(seed lo, seed hi)`` with counter ``(c0, position, 0,
  stream)``, all four output words;
* sampling noise (`noise_bits`): token ``t``'s ``hi`` word is word ``t % 4`` of the call at
  ``c0 = t // 4`` on `NOISE_STREAM`, its ``lo`` word is word 0 of the call at ``c0 = t`` on
  `NOISE_LO_STREAM`;
* the speculative streams (`philox_64bits`): 64 bits ``(hi, lo) = (c0, c1)`` of the call at
  ``c0 = token id`` (the accept test: ``c0 = 0``) on their own stream;
* ``u = hi 2^-32 + (lo + 0.5) 2^-64`` clamped to ``1 - 2^-24``, Gumbel noise ``-log(-log1p(-u))``.

This file reproduces the bits exactly, one 32-bit word at a time in int64 arithmetic (products
wrap mod 2^64, which keeps the 64-bit product's bits intact), and computes the uniform and the
noise in float64 for **every** token from its full 64 bits (no interval bounds, no refinement:
the kernels' shortcut must land on this argmax).
"""
from __future__ import annotations

import torch

M0 = 0xD2511F53
M1 = 0xCD9E8D57
W0 = 0x9E3779B9
W1 = 0xBB67AE85
MASK32 = 0xFFFFFFFF
# docs/SAMPLING.md, "RNG streams": the sampler's hi words, the proposer's own draft noise, the accept
# test's uniforms, the residual/bonus resample and the sampler's lo words each have their own stream.
NOISE_STREAM = 0
DRAFT_STREAM = 1
ACCEPT_STREAM = 2
RESAMPLE_STREAM = 3
NOISE_LO_STREAM = 4


def _mullo(a: torch.Tensor, m: int) -> torch.Tensor:
    return (a * m) & MASK32


def _mulhi(a: torch.Tensor, m: int) -> torch.Tensor:
    # a < 2^32 and m < 2^32: the true product has 64 bits; int64 multiplication wraps mod 2^64,
    # so bits 32..63 of the wrapped result are the high word.
    return ((a * m) >> 32) & MASK32


def philox4x32(seed: int | torch.Tensor, counter: torch.Tensor, position: int | torch.Tensor,
               stream: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four output words (int64 tensors holding uint32) of Philox4x32-10 at counter
    ``(counter, position, 0, stream)`` under key ``(seed & 0xFFFFFFFF, seed >> 32)``; broadcasts."""
    c0 = torch.as_tensor(counter, dtype=torch.int64) & MASK32
    seed_t = torch.as_tensor(seed, dtype=torch.int64)
    position_t = torch.as_tensor(position, dtype=torch.int64)
    shape = torch.broadcast_shapes(c0.shape, seed_t.shape, position_t.shape)
    c0 = c0.expand(shape)
    k0 = (seed_t & MASK32).expand(shape)
    k1 = ((seed_t >> 32) & MASK32).expand(shape)
    c1 = (position_t & MASK32).expand(shape)
    c2 = torch.zeros_like(c0)
    c3 = torch.full_like(c0, stream)
    for rnd in range(10):
        hi0, lo0 = _mulhi(c0, M0), _mullo(c0, M0)
        hi1, lo1 = _mulhi(c2, M1), _mullo(c2, M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        if rnd < 9:
            k0 = (k0 + W0) & MASK32
            k1 = (k1 + W1) & MASK32
    return c0, c1, c2, c3


def philox_64bits(seed: int | torch.Tensor, position: int | torch.Tensor, token_ids: torch.Tensor,
                  stream: int = NOISE_STREAM) -> tuple[torch.Tensor, torch.Tensor]:
    """64 bits ``(hi, lo) = (c0, c1)`` at counter ``(token, position, 0, stream)``: the speculative streams' draws.

    Not the sampler's noise (that is `noise_bits`): one call per token, half its output used.
    """
    c0, c1, _, _ = philox4x32(seed, torch.as_tensor(token_ids, dtype=torch.int64), position, stream)
    return c0, c1


def noise_hi(seed: int | torch.Tensor, position: int | torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """The sampler's hi words: word ``t % 4`` of the `NOISE_STREAM` call at ``c0 = t // 4``."""
    token_ids = torch.as_tensor(token_ids, dtype=torch.int64)
    words = torch.stack(philox4x32(seed, token_ids // 4, position, NOISE_STREAM), dim=-1)
    return torch.gather(words, -1, (token_ids % 4).unsqueeze(-1).expand(*words.shape[:-1], 1)).squeeze(-1)


def noise_lo(seed: int | torch.Tensor, position: int | torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """The sampler's lo words: word 0 of the `NOISE_LO_STREAM` call at ``c0 = t``."""
    return philox4x32(seed, torch.as_tensor(token_ids, dtype=torch.int64), position, NOISE_LO_STREAM)[0]


def noise_bits(seed: int | torch.Tensor, position: int | torch.Tensor,
               token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's full 64 sampling bits ``(hi, lo)`` under RNG contract v2."""
    return noise_hi(seed, position, token_ids), noise_lo(seed, position, token_ids)


def uniform_from_bits(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """float64 uniform in (0, 1): ``hi 2^-32 + (lo + 0.5) 2^-64``, clamped to ``1 - 2^-24``."""
    u = hi.to(torch.float64) * 2.0**-32 + (lo.to(torch.float64) + 0.5) * 2.0**-64
    return torch.clamp(u, max=1.0 - 2.0**-24)


def gumbel_from_bits(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    u = uniform_from_bits(hi, lo)
    return -torch.log(-torch.log1p(-u))


def gumbel_noise(seed: int, position: int, vocab_size: int) -> torch.Tensor:
    """float64 Gumbel noise for every token id of the vocabulary at (seed, position), from each
    token's full 64 bits (`noise_bits`)."""
    return gumbel_from_bits(*noise_bits(seed, position, torch.arange(vocab_size, dtype=torch.int64)))
