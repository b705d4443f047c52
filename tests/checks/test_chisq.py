"""checks/chisq/samplers.py and checks/chisq/run.py: the baselines, the loader, the quick run and its self-tests.

The quick run (matrix + calibration + power + report) is done once per module and inspected by
several tests; it is the same call `runnercheck verify` makes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import pytest
import torch

from runnercheck.checks.chisq import draws as chisq_draws
from runnercheck.checks.chisq import execute as chisq_execute
from runnercheck.checks.chisq import plan as chisq_plan
from runnercheck.checks.chisq import run as chisq
from runnercheck.checks.chisq import cases as chisq_cases
from runnercheck.checks.chisq import samplers
from runnercheck.checks.chisq import stats
from runnercheck.checks.chisq.samplers import GumbelSampler, TokenHistory, load_sampler
from runnercheck.impl.interface import SamplingParams
from runnercheck.reference.rng import gumbel_noise as reference_noise
from runnercheck.reference.rng import noise_bits
from runnercheck.reference.sampler import sample as reference_sample


# --------------------------------------------------------------------------- the baseline sampler


def test_philox_bits_match_the_reference_rng() -> None:
    seeds = torch.tensor([0, 1, 2**32 + 7, 2**63 - 1])
    positions = torch.tensor([0, 5, 2**31, 2**32 - 1])
    hi, lo = samplers.philox_bits(seeds, positions, 300)
    for i in range(4):
        ref_hi, ref_lo = noise_bits(int(seeds[i]), int(positions[i]), torch.arange(300))
        assert torch.equal(hi[i], ref_hi) and torch.equal(lo[i], ref_lo)


def test_noise_variants_reach_what_their_bits_allow() -> None:
    hi = torch.tensor([[0, 0, 1 << 8, 2**32 - 1]])
    lo = torch.tensor([[0, 2**32 - 1, 0, 2**32 - 1]])
    u64 = samplers.gumbel_noise(hi, lo, "u64")
    assert float(u64[0, 0]) > 44.0  # hi = lo = 0: u = 2^-65, noise 65 ln 2
    np.testing.assert_allclose(u64[0].double(), reference_noise_from_bits(hi[0], lo[0]), rtol=2e-6, atol=2e-6)
    assert float(samplers.gumbel_noise(hi, lo, "u32").max()) == pytest.approx(33 * math.log(2), abs=1e-3)
    assert float(samplers.gumbel_noise(hi, lo, "floor31").max()) == pytest.approx(31 * math.log(2), abs=1e-3)
    u24 = samplers.gumbel_noise(hi, lo, "u24")
    assert math.isinf(float(u24[0, 0])) and math.isfinite(float(u24[0, 2]))
    assert math.isinf(float(samplers.gumbel_noise(hi, lo, "fp16")[0, 0]))


def reference_noise_from_bits(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    from runnercheck.reference.rng import gumbel_from_bits

    return gumbel_from_bits(hi, lo)


def test_baseline_noise_matches_the_reference_in_fp32() -> None:
    hi, lo = samplers.philox_bits(torch.tensor([77]), torch.tensor([12]), 5000)
    ours = samplers.gumbel_noise(hi, lo)[0].double()
    ref = reference_noise(77, 12, 5000)
    winning = ref > 1  # u < 0.31: fp32 keeps full relative precision of the winning noise there
    np.testing.assert_allclose(ours[winning], ref[winning], rtol=2e-6)
    np.testing.assert_allclose(ours, ref, atol=1e-3)  # near u = 1, fp32 rounds 1 - u coarsely


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(temperature=0.6, top_k=7),
        SamplingParams(temperature=1.4, top_p=0.6, min_p=0.02),
        SamplingParams(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=-0.3),
        SamplingParams(temperature=0.0, repetition_penalty=2.0),
    ],
)
def test_gumbel_baseline_picks_the_oracles_tokens(params: SamplingParams) -> None:
    """Token for token equal to reference.sampler.sample, except where the oracle reports a tie."""
    gen = torch.Generator().manual_seed(3)
    rows, vocab = 60, 211
    logits = torch.randn(rows, vocab, generator=gen) * 2.5
    logits[5, 17] = float("inf")
    logits[6] = float("-inf")
    logits[7, 3] = float("nan")
    history = TokenHistory(prompt_ids=(1, 2, 3, 17), output_ids=(4, 4, 9, 200, 17))
    seeds = torch.randint(0, 2**62, (rows,), generator=gen)
    positions = torch.randint(0, 2**31, (rows,), generator=gen)
    got = GumbelSampler()(logits, [params] * rows, seeds, positions, history=[history] * rows)
    for i in range(rows):
        ref = reference_sample(logits[i], params, int(seeds[i]), int(positions[i]), history.prompt_ids, history.output_ids)
        assert int(got[i]) == ref.token or ref.gap < 1e-3 or ref.fragile, f"row {i}"


def test_single_row_baseline_is_the_batched_one() -> None:
    """`samplers.sample_row` (the fp32 baseline of host-side runners) picks what `GumbelSampler` picks."""
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(40, 97, generator=gen) * 2.0
    logits[3, 11] = float("nan")
    params = SamplingParams(temperature=0.9, top_k=30, top_p=0.85, min_p=0.02, repetition_penalty=1.3,
                            frequency_penalty=0.4, presence_penalty=-0.2)
    history = TokenHistory(prompt_ids=(1, 5, 9), output_ids=(5, 5, 60))
    seeds = torch.randint(0, 2**62, (40,), generator=gen)
    positions = torch.arange(40) * 7
    batched = GumbelSampler()(logits, [params] * 40, seeds, positions, history=[history] * 40)
    rows = [samplers.sample_row(logits[i], params, int(seeds[i]), int(positions[i]), history.prompt_ids, history.output_ids)
            for i in range(40)]
    assert rows == batched.tolist()


def test_shared_noise_bug_needs_rows_of_one_request() -> None:
    logits = torch.zeros(6, 50)
    params = [SamplingParams()] * 6
    seeds = torch.full((6,), 9)
    positions = torch.arange(6)
    biased = samplers.planted_sampler("draft-shared-noise")
    same_request = biased(logits, params, seeds, positions, request_index=torch.tensor([0, 0, 0, 1, 1, 1]))
    assert same_request[0] == same_request[1] == same_request[2] and same_request[3] == same_request[4]
    assert torch.equal(biased(logits, params, seeds, positions), GumbelSampler()(logits, params, seeds, positions))


def test_cases_have_no_fragile_boundaries() -> None:
    """fp32 samplers and the float64 oracle must agree on every kept set the matrix tests."""
    for case in chisq_cases.build_cases(quick=True):
        for j in range(case.rows):
            result = reference_sample(case.logits[j], case.params, 1, 0, case.history.prompt_ids, case.history.output_ids)
            assert not result.fragile, case.name


# --------------------------------------------------------------------------- loading samplers


def test_load_sampler_builtins_and_module_paths() -> None:
    assert isinstance(load_sampler("gumbel"), GumbelSampler)
    assert load_sampler("torch") is samplers.torch_multinomial_sampler
    assert load_sampler("bias-top-k-off-by-one").variant.top_k_offset == 1
    assert load_sampler("runnercheck.checks.chisq.samplers:torch_multinomial_sampler") is samplers.torch_multinomial_sampler


@pytest.mark.parametrize(
    "spec, error",
    [
        ("", samplers.SamplerSpecError),
        ("nonsense", samplers.SamplerSpecError),
        ("a:b:c", samplers.SamplerSpecError),
        (":fn", samplers.SamplerSpecError),
        ("no_such_module_xyz:fn", samplers.SamplerNotFoundError),
        ("runnercheck.checks.chisq.samplers:no_such_function", samplers.SamplerNotFoundError),
        ("runnercheck.checks.chisq.samplers:MASK32", samplers.SamplerNotCallableError),
        ("bias-no-such-bias", samplers.SamplerSpecError),
    ],
)
def test_load_sampler_errors_are_typed(spec: str, error: type) -> None:
    with pytest.raises(error):
        load_sampler(spec)


def test_impl_sampler_reports_when_unavailable(monkeypatch) -> None:
    from runnercheck.checks.chisq.impl_sampler import ImplSampler

    monkeypatch.setitem(sys.modules, "runnercheck.impl.sample", None)  # import of impl.sample now fails
    with pytest.raises(samplers.SamplerUnavailableError):
        ImplSampler()(torch.zeros(1, 4), [SamplingParams()], torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))


def test_impl_sampler_on_a_given_device_exposes_the_sampler_it_launches() -> None:
    """``ImplSampler(device, vocab)``: the adapter mutants patch (`sampler`), other vocabularies declined."""
    from runnercheck.checks.chisq.impl_sampler import ImplSampler, impl_sampler_available
    from runnercheck.impl.device import Device

    if not impl_sampler_available():
        pytest.skip("runnercheck.impl.sample not built")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("the sampler kernel on CPU tensors needs TRITON_INTERPRET=1")
    adapter = ImplSampler(Device("cpu"), 64, rows_per_launch=2, max_requests=1)
    logits = torch.zeros(3, 64)
    logits[:, 7] = 50.0
    args = (logits, [SamplingParams()] * 3, torch.full((3,), 5), torch.arange(3))
    assert adapter(*args).tolist() == [7, 7, 7]
    launched = []
    real = adapter.sampler.sample
    adapter.sampler.sample = lambda *a, **k: launched.append(k["num_rows"]) or real(*a, **k)
    assert adapter(*args).tolist() == [7, 7, 7] and launched == [2, 1]
    with pytest.raises(samplers.SamplerUnsupportedError, match="vocabulary 64, not 32"):
        adapter(torch.zeros(1, 32), [SamplingParams()], torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    with pytest.raises(AttributeError):
        ImplSampler().sampler
    with pytest.raises(ValueError):
        ImplSampler(Device("cpu"))


def test_impl_sampler_agrees_with_the_baseline() -> None:
    from runnercheck.checks.chisq.impl_sampler import ImplSampler, impl_sampler_available

    if not impl_sampler_available():
        pytest.skip("runnercheck.impl.sample is not built")
    gen = torch.Generator().manual_seed(8)
    rows = 16  # interpreted on CPU: each row is one ~0.1-0.3 s kernel program
    logits = torch.randn(rows, 97, generator=gen) * 2
    params = [SamplingParams(top_k=20)] * (rows // 2) + [SamplingParams(temperature=0.7, top_p=0.8)] * (rows // 2)
    seeds = torch.tensor([5] * (rows // 2) + [6] * (rows // 2))
    positions = torch.arange(rows) + 1000
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    got = ImplSampler()(logits.to(dev), params, seeds.to(dev), positions.to(dev))
    assert torch.equal(got.cpu(), GumbelSampler()(logits, params, seeds, positions))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter evaluates both sides of tl.where
def test_fused_kernel_matches_the_pytorch_path() -> None:
    from runnercheck.checks.chisq.gumbel_kernel import FUSED_VARIANTS, gumbel_argmax, noise_from_bits

    hi = torch.tensor([0, 0, 255, 256, 2**31, 2**32 - 1, 12345])
    lo = torch.tensor([0, 2**32 - 1, 7, 0, 5, 2**32 - 1, 99])
    gen = torch.Generator().manual_seed(1)
    scores = torch.randn(5, 700, generator=gen) * 3
    scores[1, ::3] = -math.inf
    scores[2] = -math.inf
    seeds, positions = torch.randint(0, 2**62, (5,), generator=gen), torch.randint(0, 2**31, (5,), generator=gen)
    bits = samplers.philox_bits(seeds, positions, 700)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # compiled on a GPU, interpreted on CPU
    for variant in FUSED_VARIANTS:
        fused_noise = noise_from_bits(hi.to(dev), lo.to(dev), variant).cpu()
        np.testing.assert_allclose(fused_noise, samplers.gumbel_noise(hi, lo, variant), rtol=1e-6, atol=2e-6)
        expected = torch.argmax(torch.where(scores > -math.inf, scores + samplers.gumbel_noise(*bits, variant), -math.inf), dim=1)
        got = gumbel_argmax(scores.to(dev), seeds.to(dev), positions.to(dev), variant).cpu()
        assert torch.equal(got, expected), variant


def test_plain_adapter_rejects_penalties_and_is_skipped_on_them() -> None:
    with pytest.raises(samplers.SamplerUnsupportedError):
        samplers.torch_multinomial_sampler(torch.zeros(1, 4), [SamplingParams(presence_penalty=0.5)],
                                           torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    case = next(c for c in chisq_cases.build_cases(True) if samplers.has_penalties(c.params))
    assert chisq_draws.sampler_can_run(samplers.torch_multinomial_sampler, case) is not None


# --------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("chisq")
    torch.set_num_threads(1)
    return out, chisq.run_quick(out, "gumbel")


def test_quick_run_passes_with_the_baseline(quick_run) -> None:
    _, summary = quick_run
    assert summary["passed"], [t["name"] for t in summary["tests"] if not t["passed"]]
    assert summary["num_tests"] >= 20 and not summary["skipped"]


def test_quick_calibration_within_band(quick_run) -> None:
    calibration = quick_run[1]["calibration"]
    assert calibration["passed"] and calibration["runs"] == 40
    assert calibration["band"][0] <= calibration["rejections"] <= calibration["band"][1]


def test_every_quick_planted_bias_is_rejected(quick_run) -> None:
    power = {p["bias"]: p for p in quick_run[1]["power"]}
    from runnercheck.checks.chisq.spec import SPEC_BIASES

    assert set(power) == set(chisq_cases.power_plan(True, torch.device("cpu"))) | set(SPEC_BIASES)
    assert {"top-k-off-by-one", "top-p-drop-boundary", "top-p-extra-token", "temperature-twice",
            "penalty-wrong-sign", "draft-shared-noise", "bf16-noise"} <= set(power)
    for bias, p in power.items():
        assert p["power"] == 1.0, bias


def test_report_files_are_written_and_valid(quick_run) -> None:
    out, _ = quick_run
    data = json.loads((out / "chisq.json").read_text())
    assert data["passed"] and data["tests"][0]["bins"]
    for t in data["tests"]:
        assert {"name", "config", "statistic", "dof", "p_value", "adjusted_p_value", "n_samples", "passed"} <= set(t)
    assert data["calibration"]["p_values"] and data["power"]
    assert "| test |" in (out / "chisq.md").read_text()
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3


def test_plain_pytorch_adapter_passes() -> None:
    opts = chisq_plan.RunOptions(quick=True, seed=3, calibration=False, power=False)
    results, skipped = chisq_execute.run_matrix(samplers.torch_multinomial_sampler, opts, torch.device("cpu"), lambda *a: None)
    assert all(r.passed for r in results), [r.name for r in results if not r.passed]
    assert {s["case"] for s in skipped} == {c.name for c in chisq_cases.build_cases(True) if samplers.has_penalties(c.params)}


def test_cli_exit_status_follows_the_verdict(tmp_path) -> None:
    from runnercheck.stress.cli.main import main

    common = ["chisq", "--quick", "--cases", "top-k", "--no-calibration", "--no-power", "--device", "cpu"]
    assert main(common + ["--sampler", "gumbel", "--out", str(tmp_path / "ok")]) == 0
    assert main(common + ["--sampler", "bias-top-k-off-by-one", "--out", str(tmp_path / "bad")]) == 1
    bad = json.loads((tmp_path / "bad" / "chisq.json").read_text())
    assert bad["tests"][0]["impossible_tokens"]


def test_cli_rejects_bad_arguments_with_status_2(tmp_path, capsys) -> None:
    from runnercheck.stress.cli.main import main

    assert main(["chisq", "--quick", "--sampler", "no_such_module_xyz:f", "--out", str(tmp_path)]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["chisq", "--quick", "--samples", "0", "--out", str(tmp_path)]) == 2
    assert main(["chisq", "--quick", "--biases", "no-such-bias", "--out", str(tmp_path)]) == 2
    assert "unknown --biases no-such-bias" in capsys.readouterr().err
    assert main(["chisq", "--quick", "--power-repeats", "0", "--out", str(tmp_path)]) == 2
    assert not (tmp_path / "chisq.json").exists()


def test_cli_power_only_run_of_chosen_biases(tmp_path) -> None:
    from runnercheck.stress.cli.main import main

    rc = main(["chisq", "--quick", "--no-matrix", "--no-calibration", "--biases", "top-k-off-by-one",
               "--power-repeats", "2", "--device", "cpu", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "chisq.json").read_text())
    assert rc == 0 and report["tests"] == []
    assert report["sampler"] == "none (planted biases only)"
    assert [(p["bias"], p["repeats"], p["rejections"]) for p in report["power"]] == [("top-k-off-by-one", 2, 2)]


def test_cli_arguments_are_declared() -> None:
    parser = argparse.ArgumentParser()
    chisq.add_arguments(parser)
    args = parser.parse_args(["--quick", "--samples", "10", "--sampler", "torch", "--seed", "4", "--out", "x"])
    assert args.quick and args.samples == 10 and args.seed == 4


# --------------------------------------------------------------------------- heavier power checks


@pytest.mark.stats
@pytest.mark.parametrize("bias", ["u24-uniform", "fp16-noise"])
def test_inf_noise_biases_are_rejected_on_cpu(bias: str) -> None:
    """~2e8 token-draws each: +inf noise (2^-24 / 2^-25 per token) shows in a 2^15-token probe."""
    result = chisq_execute.run_power(chisq_plan.RunOptions(quick=True), torch.device("cpu"), lambda *a: None, biases=[bias])[0]
    assert result.power == 1.0


@pytest.mark.gpu
@pytest.mark.stats
@pytest.mark.parametrize("bias", ["u31-floor", "u32-uniform"])
def test_capped_noise_biases_are_rejected_on_gpu(bias: str) -> None:
    """~1e12 token-draws: noise capped near 21.5 / 22.9 loses most hits of a tail 24 logits down."""
    case, _ = chisq_cases.power_cases()[bias]
    seed, offset = chisq_cases.case_seed(0, f"power:{bias}")
    started = time.perf_counter()
    tokens = chisq_draws.draw(samplers.planted_sampler(bias), case, seed=seed, position_offset=offset, device=torch.device("cuda"))
    results = chisq_draws.evaluate(case, tokens, chisq_draws.expected_rows(case), 0.01)
    for r in results:
        print(f"{bias} {r.name}: p={r.p_value:.3g} {r.notes} ({time.perf_counter() - started:.1f} s)")
    assert stats.family_min_p(results) < 0.01


@pytest.mark.gpu
@pytest.mark.stats
def test_deep_tails_pass_with_the_baseline_on_gpu() -> None:
    sampler = GumbelSampler()
    for case in chisq_cases.deep_tail_cases():
        seed, offset = chisq_cases.case_seed(0, case.name)
        started = time.perf_counter()
        tokens = chisq_draws.draw(sampler, case, seed=seed, position_offset=offset, device=torch.device("cuda"))
        results = chisq_draws.evaluate(case, tokens, chisq_draws.expected_rows(case), 0.01)
        for r in results:
            print(f"{r.name}: p={r.p_value:.3g} {r.notes} ({time.perf_counter() - started:.1f} s)")  # for docs/CHISQ.md
        assert all(r.passed for r in results), [(r.name, r.notes) for r in results]


@pytest.mark.gpu
def test_impl_sampler_reads_logits_written_on_the_callers_stream() -> None:
    """The adapter's kernels run on the runner's stream; the caller's logits come from its own.

    Without ordering the two (H200, this session) the kernels read stale logits and positions:
    one call drew the same tail token in all 2048 rows.
    """
    from runnercheck.checks.chisq.impl_sampler import ImplSampler

    sampler = ImplSampler()
    params = [SamplingParams(temperature=0.0)] * 8192
    for i in range(10):
        logits = torch.randn(8192, 4097, device="cuda") * (i + 1)  # new values on the default stream
        seeds = torch.full((8192,), i, dtype=torch.int64, device="cuda")
        positions = torch.arange(8192, dtype=torch.int64, device="cuda") + i * 8192
        tokens = sampler(logits, params, seeds, positions)
        assert torch.equal(tokens.cpu(), logits.argmax(dim=1).cpu()), i


def test_shards_partition_the_matrix_and_the_biases_and_shard_0_keeps_the_calibration(tmp_path) -> None:
    """The two shards' runs, against the whole quick campaign's plan (its matrix and its planted biases)."""
    from runnercheck.checks.chisq.cases import build_cases, power_plan
    from runnercheck.stress.cli.main import main

    def names(*extra: str) -> tuple[set, set, dict]:
        out = tmp_path / "-".join(extra).replace("/", "of")
        assert main(["chisq", "--quick", "--no-spec", "--device", "cpu", "--out", str(out), *extra]) == 0
        doc = json.loads((out / "chisq.json").read_text())
        cases = {t["config"]["case"] for t in doc["tests"]} | {s["case"] for s in doc["skipped"]}
        return cases, {p["bias"] for p in doc["power"]}, doc

    whole_cases = {c.name for c in build_cases(quick=True)}
    whole_biases = set(power_plan(True, torch.device("cpu")))
    first_cases, first_biases, first = names("--shard", "0/2")
    second_cases, second_biases, second = names("--shard", "1/2")
    assert first_cases.isdisjoint(second_cases) and first_cases | second_cases == whole_cases
    assert first_biases.isdisjoint(second_biases) and first_biases | second_biases == whole_biases
    assert first["calibration"] is not None and second["calibration"] is None
    assert (first["shard"], second["shard"]) == ("0/2", "1/2")
