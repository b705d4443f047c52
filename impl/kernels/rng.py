"""The sampling RNG as Triton device functions (the spec; `reference/rng.py` is its PyTorch twin).

Specification (runnercheck RNG v1)
----------------------------------
A stateless counter-based generator: Philox4x32 with 10 rounds, keyed by the request seed and
counted by (vocabulary index, token position, stream):

* key     ``(k0, k1) = (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)``  (seed in [0, 2^63))
* counter ``(c0, c1, c2, c3) = (token_id, position, 0, stream)``; ``stream`` is 0 for
  sampling noise, 1 for a proposer's draft sampling, 2 for the speculative accept test and 3 for
  the speculative residual/bonus resample (docs/SAMPLING.md, "Probabilistic speculative
  verification"); other streams are reserved.
* one round, with ``M0 = 0xD2511F53``, ``M1 = 0xCD9E8D57`` and all arithmetic mod 2^32::

      (c0, c1, c2, c3) <- (mulhi(M1, c2) ^ c1 ^ k0,  M1 * c2,  mulhi(M0, c0) ^ c3 ^ k1,  M0 * c0)

  followed by the key bump ``k0 += 0x9E3779B9; k1 += 0xBB67AE85``.  Ten rounds; the key is bumped
  after each of the first nine (the tenth round's output is the result).
* the 64 random bits of the draw are ``hi = c0``, ``lo = c1`` of the result.

This is standard Philox4x32-10 (Salmon et al. 2011); counter 0 / key 0 gives Random123's
published answer ``0x6627e8d5, 0xe169c58d, ...`` (pinned in ``tests/reference/test_rng.py``).

Uniform and Gumbel noise
------------------------
``u = hi * 2^-32 + (lo + 0.5) * 2^-64``, then ``u = min(u, 1 - 2^-24)``, so ``u`` lies in
``(0, 1)``; its smallest value is 2^-65 (resolution near 0 far finer than 2^-60).  The noise is
``g = -log(-log1p(-u))`` (in the kernels ``-log1p(-u)`` is evaluated with Goldberg's
identity, see `neg_log1p_neg`); its winning tail sits at u -> 0, where ``-log1p(-u) ~ u`` keeps full
relative precision in fp32, so the largest noise is ``65 ln 2 ~ 45.05`` (>= 40).  A 32-bit
uniform would cap the noise near 22-23 and truncate deep tails (a token 25 logits below the head
is then never sampled).  The clamp at ``1 - 2^-24`` only touches the losing end (probability
2^-24, noise about -2.8 instead of lower) and is what fp32 rounding would do anyway.

The kernels compute ``u`` and ``g`` in fp32; the reference computes them in float64 from the same
bits.  The 64 bits are bit-exact between the two; the noise agrees to fp32 rounding.
"""
from __future__ import annotations

import triton
import triton.language as tl

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
NOISE_STREAM = 0
# constexpr: jit functions may read only constexpr globals (docs/SAMPLING.md assigns the streams)
DRAFT_STREAM = tl.constexpr(1)
ACCEPT_STREAM = tl.constexpr(2)
RESAMPLE_STREAM = tl.constexpr(3)


@triton.jit
def philox_round(c0, c1, c2, c3, k0, k1):
    """One round; each 32x32 -> 64-bit product is one widening multiply (IMAD.WIDE.U32 on sm_90)
    giving both halves, where ``umulhi`` + ``*`` compile to two multiplies (see `philox_round_hilo`)."""
    p0 = c0.to(tl.uint64) * 0xD2511F53
    p1 = c2.to(tl.uint64) * 0xCD9E8D57
    return (p1 >> 32).to(tl.uint32) ^ c1 ^ k0, p1.to(tl.uint32), (p0 >> 32).to(tl.uint32) ^ c3 ^ k1, p0.to(tl.uint32)


@triton.jit
def philox_round_hilo(c0, c1, c2, c3, k0, k1):
    """The same round with ``umulhi`` and ``*`` (the earlier form; the bench times both)."""
    hi0 = tl.umulhi(c0, 0xD2511F53)
    lo0 = c0 * 0xD2511F53
    hi1 = tl.umulhi(c2, 0xCD9E8D57)
    lo1 = c2 * 0xCD9E8D57
    return hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0


@triton.jit
def philox_64bits(seed, position, token_id, stream):
    """64 random bits ``(hi, lo)`` (uint32 each) for int64 ``seed``, int ``position``/``token_id``.

    Broadcasts like ordinary Triton arithmetic (e.g. a scalar seed/position and a block of ids).
    The first round is written out: its counter has ``c2 = 0`` (``M1 * c2 = 0``, no multiply) and
    ``c1``, ``c3`` per row, so only ``M0 * c0`` varies per token.
    """
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c0 = token_id.to(tl.uint32)
    p0 = c0.to(tl.uint64) * 0xD2511F53
    zero = c0 * 0  # broadcast the per-row words to the counter's shape
    c0, c1, c2, c3 = (position.to(tl.uint32) ^ k0) + zero, zero, (p0 >> 32).to(tl.uint32) ^ stream ^ k1, \
        p0.to(tl.uint32)
    k0 = k0 + 0x9E3779B9 + zero
    k1 = k1 + 0xBB67AE85 + zero
    for _ in tl.static_range(8):
        c0, c1, c2, c3 = philox_round(c0, c1, c2, c3, k0, k1)
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    c0, c1, c2, c3 = philox_round(c0, c1, c2, c3, k0, k1)
    return c0, c1


@triton.jit
def philox_64bits_hilo(seed, position, token_id, stream):
    """`philox_64bits` as first written (``umulhi`` + ``*`` rounds, no folding): the same bits."""
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c0 = token_id.to(tl.uint32)
    c1 = position.to(tl.uint32) + c0 * 0  # broadcast to the counter's shape
    c2 = c0 * 0
    c3 = c0 * 0 + stream
    k0 = k0 + c0 * 0
    k1 = k1 + c0 * 0
    for _ in tl.static_range(9):
        c0, c1, c2, c3 = philox_round_hilo(c0, c1, c2, c3, k0, k1)
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    c0, c1, c2, c3 = philox_round_hilo(c0, c1, c2, c3, k0, k1)
    return c0, c1


@triton.jit
def uniform_from_bits(hi, lo):
    """fp32 uniform in (0, 1) from 64 bits; resolution 2^-65 near 0 (see the module spec)."""
    u = hi.to(tl.float32) * 2.3283064365386963e-10 + (lo.to(tl.float32) + 0.5) * 5.421010862427522e-20
    return tl.minimum(u, 0.99999994039535522)  # 1 - 2^-24


@triton.jit
def neg_log1p_neg(u):
    """``-log1p(-u)`` to a few ulps in fp32 for u in (0, 1) (Triton has no portable log1p).

    Goldberg's identity ``log1p(x) = log(1 + x) * x / ((1 + x) - 1)``: the rounding of ``1 + x``
    cancels between numerator and denominator; where ``1 - u`` rounds to 1 the answer is ``u``.
    """
    w = 1.0 - u
    return tl.where(w == 1.0, u, tl.log(w) * (u / (w - 1.0)))


@triton.jit
def gumbel_from_bits(hi, lo):
    u = uniform_from_bits(hi, lo)
    return -tl.log(neg_log1p_neg(u))


@triton.jit
def gumbel_noise(seed, position, token_id):
    """fp32 Gumbel(0, 1) noise for (seed, position, token id), stream 0."""
    hi, lo = philox_64bits(seed, position, token_id, 0)
    return gumbel_from_bits(hi, lo)


@triton.jit
def _philox_table_kernel(seed_ptr, pos_ptr, hi_ptr, lo_ptr, noise_ptr, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    seed = tl.load(seed_ptr + row)
    pos = tl.load(pos_ptr + row)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < vocab
    hi, lo = philox_64bits(seed, pos, offs, 0)
    tl.store(hi_ptr + row * vocab + offs, hi.to(tl.int64), mask=mask)
    tl.store(lo_ptr + row * vocab + offs, lo.to(tl.int64), mask=mask)
    tl.store(noise_ptr + row * vocab + offs, gumbel_from_bits(hi, lo), mask=mask)


def philox_table(seeds, positions, vocab: int):
    """Test helper: the (hi, lo, fp32 noise) tables ``[rows, vocab]`` for per-row seeds/positions."""
    import torch

    rows = seeds.shape[0]
    hi = torch.empty((rows, vocab), dtype=torch.int64, device=seeds.device)
    lo = torch.empty_like(hi)
    noise = torch.empty((rows, vocab), dtype=torch.float32, device=seeds.device)
    block = min(1024, triton.next_power_of_2(vocab))
    _philox_table_kernel[(rows, triton.cdiv(vocab, block))](seeds, positions, hi, lo, noise, vocab, BLOCK=block)
    return hi, lo, noise
