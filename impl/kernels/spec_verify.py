"""Speculative verification on the device: docs/SAMPLING.md "Probabilistic speculative verification".

`spec_verify_kernel` runs one program per request of the batch (``num_reqs`` programs).  Request
``r`` owns draft rows ``[cu[r], cu[r+1])`` (``k_r`` of them: draft tokens and draft
probabilities) and target rows ``[cu[r] + r, cu[r+1] + r + 1)`` (``k_r + 1``: the last is the
bonus position); its seed and temperature are read through ``idx_mapping[r]`` (the state row, as
the sampler reads its parameters) and its noise position of target row 0 from ``positions[r]``.

* greedy (temperature 0): per target row one pass for ``argmax p`` (lowest index), compared with
  the draft; the loop stops deciding at the first mismatch.
* rejection sampling: scalar loads of ``p_i(d_i)`` and ``q_i(d_i)`` per draft, the accept
  uniform from `runnercheck.impl.kernels.rng` at ``(0, P + i, 0, ACCEPT_STREAM)``.  The row to resample
  (``accepted``: the first rejected draft's, or the bonus row) is then drawn by two more launches:
  `spec_resample_partials_kernel`, one program per (request, vocabulary span of ``CHUNK`` tokens), tracks
  the Gumbel-max over the residual and over ``p`` at once (`residual_span_partials`: so the all-zero
  residual needs no second read), and `spec_resample_combine_kernel`, one program per request, takes the
  lowest token at the largest score over the spans (`combine_partials`) and writes it at column
  ``accepted``.  Noise is per (seed, position, token), so the split gives the one-pass token exactly, and
  every token's 64-bit Philox draw runs spread over the machine instead of on one SM per request.

The first launch writes every output row to -1, so an emitted row is ``accepted + 1`` tokens then
padding.  Memory written: the output, and the span partials (the caller's int32 ``[R, 4, spans]`` buffer).
"""
from __future__ import annotations

import triton
import triton.language as tl

from runnercheck.impl.kernels.rng import ACCEPT_STREAM, RESAMPLE_STREAM, gumbel_from_bits, philox_64bits, uniform_from_bits

# Tokens per program of a span-split Gumbel-max (the resample here, the draft sample of `draft_model`): a row's
# 64-bit Philox draws spread over ~V/4096 programs (151936 tokens: 38 a row), few enough that the combine reads one
# short row of partials.
SPAN_TOKENS = 4096
# Tokens a span-split program holds at a time: it walks its span (or a whole row it copies) in blocks of this width.
SPAN_BLOCK = 1024


def spans_of(vocab_size: int, span_tokens: int = SPAN_TOKENS) -> tuple[int, int]:
    """``(span width, span count)`` of a row of ``vocab_size`` tokens split into spans of at most ``span_tokens``
    (a power of two): the ``CHUNK`` and the partials' last dimension of a span-split launch."""
    width = min(span_tokens, max(2, triton.next_power_of_2(vocab_size)))
    return width, triton.cdiv(vocab_size, width)


@triton.jit
def _lowest_at_max(best, best_token, vocab_size):
    """Per-lane running maxima -> (row maximum, lowest token id holding it)."""
    top = tl.max(best, axis=0)
    return top, tl.min(tl.where(best == top, best_token, vocab_size), axis=0)


@triton.jit
def _greedy_argmax(p_row, vocab_size, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    best = tl.full((BLOCK,), float("-inf"), tl.float32)
    best_token = tl.full((BLOCK,), vocab_size, tl.int32)
    for start in range(0, vocab_size, BLOCK):
        offs = start + lanes
        p = tl.load(p_row + offs, mask=offs < vocab_size, other=float("-inf"))
        better = p > best  # strict: an earlier chunk keeps the lane on ties (lowest index)
        best = tl.where(better, p, best)
        best_token = tl.where(better, offs, best_token)
    top, token = _lowest_at_max(best, best_token, vocab_size)
    return tl.where(token >= vocab_size, 0, token)


@triton.jit
def residual_span_partials(p_row, q_row, use_residual, seed, position, start, stop, BLOCK: tl.constexpr,
                           STREAM: tl.constexpr):
    """Gumbel-max partials of ``[start, stop)``: ``(top_r, token_r, top_p, token_p)``, the largest ``log r + g``
    (noise of ``STREAM``) over ``r = max(0, p - q)`` and the largest ``log p + g``, each with the lowest token
    holding it (``token = stop`` where no token has mass).  ``use_residual`` false: q is not read (r = p)."""
    lanes = tl.arange(0, BLOCK)
    best_r = tl.full((BLOCK,), float("-inf"), tl.float32)
    token_r = tl.full((BLOCK,), stop, tl.int32)
    best_p = tl.full((BLOCK,), float("-inf"), tl.float32)
    token_p = tl.full((BLOCK,), stop, tl.int32)
    for first in range(start, stop, BLOCK):
        offs = first + lanes
        in_span = offs < stop
        p = tl.load(p_row + offs, mask=in_span, other=0.0)
        # the flag broadcast to the block first: the interpreter refuses a block mask & a 0-d mask
        q = tl.load(q_row + offs, mask=in_span & ((offs * 0 + use_residual) != 0), other=0.0)
        hi, lo = philox_64bits(seed, position, offs, STREAM)
        g = gumbel_from_bits(hi, lo)
        r = tl.maximum(p - q, 0.0)
        score_r = tl.where(in_span & (r > 0.0), tl.log(tl.where(r > 0.0, r, 1.0)) + g, float("-inf"))
        score_p = tl.where(in_span & (p > 0.0), tl.log(tl.where(p > 0.0, p, 1.0)) + g, float("-inf"))
        better_r = score_r > best_r  # strict: an earlier step keeps the lane on ties (lowest index)
        best_r = tl.where(better_r, score_r, best_r)
        token_r = tl.where(better_r, offs, token_r)
        better_p = score_p > best_p
        best_p = tl.where(better_p, score_p, best_p)
        token_p = tl.where(better_p, offs, token_p)
    top_r, tok_r = _lowest_at_max(best_r, token_r, stop)
    top_p, tok_p = _lowest_at_max(best_p, token_p, stop)
    return top_r, tok_r, top_p, tok_p


@triton.jit
def store_partials(part_ptr, row, chunk, num_chunks, top_r, tok_r, top_p, tok_p):
    """A span's partials into ``part_ptr`` (int32 ``[rows, 4, num_chunks]``: scores as their fp32 bits)."""
    base = part_ptr + row.to(tl.int64) * 4 * num_chunks + chunk
    tl.store(base, top_r.to(tl.int32, bitcast=True))
    tl.store(base + num_chunks, tok_r)
    tl.store(base + 2 * num_chunks, top_p.to(tl.int32, bitcast=True))
    tl.store(base + 3 * num_chunks, tok_p)


@triton.jit
def combine_partials(part_ptr, row, num_chunks, vocab_size, CHUNKS_P2: tl.constexpr):
    """The sampled token of ``row`` from its spans' partials: the lowest token at the largest residual score,
    or, when the residual is zero everywhere, at the largest ``log p + g`` (0 for a row without mass, which
    the launchers' checks refuse).  Spans cover the row in order, so this is the one-pass rule exactly."""
    chunks = tl.arange(0, CHUNKS_P2)
    valid = chunks < num_chunks
    base = part_ptr + row.to(tl.int64) * 4 * num_chunks + chunks
    top_r = tl.load(base, mask=valid, other=0).to(tl.float32, bitcast=True)
    tok_r = tl.load(base + num_chunks, mask=valid, other=0)
    top_p = tl.load(base + 2 * num_chunks, mask=valid, other=0).to(tl.float32, bitcast=True)
    tok_p = tl.load(base + 3 * num_chunks, mask=valid, other=0)
    top_r = tl.where(valid, top_r, float("-inf"))
    top_p = tl.where(valid, top_p, float("-inf"))
    # a span without mass names its end as its token: not a token of the row
    best_r, token_r = _lowest_at_max(top_r, tl.where(top_r > float("-inf"), tok_r, vocab_size), vocab_size)
    best_p, token_p = _lowest_at_max(top_p, tl.where(top_p > float("-inf"), tok_p, vocab_size), vocab_size)
    token = tl.where(best_r > float("-inf"), token_r, token_p)
    return tl.where(token >= vocab_size, 0, token)


@triton.jit(do_not_specialize=["vocab_size"])
def spec_verify_kernel(
    target_ptr, target_stride, draft_probs_ptr, draft_stride, draft_tokens_ptr, cu_drafts_ptr, idx_mapping_ptr,
    seed_ptr, temperature_ptr, position_ptr, out_tokens_ptr, out_stride, accepted_ptr, vocab_size,
    OUT_WIDTH: tl.constexpr, OUT_P2: tl.constexpr, BLOCK: tl.constexpr,
):
    req = tl.program_id(0)
    state_row = tl.load(idx_mapping_ptr + req).to(tl.int64)
    seed = tl.load(seed_ptr + state_row)
    temperature = tl.load(temperature_ptr + state_row)
    position = tl.load(position_ptr + req).to(tl.int64)
    d_start = tl.load(cu_drafts_ptr + req).to(tl.int64)
    k = tl.load(cu_drafts_ptr + req + 1).to(tl.int64) - d_start
    t_start = d_start + req
    out_row = out_tokens_ptr + req.to(tl.int64) * out_stride
    cols = tl.arange(0, OUT_P2)
    tl.store(out_row + cols, tl.full((OUT_P2,), -1, tl.int64), mask=cols < OUT_WIDTH)

    accepted = tl.full((), 0, tl.int64)
    done = tl.full((), 0, tl.int32)
    if temperature == 0.0:
        for i in range(0, k + 1):
            if done == 0:
                target = _greedy_argmax(target_ptr + (t_start + i) * target_stride, vocab_size, BLOCK).to(tl.int64)
                draft = tl.load(draft_tokens_ptr + d_start + i, mask=i < k, other=-1).to(tl.int64)
                if draft == target:
                    tl.store(out_row + i, draft)
                    accepted += 1
                else:
                    tl.store(out_row + i, target)  # the first mismatch, or the bonus row (i == k)
                    done = 1
    else:
        zero = req * 0
        for i in range(0, k):
            if done == 0:
                draft = tl.load(draft_tokens_ptr + d_start + i).to(tl.int64)
                p_d = tl.load(target_ptr + (t_start + i) * target_stride + draft)
                q_d = tl.load(draft_probs_ptr + (d_start + i) * draft_stride + draft)
                hi, lo = philox_64bits(seed, position + i, zero, ACCEPT_STREAM)
                u = uniform_from_bits(hi, lo)
                if u * q_d < p_d:
                    tl.store(out_row + i, draft)
                    accepted += 1
                else:
                    done = 1
        # the resample at row ``accepted``: `spec_resample_partials_kernel`, then `spec_resample_combine_kernel`
    tl.store(accepted_ptr + req, accepted.to(tl.int32))


@triton.jit(do_not_specialize=["vocab_size", "num_chunks"])
def spec_resample_partials_kernel(
    target_ptr, target_stride, draft_probs_ptr, draft_stride, cu_drafts_ptr, idx_mapping_ptr, seed_ptr,
    temperature_ptr, position_ptr, accepted_ptr, part_ptr, num_chunks, vocab_size,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):
    """Program (request, span): the Gumbel-max partials of the request's resample row over one ``CHUNK`` of it."""
    req = tl.program_id(0)
    chunk = tl.program_id(1)
    state_row = tl.load(idx_mapping_ptr + req).to(tl.int64)
    if tl.load(temperature_ptr + state_row) != 0.0:
        seed = tl.load(seed_ptr + state_row)
        d_start = tl.load(cu_drafts_ptr + req).to(tl.int64)
        k = tl.load(cu_drafts_ptr + req + 1).to(tl.int64) - d_start
        accepted = tl.load(accepted_ptr + req).to(tl.int64)
        position = tl.load(position_ptr + req).to(tl.int64) + accepted
        start = chunk * CHUNK
        top_r, tok_r, top_p, tok_p = residual_span_partials(
            target_ptr + (d_start + req + accepted) * target_stride, draft_probs_ptr + (d_start + accepted) * draft_stride,
            (accepted < k).to(tl.int32), seed, position, start, tl.minimum(start + CHUNK, vocab_size), BLOCK,
            RESAMPLE_STREAM)
        store_partials(part_ptr, req, chunk, num_chunks, top_r, tok_r, top_p, tok_p)


@triton.jit(do_not_specialize=["vocab_size", "num_chunks"])
def spec_resample_combine_kernel(idx_mapping_ptr, temperature_ptr, accepted_ptr, part_ptr, out_tokens_ptr, out_stride,
                                 num_chunks, vocab_size, CHUNKS_P2: tl.constexpr):
    """Program per request: the resampled (or bonus) token at its output column ``accepted``."""
    req = tl.program_id(0)
    state_row = tl.load(idx_mapping_ptr + req).to(tl.int64)
    if tl.load(temperature_ptr + state_row) != 0.0:
        token = combine_partials(part_ptr, req, num_chunks, vocab_size, CHUNKS_P2)
        accepted = tl.load(accepted_ptr + req).to(tl.int64)
        tl.store(out_tokens_ptr + req.to(tl.int64) * out_stride + accepted, token.to(tl.int64))
