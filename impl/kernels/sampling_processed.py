"""Processed scores: the rows the sampler drew from, written out for the logprobs kernels (docs/SAMPLING.md "Logprobs").

`processed_scores_kernel`, one program per (logit row, vocabulary chunk), writes one row of a scores buffer per
logit row:

* a row whose state row asks for processed logprobs (``logprobs_mode[state_row] != 0``): the sampler's own
  scores (`runnercheck.impl.kernels.sampling._chunk_scores`: NaN -> -inf, penalties with the row's draft prefix
  counted as outputs, division by the temperature, 1 for greedy rows), ``-inf`` where the score lies below the
  row's kept threshold ``bound[row]`` (which the sampler's plan/finish/fallback kernels leave there: the
  ``s >= threshold`` that min-p, top-k and top-p combine to).  Greedy rows are never filtered (their threshold
  is not read): the temperature-1 distribution whose argmax the greedy token is;
* any other row: its raw logits, unchanged (the logprobs kernels apply the raw rule themselves).

The same fp32 function computes these scores as every sampler pass, from the same inputs, so the kept set
written here is bit for bit the set the sampler drew from.  The logprobs kernels
(`runnercheck.impl.kernels.sampling_logprobs`) then run on the buffer unchanged: ``log_softmax`` of the kept
scores is the log of the exact distribution sampled (filtered tokens ``-inf``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from runnercheck.impl.kernels.sampling import _chunk_scores


@triton.jit
def _kept_scores(score, bound, temperature):
    """The processed row of a chunk: the score where it reaches the kept threshold, else -inf (``temperature``
    unused here; the one place the processed-logprob mutants of `runnercheck.stress.mutants.logprobs` rebind)."""
    return tl.where(score >= bound, score, float("-inf"))


@triton.jit
def kept_chunk_scores(logits_ptr, logits_stride, row, offs, in_vocab, state_row, temperature_ptr, repetition_ptr,
                      frequency_ptr, presence_ptr, bound_ptr, prompt_mask_ptr, prompt_mask_stride, counts_ptr,
                      counts_stride, draft_ptr, draft_stride, num_drafts):
    """One chunk of a processed row: the sampler's scores, ``-inf`` below the row's kept threshold (greedy rows:
    none).  Also the first half of `runnercheck.impl.kernels.sampling_distribution` (the drawn distributions)."""
    temperature = tl.load(temperature_ptr + state_row)
    score, raw, has_penalty = _chunk_scores(logits_ptr, logits_stride, row, offs, in_vocab, state_row, temperature,
                                            repetition_ptr, frequency_ptr, presence_ptr, prompt_mask_ptr,
                                            prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride,
                                            num_drafts)
    bound = tl.where(temperature == 0.0, float("-inf"), tl.load(bound_ptr + row))
    return _kept_scores(score, bound, temperature)


@triton.jit(do_not_specialize=["num_drafts", "row_offset"])
def processed_scores_kernel(
    logits_ptr, logits_stride, state_row_ptr, temperature_ptr, repetition_ptr, frequency_ptr, presence_ptr,
    mode_ptr, bound_ptr, prompt_mask_ptr, prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride,
    num_drafts, row_offset, out_ptr, out_stride, vocab_size,
    CHUNK: tl.constexpr,
):
    """Rows ``row_offset + program_id(0)`` of the step into row ``program_id(0)`` of ``out``."""
    local = tl.program_id(0)
    blk = tl.program_id(1)
    row = local + row_offset
    state_row = tl.load(state_row_ptr + row).to(tl.int64)
    offs = blk * CHUNK + tl.arange(0, CHUNK)
    in_vocab = offs < vocab_size
    out_row = out_ptr + local.to(tl.int64) * out_stride
    if tl.load(mode_ptr + state_row) != 0:
        kept = kept_chunk_scores(logits_ptr, logits_stride, row, offs, in_vocab, state_row, temperature_ptr,
                                 repetition_ptr, frequency_ptr, presence_ptr, bound_ptr, prompt_mask_ptr,
                                 prompt_mask_stride, counts_ptr, counts_stride, draft_ptr, draft_stride, num_drafts)
        tl.store(out_row + offs, kept, mask=in_vocab)
    else:
        raw = tl.load(logits_ptr + row.to(tl.int64) * logits_stride + offs, mask=in_vocab, other=float("-inf"))
        tl.store(out_row + offs, raw, mask=in_vocab)
