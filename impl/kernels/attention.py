"""Paged KV-cache write and varlen causal paged attention (Triton).

Cache layout (one layer): ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous, so a
token's K (or V) row for all kv heads lives at ``slot * num_kv_heads * head_dim`` with
``slot = block_id * block_size + offset``.

Batch layout (varlen, the flattened form the runner's input prep produces): the scheduled tokens
of request ``r`` are rows ``[query_start_loc[r], query_start_loc[r + 1])`` of ``query``; they sit at
the *last* ``query_len`` positions of a sequence of ``seq_lens[r]`` tokens, so the token at row
``query_start_loc[r] + i`` has position ``seq_lens[r] - query_len + i`` and attends to positions
``0 ..`` its own.  Prefill chunks (query_len > 1, earlier chunks already cached) and decodes
(query_len 1) mix freely in one launch.  The cache must already hold this step's K/V
(`write_kv_cache` first).

Work split: programs are ``(query block, kv head)``.  A query block is ``BLOCK_Q`` consecutive
tokens of one request times the ``num_heads // num_kv_heads`` query heads that share a kv head, so
K/V tiles are loaded once per GQA group.  The query-block grid is
``num_tokens // BLOCK_Q + num_reqs`` -- an upper bound of the number of blocks over all requests
that needs only host-known ints; each program finds its request by binary search over
``query_start_loc`` and exits if it has no tokens.  Keys are visited in tiles of ``TILE_N``
positions mapped to physical blocks through the request's block table, with an fp32 online
softmax (base 2).

Nothing here reads device data on the host: shapes and grids come from the ints passed in.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

_LOG2_E = 1.4426950408889634


class AttentionArgumentError(ValueError):
    """Tensors or host ints handed to a cache-write/attention launch that do not fit together."""


# --------------------------------------------------------------------------- kernels


@triton.jit
def _kv_cache_write_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    key_token_stride, value_token_stride,
    ROW: tl.constexpr, ROW_PAD: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    offs = tl.arange(0, ROW_PAD)
    # slot -1 marks a padding token: its row length counts as 0, so nothing is written.  (One
    # comparison rather than `& (slot >= 0)`: the interpreter turns a scalar-bool `&` into int32.)
    mask = offs < tl.where(slot >= 0, ROW, 0)
    dst = slot.to(tl.int64) * ROW + offs
    k = tl.load(key_ptr + token.to(tl.int64) * key_token_stride + offs, mask=mask)
    tl.store(k_cache_ptr + dst, k, mask=mask)
    v = tl.load(value_ptr + token.to(tl.int64) * value_token_stride + offs, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


@triton.jit
def _request_of_query_block(query_start_loc_ptr, num_reqs, query_block, BLOCK_Q: tl.constexpr):
    """The last request r with ``query_start_loc[r] // BLOCK_Q + r <= query_block``."""
    lo: tl.int32 = 0
    hi: tl.int32 = num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= query_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit(do_not_specialize=["num_reqs"])
def _paged_attention_kernel(
    out_ptr, query_ptr, k_cache_ptr, v_cache_ptr,
    block_table_ptr, query_start_loc_ptr, seq_lens_ptr,
    num_reqs, scale_log2,
    query_token_stride, query_head_stride, out_token_stride, out_head_stride,
    cache_block_stride, cache_slot_stride, cache_head_stride, block_table_row_stride,
    KV_BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    QUERIES_PER_KV: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, TILE_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    query_block = tl.program_id(0)
    kv_head = tl.program_id(1)

    req = _request_of_query_block(query_start_loc_ptr, num_reqs, query_block, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + req)
    query_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    local_block = query_block - (q_start // BLOCK_Q + req)
    if local_block * BLOCK_Q >= query_len:
        return
    context_len = tl.load(seq_lens_ptr + req) - query_len

    rows = tl.arange(0, BLOCK_M)
    q_index = local_block * BLOCK_Q + rows // QUERIES_PER_KV
    head = kv_head * QUERIES_PER_KV + rows % QUERIES_PER_KV
    row_valid = (rows // QUERIES_PER_KV < BLOCK_Q) & (q_index < query_len)
    q_pos = context_len + q_index
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_valid = dims < HEAD_DIM

    q_token = (q_start + q_index).to(tl.int64)
    q = tl.load(
        query_ptr + q_token[:, None] * query_token_stride + head[:, None] * query_head_stride + dims[None, :],
        mask=row_valid[:, None] & dim_valid[None, :], other=0.0,
    )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)

    # The last query of this block sees the most keys; earlier rows are cut by the causal mask.
    kv_end = context_len + tl.minimum(query_len, (local_block + 1) * BLOCK_Q)
    block_table_row = block_table_ptr + req.to(tl.int64) * block_table_row_stride
    head_offset = kv_head * cache_head_stride
    for tile_start in range(0, kv_end, TILE_N):
        key_pos = tile_start + tl.arange(0, TILE_N)
        key_valid = key_pos < kv_end
        block_id = tl.load(block_table_row + key_pos // KV_BLOCK_SIZE, mask=key_valid, other=0)
        slot_offset = block_id.to(tl.int64) * cache_block_stride + (key_pos % KV_BLOCK_SIZE) * cache_slot_stride + head_offset

        k = tl.load(
            k_cache_ptr + slot_offset[None, :] + dims[:, None],
            mask=dim_valid[:, None] & key_valid[None, :], other=0.0,
        )
        scores = tl.dot(q, k, input_precision=DOT_PRECISION) * scale_log2
        visible = (key_pos[None, :] <= q_pos[:, None]) & key_valid[None, :]
        scores = tl.where(visible, scores, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        # A row with nothing visible yet keeps m = -inf; shifting by 0 keeps exp2 away from NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_shift[:, None])
        alpha = tl.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, axis=1)

        v = tl.load(
            v_cache_ptr + slot_offset[:, None] + dims[None, :],
            mask=key_valid[:, None] & dim_valid[None, :], other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        out_ptr + q_token[:, None] * out_token_stride + head[:, None] * out_head_stride + dims[None, :],
        out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & dim_valid[None, :],
    )


# --------------------------------------------------------------------------- launch configuration


@dataclass(frozen=True)
class AttentionLaunch:
    """Tile sizes for one attention launch (all chosen from host-known ints)."""

    block_m: int  # query rows per program: BLOCK_Q tokens x QUERIES_PER_KV heads (padded)
    block_q: int
    tile_n: int  # key positions per inner-loop step
    head_dim_pad: int
    num_warps: int
    num_stages: int


def attention_launch(max_query_len: int, queries_per_kv: int, head_dim: int, on_gpu: bool) -> AttentionLaunch:
    """Pick tiles: small query tiles when the batch is all decodes, larger ones for prefills."""
    # tl.dot needs every dimension >= 16 on GPU.
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    rows_wanted = 64 if max_query_len * queries_per_kv > 16 else 16
    block_m = max(rows_wanted, triton.next_power_of_2(queries_per_kv))
    block_q = block_m // queries_per_kv
    if on_gpu:
        tile_n = 64 if head_dim_pad <= 128 else 32
        num_warps = 4 if block_m <= 64 else 8
        num_stages = 2
    else:
        # Interpreted: cost is per executed op, so fewer, larger tiles are cheaper.
        tile_n, num_warps, num_stages = 32, 4, 1
    return AttentionLaunch(block_m, block_q, tile_n, head_dim_pad, num_warps, num_stages)


# --------------------------------------------------------------------------- host wrappers


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise AttentionArgumentError(message)


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    _require(k_cache.dim() == 4, f"cache must be [num_blocks, block_size, kv_heads, head_dim], got {tuple(k_cache.shape)}")
    _require(k_cache.shape == v_cache.shape and k_cache.dtype == v_cache.dtype, "k and v caches differ in shape or dtype")
    _require(k_cache.is_contiguous() and v_cache.is_contiguous(), "k/v cache layer views must be contiguous")
    _require(k_cache.device == v_cache.device, "k and v caches are on different devices")


def write_kv_cache(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, num_tokens: int, *, check: bool = True,
) -> None:
    """Write rows ``[0, num_tokens)`` of key/value ``[T, kv_heads, head_dim]`` into one layer's cache.

    Token i goes to ``slot_mapping[i]``; slot -1 writes nothing.  key/value may be strided views
    (e.g. slices of a fused qkv output) as long as each token's ``[kv_heads, head_dim]`` is contiguous.
    ``check=False`` skips the argument checks (host time per launch) for a caller that validated
    the same shapes once per step.
    """
    if check:
        _check_write_args(key, value, k_cache, v_cache, slot_mapping, num_tokens)
    _, _, kv_heads, head_dim = k_cache.shape
    row = kv_heads * head_dim
    if num_tokens == 0:
        return
    _kv_cache_write_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping, key.stride(0), value.stride(0),
        ROW=row, ROW_PAD=triton.next_power_of_2(row), num_warps=4,
    )


def _check_write_args(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, num_tokens: int,
) -> None:
    _check_cache(k_cache, v_cache)
    _, _, kv_heads, head_dim = k_cache.shape
    for name, t in (("key", key), ("value", value)):
        _require(t.dim() == 3 and tuple(t.shape[1:]) == (kv_heads, head_dim), f"{name} must be [T, {kv_heads}, {head_dim}], got {tuple(t.shape)}")
        _require(t.stride(2) == 1 and t.stride(1) == head_dim, f"{name}'s per-token [kv_heads, head_dim] block must be contiguous")
        _require(t.shape[0] >= num_tokens, f"{name} has {t.shape[0]} rows < num_tokens {num_tokens}")
        _require(t.dtype == k_cache.dtype, f"{name} dtype {t.dtype} != cache dtype {k_cache.dtype}")
        _require(t.device == k_cache.device, f"{name} is on {t.device}, cache on {k_cache.device}")
    _require(slot_mapping.dtype == torch.int64 and slot_mapping.dim() == 1, "slot_mapping must be 1-D int64")
    _require(slot_mapping.shape[0] >= num_tokens, f"slot_mapping has {slot_mapping.shape[0]} entries < num_tokens {num_tokens}")
    _require(num_tokens >= 0, f"num_tokens {num_tokens} < 0")


def paged_attention(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor, *,
    num_reqs: int, num_tokens: int, max_query_len: int, scale: float, check: bool = True,
) -> None:
    """Causal attention of query rows ``[0, num_tokens)`` ``[T, heads, head_dim]`` into ``out``.

    Reads keys/values of request r through ``block_table[r]`` (int32 physical block ids);
    ``query_start_loc`` (int32, ``num_reqs + 1`` used) and ``seq_lens`` (int32) describe the batch
    (see the module docstring).  Rows not covered by any request are left untouched.
    ``check=False`` skips the argument checks, as in `write_kv_cache`.
    """
    if check:
        _check_attention_args(query, k_cache, v_cache, block_table, query_start_loc, seq_lens, out,
                              num_reqs, num_tokens, max_query_len)
    _, block_size, kv_heads, head_dim = k_cache.shape
    num_heads = query.shape[1]
    queries_per_kv = num_heads // kv_heads
    launch = attention_launch(max_query_len, queries_per_kv, head_dim, query.is_cuda)
    fp32 = query.dtype == torch.float32
    grid = (num_tokens // launch.block_q + num_reqs, kv_heads)
    _paged_attention_kernel[grid](
        out, query, k_cache, v_cache, block_table, query_start_loc, seq_lens,
        num_reqs, scale * _LOG2_E,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0),
        KV_BLOCK_SIZE=block_size, HEAD_DIM=head_dim, HEAD_DIM_PAD=launch.head_dim_pad,
        QUERIES_PER_KV=queries_per_kv, BLOCK_Q=launch.block_q, BLOCK_M=launch.block_m, TILE_N=launch.tile_n,
        # fp32 models are compared with the float64 oracle at fp32 tolerances: no tf32 rounding.
        DOT_PRECISION="ieee" if fp32 else "tf32",
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )


def _check_attention_args(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor,
    num_reqs: int, num_tokens: int, max_query_len: int,
) -> None:
    _check_cache(k_cache, v_cache)
    _, block_size, kv_heads, head_dim = k_cache.shape
    _require(query.dim() == 3 and query.shape[2] == head_dim, f"query must be [T, heads, {head_dim}], got {tuple(query.shape)}")
    num_heads = query.shape[1]
    _require(num_heads % kv_heads == 0, f"{num_heads} query heads is not a multiple of {kv_heads} kv heads")
    _require(out.shape == query.shape, f"out shape {tuple(out.shape)} != query shape {tuple(query.shape)}")
    for name, t in (("query", query), ("out", out)):
        _require(t.stride(2) == 1, f"{name}'s head_dim must be contiguous")
        _require(t.device == k_cache.device, f"{name} is on {t.device}, cache on {k_cache.device}")
    _require(query.dtype == k_cache.dtype, f"query dtype {query.dtype} != cache dtype {k_cache.dtype}")
    for name, t in (("block_table", block_table), ("query_start_loc", query_start_loc), ("seq_lens", seq_lens)):
        _require(t.dtype == torch.int32, f"{name} must be int32, got {t.dtype}")
        _require(t.device == k_cache.device, f"{name} is on {t.device}, cache on {k_cache.device}")
    _require(block_table.dim() == 2 and block_table.stride(1) == 1, "block_table must be 2-D with contiguous rows")
    _require(num_reqs >= 1 and num_tokens >= 1, f"need num_reqs >= 1 and num_tokens >= 1, got {num_reqs}, {num_tokens}")
    _require(query.shape[0] >= num_tokens, f"query has {query.shape[0]} rows < num_tokens {num_tokens}")
    _require(query_start_loc.shape[0] >= num_reqs + 1, f"query_start_loc has {query_start_loc.shape[0]} entries < num_reqs + 1")
    _require(seq_lens.shape[0] >= num_reqs and block_table.shape[0] >= num_reqs, "seq_lens/block_table have fewer rows than num_reqs")
    _require(1 <= max_query_len <= num_tokens, f"max_query_len {max_query_len} not in [1, num_tokens={num_tokens}]")


__all__ = ["AttentionArgumentError", "AttentionLaunch", "attention_launch", "write_kv_cache", "paged_attention"]
