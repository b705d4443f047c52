"""The mutant catalogue (`runnercheck.stress.mutants.catalogue`) and `runnercheck mutants` (`runnercheck.stress.cli.mutants_cmd`).

The CI test runs the whole quick catalogue on ``sim`` and asserts every CPU-manifesting mutant is
killed by the check it was built for, with clean controls.  The others prove the harness can fail:
a mutant that changes nothing survives, a kill by the wrong check is not "as designed", a control
that fires fails the run, and applying/undoing a mutant leaves no trace.
"""
from __future__ import annotations

import json
from dataclasses import replace
from types import ModuleType

import pytest
import torch

import runnercheck.impl.draft_proposer as draft_proposer_module
import runnercheck.impl.eager_step as eager_step_module
import runnercheck.impl.runner as runner_module
import runnercheck.impl.sample.sampler as sampler_module
from runnercheck.checks.chisq.cases import power_cases
from runnercheck.impl.device import Device
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.stress.cli import main as cli
from runnercheck.stress.mutants import catalogue
from runnercheck.stress.mutants.catalogue import CATALOGUE, CLASSES, WORKLOADS, MutantTargetError, UnknownMutantError, known_checks
from runnercheck.stress.cli.mutants_cmd import MutantsOptions, run_catalogue, run_differential
from runnercheck.stress.mutants.report import ControlResult, MutantResult, MutantsReport, markdown
from runnercheck.stress.run.runners import simple_runner
from runnercheck.stress.run.config import default_limits


@pytest.fixture
def micro_runner():
    config = preset("micro")
    return runner_module.make_runner(random_weights(config, seed=0), default_limits(config), Device("sim", seed=0))


# --------------------------------------------------------------------------- the catalogue


def test_catalogue_covers_every_class_and_names_the_required_mutants():
    assert len(CATALOGUE) >= 18
    by_class = {c: [m.name for m in CATALOGUE.values() if m.cls == c] for c in CLASSES}
    assert all(by_class[c] for c in CLASSES), by_class
    assert {"reuse_staging_early", "stale_row_after_preempt"} <= set(CATALOGUE)
    assert len(by_class["race"]) >= 3 and len(by_class["sync"]) >= 3
    assert len(by_class["state"]) >= 6 and len(by_class["sampler"]) >= 7


def test_every_mutant_names_its_checks_workload_and_probe():
    probes = power_cases()
    for m in CATALOGUE.values():
        assert m.description and m.checks and set(m.checks) <= set(known_checks()), m.name
        assert m.workload in WORKLOADS, m.name
        assert (m.chisq_case is not None) == ("chisq" in m.checks), m.name
        if m.chisq_case:
            assert m.chisq_case in probes, m.name
        if m.needs_gpu:  # nothing a CPU run could kill: a cuda-only check (chi-square probe, CSAN) is its designed one
            assert m.checks in (("chisq",), ("csan",)), m.name
    # `memory` catches the consequence of other bugs (stale indices, a wrong row): no mutant is designed for it
    # (docs/MUTANTS.md); tests/stress/test_kernel_memory.py plants the faults it exists for.
    designed = {c: {m.name for m in CATALOGUE.values() if c in m.checks} for c in known_checks() if c != "memory"}
    assert all(designed.values()), designed


def test_unknown_mutant_is_a_lookup_error(micro_runner):
    with pytest.raises(UnknownMutantError, match="no_such_bug"):
        catalogue.apply("no_such_bug", runner=micro_runner)


def test_a_runner_without_the_patched_parts_is_refused_untouched():
    config = preset("micro")
    runner = simple_runner(random_weights(config, seed=0), default_limits(config), None, 0)
    before = dict(vars(runner))
    with pytest.raises(MutantTargetError, match="staging"):
        catalogue.apply("reuse_staging_early", runner=runner)
    assert vars(runner) == before


def _patchable(runner) -> dict[str, object]:
    parts = {"runner": runner, **{name: getattr(runner, name) for name in (
        "staging", "outputs", "state", "sampling_state", "input_batch", "block_table", "sampler", "graphs", "model")}}
    parts.update({f"{n}.{t.name}": t for n, owner in (("sampling_state", runner.sampling_state),)
                  for t in owner._staged})
    parts.update({"graphs.inputs": runner.graphs.inputs, "state.row_state": runner.state.row_state,
                  "sampler.processed": runner.sampler.processed,
                  **{f"graphs.{key.describe()}": g for key, g in runner.graphs.graphs.items()}})
    parts.update({"runnercheck.impl.runner": runner_module, "runnercheck.impl.sample.sampler": sampler_module,
                  "runnercheck.impl.eager_step": eager_step_module})
    if runner.proposer is not None and hasattr(runner.proposer, "verifier"):  # the draft-model proposer, its parts
        parts["proposer"], parts["proposer.verifier"] = runner.proposer, runner.proposer.verifier
        parts["runnercheck.impl.draft_proposer"] = draft_proposer_module
    return parts


def _snapshot(parts: dict[str, object]) -> dict[str, dict[str, int]]:
    return {key: {k: id(v) for k, v in vars(obj).items() if not (isinstance(obj, ModuleType) and k.startswith("__"))}
            for key, obj in parts.items()}


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_apply_patches_the_runner_and_undo_restores_it(name, micro_runner):
    from runnercheck.stress.sim.scheduler import SchedulerSim

    if CATALOGUE[name].workload == "draft-model":  # the rejection-sampling mutants patch the draft-model proposer
        from runnercheck.impl.interface import DraftModelConfig

        config = preset("micro")
        micro_runner = runner_module.make_runner(random_weights(config, seed=0), default_limits(config), Device("sim", seed=0),
                                                 speculative=DraftModelConfig("micro-draft", 2))

    scheduler = SchedulerSim(micro_runner.limits)  # scheduler mutants (prefix cache) patch it instead
    device = Device("sim", seed=0)  # device mutants (stream ordering) patch the device the runner is built on
    parts = {**_patchable(micro_runner), "scheduler": scheduler, "scheduler.blocks": scheduler.blocks, "device": device}
    before = _snapshot(parts)
    with catalogue.apply(name, runner=micro_runner, scheduler=scheduler, device=device) as applied:
        assert applied.mutant.name == name
        assert _snapshot(parts) != before, f"{name} patched nothing it could be caught by"
    assert _snapshot(parts) == before


def test_stress_command_installs_mutants_through_apply():
    from runnercheck.stress.sim.scheduler import SchedulerConfig
    from runnercheck.stress.run.harness import build_session
    from runnercheck.stress.run.config import RunConfig, RunSetupError

    config = preset("micro")

    def stress_config(mutant: str) -> RunConfig:
        return RunConfig(0, 1, "sim", "micro", config, default_limits(config), SchedulerConfig(), None, None,
                            mutant, "runnercheck.impl.runner:make_runner")

    session = build_session(stress_config("reuse_staging_early"))
    assert len(session.runner.staging.slots) == 1
    with pytest.raises(RunSetupError, match="unknown mutant"):
        build_session(stress_config("no_such_bug"))


# --------------------------------------------------------------------------- the harness can fail


def test_a_mutant_that_changes_nothing_survives_and_fails_the_run(monkeypatch):
    noop = catalogue.Mutant("noop", "state", "changes nothing", ("differential",), "temperature",
                            lambda target, applied: None, ())
    monkeypatch.setitem(CATALOGUE, "noop", noop)
    monkeypatch.setitem(WORKLOADS, "temperature", replace(WORKLOADS["temperature"], ticks=3))
    report = run_catalogue(MutantsOptions(device="sim", only=("noop",)))
    (result,) = report.mutants
    assert result.status == "survived" and not result.killed and not result.as_designed
    assert result.ticks == 3 and [c.name for c in report.controls] == ["temperature"]
    assert not report.passed


def test_a_kill_by_a_check_the_mutant_was_not_built_for_is_not_as_designed(monkeypatch):
    real = CATALOGUE["item_in_step"]
    monkeypatch.setitem(CATALOGUE, "item_in_step", catalogue.Mutant(
        real.name, real.cls, real.description, ("lifetime",), real.workload, real.install, real.requires))
    report = run_catalogue(MutantsOptions(device="sim", only=("item_in_step",)))
    (result,) = report.mutants
    assert result.killed_by == ["sync"] and not result.as_designed
    assert not report.passed


def test_a_control_that_fires_fails_the_run():
    killed = MutantResult("m", "sync", "d", False, ["sync"], "steady", "killed", True, ["sync"], True,
                          ["sync", "lifetime", "differential"], {"sync": "x"}, 2, 0.1)
    report = MutantsReport("sim", True, 0, False, "cmd", "date", [killed], [ControlResult("workload", "steady", {}, 2, 0.1)], 1.0)
    assert report.passed
    report.controls.append(ControlResult("workload", "racing", {"differential": "step 3: ..."}, 2, 0.1))
    assert not report.passed
    assert "NOT CLEAN" in markdown(report)


def test_the_sync_detector_stays_silent_on_an_unmutated_lagging_runner():
    run = run_differential(WORKLOADS["lagging"], "sim", 1, 6)
    assert run.fired == {} and run.ticks == 6 and run.tokens > 0


# --------------------------------------------------------------------------- chi-square on the runner's sampler


def test_chisq_on_the_runners_sampler_kills_temperature_twice_with_a_clean_probe_control():
    report = run_catalogue(MutantsOptions(device="sim", only=("temperature_twice",), chisq=True, chisq_samples=200))
    (result,) = report.mutants
    assert result.killed_by == ["chisq"] and result.as_designed  # quick: the differential run is not needed
    assert "temperature-2-v97" in result.evidence["chisq"]
    assert [(c.kind, c.name, c.clean) for c in report.controls] == [("chisq", "temperature-twice", True)]
    assert report.passed


# RNG v2 bits for (seed, position, token) with hi = 61: u < 2^-25, which fp16 rounds to 0 and a
# 24-bit uniform truncates to 0, so either noise bug gives that token +inf noise.
NOISE_WITNESS = (20240601, 33406, 212)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter evaluates log(0) and 0/0 on discarded lanes
@pytest.mark.parametrize("name", ["fp16_gumbel_noise", "u24_uniform"])
def test_noise_mutants_give_a_tiny_uniform_infinite_noise(name):
    from runnercheck.impl.interface import SamplingParams
    from runnercheck.reference.rng import noise_hi
    from runnercheck.checks.chisq.impl_sampler import ImplSampler

    seed, position, token = NOISE_WITNESS
    assert int(noise_hi(seed, position, torch.tensor([token]))[0]) < 128
    logits = torch.zeros(1, 256)
    logits[0, token] = -30.0  # 30 below the rest: the spec's noise (at most ~45) cannot lift it here
    probe = ImplSampler(Device("cpu"), 256, rows_per_launch=1, max_requests=1)
    args = (logits, [SamplingParams()], torch.tensor([seed]), torch.tensor([position]))
    assert int(probe(*args)[0]) != token
    with catalogue.apply(name, target=probe):
        assert int(probe(*args)[0]) == token
    assert int(probe(*args)[0]) != token


# --------------------------------------------------------------------------- the CI run


def test_quick_sim_run_kills_every_cpu_mutant_as_designed(tmp_path, capsys):
    rc = cli.main(["mutants", "--quick", "--device", "sim", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "mutants.json").read_text())
    results = {m["name"]: m for m in report["mutants"]}
    assert set(results) == set(CATALOGUE)
    for name, m in results.items():
        if CATALOGUE[name].needs_gpu:
            assert m["status"] == "skipped", name
            continue
        assert m["killed"] and m["as_designed"], (name, m["evidence"])
        assert set(m["killed_by"]) & set(CATALOGUE[name].checks), name
        assert {"class", "description", "killed", "killed_by", "seconds"} <= set(m)
    assert results["reuse_staging_early"]["killed_by"] == ["lifetime"]
    assert "sync" in results["item_in_step"]["killed_by"]
    for name in ("spec_accept_ratio_normalised", "spec_residual_abs", "spec_accept_uses_draft_noise", "spec_bonus_dropped"):
        assert "differential" in results[name]["killed_by"], (name, results[name]["evidence"])  # issue 20's biases
    assert any(c["kind"] == "workload" and c["name"] == "draft-model" for c in report["controls"])
    assert all(c["clean"] for c in report["controls"]) and report["controls"]
    assert rc == 0 and report["passed"]
    matrix = (tmp_path / "mutants.md").read_text()
    assert all(f"`{name}`" in matrix for name in CATALOGUE)
    assert "runnercheck mutants: PASS" in capsys.readouterr().out


def test_cli_rejects_unknown_names_and_a_missing_out(tmp_path, capsys):
    assert cli.main(["mutants", "--device", "sim", "--only", "no_such_bug", "--out", str(tmp_path)]) == 2
    assert "no_such_bug" in capsys.readouterr().err
    assert cli.main(["mutants", "--device", "sim"]) == 2
    assert cli.main(["mutants", "--list"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_quick_sim_run_kills_every_cpu_mutant_for_other_seeds(seed):
    report = run_catalogue(MutantsOptions(device="sim", quick=True, seed=seed))
    survivors = [(m.name, m.killed_by) for m in report.mutants if m.status != "skipped" and not m.as_designed]
    assert not survivors and all(c.clean for c in report.controls), (survivors, report.controls)


@pytest.mark.gpu
def test_cuda_run_kills_every_mutant_including_the_noise_bugs(tmp_path):
    rc = cli.main(["mutants", "--quick", "--device", "cuda", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "mutants.json").read_text())
    results = {m["name"]: m for m in report["mutants"]}
    assert results["fp16_gumbel_noise"]["killed_by"] == ["chisq"]
    assert results["u24_uniform"]["killed_by"] == ["chisq"]
    assert rc == 0 and report["passed"], [(n, m["evidence"]) for n, m in results.items() if not m["as_designed"]]


def test_every_mutants_workload_is_known_to_a_child_that_imports_only_the_harness():
    """A cuda run's child process is spawned: it imports the harness, not the catalogues.  Every
    workload must be defined where the harness looks it up (on the H200 the 'decode-penalties'
    control died with a KeyError when a catalogue module registered it)."""
    import subprocess
    import sys

    names = sorted({m.workload for m in CATALOGUE.values()})
    code = ("import sys, runnercheck.stress.run.harness\n"
            "from runnercheck.stress.mutants.workloads import WORKLOADS\n"
            "missing = [n for n in sys.argv[1:] if n not in WORKLOADS]\n"
            "assert not missing, missing\n"
            "assert 'runnercheck.stress.mutants.catalogue' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
