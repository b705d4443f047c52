"""Token logprobs, ranks and top-n logprobs per row, without a ``[rows, vocab]`` logprob tensor.

One program per row (docs/SAMPLING.md "Logprobs", raw logits with NaN -> -inf; +inf is clamped
to FLT_MAX so a flagged row still yields finite output, which is not compared):

1. one pass: per-lane online max / sum-exp (the log-sum-exp), the count of logits strictly above
   the target's (its rank), the smallest finite logit;
2. when ``num_top > 0``: `sampling_select.narrow_threshold` finds the n-th largest logit (usually
   in one pass), `gather_candidates` collects everything at or above it (ties at the boundary in
   token order, capped), sorts the few candidates, and the first ``num_top`` are stored.
"""
from __future__ import annotations

import triton
import triton.language as tl

from impl.kernels.sampling_select import (
    FLOAT32_MAX,
    OUTCOME_ALL,
    gather_candidates,
    load_row_scores,
    narrow_threshold,
    next_float_up,
    unpack_candidate,
)


@triton.jit(do_not_specialize=["num_top"])
def token_logprobs_kernel(
    logits_ptr, logits_stride, target_ptr, scratch_ptr,
    logprob_out_ptr, rank_out_ptr, top_ids_out_ptr, top_logprobs_out_ptr, top_stride,
    num_top, vocab_size,
    BLOCK: tl.constexpr, NARROW_BLOCK: tl.constexpr, CAND: tl.constexpr, MAX_TOP: tl.constexpr,
    NPIV: tl.constexpr, MAX_PASSES: tl.constexpr,
):
    row = tl.program_id(0)
    logits_row = logits_ptr + row.to(tl.int64) * logits_stride
    scratch_row = scratch_ptr + row.to(tl.int64) * CAND
    target = tl.minimum(tl.maximum(tl.load(target_ptr + row).to(tl.int32), 0), vocab_size - 1)
    target_raw = tl.load(logits_row + target)
    target_score = tl.minimum(tl.where(target_raw != target_raw, float("-inf"), target_raw), FLOAT32_MAX)

    lanes = tl.arange(0, BLOCK)
    lane_max = tl.full((BLOCK,), float("-inf"), tl.float32)
    lane_sum = tl.zeros((BLOCK,), tl.float32)
    lane_min = tl.full((BLOCK,), float("inf"), tl.float32)
    above = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, vocab_size, BLOCK):
        offs = start + lanes
        in_vocab = offs < vocab_size
        score, raw = load_row_scores(logits_row, offs, in_vocab, 1.0, False, 1.0, 0.0, 0.0, logits_row, logits_row,
                                   logits_row, 0, False)
        new_max = tl.maximum(lane_max, score)
        # a lane that has seen only -inf keeps sum 0; shifting by 0 there avoids -inf - -inf
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        lane_sum = lane_sum * tl.exp(lane_max - shift) + tl.exp(score - shift)
        lane_max = new_max
        lane_min = tl.minimum(lane_min, tl.where(score > float("-inf"), score, float("inf")))
        above += (score > target_score).to(tl.int32)
    row_max = tl.max(lane_max, axis=0)
    row_shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    total = tl.sum(lane_sum * tl.exp(lane_max - row_shift), axis=0)
    log_normalizer = row_max + tl.log(total)
    tl.store(logprob_out_ptr + row, target_score - log_normalizer)
    tl.store(rank_out_ptr + row, 1 + tl.sum(above, axis=0))

    if num_top > 0:
        out_slots = tl.arange(0, CAND)
        ids = out_slots.to(tl.int64)  # an all -inf row: every logit ties, lowest ids first
        values = tl.full((CAND,), float("-inf"), tl.float32)
        if row_max > float("-inf"):
            row_min = tl.min(lane_min, axis=0)
            top = next_float_up(row_max)
            outcome, lo, hi, lo_count, lo_mass, above_count, above_mass, goal = narrow_threshold(
                logits_row, 1.0, False, 1.0, 0.0, 0.0, logits_row, logits_row, logits_row, vocab_size, row_max,
                row_min, float("-inf"), top, float("-inf"), num_top, 1.0, CAND - MAX_TOP, 0, False, False, CAND,
                NPIV, NARROW_BLOCK, MAX_PASSES)
            gather_all = outcome == OUTCOME_ALL
            candidates = gather_candidates(
                logits_row, 1.0, False, 1.0, 0.0, 0.0, logits_row, logits_row, logits_row, vocab_size, lo,
                tl.where(gather_all, top, hi), tl.where(gather_all, 0, above_count), ~gather_all, scratch_row, 0,
                False, CAND, NARROW_BLOCK)
            values, ids = unpack_candidate(candidates)
        keep = out_slots < num_top
        out_row = row.to(tl.int64) * top_stride
        tl.store(top_ids_out_ptr + out_row + out_slots, ids.to(tl.int32), mask=keep)
        tl.store(top_logprobs_out_ptr + out_row + out_slots, values - log_normalizer, mask=keep)
