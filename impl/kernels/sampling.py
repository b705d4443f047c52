"""The sampling kernels: docs/SAMPLING.md steps 0-7 in fp32, three launches per step.

`sample_kernel`, grid ``(rows, splits)``: every row is read in ``splits`` column spans by
separate programs (enough programs to fill the GPU whatever the batch size); each writes a
partial result and the last one to arrive for a row (an atomic counter, reset by that program for
the next launch) combines them.  Rows without min-p/top-k/top-p (and greedy rows) finish in this
**one pass**: the non-finite scan fused with the argmax of ``s + g`` (or of ``l`` when greedy).
Filtered rows leave their max/min score and ``stage = SELECT``.

`select_kernel`, grid ``(rows,)``: for ``SELECT`` rows only, the thresholds of min-p, top-k and
top-p (`sampling_select.narrow_threshold`, usually 1-2 passes each).  When the kept set is small
(at most ``CAND`` entries, e.g. top-k 50) it is gathered, sorted and sampled right there;
otherwise the row's threshold is stored with ``stage = THRESHOLD``.  Kept apart from the split
pass because its registers (pivot accumulators, candidate sort) would starve that pass's
occupancy.

`sample_threshold_kernel`, grid ``(rows, splits)``: the split Gumbel-max over
``s >= threshold`` for ``THRESHOLD`` rows (the others exit at once).

Each pass re-reads the logits and re-applies penalties and temperature: no ``[rows, vocab]``
intermediate exists.  Noise is `impl.kernels.rng.gumbel_noise(seed, position, token id)`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from impl.kernels.rng import gumbel_noise
from impl.kernels.sampling_select import (
    EMPTY_CANDIDATE,
    OUTCOME_ALL,
    OUTCOME_BRACKET,
    OUTCOME_EXACT,
    gather_candidates,
    load_raw_chunk,
    narrow_threshold,
    next_float_up,
    scores_from_raw,
    unpack_candidate,
)


STAGE_DONE = tl.constexpr(0)
STAGE_SELECT = tl.constexpr(1)
STAGE_THRESHOLD = tl.constexpr(2)


@triton.jit
def _filtered_threshold(logits_row, divisor, has_penalty, repetition, frequency, presence, prompt_mask_row,
                        counts_row, draft_row, num_drafts, vocab_size, row_max, row_min, top_k, top_k_on, top_p,
                        top_p_on, min_p, min_p_on, scratch_row, CAND: tl.constexpr, NPIV: tl.constexpr,
                        BLOCK: tl.constexpr, MAX_PASSES: tl.constexpr):
    """``(threshold, use_candidates, candidates)``: keep ``s >= threshold`` (steps 4-6).

    When ``use_candidates`` is 1, ``candidates`` (sorted packed keys) hold every kept entry.
    """
    slots = tl.arange(0, CAND)
    top = next_float_up(row_max)
    min_p_threshold = tl.where(min_p_on, row_max + tl.log(tl.where(min_p_on, min_p, 1.0)), float("-inf"))
    candidates = tl.full((CAND,), EMPTY_CANDIDATE, tl.int64)
    use_candidates = tl.full((), 0, tl.int32)
    kth = tl.full((), float("-inf"), tl.float32)
    if top_k_on:
        k_outcome, k_lo, k_hi, k_lo_count, k_lo_mass, k_above_count, k_above_mass, k_goal = narrow_threshold(
            logits_row, divisor, has_penalty, repetition, frequency, presence, prompt_mask_row, counts_row,
            draft_row, num_drafts, 0, vocab_size, row_max, row_min, min_p_threshold, top, min_p_threshold, top_k,
            1.0, CAND, True, False, CAND, NPIV, BLOCK, MAX_PASSES)
        if (k_outcome == OUTCOME_ALL) | (k_outcome == OUTCOME_BRACKET):
            candidates = gather_candidates(
                logits_row, divisor, has_penalty, repetition, frequency, presence, prompt_mask_row, counts_row,
                draft_row, num_drafts, 0, vocab_size, k_lo, tl.where(k_outcome == OUTCOME_ALL, top, k_hi), 0, False,
                scratch_row, True, CAND, BLOCK)
            values, candidate_ids = unpack_candidate(candidates)
            filled = candidates != EMPTY_CANDIDATE
            reach = tl.where(k_outcome == OUTCOME_BRACKET, k_above_count, 0) + slots + 1
            kth = tl.max(tl.where(filled & (reach >= top_k), values, float("-inf")), axis=0)
            use_candidates = (k_outcome == OUTCOME_ALL).to(tl.int32)
        kth = tl.where(k_outcome == OUTCOME_EXACT, k_lo, kth)
    kept_from = tl.maximum(min_p_threshold, kth)
    threshold = kept_from
    if top_p_on:
        tau = kept_from
        if use_candidates != 0:
            values, candidate_ids = unpack_candidate(candidates)
            kept = (candidates != EMPTY_CANDIDATE) & (values >= kept_from)
            cum = tl.cumsum(tl.where(kept, tl.exp(values - row_max), 0.0), axis=0)
            goal = top_p * tl.max(tl.where(kept, cum, 0.0), axis=0)
            # sorted descending: the first slot reaching the goal holds the largest such value
            tau = tl.max(tl.where(kept & (cum >= goal), values, float("-inf")), axis=0)
        else:
            hint = tl.maximum(kept_from, row_max + tl.log((1.0 - top_p) / vocab_size))
            outcome, lo, hi, lo_count, lo_mass, above_count, above_mass, goal = narrow_threshold(
                logits_row, divisor, has_penalty, repetition, frequency, presence, prompt_mask_row, counts_row,
                draft_row, num_drafts, 0, vocab_size, row_max, row_min, kept_from, top, hint, 0, top_p, CAND, True,
                True, CAND, NPIV, BLOCK, MAX_PASSES)
            tau = lo
            if (outcome == OUTCOME_ALL) | (outcome == OUTCOME_BRACKET):
                candidates = gather_candidates(
                    logits_row, divisor, has_penalty, repetition, frequency, presence, prompt_mask_row,
                    counts_row, draft_row, num_drafts, 0, vocab_size, lo, tl.where(outcome == OUTCOME_ALL, top, hi),
                    0, False, scratch_row, True, CAND, BLOCK)
                values, candidate_ids = unpack_candidate(candidates)
                filled = candidates != EMPTY_CANDIDATE
                base = tl.where(outcome == OUTCOME_BRACKET, above_mass, 0.0)
                cum = base + tl.cumsum(tl.where(filled, tl.exp(values - row_max), 0.0), axis=0)
                reached = filled & (cum >= goal)
                any_reached = tl.sum(reached.to(tl.int32), axis=0) > 0
                # fp32 summation order may leave the goal a rounding short: keep the whole bracket
                tau = tl.where(any_reached, tl.max(tl.where(reached, values, float("-inf")), axis=0),
                               tl.min(tl.where(filled, values, float("inf")), axis=0))
                use_candidates = (outcome == OUTCOME_ALL).to(tl.int32)
        threshold = tl.maximum(kept_from, tau)
    return threshold, use_candidates, candidates


@triton.jit
def _arrive(counter_ptr, num_splits):
    """1 for the last of a row's ``num_splits`` programs to call this (partials stored before)."""
    tl.debug_barrier()  # every thread's partial stores precede the release below
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel")
    return arrived == num_splits - 1


@triton.jit
def sample_kernel(
    logits_ptr, logits_stride, state_row_ptr, position_ptr,
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, repetition_ptr, frequency_ptr, presence_ptr, seed_ptr,
    prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride, num_drafts,
    partial_f_ptr, partial_i_ptr, counter_ptr, row_stats_ptr, stage_ptr,
    token_out_ptr, flag_out_ptr, vocab_size, num_splits, split_len,
    BLOCK: tl.constexpr, MAX_SPLITS: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    state_row = tl.load(state_row_ptr + row).to(tl.int64)
    position = tl.load(position_ptr + row)
    temperature = tl.load(temperature_ptr + state_row)
    top_k = tl.load(top_k_ptr + state_row)
    top_p = tl.load(top_p_ptr + state_row)
    min_p = tl.load(min_p_ptr + state_row)
    repetition = tl.load(repetition_ptr + state_row)
    frequency = tl.load(frequency_ptr + state_row)
    presence = tl.load(presence_ptr + state_row)
    seed = tl.load(seed_ptr + state_row)

    greedy = temperature == 0.0
    divisor = tl.where(greedy, 1.0, temperature)
    has_penalty = (repetition != 1.0) | (frequency != 0.0) | (presence != 0.0)
    top_k_on = (top_k > 0) & (top_k < vocab_size)
    top_p_on = top_p < 1.0
    min_p_on = min_p > 0.0
    filtered = (~greedy) & (top_k_on | top_p_on | min_p_on)

    logits_row = logits_ptr + row.to(tl.int64) * logits_stride
    prompt_mask_row = prompt_mask_ptr + state_row * prompt_mask_stride
    counts_row = counts_ptr + state_row * counts_stride
    draft_row = draft_ptr + row.to(tl.int64) * draft_stride
    span_start = split * split_len
    span_end = tl.minimum(span_start + split_len, vocab_size)

    lanes = tl.arange(0, BLOCK)
    nonfinite = tl.zeros((BLOCK,), tl.int32)
    first_inf = tl.full((BLOCK,), vocab_size, tl.int32)
    best = tl.full((BLOCK,), float("-inf"), tl.float32)  # filtered rows: the running max score
    best_token = tl.full((BLOCK,), vocab_size, tl.int32)
    lane_min = tl.full((BLOCK,), float("inf"), tl.float32)
    raw_next = load_raw_chunk(logits_row, span_start + lanes, span_end)
    for start in range(span_start, span_end, BLOCK):
        offs = start + lanes
        in_range = offs < span_end
        raw = raw_next
        raw_next = load_raw_chunk(logits_row, offs + BLOCK, span_end)
        nonfinite |= ((raw != raw) | (raw == float("inf"))).to(tl.int32)
        first_inf = tl.minimum(first_inf, tl.where(raw == float("inf"), offs, vocab_size))
        score = scores_from_raw(raw, offs, in_range, divisor, has_penalty, repetition, frequency, presence,
                                prompt_mask_row, counts_row, draft_row, num_drafts, True)
        if filtered:
            lane_min = tl.minimum(lane_min, tl.where(score > float("-inf"), score, float("inf")))
        elif temperature > 0.0:
            score = score + gumbel_noise(seed, position, offs)
        better = score > best
        best = tl.where(better, score, best)
        best_token = tl.where(better, offs, best_token)
    flagged = tl.max(nonfinite, axis=0)
    inf_token = tl.min(first_inf, axis=0)
    top_score = tl.max(best, axis=0)
    top_token = tl.min(tl.where(best == top_score, best_token, vocab_size), axis=0)
    low_score = tl.min(lane_min, axis=0)

    is_last = tl.full((), 1, tl.int32) != 0
    if num_splits > 1:
        f_slot = partial_f_ptr + (row.to(tl.int64) * MAX_SPLITS + split) * 2
        i_slot = partial_i_ptr + (row.to(tl.int64) * MAX_SPLITS + split) * 3
        tl.store(f_slot, top_score)
        tl.store(f_slot + 1, low_score)
        tl.store(i_slot, top_token)
        tl.store(i_slot + 1, flagged)
        tl.store(i_slot + 2, inf_token)
        is_last = _arrive(counter_ptr + row, num_splits)
        if is_last:
            splits = tl.arange(0, MAX_SPLITS)
            used = splits < num_splits
            f_row = partial_f_ptr + (row.to(tl.int64) * MAX_SPLITS + splits) * 2
            i_row = partial_i_ptr + (row.to(tl.int64) * MAX_SPLITS + splits) * 3
            # volatile: bypass L1, which may hold this row's partials from an earlier launch
            scores = tl.load(f_row, mask=used, other=float("-inf"), volatile=True)
            top_score = tl.max(scores, axis=0)
            low_score = tl.min(tl.load(f_row + 1, mask=used, other=float("inf"), volatile=True), axis=0)
            tokens = tl.load(i_row, mask=used, other=vocab_size, volatile=True)
            top_token = tl.min(tl.where(scores == top_score, tokens, vocab_size), axis=0)
            flagged = tl.max(tl.load(i_row + 1, mask=used, other=0, volatile=True), axis=0)
            inf_token = tl.min(tl.load(i_row + 2, mask=used, other=vocab_size, volatile=True), axis=0)
            tl.store(counter_ptr + row, 0)

    if is_last:
        token = tl.where(top_token >= vocab_size, 0, top_token)
        stage = tl.full((), 0, tl.int32)
        if filtered:
            token = tl.full((), 0, tl.int32)  # an all -inf row
            if (top_score > float("-inf")) & (inf_token >= vocab_size):
                stage = tl.full((), 1, tl.int32)
                tl.store(row_stats_ptr + row * 2, top_score)
                tl.store(row_stats_ptr + row * 2 + 1, low_score)
        token = tl.where(inf_token < vocab_size, inf_token, token)
        tl.store(stage_ptr + row, stage)
        tl.store(token_out_ptr + row, token.to(tl.int64))
        tl.store(flag_out_ptr + row, flagged)


@triton.jit
def select_kernel(
    logits_ptr, logits_stride, state_row_ptr, position_ptr,
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, repetition_ptr, frequency_ptr, presence_ptr, seed_ptr,
    prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride, num_drafts,
    scratch_ptr, row_stats_ptr, threshold_ptr, stage_ptr, token_out_ptr, vocab_size,
    BLOCK: tl.constexpr, CAND: tl.constexpr, NPIV: tl.constexpr, MAX_PASSES: tl.constexpr,
):
    row = tl.program_id(0)
    if tl.load(stage_ptr + row) == STAGE_SELECT:
        state_row = tl.load(state_row_ptr + row).to(tl.int64)
        position = tl.load(position_ptr + row)
        temperature = tl.load(temperature_ptr + state_row)
        top_k = tl.load(top_k_ptr + state_row)
        top_p = tl.load(top_p_ptr + state_row)
        min_p = tl.load(min_p_ptr + state_row)
        repetition = tl.load(repetition_ptr + state_row)
        frequency = tl.load(frequency_ptr + state_row)
        presence = tl.load(presence_ptr + state_row)
        seed = tl.load(seed_ptr + state_row)
        has_penalty = (repetition != 1.0) | (frequency != 0.0) | (presence != 0.0)
        threshold, use_candidates, candidates = _filtered_threshold(
            logits_ptr + row.to(tl.int64) * logits_stride, temperature, has_penalty, repetition, frequency,
            presence, prompt_mask_ptr + state_row * prompt_mask_stride, counts_ptr + state_row * counts_stride,
            draft_ptr + row.to(tl.int64) * draft_stride, num_drafts, vocab_size, tl.load(row_stats_ptr + row * 2),
            tl.load(row_stats_ptr + row * 2 + 1), top_k, (top_k > 0) & (top_k < vocab_size), top_p, top_p < 1.0,
            min_p, min_p > 0.0, scratch_ptr + row.to(tl.int64) * CAND, CAND, NPIV, BLOCK, MAX_PASSES)
        if use_candidates != 0:
            values, token_ids = unpack_candidate(candidates)
            kept = (candidates != EMPTY_CANDIDATE) & (values >= threshold)
            noisy = tl.where(kept, values + gumbel_noise(seed, position, token_ids), float("-inf"))
            best_noisy = tl.max(noisy, axis=0)
            token = tl.min(tl.where(kept & (noisy == best_noisy), token_ids, vocab_size), axis=0)
            tl.store(token_out_ptr + row, token)
            tl.store(stage_ptr + row, STAGE_DONE)
        else:
            tl.store(threshold_ptr + row, threshold)
            tl.store(stage_ptr + row, STAGE_THRESHOLD)


@triton.jit
def sample_threshold_kernel(
    logits_ptr, logits_stride, state_row_ptr, position_ptr,
    temperature_ptr, repetition_ptr, frequency_ptr, presence_ptr, seed_ptr,
    prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride, num_drafts,
    partial_f_ptr, partial_i_ptr, counter_ptr, threshold_ptr, stage_ptr, token_out_ptr,
    vocab_size, num_splits, split_len, BLOCK: tl.constexpr, MAX_SPLITS: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    if tl.load(stage_ptr + row) == STAGE_THRESHOLD:
        state_row = tl.load(state_row_ptr + row).to(tl.int64)
        position = tl.load(position_ptr + row)
        temperature = tl.load(temperature_ptr + state_row)
        repetition = tl.load(repetition_ptr + state_row)
        frequency = tl.load(frequency_ptr + state_row)
        presence = tl.load(presence_ptr + state_row)
        seed = tl.load(seed_ptr + state_row)
        threshold = tl.load(threshold_ptr + row)
        has_penalty = (repetition != 1.0) | (frequency != 0.0) | (presence != 0.0)
        logits_row = logits_ptr + row.to(tl.int64) * logits_stride
        prompt_mask_row = prompt_mask_ptr + state_row * prompt_mask_stride
        counts_row = counts_ptr + state_row * counts_stride
        draft_row = draft_ptr + row.to(tl.int64) * draft_stride
        span_start = split * split_len
        span_end = tl.minimum(span_start + split_len, vocab_size)

        lanes = tl.arange(0, BLOCK)
        best = tl.full((BLOCK,), float("-inf"), tl.float32)
        best_token = tl.full((BLOCK,), vocab_size, tl.int32)
        raw_next = load_raw_chunk(logits_row, span_start + lanes, span_end)
        for start in range(span_start, span_end, BLOCK):
            offs = start + lanes
            in_range = offs < span_end
            raw = raw_next
            raw_next = load_raw_chunk(logits_row, offs + BLOCK, span_end)
            score = scores_from_raw(raw, offs, in_range, temperature, has_penalty, repetition, frequency, presence,
                                    prompt_mask_row, counts_row, draft_row, num_drafts, True)
            noisy = tl.where(score >= threshold, score + gumbel_noise(seed, position, offs), float("-inf"))
            better = noisy > best
            best = tl.where(better, noisy, best)
            best_token = tl.where(better, offs, best_token)
        top_score = tl.max(best, axis=0)
        top_token = tl.min(tl.where(best == top_score, best_token, vocab_size), axis=0)

        is_last = tl.full((), 1, tl.int32) != 0
        if num_splits > 1:
            tl.store(partial_f_ptr + (row.to(tl.int64) * MAX_SPLITS + split) * 2, top_score)
            tl.store(partial_i_ptr + (row.to(tl.int64) * MAX_SPLITS + split) * 3, top_token)
            is_last = _arrive(counter_ptr + row, num_splits)
            if is_last:
                splits = tl.arange(0, MAX_SPLITS)
                used = splits < num_splits
                scores = tl.load(partial_f_ptr + (row.to(tl.int64) * MAX_SPLITS + splits) * 2, mask=used,
                                 other=float("-inf"), volatile=True)
                tokens = tl.load(partial_i_ptr + (row.to(tl.int64) * MAX_SPLITS + splits) * 3, mask=used,
                                 other=vocab_size, volatile=True)
                top_score = tl.max(scores, axis=0)
                top_token = tl.min(tl.where(scores == top_score, tokens, vocab_size), axis=0)
                tl.store(counter_ptr + row, 0)
        if is_last:
            tl.store(token_out_ptr + row, tl.where(top_token >= vocab_size, 0, top_token).to(tl.int64))
