"""The processed-logprob mutants (`runnercheck.stress.mutants.logprobs`) planted in the runner on sim: the differential
against the oracle kills each on the ``processed-logprobs`` workload (its control runs in the catalogue's quick run)."""
from __future__ import annotations

import pytest

from runnercheck.stress.cli.mutants_cmd import run_differential
from runnercheck.stress.mutants.catalogue import CATALOGUE, WORKLOADS

LOGPROB_MUTANTS = ("processed_logprobs_without_temperature", "processed_logprobs_before_filters",
                   "processed_logprobs_mode_kept_on_reuse")


@pytest.mark.parametrize("name", LOGPROB_MUTANTS)
def test_the_differential_kills_each_processed_logprob_mutant_on_sim(name):
    mutant = CATALOGUE[name]
    assert mutant.checks == ("differential",) and mutant.workload == "processed-logprobs"
    workload = WORKLOADS[mutant.workload]
    run = run_differential(workload, "sim", 0, workload.ticks, mutant=name, isolate=False)
    assert set(run.fired) == {"differential"}, run.fired
    assert "logprob" in run.fired["differential"], run.fired["differential"]
