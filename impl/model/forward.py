"""The built-in decoder's forward over a paged KV cache (Llama / Qwen2 / Qwen3 style).

Math (the same conventions as the float64 oracle): RMSNorm ``x * rsqrt(mean(x^2) + eps) * w``;
q/k/v projections with optional bias; optional per-head RMSNorm of q and k before RoPE; RoPE
"rotate half" over the full head_dim with ``inv_freq = theta^(-2i/head_dim)`` at each token's
position; GQA causal attention with scale ``head_dim^-0.5`` (`runnercheck.impl.kernels.attention`); o_proj;
residual; RMSNorm; SwiGLU ``down(silu(gate(x)) * up(x))``; residual; final norm; lm_head.
Weights are ``[out, in]`` applied as ``x @ W.T``.

The forward is pure device work, meant to run inside a `Device.enqueue` closure (and under CUDA
graph capture): it never reads a device tensor on the host; every shape and grid comes from the
host ints passed in, which are checked before any cache write so a bad call changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runnercheck.impl.device import Device
from runnercheck.impl.kernels import batch_invariant as bi
from runnercheck.impl.kernels.attention import paged_attention, rope_and_write_kv_cache
from runnercheck.impl.model.weights import ModelConfig, ModelWeights

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class ForwardInputError(ValueError):
    """A decoder/cache construction or forward call whose arguments do not fit (nothing was written)."""


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ForwardInputError(message)


class PagedKVCache:
    """The paged K and V caches of every layer.

    Ownership: ``k`` and ``v`` (``[num_layers, num_blocks, block_size, num_kv_heads, head_dim]``)
    are owned by this object, live on the device, are allocated once (zeroed, registered with the
    `Device`) and live as long as the runner; the only writer is the cache-write kernel launched
    by `PagedDecoder.forward`.  Which blocks belong to which request is the scheduler's business
    (block tables); this object knows nothing about requests.  ``layer_k``/``layer_v`` are views
    of ``k``/``v`` (one contiguous ``[num_blocks, block_size, num_kv_heads, head_dim]`` per
    layer), made once so the forward does not re-slice every step.
    """

    def __init__(self, config: ModelConfig, device: Device, num_blocks: int, block_size: int, dtype: torch.dtype):
        _require(isinstance(num_blocks, int) and num_blocks > 0, f"num_blocks must be a positive int, got {num_blocks!r}")
        _require(isinstance(block_size, int) and block_size > 0, f"block_size must be a positive int, got {block_size!r}")
        _require(dtype in SUPPORTED_DTYPES, f"KV cache dtype {dtype} not in {SUPPORTED_DTYPES}")
        self.config = config
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        shape = (config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim)
        self.k = device.zeros(shape, dtype)
        self.v = device.zeros(shape, dtype)
        self.layer_k = [self.k[i] for i in range(config.num_layers)]
        self.layer_v = [self.v[i] for i in range(config.num_layers)]

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size


@dataclass
class _DeviceLayer:
    """One layer's device weights.  q/k/v and gate/up are fused so each is one matmul launch."""

    input_norm: torch.Tensor  # [hidden]
    qkv_weight: torch.Tensor  # [(heads + 2 kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # [head_dim]
    k_norm: torch.Tensor | None  # [head_dim]
    o_proj: torch.Tensor  # [hidden, heads * head_dim]
    post_attn_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [2 * intermediate, hidden]: gate rows first, then up rows
    down_proj: torch.Tensor  # [hidden, intermediate]


class PagedDecoder:
    """The runner's built-in decoder: weights, RoPE tables and the paged KV cache on one device.

    Ownership: every tensor here is owned by this object, lives on the device, is made once at
    construction and lives as long as the runner.  Weights (``embed``, ``layers``, ``lm_head``, all
    in the model dtype; q/k/v and gate/up fused into one matrix each) and the RoPE tables
    (``rope_cos``/``rope_sin``, fp32 ``[max_model_len, head_dim / 2]``, angles computed in
    float64) are written only at construction.  ``kv_cache`` is a `PagedKVCache` written only by
    `forward`'s cache-write kernel.  The input tensors of `forward` belong to the caller (the
    input batch) and are only read; activations are per-call temporaries.

    Precision: matmuls in the model dtype with fp32 accumulation; RMSNorm statistics, q/k norm and
    RoPE in fp32; attention softmax in fp32; logits returned as fp32.

    ``batch_invariant=True``: every matmul and RMSNorm runs through `runnercheck.impl.kernels.batch_invariant`
    (fixed tiles, one reduction order per row) and attention with fixed tiles, so a token's logits do
    not depend on which other tokens share the step (docs/INVARIANCE.md).  Off by default: the
    library kernels are faster.  `_rms_norm` is the one place a norm is computed (a mutant of
    `runnercheck.stress.mutants.batch` replaces it per instance).
    """

    def __init__(self, weights: ModelWeights, device: Device, *, dtype: torch.dtype, num_kv_blocks: int, block_size: int,
                 batch_invariant: bool = False):
        _require(dtype in SUPPORTED_DTYPES, f"model dtype {dtype} not in {SUPPORTED_DTYPES}")
        config = weights.config
        self.config = config
        self.device = device
        self.dtype = dtype
        self.eps = config.rms_norm_eps
        self.batch_invariant = bool(batch_invariant)
        self.scale = config.head_dim ** -0.5

        def put(t: torch.Tensor) -> torch.Tensor:
            return device.to_device(t.detach().to(dtype).contiguous())

        self.layers: list[_DeviceLayer] = []
        for lw in weights.layers:
            qkv_bias = None
            if config.qkv_bias:
                qkv_bias = put(torch.cat((lw.q_bias, lw.k_bias, lw.v_bias)))
            self.layers.append(_DeviceLayer(
                input_norm=put(lw.input_norm),
                qkv_weight=put(torch.cat((lw.q_proj, lw.k_proj, lw.v_proj), dim=0)),
                qkv_bias=qkv_bias,
                q_norm=put(lw.q_norm) if config.qk_norm else None,
                k_norm=put(lw.k_norm) if config.qk_norm else None,
                o_proj=put(lw.o_proj),
                post_attn_norm=put(lw.post_attn_norm),
                gate_up=put(torch.cat((lw.gate_proj, lw.up_proj), dim=0)),
                down_proj=put(lw.down_proj),
            ))
        self.embed = put(weights.embed)
        self.lm_head = self.embed if config.tie_word_embeddings else put(weights.lm_head)
        self.final_norm = put(weights.final_norm)

        half = config.head_dim // 2
        inv_freq = config.rope_theta ** (-torch.arange(half, dtype=torch.float64) * 2.0 / config.head_dim)
        angles = torch.arange(config.max_model_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.rope_cos = device.to_device(torch.cos(angles).to(torch.float32))
        self.rope_sin = device.to_device(torch.sin(angles).to(torch.float32))

        self.kv_cache = PagedKVCache(config, device, num_kv_blocks, block_size, dtype)
        self._qkv_split = (config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim,
                           config.num_kv_heads * config.head_dim)

    # ------------------------------------------------------------------ validation

    def _check_forward_args(
        self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
        query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
        logits_indices: torch.Tensor, num_reqs: int, num_tokens: int, max_query_len: int, max_seq_len: int,
    ) -> None:
        where = self.device.torch_device
        named = (
            ("input_ids", input_ids, torch.int64, 1), ("positions", positions, torch.int64, 1),
            ("slot_mapping", slot_mapping, torch.int64, 1), ("query_start_loc", query_start_loc, torch.int32, 1),
            ("seq_lens", seq_lens, torch.int32, 1), ("block_table", block_table, torch.int32, 2),
            ("logits_indices", logits_indices, torch.int64, 1),
        )
        for name, t, dtype, dims in named:
            _require(isinstance(t, torch.Tensor), f"{name} must be a tensor, got {type(t).__name__}")
            _require(t.dtype == dtype and t.dim() == dims, f"{name} must be {dims}-D {dtype}, got {t.dim()}-D {t.dtype}")
            _require(t.device == where, f"{name} is on {t.device}, the decoder on {where}")
        for name, v in (("num_reqs", num_reqs), ("num_tokens", num_tokens), ("max_query_len", max_query_len), ("max_seq_len", max_seq_len)):
            _require(isinstance(v, int) and not isinstance(v, bool) and v >= 1, f"{name} must be an int >= 1, got {v!r}")
        for name, t in (("input_ids", input_ids), ("positions", positions), ("slot_mapping", slot_mapping)):
            _require(t.shape[0] >= num_tokens, f"{name} has {t.shape[0]} entries < num_tokens {num_tokens}")
        _require(query_start_loc.shape[0] >= num_reqs + 1, f"query_start_loc has {query_start_loc.shape[0]} entries < num_reqs + 1 = {num_reqs + 1}")
        _require(seq_lens.shape[0] >= num_reqs, f"seq_lens has {seq_lens.shape[0]} entries < num_reqs {num_reqs}")
        _require(block_table.shape[0] >= num_reqs, f"block_table has {block_table.shape[0]} rows < num_reqs {num_reqs}")
        _require(block_table.stride(1) == 1, "block_table rows must be contiguous")
        _require(max_query_len <= num_tokens, f"max_query_len {max_query_len} > num_tokens {num_tokens}")
        _require(max_query_len <= max_seq_len, f"max_query_len {max_query_len} > max_seq_len {max_seq_len}")
        _require(max_seq_len <= self.config.max_model_len, f"max_seq_len {max_seq_len} > max_model_len {self.config.max_model_len}")
        capacity = block_table.shape[1] * self.kv_cache.block_size
        _require(max_seq_len <= capacity, f"max_seq_len {max_seq_len} > block table capacity {capacity} "
                 f"({block_table.shape[1]} blocks of {self.kv_cache.block_size})")
        _require(logits_indices.shape[0] >= 1, "logits_indices is empty")

    # ------------------------------------------------------------------ forward

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
        query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
        logits_indices: torch.Tensor, *, num_reqs: int, num_tokens: int, max_query_len: int, max_seq_len: int,
        return_hidden: bool = False,
    ) -> torch.Tensor:
        """Run one step and return float32 logits ``[len(logits_indices), vocab]``.

        With ``return_hidden`` it returns the final-normed hidden states ``[len(logits_indices),
        hidden]`` instead; `compute_logits` turns any slice of them into logits, so a caller can
        bound peak memory by taking logits a chunk of rows at a time (prompt logprobs).

        Uses the first ``num_tokens`` entries of input_ids/positions/slot_mapping and the first
        ``num_reqs`` requests of query_start_loc/seq_lens/block_table (see the attention module
        for their meaning).  Writes this step's K/V into the cache (slot -1: nothing) before the
        attention of each layer.  Hidden states of tokens outside every request are unspecified,
        so logits_indices must point at request tokens.
        """
        self._check_forward_args(input_ids, positions, slot_mapping, query_start_loc, seq_lens, block_table,
                                 logits_indices, num_reqs, num_tokens, max_query_len, max_seq_len)
        c = self.config
        T = num_tokens
        # Few, large launches: host time per step is dominated by launch count (RMSNorm is one
        # torch op with fp32 statistics, the residual adds ride in addmm, q/k norm + RoPE + cache
        # write are one kernel).
        invariant = self.batch_invariant
        linear = bi.linear if invariant else F.linear
        x = F.embedding(input_ids[:T], self.embed)
        for layer, k_cache, v_cache in zip(self.layers, self.kv_cache.layer_k, self.kv_cache.layer_v):
            h = self._rms_norm(x, layer.input_norm)
            q, k, v = linear(h, layer.qkv_weight, layer.qkv_bias).split(self._qkv_split, dim=-1)
            q_rotated = torch.empty((T, c.num_heads, c.head_dim), dtype=self.dtype, device=x.device)
            rope_and_write_kv_cache(
                q.view(T, c.num_heads, c.head_dim), k.view(T, c.num_kv_heads, c.head_dim),
                v.view(T, c.num_kv_heads, c.head_dim), q_rotated, k_cache, v_cache, slot_mapping, positions,
                self.rope_cos, self.rope_sin, layer.q_norm, layer.k_norm, eps=self.eps, num_tokens=T, check=False,
            )
            attn = torch.empty_like(q_rotated)
            paged_attention(q_rotated, k_cache, v_cache, block_table, query_start_loc, seq_lens, attn,
                            num_reqs=num_reqs, num_tokens=T, max_query_len=max_query_len, scale=self.scale, check=False,
                            batch_invariant=invariant)
            if invariant:
                x = bi.linear(attn.view(T, c.num_heads * c.head_dim), layer.o_proj, residual=x)
            else:
                x = torch.addmm(x, attn.view(T, c.num_heads * c.head_dim), layer.o_proj.t())
            h = self._rms_norm(x, layer.post_attn_norm)
            gate, up = linear(h, layer.gate_up).chunk(2, dim=-1)
            if invariant:
                x = bi.linear((F.silu(gate) * up).contiguous(), layer.down_proj, residual=x)
            else:
                x = torch.addmm(x, F.silu(gate) * up, layer.down_proj.t())

        h = self._rms_norm(x.index_select(0, logits_indices), self.final_norm)
        return h if return_hidden else self.compute_logits(h)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm over the hidden dim (fp32 statistics); one program per row when batch-invariant."""
        if self.batch_invariant:
            return bi.rms_norm(x, weight, self.eps)
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[rows, vocab]`` of final-normed hidden states (from ``return_hidden``)."""
        if self.batch_invariant:
            return bi.linear(hidden_states.contiguous(), self.lm_head).float()
        return F.linear(hidden_states, self.lm_head).float()


__all__ = ["PagedKVCache", "PagedDecoder", "ForwardInputError", "SUPPORTED_DTYPES"]
