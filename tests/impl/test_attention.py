"""Paged KV-cache write and varlen causal paged attention vs a dense float64 causal attention.

The reference here is written independently of the kernel: whole sequences, no cache, no paging,
no batching.  Batches mix a decode, a fresh prefill and a prefill chunk whose earlier part was
cached by an earlier call, with shuffled non-contiguous block ids, persistent-style input buffers
longer than what is used (filled with garbage past the used part), and padding tokens (slot -1).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from runnercheck.impl.device import Device
from runnercheck.impl.kernels.attention import (
    AttentionArgumentError, attention_launch, paged_attention, rope_and_write_kv_cache, write_kv_cache,
)


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """float64 causal GQA attention of one whole sequence: q [S, H, D], k/v [S, KVH, D] -> [S, H, D]."""
    q, k, v = q.double(), k.double(), v.double()
    seq, heads, dim = q.shape
    group = heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * dim**-0.5
    future = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


@dataclass
class Seq:
    """One request's whole sequence of q/k/v (host, in the cache dtype) and its KV blocks."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    blocks: list[int]
    expected: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.expected = dense_causal_attention(self.q, self.k, self.v)

    def slot(self, pos: int, block_size: int) -> int:
        return self.blocks[pos // block_size] * block_size + pos % block_size


class Scenario:
    """Builds sequences on shuffled blocks and launches steps the way the runner would."""

    def __init__(self, dev: Device, *, heads: int, kv_heads: int, head_dim: int, block_size: int,
                 num_blocks: int, max_blocks_per_req: int, dtype: torch.dtype, seed: int = 0):
        self.dev, self.heads, self.kv_heads, self.head_dim = dev, heads, kv_heads, head_dim
        self.block_size, self.max_blocks, self.dtype = block_size, max_blocks_per_req, dtype
        self.gen = torch.Generator().manual_seed(seed)
        self.free_blocks = torch.randperm(num_blocks, generator=self.gen).tolist()
        shape = (num_blocks, block_size, kv_heads, head_dim)
        self.k_cache = dev.zeros(shape, dtype)
        self.v_cache = dev.zeros(shape, dtype)

    def new_seq(self, length: int) -> Seq:
        n_blocks = -(-length // self.block_size)
        blocks = [self.free_blocks.pop() for _ in range(n_blocks)]
        rand = lambda *s: torch.randn(*s, generator=self.gen, dtype=torch.float64).to(self.dtype)  # noqa: E731
        return Seq(rand(length, self.heads, self.head_dim), rand(length, self.kv_heads, self.head_dim),
                   rand(length, self.kv_heads, self.head_dim), blocks)

    def step(self, parts: list[tuple[Seq, int, int]], *, pad_tokens: int = 0, spare: int = 5) -> list[torch.Tensor]:
        """Run write + attention for ``(seq, num_computed, num_scheduled)`` parts; return each part's output rows."""
        bs = self.block_size
        num_reqs = len(parts)
        num_real = sum(n for _, _, n in parts)
        num_tokens = num_real + pad_tokens
        length = num_tokens + spare
        rand = lambda *s: torch.randn(*s, generator=self.gen, dtype=torch.float64).to(self.dtype)  # noqa: E731
        q, k, v = rand(length, self.heads, self.head_dim), rand(length, self.kv_heads, self.head_dim), rand(length, self.kv_heads, self.head_dim)
        # Past num_tokens the persistent buffers hold stale slots of live blocks: a kernel that read
        # beyond num_tokens would corrupt the cache and fail the comparison.
        slots = torch.full((length,), parts[0][0].slot(0, bs), dtype=torch.int64)
        slots[num_real:num_tokens] = -1
        qsl = torch.full((num_reqs + 3,), 7, dtype=torch.int32)
        seq_lens = torch.full((num_reqs + 2,), 3, dtype=torch.int32)
        table = torch.randint(0, self.k_cache.shape[0], (num_reqs + 2, self.max_blocks), generator=self.gen, dtype=torch.int32)
        row = 0
        max_query_len = 0
        for r, (seq, done, n) in enumerate(parts):
            qsl[r] = row
            seq_lens[r] = done + n
            table[r, : len(seq.blocks)] = torch.tensor(seq.blocks, dtype=torch.int32)
            q[row : row + n], k[row : row + n], v[row : row + n] = seq.q[done : done + n], seq.k[done : done + n], seq.v[done : done + n]
            slots[row : row + n] = torch.tensor([seq.slot(p, bs) for p in range(done, done + n)])
            row += n
            max_query_len = max(max_query_len, n)
        qsl[num_reqs] = row
        d = self.dev.to_device
        q_d, k_d, v_d, slots_d = d(q), d(k), d(v), d(slots)
        out = self.dev.full(q.shape, float("nan"), self.dtype)
        self.last_inputs = dict(block_table=d(table), query_start_loc=d(qsl), seq_lens=d(seq_lens))
        self.last_query, self.last_counts = q_d, dict(num_reqs=num_reqs, num_tokens=num_tokens, max_query_len=max_query_len)

        def work() -> None:
            write_kv_cache(k_d, v_d, self.k_cache, self.v_cache, slots_d, num_tokens)
            paged_attention(q_d, self.k_cache, self.v_cache, out=out, scale=self.head_dim**-0.5,
                            **self.last_inputs, **self.last_counts)

        self.dev.enqueue(work, "attention-step")
        self.dev.synchronize()
        out = out.cpu()
        rows, row = [], 0
        for _, _, n in parts:
            rows.append(out[row : row + n])
            row += n
        assert torch.isnan(out[num_real:]).all(), "attention wrote rows of padding tokens or past num_tokens"
        return rows

    def rerun_attention(self, **overrides) -> torch.Tensor:
        """Attention of the last step again with some inputs replaced (cache already written)."""
        inputs = {**self.last_inputs, **overrides}
        out = torch.full(self.last_query.shape, float("nan"), dtype=self.dtype, device=self.dev.torch_device)
        paged_attention(self.last_query, self.k_cache, self.v_cache, out=out, scale=self.head_dim**-0.5, **inputs, **self.last_counts)
        return out.cpu()


def _check(rows: list[torch.Tensor], parts: list[tuple[Seq, int, int]], atol: float) -> None:
    for got, (seq, done, n) in zip(rows, parts):
        want = seq.expected[done : done + n]
        err = (got.double() - want).abs().max().item()
        assert err <= atol, f"max abs error {err:.3g} > {atol} for a part at positions [{done}, {done + n})"


def _three_step_run(sc: Scenario, lens: dict[str, int], atol: float) -> None:
    a, b, c = sc.new_seq(lens["decode_ctx"] + 2), sc.new_seq(lens["prefill"] + 1), sc.new_seq(lens["chunk1"] + lens["chunk2"] + 1)
    # Step 1: a's context and c's first chunk are prefilled (and checked).
    step1 = [(a, 0, lens["decode_ctx"]), (c, 0, lens["chunk1"])]
    _check(sc.step(step1), step1, atol)
    # Step 2: a decode, a fresh prefill, and c's second chunk over its cached first chunk; padding.
    step2 = [(a, lens["decode_ctx"], 1), (b, 0, lens["prefill"]), (c, lens["chunk1"], lens["chunk2"])]
    _check(sc.step(step2, pad_tokens=3), step2, atol)
    # Step 3: decodes only (the small-tile path).
    c_done = lens["chunk1"] + lens["chunk2"]
    step3 = [(b, lens["prefill"], 1), (a, lens["decode_ctx"] + 1, 1), (c, c_done, 1)]
    _check(sc.step(step3, pad_tokens=1), step3, atol)
    # Every cached slot holds exactly its token's K/V; every other slot is still zero (padding
    # tokens and stale buffer entries past num_tokens wrote nothing).
    expect_k = torch.zeros_like(sc.k_cache, device="cpu")
    expect_v = torch.zeros_like(expect_k)
    bs = sc.block_size
    for seq, n in ((a, lens["decode_ctx"] + 2), (b, lens["prefill"] + 1), (c, c_done + 1)):
        for p in range(n):
            expect_k[seq.blocks[p // bs], p % bs] = seq.k[p]
            expect_v[seq.blocks[p // bs], p % bs] = seq.v[p]
    assert torch.equal(sc.k_cache.cpu(), expect_k)
    assert torch.equal(sc.v_cache.cpu(), expect_v)


CPU_LENS = dict(decode_ctx=32, prefill=40, chunk1=9, chunk2=6)


@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", [(4, 2, 16, 4), (6, 2, 24, 8), (2, 2, 16, 8)])
def test_mixed_batches_match_dense_attention(heads, kv_heads, head_dim, block_size):
    # The decode at position 32 = TILE_N (on CPU) needs a second key tile holding one key, the
    # online softmax rescales across tiles, and the 40-token prefill spans two query blocks.
    sc = Scenario(Device("cpu"), heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
                  num_blocks=48, max_blocks_per_req=12, dtype=torch.float32, seed=heads * 100 + head_dim)
    _three_step_run(sc, CPU_LENS, atol=2e-5)


def test_padding_slots_write_nothing():
    dev = Device("cpu")
    gen = torch.Generator().manual_seed(1)
    k_cache = dev.to_device(torch.randn(4, 4, 2, 16, generator=gen))
    v_cache = dev.to_device(torch.randn(4, 4, 2, 16, generator=gen))
    before_k, before_v = k_cache.clone(), v_cache.clone()
    key = dev.to_device(torch.randn(6, 2, 16, generator=gen))
    value = dev.to_device(torch.randn(6, 2, 16, generator=gen))
    slots = dev.to_device(torch.tensor([5, -1, 14, -1, 3, 0]))
    write_kv_cache(key, value, k_cache, v_cache, slots, num_tokens=4)  # tokens 4, 5 are past num_tokens
    written = {5: 0, 14: 2}
    flat_k, flat_v = k_cache.view(16, 2, 16), v_cache.view(16, 2, 16)
    for s in range(16):
        want_k = key[written[s]] if s in written else before_k.view(16, 2, 16)[s]
        want_v = value[written[s]] if s in written else before_v.view(16, 2, 16)[s]
        assert torch.equal(flat_k[s], want_k) and torch.equal(flat_v[s], want_v), f"slot {s}"


def _rotate_half_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """float64 RoPE of x [T, heads, D]: x * cos + rotate_half(x) * sin, angles pos * theta^(-2i/D)."""
    dim = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angle = positions.double()[:, None] * inv_freq[None, :]
    cos, sin = torch.cat((angle.cos(), angle.cos()), -1)[:, None], torch.cat((angle.sin(), angle.sin()), -1)[:, None]
    rotated = torch.cat((-x[..., dim // 2 :], x[..., : dim // 2]), dim=-1)
    return x * cos + rotated * sin


@pytest.mark.parametrize("with_qk_norm", [True, False])
def test_rope_norm_and_cache_write_stage_matches_float64(with_qk_norm):
    dev = Device("cpu")
    gen = torch.Generator().manual_seed(4)
    heads, kv_heads, dim, theta, max_pos = 6, 2, 24, 10000.0, 40
    num_tokens, length = 5, 7
    qkv = torch.randn(length, (heads + 2 * kv_heads) * dim, generator=gen, dtype=torch.float64)
    positions = torch.tensor([0, 3, 17, 10**9, 39, 2, 2])  # token 3 is padding with a garbage position
    slots = torch.tensor([5, 0, 9, -1, 12, 1, 1])  # past num_tokens: stale live slot 1
    q_norm = 1 + 0.2 * torch.randn(dim, generator=gen, dtype=torch.float64)
    k_norm = 1 + 0.2 * torch.randn(dim, generator=gen, dtype=torch.float64)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)

    d = dev.to_device
    qkv_d = d(qkv.float())
    q, k, v = qkv_d.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q_out = dev.full((length, heads, dim), float("nan"), torch.float32)
    k_cache, v_cache = dev.zeros((4, 4, kv_heads, dim), torch.float32), dev.zeros((4, 4, kv_heads, dim), torch.float32)
    rope_and_write_kv_cache(
        q.view(length, heads, dim), k.view(length, kv_heads, dim), v.view(length, kv_heads, dim), q_out, k_cache, v_cache,
        d(slots), d(positions), d(angles.cos().float()), d(angles.sin().float()),
        d(q_norm.float()) if with_qk_norm else None, d(k_norm.float()) if with_qk_norm else None, eps=1e-6, num_tokens=num_tokens,
    )

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w if with_qk_norm else x

    q64, k64, v64 = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    real = [0, 1, 2, 4]
    want_q = _rotate_half_rope(norm(q64.reshape(length, heads, dim), q_norm), positions.clamp(max=max_pos - 1), theta)
    assert (q_out[real].double() - want_q[real]).abs().max() < 1e-5
    assert torch.isnan(q_out[num_tokens:]).all()
    want_k = _rotate_half_rope(norm(k64.reshape(length, kv_heads, dim), k_norm), positions.clamp(max=max_pos - 1), theta)
    flat_k, flat_v = k_cache.view(16, kv_heads, dim), v_cache.view(16, kv_heads, dim)
    for token in real:
        assert (flat_k[slots[token]].double() - want_k[token]).abs().max() < 1e-5
        assert torch.equal(flat_v[slots[token]], v[token].view(kv_heads, dim))
    untouched = [s for s in range(16) if s not in slots[real].tolist()]
    assert not flat_k[untouched].any() and not flat_v[untouched].any()


def test_comparison_catches_wrong_paging_and_wrong_context():
    """The dense comparison is sensitive to the bugs it exists for: a swapped block table entry,
    and an off-by-one context length."""
    sc = Scenario(Device("cpu"), heads=4, kv_heads=2, head_dim=16, block_size=4, num_blocks=32,
                  max_blocks_per_req=8, dtype=torch.float32, seed=3)
    a, b = sc.new_seq(20), sc.new_seq(9)
    sc.step([(a, 0, 17), (b, 0, 6)])
    parts = [(a, 17, 3), (b, 6, 3)]
    _check(sc.step(parts), parts, 2e-5)

    good = sc.rerun_attention()
    _check([good[:3], good[3:6]], parts, 2e-5)

    swapped = sc.last_inputs["block_table"].clone()
    # Swap a fully visible block with the one holding the queries: a permutation among fully
    # visible keys would not change a softmax, this one changes what each query sees.
    swapped[0, [1, 4]] = swapped[0, [4, 1]]
    with pytest.raises(AssertionError, match="max abs error"):
        _check([sc.rerun_attention(block_table=swapped)[:3]], parts[:1], 2e-5)

    off_by_one = sc.last_inputs["seq_lens"].clone()
    off_by_one[1] += 1
    with pytest.raises(AssertionError, match="max abs error"):
        _check([sc.rerun_attention(seq_lens=off_by_one)[3:6]], parts[1:], 2e-5)


def test_bad_arguments_raise_typed_errors_before_any_write():
    dev = Device("cpu")
    k_cache, v_cache = dev.zeros((4, 4, 2, 16), torch.float32), dev.zeros((4, 4, 2, 16), torch.float32)
    key = dev.to_device(torch.randn(3, 2, 16))
    with pytest.raises(AttentionArgumentError, match="slot_mapping"):
        write_kv_cache(key, key, k_cache, v_cache, dev.to_device(torch.tensor([0, 1, 2], dtype=torch.int32)), 3)
    with pytest.raises(AttentionArgumentError, match="rows < num_tokens"):
        write_kv_cache(key, key, k_cache, v_cache, dev.to_device(torch.tensor([0, 1, 2, 3])), 4)
    assert not k_cache.any()
    q = dev.to_device(torch.randn(3, 4, 16))
    qsl = dev.to_device(torch.tensor([0, 3], dtype=torch.int32))
    lens = dev.to_device(torch.tensor([3], dtype=torch.int32))
    table = dev.to_device(torch.tensor([[0]], dtype=torch.int64))
    with pytest.raises(AttentionArgumentError, match="block_table must be int32"):
        paged_attention(q, k_cache, v_cache, table, qsl, lens, torch.empty_like(q), num_reqs=1, num_tokens=3, max_query_len=3, scale=0.25)
    with pytest.raises(AttentionArgumentError, match="query_start_loc"):
        paged_attention(q, k_cache, v_cache, table.int(), qsl, lens, torch.empty_like(q), num_reqs=2, num_tokens=3, max_query_len=3, scale=0.25)


def test_launch_tiles_fit_the_dot_and_gqa_groups():
    for qpkv in (1, 2, 3, 4, 8, 16, 32):
        for mql in (1, 7, 300):
            launch = attention_launch(mql, qpkv, 128, on_gpu=True)
            assert launch.block_m >= 16 and launch.block_q >= 1 and launch.block_q * qpkv <= launch.block_m
            assert launch.tile_n >= 16 and launch.head_dim_pad == 128


# --------------------------------------------------------------------------- GPU (H200)

GPU_LENS = dict(decode_ctx=700, prefill=300, chunk1=500, chunk2=200)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_qwen3_shaped_mixed_batches_on_gpu(dtype, atol):
    sc = Scenario(Device("cuda"), heads=16, kv_heads=8, head_dim=128, block_size=16, num_blocks=256,
                  max_blocks_per_req=64, dtype=dtype, seed=7)
    _three_step_run(sc, GPU_LENS, atol=atol)
