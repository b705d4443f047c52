"""The RNG is specified once and implemented twice: the bits must agree exactly."""
from __future__ import annotations

import math

import pytest
import torch

from reference import rng as ref_rng

SEEDS = [0, 1, 12345, 2**31 - 1, 2**32, 2**32 + 7, 2**40 + 3, 2**62 + 99, 2**63 - 1]
POSITIONS = [0, 1, 17, 4095, 2**20 + 5, 2**31 - 1]


def _kernel_tables(device: str, vocab: int):
    from impl.kernels.rng import philox_table

    seeds, positions = [], []
    for s in SEEDS:
        for p in POSITIONS:
            seeds.append(s)
            positions.append(p)
    st = torch.tensor(seeds, dtype=torch.int64, device=device)
    pt = torch.tensor(positions, dtype=torch.int64, device=device)
    return seeds, positions, philox_table(st, pt, vocab)


def _check_tables(device: str, vocab: int) -> None:
    seeds, positions, (hi, lo, noise) = _kernel_tables(device, vocab)
    hi, lo, noise = hi.cpu(), lo.cpu(), noise.cpu()
    for r, (s, p) in enumerate(zip(seeds, positions)):
        rhi, rlo = ref_rng.philox_64bits(s, p, torch.arange(vocab))
        assert torch.equal(hi[r], rhi), (s, p)
        assert torch.equal(lo[r], rlo), (s, p)
        rnoise = ref_rng.gumbel_from_bits(rhi, rlo)
        # The kernel's u is fp32: near 1 it is rounded to ~2^-24, and noise = -log(-log(1 - u))
        # moves by |du| / (w |log w|) with w = 1 - u (measured on an H200: 1.1e-4 at noise -2.5, w ~ 5e-6).
        # Elsewhere fp32 log differs from float64 by a few ulps (H200: <= 4.1e-6 relative).
        w = 1.0 - ref_rng.uniform_from_bits(rhi, rlo)
        allowed = 2e-5 * (1.0 + rnoise.abs()) + 2.0**-23 / (w * -torch.log(w))
        error = (noise[r].double() - rnoise).abs()
        worst = int(torch.argmax(error / allowed))
        assert bool((error <= allowed).all()), (s, p, worst, float(error[worst]), float(allowed[worst]), float(rnoise[worst]))


def test_known_answer():
    # Pinned values of the spec, so both implementations cannot drift together.
    hi, lo = ref_rng.philox_64bits(0, 0, torch.tensor([0, 1]))
    hi2, lo2 = ref_rng.philox_64bits(2**63 - 1, 2**31 - 1, torch.tensor([511]))
    assert (hi.tolist(), lo.tolist(), hi2.tolist(), lo2.tolist()) == KNOWN


# (0, 0, [0]) is Random123's published Philox4x32-10 answer for counter 0, key 0:
# 0x6627e8d5, 0xe169c58d -- the spec is standard Philox4x32-10.
KNOWN = ([1713891541, 4175744164], [3781805453, 1555169499], [1049158199], [3714573434])


def test_kernel_bits_match_reference_cpu():
    _check_tables("cpu", 67)


@pytest.mark.gpu
def test_kernel_bits_match_reference_cuda():
    _check_tables("cuda", 4099)


def test_distinct_keys_give_distinct_streams():
    a = ref_rng.philox_64bits(1, 5, torch.arange(64))
    b = ref_rng.philox_64bits(1 + 2**32, 5, torch.arange(64))
    c = ref_rng.philox_64bits(1, 6, torch.arange(64))
    assert not torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_noise_reaches_deep_tail():
    # Smallest u is 2^-65: noise = -log(-log1p(-2^-65)) = 65 ln 2 > 40.
    hi = torch.tensor([0]); lo = torch.tensor([0])
    g = ref_rng.gumbel_from_bits(hi, lo).item()
    assert g == pytest.approx(65 * math.log(2), rel=1e-9)
    assert g >= 40
    # and u never reaches 1
    u = ref_rng.uniform_from_bits(torch.tensor([2**32 - 1]), torch.tensor([2**32 - 1]))
    assert u.item() < 1.0


def test_uniform_is_uniform():
    from scipy import stats

    hi, lo = ref_rng.philox_64bits(42, 3, torch.arange(20000))
    u = ref_rng.uniform_from_bits(hi, lo).numpy()
    assert stats.kstest(u, "uniform").pvalue > 1e-4
