"""Threshold selection over one vocabulary row without sorting it (Triton device functions).

The sampler (top-k, top-p) and the logprobs kernel (top-n) both need "the largest score ``x*``
such that F(x*) >= target", where ``F(x)`` is either the number of row entries ``>= x`` or their
softmax mass ``sum exp(s - m)`` over entries ``>= x``.  Both F are non-increasing in ``x``, so the
answer can be bracketed by evaluating F at a few pivots per pass over the row, never sorting the
vocabulary:

* `narrow_threshold` keeps a bracket ``[lo, hi)`` holding ``x*`` (``F(lo) >= target > F(hi)``).
  Each pass evaluates F at ``NPIV`` pivots at once (a ``[NPIV, BLOCK]`` comparison accumulated per
  lane, reduced once per pass): ``lo`` itself, pivots evenly spaced in *value* (fast on real logit
  rows), pivots evenly spaced in the fp32 *order key* (which bounds the number of passes: the key
  interval shrinks by ``NKEY + 1`` per pass, so 32 bits take at most ~11 passes), and one caller
  hint.  It stops as soon as the answer can be finished from a small candidate set:

  - ``OUTCOME_ALL``: a pivot ``a <= x*`` has at most ``CAND`` entries ``>= a``: gather all of them;
  - ``OUTCOME_BRACKET``: the bracket holds at most ``bracket_cap`` entries: gather the bracket and
    continue the count/mass from ``F(hi)``;
  - ``OUTCOME_EXACT``: the bracket holds a single distinct value: that value is ``x*``;
  - ``OUTCOME_BELOW``: already ``F(lo) < target`` (the caller's filter is then a no-op).

* `gather_candidates` compacts the entries of one or two score ranges into a per-program scratch
  row (index order, capped), then loads and sorts them as packed int64 keys
  ``(order key of the score) << 32 | (2^32 - 1 - token id)``: descending order is score
  descending, ties by lower token id, which is what top-k/top-n tie rules ask for.

Score loading is the caller's: every pass re-reads the row through `load_row_scores`, which
applies the same penalties/temperature (sampler) or the raw-logit rule (logprobs), so no
``[rows, vocab]`` intermediate is ever written.
"""
from __future__ import annotations

import triton
import triton.language as tl

OUTCOME_CONTINUE = tl.constexpr(0)
OUTCOME_ALL = tl.constexpr(1)
OUTCOME_BRACKET = tl.constexpr(2)
OUTCOME_EXACT = tl.constexpr(3)
OUTCOME_BELOW = tl.constexpr(4)

# Smallest packed candidate: sorts after every real one (real keys are >= key(-inf) << 32).
EMPTY_CANDIDATE = tl.constexpr(-9223372036854775807)
FLOAT32_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def float_order_key(x):
    """int32 whose signed order is the numeric order of fp32 ``x`` (not NaN; -0.0 counts as +0.0)."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def float_from_order_key(key):
    bits = key ^ ((key >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def next_float_up(x):
    """The smallest fp32 strictly above finite ``x`` (FLT_MAX goes to +inf)."""
    return float_from_order_key(float_order_key(x) + 1)


@triton.jit
def pack_candidate(score, token_id):
    key = float_order_key(score).to(tl.int64)
    return (key << 32) | (4294967295 - token_id.to(tl.int64))


@triton.jit
def unpack_candidate(packed):
    key = (packed >> 32).to(tl.int32)
    token_id = 4294967295 - (packed & 4294967295)
    return float_from_order_key(key), token_id


@triton.jit
def apply_penalties(logit, offs, in_vocab, repetition, frequency, presence, prompt_mask_row, counts_row,
                    draft_row, num_drafts):
    """docs/SAMPLING.md step 1; the draft prefix of this logit row counts as extra outputs."""
    count = tl.load(counts_row + offs, mask=in_vocab, other=0)
    for j in range(0, num_drafts):
        count += (offs == tl.load(draft_row + j)).to(tl.int32)
    word = tl.load(prompt_mask_row + (offs >> 5), mask=in_vocab, other=0)
    in_prompt = ((word >> (offs & 31)) & 1) != 0
    seen = in_prompt | (count > 0)
    logit = tl.where(seen, tl.where(logit > 0.0, logit / repetition, logit * repetition), logit)
    return logit - frequency * count.to(tl.float32) - presence * (count > 0).to(tl.float32)


@triton.jit
def normal_divisor(temperature):
    """``2^-126 <= T <= 2^126``: ``1 / T`` and ``log2(e) / T`` are normal, and `scale_by_temperature` multiplies."""
    return (temperature >= 1.1754943508222875e-38) & (temperature <= 8.507059173023462e37)


@triton.jit
def scale_by_temperature(logit, temperature, UNFUSED: tl.constexpr = False):
    """``logit / temperature`` (a block or one value), with the same bits wherever the sampler computes it.

    UNFUSED: the product as ``fma(logit, 1 / T, +0)``, one rounding like the multiply (only a zero's sign may
    differ), which the compiler cannot contract into a following add as it may a plain multiply: for a value that
    must keep a block's bits through ``+ noise``."""
    # A normal divisor (2^-126 <= T <= 2^126): one reciprocal a row and a multiply a token, div.full.f32's own
    # sequence where its range scalings are off (the same bits), without its two predicated multiplies a token;
    # another divides as before.
    if normal_divisor(temperature):
        if UNFUSED:
            score = tl.fma(logit, 1.0 / temperature, 0.0)
        else:
            score = logit * (1.0 / temperature)
    else:
        score = logit / temperature
    return score


@triton.jit
def load_row_scores(logits_row, offs, in_vocab, temperature, has_penalty, repetition, frequency, presence,
                    prompt_mask_row, counts_row, draft_row, num_drafts, PROCESSED: tl.constexpr,
                    KEEP_NAN: tl.constexpr = False):
    """``(score, raw)`` for a chunk of a logit row; out-of-vocab lanes score -inf.

    PROCESSED: NaN -> -inf, penalties (when ``has_penalty``), then division by ``temperature``
    (the caller passes 1.0 for greedy rows).  Otherwise the logprobs rule: NaN -> -inf and +inf
    clamped to FLT_MAX so that a flagged row still yields finite selections.
    KEEP_NAN (PROCESSED only): NaN stays NaN, for a caller that finds it in the scores' maximum and reloads.
    """
    raw = tl.load(logits_row + offs, mask=in_vocab, other=float("-inf"))
    if PROCESSED:
        if KEEP_NAN:
            logit = raw
        else:
            logit = tl.where(raw != raw, float("-inf"), raw)
        if has_penalty:
            logit = apply_penalties(logit, offs, in_vocab, repetition, frequency, presence, prompt_mask_row,
                                    counts_row, draft_row, num_drafts)
        score = scale_by_temperature(logit, temperature)
    else:
        # max/min return the non-NaN operand (PTX max.f32, numpy fmax): NaN -> -inf, +inf -> FLT_MAX
        # in two instructions per logit (the logprobs pass is instruction-bound, not memory-bound)
        score = tl.minimum(tl.maximum(raw, float("-inf")), FLOAT32_MAX)
    return score, raw


@triton.jit
def narrow_threshold(logits_row, temperature, has_penalty, repetition, frequency, presence, prompt_mask_row,
                     counts_row, draft_row, vocab_size, row_max, row_min, lo, hi, hint, count_target,
                     mass_fraction, bracket_cap, num_drafts, PROCESSED: tl.constexpr,
                     BY_MASS: tl.constexpr, CAND: tl.constexpr, NPIV: tl.constexpr, BLOCK: tl.constexpr,
                     MAX_PASSES: tl.constexpr):
    """Bracket ``x*`` = the largest score with F(x*) >= target (see the module docstring).

    ``lo`` must be <= x* when the caller expects an answer (F(lo) is measured in the first pass;
    if it falls short the outcome is BELOW); ``hi`` is exclusive and F(hi) must be 0
    (``hi = next_float_up(row_max)``).  BY_MASS: F is the mass and the target
    ``mass_fraction * F_mass(lo)``; otherwise F is the count and the target ``count_target``
    (masses are then not computed and read 0).  Returns ``(outcome, lo, hi, F_count(lo), F_mass(lo),
    F_count(hi), F_mass(hi), target)``; for EXACT, ``lo`` is x*.
    """
    NVAL: tl.constexpr = (NPIV - 2) // 2
    NKEY: tl.constexpr = NPIV - 2 - NVAL
    slot = tl.arange(0, NPIV)
    lanes = tl.arange(0, BLOCK)
    lo = tl.full((), 0.0, tl.float32) + lo  # callers may pass Python floats; the loop carries fp32
    hi = tl.full((), 0.0, tl.float32) + hi
    outcome = tl.full((), 0, tl.int32)
    passes = tl.full((), 0, tl.int32)
    target = tl.full((), 0.0, tl.float32) + count_target
    flo_count = tl.full((), 0, tl.int32)
    flo_mass = tl.full((), 0.0, tl.float32)
    fhi_count = tl.full((), 0, tl.int32)
    fhi_mass = tl.full((), 0.0, tl.float32)
    while outcome == 0:
        key_lo = float_order_key(lo).to(tl.int64)
        key_hi = float_order_key(hi).to(tl.int64)
        below_hi = float_from_order_key((key_hi - 1).to(tl.int32))
        value_lo = tl.maximum(lo, row_min)
        frac = slot.to(tl.float32) / (NVAL + 1)
        value_pivot = value_lo * (1.0 - frac) + below_hi * frac
        key_step = (slot - NVAL).to(tl.int64)
        key_pivot = float_from_order_key((key_lo + (key_hi - key_lo) * key_step // (NKEY + 1)).to(tl.int32))
        pivot = tl.where(slot <= NVAL, value_pivot, tl.where(slot < NPIV - 1, key_pivot, hint))
        pivot = tl.where(slot == 0, lo, pivot)
        pivot = tl.minimum(tl.maximum(pivot, lo), below_hi)
        pivot = tl.where(pivot == 0.0, 0.0, pivot)

        count_acc = tl.zeros((NPIV, BLOCK), tl.int32)
        mass_acc = tl.zeros((NPIV, BLOCK), tl.float32)
        inside_min = tl.full((BLOCK,), float("inf"), tl.float32)
        inside_max = tl.full((BLOCK,), float("-inf"), tl.float32)
        for start in range(0, vocab_size, BLOCK):
            offs = start + lanes
            in_vocab = offs < vocab_size
            score, raw = load_row_scores(logits_row, offs, in_vocab, temperature, has_penalty, repetition, frequency,
                                       presence, prompt_mask_row, counts_row, draft_row, num_drafts, PROCESSED)
            ge = (score[None, :] >= pivot[:, None]) & in_vocab[None, :]
            count_acc += ge.to(tl.int32)
            if BY_MASS:
                prob = tl.where(score == float("-inf"), 0.0, tl.exp(score - row_max))
                mass_acc += tl.where(ge, prob[None, :], 0.0)
            inside = in_vocab & (score >= lo) & (score < hi)
            inside_min = tl.minimum(inside_min, tl.where(inside, score, float("inf")))
            inside_max = tl.maximum(inside_max, tl.where(inside, score, float("-inf")))
        f_count = tl.sum(count_acc, axis=1)
        f_mass = tl.sum(mass_acc, axis=1)
        bracket_min = tl.min(inside_min, axis=0)
        bracket_max = tl.max(inside_max, axis=0)
        lo_count = tl.sum(tl.where(slot == 0, f_count, 0), axis=0)
        lo_mass = tl.sum(tl.where(slot == 0, f_mass, 0.0), axis=0)
        if BY_MASS:
            target = tl.where(passes == 0, mass_fraction * lo_mass, target)
            f_value = f_mass
            lo_value = lo_mass
        else:
            f_value = f_count.to(tl.float32)
            lo_value = lo_count.to(tl.float32)
        sat = f_value >= target
        lo_sat = (lo_count > 0) & (lo_value >= target)

        new_lo = tl.max(tl.where(sat, pivot, float("-inf")), axis=0)
        at_new_lo = sat & (pivot == new_lo)
        new_lo_count = tl.min(tl.where(at_new_lo, f_count, 2147483647), axis=0)
        new_lo_mass = tl.min(tl.where(at_new_lo, f_mass, float("inf")), axis=0)
        has_unsat = tl.sum((~sat).to(tl.int32), axis=0) > 0
        unsat_min = tl.min(tl.where(sat, float("inf"), pivot), axis=0)
        take_pivot_hi = has_unsat & (unsat_min < hi)
        at_new_hi = (~sat) & (pivot == unsat_min)
        new_hi = tl.where(take_pivot_hi, unsat_min, hi)
        new_hi_count = tl.where(take_pivot_hi, tl.max(tl.where(at_new_hi, f_count, 0), axis=0), fhi_count)
        new_hi_mass = tl.where(take_pivot_hi, tl.max(tl.where(at_new_hi, f_mass, 0.0), axis=0), fhi_mass)
        # The old bracket's extreme entries bound the new one without changing F at its ends.
        nonempty = bracket_min <= bracket_max
        new_lo = tl.where(nonempty & (bracket_min >= new_lo), bracket_min, new_lo)
        tight_hi = next_float_up(bracket_max)
        new_hi = tl.where(nonempty & (tight_hi < new_hi), tight_hi, new_hi)

        passes += 1
        single_value = bracket_min == bracket_max
        outcome = tl.where(
            ~lo_sat, OUTCOME_BELOW,
            tl.where(new_lo_count <= CAND, OUTCOME_ALL,
                     tl.where(new_lo_count - new_hi_count <= bracket_cap, OUTCOME_BRACKET,
                              tl.where(single_value | (passes >= MAX_PASSES), OUTCOME_EXACT, 0))))
        # BELOW and EXACT report the bracket they measured; ALL/BRACKET/CONTINUE move to the new one.
        moved = (outcome == OUTCOME_ALL) | (outcome == OUTCOME_BRACKET) | (outcome == 0)
        exact_value = tl.where(single_value, bracket_min, lo)
        flo_count = tl.where(moved, new_lo_count, lo_count)
        flo_mass = tl.where(moved, new_lo_mass, lo_mass)
        fhi_count = tl.where(moved, new_hi_count, fhi_count)
        fhi_mass = tl.where(moved, new_hi_mass, fhi_mass)
        lo = tl.where(moved, new_lo, tl.where(outcome == OUTCOME_EXACT, exact_value, lo))
        hi = tl.where(moved, new_hi, hi)
    return outcome, lo, hi, flo_count, flo_mass, fhi_count, fhi_mass, target


@triton.jit
def gather_candidates(logits_row, temperature, has_penalty, repetition, frequency, presence, prompt_mask_row,
                      counts_row, draft_row, vocab_size, lo, hi, base_b, store_above, scratch_row,
                      num_drafts, PROCESSED: tl.constexpr, CAND: tl.constexpr, BLOCK: tl.constexpr):
    """Sorted packed candidates (``[CAND]`` int64, descending; empty slots EMPTY_CANDIDATE).

    Region B (scores in ``[lo, hi)``) fills slots ``base_b, base_b + 1, ...`` in token order;
    region A (scores ``>= hi``, only when ``store_above``) fills slots ``0, 1, ...``.  Entries past
    ``CAND`` are dropped (callers size the ranges so that only ties at one value can overflow,
    and then keep the lowest token ids, as the top-n tie rule wants).
    """
    lanes = tl.arange(0, BLOCK)
    # store_above may be a Python bool or an int1 scalar: broadcast it to a lane mask explicitly
    above_lanes = (tl.zeros((BLOCK,), tl.int32) + (tl.full((), 0, tl.int32) + store_above)) != 0
    count_a = tl.full((), 0, tl.int32)
    count_b = tl.full((), 0, tl.int32)
    for start in range(0, vocab_size, BLOCK):
        offs = start + lanes
        in_vocab = offs < vocab_size
        score, raw = load_row_scores(logits_row, offs, in_vocab, temperature, has_penalty, repetition, frequency,
                                   presence, prompt_mask_row, counts_row, draft_row, num_drafts, PROCESSED)
        in_b = in_vocab & (score >= lo) & (score < hi)
        in_a = in_vocab & (score >= hi) & above_lanes
        packed = pack_candidate(score, offs)
        slot_a = count_a + tl.cumsum(in_a.to(tl.int32), axis=0) - 1
        slot_b = base_b + count_b + tl.cumsum(in_b.to(tl.int32), axis=0) - 1
        tl.store(scratch_row + slot_a, packed, mask=in_a & (slot_a < CAND))
        tl.store(scratch_row + slot_b, packed, mask=in_b & (slot_b < CAND))
        count_a += tl.sum(in_a.to(tl.int32), axis=0)
        count_b += tl.sum(in_b.to(tl.int32), axis=0)
    tl.debug_barrier()  # the slots were written by other threads of this program
    slots = tl.arange(0, CAND)
    filled = (slots < count_a) | ((slots >= base_b) & (slots < base_b + count_b))
    packed = tl.load(scratch_row + slots, mask=filled, other=EMPTY_CANDIDATE)
    tl.debug_barrier()  # every thread has read before a later gather rewrites the scratch row
    return sorted_descending(packed)


@triton.jit
def sorted_descending(packed):
    """``packed`` (a 1-D int64 block) largest first; its own function so that the interpreter can run it as a numpy
    sort (`runnercheck.impl.kernels.interpreted_twins`) rather than as ``tl.sort``'s bitonic network op by op."""
    return tl.sort(packed, descending=True)
