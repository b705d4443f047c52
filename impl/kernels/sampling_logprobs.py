"""Token logprobs, ranks and top-n logprobs per row, without a ``[rows, vocab]`` logprob tensor.

docs/SAMPLING.md "Logprobs": raw logits with NaN -> -inf; +inf is clamped to FLT_MAX so a flagged
row still yields finite output (which is not compared).  Two launches:

1. `logprobs_block_kernel`, one program per (vocabulary chunk, row), chunks of a row adjacent in
   launch order, so a row's chunks are read close together in time.  Each program reads its chunk
   once, as ``SUBS`` sub-blocks of ``SUB`` tokens, and writes the chunk's max, its sum-exp relative
   to that max, the count of logits strictly above the target's (the target, e.g. the sampled
   token, is known: logprobs run after sampling) and the max of every sub-block.  A per-row
   arrival counter (one atomic per program) makes the row's last program finish the row, while
   the row's logits are still in L2 (`_finish_row`): the log-sum-exp, the target's logprob and
   rank, and, for top-n, the bound ``T`` = the ``n``-th largest chunk max (``n`` distinct entries
   of the row reach it, so the row's ``n``-th largest entry is ``>= T``; `kth_largest_block_max`).
   Only sub-blocks whose max reaches ``T`` can hold an entry ``>= T``: typically ~``n`` of the
   row's ~1200, so the finish re-reads ~``n * SUB`` logits (not whole chunks) in a few 2-D gathers,
   keeps every entry ``>= T`` (all ties at the ``n``-th value among them) as packed keys (score,
   then lower token id first) and ranks them by counting.  The row is DONE; it is FALLBACK when
   ``T`` cannot bound (``n`` above the chunk count, fewer than ``n`` chunks with a finite entry)
   or more than ``CAND`` entries (or sub-blocks) reach ``T`` (ties, clustered logits).  The last
   program resets the counter to 0, so the next launch (or graph replay) starts from zero.
2. `token_logprobs_kernel` (per row, FALLBACK rows only; the others exit at once): the whole row in
   one program by pivot narrowing (`sampling_select.narrow_threshold`, `gather_candidates`).

Why one kernel with a last-arrival counter instead of stream-ordered combine launches (the
sampler's way, `runnercheck.impl.kernels.sampling_split`): a separate combine and gather launch re-reads the
candidate chunks from DRAM after every row's first read evicted them from L2, and each launch in
the chain adds its own latency; here the only extra traffic is the candidate sub-blocks, from L2.
"""
from __future__ import annotations

import triton
import triton.language as tl

from runnercheck.impl.kernels.sampling_split import MODE_DONE, MODE_FALLBACK, descending_ranks, kth_largest_block_max
from runnercheck.impl.kernels.sampling_select import (
    EMPTY_CANDIDATE,
    FLOAT32_MAX,
    OUTCOME_ALL,
    gather_candidates,
    load_row_scores,
    narrow_threshold,
    next_float_up,
    pack_candidate,
    unpack_candidate,
)


_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _raw_scores(logits_row, offs, in_vocab):
    score, raw = load_row_scores(logits_row, offs, in_vocab, 1.0, False, 1.0, 0.0, 0.0, logits_row, logits_row,
                                 logits_row, 0, False)
    return score


@triton.jit
def _target_score(logits_ptr, logits_stride, target_ptr, row, vocab_size):
    target = tl.minimum(tl.maximum(tl.load(target_ptr + row).to(tl.int32), 0), vocab_size - 1)
    target_raw = tl.load(logits_ptr + row.to(tl.int64) * logits_stride + target)
    return tl.minimum(tl.where(target_raw != target_raw, float("-inf"), target_raw), FLOAT32_MAX)


@triton.jit(do_not_specialize=["num_blocks", "num_top"])
def logprobs_block_kernel(logits_ptr, logits_stride, target_ptr, part_max_ptr, part_sum_ptr, part_above_ptr,
                          sub_max_ptr, arrivals_ptr, num_blocks, num_top, mode_ptr, sub_list_ptr, cand_ptr,
                          logprob_out_ptr, rank_out_ptr, top_ids_out_ptr, top_logprobs_out_ptr, top_stride,
                          vocab_size, CHUNK: tl.constexpr, SUB: tl.constexpr, NB_P2: tl.constexpr,
                          CAND: tl.constexpr, COLS: tl.constexpr):
    blk = tl.program_id(0)  # chunks of one row are adjacent in launch order (L2 reuse by the finish)
    row = tl.program_id(1)
    SUBS: tl.constexpr = CHUNK // SUB
    logits_row = logits_ptr + row.to(tl.int64) * logits_stride
    target_score = _target_score(logits_ptr, logits_stride, target_ptr, row, vocab_size)
    subs = tl.arange(0, SUBS)
    offs = blk * CHUNK + subs[:, None] * SUB + tl.arange(0, SUB)[None, :]
    score = _raw_scores(logits_row, offs, offs < vocab_size)
    sub_max = tl.max(score, axis=1)
    chunk_max = tl.max(sub_max, axis=0)
    shift = tl.where(chunk_max == float("-inf"), 0.0, chunk_max)
    at = row.to(tl.int64) * num_blocks + blk
    tl.store(part_max_ptr + at, chunk_max)
    # exp2 is one MUFU.EX2 (tl.exp adds a denormal rescale per logit); a term below 2^-126 of the
    # chunk max is far below fp32 resolution of the sum, which holds 1 from the max itself
    tl.store(part_sum_ptr + at, tl.sum(tl.math.exp2((score - shift) * _LOG2E)))  # axis None: one flat reduction
    tl.store(part_above_ptr + at, tl.sum((score > target_score).to(tl.int32)))
    tl.store(sub_max_ptr + at * SUBS + subs, sub_max)
    # every thread's partial stores happen before the one releasing atomic (bar.sync, then acq_rel)
    tl.debug_barrier()
    if tl.atomic_add(arrivals_ptr + row, 1) == num_blocks - 1:  # acquire: the row's other partials are visible
        tl.store(arrivals_ptr + row, 0)
        _finish_row(logits_row, target_score, part_max_ptr, part_sum_ptr, part_above_ptr, sub_max_ptr, row,
                    num_blocks, num_top, mode_ptr, sub_list_ptr, cand_ptr, logprob_out_ptr, rank_out_ptr,
                    top_ids_out_ptr, top_logprobs_out_ptr, top_stride, vocab_size, SUB, SUBS, NB_P2, CAND, COLS)


@triton.jit
def _finish_row(logits_row, target_score, part_max_ptr, part_sum_ptr, part_above_ptr, sub_max_ptr, row, num_blocks,
                num_top, mode_ptr, sub_list_ptr, cand_ptr, logprob_out_ptr, rank_out_ptr, top_ids_out_ptr,
                top_logprobs_out_ptr, top_stride, vocab_size, SUB: tl.constexpr, SUBS: tl.constexpr,
                NB_P2: tl.constexpr, CAND: tl.constexpr, COLS: tl.constexpr):
    """The row's last program: logprob and rank, then the top ``num_top`` from the sub-blocks reaching ``T``.

    Partials written by the row's other programs are read with ``.cg`` (L2, never a stale L1 line).
    """
    base = row.to(tl.int64) * num_blocks
    blocks = tl.arange(0, NB_P2)
    valid = blocks < num_blocks
    chunk_max = tl.load(part_max_ptr + base + blocks, mask=valid, other=float("-inf"), cache_modifier=".cg")
    chunk_sum = tl.load(part_sum_ptr + base + blocks, mask=valid, other=0.0, cache_modifier=".cg")
    above = tl.load(part_above_ptr + base + blocks, mask=valid, other=0, cache_modifier=".cg")
    row_max = tl.max(chunk_max, axis=0)
    row_shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    log_normalizer = row_max + tl.log(tl.sum(chunk_sum * tl.exp(chunk_max - row_shift), axis=0))
    tl.store(logprob_out_ptr + row, target_score - log_normalizer)
    tl.store(rank_out_ptr + row, 1 + tl.sum(above, axis=0))
    mode = tl.full((), MODE_DONE, tl.int32)
    if num_top > 0:
        bound = kth_largest_block_max(part_max_ptr, base, num_blocks, num_top, NB_P2, COLS)
        # sub-blocks reaching the bound, listed in token order (their count bounds the entries >= T from below)
        lanes = tl.arange(0, NB_P2 * SUBS)
        sub = tl.load(sub_max_ptr + base * SUBS + lanes, mask=lanes < num_blocks * SUBS, other=float("-inf"),
                      cache_modifier=".cg")
        hit = sub >= bound
        num_hits = tl.sum(hit.to(tl.int32), axis=0)
        fits = (bound > float("-inf")) & (num_hits <= CAND)
        if fits:
            list_row = sub_list_ptr + row.to(tl.int64) * CAND
            slot = tl.cumsum(hit.to(tl.int32), axis=0) - 1
            tl.store(list_row + slot, lanes, mask=hit)
            tl.debug_barrier()  # the list was written by other threads of this program
            cand_row = cand_ptr + row.to(tl.int64) * CAND
            group = tl.arange(0, SUBS)  # one chunk's shape per gather: [SUBS, SUB]
            cols = tl.arange(0, SUB)
            total = tl.full((), 0, tl.int32)
            for first in range(0, num_hits, SUBS):
                listed = first + group < num_hits
                start = tl.load(list_row + first + group, mask=listed, other=0) * SUB
                offs = start[:, None] + cols[None, :]
                in_vocab = listed[:, None] & (offs < vocab_size)
                score = _raw_scores(logits_row, offs, in_vocab)
                keep = in_vocab & (score >= bound)
                per_sub = tl.sum(keep.to(tl.int32), axis=1)
                dest = total + (tl.cumsum(per_sub, axis=0) - per_sub)[:, None] + tl.cumsum(keep.to(tl.int32), axis=1) - 1
                tl.store(cand_row + dest, pack_candidate(score, offs), mask=keep & (dest < CAND))
                total += tl.sum(per_sub, axis=0)
            fits = total <= CAND
            if fits:
                slots = tl.arange(0, CAND)
                tl.store(cand_row + slots, tl.full((CAND,), EMPTY_CANDIDATE, tl.int64), mask=slots >= total)
                tl.debug_barrier()  # the candidates were written by other threads of this program
                candidates = tl.load(cand_row + slots)
                values, ids = unpack_candidate(candidates)
                rank = descending_ranks(candidates, cand_row, CAND, COLS)  # ties: lower token id first
                keep_top = (candidates != EMPTY_CANDIDATE) & (rank < num_top)
                out_row = row.to(tl.int64) * top_stride
                tl.store(top_ids_out_ptr + out_row + rank, ids.to(tl.int32), mask=keep_top)
                tl.store(top_logprobs_out_ptr + out_row + rank, values - log_normalizer, mask=keep_top)
        mode = tl.where(fits, MODE_DONE, MODE_FALLBACK)
    tl.store(mode_ptr + row, mode)


@triton.jit(do_not_specialize=["num_top"])
def token_logprobs_kernel(
    logits_ptr, logits_stride, target_ptr, scratch_ptr, mode_ptr,
    logprob_out_ptr, rank_out_ptr, top_ids_out_ptr, top_logprobs_out_ptr, top_stride,
    num_top, vocab_size,
    BLOCK: tl.constexpr, NARROW_BLOCK: tl.constexpr, CAND: tl.constexpr, MAX_TOP: tl.constexpr,
    NPIV: tl.constexpr, MAX_PASSES: tl.constexpr,
):
    """The whole row in one program (FALLBACK rows only; the others exit at once)."""
    row = tl.program_id(0)
    if tl.load(mode_ptr + row) == MODE_FALLBACK:
        _token_logprobs_row(logits_ptr, logits_stride, target_ptr, scratch_ptr, logprob_out_ptr, rank_out_ptr,
                            top_ids_out_ptr, top_logprobs_out_ptr, top_stride, num_top, vocab_size, row, BLOCK,
                            NARROW_BLOCK, CAND, MAX_TOP, NPIV, MAX_PASSES)


@triton.jit
def _token_logprobs_row(
    logits_ptr, logits_stride, target_ptr, scratch_ptr,
    logprob_out_ptr, rank_out_ptr, top_ids_out_ptr, top_logprobs_out_ptr, top_stride,
    num_top, vocab_size, row,
    BLOCK: tl.constexpr, NARROW_BLOCK: tl.constexpr, CAND: tl.constexpr, MAX_TOP: tl.constexpr,
    NPIV: tl.constexpr, MAX_PASSES: tl.constexpr,
):
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
