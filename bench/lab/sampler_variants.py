"""Issue 58's two misses, by variant: the all-greedy launch and the temperature split pass, timed side by side.

    python -m runnercheck.bench.lab.sampler_variants [--rows 1 8 64 256] [--vocab 151936] [--check-only] [--greedy-only
        [--greedy-stages 1 2 3 4]]

Greedy: the product's all-greedy launch (`sampling_greedy`: each program walks a contiguous span in
``SUB``-wide steps) over spans per row, steps and warps, next to ``torch.argmax`` and a plain read of the
logits (the floor's kernel).

Temperature: the temperature rows' share of the product's split pass (`sampling._noisy_chunk_argmax`: keys
bounded in exponential space from the hi words, one reference token's full key as the bar) over chunk and
warps, against the same bounds on ``[CHUNK/4, 4]`` quads (no interleave) and against two chunks per program
(both loads issued first).  All must give the same per-chunk (key, token) partials: checked first.
``--profile`` launches each kernel twice and exits (for ncu).  ``--greedy-only``: the greedy launch alone,
over a wider grid (spans per row 1-8, steps 1024-8192, 4-16 warps), beside the floor, argmax and the read.

Prints one JSON line per measurement (device microseconds, CUDA-graph replays).  Not a product feature:
the lab.
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from runnercheck.impl.kernels.rng import gumbel_from_bits, noise_lo, philox4x32, NOISE_STREAM
from runnercheck.impl.kernels.sampling_greedy import greedy_argmax_kernel


@triton.jit
def noise_hi_quads(seed, position, start, Q: tl.constexpr):
    """The hi words of tokens ``start + 4 q + r`` as ``[Q, 4]`` (one Philox call per row of four)."""
    quads = start // 4 + tl.arange(0, Q)
    w0, w1, w2, w3 = philox4x32(seed, quads, position, NOISE_STREAM)
    r = tl.arange(0, 4)[None, :]
    return tl.where(r == 0, w0[:, None], tl.where(r == 1, w1[:, None], tl.where(r == 2, w2[:, None], w3[:, None])))


@triton.jit
def _argmin_payload(c1, i1, s1, h1, c2, i2, s2, h2):
    take = (c2 < c1) | ((c2 == c1) & (i2 < i1))
    return tl.where(take, c2, c1), tl.where(take, i2, i1), tl.where(take, s2, s1), tl.where(take, h2, h1)


@triton.jit
def exp_space_noisy_argmax(score, offs, hi, seed, position, start, REFINE_LOOP: tl.constexpr):
    """Gumbel-max of one chunk ([Q, 4] lanes; ``score == -inf`` excluded): ``(best full key, lowest token)``.

    ``e_lo = u0 + u0^2/2 + u0^3/3 + u0^4/4`` (``u0 = hi 2^-32``) is at most ``-log1p(-u)`` for every lo word,
    so ``s - log(e_lo)`` bounds the key from above; comparing ``e_lo exp(m - s)`` with ``exp(m - key_ref)``
    takes no logarithm per token.  The reference is the lane of smallest ``e_lo exp(m - s)`` (its full key is
    a lower bound on the chunk's best); every lane that could reach it is refined from its full 64 bits.
    """
    valid = score > float("-inf")
    m = tl.max(tl.max(score, axis=1), axis=0)
    u0 = hi.to(tl.float32) * 2.3283064365386963e-10
    e_lo = u0 * (1.0 + u0 * (0.5 + u0 * (0.3333333432674408 + u0 * 0.25)))
    w = tl.exp(m - score)
    # a lane more than ~88 below the chunk max (w = inf) cannot win: its key is below m - 2.82
    cheap = tl.where(valid & (w < float("inf")), e_lo * w, float("inf"))
    c_ref, ref, s_ref, h_ref = tl.reduce((cheap, offs, score, hi), 1, _argmin_payload)
    c_ref, ref, s_ref, h_ref = tl.reduce((c_ref, ref, s_ref, h_ref), 0, _argmin_payload)
    best = tl.full((), float("-inf"), tl.float32)
    best_token = tl.full((), 0, tl.int32) + start
    if c_ref < float("inf"):
        best = s_ref + gumbel_from_bits(h_ref, noise_lo(seed, position, ref))
        best_token = ref
        margin = 4.8828125e-04 + (tl.abs(m) + tl.abs(best)) * 1.9073486328125e-06  # 2^-11 + 2^-19 (|m| + |key|)
        bar = tl.exp((m - best) + margin)
        candidate = valid & (cheap <= bar) & (offs != ref)
        count = tl.sum(tl.sum(candidate.to(tl.int32), axis=1), axis=0)
        if count > REFINE_LOOP:
            key = tl.where(candidate, score + gumbel_from_bits(hi, noise_lo(seed, position, offs)), float("-inf"))
            top = tl.max(tl.max(key, axis=1), axis=0)
            at = tl.min(tl.min(tl.where(candidate & (key == top), offs, 2147483647), axis=1), axis=0)
            take = (top > best) | ((top == best) & (at < best_token))
            best = tl.where(take, top, best)
            best_token = tl.where(take, at, best_token)
        else:
            remaining = candidate
            for _ in range(count):
                token = tl.min(tl.min(tl.where(remaining, offs, 2147483647), axis=1), axis=0)
                pick = offs == token
                s = tl.max(tl.max(tl.where(pick, score, float("-inf")), axis=1), axis=0)
                h = tl.max(tl.max(tl.where(pick, hi, 0), axis=1), axis=0)
                key = s + gumbel_from_bits(h, noise_lo(seed, position, token))
                take = (key > best) | ((key == best) & (token < best_token))
                best = tl.where(take, key, best)
                best_token = tl.where(take, token, best_token)
                remaining = remaining & (offs != token)
    return best, best_token


@triton.jit(do_not_specialize=["num_blocks"])
def temperature_block_variant_kernel(logits_ptr, logits_stride, temperature, seed_ptr, position_ptr,
                                     part_best_ptr, part_token_ptr, num_blocks, vocab_size, CHUNK: tl.constexpr):
    """The temperature rows' share of the split pass (no penalties): the exp-space variant's partials."""
    row = tl.program_id(0)
    blk = tl.program_id(1)
    Q: tl.constexpr = CHUNK // 4
    offs = blk * CHUNK + 4 * tl.arange(0, Q)[:, None] + tl.arange(0, 4)[None, :]
    in_vocab = offs < vocab_size
    raw = tl.load(logits_ptr + row.to(tl.int64) * logits_stride + offs, mask=in_vocab, other=float("-inf"))
    score = tl.where(raw != raw, float("-inf"), raw) / temperature
    seed = tl.load(seed_ptr + row)
    position = tl.load(position_ptr + row)
    hi = noise_hi_quads(seed, position, blk * CHUNK, Q)
    best, token = exp_space_noisy_argmax(score, offs, hi, seed, position, blk * CHUNK, 8)
    at = row.to(tl.int64) * num_blocks + blk
    tl.store(part_best_ptr + at, best)
    tl.store(part_token_ptr + at, token)


@triton.jit(do_not_specialize=["num_blocks"])
def temperature_block_product_kernel(logits_ptr, logits_stride, temperature, seed_ptr, position_ptr,
                                     part_best_ptr, part_token_ptr, num_blocks, vocab_size, CHUNK: tl.constexpr):
    """The same share through the product's `_noisy_chunk_argmax` (the baseline of this comparison)."""
    row = tl.program_id(0)
    blk = tl.program_id(1)
    offs = blk * CHUNK + tl.arange(0, CHUNK)
    in_vocab = offs < vocab_size
    raw = tl.load(logits_ptr + row.to(tl.int64) * logits_stride + offs, mask=in_vocab, other=float("-inf"))
    score = tl.where(raw != raw, float("-inf"), raw) / temperature
    seed = tl.load(seed_ptr + row)
    position = tl.load(position_ptr + row)
    best, token = _product_noisy_chunk_argmax(score, offs, seed, position, blk * CHUNK, tl.max(score, axis=0),
                                              logits_ptr, temperature, False, CHUNK)
    at = row.to(tl.int64) * num_blocks + blk
    tl.store(part_best_ptr + at, best)
    tl.store(part_token_ptr + at, token)


from runnercheck.impl.kernels.sampling import _noisy_chunk_argmax as _product_noisy_chunk_argmax  # noqa: E402


@triton.jit(do_not_specialize=["num_blocks"])
def temperature_block_pair_kernel(logits_ptr, logits_stride, temperature, seed_ptr, position_ptr,
                                  part_best_ptr, part_token_ptr, num_blocks, vocab_size, CHUNK: tl.constexpr):
    """Two chunks per program, both loads issued before either chunk's noise (the same partials)."""
    row = tl.program_id(0)
    first = tl.program_id(1) * 2
    logits_row = logits_ptr + row.to(tl.int64) * logits_stride
    offs_a = first * CHUNK + tl.arange(0, CHUNK)
    offs_b = offs_a + CHUNK
    raw_a = tl.load(logits_row + offs_a, mask=offs_a < vocab_size, other=float("-inf"))
    raw_b = tl.load(logits_row + offs_b, mask=offs_b < vocab_size, other=float("-inf"))
    seed = tl.load(seed_ptr + row)
    position = tl.load(position_ptr + row)
    score_a = tl.where(raw_a != raw_a, float("-inf"), raw_a) / temperature
    best, token = _product_noisy_chunk_argmax(score_a, offs_a, seed, position, first * CHUNK, tl.max(score_a, axis=0),
                                              logits_row, temperature, False, CHUNK)
    at = row.to(tl.int64) * num_blocks + first
    tl.store(part_best_ptr + at, best)
    tl.store(part_token_ptr + at, token)
    if first + 1 < num_blocks:
        score_b = tl.where(raw_b != raw_b, float("-inf"), raw_b) / temperature
        best, token = _product_noisy_chunk_argmax(score_b, offs_b, seed, position, (first + 1) * CHUNK,
                                                  tl.max(score_b, axis=0), logits_row, temperature, False, CHUNK)
        tl.store(part_best_ptr + at + 1, best)
        tl.store(part_token_ptr + at + 1, token)


@triton.jit
def _read_max_kernel(logits_ptr, logits_stride, out_ptr, vocab_size, span, SUB: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    lanes = tl.arange(0, SUB)
    acc = tl.full([SUB], float("-inf"), tl.float32)
    start = blk * span
    stop = tl.minimum(start + span, vocab_size)
    for first in range(start, stop, SUB):
        offs = first + lanes
        acc = tl.maximum(acc, tl.load(logits_ptr + row.to(tl.int64) * logits_stride + offs, mask=offs < stop,
                                      other=float("-inf")))
    tl.store(out_ptr + row * tl.num_programs(1) + blk, tl.max(acc, axis=0))


def _graph_us(fn, cuda: bool) -> float:
    from runnercheck.bench.timing import device_time_us

    if not cuda:
        return device_time_us(fn, cuda=False)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return device_time_us(graph.replay, cuda=True)


class GreedyLoop:
    """The all-greedy launch (`sampling_greedy.greedy_argmax_kernel`) over ``blocks`` spans per row, any step and
    warps (accumulators at their reset values)."""

    def __init__(self, device: torch.device, rows: int):
        self.packed = torch.full((rows,), -(2**63), dtype=torch.int64, device=device)
        self.inf = torch.full((rows,), 2**31 - 1, dtype=torch.int32, device=device)
        self.flag = torch.zeros(rows, dtype=torch.int32, device=device)
        self.arrivals = torch.zeros(rows, dtype=torch.int32, device=device)
        self.tokens = torch.zeros(rows, dtype=torch.int64, device=device)
        self.flags = torch.zeros(rows, dtype=torch.int32, device=device)
        self.rows_map = torch.arange(rows, dtype=torch.int32, device=device)
        self.ones = torch.ones(rows, dtype=torch.float32, device=device)
        self.zeros = torch.zeros(rows, dtype=torch.float32, device=device)
        self.dummy_i32 = torch.zeros((rows, 8), dtype=torch.int32, device=device)
        self.dummy_i64 = torch.zeros((rows, 1), dtype=torch.int64, device=device)

    def __call__(self, logits: torch.Tensor, rows: int, blocks: int, sub: int, warps: int,
                 stages: int = 1) -> torch.Tensor:
        vocab = logits.shape[1]
        span = triton.cdiv(triton.cdiv(vocab, blocks), sub) * sub
        blocks = triton.cdiv(vocab, span)
        greedy_argmax_kernel[(rows, blocks)](
            logits, logits.stride(0), self.rows_map, self.ones, self.zeros, self.zeros, self.dummy_i32,
            self.dummy_i32.stride(0), self.dummy_i32, self.dummy_i32.stride(0), self.dummy_i64, 1, 0,
            self.packed, self.inf, self.flag, self.arrivals, self.tokens, self.flags, blocks, span, vocab,
            SUB=sub, STAGES=stages, num_warps=warps)
        return self.tokens[:rows]


def _emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument("--profile", action="store_true",
                        help="one launch each of the temperature split pass and the all-greedy launch at the largest "
                             "row count, after a warm-up launch (for ncu --launch-skip 1)")
    parser.add_argument("--greedy-only", action="store_true", help="the greedy launch's wider sweep, no temperature")
    parser.add_argument("--greedy-stages", type=int, nargs="+", default=None,
                        help="with --greedy-only: the greedy launch's software-pipelined stages over these counts, at "
                             "the product's spans and its neighbouring steps and warps only")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    max_rows = max(args.rows)
    gen = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(max_rows, args.vocab, generator=gen, device=dev) * 3.0
    seeds = torch.arange(max_rows, dtype=torch.int64, device=dev) * 7919 + 1000
    positions = torch.arange(max_rows, dtype=torch.int64, device=dev) + 100
    chunk = 1024 if cuda else 64
    num_blocks = triton.cdiv(args.vocab, chunk)
    loop = GreedyLoop(dev, max_rows)
    if args.profile:
        best = torch.empty((max_rows, num_blocks), dtype=torch.float32, device=dev)
        token = torch.empty((max_rows, num_blocks), dtype=torch.int32, device=dev)
        for _ in range(2):
            temperature_block_product_kernel[(max_rows, num_blocks)](logits, logits.stride(0), 0.8, seeds, positions,
                                                                     best, token, num_blocks, args.vocab, CHUNK=chunk,
                                                                     num_warps=4)
            loop(logits, max_rows, 1, 2048 if cuda else chunk, 8)
        if cuda:
            torch.cuda.synchronize()
        return 0
    # correctness first: the variants against the product's partials and torch.argmax
    ref_tokens = torch.argmax(logits, dim=1)
    for blocks, sub, warps in ((4, chunk, 4), (16, chunk, 4), (1, chunk, 8)):
        got = loop(logits, max_rows, blocks, sub, warps).clone()
        _emit(check="greedy_loop", blocks=blocks, sub=sub, warps=warps, equal=bool(torch.equal(got, ref_tokens)))
    outs = {}
    variants = (("product", temperature_block_product_kernel), ("exp_space", temperature_block_variant_kernel),
                ("pair", temperature_block_pair_kernel))
    for name, kernel in variants:
        best = torch.empty((max_rows, num_blocks), dtype=torch.float32, device=dev)
        token = torch.empty((max_rows, num_blocks), dtype=torch.int32, device=dev)
        grid = (max_rows, triton.cdiv(num_blocks, 2) if name == "pair" else num_blocks)
        kernel[grid](logits, logits.stride(0), 0.8, seeds, positions, best, token, num_blocks, args.vocab, CHUNK=chunk,
                     num_warps=4)
        outs[name] = (best, token)
    for name in ("exp_space", "pair"):
        _emit(check="temperature_partials", variant=name,
              tokens_equal=bool(torch.equal(outs["product"][1], outs[name][1])),
              keys_equal=bool(torch.equal(outs["product"][0], outs[name][0])))
    for scale in (0.05, 1.0, 30.0):  # near-flat rows (many candidates) and peaked ones
        flat = logits * scale
        for name, kernel in variants:
            grid = (max_rows, triton.cdiv(num_blocks, 2) if name == "pair" else num_blocks)
            kernel[grid](flat, flat.stride(0), 0.8, seeds, positions, *outs[name], num_blocks, args.vocab,
                         CHUNK=chunk, num_warps=4)
        for name in ("exp_space", "pair"):
            _emit(check="temperature_partials", variant=name, scale=scale,
                  tokens_equal=bool(torch.equal(outs["product"][1], outs[name][1])),
                  keys_equal=bool(torch.equal(outs["product"][0], outs[name][0])))
    if args.check_only or not cuda:
        return 0
    bw_bytes = None
    from runnercheck.bench.timing import copy_bandwidth_bytes_per_s

    bw_bytes = copy_bandwidth_bytes_per_s(True)
    for rows in args.rows:
        part = logits[:rows]
        floor = rows * args.vocab * 4 / bw_bytes * 1e6
        _emit(rows=rows, case="floor", us=floor)
        _emit(rows=rows, case="torch.argmax", us=_graph_us(lambda: torch.argmax(part, dim=1), True))
        out = torch.empty((rows, 256), dtype=torch.float32, device=dev)
        for blocks, sub, warps in ((16, 4096, 8), (8, 4096, 8), (32, 2048, 4)):
            span = triton.cdiv(triton.cdiv(args.vocab, blocks), sub) * sub
            nb = triton.cdiv(args.vocab, span)
            _emit(rows=rows, case="read_max", blocks=nb, sub=sub, warps=warps,
                  us=_graph_us(lambda: _read_max_kernel[(rows, nb)](part, part.stride(0), out, args.vocab, span,
                                                                    SUB=sub, num_warps=warps), True))
        stage_counts = (1,)
        if args.greedy_only and args.greedy_stages:
            spans = sorted({max(1, 256 // rows) * m for m in (1, 2)})
            shapes = [(2048, 16), (2048, 8), (4096, 16), (1024, 8)]
            stage_counts = tuple(args.greedy_stages)
        elif args.greedy_only:
            spans = sorted({max(1, 256 // rows) * m for m in (1, 2, 4, 8)})
            shapes = [(sub, warps) for sub in (1024, 2048, 4096, 8192) for warps in (4, 8, 16) if sub >= 128 * warps]
        else:
            spans, shapes = (max(1, 256 // rows), max(1, 512 // rows)), ((2048, 8), (1024, 8), (2048, 16))
        for blocks in spans:
            for sub, warps in shapes:
                if triton.cdiv(args.vocab, blocks) < sub // 2:
                    continue
                for stages in stage_counts:
                    loop.tokens.zero_()
                    us = _graph_us(lambda: loop(logits, rows, blocks, sub, warps, stages), True)
                    _emit(rows=rows, case="greedy_loop", blocks=blocks, sub=sub, warps=warps, stages=stages, us=us,
                          equal=bool(torch.equal(loop.tokens[:rows], ref_tokens[:rows])))
        if args.greedy_only:
            continue
        for name, kernel in variants:
            shapes = ((1024, 4), (2048, 4)) if name == "exp_space" else ((512, 2), (512, 4), (1024, 2), (1024, 4),
                                                                           (1024, 8), (2048, 4))
            for ch, warps in shapes:
                nb = triton.cdiv(args.vocab, ch)
                best = torch.empty((rows, nb), dtype=torch.float32, device=dev)
                token = torch.empty((rows, nb), dtype=torch.int32, device=dev)
                grid = (rows, triton.cdiv(nb, 2) if name == "pair" else nb)
                _emit(rows=rows, case=f"temperature_block_{name}", chunk=ch, warps=warps,
                      us=_graph_us(lambda: kernel[grid](part, part.stride(0), 0.8, seeds, positions, best, token,
                                                        nb, args.vocab, CHUNK=ch, num_warps=warps), True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
