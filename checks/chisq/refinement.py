"""The bitwise probe of RNG contract v2's refinement (docs/SAMPLING.md "RNG contract v2").

A refined sampler draws a token's lo word only when its key, bounded from the hi word alone, can still
reach the maximum; a bug there (a candidate not refined, lo words from the wrong stream) moves the
token only where two keys lie within one hi interval of each other, which no statistic sees at a
feasible sample size.  So this probe plants such rows and compares bit for bit.  For a seed it searches
noise positions where some token ``b`` has a small hi word and a large lo word (``hi < 2^12``,
``lo >= 2^31``: its key sits ``gap = g(hi, 0) - g(hi, lo)``, at least ~2^-13, below the largest key its
hi word allows).  ``b`` and a neighbour ``a`` in the same 64-token chunk get logits that put ``a``'s full
key at ``C`` and ``b``'s at ``C - gap / 8``: ``a`` wins, yet ``b``'s hi word promises the higher key.  A
sampler that trusts the hi-word bound without refining every token that can reach the winner returns
``b``; one whose lo words come from another stream moves ``b``'s key by up to ``gap`` (it wins when its
wrong lo word is below ~7/8 of the right one).  Every other token sits 30 below.  The sampler's tokens
must equal the dense fp32 argmax of every token's full 64-bit key
(`runnercheck.checks.chisq.gumbel_kernel.gumbel_argmax`) on every row.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch

from runnercheck.impl.interface import SamplingParams
from runnercheck.reference import rng as ref_rng

SMALL_HI = 2**12
LARGE_LO = 2**31
TOP = 0.25
REST = -30.0
CHUNK = 64  # the partner stays in the wide token's 64-token chunk (so in every larger power-of-two chunk too)


@functools.lru_cache(maxsize=8)
def _planted_positions(vocab: int, rows: int, seed: int, device: str) -> tuple[tuple[int, int], ...]:
    """``(position, wide token)`` of the first ``rows`` positions holding a wide token (a search of ~2^20
    tokens per row: cached, and run on ``device``)."""
    quads = torch.arange(-(-vocab // 4), device=device).view(1, -1)
    found: list[tuple[int, int]] = []
    base = 0
    batch = max(1, 2**22 // vocab)  # positions searched at once: ~4M int64 words per Philox temporary
    while len(found) < rows:
        positions = torch.arange(base, base + batch, device=device).view(-1, 1)
        # the hi words four tokens per Philox call, as `ref_rng.noise_hi` lays them out
        words = ref_rng.philox4x32(torch.tensor(seed, device=device), quads, positions, ref_rng.NOISE_STREAM)
        hi = torch.stack(words, dim=-1).flatten(1)[:, :vocab]
        for r, t in torch.nonzero(hi < SMALL_HI).tolist():
            if len(found) < rows and int(ref_rng.noise_lo(seed, base + r, torch.tensor([t]))[0]) >= LARGE_LO:
                found.append((base + r, t))
        base += batch
    return tuple(found)


def collision_rows(vocab: int, rows: int, seed: int = 0, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logits [rows, vocab] float32, seeds, positions)`` on the CPU: rows with one planted near-collision
    each (``device``: where the search for them runs)."""
    found = _planted_positions(vocab, rows, seed, device)
    logits = torch.full((rows, vocab), REST, dtype=torch.float64)
    for i, (position, wide) in enumerate(found):
        partner = wide + 1 if (wide + 1) % CHUNK and wide + 1 < vocab else wide - 1
        pair = torch.tensor([wide, partner])
        hi, lo = ref_rng.noise_hi(seed, position, pair), ref_rng.noise_lo(seed, position, pair)
        full = ref_rng.gumbel_from_bits(hi, lo)
        gap = float(ref_rng.gumbel_from_bits(hi[:1], torch.zeros_like(lo[:1]))[0] - full[0])
        logits[i, wide] = TOP - gap / 8 - full[0]
        logits[i, partner] = TOP - full[1]
    return (logits.float(), torch.full((rows,), seed, dtype=torch.int64),
            torch.tensor([p for p, _ in found], dtype=torch.int64))


def refinement_mismatches(sampler: Callable[..., torch.Tensor], vocab: int = 512, rows: int = 16, seed: int = 0,
                          device: str = "cpu") -> list[tuple[int, int, int]]:
    """``(row, sampler's token, dense argmax)`` for every planted row where a `SamplerFn` disagrees."""
    from runnercheck.checks.chisq.gumbel_kernel import gumbel_argmax

    logits, seeds, positions = collision_rows(vocab, rows, seed, device)
    args = (logits.to(device), seeds.to(device), positions.to(device))
    got = sampler(args[0], [SamplingParams(temperature=1.0)] * rows, args[1], args[2]).cpu().tolist()
    dense = gumbel_argmax(*args).cpu().tolist()
    return [(i, g, d) for i, (g, d) in enumerate(zip(got, dense)) if g != d]


__all__: Sequence[str] = ["collision_rows", "refinement_mismatches"]
