"""The oracle's model: the built-in decoder recomputed from scratch in float64 on CPU.

`ReferenceModel.logits(token_ids)` returns the logits of every position of one sequence, computed
with no KV cache, no paging and no batching.  The runner's paged model (`impl/model/forward.py`)
must agree with it up to floating-point rounding; the exact conventions, in order, are:

* **Embedding** ``x = embed[token_ids]`` (``[L, hidden]``).
* **Per layer** (``W`` matrices are ``[out, in]`` and applied as ``x @ W.T``):

  1. ``h = rms_norm(x, input_norm)`` with ``rms_norm(x, w) = x * rsqrt(mean(x^2, last dim) + eps) * w``
     and ``eps = config.rms_norm_eps``.
  2. ``q = h @ q_proj.T (+ q_bias)``, ``k = h @ k_proj.T (+ k_bias)``, ``v = h @ v_proj.T (+ v_bias)``
     (biases only when ``config.qkv_bias``), split head-major into ``[L, heads, head_dim]`` and
     ``[L, kv_heads, head_dim]``.
  3. When ``config.qk_norm``: ``q = rms_norm(q, q_norm)``, ``k = rms_norm(k, k_norm)`` over each head's
     ``head_dim`` (same eps), *before* RoPE.
  4. RoPE, "rotate half" over the full ``head_dim``: ``inv_freq[i] = theta^(-2i / head_dim)`` for
     ``i < head_dim / 2``, angle ``= position * inv_freq`` with positions ``0 .. L-1``,
     ``cos = cat(cos(angle), cos(angle))`` (likewise ``sin``), ``x' = x * cos + rotate_half(x) * sin``
     where ``rotate_half(x) = cat(-x[half:], x[:half])``.
  5. Causal grouped-query attention: query head ``h`` reads kv head ``h // (heads / kv_heads)``;
     ``softmax(q k^T * head_dim^-0.5)`` with key ``j`` visible to query ``i`` iff ``j <= i``; times ``v``.
  6. ``x = x + attn @ o_proj.T`` (heads concatenated head-major).
  7. ``x = x + down(silu(gate(h2)) * up(h2))`` with ``h2 = rms_norm(x, post_attn_norm)``.

* **Output** ``logits = rms_norm(x, final_norm) @ lm_head.T``, where ``lm_head`` is the embedding
  itself when ``config.tie_word_embeddings``.

Everything, RoPE tables included, is computed in float64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from runnercheck.impl.interface import MaxModelLenError, TokenOutOfVocabError
from runnercheck.impl.model.weights import LayerWeights, ModelConfig, ModelWeights, WeightsError


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rope_tables(num_positions: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each float64 ``[num_positions, head_dim]``, for positions ``0 .. num_positions-1``."""
    half = head_dim // 2
    inv_freq = torch.tensor([theta ** (-2.0 * i / head_dim) for i in range(half)], dtype=torch.float64)
    positions = torch.arange(num_positions, dtype=torch.float64)
    angle = positions[:, None] * inv_freq[None, :]
    return torch.cat([angle.cos(), angle.cos()], dim=-1), torch.cat([angle.sin(), angle.sin()], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (``[L, heads, head_dim]``) by the per-position tables (``[L, head_dim]``)."""
    half = x.shape[-1] // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated_half * sin[:, None, :]


@dataclass
class _Layer:
    """One decoder layer's weights as float64 CPU copies."""

    input_norm: torch.Tensor
    q_proj: torch.Tensor
    k_proj: torch.Tensor
    v_proj: torch.Tensor
    o_proj: torch.Tensor
    post_attn_norm: torch.Tensor
    gate_proj: torch.Tensor
    up_proj: torch.Tensor
    down_proj: torch.Tensor
    q_bias: torch.Tensor | None
    k_bias: torch.Tensor | None
    v_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None


def _own_float64(t: torch.Tensor | None) -> torch.Tensor | None:
    # A private copy: the caller's weights may be float64 CPU already, and `.to` would then alias.
    return None if t is None else t.detach().to(device="cpu", dtype=torch.float64).clone()


def _check_shape(name: str, t: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    if t is None:
        raise WeightsError(f"ReferenceModel: weight {name} is missing for this config")
    if tuple(t.shape) != shape:
        raise WeightsError(f"ReferenceModel: weight {name} has shape {tuple(t.shape)}, expected {shape}")


def _convert_layer(index: int, lw: LayerWeights, c: ModelConfig) -> _Layer:
    h, hd = c.hidden_size, c.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "input_norm": (h,), "q_proj": (c.num_heads * hd, h), "k_proj": (c.num_kv_heads * hd, h),
        "v_proj": (c.num_kv_heads * hd, h), "o_proj": (h, c.num_heads * hd), "post_attn_norm": (h,),
        "gate_proj": (c.intermediate_size, h), "up_proj": (c.intermediate_size, h),
        "down_proj": (h, c.intermediate_size),
    }
    if c.qkv_bias:
        shapes.update(q_bias=(c.num_heads * hd,), k_bias=(c.num_kv_heads * hd,), v_bias=(c.num_kv_heads * hd,))
    if c.qk_norm:
        shapes.update(q_norm=(hd,), k_norm=(hd,))
    for name, shape in shapes.items():
        _check_shape(f"layers[{index}].{name}", getattr(lw, name), shape)
    used = {name: _own_float64(getattr(lw, name)) for name in shapes}
    for optional in ("q_bias", "k_bias", "v_bias", "q_norm", "k_norm"):
        used.setdefault(optional, None)
    return _Layer(**used)


class ReferenceModel:
    """Full-sequence float64 forward of the built-in decoder (see the module docstring).

    Owns float64 CPU copies of every weight: one owner (this object), on the host, for the object's
    lifetime, written once in ``__init__`` and only read afterwards.  Holds no per-sequence state.
    """

    def __init__(self, weights: ModelWeights) -> None:
        c = weights.config
        self.config: ModelConfig = c
        if len(weights.layers) != c.num_layers:
            raise WeightsError(f"ReferenceModel: {len(weights.layers)} layers, config says {c.num_layers}")
        _check_shape("embed", weights.embed, (c.vocab_size, c.hidden_size))
        _check_shape("final_norm", weights.final_norm, (c.hidden_size,))
        self.embed = _own_float64(weights.embed)
        if c.tie_word_embeddings:
            self.lm_head = self.embed
        else:
            _check_shape("lm_head", weights.lm_head, (c.vocab_size, c.hidden_size))
            self.lm_head = _own_float64(weights.lm_head)
        self.final_norm = _own_float64(weights.final_norm)
        self.layers = [_convert_layer(i, lw, c) for i, lw in enumerate(weights.layers)]

    def _check_tokens(self, token_ids: Sequence[int]) -> torch.Tensor:
        c = self.config
        ids = list(token_ids)
        if not ids:
            raise MaxModelLenError("empty sequence: nothing to compute", field="token_ids")
        if len(ids) > c.max_model_len:
            raise MaxModelLenError(f"{len(ids)} tokens > max_model_len {c.max_model_len}", field="token_ids")
        for tok in ids:
            if not isinstance(tok, int) or isinstance(tok, bool) or not 0 <= tok < c.vocab_size:
                raise TokenOutOfVocabError(f"token {tok!r} outside [0, {c.vocab_size})", field="token_ids")
        return torch.tensor(ids, dtype=torch.int64)

    def _attention(self, layer: _Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c = self.config
        length = h.shape[0]
        q = h @ layer.q_proj.T
        k = h @ layer.k_proj.T
        v = h @ layer.v_proj.T
        if c.qkv_bias:
            q, k, v = q + layer.q_bias, k + layer.k_bias, v + layer.v_bias
        q = q.view(length, c.num_heads, c.head_dim)
        k = k.view(length, c.num_kv_heads, c.head_dim)
        v = v.view(length, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q = rms_norm(q, layer.q_norm, c.rms_norm_eps)
            k = rms_norm(k, layer.k_norm, c.rms_norm_eps)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)

        heads_per_kv = c.num_heads // c.num_kv_heads
        scale = c.head_dim ** -0.5
        query_pos = torch.arange(length)[:, None]
        key_pos = torch.arange(length)[None, :]
        visible = key_pos <= query_pos
        out = torch.empty(length, c.num_heads, c.head_dim, dtype=torch.float64)
        for head in range(c.num_heads):
            kv_head = head // heads_per_kv
            scores = (q[:, head, :] @ k[:, kv_head, :].T) * scale
            scores = scores.masked_fill(~visible, -math.inf)
            out[:, head, :] = torch.softmax(scores, dim=-1) @ v[:, kv_head, :]
        return out.reshape(length, c.num_heads * c.head_dim) @ layer.o_proj.T

    @staticmethod
    def _mlp(layer: _Layer, h: torch.Tensor) -> torch.Tensor:
        gate = torch.nn.functional.silu(h @ layer.gate_proj.T)
        return (gate * (h @ layer.up_proj.T)) @ layer.down_proj.T

    def logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """float64 ``[len(token_ids), vocab]``: logits at positions ``0 .. len-1`` of this one sequence.

        Raises `TokenOutOfVocabError` for an id outside the vocabulary and `MaxModelLenError` for an
        empty sequence or one longer than ``config.max_model_len``.
        """
        ids = self._check_tokens(token_ids)
        c = self.config
        cos, sin = rope_tables(len(ids), c.head_dim, c.rope_theta)
        x = self.embed[ids]
        for layer in self.layers:
            x = x + self._attention(layer, rms_norm(x, layer.input_norm, c.rms_norm_eps), cos, sin)
            x = x + self._mlp(layer, rms_norm(x, layer.post_attn_norm, c.rms_norm_eps))
        return rms_norm(x, self.final_norm, c.rms_norm_eps) @ self.lm_head.T


__all__ = ["ReferenceModel", "rms_norm", "rope_tables", "apply_rope"]
