"""Greedy rows in one launch: docs/SAMPLING.md steps 0-2 at one read of the logits.

`greedy_argmax_kernel` runs ``num_blocks`` programs per row, each over a contiguous ``span`` of the
vocabulary (a multiple of ``SUB``), walked in ``SUB``-wide steps that keep a per-lane running argmax
(strict ``>``: an earlier step, the lower token, keeps a tie), so a program reduces once whatever its
span.  `greedy_spans` sizes the spans so that a launch has about ``programs`` programs at any row
count (a few per SM: at 256 rows one program per row, at one row ~150).  The programs of a row combine
with atomics: each folds its argmax into the row's packed key (`atomic_max` on ``ordered float bits <<
32 | (2^31 - 1 - token)``: the larger score wins, then the lower index), its first raw ``+inf`` index
(`atomic_min`) and its non-finite flag (`atomic_max`), then bumps the row's arrival counter; the row's
last program reads the three accumulators back while resetting them (`atomic_xchg`), applies the
non-finite rule and writes the token and the flag.  So the accumulators are at their reset values
between launches (CUDA-graph replays included).

Only for batches whose every row is greedy (temperature 0): `runnercheck.impl.sample.Sampler.sample`
takes it when its caller says so (``all_greedy=True``); mixed batches use the split passes, whose
greedy rows are exact too.  Penalties are applied (the same `load_row_scores`).
"""
from __future__ import annotations

import triton
import triton.language as tl

from runnercheck.impl.kernels.sampling_select import load_row_scores

PACKED_RESET = -(2**63)  # below every packed key
INF_RESET = 2**31 - 1  # above every token id


@triton.jit
def pack_argmax(best, token):
    """``best`` (fp32, not NaN) and ``token`` as one int64 whose signed order is (best, then lower token)."""
    bits = (best + 0.0).to(tl.int32, bitcast=True)  # + 0.0: -0.0 becomes +0.0, equal scores pack equal
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (2147483647 - token).to(tl.int64)


@triton.jit
def unpack_token(packed):
    return (2147483647 - (packed & 0xFFFFFFFF)).to(tl.int32)


def greedy_spans(vocab_size: int, num_rows: int, sub: int, programs: int) -> tuple[int, int]:
    """``(num_blocks, span)`` of a launch over ``num_rows`` rows: about ``programs`` programs in all, each
    span a multiple of ``sub``, the last one holding the remainder of the row."""
    blocks = max(1, min(-(-programs // max(num_rows, 1)), -(-vocab_size // sub)))
    span = -(-(-(-vocab_size // blocks)) // sub) * sub
    return -(-vocab_size // span), span


# Spans shorter than this many steps load plainly whatever ``stages`` asks: the pipeline's prologue does not pay there
# (H100 lab sweep, one lease: 3 stages at 8 rows, 3 steps a span, 15.1 us against 14.2 plain; at 64 rows, 19 steps,
# 31.0 against 32.6; at 256 rows, 75 steps, 76.3 against 78.2).
MIN_PIPELINED_STEPS = 8


def greedy_stages(span: int, sub: int, stages: int) -> int:
    """The software-pipelined steps a launch of ``span``-token spans takes: ``stages`` where a span has at least
    `MIN_PIPELINED_STEPS` steps of ``sub``, else 1 (plain loads)."""
    return stages if span // sub >= MIN_PIPELINED_STEPS else 1


@triton.jit
def _span_argmax(logits_row, start, stop, repetition, frequency, presence, prompt_mask_row, counts_row, draft_row,
                 num_drafts, SUB: tl.constexpr, PENALTIES: tl.constexpr, STAGES: tl.constexpr):
    """``(top score, its lowest token, non-finite flag, first raw +inf token)`` of ``[start, stop)``.

    Without penalties a score is its raw logit (NaN as -inf), so a lane's running best reaches +inf exactly at
    its first raw +inf and keeps it (strict ``>``): the +inf facts are read off the running best after the loop,
    and the loop carries only the argmax and a NaN-propagating maximum -- the fewest instructions per logit,
    which the launch at 256 rows needs to stay at memory speed.  Penalties can move a finite logit to +inf, so
    that loop tracks the raw facts per logit.  ``STAGES`` > 1: the loop's loads are software-pipelined (Triton
    copies the next ``STAGES - 1`` steps to shared memory asynchronously while a step is reduced); 1: plain loads."""
    lanes = tl.arange(0, SUB)
    best = tl.full([SUB], float("-inf"), tl.float32)
    best_token = start + lanes
    if PENALTIES:
        nonfinite = tl.zeros([SUB], tl.int32)
        first_inf = tl.full([SUB], 2147483647, tl.int32)
    else:
        nan_seen = tl.full([SUB], float("-inf"), tl.float32)
    for first in tl.range(start, stop, SUB, num_stages=STAGES):
        offs = first + lanes
        score, raw = load_row_scores(logits_row, offs, offs < stop, 1.0, PENALTIES, repetition, frequency, presence,
                                     prompt_mask_row, counts_row, draft_row, num_drafts, True)
        better = score > best
        best = tl.where(better, score, best)
        best_token = tl.where(better, offs, best_token)
        if PENALTIES:
            nonfinite = tl.maximum(nonfinite, ((raw != raw) | (raw == float("inf"))).to(tl.int32))
            first_inf = tl.minimum(first_inf, tl.where(raw == float("inf"), offs, 2147483647))
        else:
            nan_seen = tl.maximum(nan_seen, raw, propagate_nan=tl.PropagateNan.ALL)
    if not PENALTIES:
        at_inf = best == float("inf")
        nonfinite = ((nan_seen != nan_seen) | at_inf).to(tl.int32)
        first_inf = tl.where(at_inf, best_token, 2147483647)
    top = tl.max(best, axis=0)
    token = tl.min(tl.where(best == top, best_token, 2147483647), axis=0)
    return top, token, tl.max(nonfinite, axis=0), tl.min(first_inf, axis=0)


@triton.jit(do_not_specialize=["num_drafts", "num_blocks", "span"])
def greedy_argmax_kernel(
    logits_ptr, logits_stride, state_row_ptr, repetition_ptr, frequency_ptr, presence_ptr,
    prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride, num_drafts,
    packed_ptr, inf_ptr, flag_ptr, arrivals_ptr, token_out_ptr, flag_out_ptr, num_blocks, span, vocab_size,
    SUB: tl.constexpr, STAGES: tl.constexpr,
):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    state_row = tl.load(state_row_ptr + row).to(tl.int64)
    repetition = tl.load(repetition_ptr + state_row)
    frequency = tl.load(frequency_ptr + state_row)
    presence = tl.load(presence_ptr + state_row)
    logits_row = logits_ptr + row.to(tl.int64) * logits_stride
    prompt_mask_row = prompt_mask_ptr + state_row * prompt_mask_stride
    counts_row = counts_ptr + state_row * counts_stride
    draft_row = draft_ptr + row.to(tl.int64) * draft_stride
    start = blk * span
    stop = tl.minimum(start + span, vocab_size)
    # the branch is uniform over the program: the common penalty-free rows run a loop without the penalty code
    if (repetition != 1.0) | (frequency != 0.0) | (presence != 0.0):
        top, token, nonfinite, first_inf = _span_argmax(logits_row, start, stop, repetition, frequency, presence,
                                                        prompt_mask_row, counts_row, draft_row, num_drafts, SUB, True,
                                                        STAGES)
    else:
        top, token, nonfinite, first_inf = _span_argmax(logits_row, start, stop, repetition, frequency, presence,
                                                        prompt_mask_row, counts_row, draft_row, num_drafts, SUB, False,
                                                        STAGES)
    tl.atomic_max(packed_ptr + row, pack_argmax(top, token))
    tl.atomic_min(inf_ptr + row, first_inf)
    tl.atomic_max(flag_ptr + row, nonfinite)
    if tl.atomic_add(arrivals_ptr + row, 1) == num_blocks - 1:  # acq_rel: the row's other atomics are visible
        tl.store(arrivals_ptr + row, 0)
        packed = tl.atomic_xchg(packed_ptr + row, tl.full((), -9223372036854775807, tl.int64) - 1)  # PACKED_RESET
        inf_token = tl.atomic_xchg(inf_ptr + row, 2147483647)
        flagged = tl.atomic_xchg(flag_ptr + row, 0)
        token = tl.where(inf_token < vocab_size, inf_token, unpack_token(packed))
        tl.store(token_out_ptr + row, token.to(tl.int64))
        tl.store(flag_out_ptr + row, flagged)
