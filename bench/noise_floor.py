"""The compute floor of temperature sampling under the RNG contract (used by `runnercheck.bench.case_sampler`).

Temperature sampling must draw the contract's noise for every (row, token): 64-bit Philox4x32-10
bits (RNG spec v1, `runnercheck.impl.kernels.rng`) and two fp32 logs.  Two kernels read no logits at all:

* ``philox``: the bits alone, XOR-folded per (row, chunk) so nothing is optimised away -- no
  temperature sampler under the contract can be faster than this;
* ``noise``: the bits, the uniform and the Gumbel transform, argmax per (row, chunk) -- what the
  fused temperature kernel computes, minus the logits read and the penalties.

Each is timed at a few launch shapes (chunk x warps, the sampler's split shape among them) and
the fastest is reported, so the floor is not an artefact of one shape.  ``philox`` is timed in
both forms of the round (`philox_64bits`: widening multiplies, the runner's; and
`philox_64bits_hilo`: ``umulhi`` + ``*``), which produce the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from runnercheck.bench.timing import device_time_us
from runnercheck.impl.kernels.rng import gumbel_from_bits, philox_64bits, philox_64bits_hilo

SHAPES = ((1024, 4), (2048, 4), (2048, 8), (4096, 8))  # (chunk, num_warps)
POSITION_BASE = tl.constexpr(100)  # jit functions read only constexpr globals


@triton.jit
def _philox_xor_kernel(seed_ptr, out_ptr, vocab_size, HILO: tl.constexpr, CHUNK: tl.constexpr):
    """Per (row, chunk): XOR of ``hi ^ lo`` over the chunk's tokens (no logits read)."""
    row = tl.program_id(0)
    blk = tl.program_id(1)
    offs = blk * CHUNK + tl.arange(0, CHUNK)
    seed = tl.load(seed_ptr + row)
    if HILO:
        hi, lo = philox_64bits_hilo(seed, row + POSITION_BASE, offs, 0)
    else:
        hi, lo = philox_64bits(seed, row + POSITION_BASE, offs, 0)
    bits = tl.where(offs < vocab_size, hi ^ lo, 0)
    tl.store(out_ptr + row * tl.num_programs(1) + blk, tl.xor_sum(bits, axis=0).to(tl.int32, bitcast=True))


@triton.jit
def _noise_argmax_kernel(seed_ptr, best_ptr, token_ptr, vocab_size, CHUNK: tl.constexpr):
    """Per (row, chunk): argmax of the contract's Gumbel noise alone (no logits read)."""
    row = tl.program_id(0)
    blk = tl.program_id(1)
    offs = blk * CHUNK + tl.arange(0, CHUNK)
    hi, lo = philox_64bits(tl.load(seed_ptr + row), row + POSITION_BASE, offs, 0)
    noise = tl.where(offs < vocab_size, gumbel_from_bits(hi, lo), float("-inf"))
    best = tl.max(noise, axis=0)
    at = row * tl.num_programs(1) + blk
    tl.store(best_ptr + at, best)
    tl.store(token_ptr + at, tl.min(tl.where(noise == best, offs, vocab_size), axis=0))


@dataclass(frozen=True)
class FloorTime:
    us: float
    chunk: int
    num_warps: int

    def shape(self) -> str:
        return f"chunk {self.chunk}, {self.num_warps} warps"


def philox_xor(seeds: torch.Tensor, vocab: int, chunk: int, hilo: bool = False) -> torch.Tensor:
    """The per-(row, chunk) XOR folds ``[rows, cdiv(vocab, chunk)]`` int32 (one launch; also for tests)."""
    out = torch.empty((seeds.shape[0], triton.cdiv(vocab, chunk)), dtype=torch.int32, device=seeds.device)
    _philox_xor_kernel[(seeds.shape[0], out.shape[1])](seeds, out, vocab, HILO=hilo, CHUNK=chunk,
                                                        num_warps=4)
    return out


def _fastest(launch, shapes) -> FloorTime:
    best = None
    for chunk, warps in shapes:
        us = launch(chunk, warps)
        if best is None or us < best.us:
            best = FloorTime(us, chunk, warps)
    return best


def floor_times(device: torch.device, rows: int, vocab: int, cuda: bool,
                shapes=SHAPES) -> dict[str, FloorTime]:
    """Fastest time over ``shapes`` of ``philox`` (runner's form), ``philox_hilo`` and ``noise``."""
    seeds = torch.arange(rows, dtype=torch.int64, device=device) + 1000
    results = {}
    for name, hilo in (("philox", False), ("philox_hilo", True)):
        def launch(chunk: int, warps: int, hilo: bool = hilo) -> float:
            out = torch.empty((rows, triton.cdiv(vocab, chunk)), dtype=torch.int32, device=device)
            grid = (rows, out.shape[1])
            return device_time_us(lambda: _philox_xor_kernel[grid](seeds, out, vocab, HILO=hilo, CHUNK=chunk,
                                                                   num_warps=warps), cuda=cuda)

        results[name] = _fastest(launch, shapes)

    def launch_noise(chunk: int, warps: int) -> float:
        blocks = triton.cdiv(vocab, chunk)
        best = torch.empty((rows, blocks), dtype=torch.float32, device=device)
        token = torch.empty((rows, blocks), dtype=torch.int32, device=device)
        return device_time_us(lambda: _noise_argmax_kernel[(rows, blocks)](seeds, best, token, vocab, CHUNK=chunk,
                                                                           num_warps=warps), cuda=cuda)

    results["noise"] = _fastest(launch_noise, shapes)
    return results


__all__ = ["FloorTime", "SHAPES", "floor_times", "philox_xor"]
