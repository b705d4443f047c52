"""The CUDA-graph mutants (`runnercheck.stress.mutants.graphs`): each is killed on sim by the check it was built
for, within the quick tick budget of its workload, and the unmutated workload stays silent."""
from __future__ import annotations

import pytest

from runnercheck.impl.device import Device
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import make_runner
from runnercheck.stress.mutants import catalogue
from runnercheck.stress.mutants.catalogue import CATALOGUE, WORKLOADS
from runnercheck.stress.cli.mutants_cmd import run_differential
from runnercheck.stress.run.config import default_limits

GRAPH_MUTANTS = ("graph_buffer_reallocated", "padding_row_writes_live_state", "predicate_admits_larger_batch",
                 "graph_init_only_at_capture", "mixed_tail_left_stale",
                 "graph_skips_admitted_count_reset", "draft_q_not_refreshed", "draft_propose_before_post_update")


def test_the_graph_mutants_are_in_the_catalogue():
    assert set(GRAPH_MUTANTS) <= set(CATALOGUE)
    for name in GRAPH_MUTANTS:
        assert "differential" in CATALOGUE[name].checks and "graphs" in CATALOGUE[name].requires


# Each mutant and control on its own: the CI run of the whole catalogue (`test_mutants.py`, `mutants --quick` on
# sim) already kills every one of them by the checks it was built for, with these workloads' controls clean.
@pytest.mark.slow
@pytest.mark.parametrize("name", GRAPH_MUTANTS)
def test_graph_mutant_is_killed_on_sim_by_the_checks_it_was_built_for(name):
    workload = WORKLOADS[CATALOGUE[name].workload]
    run = run_differential(workload, "sim", 0, workload.ticks, mutant=name)
    assert set(run.fired) & set(CATALOGUE[name].checks), (name, run)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["decode", "decode-penalties"])
def test_the_graph_workloads_are_silent_unmutated(name):
    workload = WORKLOADS[name]
    run = run_differential(workload, "sim", 0, workload.ticks)
    assert not run.fired, run


def test_undo_restores_what_the_init_only_at_capture_mutant_changed():
    config = preset("micro")
    runner = make_runner(random_weights(config, seed=0), default_limits(config, max_num_reqs=4), Device("cpu"))
    inputs = runner.graphs.inputs
    before = {q: t.clone() for q, t in inputs.query_start.items()}
    with catalogue.apply("graph_init_only_at_capture", runner=runner):
        assert not runner.graphs.enabled and all(not t.any() for t in inputs.query_start.values())
    assert runner.graphs.enabled and all(inputs.query_start[q].equal(t) for q, t in before.items())


@pytest.mark.parametrize("name", ["positions_off_by_one", "slot_mapping_wrong_block", "idx_mapping_off_by_one"])
def test_input_prep_mutants_survive_a_mixed_graphs_warm_up(name):
    """A CUDA capture's warm-up runs a mixed graph's launches with no request named (every token padding): a
    mutant's fix must index inside the batch there too (an index past it is a device-side assert on the GPU,
    which ended run 48's catalogue; on CPU an IndexError)."""
    config = preset("micro")
    runner = make_runner(random_weights(config, seed=0), default_limits(config, max_num_reqs=4), Device("cpu"))
    with catalogue.apply(name, runner=runner):
        runner.graphs.inputs.header.zero_()
        mixed = [graph for key, graph in runner.graphs.graphs.items() if key.mixed]
        assert mixed
        for graph in mixed:
            graph.replay()
