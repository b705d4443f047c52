"""The compute-floor kernels of the sampler bench draw the contract's real bits (not a cheaper stand-in)."""
from __future__ import annotations

import pytest
import torch

from runnercheck.bench.noise_floor import philox_xor
from runnercheck.reference import rng as ref_rng


@pytest.mark.parametrize("hilo", [False, True])
def test_philox_floor_kernel_folds_the_spec_bits(hilo):
    vocab, chunk = 300, 64
    seeds = torch.tensor([1000, 1001, 2**40 + 7], dtype=torch.int64)
    got = philox_xor(seeds, vocab, chunk, hilo=hilo)
    for row, seed in enumerate(seeds.tolist()):
        hi, lo = ref_rng.philox_64bits(seed, row + 100, torch.arange(vocab))  # POSITION_BASE + row
        bits = (hi ^ lo).tolist()
        for blk in range(got.shape[1]):
            folded = 0
            for word in bits[blk * chunk:(blk + 1) * chunk]:
                folded ^= word
            assert got[row, blk].item() & 0xFFFFFFFF == folded, (row, blk)
