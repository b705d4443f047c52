"""The bitwise probe of RNG contract v2's refinement (docs/SAMPLING.md "RNG contract v2").

A refined sampler draws a token's lo word only when its key interval, given the hi word, can still
hold the maximum; a bug there (a candidate not refined, lo words from the wrong stream) moves the
token only where two keys lie within one hi interval of each other, which no statistic sees at a
feasible sample size.  So this probe plants such rows and compares bit for bit: for a seed it
searches noise positions where at least two tokens have a small hi word (``hi < 2^20``: their
intervals are wide enough, ~1e-6, for the lo word to decide between them in fp32), and sets those
tokens' logits to ``C - g(hi, lo = 0)`` so their intervals start at the same key ``C``; every other
token sits 30 below.  The sampler's tokens must equal the dense fp32 argmax of every token's full
64-bit key (`runnercheck.checks.chisq.gumbel_kernel.gumbel_argmax`) on every row.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from runnercheck.impl.interface import SamplingParams
from runnercheck.reference import rng as ref_rng

SMALL_HI = 2**20
TOP = 0.25
REST = -30.0


def collision_rows(vocab: int, rows: int, seed: int = 0, per_row: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logits [rows, vocab] float32, seeds, positions)``: rows with ``>= per_row`` planted near-collisions."""
    tokens = torch.arange(vocab)
    found: list[tuple[int, int, torch.Tensor]] = []
    base = 0
    batch = max(1, 2**22 // vocab)  # positions searched at once: ~4M int64 words per Philox temporary
    while len(found) < rows:
        positions = torch.arange(base, base + batch).view(-1, 1)
        hi = ref_rng.noise_hi(seed, positions, tokens.view(1, -1))
        small = hi < SMALL_HI
        for r in torch.nonzero(small.sum(dim=1) >= per_row).view(-1).tolist():
            found.append((seed, base + r, torch.nonzero(small[r]).view(-1)))
            if len(found) == rows:
                break
        base += batch
    logits = torch.full((rows, vocab), REST, dtype=torch.float64)
    for i, (s, p, planted) in enumerate(found):
        hi = ref_rng.noise_hi(s, p, planted)
        logits[i, planted] = TOP - ref_rng.gumbel_from_bits(hi, torch.zeros_like(hi))
    return (logits.float(), torch.tensor([s for s, _, _ in found], dtype=torch.int64),
            torch.tensor([p for _, p, _ in found], dtype=torch.int64))


def refinement_mismatches(sampler: Callable[..., torch.Tensor], vocab: int = 512, rows: int = 16, seed: int = 0,
                          device: str = "cpu") -> list[tuple[int, int, int]]:
    """``(row, sampler's token, dense argmax)`` for every planted row where a `SamplerFn` disagrees."""
    from runnercheck.checks.chisq.gumbel_kernel import gumbel_argmax

    logits, seeds, positions = collision_rows(vocab, rows, seed)
    args = (logits.to(device), seeds.to(device), positions.to(device))
    got = sampler(args[0], [SamplingParams(temperature=1.0)] * rows, args[1], args[2]).cpu().tolist()
    dense = gumbel_argmax(*args).cpu().tolist()
    return [(i, g, d) for i, (g, d) in enumerate(zip(got, dense)) if g != d]


__all__: Sequence[str] = ["collision_rows", "refinement_mismatches"]
