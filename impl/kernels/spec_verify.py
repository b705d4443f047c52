"""Speculative verification on the device: docs/SAMPLING.md "Probabilistic speculative verification".

`spec_verify_kernel` runs one program per request of the batch (``num_reqs`` programs).  Request
``r`` owns draft rows ``[cu[r], cu[r+1])`` (``k_r`` of them: draft tokens and draft
probabilities) and target rows ``[cu[r] + r, cu[r+1] + r + 1)`` (``k_r + 1``: the last is the
bonus position); its seed and temperature are read through ``idx_mapping[r]`` (the state row, as
the sampler reads its parameters) and its noise position of target row 0 from ``positions[r]``.

* greedy (temperature 0): per target row one pass for ``argmax p`` (lowest index), compared with
  the draft; the loop stops deciding at the first mismatch.
* rejection sampling: scalar loads of ``p_i(d_i)`` and ``q_i(d_i)`` per draft, the accept
  uniform from `runnercheck.impl.kernels.rng` at ``(0, P + i, 0, ACCEPT_STREAM)``; then one pass over the
  vocabulary of the row to resample (`gumbel_max_residual`), which tracks the Gumbel-max over the residual
  and over ``p`` at once, so the all-zero residual needs no second read.

Every program first writes its output row to -1, so an emitted row is ``accepted + 1`` tokens then
padding.  No intermediate tensor: the only memory written is the output.
"""
from __future__ import annotations

import triton
import triton.language as tl

from runnercheck.impl.kernels.rng import ACCEPT_STREAM, RESAMPLE_STREAM, gumbel_from_bits, philox_64bits, uniform_from_bits


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
def gumbel_max_residual(p_row, q_row, use_residual, seed, position, vocab_size, BLOCK: tl.constexpr,
                        STREAM: tl.constexpr):
    """Gumbel-max of ``log r + g`` (noise of ``STREAM``) over ``r = max(0, p - q)``, or over ``p`` when
    that residual is zero everywhere or ``use_residual`` is false (the bonus row: q is not read).
    The draft-model proposer samples its drafts with it too (``use_residual = 0``, the draft stream)."""
    lanes = tl.arange(0, BLOCK)
    best_r = tl.full((BLOCK,), float("-inf"), tl.float32)
    token_r = tl.full((BLOCK,), vocab_size, tl.int32)
    best_p = tl.full((BLOCK,), float("-inf"), tl.float32)
    token_p = tl.full((BLOCK,), vocab_size, tl.int32)
    for start in range(0, vocab_size, BLOCK):
        offs = start + lanes
        in_vocab = offs < vocab_size
        p = tl.load(p_row + offs, mask=in_vocab, other=0.0)
        # the flag broadcast to the block first: the interpreter refuses a block mask & a 0-d mask
        q = tl.load(q_row + offs, mask=in_vocab & ((offs * 0 + use_residual) != 0), other=0.0)
        hi, lo = philox_64bits(seed, position, offs, STREAM)
        g = gumbel_from_bits(hi, lo)
        r = tl.maximum(p - q, 0.0)
        score_r = tl.where(in_vocab & (r > 0.0), tl.log(tl.where(r > 0.0, r, 1.0)) + g, float("-inf"))
        score_p = tl.where(in_vocab & (p > 0.0), tl.log(tl.where(p > 0.0, p, 1.0)) + g, float("-inf"))
        better_r = score_r > best_r
        best_r = tl.where(better_r, score_r, best_r)
        token_r = tl.where(better_r, offs, token_r)
        better_p = score_p > best_p
        best_p = tl.where(better_p, score_p, best_p)
        token_p = tl.where(better_p, offs, token_p)
    top_r, tok_r = _lowest_at_max(best_r, token_r, vocab_size)
    top_p, tok_p = _lowest_at_max(best_p, token_p, vocab_size)
    token = tl.where(top_r > float("-inf"), tok_r, tok_p)
    return tl.where(token >= vocab_size, 0, token)  # a row without mass is refused by the launcher's checks


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
        token = gumbel_max_residual(target_ptr + (t_start + accepted) * target_stride,
                                    draft_probs_ptr + (d_start + accepted) * draft_stride, (accepted < k).to(tl.int32),
                                    seed, position + accepted, vocab_size, BLOCK, RESAMPLE_STREAM)
        tl.store(out_row + accepted, token.to(tl.int64))
    tl.store(accepted_ptr + req, accepted.to(tl.int32))
