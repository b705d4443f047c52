"""The speculative-decoding mutants (`runnercheck.stress.mutants.spec`): the accepted count read on the host in
the step is killed on sim by the sync detector within the ``ngram`` workload's quick budget, and
the unmutated workload (the n-gram proposer on) stays silent; the four rejection-sampling biases planted
in the draft-model runner's verification are killed by the differential on the ``draft-model`` workload,
which stays silent unmutated.  (Accepting with ``p/q`` without the min is unobservable -- ``u < 1`` --
so its observable form, the row-normalised ratio, is the mutant; see `runnercheck.stress.mutants.spec`.)"""
from __future__ import annotations

import pytest

from runnercheck.impl.device import Device
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import make_runner
from runnercheck.stress.mutants import catalogue
from runnercheck.stress.mutants.catalogue import CATALOGUE, WORKLOADS
from runnercheck.stress.cli.mutants_cmd import run_differential
from runnercheck.stress.run.config import default_limits


def test_the_host_read_mutant_is_killed_by_the_sync_detector() -> None:
    m = CATALOGUE["accepted_count_read_on_host"]
    assert m.checks == ("sync",) and m.workload == "ngram"
    workload = WORKLOADS[m.workload]
    run = run_differential(workload, "sim", 0, workload.ticks, mutant=m.name)
    assert "sync" in run.fired, run


@pytest.mark.slow  # the catalogue's CI run (test_mutants.py) runs this control too
def test_the_ngram_workload_is_silent_unmutated() -> None:
    workload = WORKLOADS["ngram"]
    run = run_differential(workload, "sim", 0, workload.ticks)
    assert not run.fired, run


def test_the_mutant_patches_the_proposer_and_undo_restores_it() -> None:
    config = preset("micro")
    from runnercheck.impl.interface import NgramConfig

    runner = make_runner(random_weights(config, seed=0), default_limits(config), Device("cpu"), speculative=NgramConfig(2))
    original = runner.proposer.enqueue_propose
    applied = catalogue.apply("accepted_count_read_on_host", runner=runner)
    assert runner.proposer.enqueue_propose != original
    applied.undo()
    assert runner.proposer.enqueue_propose == original


SPEC_BIAS_MUTANTS = ("spec_accept_ratio_normalised", "spec_residual_abs", "spec_accept_uses_draft_noise", "spec_bonus_dropped")


def test_the_rejection_sampling_biases_are_designed_for_the_differential_on_the_draft_model_workload() -> None:
    """Their kills (and the workload's silent control) are asserted by the catalogue's quick sim run,
    `tests/stress/test_mutants.py::test_quick_sim_run_kills_every_cpu_mutant_as_designed`."""
    for name in SPEC_BIAS_MUTANTS:
        m = CATALOGUE[name]
        # the dropped bonus's -1 reaches the draft model's embedding in the same step: a device-side assert on cuda
        designed = ("differential", "memory") if name == "spec_bonus_dropped" else ("differential",)
        assert m.checks == designed and m.workload == "draft-model" and not m.needs_gpu, name
    assert WORKLOADS["draft-model"].draft_model == "micro-draft"


def test_a_bias_mutant_needs_the_draft_model_proposer_and_undo_restores_the_verifier() -> None:
    from runnercheck.impl.interface import DraftModelConfig, NgramConfig
    from runnercheck.stress.mutants.kernels import MutantTargetError

    config = preset("micro")
    weights, limits = random_weights(config, seed=0), default_limits(config)
    with pytest.raises(MutantTargetError):
        catalogue.apply("spec_residual_abs", runner=make_runner(weights, limits, Device("cpu"), speculative=NgramConfig(2)))
    runner = make_runner(weights, limits, Device("cpu"), speculative=DraftModelConfig("micro-draft", 2))
    applied = catalogue.apply("spec_residual_abs", runner=runner)
    assert "verify" in vars(runner.proposer.verifier)
    applied.undo()
    assert "verify" not in vars(runner.proposer.verifier)
