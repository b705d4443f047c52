"""The runner's all-greedy sampler launch (issue 58): when every live request has temperature 0 (the host's count,
`runnercheck.impl.state.RequestStateTable.all_greedy`), eager steps and bucketed steps (the bucket's greedy mode,
`runnercheck.impl.graph_step.GraphMode.greedy`) sample with `Sampler.sample(..., all_greedy=True)`.

Asserted: all-greedy traffic (penalties, filters that temperature 0 switches off, logprobs, drafts) gives the same
tokens through the greedy launch as through the split passes, eagerly and replayed, and as the float64 oracle; a
batch with one row at temperature > 0 takes the split passes, and the greedy launch comes back once that request
is released; the count survives admission and release (C twins or not) and a bad release leaves it as it was; a
runner that says "all greedy" while a row samples with temperature (the catalogue's ``greedy_from_first_request``)
is caught by the differential check.  Interpreted on CPU: the micro model.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import runnercheck.impl.state as state_module
from runnercheck.impl.device import Device
from runnercheck.impl.interface import NewRequest, RunnerLimits, SamplingParams
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import ModelRunner
from runnercheck.impl.state import RequestStateTable, RowStateError
from runnercheck.stress.sim.scheduler import SchedulerSim

LIMITS = RunnerLimits(vocab_size=256, max_num_reqs=4, max_model_len=48, max_num_batched_tokens=16, num_kv_blocks=40,
                      block_size=4, max_logprobs=3, max_num_draft_tokens=1)


@pytest.fixture(scope="module")
def weights():
    return random_weights(preset("micro"), seed=11)


def _record_paths(runner: ModelRunner, *, force_split: bool = False) -> list[bool]:
    """Wrap the runner's sampler: every call's ``all_greedy`` (CPU replays call it too: recorded closures look the
    method up when they run).  ``force_split``: the split passes whatever the runner asked (the path before issue 58)."""
    paths: list[bool] = []
    sample = runner.sampler.sample

    def recording(*args, all_greedy: bool = False, **kwargs):
        paths.append(all_greedy)
        return sample(*args, all_greedy=False if force_split else all_greedy, **kwargs)

    runner.sampler.sample = recording
    return paths


def _note_live(runner: ModelRunner) -> list[set[str]]:
    """Wrap the runner's ``execute_model``: the ids of the live requests after every step that samples (the last step
    of a schedule only releases)."""
    live: list[set[str]] = []
    execute = runner.execute_model

    def execute_noting_live(sched):
        out = execute(sched)
        if runner.last_step_stats.num_tokens:
            live.append(set(runner.state.req_to_row))
        return out

    runner.execute_model = execute_noting_live
    return live


def _greedy_requests(sched: SchedulerSim) -> None:
    sp = SamplingParams
    sched.add_request("a", (3, 4, 5), sp(temperature=0.0, max_tokens=3, top_k=3, min_p=0.2))  # filters: off at T = 0
    sched.add_request("b", (7, 8), sp(temperature=0.0, repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=0.3,
                                      logprobs=2, max_tokens=5))
    sched.add_request("c", (9, 10, 11, 12), sp(temperature=0.0, top_p=0.5, max_tokens=4, seed=3))


def _drive(runners: list[ModelRunner], sched: SchedulerSim, oracle=None, compare=None) -> list:
    """One schedule into every runner: equal outputs, each step compared with the oracle when given."""
    outputs = []
    while sched.has_work:
        step = sched.schedule()
        got = [r.execute_model(step).get() for r in runners]
        for other in got[1:]:
            assert other == got[0], f"step {step.step_id}: {other} != {got[0]}"
        if oracle is not None:
            expected = oracle.execute_model(step)
            cmp = compare.compare_step(got[0], expected, oracle.last_results, positions=compare.first_output_positions(step))
            assert cmp.ok, "\n".join(d.line() for d in cmp.divergences)
            for tie in cmp.ties:
                oracle.replace_output_token(tie.req_id, 0, got[0].token_dict()[tie.req_id][-1])
        outputs.append(got[0])
        sched.update(got[0])
    return outputs


def test_all_greedy_traffic_takes_the_greedy_launch_with_the_split_paths_tokens_and_the_oracles(weights):
    reference = pytest.importorskip("runnercheck.reference.runner")
    compare = pytest.importorskip("runnercheck.checks.compare")
    graphed = ModelRunner(weights, LIMITS, Device("sim", seed=2), base_seed=7)
    split = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=7, cuda_graphs=False)  # bucketed steps padded, eager
    graphed_paths, split_paths = _record_paths(graphed), _record_paths(split, force_split=True)
    sched = SchedulerSim(LIMITS, seed=1, draft_prob=0.7)  # drafts (prefixes counted as outputs) that differ: eager steps
    _greedy_requests(sched)
    oracle = reference.ReferenceRunner(weights, LIMITS, base_seed=7)
    _drive([graphed, split], sched, oracle, compare)
    assert graphed_paths and all(graphed_paths) and all(split_paths)  # split: asked for, forced below the flag
    stats = graphed.cuda_graph_stats()
    assert stats["greedy_bucketed"] == stats["replays"] > 0  # every bucketed step replayed a greedy mode
    assert stats["fallbacks"]  # and some ran eager (`enqueue_eager_step`), greedy too
    assert split.cuda_graph_stats()["greedy_bucketed"] == split.cuda_graph_stats()["padded_eager"] > 0
    # Every bucket's split-pass graph has its greedy twin (and its unfiltered one: test_runner_unfiltered.py).
    keys = set(graphed.graphs.graphs)
    assert {k for k in keys if k.mode.greedy} == {dataclasses.replace(k, mode=dataclasses.replace(k.mode, greedy=True))
                                                 for k in keys if not (k.mode.greedy or k.mode.unfiltered)}
    assert all(k.describe().endswith("-greedy") == k.mode.greedy for k in keys)
    assert graphed.state.all_greedy and graphed.state.num_random_rows == 0


def test_a_row_with_a_temperature_takes_the_split_passes_until_its_request_is_released(weights):
    reference = pytest.importorskip("runnercheck.reference.runner")
    compare = pytest.importorskip("runnercheck.checks.compare")
    runner = ModelRunner(weights, LIMITS, Device("sim", seed=1), base_seed=5)
    paths = _record_paths(runner)
    live = _note_live(runner)
    sched = SchedulerSim(LIMITS, seed=0)
    sched.add_request("g", (3, 4, 5), SamplingParams(temperature=0.0, max_tokens=7, frequency_penalty=0.4))
    sched.add_request("r", (6, 7), SamplingParams(temperature=0.9, seed=11, max_tokens=2))
    _drive([runner], sched, reference.ReferenceRunner(weights, LIMITS, base_seed=5), compare)
    assert len(paths) == len(live)  # one sampler call a step
    assert [greedy for greedy in paths] == ["r" not in names for names in live]
    assert paths[0] is False and paths[-1] is True  # both admitted together; "g" decodes alone at the end
    assert runner.state.num_random_rows == 0


@pytest.mark.parametrize("native", [True, False], ids=["c-twins", "python"])
def test_the_count_moves_at_admission_and_release_and_a_bad_release_leaves_it(monkeypatch, native):
    if not native:
        monkeypatch.setattr(state_module, "_rows", None)
    table = RequestStateTable(Device("cpu"), max_num_reqs=3, max_model_len=16)

    def admit(req_id: str, temperature: float) -> None:
        table.admit(NewRequest(req_id, (1, 2), SamplingParams(temperature=temperature), (0,)), seed=1)

    admit("g", 0.0)
    admit("z", -0.0)  # -0.0 == 0: greedy, as the kernels' fp32 test reads it
    assert table.all_greedy
    admit("r", 1e-30)  # no noise-free shortcut for a tiny temperature: it is not greedy on the host
    assert not table.all_greedy and table.num_random_rows == 1
    table.release("g")
    assert table.num_random_rows == 1
    with pytest.raises(RowStateError):
        table.release("nobody")
    assert table.num_random_rows == 1
    table.release("r")
    assert table.all_greedy and table.num_random_rows == 0


def test_a_runner_that_says_all_greedy_while_a_row_samples_is_caught_by_the_differential(weights):
    """The planted bug (the catalogue's ``greedy_from_first_request``): the launch chosen from the batch's first
    request, greedy here, so the temperature row behind it is argmaxed; the oracle comparison names the step."""
    reference = pytest.importorskip("runnercheck.reference.runner")
    compare = pytest.importorskip("runnercheck.checks.compare")
    from runnercheck.stress.mutants import catalogue

    runner = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=5)
    paths = _record_paths(runner)
    sched = SchedulerSim(LIMITS, seed=0)
    sched.add_request("g", (3, 4, 5), SamplingParams(temperature=0.0, max_tokens=12))
    sched.add_request("r", (6, 7), SamplingParams(temperature=2.0, seed=11, max_tokens=12))
    with catalogue.apply("greedy_from_first_request", runner=runner):
        with pytest.raises(AssertionError, match="expected token"):
            _drive([runner], sched, reference.ReferenceRunner(weights, LIMITS, base_seed=5), compare)
    assert paths and all(paths)  # the greedy launch for both rows from the first step: the wrong one


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_greedy_modes_replay_the_split_paths_tokens_and_the_oracles(weights):
    """Compiled and captured: the greedy modes' CUDA graphs (plain and fused) against eager steps forced onto the split
    passes, and the oracle."""
    reference = pytest.importorskip("runnercheck.reference.runner")
    compare = pytest.importorskip("runnercheck.checks.compare")
    graphed = ModelRunner(weights, LIMITS, Device("cuda"), base_seed=7)
    split = ModelRunner(weights, LIMITS, Device("cuda"), base_seed=7, cuda_graphs=False)
    split_paths = _record_paths(split, force_split=True)
    sched = SchedulerSim(LIMITS, seed=1, draft_prob=0.5)  # drafted and undrafted decodes, mixed steps
    _greedy_requests(sched)
    _drive([graphed, split], sched, reference.ReferenceRunner(weights, LIMITS, base_seed=7), compare)
    stats = graphed.cuda_graph_stats()
    assert stats["greedy_bucketed"] == stats["replays"] > 0
    assert all(graph.cuda_graph is not None for key, graph in graphed.graphs.graphs.items() if key.mode.greedy)
    assert split_paths and all(split_paths)
