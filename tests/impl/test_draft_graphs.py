"""Draft-model speculation in bucketed (CUDA-graph) steps (`runnercheck.impl.draft_proposer.DraftModelProposer.padded_launches`).

* a graphed draft-model runner (recorded closures on ``sim``, CUDA graphs on ``cuda``) produces the
  same outputs, bit for bit, as the same runner with graphs off (the bucketed launches run eagerly),
  for k = 1..3, greedy and random requests, logprobs included, over buckets padded by 0..2 rows --
  and, on CPU, the float64 oracle's tokens;
* the buckets were replayed (so the draft verify and propose ran inside them), and a draft-model
  runner captures no mixed graph;
* armed around every ``execute_model`` with two steps in flight, the sync detector counts 0;
* bucket selection for a draft-model runner (host logic): uniform decode batches only.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from runnercheck.impl.device import Device
from runnercheck.impl.interface import DraftModelConfig, RunnerLimits, SamplingParams
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import ModelRunner
from runnercheck.stress.sim.scheduler import SchedulerSim
from test_graphs import _record

LIMITS = RunnerLimits(vocab_size=256, max_num_reqs=3, max_model_len=64, max_num_batched_tokens=24, num_kv_blocks=48,
                      block_size=4, max_logprobs=2, max_num_draft_tokens=3)
needs_gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.fixture(scope="module")
def weights():
    return random_weights(preset("micro"), seed=2)


def _limits(k: int, spare: int = 0) -> RunnerLimits:
    """``spare``: draft slots past the proposer's k (its buckets are still 1 + k tokens a request)."""
    return replace(LIMITS, max_num_draft_tokens=k + spare)


def _runner(weights, kind: str, k: int, *, graphs: bool, capture_sizes=(1, 3), draft: str = "micro",
            spare: int = 0) -> ModelRunner:
    return ModelRunner(weights, _limits(k, spare), Device(kind, seed=3) if kind == "sim" else Device(kind), base_seed=7,
                       speculative=DraftModelConfig(draft, k, weights_seed=2), cuda_graphs=graphs,
                       capture_sizes=capture_sizes)


def _scheduler(k: int, limits: RunnerLimits, seed: int = 0, draft: str = "micro") -> SchedulerSim:
    """Three requests admitted together that finish one after another: decode batches of 3, 2, 1, every
    decode asking for k device drafts (uniform: bucketed)."""
    sched = SchedulerSim(limits, seed=seed, prefix_caching=False, ngram_spec_tokens=k, most_device_drafts=True,
                         draft_model=draft)
    sp = SamplingParams
    sched.add_request("a", (5, 6, 5, 6), sp(temperature=0.0, max_tokens=4))
    sched.add_request("b", (9, 9, 9), sp(temperature=1.5, seed=4, max_tokens=8, logprobs=2))
    sched.add_request("c", (1, 2, 3), sp(temperature=2.0, top_k=60, repetition_penalty=1.3, max_tokens=12))
    return sched


def lockstep(runners: list, k: int, oracle=None, max_steps: int = 60) -> None:
    """One schedule into every runner; every output equals the first's (and the oracle's tokens)."""
    sched = _scheduler(k, runners[0].limits)
    for _ in range(max_steps):
        if not sched.has_work:
            break
        step = sched.schedule()
        got = [r.execute_model(step).get() for r in runners]
        for other in got[1:]:
            assert other == got[0], f"step {step.step_id}: {other} != {got[0]}"
        if oracle is not None:
            assert got[0].sampled_token_ids == oracle.execute_model(step).sampled_token_ids, step.step_id
        sched.update(got[0])
    assert not sched.has_work


@pytest.mark.parametrize("k,capture_sizes,spare", [(3, (1, 3), 1), pytest.param(1, (3,), 0, marks=pytest.mark.slow),
                                                   pytest.param(2, (1, 2, 3), 0, marks=pytest.mark.slow)])
def test_recorded_replay_equals_eager_and_the_oracle(weights, k, capture_sizes, spare):
    """sim replays the recorded closures (a stale buffer or a host-computed shape would diverge); cpu runs the
    bucketed launches eagerly; the oracle's tokens must come out of both."""
    from runnercheck.reference.runner import ReferenceRunner

    graphed = _runner(weights, "sim", k, graphs=True, capture_sizes=capture_sizes, spare=spare)
    eager = _runner(weights, "cpu", k, graphs=False, capture_sizes=capture_sizes, spare=spare)
    assert graphed.graphs.query_lens == (1, 1 + k)
    oracle = ReferenceRunner(weights, _limits(k, spare), base_seed=7, proposer=DraftModelConfig("micro", k, weights_seed=2))
    trace: list = []
    _record(graphed, trace)
    lockstep([graphed, eager], k, oracle)
    replayed = {n for n, r in trace if r}
    assert replayed == {1, 2, 3}, trace  # every batch size, so every padding amount of its bucket
    stats = graphed.cuda_graph_stats()
    assert stats["replays"] == len([1 for _, r in trace if r]) == eager.cuda_graph_stats()["padded_eager"]
    assert stats["mixed_sizes"] == [] and all(not key.mixed for key in graphed.graphs.graphs)
    assert graphed.graphs.fused_graphs == {}  # a proposer's steps never take the fused path


def test_bucket_selection_takes_uniform_decodes_only(weights):
    runner = _runner(weights, "cpu", 3, graphs=False, capture_sizes=(1, 3))
    graphs = runner.graphs
    assert graphs.select(2, (4, 3), 0, -1, 8, 6)[0].size == 3  # padded by one
    assert graphs.select(1, (1, 0), 0, 2, 1, 0)[0].describe() == "1xq1-lp2"
    assert graphs.select(2, None, 0, -1, 7, 3) == (None, "non_uniform")  # drafts that differ
    assert graphs.select(2, None, 0, -1, 9, 0) == (None, "non_uniform")  # a prefill beside a decode: no mixed graph
    assert graphs.select(2, (3, 2), 0, -1, 6, 4) == (None, "non_uniform")  # fewer drafts than the proposer's k


@pytest.mark.parametrize("spec_query_len", [0, 4])
def test_a_drafted_mode_outside_the_draft_slots_is_a_typed_error(spec_query_len):
    from runnercheck.impl.graphs import CudaGraphManager, GraphConfigError

    with pytest.raises(GraphConfigError, match=f"spec_query_len {spec_query_len}"):
        CudaGraphManager(Device("cpu"), enabled=True, capture_sizes=None, max_num_reqs=2, max_num_batched_tokens=8,
                         max_num_draft_tokens=2, max_logprobs=0, build_step=lambda inputs, key: None, staging_bytes=0,
                         staging_layout={}, spec_query_len=spec_query_len)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("capture_sizes", [(1, 2, 3), (3,)], ids=["sizes-1-2-3", "size-3"])
def test_cuda_replay_equals_eager_bit_for_bit(weights, k, capture_sizes):
    graphed = _runner(weights, "cuda", k, graphs=True, capture_sizes=capture_sizes)
    eager = _runner(weights, "cuda", k, graphs=False, capture_sizes=capture_sizes)
    trace: list = []
    _record(graphed, trace)
    lockstep([graphed, eager], k)
    # Batches of 3, 2 and 1 on CPU; GPU numerics may finish two requests in one step, so at least two buckets.
    assert len({n for n, r in trace if r}) >= 2, trace
    assert all(g.cuda_graph is not None for g in graphed.graphs.graphs.values())


@pytest.mark.parametrize("kind", ["sim", pytest.param("cuda", marks=needs_gpu)])
def test_replay_under_the_armed_sync_detector_counts_zero(weights, kind):
    """Two steps in flight, the detector armed around every execute_model: a draft-model bucket reads nothing back."""
    from runnercheck.checks.detectors import sync

    runner = _runner(weights, kind, 3, graphs=True, capture_sizes=(1, 2, 3))
    sched = SchedulerSim(_limits(3), seed=1, max_inflight_steps=2, prefix_caching=False, ngram_spec_tokens=3,
                         most_device_drafts=True, draft_model="micro")
    for rid, prompt in (("a", (5, 6, 5)), ("b", (9, 9, 9, 9)), ("c", (1, 2))):
        sched.add_request(rid, prompt, SamplingParams(temperature=1.0, seed=len(rid), max_tokens=6, logprobs=1))
    pending = []
    report = sync.arm_runner(runner, mode="count")
    while sched.has_work or pending:
        if sched.has_work and len(pending) < 2 and sched.can_schedule:
            pending.append(runner.execute_model(sched.schedule()))
            continue
        sched.update(pending.pop(0).get())
    assert runner.cuda_graph_stats()["replays"] > 0
    assert report.mode == "count" and report.count == 0, report.summary()


def _replay_all_padding(runner: ModelRunner) -> None:
    """Every captured bucket replayed with no request named (all padding, as in a CUDA capture's warm-up): the
    proposer's live rows (drafts, q), the draft model's KV and the row state must be left as they were."""
    proposer, gen = runner.proposer, torch.Generator().manual_seed(0)
    # Filled on the CPU generator and copied (any device); the dummy row zeroed, to see the padding write it.
    proposer.proposed.copy_(torch.randint(0, 256, proposer.proposed.shape, generator=gen, dtype=torch.int32))
    proposer.q.copy_(torch.rand(proposer.q.shape, generator=gen))
    proposer.q[-1].zero_()
    kv = proposer.model.kv_cache
    kv.k.copy_(torch.randn(kv.k.shape, generator=gen))
    kv.v.copy_(torch.randn(kv.v.shape, generator=gen))
    before = [t.clone() for t in (proposer.proposed[:-1], proposer.q[:-1], kv.k, kv.v, runner.state.base)]
    runner.graphs.inputs.header.zero_()
    for graph in runner.graphs.graphs.values():
        graph.replay()  # cuda: CUDAGraph.replay on the current stream, after the fills above
    after = (proposer.proposed[:-1], proposer.q[:-1], kv.k, kv.v, runner.state.base)
    for name, b, a in zip(("proposed", "q", "draft K", "draft V", "row state"), before, after):
        assert torch.equal(b, a), name
    assert proposer.q[-1].any()  # the dummy row took the padding's q


@pytest.mark.parametrize("kind", ["cpu", pytest.param("cuda", marks=needs_gpu)])
def test_padding_requests_write_no_live_proposer_row_and_no_draft_kv(weights, kind):
    runner = _runner(weights, kind, 3, graphs=True, capture_sizes=(1, 3))
    if kind == "cuda":
        torch.cuda.synchronize()  # capture ran on the runner's stream; the checks below use the current one
    _replay_all_padding(runner)


def test_planted_bug_padding_on_a_live_proposer_row_is_caught(weights):
    """The check can fail: padding requests pointed at live row 0 instead of the dummy row overwrite its q."""
    runner = _runner(weights, "cpu", 3, graphs=True, capture_sizes=(1, 3))
    runner.proposer.dummy_row = 0
    with pytest.raises(AssertionError):
        _replay_all_padding(runner)
