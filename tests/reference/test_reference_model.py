"""ReferenceModel against an independently written float64 forward.

The independent forward uses different building blocks on purpose: `F.rms_norm`, `F.linear`,
RoPE as a complex rotation of ``(x[:half], x[half:])`` pairs, and
`F.scaled_dot_product_attention(is_causal=True)` with GQA done by the library (``enable_gqa``) or by
``repeat_interleave``.  Planted variants of that forward (the classic bugs of a paged model) must
disagree with the oracle, so the comparison is shown to be able to fail.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from runnercheck.impl.interface import MaxModelLenError, TokenOutOfVocabError
from runnercheck.impl.model.weights import ModelWeights, WeightsError, preset, random_weights
from runnercheck.reference.model import ReferenceModel

TOL = dict(rtol=1e-10, atol=1e-10)

BUGS = ("none", "interleaved_rope", "no_causal_mask", "kv_head_modulo", "norm_after_rope", "no_bias", "untied_head")


def _rope_complex(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x: [heads, L, hd]; rotate each (x[i], x[i + hd/2]) pair as a complex number."""
    hd = x.shape[-1]
    half = hd // 2
    exponent = torch.arange(0, hd, 2, dtype=torch.float64) / hd
    inv_freq = 1.0 / theta**exponent
    angle = torch.arange(x.shape[-2], dtype=torch.float64)[:, None] * inv_freq[None, :]
    z = torch.complex(x[..., :half], x[..., half:]) * torch.polar(torch.ones_like(angle), angle)
    return torch.cat([z.real, z.imag], dim=-1)


def _rope_interleaved(x: torch.Tensor, theta: float) -> torch.Tensor:
    """The GPT-J convention (pairs (x[2i], x[2i+1])): a planted bug."""
    hd = x.shape[-1]
    exponent = torch.arange(0, hd, 2, dtype=torch.float64) / hd
    angle = torch.arange(x.shape[-2], dtype=torch.float64)[:, None] * (1.0 / theta**exponent)[None, :]
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * torch.polar(torch.ones_like(angle), angle)
    return torch.stack([z.real, z.imag], dim=-1).flatten(-2)


def independent_logits(w: ModelWeights, ids: list[int], bug: str = "none", gqa: str = "library") -> torch.Tensor:
    c = w.config
    d = lambda t: None if t is None else t.double()  # noqa: E731
    eps = c.rms_norm_eps
    x = d(w.embed)[torch.tensor(ids)]
    length = len(ids)
    for lw in w.layers:
        h = F.rms_norm(x, (c.hidden_size,), d(lw.input_norm), eps)
        use_bias = c.qkv_bias and bug != "no_bias"
        q = F.linear(h, d(lw.q_proj), d(lw.q_bias) if use_bias else None)
        k = F.linear(h, d(lw.k_proj), d(lw.k_bias) if use_bias else None)
        v = F.linear(h, d(lw.v_proj), d(lw.v_bias) if use_bias else None)
        q = q.view(length, c.num_heads, c.head_dim).transpose(0, 1)
        k = k.view(length, c.num_kv_heads, c.head_dim).transpose(0, 1)
        v = v.view(length, c.num_kv_heads, c.head_dim).transpose(0, 1)
        rope = _rope_interleaved if bug == "interleaved_rope" else _rope_complex
        if c.qk_norm and bug != "norm_after_rope":
            q = F.rms_norm(q, (c.head_dim,), d(lw.q_norm), eps)
            k = F.rms_norm(k, (c.head_dim,), d(lw.k_norm), eps)
        q, k = rope(q, c.rope_theta), rope(k, c.rope_theta)
        if c.qk_norm and bug == "norm_after_rope":
            q = F.rms_norm(q, (c.head_dim,), d(lw.q_norm), eps)
            k = F.rms_norm(k, (c.head_dim,), d(lw.k_norm), eps)
        group = c.num_heads // c.num_kv_heads
        causal = bug != "no_causal_mask"
        if bug == "kv_head_modulo":
            k, v = k.repeat(group, 1, 1), v.repeat(group, 1, 1)
            attn = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=causal)[0]
        elif gqa == "library":
            attn = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=causal, enable_gqa=True)[0]
        else:
            k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
            attn = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=causal)[0]
        x = x + F.linear(attn.transpose(0, 1).reshape(length, -1), d(lw.o_proj))
        h2 = F.rms_norm(x, (c.hidden_size,), d(lw.post_attn_norm), eps)
        x = x + F.linear(F.silu(F.linear(h2, d(lw.gate_proj))) * F.linear(h2, d(lw.up_proj)), d(lw.down_proj))
    head = d(w.embed) if c.tie_word_embeddings and bug != "untied_head" else d(w.lm_head)
    return F.linear(F.rms_norm(x, (c.hidden_size,), d(w.final_norm), eps), head)


def _configs():
    tiny = preset("tiny")
    qwen_like = dataclasses.replace(tiny, qkv_bias=True, qk_norm=True, tie_word_embeddings=True)
    return {"tiny": tiny, "qwen_like": qwen_like, "micro": preset("micro")}


CONFIGS = _configs()


def _weights(name: str) -> ModelWeights:
    w = random_weights(CONFIGS[name], seed=3)
    if name == "qwen_like":
        # Tied models ship an lm_head field equal to the embedding; give it a different value so a
        # forward that ignores the tie is caught.
        w = dataclasses.replace(w, lm_head=w.lm_head * 0.5 + 0.1)
    return w


def _ids(vocab: int, length: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (length,), generator=g).tolist()


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("gqa", ["library", "repeat_interleave"])
def test_matches_independent_forward(name: str, gqa: str) -> None:
    w = _weights(name)
    model = ReferenceModel(w)
    for length in (1, 7, 23):
        ids = _ids(w.config.vocab_size, length, seed=length)
        got = model.logits(ids)
        assert got.dtype == torch.float64 and got.shape == (length, w.config.vocab_size)
        torch.testing.assert_close(got, independent_logits(w, ids, gqa=gqa), **TOL)


@pytest.mark.parametrize("bug", [b for b in BUGS if b != "none"])
def test_planted_forward_bugs_are_detected(bug: str) -> None:
    w = _weights("qwen_like")
    ids = _ids(w.config.vocab_size, 12, seed=5)
    got = ReferenceModel(w).logits(ids)
    wrong = independent_logits(w, ids, bug=bug)
    assert not torch.allclose(got, wrong, **TOL), f"planted bug {bug!r} went unnoticed"
    # ...and by a clear margin, not a rounding accident
    assert (got - wrong).abs().max().item() > 1e-3


def test_causal_prefix_logits_do_not_change_when_tokens_are_appended() -> None:
    w = _weights("qwen_like")
    model = ReferenceModel(w)
    ids = _ids(w.config.vocab_size, 20, seed=9)
    full = model.logits(ids)
    for cut in (1, 5, 13):
        torch.testing.assert_close(model.logits(ids[:cut]), full[:cut], rtol=1e-12, atol=1e-12)
    # a different continuation leaves the prefix alone as well
    other = ids[:13] + _ids(w.config.vocab_size, 7, seed=10)
    torch.testing.assert_close(model.logits(other)[:13], full[:13], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(model.logits(other)[13:], full[13:])


def test_weights_are_private_float64_copies() -> None:
    w = random_weights(CONFIGS["micro"], seed=1, dtype=torch.float64)
    model = ReferenceModel(w)
    ids = _ids(w.config.vocab_size, 6)
    before = model.logits(ids)
    with torch.no_grad():
        w.embed.mul_(2.0)
        w.layers[0].q_proj.zero_()
    torch.testing.assert_close(model.logits(ids), before, rtol=0, atol=0)
    assert model.embed.dtype == torch.float64 and model.embed.device.type == "cpu"


def test_fp32_and_fp64_weights_give_close_logits() -> None:
    cfg = CONFIGS["micro"]
    ids = _ids(cfg.vocab_size, 9)
    a = ReferenceModel(random_weights(cfg, seed=4, dtype=torch.float32)).logits(ids)
    b = ReferenceModel(random_weights(cfg, seed=4, dtype=torch.float64)).logits(ids)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_bad_token_ids_raise_typed_errors() -> None:
    model = ReferenceModel(_weights("micro"))
    v = model.config.vocab_size
    with pytest.raises(TokenOutOfVocabError):
        model.logits([0, v])
    with pytest.raises(TokenOutOfVocabError):
        model.logits([0, -1])
    with pytest.raises(TokenOutOfVocabError):
        model.logits([0, 1.0])  # type: ignore[list-item]
    with pytest.raises(MaxModelLenError):
        model.logits([])
    with pytest.raises(MaxModelLenError):
        model.logits([1] * (model.config.max_model_len + 1))


def test_bad_weights_raise_weights_error() -> None:
    w = _weights("micro")
    with pytest.raises(WeightsError):
        ReferenceModel(dataclasses.replace(w, embed=w.embed[:, :-1]))
    with pytest.raises(WeightsError):
        ReferenceModel(dataclasses.replace(w, layers=w.layers[:0]))
    biased = random_weights(dataclasses.replace(CONFIGS["micro"], qkv_bias=True), seed=0)
    biased.layers[0].q_bias = None
    with pytest.raises(WeightsError):
        ReferenceModel(biased)
