"""The input-prep kernel: one step's model inputs gathered on the device from stable row state.

One program per scheduled request (batch position ``i``, state row ``rows[i]``) reads the row's
device-resident counts (``NUM_COMPUTED``, ``NUM_TOKENS``, ``PREFILL_LEN``, ``LAST_TOKEN``) and
writes, for its tokens ``[query_start_loc[i], query_start_loc[i + 1])``:

* ``input_ids``: a position below ``PREFILL_LEN`` reads the pinned prefill tokens (over UVA on
  CUDA); position ``NUM_TOKENS - 1`` past the prefill is the last sampled token; positions from
  ``NUM_TOKENS`` on are this step's drafts;
* ``positions`` (``NUM_COMPUTED + j``), ``slot_mapping`` (through the row's block table),
  ``seq_lens[i]`` (context length after the step), ``idx_mapping[i]``, ``query_start_loc``;
* the gathered block-table row ``block_table_out[i]`` (the blocks covering the context);
* its logit rows ``[logits_start[i], logits_start[i] + 1 + k)``: the token index of the last
  ``1 + k`` scheduled tokens, the state row, the noise position (the index of the token the
  row produces, i.e. input position + 1), and the draft prefix (row j: drafts ``d_1..d_j``,
  -1 padded; the sampler counts them as outputs for penalties).

Padding requests (bucketed steps, `runnercheck.impl.graph_step`): a ``rows`` entry of -1 marks a request that
only fills the bucket.  It computes ``query_len`` tokens of id 0 at positions ``0..`` with slot -1
(no KV write), gathers the dummy row's blocks (attention reads them; the result is discarded),
and its logit rows read the sampling parameters of `PADDING_STATE_ROW` with an empty draft
prefix.  Nothing of it is written to row state, KV cache or a live request's output.

One extra *tail* program pads tokens ``[cu[num_reqs], padded_num_tokens)`` (slot -1) and copies the
host-computed prompt-logprob token indices after the sampling rows.  The host uploads only the
compact per-step arrays (rows, query_start_loc, logits_start, draft_start, drafts, prompt
indices); everything else comes from device state, so nothing is rebuilt per token on the host.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from runnercheck.impl.kernels.launch import launch, next_power_of_2
from runnercheck.impl.state import LAST_TOKEN, NUM_COMPUTED, NUM_ROW_FIELDS, NUM_TOKENS, PREFILL_LEN

# The state row a padding request's logit rows read their sampling parameters from (read only;
# their samples are never copied out and their penalty counts are never taken in).
PADDING_STATE_ROW: tl.constexpr = tl.constexpr(0)
PADDING_ROW = -1  # the ``rows`` entry that marks a padding request of a bucketed step


@triton.jit(do_not_specialize=["num_reqs", "padded_num_tokens", "num_sampling_rows", "num_prompt_rows"])
def _prepare_inputs_kernel(
    rows_ptr, cu_ptr, logits_start_ptr, draft_start_ptr, drafts_ptr, prompt_token_index_ptr,
    row_state_ptr, prefill_ptr, prefill_row_stride, block_table_ptr, block_table_row_stride,
    input_ids_ptr, positions_ptr, slot_mapping_ptr, query_start_loc_ptr, seq_lens_ptr, idx_mapping_ptr,
    block_table_out_ptr, block_table_out_row_stride,
    logits_indices_ptr, logits_rows_ptr, logits_positions_ptr, draft_prefix_ptr, draft_prefix_row_stride,
    num_reqs, padded_num_tokens, num_sampling_rows, num_prompt_rows,
    ROW_FIELDS: tl.constexpr, COL_COMPUTED: tl.constexpr, COL_TOKENS: tl.constexpr,
    COL_PREFILL: tl.constexpr, COL_LAST: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr, BLOCK: tl.constexpr, BLOCK_LOGITS: tl.constexpr,
    MAX_DRAFTS: tl.constexpr, BLOCK_DRAFTS: tl.constexpr,
):
    i = tl.program_id(0)
    if i == num_reqs:
        # The tail program: padding tokens write nothing to the KV cache (slot -1).  They start where
        # the requests' tokens end, read on the device (a mixed graph's host does not know it).
        for start in range(tl.load(cu_ptr + num_reqs), padded_num_tokens, BLOCK):
            t = start + tl.arange(0, BLOCK)
            m = t < padded_num_tokens
            tl.store(input_ids_ptr + t, tl.zeros([BLOCK], tl.int64), mask=m)
            tl.store(positions_ptr + t, tl.zeros([BLOCK], tl.int64), mask=m)
            tl.store(slot_mapping_ptr + t, tl.full([BLOCK], -1, tl.int64), mask=m)
        for start in range(0, num_prompt_rows, BLOCK):
            p = start + tl.arange(0, BLOCK)
            m = p < num_prompt_rows
            token_index = tl.load(prompt_token_index_ptr + p, mask=m)
            tl.store(logits_indices_ptr + num_sampling_rows + p, token_index.to(tl.int64), mask=m)
        return

    row = tl.load(rows_ptr + i)
    q_start = tl.load(cu_ptr + i)
    q_end = tl.load(cu_ptr + i + 1)
    n = q_end - q_start
    d_start = tl.load(draft_start_ptr + i)
    k = tl.load(draft_start_ptr + i + 1) - d_start
    # A padding request (row -1, bucketed steps) reads the dummy row PADDING_STATE_ROW only to keep
    # every pointer in bounds; what it reads is replaced below, and it writes no state and no KV.
    real = row >= 0
    read_row = tl.where(real, row, PADDING_STATE_ROW)
    state = row_state_ptr + read_row.to(tl.int64) * ROW_FIELDS
    computed = tl.where(real, tl.load(state + COL_COMPUTED), 0)
    known = tl.where(real, tl.load(state + COL_TOKENS), n)  # padding: no prefill, no drafts, token 0
    prefill_len = tl.where(real, tl.load(state + COL_PREFILL), 0)
    last_token = tl.where(real, tl.load(state + COL_LAST), 0)
    prefill_row = prefill_ptr + read_row.to(tl.int64) * prefill_row_stride
    table_row = block_table_ptr + read_row.to(tl.int64) * block_table_row_stride

    for start in range(0, n, BLOCK):
        j = start + tl.arange(0, BLOCK)
        m = j < n
        pos = computed + j
        from_prefill = pos < prefill_len
        from_draft = pos >= known
        prefill_tok = tl.load(prefill_row + pos, mask=m & from_prefill, other=0)
        draft_tok = tl.load(drafts_ptr + d_start + (pos - known), mask=m & from_draft, other=0)
        tok = tl.where(from_prefill, prefill_tok, tl.where(from_draft, draft_tok, last_token))
        block_id = tl.load(table_row + pos // KV_BLOCK_SIZE, mask=m, other=0)
        # Padding tokens get slot -1: their K/V write is dropped (the scratch slot of padding).
        slot = tl.where(real, block_id.to(tl.int64) * KV_BLOCK_SIZE + (pos % KV_BLOCK_SIZE), -1)
        t = q_start + j
        tl.store(input_ids_ptr + t, tok.to(tl.int64), mask=m)
        tl.store(positions_ptr + t, pos.to(tl.int64), mask=m)
        tl.store(slot_mapping_ptr + t, slot, mask=m)

    seq_len = computed + n
    tl.store(seq_lens_ptr + i, seq_len)
    tl.store(idx_mapping_ptr + i, row)
    tl.store(query_start_loc_ptr + i + 1, q_end)
    if i == 0:
        tl.store(query_start_loc_ptr, q_start)

    num_context_blocks = (seq_len + KV_BLOCK_SIZE - 1) // KV_BLOCK_SIZE
    out_row = block_table_out_ptr + i.to(tl.int64) * block_table_out_row_stride
    for start in range(0, num_context_blocks, BLOCK):
        b = start + tl.arange(0, BLOCK)
        m = b < num_context_blocks
        tl.store(out_row + b, tl.load(table_row + b, mask=m), mask=m)

    # Logit rows: the last 1 + k scheduled tokens (the last known token and the k drafts).
    r = tl.arange(0, BLOCK_LOGITS)
    m = r <= k
    l_start = tl.load(logits_start_ptr + i)
    # (A padding request of a mixed step that has no real request before it -- a capture's warm-up --
    # would point at token -1: clamped, its row is discarded anyway.)
    tl.store(logits_indices_ptr + l_start + r, tl.maximum(q_end - 1 - k + r, 0).to(tl.int64), mask=m)
    tl.store(logits_rows_ptr + l_start + r, read_row + r * 0, mask=m)
    tl.store(logits_positions_ptr + l_start + r, (seq_len - k + r).to(tl.int64), mask=m)
    if MAX_DRAFTS > 0:
        # Row r's penalties count drafts d_1..d_r as outputs: its prefix, padded with -1.
        c = tl.arange(0, BLOCK_DRAFTS)
        in_prefix = (c[None, :] < r[:, None]) & (r <= tl.where(real, k, -1))[:, None]
        prefix = tl.load(drafts_ptr + d_start + c[None, :] + r[:, None] * 0, mask=in_prefix, other=-1)
        dst = draft_prefix_ptr + (l_start + r[:, None]).to(tl.int64) * draft_prefix_row_stride + c[None, :]
        tl.store(dst, tl.where(in_prefix, prefix, -1), mask=m[:, None] & (c[None, :] < MAX_DRAFTS))


def launch_prepare_inputs(
    *,
    rows: torch.Tensor, cu: torch.Tensor, logits_start: torch.Tensor, draft_start: torch.Tensor,
    drafts: torch.Tensor, prompt_token_index: torch.Tensor,
    row_state: torch.Tensor, prefill_tokens: torch.Tensor, block_table: torch.Tensor,
    input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, idx_mapping: torch.Tensor,
    block_table_out: torch.Tensor, logits_indices: torch.Tensor, logits_rows: torch.Tensor,
    logits_positions: torch.Tensor, draft_prefix: torch.Tensor,
    num_reqs: int, num_tokens: int, padded_num_tokens: int, num_sampling_rows: int, num_prompt_rows: int,
    kv_block_size: int, max_drafts: int,
) -> None:
    """Launch the input-prep kernel (call from inside the step's enqueued device work).

    ``num_tokens``: the requests' tokens, or a lower bound of them (a mixed graph, `runnercheck.impl.graph_step`:
    0); the tail program pads from ``cu[num_reqs]`` (device) to ``padded_num_tokens``.
    """
    needs_tail = padded_num_tokens > num_tokens or num_prompt_rows > 0
    grid = (num_reqs + (1 if needs_tail else 0),)
    launch(_prepare_inputs_kernel, grid,
        rows, cu, logits_start, draft_start, drafts, prompt_token_index,
        row_state, prefill_tokens, prefill_tokens.stride(0), block_table, block_table.stride(0),
        input_ids, positions, slot_mapping, query_start_loc, seq_lens, idx_mapping,
        block_table_out, block_table_out.stride(0),
        logits_indices, logits_rows, logits_positions, draft_prefix, draft_prefix.stride(0),
        num_reqs, padded_num_tokens, num_sampling_rows, num_prompt_rows,
        ROW_FIELDS=NUM_ROW_FIELDS, COL_COMPUTED=NUM_COMPUTED, COL_TOKENS=NUM_TOKENS,
        COL_PREFILL=PREFILL_LEN, COL_LAST=LAST_TOKEN,
        KV_BLOCK_SIZE=kv_block_size, BLOCK=128, BLOCK_LOGITS=max(2, next_power_of_2(max_drafts + 1)),
        MAX_DRAFTS=max_drafts, BLOCK_DRAFTS=max(2, next_power_of_2(max_drafts)),
    )


# The header a bucketed step's staging starts with (int32 words): the step's counts, which the
# in-graph launches read from device memory, so one capture serves every batch of its bucket.
HEADER_NUM_REQS = 0  # real requests of the step (rows past it are padding)
HEADER_NUM_DRAFTS = 1  # drafts staged for them
HEADER_NUM_DIFFS = 2  # staged-write diffs the in-graph apply copies (0: none, or applied eagerly)
HEADER_DIFF_TABLE = 3  # word offset of the diff table in the step buffer (values follow it)
HEADER_NUM_RESETS = 4  # rows admitted this step whose penalty counts the graph zeroes (0: none, or zeroed eagerly)
HEADER_RESET_ROWS = 5  # word offset of those rows in the step buffer
HEADER_WORDS = 6


@triton.jit(do_not_specialize=["size", "max_drafts_total"])
def _pad_step_inputs_kernel(header_ptr, rows_ptr, drafts_ptr, cu_ptr, padded_rows_ptr, padded_drafts_ptr, padded_cu_ptr,
                            size, max_drafts_total, BLOCK: tl.constexpr, PAD_CU: tl.constexpr):
    # Loop bounds are the bucket's (fixed at capture); the step's counts come from the header.
    num_reqs = tl.load(header_ptr + 0)  # HEADER_NUM_REQS
    num_drafts = tl.load(header_ptr + 1)  # HEADER_NUM_DRAFTS
    for start in range(0, size, BLOCK):
        i = start + tl.arange(0, BLOCK)
        m = i < size
        real = i < num_reqs
        row = tl.load(rows_ptr + i, mask=m & real, other=-1)
        tl.store(padded_rows_ptr + i, tl.where(real, row, -1), mask=m)
    for start in range(0, max_drafts_total, BLOCK):
        j = start + tl.arange(0, BLOCK)
        m = (j < num_drafts) & (j < max_drafts_total)
        tl.store(padded_drafts_ptr + j, tl.load(drafts_ptr + j, mask=m), mask=m)
    if PAD_CU:
        # A mixed step: padding requests [num_reqs, size) are empty, so their query starts repeat its token count.
        for start in range(0, size + 1, BLOCK):
            i = start + tl.arange(0, BLOCK)
            m = i <= size
            tl.store(padded_cu_ptr + i, tl.load(cu_ptr + tl.minimum(i, num_reqs), mask=m), mask=m)


def launch_pad_step_inputs(*, header: torch.Tensor, rows: torch.Tensor, drafts: torch.Tensor, padded_rows: torch.Tensor,
                           padded_drafts: torch.Tensor, size: int, max_drafts_total: int,
                           cu: torch.Tensor | None = None, padded_cu: torch.Tensor | None = None) -> None:
    """Copy a bucketed step's rows and drafts into the persistent padded inputs; rows ``[num_reqs, size)`` get -1.

    One launch (call inside enqueued device work, or inside a graph capture): ``num_reqs`` and the
    number of drafts are read from ``header`` (`HEADER_NUM_REQS`, `HEADER_NUM_DRAFTS`) on the
    device; ``size`` is the bucket and ``max_drafts_total`` the most drafts a batch of it stages.
    With ``cu``/``padded_cu`` (a mixed step's query starts, ``size + 1`` entries written) the
    padding requests get empty queries: ``padded_cu[i] = cu[min(i, num_reqs)]``.
    """
    pad_cu = cu is not None
    launch(_pad_step_inputs_kernel, (1,), header, rows, drafts, cu if pad_cu else rows, padded_rows, padded_drafts,
           padded_cu if pad_cu else padded_rows, size, max_drafts_total, BLOCK=256, PAD_CU=pad_cu)
