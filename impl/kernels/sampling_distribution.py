"""The distribution a sampler call drew each row from, in two launches (`runnercheck.impl.sample.probs`).

`distribution_scores_kernel`, one program per (logit row, vocabulary chunk): the row's kept scores
(`runnercheck.impl.kernels.sampling_processed.kept_chunk_scores`: the sampler's own fp32 scores, ``-inf`` below the
kept threshold it left in ``bound``) into the output row, and the chunk's softmax partials -- its largest kept
score ``m`` and ``sum(exp(s - m))`` over its lanes (0 where ``m`` is not finite) -- into ``part``.

`distribution_finish_kernel`, one program per (row, chunk): the row's maximum ``M`` and normaliser
``S = sum_c exp(m_c - M) s_c`` from every chunk's partials, then, in place over the scores,
``exp(s - M) / S`` -- or a point mass on the sampler's token where no noise was involved: a greedy row, a
``+inf`` maximum, no finite score (``M = -inf``).

Two launches and four passes over ``[rows, V]`` (logits read, scores written, read, probabilities written)
where a processed-scores launch followed by torch's ``amax``, ``softmax``, ``scatter`` and ``where`` took ten
launches and about nine passes -- four times a speculative step (the verification and each draft decode).
"""
from __future__ import annotations

import triton
import triton.language as tl

from runnercheck.impl.kernels.sampling_processed import kept_chunk_scores


@triton.jit(do_not_specialize=["num_drafts"])
def distribution_scores_kernel(
    logits_ptr, logits_stride, state_row_ptr, temperature_ptr, repetition_ptr, frequency_ptr, presence_ptr,
    bound_ptr, prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride,
    num_drafts, out_ptr, out_stride, part_ptr, num_chunks, vocab_size,
    CHUNK: tl.constexpr,
):
    """Row ``program_id(0)``'s kept scores over chunk ``program_id(1)`` into ``out``; the chunk's (max, sum of
    exp below it) into ``part[row, chunk]`` (float32 ``[rows, num_chunks, 2]``)."""
    row = tl.program_id(0)
    blk = tl.program_id(1)
    state_row = tl.load(state_row_ptr + row).to(tl.int64)
    offs = blk * CHUNK + tl.arange(0, CHUNK)
    in_vocab = offs < vocab_size
    kept = kept_chunk_scores(logits_ptr, logits_stride, row, offs, in_vocab, state_row, temperature_ptr,
                             repetition_ptr, frequency_ptr, presence_ptr, bound_ptr, prompt_mask_ptr,
                             prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride, num_drafts)
    kept = tl.where(in_vocab, kept, float("-inf"))
    tl.store(out_ptr + row.to(tl.int64) * out_stride + offs, kept, mask=in_vocab)
    m = tl.max(kept, axis=0)
    finite = (m > float("-inf")) & (m < float("inf"))
    total = tl.sum(tl.where(finite, tl.exp(kept - tl.where(finite, m, 0.0)), 0.0), axis=0)
    at = part_ptr + (row.to(tl.int64) * num_chunks + blk) * 2
    tl.store(at, m)
    tl.store(at + 1, total)


@triton.jit
def distribution_finish_kernel(out_ptr, out_stride, part_ptr, num_chunks, state_row_ptr, temperature_ptr, token_ptr,
                               vocab_size, CHUNK: tl.constexpr, CHUNKS_P2: tl.constexpr):
    """Row ``program_id(0)``'s chunk ``program_id(1)`` of ``out``: its scores turned into probabilities, or the
    point mass on ``token_ptr[row]`` (see the module docstring)."""
    row = tl.program_id(0)
    blk = tl.program_id(1)
    chunks = tl.arange(0, CHUNKS_P2)
    at = part_ptr + row.to(tl.int64) * num_chunks * 2 + chunks * 2
    m_c = tl.load(at, mask=chunks < num_chunks, other=float("-inf"))
    s_c = tl.load(at + 1, mask=chunks < num_chunks, other=0.0)
    top = tl.max(m_c, axis=0)
    temperature = tl.load(temperature_ptr + tl.load(state_row_ptr + row))
    point = (temperature == 0.0) | (top == float("inf")) | (top == float("-inf"))
    # The point-mass rows' unused branch stays free of inf - inf and 0 / 0 (the interpreter warns on them).
    shift = tl.where((top > float("-inf")) & (top < float("inf")), top, 0.0)
    live = (m_c > float("-inf")) & (m_c < float("inf"))
    total = tl.sum(tl.exp(tl.where(live, m_c - shift, float("-inf"))) * s_c, axis=0)
    total = tl.where(total > 0.0, total, 1.0)
    offs = blk * CHUNK + tl.arange(0, CHUNK)
    in_vocab = offs < vocab_size
    row_ptr = out_ptr + row.to(tl.int64) * out_stride + offs
    score = tl.load(row_ptr, mask=in_vocab, other=float("-inf"))
    token = tl.load(token_ptr + row)
    probs = tl.where(point, (offs == token).to(tl.float32), tl.exp(score - shift) / total)
    tl.store(row_ptr, probs, mask=in_vocab)


__all__ = ["distribution_finish_kernel", "distribution_scores_kernel"]
