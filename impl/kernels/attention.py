"""Paged KV-cache write (with the per-head q/k norm and RoPE fused in) and varlen causal paged
attention (Triton).

Cache layout (one layer): ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous, so a
token's K (or V) row for all kv heads lives at ``slot * num_kv_heads * head_dim`` with
``slot = block_id * block_size + offset``.

Batch layout (varlen, the flattened form the runner's input prep produces): the scheduled tokens
of request ``r`` are rows ``[query_start_loc[r], query_start_loc[r + 1])`` of ``query``; they sit at
the *last* ``query_len`` positions of a sequence of ``seq_lens[r]`` tokens, so the token at row
``query_start_loc[r] + i`` has position ``seq_lens[r] - query_len + i`` and attends to positions
``0 ..`` its own.  Prefill chunks (query_len > 1, earlier chunks already cached) and decodes
(query_len 1) mix freely in one launch.  The cache must already hold this step's K/V
(`rope_and_write_kv_cache` or `write_kv_cache` first).  Requests with an empty query (padding
requests) are skipped.

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

from runnercheck.impl.kernels.launch import launch as launch_kernel
from runnercheck.impl.kernels.tile_dot import row_exact_dot, tile_dot

_LOG2_E = 1.4426950408889634


class AttentionArgumentError(ValueError):
    """Tensors or host ints handed to a cache-write/attention launch that do not fit together."""


# --------------------------------------------------------------------------- kernels


@triton.jit
def _norm_and_rotate(x1, x2, weight_ptr, cos, sin, eps, half_offs, half_valid,
                     HEAD_DIM: tl.constexpr, QK_NORM: tl.constexpr, ROPE: tl.constexpr):
    """Per-head RMSNorm then rotate-half RoPE of heads split in halves ``x1``/``x2`` ``[heads, half]``, fp32."""
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    if QK_NORM:
        inv_rms = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / HEAD_DIM + eps)[:, None]
        w1 = tl.load(weight_ptr + half_offs, mask=half_valid, other=0.0).to(tl.float32)
        w2 = tl.load(weight_ptr + HEAD_DIM // 2 + half_offs, mask=half_valid, other=0.0).to(tl.float32)
        x1 = x1 * inv_rms * w1[None, :]
        x2 = x2 * inv_rms * w2[None, :]
    if ROPE:
        r1 = x1 * cos[None, :] - x2 * sin[None, :]
        r2 = x2 * cos[None, :] + x1 * sin[None, :]
        x1 = r1
        x2 = r2
    return x1, x2


@triton.jit
def _prepare_qkv_kernel(
    q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, positions_ptr,
    cos_ptr, sin_ptr, q_norm_ptr, k_norm_ptr, eps, max_position,
    q_token_stride, k_token_stride, v_token_stride, q_out_token_stride,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr, HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr,
    HAS_Q: tl.constexpr, QK_NORM: tl.constexpr, ROPE: tl.constexpr,
):
    # One program per token; heads are rows, each head_dim is handled as two halves so RoPE's
    # rotate-half pairs (i, i + head_dim/2) line up lane by lane.
    HALF: tl.constexpr = HEAD_DIM // 2
    token = tl.program_id(0)
    token64 = token.to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    half_offs = tl.arange(0, HALF_PAD)
    half_valid = half_offs < HALF
    if ROPE:
        # Clamped so a garbage position of a padding token cannot read outside the table.
        pos = tl.minimum(tl.maximum(tl.load(positions_ptr + token), 0), max_position - 1).to(tl.int64)
        cos = tl.load(cos_ptr + pos * HALF + half_offs, mask=half_valid, other=0.0)
        sin = tl.load(sin_ptr + pos * HALF + half_offs, mask=half_valid, other=0.0)
    else:
        cos = tl.zeros([HALF_PAD], tl.float32)
        sin = tl.zeros([HALF_PAD], tl.float32)

    kv_heads = tl.arange(0, KV_HEADS_PAD)
    kv_src = kv_heads[:, None] * HEAD_DIM + half_offs[None, :]
    kv_valid = (kv_heads[:, None] < NUM_KV_HEADS) & half_valid[None, :]
    # slot -1 marks a padding token: it counts as having no kv heads, so nothing is written.
    # (A comparison rather than `& (slot >= 0)`: the interpreter turns a scalar-bool `&` into int32.)
    kv_write = (kv_heads[:, None] < tl.where(slot >= 0, NUM_KV_HEADS, 0)) & half_valid[None, :]
    kv_dst = slot.to(tl.int64) * (NUM_KV_HEADS * HEAD_DIM) + kv_src

    k_row = k_ptr + token64 * k_token_stride + kv_src
    k1, k2 = _norm_and_rotate(tl.load(k_row, mask=kv_valid, other=0.0), tl.load(k_row + HALF, mask=kv_valid, other=0.0),
                              k_norm_ptr, cos, sin, eps, half_offs, half_valid, HEAD_DIM, QK_NORM, ROPE)
    tl.store(k_cache_ptr + kv_dst, k1.to(k_cache_ptr.dtype.element_ty), mask=kv_write)
    tl.store(k_cache_ptr + kv_dst + HALF, k2.to(k_cache_ptr.dtype.element_ty), mask=kv_write)
    v_row = v_ptr + token64 * v_token_stride + kv_src
    tl.store(v_cache_ptr + kv_dst, tl.load(v_row, mask=kv_write, other=0.0), mask=kv_write)
    tl.store(v_cache_ptr + kv_dst + HALF, tl.load(v_row + HALF, mask=kv_write, other=0.0), mask=kv_write)

    if HAS_Q:
        heads = tl.arange(0, HEADS_PAD)
        q_src = heads[:, None] * HEAD_DIM + half_offs[None, :]
        q_valid = (heads[:, None] < NUM_HEADS) & half_valid[None, :]
        q_row = q_ptr + token64 * q_token_stride + q_src
        q1, q2 = _norm_and_rotate(tl.load(q_row, mask=q_valid, other=0.0), tl.load(q_row + HALF, mask=q_valid, other=0.0),
                                  q_norm_ptr, cos, sin, eps, half_offs, half_valid, HEAD_DIM, QK_NORM, ROPE)
        q_dst = q_out_ptr + token64 * q_out_token_stride + q_src
        tl.store(q_dst, q1.to(q_out_ptr.dtype.element_ty), mask=q_valid)
        tl.store(q_dst + HALF, q2.to(q_out_ptr.dtype.element_ty), mask=q_valid)


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
    DOT_PRECISION: tl.constexpr, ROW_EXACT_DOT: tl.constexpr,
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
        scores = tile_dot(q, k, tl.zeros([BLOCK_M, TILE_N], tl.float32), DOT_PRECISION, ROW_EXACT_DOT) * scale_log2
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
        acc = acc * alpha[:, None] + tile_dot(p.to(v.dtype), v, tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32),
                                              DOT_PRECISION, ROW_EXACT_DOT)
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


# A prefill-sized query length: the tiles `attention_launch` picks for it (with no program-count
# hint) are the ones every batch-invariant launch uses, decodes included.
BATCH_INVARIANT_QUERY_LEN = 1 << 20


def attention_launch(max_query_len: int, queries_per_kv: int, head_dim: int, on_gpu: bool, num_programs_hint: int = 1 << 30) -> AttentionLaunch:
    """Pick tiles: small query tiles when the batch is all decodes, larger ones for prefills.

    ``num_programs_hint`` (requests x kv heads) lets a small decode batch take longer key tiles:
    with few programs per SM each must stream its keys faster (measured on an H200, 8 kv heads:
    8 decodes at 4K context 135 -> 90 us and 32 at 2K 99 -> 76 us with 128-key tiles, while 64
    decodes at 1K preferred 64-key tiles, 71 vs 81 us).
    """
    # tl.dot needs every dimension >= 16 on GPU.
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    rows_wanted = 64 if max_query_len * queries_per_kv > 16 else 16
    block_m = max(rows_wanted, triton.next_power_of_2(queries_per_kv))
    block_q = block_m // queries_per_kv
    if on_gpu:
        few_decodes = block_m == 16 and num_programs_hint < 512
        tile_n = 128 if few_decodes and head_dim_pad <= 128 else (64 if head_dim_pad <= 128 else 32)
        num_warps = 4 if block_m <= 64 else 8
        num_stages = 3 if few_decodes else 2
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
        _check_kv_args(key, value, k_cache, v_cache, slot_mapping, num_tokens)
    _launch_prepare(None, key, value, None, k_cache, v_cache, slot_mapping, None, None, None, None, None, 0.0, num_tokens)


def rope_and_write_kv_cache(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, q_out: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, positions: torch.Tensor,
    rope_cos: torch.Tensor, rope_sin: torch.Tensor, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
    *, eps: float, num_tokens: int, check: bool = True,
) -> None:
    """The attention input stage of one layer, in one launch: for tokens ``[0, num_tokens)``,
    per-head RMSNorm of q and k (when ``q_norm``/``k_norm`` are given), rotate-half RoPE at
    ``positions[i]`` (tables ``[max_position, head_dim/2]`` fp32), q into ``q_out`` ``[T, heads,
    head_dim]``, and k, v into the cache at ``slot_mapping[i]`` (slot -1: no cache write).
    Math in fp32; results rounded once to the output dtype.
    """
    if check:
        _check_kv_args(key, value, k_cache, v_cache, slot_mapping, num_tokens)
        _check_rope_args(query, q_out, k_cache, positions, rope_cos, rope_sin, q_norm, k_norm, num_tokens)
    _launch_prepare(query, key, value, q_out, k_cache, v_cache, slot_mapping, positions, rope_cos, rope_sin,
                    q_norm, k_norm, eps, num_tokens)


def _launch_prepare(
    query: torch.Tensor | None, key: torch.Tensor, value: torch.Tensor, q_out: torch.Tensor | None,
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, positions: torch.Tensor | None,
    rope_cos: torch.Tensor | None, rope_sin: torch.Tensor | None, q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None, eps: float, num_tokens: int,
) -> None:
    if num_tokens == 0:
        return
    _, _, kv_heads, head_dim = k_cache.shape
    has_q, rope, qk_norm = query is not None, rope_cos is not None, q_norm is not None
    num_heads = query.shape[1] if has_q else kv_heads
    # Pointers a disabled stage never dereferences still need a tensor to bind to.
    unused = key
    launch_kernel(_prepare_qkv_kernel, (num_tokens,),
        query if has_q else unused, key, value, q_out if has_q else unused, k_cache, v_cache, slot_mapping,
        positions if rope else slot_mapping, rope_cos if rope else unused, rope_sin if rope else unused,
        q_norm if qk_norm else unused, k_norm if qk_norm else unused, eps,
        rope_cos.shape[0] if rope else 1,
        query.stride(0) if has_q else 0, key.stride(0), value.stride(0), q_out.stride(0) if has_q else 0,
        NUM_HEADS=num_heads, NUM_KV_HEADS=kv_heads, HEAD_DIM=head_dim,
        HALF_PAD=triton.next_power_of_2(head_dim // 2), HEADS_PAD=triton.next_power_of_2(num_heads),
        KV_HEADS_PAD=triton.next_power_of_2(kv_heads), HAS_Q=has_q, QK_NORM=qk_norm, ROPE=rope,
        num_warps=4,
    )


def _check_kv_args(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, num_tokens: int,
) -> None:
    _check_cache(k_cache, v_cache)
    _, _, kv_heads, head_dim = k_cache.shape
    _require(head_dim % 2 == 0, f"head_dim {head_dim} must be even")
    for name, t in (("key", key), ("value", value)):
        _require(t.dim() == 3 and tuple(t.shape[1:]) == (kv_heads, head_dim), f"{name} must be [T, {kv_heads}, {head_dim}], got {tuple(t.shape)}")
        _require(t.stride(2) == 1 and t.stride(1) == head_dim, f"{name}'s per-token [kv_heads, head_dim] block must be contiguous")
        _require(t.shape[0] >= num_tokens, f"{name} has {t.shape[0]} rows < num_tokens {num_tokens}")
        _require(t.dtype == k_cache.dtype, f"{name} dtype {t.dtype} != cache dtype {k_cache.dtype}")
        _require(t.device == k_cache.device, f"{name} is on {t.device}, cache on {k_cache.device}")
    _require(slot_mapping.dtype == torch.int64 and slot_mapping.dim() == 1, "slot_mapping must be 1-D int64")
    _require(slot_mapping.device == k_cache.device, f"slot_mapping is on {slot_mapping.device}, cache on {k_cache.device}")
    _require(slot_mapping.shape[0] >= num_tokens, f"slot_mapping has {slot_mapping.shape[0]} entries < num_tokens {num_tokens}")
    _require(num_tokens >= 0, f"num_tokens {num_tokens} < 0")


def _check_rope_args(
    query: torch.Tensor, q_out: torch.Tensor, k_cache: torch.Tensor, positions: torch.Tensor,
    rope_cos: torch.Tensor, rope_sin: torch.Tensor, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
    num_tokens: int,
) -> None:
    head_dim = k_cache.shape[3]
    for name, t in (("query", query), ("q_out", q_out)):
        _require(t.dim() == 3 and t.shape[2] == head_dim, f"{name} must be [T, heads, {head_dim}], got {tuple(t.shape)}")
        _require(t.stride(2) == 1 and t.stride(1) == head_dim, f"{name}'s per-token [heads, head_dim] block must be contiguous")
        _require(t.shape[0] >= num_tokens, f"{name} has {t.shape[0]} rows < num_tokens {num_tokens}")
        _require(t.device == k_cache.device, f"{name} is on {t.device}, cache on {k_cache.device}")
    _require(query.shape[1] == q_out.shape[1], f"query has {query.shape[1]} heads, q_out {q_out.shape[1]}")
    _require(query.shape[1] % k_cache.shape[2] == 0, f"{query.shape[1]} query heads is not a multiple of {k_cache.shape[2]} kv heads")
    _require(positions.dtype == torch.int64 and positions.dim() == 1 and positions.shape[0] >= num_tokens,
             "positions must be 1-D int64 with at least num_tokens entries")
    for name, t in (("rope_cos", rope_cos), ("rope_sin", rope_sin)):
        _require(t.dtype == torch.float32 and t.dim() == 2 and t.shape[1] == head_dim // 2 and t.is_contiguous(),
                 f"{name} must be a contiguous fp32 [max_position, {head_dim // 2}] table")
    _require((q_norm is None) == (k_norm is None), "give both q_norm and k_norm, or neither")
    for name, t in (("q_norm", q_norm), ("k_norm", k_norm)):
        _require(t is None or (t.shape == (head_dim,) and t.is_contiguous()), f"{name} must be a contiguous [{head_dim}] vector")
    for t in (positions, rope_cos, rope_sin, q_norm, k_norm):
        _require(t is None or t.device == k_cache.device, "rope/norm inputs must be on the cache's device")


def paged_attention(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor, *,
    num_reqs: int, num_tokens: int, max_query_len: int, scale: float, check: bool = True,
    batch_invariant: bool = False,
) -> None:
    """Causal attention of query rows ``[0, num_tokens)`` ``[T, heads, head_dim]`` into ``out``.

    Reads keys/values of request r through ``block_table[r]`` (int32 physical block ids);
    ``query_start_loc`` (int32, ``num_reqs + 1`` used) and ``seq_lens`` (int32) describe the batch
    (see the module docstring).  Rows not covered by any request are left untouched.
    ``check=False`` skips the argument checks, as in `write_kv_cache`.  ``batch_invariant`` fixes
    the tiles (`BATCH_INVARIANT_QUERY_LEN`): the key tile, and with it the order in which a query's
    online softmax accumulates, no longer follows the batch's longest query or its request count.
    """
    if check:
        _check_attention_args(query, k_cache, v_cache, block_table, query_start_loc, seq_lens, out,
                              num_reqs, num_tokens, max_query_len)
    _, block_size, kv_heads, head_dim = k_cache.shape
    num_heads = query.shape[1]
    queries_per_kv = num_heads // kv_heads
    if batch_invariant:
        launch = attention_launch(BATCH_INVARIANT_QUERY_LEN, queries_per_kv, head_dim, query.is_cuda)
    else:
        launch = attention_launch(max_query_len, queries_per_kv, head_dim, query.is_cuda, num_reqs * kv_heads)
    fp32 = query.dtype == torch.float32
    grid = (num_tokens // launch.block_q + num_reqs, kv_heads)
    launch_kernel(_paged_attention_kernel, grid,
        out, query, k_cache, v_cache, block_table, query_start_loc, seq_lens,
        num_reqs, scale * _LOG2_E,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0),
        KV_BLOCK_SIZE=block_size, HEAD_DIM=head_dim, HEAD_DIM_PAD=launch.head_dim_pad,
        QUERIES_PER_KV=queries_per_kv, BLOCK_Q=launch.block_q, BLOCK_M=launch.block_m, TILE_N=launch.tile_n,
        # fp32 models are compared with the float64 oracle at fp32 tolerances: no tf32 rounding.
        DOT_PRECISION="ieee" if fp32 else "tf32", ROW_EXACT_DOT=row_exact_dot(),
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


__all__ = [
    "AttentionArgumentError", "AttentionLaunch", "attention_launch", "write_kv_cache", "rope_and_write_kv_cache",
    "paged_attention",
]
