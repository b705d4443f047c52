"""The sampling kernel: one program per logit row, docs/SAMPLING.md steps 0-7 in fp32.

Passes over the row (each re-reads the logits, re-applying penalties and temperature, so no
``[rows, vocab]`` intermediate exists):

* rows without min-p/top-k/top-p (and greedy rows): **one pass**: the non-finite scan and the
  argmax of ``s + g`` (or of ``l`` when greedy) fused.
* filtered rows: a max/min pass; then `sampling_select.narrow_threshold` passes for the top-k
  count threshold and the top-p mass threshold (usually 1-2 each); when the kept set is small
  (at most ``CAND`` entries, e.g. top-k 50) it is gathered and sorted once and the Gumbel-max runs
  over those candidates only; otherwise one final pass samples over ``s >= threshold``.

Gumbel noise is `impl.kernels.rng.gumbel_noise(seed, position, token id)` (64-bit Philox draws).
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
    load_row_scores,
    narrow_threshold,
    next_float_up,
    unpack_candidate,
)


@triton.jit
def _finish_argmax(best, best_token, vocab_size):
    """Per-lane running maxima -> the lowest token id holding the row maximum (0 if none)."""
    top = tl.max(best, axis=0)
    token = tl.min(tl.where(best == top, best_token, vocab_size), axis=0)
    return tl.where(token >= vocab_size, 0, token)


@triton.jit
def _filtered_threshold(logits_row, divisor, has_penalty, repetition, frequency, presence, prompt_mask_row,
                        counts_row, draft_row, vocab_size, row_max, row_min, top_k, top_k_on, top_p, top_p_on,
                        min_p, min_p_on, scratch_row, num_drafts, CAND: tl.constexpr,
                        NPIV: tl.constexpr, BLOCK: tl.constexpr, MAX_PASSES: tl.constexpr):
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
        outcome, lo, hi, lo_count, lo_mass, above_count, above_mass, goal = narrow_threshold(
            logits_row, divisor, has_penalty, repetition, frequency, presence, prompt_mask_row, counts_row,
            draft_row, vocab_size, row_max, row_min, min_p_threshold, top, min_p_threshold, top_k, 1.0, CAND,
            num_drafts, True, False, CAND, NPIV, BLOCK, MAX_PASSES)
        if (outcome == OUTCOME_ALL) | (outcome == OUTCOME_BRACKET):
            gather_hi = tl.where(outcome == OUTCOME_ALL, top, hi)
            candidates = gather_candidates(
                logits_row, divisor, has_penalty, repetition, frequency, presence, prompt_mask_row, counts_row,
                draft_row, vocab_size, lo, gather_hi, 0, False, scratch_row, num_drafts, True, CAND, BLOCK)
            values, candidate_ids = unpack_candidate(candidates)
            filled = candidates != EMPTY_CANDIDATE
            reach = tl.where(outcome == OUTCOME_BRACKET, above_count, 0) + slots + 1
            kth = tl.max(tl.where(filled & (reach >= top_k), values, float("-inf")), axis=0)
            use_candidates = (outcome == OUTCOME_ALL).to(tl.int32)
        kth = tl.where(outcome == OUTCOME_EXACT, lo, kth)
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
                draft_row, vocab_size, row_max, row_min, kept_from, top, hint, 0, top_p, CAND, num_drafts, True,
                True, CAND, NPIV, BLOCK, MAX_PASSES)
            tau = lo
            if (outcome == OUTCOME_ALL) | (outcome == OUTCOME_BRACKET):
                gather_hi = tl.where(outcome == OUTCOME_ALL, top, hi)
                candidates = gather_candidates(
                    logits_row, divisor, has_penalty, repetition, frequency, presence, prompt_mask_row,
                    counts_row, draft_row, vocab_size, lo, gather_hi, 0, False, scratch_row, num_drafts, True,
                    CAND, BLOCK)
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


@triton.jit(do_not_specialize=["num_drafts"])
def sampler_kernel(
    logits_ptr, logits_stride, state_row_ptr, position_ptr,
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, repetition_ptr, frequency_ptr, presence_ptr, seed_ptr,
    prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride, num_drafts,
    scratch_ptr, token_out_ptr, flag_out_ptr, vocab_size,
    BLOCK: tl.constexpr, NARROW_BLOCK: tl.constexpr, CAND: tl.constexpr,
    NPIV: tl.constexpr, MAX_PASSES: tl.constexpr,
):
    row = tl.program_id(0)
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
    scratch_row = scratch_ptr + row.to(tl.int64) * CAND

    lanes = tl.arange(0, BLOCK)
    nonfinite = tl.zeros((BLOCK,), tl.int32)
    first_inf = tl.full((BLOCK,), vocab_size, tl.int32)
    best = tl.full((BLOCK,), float("-inf"), tl.float32)
    best_token = tl.full((BLOCK,), vocab_size, tl.int32)
    lane_max = tl.full((BLOCK,), float("-inf"), tl.float32)
    lane_min = tl.full((BLOCK,), float("inf"), tl.float32)
    if filtered:
        for start in range(0, vocab_size, BLOCK):
            offs = start + lanes
            in_vocab = offs < vocab_size
            score, raw = load_row_scores(logits_row, offs, in_vocab, divisor, has_penalty, repetition, frequency,
                                         presence, prompt_mask_row, counts_row, draft_row, num_drafts, True)
            nonfinite |= ((raw != raw) | (raw == float("inf"))).to(tl.int32)
            first_inf = tl.minimum(first_inf, tl.where(raw == float("inf"), offs, vocab_size))
            lane_max = tl.maximum(lane_max, score)
            lane_min = tl.minimum(lane_min, tl.where(score > float("-inf"), score, float("inf")))
    else:
        for start in range(0, vocab_size, BLOCK):
            offs = start + lanes
            in_vocab = offs < vocab_size
            score, raw = load_row_scores(logits_row, offs, in_vocab, divisor, has_penalty, repetition, frequency,
                                         presence, prompt_mask_row, counts_row, draft_row, num_drafts, True)
            nonfinite |= ((raw != raw) | (raw == float("inf"))).to(tl.int32)
            first_inf = tl.minimum(first_inf, tl.where(raw == float("inf"), offs, vocab_size))
            if temperature > 0.0:
                score = score + gumbel_noise(seed, position, offs)
            better = score > best
            best = tl.where(better, score, best)
            best_token = tl.where(better, offs, best_token)
    flagged = tl.max(nonfinite, axis=0) > 0
    inf_token = tl.min(first_inf, axis=0)
    token = _finish_argmax(best, best_token, vocab_size)

    if filtered:
        row_max = tl.max(lane_max, axis=0)
        row_min = tl.min(lane_min, axis=0)
        if (row_max > float("-inf")) & (inf_token >= vocab_size):
            threshold, use_candidates, candidates = _filtered_threshold(
                logits_row, divisor, has_penalty, repetition, frequency, presence, prompt_mask_row, counts_row,
                draft_row, vocab_size, row_max, row_min, top_k, top_k_on, top_p, top_p_on, min_p, min_p_on,
                scratch_row, num_drafts, CAND, NPIV, NARROW_BLOCK, MAX_PASSES)
            if use_candidates != 0:
                values, token_ids = unpack_candidate(candidates)
                kept = (candidates != EMPTY_CANDIDATE) & (values >= threshold)
                noisy = tl.where(kept, values + gumbel_noise(seed, position, token_ids), float("-inf"))
                top = tl.max(noisy, axis=0)
                token = tl.min(tl.where(kept & (noisy == top), token_ids, vocab_size), axis=0).to(tl.int32)
            else:
                best = tl.full((BLOCK,), float("-inf"), tl.float32)
                best_token = tl.full((BLOCK,), vocab_size, tl.int32)
                for start in range(0, vocab_size, BLOCK):
                    offs = start + lanes
                    in_vocab = offs < vocab_size
                    score, raw = load_row_scores(logits_row, offs, in_vocab, divisor, has_penalty, repetition,
                                               frequency, presence, prompt_mask_row, counts_row, draft_row,
                                               num_drafts, True)
                    noisy = tl.where(score >= threshold, score + gumbel_noise(seed, position, offs), float("-inf"))
                    better = noisy > best
                    best = tl.where(better, noisy, best)
                    best_token = tl.where(better, offs, best_token)
                token = _finish_argmax(best, best_token, vocab_size)
        else:
            token = tl.full((), 0, tl.int32)
    token = tl.where(inf_token < vocab_size, inf_token, token)
    tl.store(token_out_ptr + row, token.to(tl.int64))
    tl.store(flag_out_ptr + row, flagged.to(tl.int32))
