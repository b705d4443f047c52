"""Token logprobs, ranks and top-n logprobs per row, without a ``[rows, vocab]`` logprob tensor.

docs/SAMPLING.md "Logprobs": raw logits with NaN -> -inf; +inf is clamped to FLT_MAX so a flagged
row still yields finite output (which is not compared).  Split like the sampler
(`impl.kernels.sampling_split`), in launch order:

1. `logprobs_block_kernel` (one program per (row, vocabulary chunk)), the only read of the logits
   in the usual case: the chunk's max, its sum-exp relative to that max, the count of logits
   strictly above the target's (the target, e.g. the sampled token, is known: logprobs run after
   sampling) and, when top-n is asked, the chunk's ``TOPS`` largest packed keys (score, then lower
   token id first; `sampling_select.pack_candidate`) by ``TOPS`` rounds in registers (max of the
   int32 order keys, lowest index at it, mask it);
2. `logprobs_plan_kernel` (per row): the log-sum-exp, the target's logprob and rank; the top ``n``
   of the ``TOPS`` keys per chunk by ``n`` rounds of max-and-mask.  They are the row's exact top
   ``n`` when the ``n``-th of them is above every chunk's ``TOPS``-th key (a token left out of its
   chunk's keys lies below that chunk's ``TOPS``-th key): the row is then DONE and its top-n
   stored.  Otherwise (a chunk holds ``TOPS`` or more of the top ``n``: ties, clustered logits)
   the plan is the older gather: the bound ``n``-th largest chunk max, or FALLBACK when it cannot
   bound (``n`` above the chunk count, fewer than ``n`` chunks with a finite entry);
3. `logprobs_select_kernel` (``select_programs`` per row, GATHER rows only): the entries at or above the bound, from the
   chunks whose max reaches it (the others are not read);
4. `logprobs_finish_kernel` (per row, GATHER rows only): compacts them, ranks them by counting (no
   sort) and stores the first ``n`` (ties by lower index); overflowed rows become FALLBACK;
5. `token_logprobs_kernel` (per row, FALLBACK rows only): the whole row in one program by pivot
   narrowing (`sampling_select.narrow_threshold`, `gather_candidates`).
"""
from __future__ import annotations

import triton
import triton.language as tl

from impl.kernels.sampling_split import (
    MODE_DONE,
    MODE_FALLBACK,
    MODE_GATHER,
    compact_block_candidates,
    descending_ranks,
    kth_largest_block_max,
    store_block_candidates,
)
from impl.kernels.sampling_select import (
    EMPTY_CANDIDATE,
    FLOAT32_MAX,
    OUTCOME_ALL,
    gather_candidates,
    load_row_scores,
    narrow_threshold,
    float_order_key,
    next_float_up,
    unpack_candidate,
)

# below every float_order_key (whose least value, -inf's, is -2139095041): a taken or out-of-vocab lane
_TAKEN = tl.constexpr(-2147483648)


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


@triton.jit(do_not_specialize=["num_blocks"])
def logprobs_block_kernel(logits_ptr, logits_stride, target_ptr, part_max_ptr, part_sum_ptr, part_above_ptr,
                          part_top_ptr, num_blocks, vocab_size, CHUNK: tl.constexpr, TOPS: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    target_score = _target_score(logits_ptr, logits_stride, target_ptr, row, vocab_size)
    offs = blk * CHUNK + tl.arange(0, CHUNK)
    score = _raw_scores(logits_ptr + row.to(tl.int64) * logits_stride, offs, offs < vocab_size)
    chunk_max = tl.max(score, axis=0)
    shift = tl.where(chunk_max == float("-inf"), 0.0, chunk_max)
    at = row.to(tl.int64) * num_blocks + blk
    tl.store(part_max_ptr + at, chunk_max)
    tl.store(part_sum_ptr + at, tl.sum(tl.exp(score - shift), axis=0))
    tl.store(part_above_ptr + at, tl.sum((score > target_score).to(tl.int32), axis=0))
    if TOPS > 0:  # the chunk's TOPS largest keys, descending (EMPTY_CANDIDATE past its entries)
        # rounds on int32 order keys and the lowest index at the max: cheaper than int64 packed keys
        order = tl.where(offs < vocab_size, float_order_key(score), _TAKEN)
        for i in tl.static_range(TOPS):
            if i == 0:
                best = float_order_key(chunk_max)  # every chunk holds an in-vocab entry
            else:
                best = tl.max(order, axis=0)
            best_at = tl.min(tl.where(order == best, offs, 2147483647), axis=0)
            key = (best.to(tl.int64) << 32) | (4294967295 - best_at.to(tl.int64))  # = pack_candidate
            tl.store(part_top_ptr + at * TOPS + i, tl.where(best == _TAKEN, EMPTY_CANDIDATE, key))
            if i + 1 < TOPS:
                order = tl.where(offs == best_at, _TAKEN, order)


@triton.jit(do_not_specialize=["num_blocks", "num_top"])
def logprobs_plan_kernel(logits_ptr, logits_stride, target_ptr, part_max_ptr, part_sum_ptr, part_above_ptr,
                         part_top_ptr, num_blocks, num_top, mode_ptr, bound_ptr, normalizer_ptr, logprob_out_ptr,
                         rank_out_ptr, top_ids_out_ptr, top_logprobs_out_ptr, top_stride, vocab_size,
                         NB_P2: tl.constexpr, CAND: tl.constexpr, COLS: tl.constexpr, TOPS: tl.constexpr,
                         PICK: tl.constexpr):
    row = tl.program_id(0)
    base = row.to(tl.int64) * num_blocks
    blocks = tl.arange(0, NB_P2)
    valid = blocks < num_blocks
    chunk_max = tl.load(part_max_ptr + base + blocks, mask=valid, other=float("-inf"))
    chunk_sum = tl.load(part_sum_ptr + base + blocks, mask=valid, other=0.0)
    above = tl.load(part_above_ptr + base + blocks, mask=valid, other=0)
    row_max = tl.max(chunk_max, axis=0)
    row_shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    log_normalizer = row_max + tl.log(tl.sum(chunk_sum * tl.exp(chunk_max - row_shift), axis=0))
    target_score = _target_score(logits_ptr, logits_stride, target_ptr, row, vocab_size)
    tl.store(logprob_out_ptr + row, target_score - log_normalizer)
    tl.store(rank_out_ptr + row, 1 + tl.sum(above, axis=0))
    bound = kth_largest_block_max(part_max_ptr, base, num_blocks, num_top, NB_P2, COLS)
    can_gather = (num_top <= num_blocks) & (num_top <= CAND // 2) & (bound > float("-inf"))
    mode = tl.where(num_top == 0, MODE_DONE, tl.where(can_gather, MODE_GATHER, MODE_FALLBACK))
    if TOPS > 0:
        exact = _store_first_pass_top(part_top_ptr, base, num_blocks, num_top, log_normalizer, top_ids_out_ptr,
                                      top_logprobs_out_ptr, row.to(tl.int64) * top_stride, NB_P2, TOPS, PICK)
        mode = tl.where(exact, MODE_DONE, mode)
    tl.store(mode_ptr + row, mode)
    tl.store(bound_ptr + row, bound)
    tl.store(normalizer_ptr + row, log_normalizer)


@triton.jit
def _store_first_pass_top(part_top_ptr, base, num_blocks, num_top, log_normalizer, top_ids_out_ptr,
                          top_logprobs_out_ptr, out_row, NB_P2: tl.constexpr, TOPS: tl.constexpr,
                          PICK: tl.constexpr):
    """Top ``num_top`` (1..PICK) of the chunks' first-pass keys; stored, and True, when they are the row's.

    Exact when the ``num_top``-th pick is above every chunk's ``TOPS``-th key: an entry missing from
    its chunk's keys is below that key (keys are distinct: they hold the token id).
    """
    slots = tl.arange(0, NB_P2 * TOPS)
    keys = tl.load(part_top_ptr + base * TOPS + slots, mask=slots < num_blocks * TOPS, other=EMPTY_CANDIDATE)
    blocks = tl.arange(0, NB_P2)
    floor = tl.max(tl.load(part_top_ptr + (base + blocks) * TOPS + (TOPS - 1), mask=blocks < num_blocks,
                           other=EMPTY_CANDIDATE), axis=0)
    out_slots = tl.arange(0, PICK)
    picked = tl.full((PICK,), EMPTY_CANDIDATE, tl.int64)
    last = tl.full((), EMPTY_CANDIDATE, tl.int64)
    for i in range(0, num_top):
        last = tl.max(keys, axis=0)
        picked = tl.where(out_slots == i, last, picked)
        keys = tl.where(keys == last, EMPTY_CANDIDATE, keys)
    exact = last > floor  # the caller launches TOPS > 0 only for num_top <= PICK
    values, ids = unpack_candidate(picked)
    keep = (out_slots < num_top) & ((tl.zeros((PICK,), tl.int32) + exact.to(tl.int32)) != 0)
    tl.store(top_ids_out_ptr + out_row + out_slots, ids.to(tl.int32), mask=keep)
    tl.store(top_logprobs_out_ptr + out_row + out_slots, values - log_normalizer, mask=keep)
    return exact


@triton.jit(do_not_specialize=["num_blocks"])
def logprobs_select_kernel(logits_ptr, logits_stride, mode_ptr, bound_ptr, part_max_ptr, part_count_ptr, slots_ptr,
                           num_blocks, vocab_size, CHUNK: tl.constexpr, SLOT: tl.constexpr):
    """Grid (rows, P): program p handles chunks p, p + P, ... of a GATHER row (few programs, since
    most rows are decided by the first pass and exit here at once)."""
    row = tl.program_id(0)
    if tl.load(mode_ptr + row) == MODE_GATHER:
        bound = tl.load(bound_ptr + row)
        for blk in range(tl.program_id(1), num_blocks, tl.num_programs(1)):
            at = row.to(tl.int64) * num_blocks + blk
            kept_count = tl.full((), 0, tl.int32)
            if tl.load(part_max_ptr + at) >= bound:  # other chunks hold no candidate: not read
                offs = blk * CHUNK + tl.arange(0, CHUNK)
                in_vocab = offs < vocab_size
                score = _raw_scores(logits_ptr + row.to(tl.int64) * logits_stride, offs, in_vocab)
                kept_count = store_block_candidates(score, offs, in_vocab & (score >= bound),
                                                    slots_ptr + at * SLOT, SLOT)
            tl.store(part_count_ptr + at, kept_count)


@triton.jit(do_not_specialize=["num_blocks", "num_top"])
def logprobs_finish_kernel(mode_ptr, normalizer_ptr, part_count_ptr, slots_ptr, scratch_ptr, num_blocks, num_top,
                           top_ids_out_ptr, top_logprobs_out_ptr, top_stride,
                           SCRATCH: tl.constexpr, CAND: tl.constexpr, SLOT: tl.constexpr, GROUP: tl.constexpr,
                           COLS: tl.constexpr):
    row = tl.program_id(0)
    if tl.load(mode_ptr + row) == MODE_GATHER:
        scratch_row = scratch_ptr + row.to(tl.int64) * SCRATCH
        overflow, candidates = compact_block_candidates(part_count_ptr, slots_ptr, row.to(tl.int64) * num_blocks,
                                                        num_blocks, scratch_row, CAND, SLOT, GROUP)
        if overflow != 0:
            tl.store(mode_ptr + row, MODE_FALLBACK)
        else:
            values, ids = unpack_candidate(candidates)
            rank = descending_ranks(candidates, scratch_row, CAND, COLS)  # ties: lower token id first
            keep = (candidates != EMPTY_CANDIDATE) & (rank < num_top)
            out_row = row.to(tl.int64) * top_stride
            tl.store(top_ids_out_ptr + out_row + rank, ids.to(tl.int32), mask=keep)
            tl.store(top_logprobs_out_ptr + out_row + rank, values - tl.load(normalizer_ptr + row), mask=keep)


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
