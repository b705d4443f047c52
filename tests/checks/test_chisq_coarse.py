"""Coarse arithmetic the quick mode cannot see: fp16 probabilities and 16-bit uniforms in inverse-CDF sampling.

The power numbers are computed (`runnercheck.checks.chisq.power_table`); the 16-bit-uniform bias is rejected on
CPU in its full-mode probe while the same sampler with full-precision arithmetic passes it; the fp16 bias needs
~1.3e10 token-draws, so its rejection is a gpu test (and the ci/h200.sh job chisq_coarse over seeds)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from runnercheck.checks.chisq import power_table as pt
from runnercheck.checks.chisq import draws as chisq_draws
from runnercheck.checks.chisq import execute as chisq_execute
from runnercheck.checks.chisq.cases import coarse_probe_cases, power_cases
from runnercheck.checks.chisq.planted_cdf import InverseCdfSampler
from runnercheck.checks.chisq.samplers import planted_sampler

PROBES = {c.name: c for c in coarse_probe_cases()}


def test_the_alternatives_are_what_the_planted_samplers_do() -> None:
    p = np.array([0.5, 0.5 - 3 * 1.25 * 2.0**-24] + [1.25 * 2.0**-24] * 3)
    assert np.allclose(pt.fp16_probabilities(p)[2:] * p[:2].sum() / pt.fp16_probabilities(p)[:2].sum(), 2.0**-24)
    q = pt.uniform_bits(16)(np.array([1 - 4 * 2.5 / 65536] + [2.5 / 65536] * 4))
    assert sorted(set(np.round(q[1:] * 65536).astype(int))) == [2, 3] and abs(q.sum() - 1) < 1e-12


def test_quick_mode_cannot_detect_them_and_the_full_probes_can() -> None:
    for r in pt.mode_rows(quick=True):
        assert r["power"] < 0.01 and (r["draws_for_0.8"] is None or r["draws_for_0.8"] > 1e7), r
    for bias, case in (("fp16-probabilities", "fp16-probe-65536-v65537"), ("u16-uniform", "u16-probe-4096-v4097")):
        assert power_cases()[bias][0].name == case
        assert pt.case_power(PROBES[case], bias) >= 0.95


def _rejects(sampler, case, seed) -> bool:
    tokens = chisq_draws.draw(sampler, case, seed=seed, position_offset=0, device=torch.device("cpu"))
    return min(r.p_value for r in chisq_draws.evaluate(case, tokens, chisq_draws.expected_rows(case), 0.01)) < 0.01 / 2


def test_sixteen_bit_uniforms_are_rejected_and_full_precision_passes() -> None:
    case = PROBES["u16-probe-4096-v4097"]
    with chisq_execute.single_threaded_on_cpu(torch.device("cpu")):
        assert _rejects(planted_sampler("u16-uniform"), case, seed=3)
        assert not _rejects(InverseCdfSampler(), case, seed=3)


@pytest.mark.gpu
def test_fp16_probabilities_are_rejected_in_full_mode_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    case = PROBES["fp16-probe-65536-v65537"]
    tokens = chisq_draws.draw(planted_sampler("fp16-probabilities"), case, seed=1, position_offset=0, device=torch.device("cuda"))
    assert min(r.p_value for r in chisq_draws.evaluate(case, tokens, chisq_draws.expected_rows(case), 0.01)) < 0.005
    tokens = chisq_draws.draw(InverseCdfSampler(), case, seed=1, position_offset=0, device=torch.device("cuda"))
    assert min(r.p_value for r in chisq_draws.evaluate(case, tokens, chisq_draws.expected_rows(case), 0.01)) >= 0.005
