"""checks/chisq/spec.py: the twin equals the oracle and the kernel, the exact laws, the planted biases."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from runnercheck.checks.chisq import spec as cs
from runnercheck.checks.chisq import stats
from runnercheck.reference.spec_verify import verify as oracle_verify

ALPHA = 0.01


def _random_requests(n: int, k: int, vocab: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(0, 5, (n, k + 1, vocab), generator=gen).to(torch.float64)
    w[..., 0] += 1.0
    p = w / w.sum(dim=2, keepdim=True)
    wq = torch.randint(0, 5, (n, k, vocab), generator=gen).to(torch.float64)
    wq[..., -1] += 1.0
    q = wq / wq.sum(dim=2, keepdim=True)
    same = torch.rand(n, k, generator=gen) < 0.3  # q_i == p_i on some rows
    q = torch.where(same.unsqueeze(2), p[:, :k], q)
    drafts = torch.randint(0, vocab, (n, k), generator=gen)
    seeds = torch.randint(0, 2**62, (n,), generator=gen)
    positions = torch.randint(0, 2**31, (n,), generator=gen)
    return p, drafts, q, seeds, positions


@pytest.mark.parametrize("k", [0, 1, 3])
def test_twin_equals_the_oracle(k: int) -> None:
    p, drafts, q, seeds, positions = _random_requests(60, k, 7, seed=k)
    tokens, accepted = cs.SpecTwin()(p, drafts, q, seeds, positions)
    for i in range(60):
        ref = oracle_verify(p[i], drafts[i].tolist(), q[i], seed=int(seeds[i]), position=int(positions[i]), temperature=1.0)
        assert int(accepted[i]) == ref.accepted
        assert tuple(tokens[i, : ref.accepted + 1].tolist()) == ref.tokens
        assert (tokens[i, ref.accepted + 1 :] == -1).all()


def test_twin_equals_the_interpreted_kernel() -> None:
    p, drafts, q, seeds, positions = _random_requests(40, 2, 6, seed=11)
    twin = cs.SpecTwin()(p, drafts, q, seeds, positions)
    kernel = cs.KernelVerifier("cpu", max_num_reqs=16)(p.float().double(), drafts, q.float().double(), seeds, positions)
    assert torch.equal(twin[0], kernel[0]) and torch.equal(twin[1], kernel[1])


def test_exact_laws_are_distributions() -> None:
    for case in cs.build_spec_cases(True):
        assert case.expected_joint().sum() == pytest.approx(1.0)
        lengths = case.expected_lengths()
        assert lengths.sum() == pytest.approx(1.0) and (lengths >= -1e-12).all()
    equal = {c.name: c for c in cs.build_spec_cases(True)}["spec-q-equal-k2-v6"]
    assert equal.expected_lengths()[-1] == pytest.approx(1.0)  # q == p: every draft accepted


def test_the_length_law_matches_the_oracle_by_enumeration() -> None:
    """k = 1: P(accept) = sum_t min(p_t, q_t), counted over many oracle draws of the proposer's token."""
    case = {c.name: c for c in cs.build_spec_cases(True)}["spec-q-near-k2-v6"]
    case = cs.SpecCase("near-k1", case.target, case.draft, 1500, k=1)
    _, lengths = cs.draw_spec(case, cs.SpecTwin(), seed=4, position_offset=10)
    result = stats.chisquare_test(stats.token_counts(lengths - 1, 2), case.expected_lengths(), name="len", alpha=ALPHA)
    assert result.passed


def test_correct_twin_passes_every_case() -> None:
    results = cs.run_spec_cases(cs.SpecTwin(), quick=True, seed=0, alpha=ALPHA, correction="holm")
    assert len(results) == 2 * len(cs.build_spec_cases(True))
    assert all(r.passed for r in results), [(r.name, r.p_value) for r in results if not r.passed]


@pytest.mark.stats
def test_interpreted_kernel_passes_a_small_case() -> None:
    """The kernel itself (interpreted, ~20 ms a request on CPU) in the harness: 800 requests of q near p."""
    case = {c.name: c for c in cs.build_spec_cases(True)}["spec-q-near-k2-v6"]
    pairs, lengths = cs.draw_spec(case, cs.KernelVerifier("cpu", max_num_reqs=800), seed=9, position_offset=77,
                                  n_samples=800)
    results = cs.evaluate_spec(case, pairs, lengths, ALPHA)
    assert stats.family_min_p(results) >= ALPHA, [(r.name, r.p_value) for r in results]


@pytest.mark.gpu
def test_kernel_passes_every_case_on_cuda() -> None:
    """The kernel at every case's full quick size on the GPU (the chisq default there)."""
    results = cs.run_spec_cases(cs.KernelVerifier("cuda"), quick=True, seed=0, alpha=ALPHA, correction="holm")
    assert all(r.passed for r in results), [(r.name, r.p_value) for r in results if not r.passed]


@pytest.mark.parametrize("bias", list(cs.SPEC_BIASES))
def test_each_planted_bias_is_caught_at_the_quick_size(bias: str) -> None:
    """A test must be able to fail: each planted bias, one run, rejected on its case."""
    power = cs.run_spec_power(quick=True, seed=1, alpha=ALPHA, repeats=1, biases=(bias,))
    assert len(power) == 1 and power[0].rejections == 1, power


@pytest.mark.stats
@pytest.mark.parametrize("bias", list(cs.SPEC_BIASES))
def test_planted_bias_power_is_at_least_099(bias: str) -> None:
    """Five repeats at the case's size all reject, and the noncentral chi-square power estimate of the
    family's strongest test (Bonferroni level) is >= 0.99 in every repeat."""
    spec = cs.SPEC_BIASES[bias]
    case = {c.name: c for c in cs.build_spec_cases(True)}[spec.case]
    estimates = []
    for r in range(5):
        pairs, lengths = cs.draw_spec(case, cs.SpecTwin(spec.variant), seed=1000 + r, position_offset=r * 10**7)
        results = cs.evaluate_spec(case, pairs, lengths, ALPHA)
        assert stats.family_min_p(results) < ALPHA, [(t.name, t.p_value) for t in results]
        estimates.append(max(cs.power_estimate(t, ALPHA / len(results)) for t in results))
    print(f"{bias}: power estimate >= {min(estimates):.6f} at n = {case.n_samples}")
    assert min(estimates) >= 0.99


@pytest.mark.stats
def test_correct_twin_passes_over_seeds() -> None:
    """Calibration side: the unbiased twin over 20 seeds rejects (Holm over all cases) at most twice."""
    failures = sum(not all(r.passed for r in cs.run_spec_cases(cs.SpecTwin(), quick=True, seed=s, alpha=ALPHA,
                                                                 correction="holm")) for s in range(20))
    assert failures <= 2


def test_power_estimate_is_small_for_a_correct_sampler() -> None:
    case = cs.build_spec_cases(True)[1]
    pairs, lengths = cs.draw_spec(case, cs.SpecTwin(), seed=3, position_offset=0, n_samples=20_000)
    assert min(cs.power_estimate(t, ALPHA) for t in cs.evaluate_spec(case, pairs, lengths, ALPHA)) < 0.5


def test_variant_names_are_checked() -> None:
    with pytest.raises(ValueError):
        cs.SpecVariant(accept="nope")


def test_cli_runs_spec_cases_and_biases(tmp_path) -> None:
    from runnercheck.stress.cli.main import main

    rc = main(["chisq", "--quick", "--cases", "spec-q-near", "--no-calibration", "--biases", "spec-residual-abs",
               "--device", "cpu", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "chisq.json").read_text())
    names = {t["name"] for t in report["builtin_tests"]}
    assert rc == 0 and report["tests"] == [] and names == {"spec-q-near-k2-v6/first-two-joint", "spec-q-near-k2-v6/emitted-length"}
    assert [(p["bias"], p["rejections"]) for p in report["power"]] == [("spec-residual-abs", 1)]
    # With the spec cases off, the filter matches no case at all: a usage error, nothing written.
    rc = main(["chisq", "--quick", "--cases", "spec-q-near", "--no-calibration", "--no-power", "--no-spec",
               "--device", "cpu", "--out", str(tmp_path / "none")])
    assert rc == 2 and not (tmp_path / "none").exists()


def test_joint_of_the_first_two_tokens_exposes_a_wrong_second_token() -> None:
    """Sanity of the harness: emitting the draft's second token unconditionally is caught."""
    case = cs.build_spec_cases(True)[0]

    def always_accept(p, drafts, q, seeds, positions):
        n, k = drafts.shape
        tokens = torch.cat([drafts, torch.zeros(n, 1, dtype=torch.int64)], dim=1)
        return tokens, torch.full((n,), k, dtype=torch.int64)

    pairs, lengths = cs.draw_spec(case, always_accept, seed=2, position_offset=0, n_samples=5000)
    assert not cs.evaluate_spec(case, pairs, lengths, ALPHA)[0].passed
    assert np.all(lengths == case.k + 1)
