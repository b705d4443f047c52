"""The distribution a sampler call drew each row from, in two launches (`runnercheck.impl.sample.probs`).

`distribution_scores_kernel`, one program per (logit row, vocabulary span of ``SPAN`` tokens, walked ``BLOCK``
at a time): the row's kept scores (`runnercheck.impl.kernels.sampling_processed.kept_chunk_scores`: the sampler's own
fp32 scores, ``-inf`` below the kept threshold it left in ``bound``) into the output row, and the span's softmax
partials -- its largest kept score ``m`` and ``sum(exp(s - m))`` over its tokens (0 where ``m`` is not finite) --
into ``part``.

`distribution_finish_kernel`, one program per (row, span): the row's maximum ``M`` and normaliser
``S = sum_spans exp(m - M) s`` from every span's partials, then, in place over the scores,
``exp(s - M) / S`` -- or a point mass on the sampler's token where no noise was involved: a greedy row, a
``+inf`` maximum, no finite score (``M = -inf``).

Two launches and four passes over ``[rows, V]`` (logits read, scores written, read, probabilities written)
where a processed-scores launch followed by torch's ``amax``, ``softmax``, ``scatter`` and ``where`` took ten
launches and about nine passes -- four times a speculative step (the verification and each draft decode).
Spans as wide as the speculative kernels' (`runnercheck.impl.kernels.spec_verify.spans_of`): 38 a row at
V = 151936, one a row at the CPU suite's vocabularies, where every interpreted program costs its ops' Python.
"""
from __future__ import annotations

import triton
import triton.language as tl

from runnercheck.impl.kernels.sampling_processed import kept_chunk_scores


@triton.jit
def _merge_partial(m, total, kept):
    """The running (max, sum of exp below it) of a span after one more block of kept scores; total 0 while the max is
    not finite (a row without finite scores, or with a ``+inf``: a point mass, whose normaliser is unused)."""
    new_m = tl.maximum(m, tl.max(kept, axis=0))
    finite = (new_m > float("-inf")) & (new_m < float("inf"))
    ref = tl.where(finite, new_m, 0.0)
    carried = total * tl.exp(tl.where(finite & (m > float("-inf")), m - ref, float("-inf")))
    return new_m, tl.where(finite, carried + tl.sum(tl.exp(kept - ref), axis=0), 0.0)


@triton.jit(do_not_specialize=["num_drafts"])
def distribution_scores_kernel(
    logits_ptr, logits_stride, state_row_ptr, temperature_ptr, repetition_ptr, frequency_ptr, presence_ptr,
    bound_ptr, prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride,
    num_drafts, out_ptr, out_stride, part_ptr, num_spans, vocab_size,
    SPAN: tl.constexpr, BLOCK: tl.constexpr,
):
    """Row ``program_id(0)``'s kept scores over span ``program_id(1)`` into ``out``; the span's (max, sum of exp
    below it) into ``part[row, span]`` (float32 ``[rows, num_spans, 2]``)."""
    row = tl.program_id(0)
    span = tl.program_id(1)
    state_row = tl.load(state_row_ptr + row).to(tl.int64)
    out_row = out_ptr + row.to(tl.int64) * out_stride
    m = float("-inf")
    total = 0.0
    for start in tl.static_range(0, SPAN, BLOCK):
        offs = span * SPAN + start + tl.arange(0, BLOCK)
        in_vocab = offs < vocab_size
        kept = kept_chunk_scores(logits_ptr, logits_stride, row, offs, in_vocab, state_row, temperature_ptr,
                                 repetition_ptr, frequency_ptr, presence_ptr, bound_ptr, prompt_mask_ptr,
                                 prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride, num_drafts)
        kept = tl.where(in_vocab, kept, float("-inf"))
        tl.store(out_row + offs, kept, mask=in_vocab)
        m, total = _merge_partial(m, total, kept)
    at = part_ptr + (row.to(tl.int64) * num_spans + span) * 2
    tl.store(at, m)
    tl.store(at + 1, total)


@triton.jit
def distribution_finish_kernel(out_ptr, out_stride, part_ptr, num_spans, state_row_ptr, temperature_ptr, token_ptr,
                               vocab_size, SPAN: tl.constexpr, BLOCK: tl.constexpr, SPANS_P2: tl.constexpr):
    """Row ``program_id(0)``'s span ``program_id(1)`` of ``out``: its scores turned into probabilities, or the
    point mass on ``token_ptr[row]`` (see the module docstring)."""
    row = tl.program_id(0)
    span = tl.program_id(1)
    spans = tl.arange(0, SPANS_P2)
    at = part_ptr + row.to(tl.int64) * num_spans * 2 + spans * 2
    m_s = tl.load(at, mask=spans < num_spans, other=float("-inf"))
    s_s = tl.load(at + 1, mask=spans < num_spans, other=0.0)
    top = tl.max(m_s, axis=0)
    temperature = tl.load(temperature_ptr + tl.load(state_row_ptr + row))
    point = (temperature == 0.0) | (top == float("inf")) | (top == float("-inf"))
    # The point-mass rows' unused branch stays free of inf - inf and 0 / 0 (the interpreter warns on them).
    shift = tl.where((top > float("-inf")) & (top < float("inf")), top, 0.0)
    live = (m_s > float("-inf")) & (m_s < float("inf"))
    total = tl.sum(tl.exp(tl.where(live, m_s - shift, float("-inf"))) * s_s, axis=0)
    total = tl.where(total > 0.0, total, 1.0)
    token = tl.load(token_ptr + row)
    out_row = out_ptr + row.to(tl.int64) * out_stride
    for start in tl.static_range(0, SPAN, BLOCK):
        offs = span * SPAN + start + tl.arange(0, BLOCK)
        in_vocab = offs < vocab_size
        score = tl.load(out_row + offs, mask=in_vocab, other=float("-inf"))
        probs = tl.where(point, (offs == token).to(tl.float32), tl.exp(score - shift) / total)
        tl.store(out_row + offs, probs, mask=in_vocab)


__all__ = ["distribution_finish_kernel", "distribution_scores_kernel"]
