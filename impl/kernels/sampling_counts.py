"""Kernels that maintain the per-row output-token counts used by the penalties.

* `zero_count_rows_kernel`: clears whole rows (an admitted request's row), without uploading
  ``vocab_size`` zeros per row.
* `add_token_counts_kernel`: ``counts[row, token] += 1`` per (row, token) pair, with atomics
  because one step may add the same token to one row more than once (accepted drafts, or a
  resumed request's earlier outputs).  Pairs whose token lies outside the vocabulary, or whose
  ``valid`` entry is 0, add nothing.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def zero_count_rows_kernel(counts_ptr, counts_stride, rows_ptr, vocab_size, BLOCK: tl.constexpr):
    row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    tl.store(counts_ptr + row * counts_stride + offs, tl.zeros((BLOCK,), tl.int32), mask=offs < vocab_size)


@triton.jit
def zero_count_rows_from_header_kernel(counts_ptr, counts_stride, step_words_ptr, header_ptr, vocab_size,
                                       BLOCK: tl.constexpr):
    # A fixed grid over the vocabulary (one capture serves every step); the rows come from the step's header.
    num_rows = tl.load(header_ptr)
    first = tl.load(header_ptr + 1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    for i in range(num_rows):
        row = tl.load(step_words_ptr + first + i).to(tl.int64)
        tl.store(counts_ptr + row * counts_stride + offs, tl.zeros((BLOCK,), tl.int32), mask=offs < vocab_size)


@triton.jit
def add_token_counts_kernel(counts_ptr, counts_stride, rows_ptr, tokens_ptr, valid_ptr, num_pairs, vocab_size,
                            HAS_VALID: tl.constexpr, BLOCK: tl.constexpr):
    pair = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = pair < num_pairs
    rows = tl.load(rows_ptr + pair, mask=in_range, other=0).to(tl.int64)
    tokens = tl.load(tokens_ptr + pair, mask=in_range, other=-1).to(tl.int64)
    use = in_range & (tokens >= 0) & (tokens < vocab_size)
    if HAS_VALID:
        use = use & (tl.load(valid_ptr + pair, mask=in_range, other=0) != 0)
    tl.atomic_add(counts_ptr + rows * counts_stride + tokens, tl.full((BLOCK,), 1, tl.int32), mask=use)
