"""The runner's unfiltered launch set (issue 58): when no live request has a filter on (the host's count,
`runnercheck.impl.state.RequestStateTable.unfiltered`), eager steps and bucketed steps (the bucket's unfiltered mode,
`runnercheck.impl.graph_step.GraphMode.unfiltered`) sample with `Sampler.sample(..., unfiltered=True)`: the split
passes without the select, finish and fallback launches.

Asserted: unfiltered traffic (temperatures, penalties, logprobs, drafts, a greedy row beside them) gives the same tokens
without the filter launches as with them, eagerly and replayed, and as the float64 oracle; a batch with one filtered
row takes every launch, and the unfiltered set comes back once that request is released; the count survives
admission and release (C twins or not) and a bad release leaves it as it was; every bucket is captured once per
sampler launch set; a runner that says "unfiltered" while a row is filtered (the catalogue's
``unfiltered_from_first_request``) is caught by the differential check.  Interpreted on CPU: the micro model.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import runnercheck.impl.state as state_module
from runnercheck.impl.device import Device
from runnercheck.impl.graph_step import SAMPLER_TWINS, GraphMode
from runnercheck.impl.interface import NewRequest, SamplingParams
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import ModelRunner
from runnercheck.impl.state import RequestStateTable, RowStateError
from runnercheck.stress.sim.scheduler import SchedulerSim
from test_runner_greedy import LIMITS, _drive, _note_live


@pytest.fixture(scope="module")
def weights():
    return random_weights(preset("micro"), seed=11)


def _record_paths(runner: ModelRunner, *, force_filters: bool = False) -> list[tuple[bool, bool]]:
    """Wrap the runner's sampler: every call's (``all_greedy``, ``unfiltered``).  ``force_filters``: every launch
    whatever the runner asked (the path before the unfiltered set)."""
    paths: list[tuple[bool, bool]] = []
    sample = runner.sampler.sample

    def recording(*args, all_greedy: bool = False, unfiltered: bool = False, **kwargs):
        paths.append((all_greedy, unfiltered))
        return sample(*args, all_greedy=all_greedy, unfiltered=False if force_filters else unfiltered, **kwargs)

    runner.sampler.sample = recording
    return paths


def _unfiltered_requests(sched: SchedulerSim) -> None:
    sp = SamplingParams
    sched.add_request("a", (3, 4, 5), sp(temperature=0.8, max_tokens=3, seed=4))
    sched.add_request("b", (7, 8), sp(temperature=1.7, repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=0.3,
                                      logprobs=2, max_tokens=5))
    sched.add_request("c", (9, 10, 11, 12), sp(temperature=0.0, top_p=0.5, top_k=2, max_tokens=4))  # T = 0: filters off


def test_unfiltered_traffic_skips_the_filter_launches_with_every_launchs_tokens_and_the_oracles(weights):
    reference = pytest.importorskip("runnercheck.reference.runner")
    compare = pytest.importorskip("runnercheck.checks.compare")
    graphed = ModelRunner(weights, LIMITS, Device("sim", seed=2), base_seed=7)
    every = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=7, cuda_graphs=False)  # bucketed steps padded, eager
    graphed_paths, every_paths = _record_paths(graphed), _record_paths(every, force_filters=True)
    sched = SchedulerSim(LIMITS, seed=1, draft_prob=0.7)  # drafts that differ: eager steps too
    _unfiltered_requests(sched)
    _drive([graphed, every], sched, reference.ReferenceRunner(weights, LIMITS, base_seed=7), compare)
    assert graphed_paths and all(p == (False, True) for p in graphed_paths + every_paths)  # asked for; forced off below
    stats = graphed.cuda_graph_stats()
    assert stats["unfiltered_bucketed"] == stats["replays"] > 0 and stats["greedy_bucketed"] == 0
    assert stats["fallbacks"]  # and some ran eager (`enqueue_eager_step`), unfiltered too
    assert every.cuda_graph_stats()["unfiltered_bucketed"] == every.cuda_graph_stats()["padded_eager"] > 0
    # Every bucket once per launch set: all the split passes, without the filter launches, the greedy launch.
    keys = set(graphed.graphs.graphs)
    split = {k for k in keys if not (k.mode.greedy or k.mode.unfiltered)}
    assert keys == {dataclasses.replace(k, mode=dataclasses.replace(k.mode, greedy=g, unfiltered=u))
                    for k in split for g, u in SAMPLER_TWINS}
    assert all(k.describe().endswith("-unfiltered") == k.mode.unfiltered for k in keys)
    assert graphed.state.unfiltered and graphed.state.num_filtered_rows == 0


def test_a_graph_mode_is_greedy_or_unfiltered_not_both():
    with pytest.raises(ValueError, match="not both"):
        GraphMode(1, -1, greedy=True, unfiltered=True)


def test_a_filtered_row_takes_every_launch_until_its_request_is_released(weights):
    reference = pytest.importorskip("runnercheck.reference.runner")
    compare = pytest.importorskip("runnercheck.checks.compare")
    runner = ModelRunner(weights, LIMITS, Device("sim", seed=1), base_seed=5)
    paths = _record_paths(runner)
    live = _note_live(runner)
    sched = SchedulerSim(LIMITS, seed=0)
    sched.add_request("u", (3, 4, 5), SamplingParams(temperature=1.2, max_tokens=7, frequency_penalty=0.4))
    sched.add_request("f", (6, 7), SamplingParams(temperature=0.9, top_k=3, seed=11, max_tokens=2))
    _drive([runner], sched, reference.ReferenceRunner(weights, LIMITS, base_seed=5), compare)
    assert len(paths) == len(live)  # one sampler call a step
    assert [unfiltered for _, unfiltered in paths] == ["f" not in names for names in live]
    assert paths[0] == (False, False) and paths[-1] == (False, True)  # admitted together; "u" decodes alone at the end
    assert runner.state.num_filtered_rows == 0


@pytest.mark.parametrize("native", [True, False], ids=["c-twins", "python"])
def test_the_count_moves_at_admission_and_release_and_a_bad_release_leaves_it(monkeypatch, native):
    if not native:
        monkeypatch.setattr(state_module, "_rows", None)
    table = RequestStateTable(Device("cpu"), max_num_reqs=4, max_model_len=16)

    def admit(req_id: str, **params) -> None:
        table.admit(NewRequest(req_id, (1, 2), SamplingParams(**params), (0,)), seed=1)

    admit("g", temperature=0.0, top_k=3)  # greedy: the filter is off
    admit("t", temperature=0.7, repetition_penalty=1.3)  # a penalty is no filter
    assert table.unfiltered and table.num_random_rows == 1
    admit("k", temperature=0.7, top_k=3)
    admit("p", temperature=0.7, top_p=0.9, min_p=0.1)
    assert not table.unfiltered and table.num_filtered_rows == 2
    table.release("k")
    assert table.num_filtered_rows == 1
    with pytest.raises(RowStateError):
        table.release("nobody")
    assert table.num_filtered_rows == 1 and table.num_random_rows == 2
    table.release("p")
    table.release("g")
    assert table.unfiltered and table.num_filtered_rows == 0 and table.num_random_rows == 1


def test_a_runner_that_says_unfiltered_while_a_row_is_filtered_is_caught_by_the_differential(weights):
    """The planted bug (the catalogue's ``unfiltered_from_first_request``): the launch set chosen from the batch's first
    request, unfiltered here, so the top-p row behind it keeps its plain argmax; the oracle comparison names the step."""
    reference = pytest.importorskip("runnercheck.reference.runner")
    compare = pytest.importorskip("runnercheck.checks.compare")
    from runnercheck.stress.mutants import catalogue

    runner = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=5)
    paths = _record_paths(runner)
    sched = SchedulerSim(LIMITS, seed=0)
    sched.add_request("u", (3, 4, 5), SamplingParams(temperature=2.5, max_tokens=12))
    sched.add_request("f", (6, 7), SamplingParams(temperature=2.5, top_p=0.95, seed=11, max_tokens=12))
    with catalogue.apply("unfiltered_from_first_request", runner=runner):
        with pytest.raises(AssertionError, match="expected token"):
            _drive([runner], sched, reference.ReferenceRunner(weights, LIMITS, base_seed=5), compare)
    assert paths and all(p == (False, True) for p in paths)  # the unfiltered set from the first step: the wrong one


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_unfiltered_modes_replay_every_launchs_tokens_and_the_oracles(weights):
    """Compiled and captured: the unfiltered modes' CUDA graphs (plain and fused) against eager steps forced onto every
    launch, and the oracle, with every capture's logits given back to the pool the later captures share."""
    reference = pytest.importorskip("runnercheck.reference.runner")
    compare = pytest.importorskip("runnercheck.checks.compare")
    graphed = ModelRunner(weights, LIMITS, Device("cuda"), base_seed=7)
    every = ModelRunner(weights, LIMITS, Device("cuda"), base_seed=7, cuda_graphs=False)
    every_paths = _record_paths(every, force_filters=True)
    sched = SchedulerSim(LIMITS, seed=1, draft_prob=0.5)  # drafted and undrafted decodes, mixed steps
    _unfiltered_requests(sched)
    _drive([graphed, every], sched, reference.ReferenceRunner(weights, LIMITS, base_seed=7), compare)
    stats = graphed.cuda_graph_stats()
    assert stats["unfiltered_bucketed"] == stats["replays"] > 0
    assert all(graph.cuda_graph is not None for key, graph in graphed.graphs.graphs.items() if key.mode.unfiltered)
    assert every_paths and all(p == (False, True) for p in every_paths)
    # each capture gave its logits back to the shared pool (the next capture reuses them): no graph holds a tensor
    captured = [*graphed.graphs.graphs.values(), *graphed.graphs.fused_graphs.values()]
    assert captured and not any(isinstance(v, torch.Tensor) for g in captured for v in g.step.result.values())
