"""Token logprobs, ranks and top-n logprobs per row, without a ``[rows, vocab]`` logprob tensor.

Grid ``(rows, splits)``; each program covers one column span of its row (docs/SAMPLING.md
"Logprobs": raw logits with NaN -> -inf; +inf is clamped to FLT_MAX so a flagged row still yields
finite output, which is not compared):

1. one pass over the span: per-lane online max / sum-exp (partial log-sum-exp), the count of
   logits strictly above the target's (partial rank), the smallest finite logit;
2. when ``num_top > 0``: the span's own top-n (the row's top-n is among the union of the spans'):
   `sampling_select.narrow_threshold` finds the span's n-th largest logit (usually one pass),
   `gather_candidates` collects everything at or above it (ties at the boundary in token order,
   capped) and sorts the few candidates; the first n go to a per-row merge buffer.

The last program of a row to arrive (atomic counter, reset for the next launch) combines the
partial log-sum-exps and ranks, sorts the merged candidates and stores the top ``num_top``.
"""
from __future__ import annotations

import triton
import triton.language as tl

from impl.kernels.sampling_select import (
    EMPTY_CANDIDATE,
    FLOAT32_MAX,
    OUTCOME_ALL,
    gather_candidates,
    load_raw_chunk,
    narrow_threshold,
    next_float_up,
    pack_candidate,
    scores_from_raw,
    unpack_candidate,
)


@triton.jit(do_not_specialize=["num_top"])
def token_logprobs_kernel(
    logits_ptr, logits_stride, target_ptr, scratch_ptr, merge_ptr, partial_f_ptr, partial_i_ptr, counter_ptr,
    logprob_out_ptr, rank_out_ptr, top_ids_out_ptr, top_logprobs_out_ptr, top_stride,
    num_top, vocab_size, num_splits, split_len,
    BLOCK: tl.constexpr, CAND: tl.constexpr, MAX_TOP: tl.constexpr, NPIV: tl.constexpr,
    MAX_PASSES: tl.constexpr, MAX_SPLITS: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    logits_row = logits_ptr + row.to(tl.int64) * logits_stride
    span_start = split * split_len
    span_end = tl.minimum(span_start + split_len, vocab_size)
    target = tl.minimum(tl.maximum(tl.load(target_ptr + row).to(tl.int32), 0), vocab_size - 1)
    target_raw = tl.load(logits_row + target)
    target_score = tl.minimum(tl.where(target_raw != target_raw, float("-inf"), target_raw), FLOAT32_MAX)

    lanes = tl.arange(0, BLOCK)
    lane_max = tl.full((BLOCK,), float("-inf"), tl.float32)
    lane_sum = tl.zeros((BLOCK,), tl.float32)
    lane_min = tl.full((BLOCK,), float("inf"), tl.float32)
    above = tl.zeros((BLOCK,), tl.int32)
    raw_next = load_raw_chunk(logits_row, span_start + lanes, span_end)
    for start in range(span_start, span_end, BLOCK):
        offs = start + lanes
        raw = raw_next
        raw_next = load_raw_chunk(logits_row, offs + BLOCK, span_end)
        score = scores_from_raw(raw, offs, offs < span_end, 1.0, False, 1.0, 0.0, 0.0, logits_row, logits_row,
                                logits_row, 0, False)
        new_max = tl.maximum(lane_max, score)
        # a lane that has seen only -inf keeps sum 0; shifting by 0 there avoids -inf - -inf
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        lane_sum = lane_sum * tl.exp(lane_max - shift) + tl.exp(score - shift)
        lane_max = new_max
        lane_min = tl.minimum(lane_min, tl.where(score > float("-inf"), score, float("inf")))
        above += (score > target_score).to(tl.int32)
    span_max = tl.max(lane_max, axis=0)
    span_shift = tl.where(span_max == float("-inf"), 0.0, span_max)
    span_sum = tl.sum(lane_sum * tl.exp(lane_max - span_shift), axis=0)
    span_above = tl.sum(above, axis=0)

    merge_row = merge_ptr + row.to(tl.int64) * (MAX_SPLITS * MAX_TOP)
    out_slots = tl.arange(0, MAX_TOP)
    if num_top > 0:
        span_top = tl.minimum(num_top, span_end - span_start)
        # an all -inf span: every logit ties, lowest ids first
        candidates = tl.where(out_slots < span_top, pack_candidate(tl.full((MAX_TOP,), float("-inf"), tl.float32),
                                                                   span_start + out_slots), EMPTY_CANDIDATE)
        if span_max > float("-inf"):
            top = next_float_up(span_max)
            outcome, lo, hi, lo_count, lo_mass, above_count, above_mass, goal = narrow_threshold(
                logits_row, 1.0, False, 1.0, 0.0, 0.0, logits_row, logits_row, logits_row, 0, span_start, span_end,
                span_max, tl.min(lane_min, axis=0), float("-inf"), top, float("-inf"), span_top, 1.0,
                CAND - MAX_TOP, False, False, CAND, NPIV, BLOCK, MAX_PASSES)
            gather_all = outcome == OUTCOME_ALL
            sorted_candidates = gather_candidates(
                logits_row, 1.0, False, 1.0, 0.0, 0.0, logits_row, logits_row, logits_row, 0, span_start, span_end,
                lo, tl.where(gather_all, top, hi), tl.where(gather_all, 0, above_count), ~gather_all,
                scratch_ptr + (row.to(tl.int64) * MAX_SPLITS + split) * CAND, False, CAND, BLOCK)
            tl.store(merge_row + split * MAX_TOP + tl.arange(0, CAND), sorted_candidates,
                     mask=tl.arange(0, CAND) < MAX_TOP)
        else:
            tl.store(merge_row + split * MAX_TOP + out_slots, candidates)

    is_last = tl.full((), 1, tl.int32) != 0
    log_normalizer = span_shift + tl.log(span_sum)
    rank = 1 + span_above
    if num_splits > 1:
        f_slot = partial_f_ptr + (row.to(tl.int64) * MAX_SPLITS + split) * 2
        tl.store(f_slot, span_max)
        tl.store(f_slot + 1, span_sum)
        tl.store(partial_i_ptr + (row.to(tl.int64) * MAX_SPLITS + split) * 3, span_above)
        tl.debug_barrier()  # every thread's stores precede the release below
        is_last = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel") == num_splits - 1
        if is_last:
            splits = tl.arange(0, MAX_SPLITS)
            used = splits < num_splits
            f_row = partial_f_ptr + (row.to(tl.int64) * MAX_SPLITS + splits) * 2
            # volatile: bypass L1, which may hold this row's partials from an earlier launch
            maxima = tl.load(f_row, mask=used, other=float("-inf"), volatile=True)
            sums = tl.load(f_row + 1, mask=used, other=0.0, volatile=True)
            row_max = tl.max(maxima, axis=0)
            row_shift = tl.where(row_max == float("-inf"), 0.0, row_max)
            log_normalizer = row_shift + tl.log(tl.sum(sums * tl.exp(maxima - row_shift), axis=0))
            rank = 1 + tl.sum(tl.load(partial_i_ptr + (row.to(tl.int64) * MAX_SPLITS + splits) * 3, mask=used,
                                      other=0, volatile=True), axis=0)
            tl.store(counter_ptr + row, 0)
    else:
        tl.debug_barrier()  # the merge buffer was written by other threads of this program

    if is_last:
        tl.store(logprob_out_ptr + row, target_score - log_normalizer)
        tl.store(rank_out_ptr + row, rank)
        if num_top > 0:
            merged_slots = tl.arange(0, MAX_SPLITS * MAX_TOP)
            merged = tl.load(merge_row + merged_slots, mask=merged_slots < num_splits * MAX_TOP,
                             other=EMPTY_CANDIDATE, volatile=True)
            values, ids = unpack_candidate(tl.sort(merged, descending=True))
            keep = merged_slots < num_top
            out_row = row.to(tl.int64) * top_stride
            tl.store(top_ids_out_ptr + out_row + merged_slots, ids.to(tl.int32), mask=keep)
            tl.store(top_logprobs_out_ptr + out_row + merged_slots, values - log_normalizer, mask=keep)
