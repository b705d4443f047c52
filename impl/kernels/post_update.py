"""The post-update kernel: advance each scheduled row's device counts after sampling.

One program per scheduled request.  A request *samples* when its scheduled tokens reach the end
of everything the device knows (``NUM_COMPUTED + n == NUM_TOKENS + k`` with k drafts); a partial
prefill chunk only advances ``NUM_COMPUTED``.  A sampling request accepts drafts while the target
token at logit row j equals draft j, keeps the first disagreeing (or bonus) target token as the
new last token, and rewinds its counts past the rejected drafts::

    accepted a;  NUM_COMPUTED = old + n - (k - a);  NUM_TOKENS = NUM_COMPUTED + 1;  LAST_TOKEN = target[a]

It also writes, for the host, ``num_sampled[i]`` (0 for a partial chunk, else ``a + 1``; the
request's output tokens are logit rows ``[logits_start[i], logits_start[i] + num_sampled[i])``)
and ``row_valid`` per logit row (1 for rows whose token became an output: what the sampler's
penalty counts take in).  A padding request (row -1, `runnercheck.impl.graph_step`) writes no row state, 0
to ``num_sampled`` and 0 to its ``row_valid`` entries.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from runnercheck.impl.kernels.launch import launch, next_power_of_2
from runnercheck.impl.state import LAST_TOKEN, NUM_COMPUTED, NUM_ROW_FIELDS, NUM_TOKENS


@triton.jit(do_not_specialize=["num_reqs"])
def _post_update_kernel(
    rows_ptr, cu_ptr, logits_start_ptr, draft_start_ptr, drafts_ptr, sampled_ptr,
    row_state_ptr, num_sampled_ptr, row_valid_ptr, num_reqs,
    ROW_FIELDS: tl.constexpr, COL_COMPUTED: tl.constexpr, COL_TOKENS: tl.constexpr, COL_LAST: tl.constexpr,
    BLOCK_LOGITS: tl.constexpr,
):
    i = tl.program_id(0)
    row = tl.load(rows_ptr + i)
    real = row >= 0  # row -1: a padding request of a bucketed step (reads row 0, writes no state)
    row = tl.maximum(row, 0)
    n = tl.load(cu_ptr + i + 1) - tl.load(cu_ptr + i)
    d_start = tl.load(draft_start_ptr + i)
    k = tl.load(draft_start_ptr + i + 1) - d_start
    l_start = tl.load(logits_start_ptr + i)
    state = row_state_ptr + row.to(tl.int64) * ROW_FIELDS
    computed = tl.load(state + COL_COMPUTED)
    known = tl.load(state + COL_TOKENS)
    samples = (computed + n >= known + k) & real

    r = tl.arange(0, BLOCK_LOGITS)
    target = tl.load(sampled_ptr + l_start + r, mask=r <= k, other=0)
    draft = tl.load(drafts_ptr + d_start + r, mask=r < k, other=0)
    rejected_at = tl.where((r < k) & (target != draft.to(target.dtype)), r, k)
    accepted = tl.min(rejected_at, axis=0)
    last = tl.sum(tl.where(r == accepted, target, 0), axis=0)

    if samples:
        new_computed = computed + n - (k - accepted)
        tl.store(state + COL_COMPUTED, new_computed)
        tl.store(state + COL_TOKENS, new_computed + 1)
        tl.store(state + COL_LAST, last.to(tl.int32))
        tl.store(num_sampled_ptr + i, accepted + 1)
    else:
        if real:
            tl.store(state + COL_COMPUTED, computed + n)
        tl.store(num_sampled_ptr + i, 0)
    valid = (r <= accepted) & samples
    tl.store(row_valid_ptr + l_start + r, valid.to(tl.int32), mask=r <= k)


def launch_post_update(
    *,
    rows: torch.Tensor, cu: torch.Tensor, logits_start: torch.Tensor, draft_start: torch.Tensor,
    drafts: torch.Tensor, sampled: torch.Tensor, row_state: torch.Tensor,
    num_sampled: torch.Tensor, row_valid: torch.Tensor, num_reqs: int, max_drafts: int,
) -> None:
    """Launch the post-update kernel (call from inside the step's enqueued device work)."""
    launch(_post_update_kernel, (num_reqs,),
        rows, cu, logits_start, draft_start, drafts, sampled, row_state, num_sampled, row_valid, num_reqs,
        ROW_FIELDS=NUM_ROW_FIELDS, COL_COMPUTED=NUM_COMPUTED, COL_TOKENS=NUM_TOKENS, COL_LAST=LAST_TOKEN,
        BLOCK_LOGITS=max(2, next_power_of_2(max_drafts + 1)),
    )
