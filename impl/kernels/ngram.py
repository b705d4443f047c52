"""N-gram (prompt lookup) proposer kernels: propose after post-update, gather into the next step's drafts.

`_ngram_propose_kernel`, one program per scheduled request ``i`` (state row ``rows[i]``), runs after
the post-update kernel.  A request that sampled this step (``num_sampled[i] = s > 0``) has
``T = NUM_TOKENS`` known tokens; its last ``s`` are this step's samples (logit rows
``logits_start[i] ..``).  The program

1. appends those ``s`` tokens to the row's output history (``history[row, T - s : T]``);
2. finds, for ``n = max_n`` down to ``min_n`` (the first ``n`` that matches wins), the largest start
   ``m`` in ``[0, T - n - 1]`` with ``tok[m : m + n] == tok[T - n : T]``;
3. writes ``K`` drafts ``proposed[row, r] = tok[m + n + (r mod d)]`` with ``d = T - n - m`` (the
   continuation after the match, repeated with the period the match implies), or, with no match,
   ``proposed[row, r] = tok[T - 1]``.

``tok[p]`` is the pinned prefill token for ``p < PREFILL_LEN`` (over UVA on CUDA), this step's
sample for ``p >= T - s``, else ``history[row, p]``: the program never reads what it wrote (no
barrier needed).  docs/SAMPLING.md ("N-gram proposer") is the contract; `runnercheck.reference.ngram` the
oracle.

`_gather_drafts_kernel`, one program per scheduled request, runs before input prep: draft ``r``
of request ``i`` is the staged value when it is >= 0, else (the host's placeholder -1)
``proposed[rows[i], r]``; the result goes to the step's own draft buffer, which input prep,
post-update and the padded-step copy read instead of the staged drafts.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from runnercheck.impl.kernels.launch import launch
from runnercheck.impl.state import NUM_ROW_FIELDS, NUM_TOKENS, PREFILL_LEN


@triton.jit
def _token_at(p, mask, prefill_row, history_row, sampled_ptr, prefill_len, fresh_start, l_start):
    from_prefill = p < prefill_len
    from_sample = p >= fresh_start
    a = tl.load(prefill_row + p, mask=mask & from_prefill, other=0)
    b = tl.load(sampled_ptr + l_start + (p - fresh_start), mask=mask & from_sample & (p >= 0), other=0).to(tl.int32)
    c = tl.load(history_row + p, mask=mask & (p >= prefill_len) & (p < fresh_start), other=0)
    return tl.where(from_prefill, a, tl.where(from_sample, b, c))


@triton.jit(do_not_specialize=["num_reqs"])
def _ngram_propose_kernel(
    rows_ptr, logits_start_ptr, num_sampled_ptr, sampled_ptr, row_state_ptr, prefill_ptr, prefill_row_stride,
    history_ptr, history_row_stride, proposed_ptr, proposed_row_stride, num_reqs,
    ROW_FIELDS: tl.constexpr, COL_TOKENS: tl.constexpr, COL_PREFILL: tl.constexpr,
    MIN_N: tl.constexpr, MAX_N: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    s = tl.load(num_sampled_ptr + i)
    if s > 0:
        row = tl.load(rows_ptr + i).to(tl.int64)
        state = row_state_ptr + row * ROW_FIELDS
        total = tl.load(state + COL_TOKENS)
        prefill_len = tl.load(state + COL_PREFILL)
        l_start = tl.load(logits_start_ptr + i)
        fresh_start = total - s
        prefill_row = prefill_ptr + row * prefill_row_stride
        history_row = history_ptr + row * history_row_stride

        j = tl.arange(0, BLOCK_S)
        fresh = tl.load(sampled_ptr + l_start + j, mask=j < s, other=0).to(tl.int32)
        tl.store(history_row + fresh_start + j, fresh, mask=j < s)

        found_m = total * 0 - 1
        found_n = total * 0
        for n in tl.static_range(MAX_N, MIN_N - 1, -1):
            best = total * 0 - 1
            for start in range(0, total - n, BLOCK):
                m = start + tl.arange(0, BLOCK)
                valid = m < total - n
                match = valid
                for q in tl.static_range(n):
                    want = _token_at(total - n + q, total - n + q >= 0, prefill_row, history_row, sampled_ptr,
                                     prefill_len, fresh_start, l_start)
                    got = _token_at(m + q, valid, prefill_row, history_row, sampled_ptr, prefill_len, fresh_start, l_start)
                    match = match & (got == want)
                best = tl.maximum(best, tl.max(tl.where(match, m, -1), axis=0))
            take = (found_m < 0) & (best >= 0)
            found_m = tl.where(take, best, found_m)
            found_n = tl.where(take, n, found_n)

        r = tl.arange(0, BLOCK_K)
        period = tl.maximum(total - found_n - found_m, 1)
        p = tl.where(found_m >= 0, found_m + found_n + r % period, total - 1)
        drafts = _token_at(p, r < K, prefill_row, history_row, sampled_ptr, prefill_len, fresh_start, l_start)
        tl.store(proposed_ptr + row * proposed_row_stride + r, drafts, mask=r < K)


def launch_ngram_propose(
    *, rows: torch.Tensor, logits_start: torch.Tensor, num_sampled: torch.Tensor, sampled: torch.Tensor,
    row_state: torch.Tensor, prefill_tokens: torch.Tensor, history: torch.Tensor, proposed: torch.Tensor,
    num_reqs: int, min_n: int, max_n: int, num_spec_tokens: int, max_sampled: int,
) -> None:
    """Launch the propose kernel (inside the step's enqueued device work, after post-update)."""
    launch(_ngram_propose_kernel, (num_reqs,),
        rows, logits_start, num_sampled, sampled, row_state, prefill_tokens, prefill_tokens.stride(0),
        history, history.stride(0), proposed, proposed.stride(0), num_reqs,
        ROW_FIELDS=NUM_ROW_FIELDS, COL_TOKENS=NUM_TOKENS, COL_PREFILL=PREFILL_LEN,
        MIN_N=min_n, MAX_N=max_n, K=num_spec_tokens, BLOCK_K=max(2, triton.next_power_of_2(num_spec_tokens)),
        BLOCK_S=max(2, triton.next_power_of_2(max_sampled)), BLOCK=128,
    )


@triton.jit(do_not_specialize=["num_reqs"])
def _gather_drafts_kernel(rows_ptr, draft_start_ptr, staged_ptr, proposed_ptr, proposed_row_stride, out_ptr, num_reqs,
                          BLOCK_K: tl.constexpr):
    i = tl.program_id(0)
    row = tl.load(rows_ptr + i).to(tl.int64)
    d_start = tl.load(draft_start_ptr + i)
    k = tl.load(draft_start_ptr + i + 1) - d_start
    r = tl.arange(0, BLOCK_K)
    m = r < k
    staged = tl.load(staged_ptr + d_start + r, mask=m, other=0)
    proposed = tl.load(proposed_ptr + row * proposed_row_stride + r, mask=m & (staged < 0), other=0)
    tl.store(out_ptr + d_start + r, tl.where(staged < 0, proposed, staged), mask=m)


def launch_gather_drafts(*, rows: torch.Tensor, draft_start: torch.Tensor, staged_drafts: torch.Tensor, proposed: torch.Tensor,
                         out: torch.Tensor, num_reqs: int, max_drafts: int) -> None:
    """Launch the gather kernel (inside the step's enqueued device work, before input prep)."""
    launch(_gather_drafts_kernel, (num_reqs,), rows, draft_start, staged_drafts, proposed, proposed.stride(0), out, num_reqs,
                                       BLOCK_K=max(2, triton.next_power_of_2(max_drafts)))
