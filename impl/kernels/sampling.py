"""The sampling kernels: docs/SAMPLING.md steps 0-7 in fp32, split across vocabulary chunks.

Every launch but the last is sized to fill the GPU at any batch size: the split passes run one
program per (row, ``CHUNK``-wide vocabulary chunk); the combines run one program per row and read
only the small per-chunk partials (`runnercheck.impl.kernels.sampling_split`).  Launch order (stream order is
the only synchronisation between them):

1. `sampler_block_kernel` (split): the non-finite scan, the chunk's maximum score and the chunk's
   argmax of ``s + g`` (greedy: of ``s``; filtered rows: no noise yet) -- penalties, temperature,
   noise and argmax fused in **one read** of the logits.
2. `sampler_plan_kernel` (per row): combines the partials.  Unfiltered, greedy and non-finite rows
   are final here.  A top-k row (``k`` at most the chunk count and half ``CAND``) gets the bound ``max(k-th largest chunk max, min-p threshold)``
   (``MODE_GATHER``); a min-p-only row its threshold (``MODE_THRESHOLD``); anything else (top-p
   without top-k, ``k`` above the number of chunks) goes to the fallback (``MODE_FALLBACK``).
3. `sampler_select_kernel` (split, ``group`` chunks a program at large batches: `select_group`): GATHER rows
   store their chunk's entries at or above the bound (chunks whose maximum is below it are not read); THRESHOLD
   rows redo the chunk's argmax of ``s + g`` over ``s >= threshold``.  Other rows exit at once.
4. `sampler_finish_kernel` (per row): GATHER rows compact their candidates (at most ``CAND``,
   ranked by counting, never sorted), apply min-p, top-k and top-p on them (`_candidate_threshold`) and take the Gumbel-max over the kept ones;
   THRESHOLD rows combine the argmax partials.  A GATHER row whose candidates overflowed becomes
   FALLBACK.
5. `sampler_row_kernel` (per row, FALLBACK rows only): the whole row in one program, by pivot
   narrowing (`sampling_select.narrow_threshold`): any parameters, any data, more passes.

No ``[rows, vocab]`` intermediate exists: each pass re-reads the logits and re-applies penalties
and temperature.  Gumbel noise follows RNG contract v2 (`runnercheck.impl.kernels.rng`): a vocabulary chunk draws
the hi words only (`_noisy_chunk_argmax`: four tokens per Philox call) and refines with the lo word
just the tokens whose key, bounded from the hi word alone, can reach the maximum; a candidate list draws each token's full
64 bits (`gumbel_noise`).  Both give the argmax of the full 64-bit keys, so the tokens do not depend
on the path.
"""
from __future__ import annotations

import triton
import triton.language as tl

from runnercheck.impl.kernels.rng import gumbel_noise, noise_exp_lower, noise_hi_chunk
from runnercheck.impl.kernels.sampling_select import (
    EMPTY_CANDIDATE,
    FLOAT32_MAX,
    OUTCOME_ALL,
    OUTCOME_BRACKET,
    OUTCOME_EXACT,
    gather_candidates,
    load_row_scores,
    narrow_threshold,
    next_float_up,
    normal_divisor,
    scale_by_temperature,
    unpack_candidate,
)
from runnercheck.impl.kernels.sampling_split import (
    MODE_DONE,
    MODE_FALLBACK,
    MODE_GATHER,
    MODE_THRESHOLD,
    compact_block_candidates,
    descending_ranks,
    kth_largest_block_max,
    mass_at_or_above,
    reduce_block_argmax,
    store_block_candidates,
)


@triton.jit
def _row_params(state_row_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab_size):
    """``(state_row, temperature, top_k, top_k_on, top_p, top_p_on, min_p, min_p_on, filtered)``."""
    state_row = tl.load(state_row_ptr + row).to(tl.int64)
    temperature = tl.load(temperature_ptr + state_row)
    top_k = tl.load(top_k_ptr + state_row)
    top_p = tl.load(top_p_ptr + state_row)
    min_p = tl.load(min_p_ptr + state_row)
    top_k_on = (top_k > 0) & (top_k < vocab_size)
    top_p_on = top_p < 1.0
    min_p_on = min_p > 0.0
    filtered = (temperature != 0.0) & (top_k_on | top_p_on | min_p_on)
    return state_row, temperature, top_k, top_k_on, top_p, top_p_on, min_p, min_p_on, filtered


@triton.jit
def _row_penalties(repetition_ptr, frequency_ptr, presence_ptr, state_row):
    """``(repetition, frequency, presence, has_penalty)`` of a row."""
    repetition = tl.load(repetition_ptr + state_row)
    frequency = tl.load(frequency_ptr + state_row)
    presence = tl.load(presence_ptr + state_row)
    return repetition, frequency, presence, (repetition != 1.0) | (frequency != 0.0) | (presence != 0.0)


@triton.jit
def _chunk_scores(logits_ptr, logits_stride, row, offs, in_vocab, state_row, temperature, repetition_ptr,
                  frequency_ptr, presence_ptr, prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride,
                  draft_ptr, draft_stride, num_drafts, KEEP_NAN: tl.constexpr = False):
    """``(score, raw, has_penalty)`` of one chunk: docs/SAMPLING.md steps 0, 1 and 3 (greedy rows: divisor 1).
    KEEP_NAN: a NaN logit scores NaN, not ``-inf`` (`load_row_scores`)."""
    repetition, frequency, presence, has_penalty = _row_penalties(repetition_ptr, frequency_ptr, presence_ptr,
                                                                  state_row)
    divisor = tl.where(temperature == 0.0, 1.0, temperature)
    score, raw = load_row_scores(logits_ptr + row.to(tl.int64) * logits_stride, offs, in_vocab, divisor, has_penalty,
                                 repetition, frequency, presence, prompt_mask_ptr + state_row * prompt_mask_stride,
                                 counts_ptr + state_row * counts_stride, draft_ptr + row.to(tl.int64) * draft_stride,
                                 num_drafts, True, KEEP_NAN)
    return score, raw, has_penalty


@triton.jit
def _nan_max(a, b):
    """``max`` that returns NaN where either is NaN (one FMNMX.NAN)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _chunk_argmax(score, offs, vocab_size):
    """``(best, lowest token at best)`` of one chunk (out-of-vocab lanes hold -inf)."""
    best = tl.max(score, axis=0)
    return best, tl.min(tl.where(score == best, offs, vocab_size), axis=0)


@triton.jit
def _key_bounds(score, valid, hi, m):
    """``e_lo exp(m - s)`` (``m`` the chunk's maximum score): per valid lane, a value that is at most
    ``exp(m - key)`` for every lo word (`noise_exp_lower`); ``inf`` where the lane cannot win."""
    # exp2 compiles to one ex2.approx.ftz; tl.exp's ex2.approx (no ftz) adds a compare and two predicated
    # multiplies a lane for results below 2^-126, which w >= 1 never is: the same bits, 3 instructions a token fewer.
    w = tl.math.exp2((m - score) * 1.4426950408889634)
    # a lane over ~88 below the chunk's maximum (w = inf) cannot win: its key is below m - 2.82
    return tl.where(valid & (w < float("inf")), noise_exp_lower(hi) * w, float("inf"))


@triton.jit
def _logit_key_bounds(logit, hi, m, temperature):
    """`_key_bounds` from the logits of a row without penalties (normal ``T``, finite ``m`` below 2^126 in
    magnitude): ``(m - s) log2(e)`` as one fma of the logit, ``s = logit / T`` never formed, and no validity test --
    a ``-inf`` (or out-of-vocab) logit's exponent is ``+inf``, its bound ``inf`` (``0 * inf``'s NaN taken to ``inf``
    by the minimum).  Within the fp32 margin of docs/SAMPLING.md, as `_key_bounds` is."""
    w = tl.math.exp2(tl.fma(logit, -(1.4426950408889634 / temperature), m * 1.4426950408889634))
    return tl.minimum(noise_exp_lower(hi) * w, float("inf"))


@triton.jit
def _refinement_bar(m, ref_key):
    """``exp(m - ref_key)`` widened by the fp32 margin (docs/SAMPLING.md), at most FLT_MAX: a lane whose
    `_key_bounds` value exceeds it has a key below ``ref_key`` (an ``inf`` bound -- an invalid lane, or one
    ~88 below ``m`` -- always does)."""
    margin = 4.8828125e-04 + (tl.abs(m) + tl.abs(ref_key)) * 1.9073486328125e-06  # 2^-11 + 2^-19 (|m| + |key|)
    return tl.minimum(tl.exp((m - ref_key) + margin), FLOAT32_MAX)


@triton.jit
def _lane_score(score, offs, token, logits_row, temperature, reload):
    """Lane ``token``'s score: picked out of ``score`` (a reduction), or, ``reload`` (``score`` is ``logits_row``'s
    chunk scaled by `scale_by_temperature`, no penalties), its logit read again and scaled the same way -- the same
    bits, unfused so that the noise's add cannot round it away -- one load."""
    if reload:
        s = scale_by_temperature(tl.load(logits_row + token), temperature, True)
    else:
        s = tl.max(tl.where(offs == token, score, float("-inf")), axis=0)
    return s


@triton.jit
def _refine_candidates(score, offs, candidate, count, seed, position, best, best_token, logits_row, temperature,
                       reload):
    """Fold the ``count`` ``candidate`` lanes' full 64-bit keys into ``(best, best_token)`` (ties -> lowest index),
    one lane at a time in increasing index: its score (`_lane_score`) and its full draw (`gumbel_noise`: two Philox
    calls).  A chunk rarely has any (docs/SAMPLING.md); drawing every lane's lo word at once instead would hold a
    Philox state per lane in registers, which the whole pass would pay for."""
    remaining = candidate
    for _ in range(count):
        token = tl.min(tl.where(remaining, offs, 2147483647), axis=0)
        key = _lane_score(score, offs, token, logits_row, temperature, reload) + gumbel_noise(seed, position, token)
        take = (key > best) | ((key == best) & (token < best_token))
        best = tl.where(take, key, best)
        best_token = tl.where(take, token, best_token)
        remaining = remaining & (offs != token)
    return best, best_token


@triton.jit
def _noisy_chunk_argmax(score, offs, seed, position, start, m, logits_row, temperature, reload,
                        CHUNK: tl.constexpr, LOGITS: tl.constexpr = False):
    """Gumbel-max over one chunk (``offs = start + arange(CHUNK)``, ``start % 4 == 0``; lanes with
    ``score == -inf`` excluded; ``m`` its maximum score): ``(best full key, lowest token at it)``, RNG contract v2.

    The hi words alone bound every key from above by ``s - log(e_lo)`` (`noise_exp_lower`), compared in
    exponential space as ``e_lo exp(m - s)`` (``m`` the chunk's maximum score: no logarithm per token).
    A lane where that is smallest is the *reference*: its full key is a lower bound on the chunk's
    best.  Only the lanes whose bound reaches it (within the fp32 margin of docs/SAMPLING.md) are
    refined.  No valid lane: ``(-inf, start)``, as a plain argmax of an all ``-inf`` chunk.

    The reference comes out of one reduction of packed keys: a bound's fp32 bits (non-negative or +inf: they
    order as the values do) with the low ``log2(CHUNK)`` bits replaced by the lane.  So it is the smallest bound
    to within 2^-(23 - log2(CHUNK)) relative, not always the smallest; any lane would do, since every lane whose
    bound reaches the reference's key is refined, the smallest one among them (docs/SAMPLING.md).

    ``reload``: see `_lane_score`.  LOGITS: ``score`` holds the chunk's logits (a row without penalties, ``reload``
    true; `_logit_key_bounds`' conditions), the scores being ``logit / temperature``.
    """
    hi = noise_hi_chunk(seed, position, start, CHUNK)
    if LOGITS:
        bound = _logit_key_bounds(score, hi, m, temperature)
    else:
        bound = _key_bounds(score, score > float("-inf"), hi, m)
    lane_bits: tl.constexpr = CHUNK - 1
    top = tl.min((bound.to(tl.int32, bitcast=True) & ~lane_bits) | (offs - start), axis=0)
    best = tl.full((), float("-inf"), tl.float32)
    best_token = tl.full((), 0, tl.int32) + start
    if top < 0x7F800000:  # below +inf's bits: some lane's bound is finite
        ref = start + (top & lane_bits)
        best = _lane_score(score, offs, ref, logits_row, temperature, reload) + gumbel_noise(seed, position, ref)
        best_token = ref
        candidate = (bound <= _refinement_bar(m, best)) & (offs != ref)
        count = tl.sum(candidate.to(tl.int32), axis=0)
        if count > 0:
            best, best_token = _refine_candidates(score, offs, candidate, count, seed, position, best, best_token,
                                                  logits_row, temperature, reload)
    return best, best_token


@triton.jit(do_not_specialize=["num_drafts", "num_blocks"])
def sampler_block_kernel(
    logits_ptr, logits_stride, state_row_ptr, position_ptr,
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, repetition_ptr, frequency_ptr, presence_ptr, seed_ptr,
    prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride, num_drafts,
    part_best_ptr, part_token_ptr, part_max_ptr, part_flag_ptr, part_inf_ptr, num_blocks, vocab_size,
    CHUNK: tl.constexpr,
):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    state_row, temperature, top_k, top_k_on, top_p, top_p_on, min_p, min_p_on, filtered = _row_params(
        state_row_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab_size)
    offs = blk * CHUNK + tl.arange(0, CHUNK)
    in_vocab = offs < vocab_size
    logits_row = logits_ptr + row.to(tl.int64) * logits_stride
    noisy = (temperature != 0.0) & (~filtered)
    best = tl.full((), float("-inf"), tl.float32)
    best_token = tl.full((), 0, tl.int32)
    chunk_max = tl.full((), float("-inf"), tl.float32)
    bad = tl.full((), 2147483647, tl.int32)
    done = tl.full((), 0, tl.int32)
    # A noisy row without penalties at a normal temperature (most temperature rows) bounds its keys from the logits
    # (`_logit_key_bounds`); its chunk maximum is that of the logits, scaled (the same bits as the scores' maximum:
    # rounding a product or quotient by a positive T is monotone).  A chunk whose maximum is not finite (a NaN or
    # +inf logit, an overflowed score), or so large that m log2(e) could overflow, takes the general path below.
    if noisy & normal_divisor(temperature):
        repetition, frequency, presence, has_penalty = _row_penalties(repetition_ptr, frequency_ptr, presence_ptr,
                                                                      state_row)
        if ~has_penalty:
            logit = tl.load(logits_row + offs, mask=in_vocab, other=float("-inf")).to(tl.float32)
            m = scale_by_temperature(tl.reduce(logit, 0, _nan_max), temperature)
            if tl.abs(m) <= 8.507059173023462e37:
                seed = tl.load(seed_ptr + state_row)
                position = tl.load(position_ptr + row)
                best, best_token = _noisy_chunk_argmax(logit, offs, seed, position, blk * CHUNK, m, logits_row,
                                                       temperature, True, CHUNK, True)
                chunk_max = m
                done = tl.full((), 1, tl.int32)
    if done == 0:
        # The scores with NaN kept: one reduction gives their maximum and, as NaN or +inf, whether any logit is NaN
        # or +inf (or a score overflowed).  Only such a chunk (rare) reads its logits again: a NaN logit's score
        # becomes -inf (what every other pass scores it: penalties and temperature, finite and positive where they
        # multiply or divide, keep -inf), and the chunk is scanned for the first +inf's index, else a NaN marker.
        score, raw, has_penalty = _chunk_scores(logits_ptr, logits_stride, row, offs, in_vocab, state_row,
                                                temperature, repetition_ptr, frequency_ptr, presence_ptr,
                                                prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride,
                                                draft_ptr, draft_stride, num_drafts, True)
        chunk_max = tl.reduce(score, 0, _nan_max)
        if (chunk_max != chunk_max) | (chunk_max == float("inf")):
            raw = tl.load(logits_row + offs, mask=in_vocab, other=float("-inf"))
            score = tl.where(raw != raw, float("-inf"), score)
            bad = tl.min(tl.where(raw == float("inf"), offs, tl.where(raw != raw, 2147483646, 2147483647)), axis=0)
            chunk_max = tl.max(score, axis=0)
        if noisy:
            seed = tl.load(seed_ptr + state_row)
            position = tl.load(position_ptr + row)
            best, best_token = _noisy_chunk_argmax(score, offs, seed, position, blk * CHUNK, chunk_max, logits_row,
                                                   temperature, ~has_penalty, CHUNK)
        else:
            best, best_token = _chunk_argmax(score, offs, vocab_size)
    nonfinite = (bad < 2147483647).to(tl.int32)
    first_inf = tl.minimum(bad, vocab_size)
    at = row.to(tl.int64) * num_blocks + blk
    tl.store(part_best_ptr + at, best)
    tl.store(part_token_ptr + at, best_token)
    tl.store(part_max_ptr + at, chunk_max)
    tl.store(part_flag_ptr + at, nonfinite)
    tl.store(part_inf_ptr + at, first_inf)


@triton.jit(do_not_specialize=["num_blocks"])
def sampler_plan_kernel(
    state_row_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
    part_best_ptr, part_token_ptr, part_max_ptr, part_flag_ptr, part_inf_ptr, num_blocks,
    mode_ptr, bound_ptr, row_max_ptr, token_out_ptr, flag_out_ptr, vocab_size,
    NB_P2: tl.constexpr, CAND: tl.constexpr, COLS: tl.constexpr,
):
    row = tl.program_id(0)
    state_row, temperature, top_k, top_k_on, top_p, top_p_on, min_p, min_p_on, filtered = _row_params(
        state_row_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab_size)
    base = row.to(tl.int64) * num_blocks
    blocks = tl.arange(0, NB_P2)
    valid = blocks < num_blocks
    flagged = tl.max(tl.load(part_flag_ptr + base + blocks, mask=valid, other=0), axis=0) > 0
    inf_token = tl.min(tl.load(part_inf_ptr + base + blocks, mask=valid, other=vocab_size), axis=0)
    row_max = tl.max(tl.load(part_max_ptr + base + blocks, mask=valid, other=float("-inf")), axis=0)
    token = reduce_block_argmax(part_best_ptr, part_token_ptr, base, num_blocks, vocab_size, NB_P2)

    open_row = filtered & (inf_token >= vocab_size) & (row_max > float("-inf"))
    min_p_threshold = tl.where(min_p_on, row_max + tl.log(tl.where(min_p_on, min_p, 1.0)), float("-inf"))
    kth = tl.full((), float("-inf"), tl.float32)
    if top_k_on & open_row:  # the counting selection costs an [NB, COLS] pass per row: only where it is read
        kth = kth_largest_block_max(part_max_ptr, base, num_blocks, top_k, NB_P2, COLS)
    # k above half the candidate capacity would mostly overflow it: straight to the fallback
    can_gather = top_k_on & (top_k <= num_blocks) & (top_k <= CAND // 2) & (kth > float("-inf"))
    mode = tl.where(~open_row, MODE_DONE,
                    tl.where(can_gather, MODE_GATHER,
                             tl.where(top_k_on | top_p_on, MODE_FALLBACK, MODE_THRESHOLD)))
    bound = tl.where(mode == MODE_GATHER, tl.maximum(kth, min_p_threshold), min_p_threshold)
    # a decided row keeps everything (the kept threshold processed logprobs read; greedy rows are not filtered)
    bound = tl.where(mode == MODE_DONE, float("-inf"), bound)
    token = tl.where(inf_token < vocab_size, inf_token, tl.where(filtered & (row_max == float("-inf")), 0, token))
    tl.store(mode_ptr + row, mode)
    tl.store(bound_ptr + row, bound)
    tl.store(row_max_ptr + row, row_max)
    tl.store(token_out_ptr + row, token.to(tl.int64))
    tl.store(flag_out_ptr + row, flagged.to(tl.int32))


@triton.jit
def _select_chunk(logits_ptr, logits_stride, state_row_ptr, position_ptr, temperature_ptr, repetition_ptr,
                  frequency_ptr, presence_ptr, seed_ptr, prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride,
                  draft_ptr, draft_stride, num_drafts, part_best_ptr, part_token_ptr, part_max_ptr, part_count_ptr,
                  slots_ptr, num_blocks, vocab_size, row, mode, bound, blk, CHUNK: tl.constexpr, SLOT: tl.constexpr):
    """Chunk ``blk`` of a GATHER or THRESHOLD row (`sampler_select_kernel`)."""
    at = row.to(tl.int64) * num_blocks + blk
    # a GATHER row's chunk whose maximum is below the bound holds no candidate: not read
    reads = (mode == MODE_THRESHOLD) | (tl.load(part_max_ptr + at) >= bound)
    kept_count = tl.full((), 0, tl.int32)
    if reads:
        state_row = tl.load(state_row_ptr + row).to(tl.int64)
        temperature = tl.load(temperature_ptr + state_row)
        offs = blk * CHUNK + tl.arange(0, CHUNK)
        in_vocab = offs < vocab_size
        score, raw, has_penalty = _chunk_scores(logits_ptr, logits_stride, row, offs, in_vocab, state_row,
                                                temperature, repetition_ptr, frequency_ptr, presence_ptr,
                                                prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride,
                                                draft_ptr, draft_stride, num_drafts)
        keep = in_vocab & (score >= bound) & (score > float("-inf"))
        if mode == MODE_GATHER:
            kept_count = store_block_candidates(score, offs, keep, slots_ptr + at * SLOT, SLOT)
        else:
            seed = tl.load(seed_ptr + state_row)
            position = tl.load(position_ptr + row)
            kept = tl.where(keep, score, float("-inf"))
            best, best_token = _noisy_chunk_argmax(kept, offs, seed, position, blk * CHUNK, tl.max(kept, axis=0),
                                                   logits_ptr, temperature, False, CHUNK)
            tl.store(part_best_ptr + at, best)
            tl.store(part_token_ptr + at, best_token)
    if mode == MODE_GATHER:
        tl.store(part_count_ptr + at, kept_count)


@triton.jit(do_not_specialize=["num_drafts", "num_blocks", "group"])
def sampler_select_kernel(
    logits_ptr, logits_stride, state_row_ptr, position_ptr, temperature_ptr, repetition_ptr, frequency_ptr,
    presence_ptr, seed_ptr, prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride, draft_ptr,
    draft_stride, num_drafts, mode_ptr, bound_ptr, part_best_ptr, part_token_ptr, part_max_ptr, part_count_ptr,
    slots_ptr, num_blocks, group, vocab_size,
    CHUNK: tl.constexpr, SLOT: tl.constexpr, GROUPED: tl.constexpr,
):
    """One program per (row, chunk), or with ``GROUPED`` per (row, ``group`` consecutive chunks): a row that is
    neither GATHER nor THRESHOLD (plain temperature, greedy) exits at once, so the fewer programs a launch has the
    less such rows cost (`select_group`).  The loop is compiled only where it runs: on sm_90 it holds 102
    registers a thread against 64 without it, and one program per chunk in that form took 138.8 us for the
    temp+top-k+top-p rows at 256 rows (H100 run 149, docs/results/2026-12-07-h100-run149/bench_sampler.json)
    against 75.1 us without the loop (run 150), the block pass 172.8 and 172.0 us in the two runs."""
    row = tl.program_id(0)
    mode = tl.load(mode_ptr + row)
    if (mode == MODE_GATHER) | (mode == MODE_THRESHOLD):
        bound = tl.load(bound_ptr + row)
        if GROUPED:
            first = tl.program_id(1) * group
            for blk in range(first, tl.minimum(first + group, num_blocks)):
                _select_chunk(logits_ptr, logits_stride, state_row_ptr, position_ptr, temperature_ptr,
                              repetition_ptr, frequency_ptr, presence_ptr, seed_ptr, prompt_mask_ptr,
                              prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride, num_drafts,
                              part_best_ptr, part_token_ptr, part_max_ptr, part_count_ptr, slots_ptr, num_blocks,
                              vocab_size, row, mode, bound, blk, CHUNK, SLOT)
        else:
            _select_chunk(logits_ptr, logits_stride, state_row_ptr, position_ptr, temperature_ptr, repetition_ptr,
                          frequency_ptr, presence_ptr, seed_ptr, prompt_mask_ptr, prompt_mask_stride, counts_ptr,
                          counts_stride, draft_ptr, draft_stride, num_drafts, part_best_ptr, part_token_ptr,
                          part_max_ptr, part_count_ptr, slots_ptr, num_blocks, vocab_size, row, mode, bound,
                          tl.program_id(1), CHUNK, SLOT)


def select_group(num_rows: int, num_blocks: int, programs: int) -> int:
    """Chunks per program of `sampler_select_kernel`: 1 while ``num_rows * num_blocks`` chunks are at most
    ``programs``, else the fewest chunks that bring the launch to about ``programs`` programs."""
    return max(1, -(-num_rows * num_blocks // max(1, programs)))


@triton.jit
def _filtered_threshold(kept_from, tau, row_max, top_p_on, use_candidates, candidates):
    """``(threshold, use_candidates, candidates)``: keep ``s >= threshold`` (steps 4-6 combined).

    ``kept_from`` is what min-p and top-k keep, ``tau`` the top-p threshold over those; the one
    place both threshold searches (`_candidate_threshold`, `_narrowed_threshold`) end, so a
    kernel variant that rebinds it (`runnercheck.stress.mutants.kernels`) changes every path.
    """
    return tl.where(top_p_on, tl.maximum(kept_from, tau), kept_from), use_candidates, candidates


@triton.jit
def _candidate_threshold(candidates, scratch_row, row_max, top_k, top_k_on, top_p, top_p_on, min_p, min_p_on,
                         CAND: tl.constexpr, COLS: tl.constexpr):
    """``(threshold, use_candidates, candidates)``: keep ``s >= threshold`` (steps 4-6).

    ``candidates`` (packed keys, any order, also in ``scratch_row``) must hold every entry the
    filters can keep: with top-k on, every entry at or above ``max(k-th largest, min-p threshold)``;
    otherwise every entry at or above the min-p threshold.  Orders are counted, not sorted
    (`sampling_split.descending_ranks`, `sampling_split.mass_at_or_above`).
    """
    values, candidate_ids = unpack_candidate(candidates)
    filled = candidates != EMPTY_CANDIDATE
    rank = descending_ranks(candidates, scratch_row, CAND, COLS)
    min_p_threshold = tl.where(min_p_on, row_max + tl.log(tl.where(min_p_on, min_p, 1.0)), float("-inf"))
    kept = filled & (values >= min_p_threshold)  # the kept entries hold the smallest ranks
    num_kept = tl.sum(kept.to(tl.int32), axis=0)
    # top-k is a no-op when k >= the kept count; at k == kept count, the k-th value keeps them all too
    kth = tl.max(tl.where(kept & (rank == top_k - 1), values, float("-inf")), axis=0)
    kth = tl.where(top_k_on & (num_kept >= top_k), kth, float("-inf"))
    kept_from = tl.maximum(min_p_threshold, kth)
    kept = filled & (values >= kept_from)
    cum = mass_at_or_above(candidates, scratch_row, row_max, kept_from, CAND, COLS)
    goal = top_p * tl.max(tl.where(kept, cum, 0.0), axis=0)
    # the largest kept value whose cumulative mass (descending order) reaches the goal
    tau = tl.max(tl.where(kept & (cum >= goal), values, float("-inf")), axis=0)
    return _filtered_threshold(kept_from, tau, row_max, top_p_on, tl.full((), 1, tl.int32), candidates)


@triton.jit(do_not_specialize=["num_blocks"])
def sampler_finish_kernel(
    state_row_ptr, position_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr,
    mode_ptr, row_max_ptr, part_best_ptr, part_token_ptr, part_count_ptr, slots_ptr, scratch_ptr, num_blocks,
    token_out_ptr, bound_ptr, vocab_size,
    NB_P2: tl.constexpr, SCRATCH: tl.constexpr, CAND: tl.constexpr, SLOT: tl.constexpr, GROUP: tl.constexpr,
    COLS: tl.constexpr,
):
    row = tl.program_id(0)
    mode = tl.load(mode_ptr + row)
    base = row.to(tl.int64) * num_blocks
    if mode == MODE_THRESHOLD:
        token = reduce_block_argmax(part_best_ptr, part_token_ptr, base, num_blocks, vocab_size, NB_P2)
        tl.store(token_out_ptr + row, token.to(tl.int64))
    if mode == MODE_GATHER:
        scratch_row = scratch_ptr + row.to(tl.int64) * SCRATCH
        overflow, candidates = compact_block_candidates(part_count_ptr, slots_ptr, base, num_blocks, scratch_row,
                                                        CAND, SLOT, GROUP)
        if overflow != 0:
            tl.store(mode_ptr + row, MODE_FALLBACK)
        else:
            state_row, temperature, top_k, top_k_on, top_p, top_p_on, min_p, min_p_on, filtered = _row_params(
                state_row_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab_size)
            row_max = tl.load(row_max_ptr + row)
            threshold, use_candidates, candidates = _candidate_threshold(
                candidates, scratch_row, row_max, top_k, top_k_on, top_p, top_p_on, min_p, min_p_on, CAND, COLS)
            tl.store(bound_ptr + row, threshold)  # the kept set's threshold (processed logprobs read it)
            values, token_ids = unpack_candidate(candidates)
            kept = (candidates != EMPTY_CANDIDATE) & (values >= threshold)
            seed = tl.load(seed_ptr + state_row)
            position = tl.load(position_ptr + row)
            noisy = tl.where(kept, values + gumbel_noise(seed, position, token_ids), float("-inf"))
            top = tl.max(noisy, axis=0)
            token = tl.min(tl.where(kept & (noisy == top), token_ids, vocab_size), axis=0)
            tl.store(token_out_ptr + row, token.to(tl.int64))


# --------------------------------------------------------------------------- per-row fallback

@triton.jit
def _finish_argmax(best, best_token, vocab_size):
    """Per-lane running maxima -> the lowest token id holding the row maximum (0 if none)."""
    top = tl.max(best, axis=0)
    token = tl.min(tl.where(best == top, best_token, vocab_size), axis=0)
    return tl.where(token >= vocab_size, 0, token)


@triton.jit
def _narrowed_threshold(logits_row, divisor, has_penalty, repetition, frequency, presence, prompt_mask_row,
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
    tau = kept_from
    if top_p_on:
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
    return _filtered_threshold(kept_from, tau, row_max, top_p_on, use_candidates, candidates)


@triton.jit(do_not_specialize=["num_drafts"])
def sampler_row_kernel(
    logits_ptr, logits_stride, state_row_ptr, position_ptr,
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, repetition_ptr, frequency_ptr, presence_ptr, seed_ptr,
    prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride, num_drafts,
    scratch_ptr, mode_ptr, token_out_ptr, flag_out_ptr, bound_ptr, vocab_size,
    BLOCK: tl.constexpr, NARROW_BLOCK: tl.constexpr, CAND: tl.constexpr,
    NPIV: tl.constexpr, MAX_PASSES: tl.constexpr,
):
    """The whole of docs/SAMPLING.md for one row in one program (FALLBACK rows only; others exit).

    Passes over the row (each re-reads the logits): a max/min pass, then
    `sampling_select.narrow_threshold` passes for the top-k count threshold and the top-p mass
    threshold (usually 1-2 each); when the kept set is small (at most ``CAND`` entries) it is
    gathered and sorted once and the Gumbel-max runs over it, otherwise one final pass samples over
    ``s >= threshold``.
    """
    row = tl.program_id(0)
    if tl.load(mode_ptr + row) == MODE_FALLBACK:
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
                    block_best, block_token = _noisy_chunk_argmax(score, offs, seed, position, start,
                                                                  tl.max(score, axis=0), logits_row, divisor, False,
                                                                  BLOCK)
                    # one lane carries the block's winner: the lane-wise running maxima keep their rule
                    score = tl.where(offs == block_token, block_best, float("-inf"))
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
                threshold, use_candidates, candidates = _narrowed_threshold(
                    logits_row, divisor, has_penalty, repetition, frequency, presence, prompt_mask_row, counts_row,
                    draft_row, vocab_size, row_max, row_min, top_k, top_k_on, top_p, top_p_on, min_p, min_p_on,
                    scratch_row, num_drafts, CAND, NPIV, NARROW_BLOCK, MAX_PASSES)
                tl.store(bound_ptr + row, threshold)  # the kept set's threshold (processed logprobs read it)
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
                        kept = tl.where(score >= threshold, score, float("-inf"))
                        block_best, block_token = _noisy_chunk_argmax(kept, offs, seed, position, start,
                                                                      tl.max(kept, axis=0), logits_row, divisor,
                                                                      False, BLOCK)
                        noisy = tl.where(offs == block_token, block_best, float("-inf"))
                        better = noisy > best
                        best = tl.where(better, noisy, best)
                        best_token = tl.where(better, offs, best_token)
                    token = _finish_argmax(best, best_token, vocab_size)
            else:
                token = tl.full((), 0, tl.int32)
        token = tl.where(inf_token < vocab_size, inf_token, token)
        tl.store(token_out_ptr + row, token.to(tl.int64))
        tl.store(flag_out_ptr + row, flagged.to(tl.int32))
