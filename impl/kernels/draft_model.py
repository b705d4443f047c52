"""Kernels of the draft-model proposer (`runnercheck.impl.draft_proposer`) and of its verification in the runner.

* `_draft_sample_partials_kernel`, one program per (request of the draft decode batch, span of ``CHUNK``
  tokens), then `_draft_sample_combine_kernel`, one per request: draft ``j`` of
  proposer row ``rows[i]`` (a bucket's padding request: the proposer's dummy row) is the Gumbel-max of ``log q + g`` over ``q = q_buf[row, j]`` (the draft's
  distribution after the request's temperature, penalties and filters) with the noise of
  ``DRAFT_STREAM`` at the produced token's position and the seed of state row ``state_rows[i]``
  (the same row for a live request; a padding request reads a live row's seed, never writes it);
  a greedy request's ``q`` is a point mass, so the same rule returns its argmax.  The spans' partials
  (`runnercheck.impl.kernels.spec_verify.residual_span_partials`) go through the caller's buffer; the combine
  takes the lowest token at the largest score, the one-pass rule exactly.  Writes ``proposed[row, j]`` and the next decode input.
* `_gather_draft_probs_kernel`, grid ``(num_reqs, K, spans)``: copies one vocabulary span (`spans_of`) of
  ``q_buf[rows[i], j]`` into the step's draft-probability row ``draft_start[i] + j`` (the layout `SpecVerifier`
  reads); a program per row walking all of V left a 151936-token copy to 24 programs at 8 requests.
* `_scatter_verified_kernel`, one program per scheduled request: for a request with ``k > 0``
  drafts and temperature > 0 it writes the verifier's ``accepted + 1`` tokens into the sampler's
  token rows and, when a draft was rejected, poisons that draft (-1) in the step's draft buffer,
  so the post-update kernel's exact-match rule stops at the verifier's accepted count (even when
  the resampled token happens to equal the rejected draft).  Other requests keep the sampler's
  tokens (greedy: exact match equals the verifier's greedy mode).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from runnercheck.impl.kernels.launch import launch
from runnercheck.impl.kernels.rng import DRAFT_STREAM
from runnercheck.impl.kernels.spec_verify import (SPAN_BLOCK, SPAN_TOKENS, combine_partials, residual_span_partials, spans_of,
                                                   store_partials)


@triton.jit(do_not_specialize=["vocab_size", "j", "num_chunks"])
def _draft_sample_partials_kernel(rows_ptr, state_rows_ptr, positions_ptr, seed_ptr, q_ptr, q_row_stride, q_draft_stride,
                                  part_ptr, j, num_chunks, vocab_size, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Program (request, span): the Gumbel-max of ``log q + g`` over one ``CHUNK`` of the request's ``q`` row."""
    i = tl.program_id(0)
    chunk = tl.program_id(1)
    row = tl.load(rows_ptr + i).to(tl.int64)
    position = tl.load(positions_ptr + i).to(tl.int64)
    seed = tl.load(seed_ptr + tl.load(state_rows_ptr + i).to(tl.int64))
    q_row = q_ptr + row * q_row_stride + j * q_draft_stride
    start = chunk * CHUNK
    top_r, tok_r, top_p, tok_p = residual_span_partials(q_row, q_row, 0, seed, position, start,
                                                        tl.minimum(start + CHUNK, vocab_size), BLOCK, DRAFT_STREAM)
    store_partials(part_ptr, i, chunk, num_chunks, top_r, tok_r, top_p, tok_p)


@triton.jit(do_not_specialize=["vocab_size", "j", "num_chunks"])
def _draft_sample_combine_kernel(rows_ptr, part_ptr, proposed_ptr, proposed_stride, next_ptr, j, num_chunks, vocab_size,
                                 CHUNKS_P2: tl.constexpr):
    i = tl.program_id(0)
    row = tl.load(rows_ptr + i).to(tl.int64)
    token = combine_partials(part_ptr, i, num_chunks, vocab_size, CHUNKS_P2)
    tl.store(proposed_ptr + row * proposed_stride + j, token.to(tl.int32))
    tl.store(next_ptr + i, token.to(tl.int64))


def launch_draft_sample(*, rows: torch.Tensor, state_rows: torch.Tensor, positions: torch.Tensor, seeds: torch.Tensor, q_buf: torch.Tensor,
                        proposed: torch.Tensor, next_tokens: torch.Tensor, partials: torch.Tensor, chunk: int, j: int,
                        num_reqs: int) -> None:
    """Sample draft ``j`` of ``num_reqs`` rows from ``q_buf [R + 1, K, V]`` (device work); ``state_rows``: each
    request's sampling-state row (its seed); ``chunk`` and ``partials`` (int32 ``[>= num_reqs, 4, spans]``): the
    span width and count of `runnercheck.impl.kernels.spec_verify.spans_of` for ``V``."""
    vocab, num_chunks = q_buf.shape[2], partials.shape[2]
    launch(_draft_sample_partials_kernel, (num_reqs, num_chunks), rows, state_rows, positions, seeds, q_buf, q_buf.stride(0),
           q_buf.stride(1), partials, j, num_chunks, vocab, CHUNK=chunk, BLOCK=min(SPAN_BLOCK, chunk))
    launch(_draft_sample_combine_kernel, (num_reqs,), rows, partials, proposed, proposed.stride(0), next_tokens, j,
           num_chunks, vocab, CHUNKS_P2=max(2, triton.next_power_of_2(num_chunks)))


@triton.jit(do_not_specialize=["vocab_size"])
def _gather_draft_probs_kernel(rows_ptr, draft_start_ptr, q_ptr, q_row_stride, q_draft_stride, out_ptr, out_stride,
                               vocab_size, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    j = tl.program_id(1)
    d_start = tl.load(draft_start_ptr + i)
    k = tl.load(draft_start_ptr + i + 1) - d_start
    if j < k:
        row = tl.load(rows_ptr + i).to(tl.int64)
        src = q_ptr + row * q_row_stride + j * q_draft_stride
        dst = out_ptr + (d_start + j).to(tl.int64) * out_stride
        span_start = tl.program_id(2) * CHUNK
        span_end = tl.minimum(span_start + CHUNK, vocab_size)
        for start in range(0, CHUNK, BLOCK):
            offs = span_start + start + tl.arange(0, BLOCK)
            tl.store(dst + offs, tl.load(src + offs, mask=offs < span_end), mask=offs < span_end)


def launch_gather_draft_probs(*, rows: torch.Tensor, draft_start: torch.Tensor, q_buf: torch.Tensor, out: torch.Tensor,
                              num_reqs: int, max_drafts: int, span_tokens: int = SPAN_TOKENS) -> None:
    """Copy each scheduled draft's ``q`` row into ``out`` at its step draft index (device work), one program per
    (request, draft, vocabulary span of ``span_tokens``)."""
    vocab = q_buf.shape[2]
    chunk, spans = spans_of(vocab, span_tokens)
    launch(_gather_draft_probs_kernel, (num_reqs, max(1, max_drafts), spans),
        rows, draft_start, q_buf, q_buf.stride(0), q_buf.stride(1), out, out.stride(0), vocab,
        CHUNK=chunk, BLOCK=min(SPAN_BLOCK, chunk))


@triton.jit
def _scatter_verified_kernel(rows_ptr, draft_start_ptr, logits_start_ptr, temperature_ptr, verified_ptr, verified_stride,
                             accepted_ptr, sampled_ptr, drafts_ptr, BLOCK_K: tl.constexpr):
    i = tl.program_id(0)
    d_start = tl.load(draft_start_ptr + i)
    k = tl.load(draft_start_ptr + i + 1) - d_start
    row = tl.load(rows_ptr + i).to(tl.int64)
    temperature = tl.load(temperature_ptr + row)
    if (k > 0) & (temperature != 0.0):
        a = tl.load(accepted_ptr + i)
        l_start = tl.load(logits_start_ptr + i)
        r = tl.arange(0, BLOCK_K)
        tokens = tl.load(verified_ptr + i.to(tl.int64) * verified_stride + r, mask=r <= a, other=0)
        tl.store(sampled_ptr + l_start + r, tokens, mask=r <= a)
        if a < k:
            tl.store(drafts_ptr + d_start + a, -1)


def launch_scatter_verified(*, rows: torch.Tensor, draft_start: torch.Tensor, logits_start: torch.Tensor,
                            temperature: torch.Tensor, verified: torch.Tensor, accepted: torch.Tensor,
                            sampled: torch.Tensor, drafts: torch.Tensor, num_reqs: int) -> None:
    """Write the verifier's tokens over the sampler's for rejection-sampled requests (device work)."""
    launch(_scatter_verified_kernel, (num_reqs,), rows, draft_start, logits_start, temperature, verified, verified.stride(0),
                                          accepted, sampled, drafts,
                                          BLOCK_K=max(2, triton.next_power_of_2(verified.shape[1])))


__all__ = ["launch_draft_sample", "launch_gather_draft_probs", "launch_scatter_verified"]
