"""The sampling RNG as Triton device functions (the spec; `reference/rng.py` is its PyTorch twin).

Specification (runnercheck RNG v2; docs/SAMPLING.md "RNG contract v2" has the proof)
-------------------------------------------------------------------------------------
A stateless counter-based generator: Philox4x32 with 10 rounds (`philox4x32`), keyed by the
request seed, counter ``(c0, position, 0, stream)``:

* key     ``(k0, k1) = (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)``  (seed in [0, 2^63))
* one round, with ``M0 = 0xD2511F53``, ``M1 = 0xCD9E8D57`` and all arithmetic mod 2^32::

      (c0, c1, c2, c3) <- (mulhi(M1, c2) ^ c1 ^ k0,  M1 * c2,  mulhi(M0, c0) ^ c3 ^ k1,  M0 * c0)

  followed by the key bump ``k0 += 0x9E3779B9; k1 += 0xBB67AE85``.  Ten rounds; the key is bumped
  after each of the first nine (the tenth round's output is the result).

Standard Philox4x32-10 (Salmon et al. 2011); counter 0 / key 0 gives Random123's published answer
``0x6627e8d5, 0xe169c58d, ...`` (pinned in ``tests/reference/test_rng.py``).

Streams: 0 ``NOISE_STREAM`` (the sampler's hi words), 1 ``DRAFT_STREAM`` (a proposer's draft
sampling), 2 ``ACCEPT_STREAM`` (speculative accept test), 3 ``RESAMPLE_STREAM`` (residual/bonus
resample), 4 ``NOISE_LO_STREAM`` (the sampler's lo words); others reserved.

* The **sampler's** 64 bits of token ``t``: ``hi`` = word ``t % 4`` of the call at
  ``c0 = t // 4`` on stream 0 (four tokens per call, all 128 bits used; `noise_hi_chunk`,
  `noise_hi_at`), ``lo`` = word 0 of the call at ``c0 = t`` on stream 4 (`noise_lo`), computed
  only for the tokens whose key, bounded from ``hi`` alone, can still reach the maximum (`noise_exp_lower`).
* The **speculative** streams keep one call per token: ``(hi, lo) = (c0, c1)`` at ``c0 = token``
  (`philox_64bits`; the accept test uses ``c0 = 0``).

Uniform and Gumbel noise
------------------------
``u = hi * 2^-32 + (lo + 0.5) * 2^-64``, then ``u = min(u, 1 - 2^-24)``, so ``u`` lies in
``(0, 1)``; its smallest value is 2^-65 (resolution near 0 far finer than 2^-60).  The noise is
``g = -log(-log1p(-u))`` (in the kernels ``-log1p(-u)`` is evaluated with Goldberg's
identity, see `neg_log1p_neg`); its winning tail sits at u -> 0, where ``-log1p(-u) ~ u`` keeps full
relative precision in fp32, so the largest noise is ``65 ln 2 ~ 45.05`` (>= 40).  A 32-bit
uniform would cap the noise near 22-23 and truncate deep tails (a token 25 logits below the head
is then never sampled).  The clamp at ``1 - 2^-24`` only touches the losing end (probability
2^-24, noise about -2.8 instead of lower) and is what fp32 rounding would do anyway.  ``g`` is
decreasing in ``u``: for a fixed ``hi`` the largest noise is at ``lo = 0``.

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
NOISE_STREAM = tl.constexpr(0)
# constexpr: jit functions may read only constexpr globals (docs/SAMPLING.md assigns the streams)
DRAFT_STREAM = tl.constexpr(1)
ACCEPT_STREAM = tl.constexpr(2)
RESAMPLE_STREAM = tl.constexpr(3)
NOISE_LO_STREAM = tl.constexpr(4)


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
def philox4x32(seed, counter, position, stream):
    """The four words of Philox4x32-10 at ``(counter, position, 0, stream)`` under int64 ``seed``.

    Broadcasts like ordinary Triton arithmetic (e.g. a scalar seed/position and a block of counters).
    The first round is written out: its counter has ``c2 = 0`` (``M1 * c2 = 0``, no multiply) and
    ``c1``, ``c3`` per row, so only ``M0 * c0`` varies per call.
    """
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c0 = counter.to(tl.uint32)
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
    return philox_round(c0, c1, c2, c3, k0, k1)


@triton.jit
def philox_64bits(seed, position, token_id, stream):
    """64 bits ``(hi, lo) = (c0, c1)`` at counter ``(token_id, position, 0, stream)``: the
    speculative streams' draws (one call per token; the sampler's noise is `noise_hi_chunk` +
    `noise_lo`)."""
    c0, c1, c2, c3 = philox4x32(seed, token_id, position, stream)
    return c0, c1


@triton.jit
def noise_hi_chunk(seed, position, start, CHUNK: tl.constexpr):
    """The hi words of tokens ``start .. start + CHUNK - 1`` (``start`` a multiple of 4): one call
    per four tokens, its words interleaved so lane ``i`` holds token ``start + i``'s word."""
    quads = start // 4 + tl.arange(0, CHUNK // 4)
    w0, w1, w2, w3 = philox4x32(seed, quads, position, NOISE_STREAM)
    return tl.interleave(tl.interleave(w0, w2), tl.interleave(w1, w3))


@triton.jit
def noise_hi_at(seed, position, token_id):
    """The hi word of arbitrary token ids (a candidate list): one call per token, one word kept."""
    w0, w1, w2, w3 = philox4x32(seed, token_id // 4, position, NOISE_STREAM)
    r = token_id % 4
    return tl.where(r == 0, w0, tl.where(r == 1, w1, tl.where(r == 2, w2, w3)))


@triton.jit
def noise_lo(seed, position, token_id):
    """The lo word of token ids: word 0 of the call at ``(token_id, position, 0, NOISE_LO_STREAM)``."""
    c0, c1, c2, c3 = philox4x32(seed, token_id, position, NOISE_LO_STREAM)
    return c0


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
    """fp32 Gumbel(0, 1) noise of arbitrary token ids from their full 64 bits (candidate lists)."""
    return gumbel_from_bits(noise_hi_at(seed, position, token_id), noise_lo(seed, position, token_id))


@triton.jit
def noise_exp_lower(hi):
    """A lower bound on ``E = -log1p(-u)`` (fp32) for every lo word of ``hi``: no logarithm per token.

    ``E = u + u^2/2 + u^3/3 + ...`` (every term positive), so its first four terms at
    ``u0 = floor(hi / 2^9) 2^-23 <= hi 2^-32`` (below every ``u`` of the hi word; built from the bits, exact, no
    int-to-float conversion) bound it from below; the clamp at ``1 - 2^-24`` only lowers ``u`` where
    ``E >= 16.6`` exceeds the four terms' 2.08.  The noise is
    ``g = -log E``, so a key ``s + g`` is at most ``s - log(e_lo)``; the sampler compares
    ``e_lo exp(m - s)`` across a chunk instead of taking logarithms (docs/SAMPLING.md "RNG contract v2"
    states the fp32 margins).  ``hi < 2^9`` (the deep tail) gives 0: such a token is always a candidate.
    """
    u0 = ((hi >> 9) | 0x3F800000).to(tl.float32, bitcast=True) - 1.0
    return u0 * (1.0 + u0 * (0.5 + u0 * (0.3333333432674408 + u0 * 0.25)))


@triton.jit
def _philox_table_kernel(seed_ptr, pos_ptr, hi_ptr, lo_ptr, noise_ptr, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    seed = tl.load(seed_ptr + row)
    pos = tl.load(pos_ptr + row)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < vocab
    hi = noise_hi_at(seed, pos, offs)
    lo = noise_lo(seed, pos, offs)
    tl.store(hi_ptr + row * vocab + offs, hi.to(tl.int64), mask=mask)
    tl.store(lo_ptr + row * vocab + offs, lo.to(tl.int64), mask=mask)
    tl.store(noise_ptr + row * vocab + offs, gumbel_from_bits(hi, lo), mask=mask)


def philox_table(seeds, positions, vocab: int):
    """Test helper: the sampler's (hi, lo, fp32 noise) tables ``[rows, vocab]`` for per-row seeds/positions."""
    import torch

    rows = seeds.shape[0]
    hi = torch.empty((rows, vocab), dtype=torch.int64, device=seeds.device)
    lo = torch.empty_like(hi)
    noise = torch.empty((rows, vocab), dtype=torch.float32, device=seeds.device)
    block = min(1024, triton.next_power_of_2(vocab))
    _philox_table_kernel[(rows, triton.cdiv(vocab, block))](seeds, positions, hi, lo, noise, vocab, BLOCK=block)
    return hi, lo, noise
