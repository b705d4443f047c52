"""The speculative-decoding mutant (`stress.mutants_spec`): the accepted count read on the host in
the step is killed on sim by the sync detector within the ``ngram`` workload's quick budget, and
the unmutated workload (the n-gram proposer on) stays silent."""
from __future__ import annotations

from impl.device import Device
from impl.model.weights import preset, random_weights
from impl.runner import make_runner
from stress import mutants as catalogue
from stress.mutants import CATALOGUE, WORKLOADS
from stress.mutants_cmd import run_differential
from stress.run_config import default_limits


def test_the_host_read_mutant_is_killed_by_the_sync_detector() -> None:
    m = CATALOGUE["accepted_count_read_on_host"]
    assert m.checks == ("sync",) and m.workload == "ngram"
    workload = WORKLOADS[m.workload]
    run = run_differential(workload, "sim", 0, workload.ticks, mutant=m.name)
    assert "sync" in run.fired, run


def test_the_ngram_workload_is_silent_unmutated() -> None:
    workload = WORKLOADS["ngram"]
    run = run_differential(workload, "sim", 0, workload.ticks)
    assert not run.fired, run


def test_the_mutant_patches_the_proposer_and_undo_restores_it() -> None:
    config = preset("micro")
    from impl.interface import NgramConfig

    runner = make_runner(random_weights(config, seed=0), default_limits(config), Device("cpu"), speculative=NgramConfig(2))
    original = runner.proposer.enqueue_propose
    applied = catalogue.apply("accepted_count_read_on_host", runner=runner)
    assert runner.proposer.enqueue_propose != original
    applied.undo()
    assert runner.proposer.enqueue_propose == original
