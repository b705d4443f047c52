"""The paged decoder forward vs an independent float64 dense forward, over multi-step schedules.

The dense forward below is written in this file on purpose in another style than both the runner
and the oracle (complex-number RoPE, torch SDPA attention): whole sequences, no cache, no paging.
Schedules mix fresh prefills, prefill chunks over cached context, decodes, padding tokens (slot
-1), an empty padded request, persistent-style buffers longer than what is used, shuffled block
ids and batch orders that change from step to step.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import runnercheck.impl.model.forward as forward_module
from runnercheck.impl.device import Device
from runnercheck.impl.model.forward import ForwardInputError, PagedDecoder
from runnercheck.impl.model.weights import ModelWeights, preset, random_weights


# --------------------------------------------------------------------------- independent dense forward


def dense_forward(weights: ModelWeights, token_ids: list[int]) -> torch.Tensor:
    """float64 logits ``[len, vocab]`` of one whole sequence."""
    c = weights.config
    f64 = lambda t: None if t is None else t.detach().to(torch.float64)  # noqa: E731
    length = len(token_ids)

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.rms_norm_eps) * f64(w)

    half = c.head_dim // 2
    freqs = torch.tensor([c.rope_theta ** (-(2.0 * i) / c.head_dim) for i in range(half)], dtype=torch.float64)
    rotation = torch.polar(torch.ones(length, half, dtype=torch.float64), torch.arange(length, dtype=torch.float64)[:, None] * freqs)

    def rope(x: torch.Tensor) -> torch.Tensor:  # x [heads, L, D]; pairs (i, i + half) as complex numbers
        z = torch.complex(x[..., :half], x[..., half:]) * rotation
        return torch.cat((z.real, z.imag), dim=-1)

    x = f64(weights.embed)[torch.tensor(token_ids)]
    for lw in weights.layers:
        h = norm(x, lw.input_norm)
        q, k, v = (h @ f64(w).T for w in (lw.q_proj, lw.k_proj, lw.v_proj))
        if c.qkv_bias:
            q, k, v = q + f64(lw.q_bias), k + f64(lw.k_bias), v + f64(lw.v_bias)
        q = q.view(length, c.num_heads, c.head_dim).transpose(0, 1)
        k = k.view(length, c.num_kv_heads, c.head_dim).transpose(0, 1)
        v = v.view(length, c.num_kv_heads, c.head_dim).transpose(0, 1)
        if c.qk_norm:
            q, k = norm(q, lw.q_norm), norm(k, lw.k_norm)
        group = c.num_heads // c.num_kv_heads
        attn = F.scaled_dot_product_attention(rope(q), rope(k).repeat_interleave(group, 0), v.repeat_interleave(group, 0), is_causal=True)
        x = x + attn.transpose(0, 1).reshape(length, -1) @ f64(lw.o_proj).T
        h = norm(x, lw.post_attn_norm)
        x = x + (F.silu(h @ f64(lw.gate_proj).T) * (h @ f64(lw.up_proj).T)) @ f64(lw.down_proj).T
    return norm(x, weights.final_norm) @ f64(weights.lm_head).T


# --------------------------------------------------------------------------- schedules


@dataclass
class Request:
    tokens: list[int]
    blocks: list[int]


@dataclass
class Part:
    """``n`` tokens of ``req`` from position ``done``; logits wanted at these offsets of the part."""

    req: Request
    done: int
    n: int
    logits_at: tuple[int, ...] = ()


class StepDriver:
    """Lays a step out in padded buffers (as the input batch would) and runs the decoder."""

    def __init__(self, decoder: PagedDecoder, gen: torch.Generator, max_blocks: int):
        self.decoder, self.gen, self.max_blocks = decoder, gen, max_blocks
        self.dev = decoder.device
        self.bs = decoder.kv_cache.block_size

    def inputs(self, parts: list[Part], *, pad_tokens: int, empty_reqs: int, spare: int = 4):
        vocab = self.decoder.config.vocab_size
        num_real = sum(p.n for p in parts)
        num_tokens = num_real + pad_tokens
        num_reqs = len(parts) + empty_reqs
        length = num_tokens + spare
        ids = torch.randint(0, vocab, (length,), generator=self.gen)
        positions = torch.randint(0, 5, (length,), generator=self.gen)
        # Stale entries past num_tokens point at a live slot: reading past num_tokens corrupts the cache.
        slots = torch.full((length,), parts[0].req.blocks[0] * self.bs, dtype=torch.int64)
        slots[num_real:num_tokens] = -1
        # Padding tokens may carry any position: the decoder must not index outside its tables.
        positions[num_real:num_tokens] = torch.tensor([10**9, -7, 3])[: num_tokens - num_real]
        qsl = torch.full((num_reqs + 3,), 5, dtype=torch.int32)
        seq_lens = torch.full((num_reqs + 2,), 9, dtype=torch.int32)
        table = torch.randint(0, self.decoder.kv_cache.num_blocks, (num_reqs + 2, self.max_blocks), generator=self.gen, dtype=torch.int32)
        logits_indices, want = [], []
        row = 0
        for r, p in enumerate(parts):
            qsl[r] = row
            seq_lens[r] = p.done + p.n
            table[r, : len(p.req.blocks)] = torch.tensor(p.req.blocks, dtype=torch.int32)
            span = range(p.done, p.done + p.n)
            ids[row : row + p.n] = torch.tensor(p.req.tokens[p.done : p.done + p.n])
            positions[row : row + p.n] = torch.tensor(list(span))
            slots[row : row + p.n] = torch.tensor([p.req.blocks[s // self.bs] * self.bs + s % self.bs for s in span])
            for off in p.logits_at:
                logits_indices.append(row + off)
                want.append((p.req, p.done + off))
            row += p.n
        qsl[len(parts) : num_reqs + 1] = row  # empty padded requests at the end
        seq_lens[len(parts) : num_reqs] = 0
        d = self.dev.to_device
        tensors = dict(input_ids=d(ids), positions=d(positions), slot_mapping=d(slots), query_start_loc=d(qsl),
                       seq_lens=d(seq_lens), block_table=d(table), logits_indices=d(torch.tensor(logits_indices)))
        counts = dict(num_reqs=num_reqs, num_tokens=num_tokens, max_query_len=max(p.n for p in parts),
                      max_seq_len=max(p.done + p.n for p in parts))
        return tensors, counts, want

    def run(self, parts: list[Part], *, pad_tokens: int = 0, empty_reqs: int = 0):
        tensors, counts, want = self.inputs(parts, pad_tokens=pad_tokens, empty_reqs=empty_reqs)
        box = {}
        self.dev.enqueue(lambda: box.update(logits=self.decoder.forward(**tensors, **counts)), "forward")
        self.dev.synchronize()
        return box["logits"].cpu(), want


def _schedule(vocab: int, block_size: int, num_blocks: int, gen: torch.Generator):
    free = torch.randperm(num_blocks, generator=gen).tolist()

    def request(length: int) -> Request:
        return Request(torch.randint(0, vocab, (length,), generator=gen).tolist(), [free.pop() for _ in range(-(-length // block_size))])

    a, b, c = request(13), request(21), request(8)
    return [a, b, c], [
        # a whole prompt; b's first chunk (no logits) -- with padding tokens
        (dict(pad_tokens=2), [Part(a, 0, 11, (10,)), Part(b, 0, 8)]),
        # a decode; b's second chunk over its cached first chunk, logits at every position (prompt
        # logprobs); c's whole prompt
        (dict(), [Part(a, 11, 1, (0,)), Part(b, 8, 11, tuple(range(11))), Part(c, 0, 6, (5,))]),
        # decodes in another batch order, plus padding tokens and an empty padded request
        (dict(pad_tokens=3, empty_reqs=1), [Part(c, 6, 1, (0,)), Part(a, 12, 1, (0,)), Part(b, 19, 1, (0,))]),
        # two decodes
        (dict(), [Part(b, 20, 1, (0,)), Part(c, 7, 1, (0,))]),
    ]


def _run_schedule(weights: ModelWeights, dev: Device, *, dtype: torch.dtype, block_size: int, atol: float,
                  rel: float = 0.0, reference=None, mutate=None) -> float:
    """Run the schedule; every logit row must be within ``atol + rel * max|dense row|``."""
    gen = torch.Generator().manual_seed(11)
    num_blocks = 40
    decoder = PagedDecoder(weights, dev, dtype=dtype, num_kv_blocks=num_blocks, block_size=block_size)
    if mutate is not None:
        mutate(decoder)
    reqs, steps = _schedule(weights.config.vocab_size, block_size, num_blocks, gen)
    dense = {id(r): dense_forward(weights, r.tokens) for r in reqs}
    driver = StepDriver(decoder, gen, max_blocks=8)
    worst = 0.0
    for kwargs, parts in steps:
        logits, want = driver.run(parts, **kwargs)
        assert logits.dtype == torch.float32 and logits.shape == (len(want), weights.config.vocab_size)
        for row, (req, pos) in enumerate(want):
            want_row = dense[id(req)][pos]
            err = (logits[row].double() - want_row).abs().max().item()
            worst = max(worst, err)
            tol = atol + rel * want_row.abs().max().item()
            assert err <= tol, f"logits at position {pos}: max abs error {err:.3g} > {tol:.3g}"
            if reference is not None:
                ref_err = (logits[row].double() - reference.logits(req.tokens[: pos + 1])[pos]).abs().max().item()
                assert ref_err <= atol, f"vs ReferenceModel at position {pos}: {ref_err:.3g} > {atol}"
    return worst


QWEN_STYLE = dataclasses.replace(preset("tiny"), qk_norm=True, qkv_bias=True, tie_word_embeddings=True, num_heads=6, num_kv_heads=2)


@pytest.mark.parametrize("config,block_size", [(preset("tiny"), 4), (QWEN_STYLE, 8), (preset("micro"), 4)],
                         ids=["tiny", "qwen-style", "micro"])
def test_forward_matches_dense_float64(config, block_size):
    worst = _run_schedule(random_weights(config, seed=5), Device("cpu"), dtype=torch.float32, block_size=block_size, atol=1e-3)
    assert worst < 1e-3


def test_forward_matches_reference_model():
    reference_model = pytest.importorskip("runnercheck.reference.model")
    weights = random_weights(QWEN_STYLE, seed=9)
    _run_schedule(weights, Device("cpu"), dtype=torch.float32, block_size=4, atol=1e-3,
                  reference=reference_model.ReferenceModel(weights))


def test_dense_comparison_catches_a_wrong_rope_direction():
    """The comparison can fail: a decoder whose RoPE rotates the wrong way is caught.  (A uniform
    position shift would not be: attention sees only relative rotations.)"""
    weights = random_weights(preset("micro"), seed=2)
    with pytest.raises(AssertionError, match="max abs error"):
        _run_schedule(weights, Device("cpu"), dtype=torch.float32, block_size=4, atol=1e-3,
                      mutate=lambda decoder: decoder.rope_sin.neg_())


def _one_step_inputs(decoder: PagedDecoder):
    driver = StepDriver(decoder, torch.Generator().manual_seed(0), max_blocks=4)
    req = Request(list(range(6)), [3, 1])
    return driver.inputs([Part(req, 0, 6, (5,))], pad_tokens=1, empty_reqs=0)


def test_bad_forward_arguments_raise_before_any_write():
    dev = Device("cpu")
    decoder = PagedDecoder(random_weights(preset("micro")), dev, dtype=torch.float32, num_kv_blocks=6, block_size=4)
    tensors, counts, _ = _one_step_inputs(decoder)
    bad_cases = [
        (dict(tensors, slot_mapping=tensors["slot_mapping"].int()), counts, "slot_mapping"),
        (dict(tensors, block_table=tensors["block_table"].long()), counts, "block_table"),
        (dict(tensors, positions=torch.zeros(8, dtype=torch.int64, device="meta")), counts, "positions"),
        (tensors, dict(counts, num_tokens=100), "num_tokens"),
        (tensors, dict(counts, num_reqs=5), "query_start_loc"),
        (tensors, dict(counts, max_seq_len=17), "block table capacity"),
        (tensors, dict(counts, max_seq_len=1000), "max_model_len"),
        (tensors, dict(counts, max_query_len=0), "max_query_len"),
        (dict(tensors, logits_indices=tensors["logits_indices"][:0]), counts, "logits_indices"),
    ]
    for t, cnt, message in bad_cases:
        with pytest.raises(ForwardInputError, match=message):
            decoder.forward(**t, **cnt)
    assert not decoder.kv_cache.k.any() and not decoder.kv_cache.v.any()
    with pytest.raises(ForwardInputError, match="num_blocks"):
        PagedDecoder(random_weights(preset("micro")), dev, dtype=torch.float32, num_kv_blocks=0, block_size=4)
    with pytest.raises(ForwardInputError, match="dtype"):
        PagedDecoder(random_weights(preset("micro")), dev, dtype=torch.int32, num_kv_blocks=4, block_size=4)


def test_forward_never_reads_device_data_on_the_host():
    """Run outside an enqueue so the sync detector watches every op; a planted `.item()` is caught."""
    sync = pytest.importorskip("runnercheck.checks.detectors.sync")
    dev = Device("cpu")
    decoder = PagedDecoder(random_weights(preset("micro")), dev, dtype=torch.float32, num_kv_blocks=6, block_size=4)
    tensors, counts, _ = _one_step_inputs(decoder)
    with sync.forbid_host_sync("cpu", mode="count") as scope:
        decoder.forward(**tensors, **counts)
    assert scope.count == 0, scope.events

    real_attention = forward_module.paged_attention

    def attention_sized_on_host(*args, **kwargs):
        kwargs["max_query_len"] = min(kwargs["max_query_len"], int(args[5].max()))  # the planted host read
        return real_attention(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(forward_module, "paged_attention", attention_sized_on_host)
        with sync.forbid_host_sync("cpu", mode="count") as scope:
            decoder.forward(**tensors, **counts)
    assert scope.count > 0 and all("attention_sized_on_host" in loc for _, loc in scope.events), scope.events


# --------------------------------------------------------------------------- GPU (H200)

QWEN3_ONE_LAYER = dataclasses.replace(preset("qwen3-0.6b"), num_layers=1, vocab_size=4096, max_model_len=512)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,atol,rel", [(torch.float32, 2e-3, 0.0), (torch.bfloat16, 0.0, 0.03)])
def test_qwen3_shaped_forward_on_gpu(dtype, atol, rel):
    weights = random_weights(QWEN3_ONE_LAYER, seed=3)
    if dtype == torch.bfloat16:
        # Compare with the dense forward of the bf16-rounded weights: what the decoder is given.
        weights = weights.to("cpu", torch.bfloat16).to("cpu", torch.float32)
    # Tied embeddings of std 1 make logits of magnitude ~30: bf16 is judged relative to that.
    worst = _run_schedule(weights, Device("cuda"), dtype=dtype, block_size=16, atol=atol, rel=rel)
    print(f"{dtype}: worst abs logit error {worst:.3g}")


@pytest.mark.gpu
def test_forward_is_sync_free_on_gpu():
    sync = pytest.importorskip("runnercheck.checks.detectors.sync")
    dev = Device("cuda")
    decoder = PagedDecoder(random_weights(QWEN3_ONE_LAYER), dev, dtype=torch.bfloat16, num_kv_blocks=6, block_size=16)
    tensors, counts, _ = _one_step_inputs(decoder)
    decoder.forward(**tensors, **counts)  # compile the kernels outside the scope
    dev.synchronize()
    with sync.forbid_host_sync(None, mode="error"):
        dev.enqueue(lambda: decoder.forward(**tensors, **counts), "forward")
    dev.synchronize()
