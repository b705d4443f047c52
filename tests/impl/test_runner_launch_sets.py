"""The runner's lighter sampler launch sets (issue 58), each taken while a host count allows it: the all-greedy launch
while every live request has temperature 0 (`runnercheck.impl.state.RequestStateTable.all_greedy`), else the split
passes without their filter launches while no live request has a filter on (`RequestStateTable.unfiltered`).  Eager
steps pass the flag to `Sampler.sample`; bucketed steps replay the bucket's twin of that set
(`runnercheck.impl.graph_step.GraphMode`, captured once per row of `SAMPLER_TWINS`).

Asserted for each set: traffic that allows it (penalties, logprobs, drafts, filters that temperature 0 switches off)
gives the same tokens through it as through every launch, eagerly and replayed, and as the float64 oracle; a batch
with one request that rules it out takes the heavier launches, and the set comes back once that request is released;
its count survives admission and release (C twins or not) and a bad release leaves it as it was; a runner that
decides the set from the batch's first request (the catalogue's ``greedy_from_first_request`` and
``unfiltered_from_first_request``) is caught by the differential check.  Interpreted on CPU: the micro model.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch

import runnercheck.impl.state as state_module
from runnercheck.impl.device import Device
from runnercheck.impl.graph_step import SAMPLER_TWINS, GraphMode
from runnercheck.impl.interface import NewRequest, RunnerLimits, SamplingParams
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import ModelRunner
from runnercheck.impl.state import RequestStateTable, RowStateError
from runnercheck.stress.sim.scheduler import SchedulerSim

LIMITS = RunnerLimits(vocab_size=256, max_num_reqs=4, max_model_len=48, max_num_batched_tokens=16, num_kv_blocks=40,
                      block_size=4, max_logprobs=3, max_num_draft_tokens=1)
SP = SamplingParams


@dataclass(frozen=True)
class LaunchSet:
    """One lighter launch set as the runner takes it, and the traffic its tests drive."""

    flag: str  # the `Sampler.sample` keyword, and the `RequestStateTable` property that allows it
    mode: str  # the `GraphMode` field of the bucket's twin (its `describe` suffix; stats count "<mode>_bucketed")
    count: str  # the `RequestStateTable` count of the live rows that rule it out
    mutant: str  # the catalogue's planted bug: the set decided from the batch's first request
    traffic: tuple[tuple[str, tuple[int, ...], SamplingParams], ...]  # requests that allow it throughout
    allows: SamplingParams  # a request that allows it, decoding longest
    rules_out: SamplingParams  # one that rules it out while it is live
    mutant_pair: tuple[SamplingParams, SamplingParams]  # (first: allows it, second: rules it out), 12 tokens each

    @property
    def index(self) -> int:
        """Its place in the recorded (``all_greedy``, ``unfiltered``) of a sampler call."""
        return ("all_greedy", "unfiltered").index(self.flag)


GREEDY = LaunchSet(
    "all_greedy", "greedy", "num_random_rows", "greedy_from_first_request",
    traffic=(("a", (3, 4, 5), SP(temperature=0.0, max_tokens=3, top_k=3, min_p=0.2)),  # filters: off at T = 0
             ("b", (7, 8), SP(temperature=0.0, repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=0.3,
                              logprobs=2, max_tokens=5)),
             ("c", (9, 10, 11, 12), SP(temperature=0.0, top_p=0.5, max_tokens=4, seed=3))),
    allows=SP(temperature=0.0, max_tokens=7, frequency_penalty=0.4),
    rules_out=SP(temperature=0.9, seed=11, max_tokens=2),
    mutant_pair=(SP(temperature=0.0, max_tokens=12), SP(temperature=2.0, seed=11, max_tokens=12)))
UNFILTERED = LaunchSet(
    "unfiltered", "unfiltered", "num_filtered_rows", "unfiltered_from_first_request",
    traffic=(("a", (3, 4, 5), SP(temperature=0.8, max_tokens=3, seed=4)),
             ("b", (7, 8), SP(temperature=1.7, repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=0.3,
                              logprobs=2, max_tokens=5)),  # a penalty is no filter
             ("c", (9, 10, 11, 12), SP(temperature=0.0, top_p=0.5, top_k=2, max_tokens=4))),  # T = 0: filters off
    allows=SP(temperature=1.2, max_tokens=7, frequency_penalty=0.4),
    rules_out=SP(temperature=0.9, top_k=3, seed=11, max_tokens=2),
    mutant_pair=(SP(temperature=2.5, max_tokens=12), SP(temperature=2.5, top_p=0.95, seed=11, max_tokens=12)))
LAUNCH_SETS = pytest.mark.parametrize("launch_set", [GREEDY, UNFILTERED], ids=lambda s: s.mode)


@pytest.fixture(scope="module")
def weights():
    return random_weights(preset("micro"), seed=11)


def _record_paths(runner: ModelRunner, *, every_launch: bool = False) -> list[tuple[bool, bool]]:
    """Wrap the runner's sampler: every call's (``all_greedy``, ``unfiltered``) as asked (CPU replays call it too:
    recorded closures look the method up when they run).  ``every_launch``: all the split passes whatever the runner
    asked (the path before issue 58)."""
    paths: list[tuple[bool, bool]] = []
    sample = runner.sampler.sample

    def recording(*args, all_greedy: bool = False, unfiltered: bool = False, **kwargs):
        paths.append((all_greedy, unfiltered))
        if every_launch:
            all_greedy = unfiltered = False
        return sample(*args, all_greedy=all_greedy, unfiltered=unfiltered, **kwargs)

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


def _drive_traffic(launch_set: LaunchSet, lighter: ModelRunner, every: ModelRunner, weights, draft_prob: float) -> None:
    """The set's traffic into a runner that may take it and one held to every launch, against the oracle; then both
    asked for the set in every sampler call, and every bucketed step (replayed, or padded eager with graphs off) was
    one of its twins."""
    reference = pytest.importorskip("runnercheck.reference.runner")
    compare = pytest.importorskip("runnercheck.checks.compare")
    lighter_paths, every_paths = _record_paths(lighter), _record_paths(every, every_launch=True)
    sched = SchedulerSim(LIMITS, seed=1, draft_prob=draft_prob)  # drafts that differ: eager steps too
    for req_id, prompt, params in launch_set.traffic:
        sched.add_request(req_id, prompt, params)
    _drive([lighter, every], sched, reference.ReferenceRunner(weights, LIMITS, base_seed=7), compare)
    assert lighter_paths and every_paths  # asked for by both; `every` held below it
    assert all(p[launch_set.index] for p in lighter_paths + every_paths)
    stats = lighter.cuda_graph_stats()
    assert stats[f"{launch_set.mode}_bucketed"] == stats["replays"] > 0
    other = "unfiltered" if launch_set.mode == "greedy" else "greedy"
    assert stats[f"{other}_bucketed"] == 0  # the greedy launch first; the unfiltered set where a row samples
    assert getattr(lighter.state, launch_set.flag) and getattr(lighter.state, launch_set.count) == 0


@LAUNCH_SETS
def test_traffic_that_allows_the_set_takes_it_with_every_launchs_tokens_and_the_oracles(weights, launch_set):
    graphed = ModelRunner(weights, LIMITS, Device("sim", seed=2), base_seed=7)
    every = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=7, cuda_graphs=False)  # bucketed steps padded, eager
    _drive_traffic(launch_set, graphed, every, weights, draft_prob=0.7)
    assert graphed.cuda_graph_stats()["fallbacks"]  # and some ran eager (`enqueue_eager_step`), in the set too
    padded = every.cuda_graph_stats()
    assert padded[f"{launch_set.mode}_bucketed"] == padded["padded_eager"] > 0
    # Every bucket once per launch set: all the split passes, without the filter launches, the greedy launch.
    keys = set(graphed.graphs.graphs)
    split = {k for k in keys if not (k.mode.greedy or k.mode.unfiltered)}
    assert keys == {dataclasses.replace(k, mode=dataclasses.replace(k.mode, greedy=g, unfiltered=u))
                    for k in split for g, u in SAMPLER_TWINS}
    assert all(k.describe().endswith(f"-{launch_set.mode}") == getattr(k.mode, launch_set.mode) for k in keys)


def test_a_graph_mode_is_greedy_or_unfiltered_not_both():
    with pytest.raises(ValueError, match="not both"):
        GraphMode(1, -1, greedy=True, unfiltered=True)


@LAUNCH_SETS
def test_a_request_that_rules_the_set_out_holds_it_off_until_released(weights, launch_set):
    reference = pytest.importorskip("runnercheck.reference.runner")
    compare = pytest.importorskip("runnercheck.checks.compare")
    runner = ModelRunner(weights, LIMITS, Device("sim", seed=1), base_seed=5)
    paths = _record_paths(runner)
    live = _note_live(runner)
    sched = SchedulerSim(LIMITS, seed=0)
    sched.add_request("allows", (3, 4, 5), launch_set.allows)
    sched.add_request("rules_out", (6, 7), launch_set.rules_out)
    _drive([runner], sched, reference.ReferenceRunner(weights, LIMITS, base_seed=5), compare)
    assert len(paths) == len(live)  # one sampler call a step
    taken = [p[launch_set.index] for p in paths]
    assert taken == ["rules_out" not in names for names in live]
    assert taken[0] is False and taken[-1] is True  # admitted together; "allows" decodes alone at the end
    assert getattr(runner.state, launch_set.count) == 0


@pytest.mark.parametrize("native", [True, False], ids=["c-twins", "python"])
def test_the_greedy_count_moves_at_admission_and_release_and_a_bad_release_leaves_it(monkeypatch, native):
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


@pytest.mark.parametrize("native", [True, False], ids=["c-twins", "python"])
def test_the_filtered_count_moves_at_admission_and_release_and_a_bad_release_leaves_it(monkeypatch, native):
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


@LAUNCH_SETS
def test_a_runner_that_decides_the_set_from_the_first_request_is_caught_by_the_differential(weights, launch_set):
    """The planted bug: the launch set chosen from the batch's first request, which allows it, so the request behind
    it that rules it out is sampled in the lighter set (argmaxed, or unfiltered); the oracle comparison names the
    step."""
    reference = pytest.importorskip("runnercheck.reference.runner")
    compare = pytest.importorskip("runnercheck.checks.compare")
    from runnercheck.stress.mutants import catalogue

    runner = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=5)
    paths = _record_paths(runner)
    sched = SchedulerSim(LIMITS, seed=0)
    first, second = launch_set.mutant_pair
    sched.add_request("first", (3, 4, 5), first)
    sched.add_request("second", (6, 7), second)
    with catalogue.apply(launch_set.mutant, runner=runner):
        with pytest.raises(AssertionError, match="expected token"):
            _drive([runner], sched, reference.ReferenceRunner(weights, LIMITS, base_seed=5), compare)
    assert paths and all(p[launch_set.index] for p in paths)  # the lighter set from the first step: the wrong one


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@LAUNCH_SETS
def test_cuda_twins_replay_every_launchs_tokens_and_the_oracles(weights, launch_set):
    """Compiled and captured: the set's CUDA graphs (plain and fused) against eager steps held to every launch, and
    the oracle, with every capture's logits given back to the pool the later captures share."""
    graphed = ModelRunner(weights, LIMITS, Device("cuda"), base_seed=7)
    every = ModelRunner(weights, LIMITS, Device("cuda"), base_seed=7, cuda_graphs=False)
    _drive_traffic(launch_set, graphed, every, weights, draft_prob=0.5)  # drafted and undrafted decodes, mixed steps
    assert all(graph.cuda_graph is not None for key, graph in graphed.graphs.graphs.items()
               if getattr(key.mode, launch_set.mode))
    # each capture gave its logits back to the shared pool (the next capture reuses them): no graph holds a tensor
    captured = [*graphed.graphs.graphs.values(), *graphed.graphs.fused_graphs.values()]
    assert captured and not any(isinstance(v, torch.Tensor) for g in captured for v in g.step.result.values())
