"""RNG contract v2 in the runner's sampler: refinement lands on the dense argmax bit for bit.

The dense reference is `runnercheck.checks.chisq.gumbel_kernel.gumbel_argmax` (fp32, every token's
full 64 bits, no bounds); the float64 oracle (`runnercheck.reference.sampler`) must agree outside
its documented ties.  Planted rows make many candidates per chunk need the lo word: their logits
are chosen as ``C - g(hi, lo = 0)`` so every planted key's interval starts at the same ``C``
(5 and 40 per chunk, and whole rows: all refined, one lane at a time).
Interpreted on CPU (vocabulary 512, 64-token chunks); the gpu twin runs the same rows compiled.
"""
from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from runnercheck.checks.chisq.gumbel_kernel import gumbel_argmax
from runnercheck.impl.interface import SamplingParams
from runnercheck.impl.kernels.rng import gumbel_from_bits, noise_exp_lower, noise_hi_chunk, noise_lo
from runnercheck.impl.kernels.sampling import _key_bounds, _logit_key_bounds, _refinement_bar
from runnercheck.impl.kernels.sampling_select import scale_by_temperature
from runnercheck.reference import rng as ref_rng
from runnercheck.reference.sampler import TIE_TOLERANCE
from runnercheck.reference.sampler import sample as reference_sample

VOCAB = 512
CHUNK = 64  # the CPU split layout's chunk


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def planted_logits(seed: int, position: int, tokens: list[int], top: float = 3.0, rest: float = -20.0) -> torch.Tensor:
    """A row whose ``tokens`` all have key intervals starting at ``top`` (fp32 rounding aside)."""
    hi = ref_rng.noise_hi(seed, position, torch.arange(VOCAB))
    g_top = ref_rng.gumbel_from_bits(hi, torch.zeros_like(hi))
    row = torch.full((VOCAB,), rest, dtype=torch.float64)
    row[tokens] = top - g_top[tokens]
    return row.float()


@triton.jit
def _candidate_count_kernel(logits_ptr, seed_ptr, pos_ptr, out_ptr, vocab, CHUNK: tl.constexpr):
    """The lanes `sampling._noisy_chunk_argmax` refines: the reference and every lane reaching its bar."""
    row = tl.program_id(0)
    blk = tl.program_id(1)
    offs = blk * CHUNK + tl.arange(0, CHUNK)
    score = tl.load(logits_ptr + row * vocab + offs, mask=offs < vocab, other=float("-inf"))
    seed = tl.load(seed_ptr + row)
    position = tl.load(pos_ptr + row)
    hi = noise_hi_chunk(seed, position, blk * CHUNK, CHUNK)
    valid = score > float("-inf")
    m = tl.max(score, axis=0)
    bound = _key_bounds(score, valid, hi, m)
    top = tl.min((bound.to(tl.int32, bitcast=True) & ~(CHUNK - 1)) | (offs - blk * CHUNK), axis=0)  # packed keys
    ref = blk * CHUNK + (top & (CHUNK - 1))
    pick = offs == ref
    key = tl.max(tl.where(pick, score, float("-inf")), axis=0) + gumbel_from_bits(
        tl.max(tl.where(pick, hi, 0), axis=0), noise_lo(seed, position, ref))
    refined = valid & ((bound <= _refinement_bar(m, key)) | pick)
    tl.store(out_ptr + row * tl.num_programs(1) + blk, tl.sum(refined.to(tl.int32), axis=0))


def candidate_counts(logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Per (row, chunk): how many tokens the bounds leave for refinement (temperature 1 rows)."""
    rows = logits.shape[0]
    out = torch.empty((rows, triton.cdiv(VOCAB, CHUNK)), dtype=torch.int32, device=logits.device)
    _candidate_count_kernel[out.shape](logits.contiguous(), seeds, positions, out, VOCAB, CHUNK=CHUNK)
    return out.cpu()


@pytest.fixture(scope="module")
def impl_sampler():
    from runnercheck.checks.chisq.impl_sampler import ImplSampler

    return ImplSampler()


def _rows(n: int, seed0: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed0)
    seeds = torch.randint(0, 2**62, (n,), generator=gen)
    positions = torch.randint(0, 2**31, (n,), generator=gen)
    planted = []
    for i in range(n):
        s, p = int(seeds[i]), int(positions[i])
        kind = i % 4
        if kind == 0:  # random logits: the usual one or two candidates per chunk
            planted.append(torch.randn(VOCAB, generator=gen) * 2)
        elif kind == 1:  # five planted in chunk 1: refined one at a time
            planted.append(planted_logits(s, p, [64 + 3 * j for j in range(5)]))
        elif kind == 2:  # forty planted in chunk 2: every lane refined at once
            planted.append(planted_logits(s, p, list(range(128, 168))))
        else:  # the whole row planted: hundreds of keys within fp32 rounding of each other (ties)
            planted.append(planted_logits(s, p, list(range(VOCAB))))
    return torch.stack(planted), seeds, positions


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter evaluates both sides of tl.where
def test_refined_sampler_equals_the_dense_argmax_bitwise(impl_sampler) -> None:
    logits, seeds, positions = _rows(8, 3)
    dev = _device()
    counts = candidate_counts(logits.to(dev), seeds.to(dev), positions.to(dev))
    assert counts[1, 1] == 5 and counts[5, 1] == 5  # the reference and four one at a time ...
    assert counts[2, 2] >= 40 and counts[3].min() > 8  # ... and the all-lanes path
    keys = logits[3].double() + ref_rng.gumbel_noise(int(seeds[3]), int(positions[3]), VOCAB)
    assert int((keys > keys.max() - 1e-6).sum()) >= 2  # full keys a few fp32 ulps apart: ties in fp32
    for temperature in (1.0, 0.5):  # powers of two: l / T is exact however the kernel divides
        params = [SamplingParams(temperature=temperature)] * len(logits)
        got = impl_sampler(logits.to(dev), params, seeds.to(dev), positions.to(dev)).cpu()
        dense = gumbel_argmax((logits / temperature).to(dev), seeds.to(dev), positions.to(dev)).cpu()
        assert got.tolist() == dense.tolist(), temperature
    # Other temperatures on CPU: the scores are l * fl(1 / T), correctly rounded here (compiled, 1 / T may differ).
    # The planted keys' intervals still start together, to fp32 rounding; -3e5 puts |m| in the margin's relative term.
    for temperature, offset in ((0.7, 0.0), (1.7, -3e5)) if dev == "cpu" else ():
        scaled = logits * temperature + offset
        scores = scaled * (torch.tensor(1.0) / torch.tensor(temperature))
        got = impl_sampler(scaled, [SamplingParams(temperature=temperature)] * len(logits), seeds, positions)
        assert got.tolist() == gumbel_argmax(scores, seeds, positions).tolist(), (temperature, offset)
    # min-p rows take the threshold pass (the same chunk refinement over s >= max + log(min_p))
    params = [SamplingParams(temperature=1.0, min_p=1e-6)] * len(logits)
    got = impl_sampler(logits.to(dev), params, seeds.to(dev), positions.to(dev)).cpu()
    s = torch.where(logits >= logits.max(dim=1, keepdim=True).values + math.log(1e-6), logits, -math.inf)
    assert got.tolist() == gumbel_argmax(s.to(dev), seeds.to(dev), positions.to(dev)).cpu().tolist()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_refined_sampler_equals_the_float64_oracle_outside_ties(impl_sampler) -> None:
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(12, VOCAB, generator=gen) * 3
    seeds = torch.randint(0, 2**62, (12,), generator=gen)
    positions = torch.randint(0, 2**31, (12,), generator=gen)
    params = [SamplingParams(temperature=t) for t in (1.0, 0.5, 2.0)] * 4
    dev = _device()
    got = impl_sampler(logits.to(dev), params, seeds.to(dev), positions.to(dev)).cpu().tolist()
    for i in range(12):
        res = reference_sample(logits[i].double(), params[i], int(seeds[i]), int(positions[i]))
        assert got[i] == res.token or res.gap < TIE_TOLERANCE, (i, got[i], res)


def test_bounds_hold_for_every_lo_word() -> None:
    """``-log(e_lo)`` bounds the fp32 noise of the interval's extreme and interior lo words from above."""
    from runnercheck.checks.chisq.gumbel_kernel import noise_from_bits

    his = [0, 1, 2, 3, 255, 2**16, 2**23 + 1, 2**24 + 3, 2**31, 2**32 - 2**13, 2**32 - 5, 2**32 - 1]
    los = [0, 1, 2**31, 2**32 - 2, 2**32 - 1]
    hi = torch.tensor([h for h in his for _ in los])
    lo = torch.tensor([w for _ in his for w in los])
    dev = _device()
    noise = noise_from_bits(hi.to(dev), lo.to(dev)).cpu().double()
    e_lo = _exp_lower(hi.to(dev)).double()
    upper = -torch.log(e_lo)
    assert bool((noise <= upper + 2.0**-20 * (1 + noise.abs())).all())
    assert float(e_lo[0]) == 0.0  # hi = 0 always stays a candidate
    tight = (hi > 2**16) & (hi < 2**31)  # bulk hi words: the bound is within the series' tail of the noise
    assert float((upper - noise)[tight].max()) < 0.02


@triton.jit
def _exp_lower_kernel(hi_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    hi = tl.load(hi_ptr + offs, mask=offs < n, other=0).to(tl.uint32)
    tl.store(out_ptr + offs, noise_exp_lower(hi), mask=offs < n)


def _exp_lower(hi: torch.Tensor) -> torch.Tensor:
    out = torch.empty(hi.shape, dtype=torch.float32, device=hi.device)
    _exp_lower_kernel[(1,)](hi, out, hi.numel(), BLOCK=triton.next_power_of_2(hi.numel()))
    return out.cpu()


# A lane whose hi word is below 2^9 (e_lo = 0: always a candidate when it can win): seed 1312, position 3,
# token 93 (hi = 189), found with `ref_rng.noise_hi` and checked in the test.
ZERO_BOUND_SEED, ZERO_BOUND_POSITION, ZERO_BOUND_TOKEN = 1312, 3, 93


@triton.jit
def _both_bounds_kernel(logits_ptr, temperature_ptr, seed_ptr, pos_ptr, by_score_ptr, by_logit_ptr, vocab,
                        CHUNK: tl.constexpr):
    """Per lane (out-of-vocab lanes included): `_key_bounds` of the scores and `_logit_key_bounds` of the logits."""
    row = tl.program_id(0)
    blk = tl.program_id(1)
    offs = blk * CHUNK + tl.arange(0, CHUNK)
    logit = tl.load(logits_ptr + row * vocab + offs, mask=offs < vocab, other=float("-inf"))
    temperature = tl.load(temperature_ptr + row)
    score = scale_by_temperature(logit, temperature)
    m = tl.max(score, axis=0)
    hi = noise_hi_chunk(tl.load(seed_ptr + row), tl.load(pos_ptr + row), blk * CHUNK, CHUNK)
    out = row * tl.num_programs(1) * CHUNK + offs
    tl.store(by_score_ptr + out, _key_bounds(score, score > float("-inf"), hi, m))
    tl.store(by_logit_ptr + out, _logit_key_bounds(logit, hi, m, temperature))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # 0 * inf, inf - inf: the NaNs the bounds must not keep
def test_logit_bounds_agree_with_the_score_bounds() -> None:
    """The first split pass's bounds from the logits (rows without penalties) are those from the scores to within
    the refinement bar's margin, and ``inf`` -- never NaN -- wherever the scores' are: a ``-inf`` logit, an
    out-of-vocab lane, a lane ~88 below the maximum, each also at a zero ``e_lo``."""
    _check_logit_bounds(_device())


@pytest.mark.gpu
def test_logit_bounds_agree_with_the_score_bounds_cuda() -> None:
    """Compiled: the fma, ``ex2.approx.ftz`` and ``min.f32`` (NaN to the other operand) of the GPU."""
    _check_logit_bounds("cuda")


def _check_logit_bounds(dev: str) -> None:
    vocab = 500  # the last chunk has 12 out-of-vocab lanes
    hi = ref_rng.noise_hi(ZERO_BOUND_SEED, ZERO_BOUND_POSITION, torch.arange(vocab))
    assert int(hi[ZERO_BOUND_TOKEN]) < 2**9
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(6, vocab, generator=gen) * 3
    logits[0, ZERO_BOUND_TOKEN] = -math.inf
    logits[1, ZERO_BOUND_TOKEN] = logits[1].max() - 100.0
    logits[2] += 1e5  # |m| large: the margin's relative term
    logits[3, :40] = -math.inf
    temperatures = torch.tensor([0.7, 1.0, 1.3, 0.05, 3.0, 1e-3])
    seeds = torch.tensor([ZERO_BOUND_SEED, ZERO_BOUND_SEED, 7, 8, ZERO_BOUND_SEED, 10])
    positions = torch.tensor([ZERO_BOUND_POSITION, ZERO_BOUND_POSITION, 1, 2, ZERO_BOUND_POSITION, 4])
    blocks = triton.cdiv(vocab, CHUNK)
    by_score = torch.empty((6, blocks * CHUNK), device=dev)
    by_logit = torch.empty_like(by_score)
    _both_bounds_kernel[(6, blocks)](logits.to(dev), temperatures.to(dev), seeds.to(dev), positions.to(dev), by_score,
                                     by_logit, vocab, CHUNK=CHUNK)
    by_score, by_logit = by_score.cpu().double(), by_logit.cpu().double()
    assert not bool(by_logit.isnan().any())
    unbounded = by_score.isinf()
    assert bool(by_logit[unbounded].isinf().all())
    assert bool(unbounded[0, ZERO_BOUND_TOKEN] and unbounded[1, ZERO_BOUND_TOKEN] and unbounded[:, vocab:].all())
    assert float(by_score[4, ZERO_BOUND_TOKEN]) == 0.0  # a finite logit at e_lo = 0: both bounds 0
    assert bool(((by_score == 0) == (by_logit == 0)).all())
    finite = ~unbounded & (by_score > 0)
    m = (logits / temperatures.view(-1, 1)).max(dim=1).values.double().view(-1, 1).expand_as(logits)
    m = torch.cat([m, m[:, : blocks * CHUNK - vocab]], dim=1)
    gap = (by_logit.log() - by_score.log()).abs()
    # the two roundings' sum (docs/SAMPLING.md "fp32 margins"), well inside the bar's 2^-11 + 2^-19 (|m| + |k|)
    assert bool((gap[finite] <= 2.0**-15 + 2.0**-21 * m.abs()[finite]).all()), float(gap[finite].max())


@triton.jit
def _no_lane_can_win(logit, hi, m, temperature):
    """A planted `_logit_key_bounds`: every bound ``inf``, so a chunk on the logits path finds no reference."""
    return tl.zeros_like(logit) + float("inf")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_penalty_free_temperature_rows_take_the_logits_path() -> None:
    """With the logits path's bounds planted to exclude every lane, the rows that take it (noisy, no penalty, a normal
    temperature) change their tokens; rows with a penalty on, or at a subnormal temperature, do not (the general
    path).  A change that routed every row to the general path would pass every other test, only slower."""
    from runnercheck.checks.chisq.impl_sampler import ImplSampler
    from runnercheck.impl.device import Device
    from runnercheck.stress.mutants.kernels import launch_variant, sampling_kernels_variant
    from runnercheck.stress.mutants.registry import AppliedMutant

    dev = _device()
    rows = 12
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(rows, VOCAB, generator=gen) * 2
    seeds = torch.randint(0, 2**62, (rows,), generator=gen)
    positions = torch.randint(0, 2**31, (rows,), generator=gen)
    params = ([SamplingParams(temperature=0.9)] * 4 + [SamplingParams(temperature=0.9, repetition_penalty=1.2)] * 4
              + [SamplingParams(temperature=1e-39)] * 4)
    probe = ImplSampler(Device(dev), VOCAB, rows_per_launch=rows, max_requests=rows)
    args = (logits.to(dev), params, seeds.to(dev), positions.to(dev))
    clean = probe(*args).cpu()
    with AppliedMutant(None) as applied:
        launch_variant(probe, applied, sampling_kernels_variant("no_lane_can_win", _logit_key_bounds=_no_lane_can_win))
        planted = probe(*args).cpu()
    assert (planted[:4] != clean[:4]).sum() >= 3
    assert planted[4:].tolist() == clean[4:].tolist()


# --------------------------------------------------------------------------- v2's mutants


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", [None, "v2_refine_top_only", "v2_lo_from_hi_stream", "v2_lo_from_accept_stream"])
def test_refinement_probe_passes_the_sampler_and_kills_each_v2_mutant(name) -> None:
    from runnercheck.checks.chisq.impl_sampler import ImplSampler
    from runnercheck.checks.chisq.refinement import collision_rows, refinement_mismatches
    from runnercheck.impl.device import Device
    from runnercheck.stress.mutants.kernels import launch_variant, v2_kernel_variant
    from runnercheck.stress.mutants.registry import AppliedMutant

    dev = _device()
    probe = ImplSampler(Device(dev), VOCAB, rows_per_launch=8, max_requests=8)
    logits, _, _ = collision_rows(VOCAB, 8)
    assert bool(((logits > -30.0).sum(dim=1) >= 2).all())  # every row holds a planted near-collision
    if name is None:
        assert refinement_mismatches(probe, VOCAB, rows=8, device=dev) == []
        return
    with AppliedMutant(None) as applied:
        launch_variant(probe, applied, v2_kernel_variant(name))
        assert len(refinement_mismatches(probe, VOCAB, rows=8, device=dev)) >= 2, name
    assert refinement_mismatches(probe, VOCAB, rows=8, device=dev) == []  # undone


@pytest.mark.gpu
def test_refinement_probe_at_the_full_vocabulary_cuda() -> None:
    """Compiled: the probe passes the sampler and kills each v2 mutant at [64, 151936]."""
    from runnercheck.checks.chisq.impl_sampler import ImplSampler
    from runnercheck.checks.chisq.refinement import refinement_mismatches
    from runnercheck.impl.device import Device
    from runnercheck.stress.mutants.kernels import V2_KERNEL_MUTANTS, launch_variant, v2_kernel_variant
    from runnercheck.stress.mutants.registry import AppliedMutant

    vocab = 151936
    probe = ImplSampler(Device("cuda"), vocab, max_requests=64)
    assert refinement_mismatches(probe, vocab, rows=64, device="cuda") == []
    for name in V2_KERNEL_MUTANTS:
        with AppliedMutant(None) as applied:
            launch_variant(probe, applied, v2_kernel_variant(name))
            assert len(refinement_mismatches(probe, vocab, rows=64, device="cuda")) >= 8, name


@pytest.mark.gpu
def test_refined_sampler_equals_the_dense_argmax_at_the_full_vocabulary_cuda() -> None:
    from runnercheck.checks.chisq.impl_sampler import ImplSampler
    from runnercheck.impl.device import Device

    vocab, rows = 151936, 64
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    logits[::4] = torch.round(logits[::4])  # exact logit ties
    seeds = torch.randint(0, 2**62, (rows,), generator=gen)
    positions = torch.randint(0, 2**31, (rows,), generator=gen)
    probe = ImplSampler(Device("cuda"), vocab, max_requests=rows)
    for temperature in (1.0, 0.25):  # powers of two: l / T is exact however the kernel divides
        got = probe(logits.cuda(), [SamplingParams(temperature=temperature)] * rows, seeds.cuda(), positions.cuda())
        dense = gumbel_argmax((logits / temperature).cuda(), seeds.cuda(), positions.cuda())
        assert got.cpu().tolist() == dense.cpu().tolist(), temperature
