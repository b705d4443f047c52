"""The runner against the float64 oracle: a scripted run with chunked prefill, decode, finish,
preempt, resume and row reuse, on cpu, on sim under every lag policy (runner one step ahead of
its outputs), and on cuda; bad SchedulerOutputs rejected mid-run with no state change."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import pytest
import torch

from runnercheck.impl.device import Device
from runnercheck.impl.interface import (
    BlockIdError,
    CachedRequest,
    CachedRequests,
    CapacityError,
    DuplicateRequestError,
    FinishedAndScheduledError,
    LogprobsLimitError,
    MaxModelLenError,
    NewRequest,
    RunnerLimits,
    SamplingParams,
    SamplingParamsError,
    ScheduledTokensError,
    SchedulerOutput,
    SchedulerOutputError,
    TokenOutOfVocabError,
    UnknownRequestError,
)
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import ModelRunner, make_runner

reference_runner = pytest.importorskip("runnercheck.reference.runner")
compare = pytest.importorskip("runnercheck.checks.compare")
sync_check = pytest.importorskip("runnercheck.checks.detectors.sync")

LIMITS = RunnerLimits(vocab_size=256, max_num_reqs=4, max_model_len=64, max_num_batched_tokens=16, num_kv_blocks=40, block_size=4)


@dataclass
class _Req:
    req_id: str
    prompt: tuple[int, ...]
    params: SamplingParams
    arrival: int
    outputs: list[int] = field(default_factory=list)  # known (read back) outputs
    num_computed: int = 0  # tokens scheduled so far in this admission
    prefill_len: int = 0
    num_sampled: int = 0  # outputs scheduled (known or in flight), over all admissions
    sampled_this_admission: int = 0
    blocks: list[int] = field(default_factory=list)
    state: str = "waiting"  # waiting, running, preempted, finished


class ScriptedScheduler:
    """A deterministic async scheduler: chunked prefill under a token budget, one step ahead of outputs.

    Finishes a request once ``max_tokens`` outputs are scheduled, preempts on the scripted steps,
    resumes a preempted request (prompt + outputs as prefill) once all its outputs are known.
    """

    def __init__(self, limits: RunnerLimits, arrivals: list[_Req], preempt_at: dict[int, str]):
        self.limits = limits
        self.reqs = {r.req_id: r for r in arrivals}
        self.preempt_at = preempt_at
        self.free_blocks = list(range(limits.num_kv_blocks))
        self.step = 0

    def _blocks_for(self, req: _Req, upto: int) -> tuple[int, ...]:
        need = -(-upto // self.limits.block_size) - len(req.blocks)
        new = tuple(self.free_blocks.pop(0) for _ in range(max(0, need)))
        req.blocks.extend(new)
        return new

    def _drop(self, req: _Req, state: str) -> None:
        self.free_blocks.extend(req.blocks)
        req.blocks, req.state = [], state

    def feed(self, req_id: str, tokens: tuple[int, ...]) -> None:
        self.reqs[req_id].outputs.extend(tokens)

    @property
    def done(self) -> bool:
        return all(r.state == "finished" for r in self.reqs.values())

    def next(self) -> SchedulerOutput:
        step, self.step = self.step, self.step + 1
        running = [r for r in self.reqs.values() if r.state == "running"]
        finished = {r.req_id for r in running if r.num_sampled >= r.params.max_tokens}
        preempted = {self.preempt_at[step]} if self.preempt_at.get(step) in {r.req_id for r in running} - finished else set()
        for rid in finished:
            self._drop(self.reqs[rid], "finished")
        for rid in preempted:
            self._drop(self.reqs[rid], "preempted")
        running = [r for r in running if r.state == "running"]
        budget = self.limits.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        cached = []
        for r in running:
            n = min(r.prefill_len - r.num_computed, budget) if r.num_computed < r.prefill_len else 1
            if n > budget:
                continue
            cached.append(CachedRequest(r.req_id, self._blocks_for(r, r.num_computed + n), r.num_computed))
            self._schedule(r, n, num_scheduled)
            budget -= n
        new = []
        waiting = [r for r in self.reqs.values() if r.arrival <= step and (
            r.state == "waiting" or (r.state == "preempted" and len(r.outputs) == r.num_sampled))]
        for r in waiting:
            if len(running) + len(new) >= self.limits.max_num_reqs or budget <= 0:
                break
            prefill = r.prompt + tuple(r.outputs)
            r.state, r.num_computed, r.prefill_len, r.sampled_this_admission = "running", 0, len(prefill), 0
            n = min(len(prefill), budget)
            block_ids = self._blocks_for(r, n)
            new.append(NewRequest(r.req_id, r.prompt, r.params, block_ids, tuple(r.outputs)))
            self._schedule(r, n, num_scheduled)
            budget -= n
        return SchedulerOutput(step, tuple(new), CachedRequests.of(cached), num_scheduled, frozenset(finished), frozenset(preempted))

    def _schedule(self, r: _Req, n: int, num_scheduled: dict[str, int]) -> None:
        r.num_computed += n
        num_scheduled[r.req_id] = n
        # A request samples once its scheduled tokens reach the end of what the runner knows.
        if r.num_computed == r.prefill_len + r.sampled_this_admission:
            r.num_sampled += 1
            r.sampled_this_admission += 1


def scenario(features: str = "light") -> ScriptedScheduler:
    """Seven requests through four rows: admissions over time, chunked prefill, two preempt/resumes.

    ``light``: greedy, temperature (seeded and derived seeds), penalties and min-p -- the sampling
    paths that are cheap under the Triton interpreter, used for the lag-policy runs.  ``full``
    adds top-k, top-p, logprobs and prompt logprobs (oracle-checked once on cpu, and on cuda).
    """
    sp = SamplingParams
    full = features == "full"
    arrivals = [
        _Req("a", tuple(range(3, 23)), sp(temperature=0.0, logprobs=2 if full else None, max_tokens=3 if full else 5), 0),
        _Req("b", (7, 8, 9), sp(temperature=0.9, seed=1234, top_k=20 if full else -1, top_p=0.9 if full else 1.0,
                                repetition_penalty=1.3, max_tokens=6), 0),
        _Req("c", tuple(range(100, 109)), sp(min_p=0.05, frequency_penalty=0.5, prompt_logprobs=3 if full else None, max_tokens=4), 1),
        _Req("d", (42,), sp(temperature=0.7, presence_penalty=0.7, max_tokens=6), 2),
        _Req("e", tuple(range(50, 62)), sp(temperature=0.0, repetition_penalty=1.2, max_tokens=5), 3),
        _Req("f", (5, 6, 7, 8, 9, 10), sp(max_tokens=4), 4),
        _Req("g", tuple(range(200, 205)), sp(temperature=1.2, seed=99, top_k=5 if full else -1, max_tokens=6), 6),
    ]
    return ScriptedScheduler(LIMITS, arrivals, preempt_at={3: "c", 5: "b"})


def _weights():
    return random_weights(preset("micro"), seed=3)


def drive(runner, judge, sched_source: ScriptedScheduler, max_steps: int = 40, before_step=None) -> list:
    """Run the scripted schedule through ``runner`` one step ahead of its outputs.

    Step N's output is read only after step N+1 was submitted; ``judge(sched, got)`` returns the
    tokens to feed back to the scheduler (the runner's, once the judge accepted them).
    """
    pending: list[tuple[SchedulerOutput, object]] = []
    trace: list = []

    def settle(sched: SchedulerOutput, async_out) -> None:
        got = async_out.get()
        judge(sched, got)
        trace.append((sched, got))
        for rid, toks in got.token_dict().items():
            sched_source.feed(rid, toks)

    for _ in range(max_steps):
        if sched_source.done:
            break
        sched = sched_source.next()
        if before_step is not None:
            before_step(sched.step_id, runner)
        pending.append((sched, runner.execute_model(sched)))
        if len(pending) > 1:
            settle(*pending.pop(0))
    while pending:
        settle(*pending.pop(0))
    assert sched_source.done, "scenario did not finish"
    return trace


def oracle_judge(oracle, stats: dict):
    """Compare with the oracle; ties (oracle gap < TIE_TOLERANCE or fragile) adopt the runner's token."""

    def judge(sched: SchedulerOutput, got) -> None:
        expected = oracle.execute_model(sched)
        cmp = compare.compare_step(got, expected, oracle.last_results, positions=compare.first_output_positions(sched))
        assert cmp.ok, "\n".join(d.line() for d in cmp.divergences)
        for tie in cmp.ties:
            oracle.replace_output_token(tie.req_id, 0, got.token_dict()[tie.req_id][-1])
        stats["ties"] = stats.get("ties", 0) + len(cmp.ties)
        stats["tokens"] = stats.get("tokens", 0) + cmp.tokens_compared

    return judge


def trace_judge(reference_trace: list):
    """Bit-identical to the oracle-judged cpu run: lag and device timing must not change a token."""
    expected = iter(reference_trace)

    def judge(sched: SchedulerOutput, got) -> None:
        want_sched, want = next(expected)
        assert sched == want_sched, f"step {sched.step_id}: the schedule diverged from the reference run"
        assert got == want, f"step {sched.step_id}: {got.token_dict()} != reference {want.token_dict()}"

    return judge


def _oracle_run(device: Device, features: str) -> tuple[list, dict, ModelRunner]:
    weights = _weights()
    runner = make_runner(weights, LIMITS, device, 5)
    oracle = reference_runner.ReferenceRunner(weights, LIMITS, base_seed=5)
    stats: dict = {}
    trace = drive(runner, oracle_judge(oracle, stats), scenario(features))
    return trace, stats, runner


@pytest.fixture(scope="module")
def oracle_checked_trace():
    """The light scripted run on cpu, every step judged by the float64 oracle (once per module)."""
    return _oracle_run(Device("cpu"), "light")


def test_runner_matches_oracle_cpu(oracle_checked_trace):
    trace, stats, runner = oracle_checked_trace
    assert stats["tokens"] >= 30
    assert runner.state.num_live == 0
    # Seven admissions plus two resumes through four rows: rows were freed and reused.
    assert runner.state._next_generation == 9
    assert any(r.is_resumed for sched, _ in trace for r in sched.new_requests)
    assert any(len(v) == 0 for _, out in trace for v in out.sampled_token_ids), "no partial prefill chunk"


def test_runner_matches_oracle_cpu_all_sampling_features(monkeypatch):
    import runnercheck.impl.eager_step as eager_step

    # Prompt logprobs in chunks of two positions: several chunks per step, still equal to the oracle.
    monkeypatch.setattr(eager_step, "PROMPT_CHUNK_ROWS", 2)
    trace, stats, _ = _oracle_run(Device("cpu"), "full")
    assert stats["tokens"] >= 30
    assert any(out.prompt_logprobs for _, out in trace) and any(lp for _, out in trace for lp in out.logprobs)


@pytest.mark.parametrize("policy", ["run-immediately", "lag-2-steps", "random-drain"])
def test_runner_matches_oracle_sim(policy, oracle_checked_trace):
    trace, _, _ = oracle_checked_trace
    runner = make_runner(_weights(), LIMITS, Device("sim", seed=11, lag_policy=policy), 5)
    syncs = sync_check.arm_runner(runner, "count")
    assert len(drive(runner, trace_judge(trace), scenario())) == len(trace)
    # The only host waits inside execute_model are the counted back-pressure waits.
    waits = runner.state.num_quarantine_waits + runner.staging.num_backpressure_waits + runner.outputs.num_backpressure_waits
    assert syncs.count == waits, syncs.summary()


@pytest.mark.gpu
@pytest.mark.parametrize("features", ["light", "full"])
def test_runner_matches_oracle_cuda(features):
    _, stats, _ = _oracle_run(Device("cuda"), features)
    assert stats["tokens"] >= 30


@pytest.mark.gpu
def test_runner_matches_oracle_cuda_while_the_gpu_lags():
    """A spin kernel before every step keeps the GPU behind the host, so rows, staging slots and
    output slots are reused while earlier work is still queued: the real-hardware race run."""
    device = Device("cuda")
    weights = _weights()
    runner = make_runner(weights, LIMITS, device, 5)
    oracle = reference_runner.ReferenceRunner(weights, LIMITS, base_seed=5)
    execute = runner.execute_model

    def lagging(sched):
        device.inject_delay(20_000)
        return execute(sched)

    runner.execute_model = lagging
    stats: dict = {}
    drive(runner, oracle_judge(oracle, stats), scenario("full"))
    assert stats["tokens"] >= 30


# --------------------------------------------------------------------------- bad inputs


def _fingerprint(runner: ModelRunner) -> str:
    """Everything host-visible a rejected step must leave unchanged."""
    st = runner.state
    h = hashlib.sha256()
    h.update(repr(sorted((k, v.num_tokens, v.num_computed_upper, v.num_blocks) for k, v in st.live.items())).encode())
    h.update(repr(sorted(st.req_to_row.items())).encode())
    h.update(repr(list(st._free)).encode())
    h.update(st.prefill_tokens.numpy().tobytes())
    h.update(st.num_blocks.tobytes())  # the block table's columns in use
    h.update(repr([s.state for s in runner.staging.slots]).encode())
    ss = runner.sampling_state
    pending = (st.row_state.num_pending, runner.block_table.table.num_pending, ss.num_pending,
               [t.num_pending for t in ss._staged])
    h.update(repr(pending).encode())
    h.update(repr(runner.device.step_index).encode())
    return h.hexdigest()


def _bad_variants(sched_step: int, runner: ModelRunner) -> list[tuple[type, SchedulerOutput]]:
    live = list(runner.state.live)
    some = live[0] if live else None
    good = SamplingParams(temperature=0.0)
    lr = runner.state.live.get(some) if some else None
    # Make room for the one new request of each variant, so the variant trips its own check.
    room = frozenset({some}) if len(live) >= LIMITS.max_num_reqs else frozenset()

    def one_new(req: NewRequest, n: int) -> SchedulerOutput:
        return SchedulerOutput(sched_step, new_requests=(req,), num_scheduled_tokens={req.req_id: n}, finished_req_ids=room)

    bad: list[tuple[type, SchedulerOutput]] = [
        (UnknownRequestError, SchedulerOutput(sched_step, num_scheduled_tokens={"nobody": 1})),
        (TokenOutOfVocabError, one_new(NewRequest("x", (1, 999), good, (0,)), 2)),
        (SamplingParamsError, one_new(NewRequest("x", (1, 2), SamplingParams(temperature=-1.0), (0,)), 2)),
        (SamplingParamsError, one_new(NewRequest("x", (1, 2), SamplingParams(top_p=0.0), (0,)), 2)),
        (LogprobsLimitError, one_new(NewRequest("x", (1, 2), SamplingParams(logprobs=LIMITS.max_logprobs + 1), (0,)), 2)),
        (BlockIdError, one_new(NewRequest("x", (1, 2), good, (LIMITS.num_kv_blocks,)), 2)),
        (BlockIdError, one_new(NewRequest("x", (1,) * 8, good, (0,)), 8)),
        (BlockIdError, one_new(NewRequest("x", (1, 2), good, tuple(range(17))), 2)),
        (MaxModelLenError, one_new(NewRequest("x", (1,) * 65, good, tuple(range(17))), 1)),
        (ScheduledTokensError, one_new(NewRequest("x", (1,) * 20, good, tuple(range(5))), 17)),
        (CapacityError, SchedulerOutput(sched_step, new_requests=tuple(NewRequest(f"x{i}", (1,), good, (i,)) for i in range(5)))),
    ]
    if some is not None:
        bad += [
            (DuplicateRequestError, SchedulerOutput(sched_step, new_requests=(NewRequest(some, (1,), good, (0,)),))),
            (FinishedAndScheduledError, SchedulerOutput(sched_step, finished_req_ids=frozenset({some}), num_scheduled_tokens={some: 1})),
            (ScheduledTokensError, SchedulerOutput(sched_step, cached_requests=CachedRequests.of((CachedRequest(some, (), max(0, lr.num_computed_upper - 1)),)))),
            (ScheduledTokensError, SchedulerOutput(sched_step, cached_requests=CachedRequests.of((CachedRequest(some, (), lr.num_computed_upper),)),
                                                   num_scheduled_tokens={some: lr.num_tokens - lr.num_computed_upper + 1})),
        ]
    return bad


def test_bad_scheduler_outputs_change_nothing_and_run_continues(oracle_checked_trace):
    trace, _, _ = oracle_checked_trace
    runner = make_runner(_weights(), LIMITS, Device("sim", seed=2, lag_policy="lag-2-steps"), 5)
    seen: set[type] = set()

    def inject(step: int, r: ModelRunner) -> None:
        if step not in (2, 5, 9):
            return
        for cls, bad in _bad_variants(step, r):
            before = _fingerprint(r)
            with pytest.raises(cls) as info:
                r.execute_model(bad)
            assert isinstance(info.value, SchedulerOutputError)
            assert _fingerprint(r) == before, f"{cls.__name__} changed runner state"
            seen.add(cls)

    drive(runner, trace_judge(trace), scenario(), before_step=inject)
    assert {UnknownRequestError, DuplicateRequestError, TokenOutOfVocabError, BlockIdError, MaxModelLenError,
            ScheduledTokensError, CapacityError, FinishedAndScheduledError, SamplingParamsError} <= seen


def test_step_stats_and_no_wait_in_steady_state():
    runner = make_runner(_weights(), LIMITS, Device("sim", seed=1, lag_policy="lag-2-steps"), 0)
    sync_check.arm_runner(runner, "error")  # any host read or wait inside execute_model raises
    s0 = SchedulerOutput(0, new_requests=(NewRequest("a", (1, 2, 3), SamplingParams(temperature=0.0), (0,)),), num_scheduled_tokens={"a": 3})
    outs = [runner.execute_model(s0)]
    prefill_stats = runner.last_step_stats
    for step in range(1, 5):
        cached = CachedRequest("a", (1,) if step == 1 else (), 2 + step)
        outs.append(runner.execute_model(SchedulerOutput(step, cached_requests=CachedRequests.of((cached,)), num_scheduled_tokens={"a": 1})))
    decode_stats = runner.last_step_stats
    assert runner.device.num_pending > 0, "lag-2-steps should leave work queued"
    tokens = [o.get().sampled_token_ids[0] for o in outs]
    assert all(len(t) == 1 for t in tokens)
    # A decode step uploads only the compact per-step arrays (rows, query_start_loc, ...), well
    # under a prefill step that also carries the admission's staged diffs.
    assert 0 < decode_stats.h2d_bytes < prefill_stats.h2d_bytes
    # The 32-byte header (the step's counts, 6 words aligned) and the compact arrays, and room for a block append
    # per request: what the fused step's lane copy reads (`runnercheck.impl.lanes.SteadyLanes.in_bytes`).
    assert decode_stats.h2d_bytes == runner.lanes.in_bytes(1) <= 8 * 16 + 48
    # The steady decode step is one enqueue: its bucket's fused graph (the slot's copy in, apply, pad, input
    # prep .. post-update, the output's copy out).
    assert decode_stats.graph_replayed and decode_stats.graph_fallback is None and decode_stats.steady
    assert decode_stats.num_enqueued == 1 and prefill_stats.graph_replayed and prefill_stats.graph_fallback is None
    # Steps 2-4 are steady; one whose lane's output slot still held an unfinished output (the device lags two
    # steps) took the plain graph instead, without a wait.
    assert runner.cuda_graph_stats()["fused_replays"] >= 2


def test_planted_host_read_in_execute_model_is_caught(monkeypatch):
    """The no-wait test above can fail: a stray read of device state inside the step is trapped."""
    runner = make_runner(_weights(), LIMITS, Device("sim", seed=1, lag_policy="lag-2-steps"), 0)
    sync_check.arm_runner(runner, "error")
    original = ModelRunner._update_rows

    def reads_device(self, sched):
        self.state.base[0, 0].item()
        return original(self, sched)

    monkeypatch.setattr(ModelRunner, "_update_rows", reads_device)
    s0 = SchedulerOutput(0, new_requests=(NewRequest("a", (1, 2, 3), SamplingParams(temperature=0.0), (0,)),), num_scheduled_tokens={"a": 3})
    with pytest.raises(sync_check.HostSyncError):
        runner.execute_model(s0)


def test_nan_logits_are_flagged_like_the_oracle():
    weights = _weights()
    weights.lm_head[17] = float("nan")  # every logit row holds a NaN at token 17
    runner = make_runner(weights, LIMITS, Device("cpu"), 5)
    oracle = reference_runner.ReferenceRunner(weights, LIMITS, base_seed=5)
    judge = oracle_judge(oracle, {})
    p = SamplingParams(temperature=0.8, seed=3)
    steps = [
        SchedulerOutput(0, (NewRequest("n", tuple(range(1, 11)), p, (0, 1, 2)),), CachedRequests(), {"n": 6}),  # partial chunk
        SchedulerOutput(1, (), CachedRequests.of((CachedRequest("n", (), 6),)), {"n": 4}),
        SchedulerOutput(2, (), CachedRequests.of((CachedRequest("n", (), 10),)), {"n": 1}),
    ]
    flags = []
    for sched in steps:
        got = runner.execute_model(sched).get()
        judge(sched, got)
        flags.append(got.nan_flags)
    assert flags == [(False,), (True,), (True,)]


def test_profile_is_a_dummy_forward_that_leaves_state_alone():
    runner = make_runner(_weights(), LIMITS, Device("cpu"), 0)
    before = _fingerprint(runner)
    cache = runner.model.kv_cache.k.clone()
    report = runner.profile()
    assert report["num_tokens"] == LIMITS.max_num_batched_tokens and report["kv_cache_bytes"] > 0
    assert _fingerprint(runner) == before
    assert torch.equal(runner.model.kv_cache.k, cache), "padding slots must not write the KV cache"


def test_one_h2d_and_one_apply_launch_per_step():
    """Row state, block tables and sampling params of two admissions reach the device through one
    staging copy and one apply launch (two admissions: more than a mixed bucket's lane copy holds); a
    graphed decode's diffs (a new block) ride in its staging slot and are applied inside its graph
    replay, with no apply of their own; it and the steady step after it are their bucket's fused replay
    alone, which copies the slot in itself (`runnercheck.impl.lanes`)."""
    device = Device("sim", seed=1, lag_policy="run-immediately")
    runner = make_runner(_weights(), LIMITS, device, 0)
    device.trace = []
    p = SamplingParams(temperature=0.7, top_k=5, seed=3)
    steps = [
        SchedulerOutput(0, new_requests=(NewRequest("a", (1, 2, 3), p, (0,)), NewRequest("b", (4, 5), p, (1,))),
                        num_scheduled_tokens={"a": 3, "b": 2}),
        SchedulerOutput(1, cached_requests=CachedRequests.of((CachedRequest("a", (2,), 3), CachedRequest("b", (), 2))), num_scheduled_tokens={"a": 1, "b": 1}),
        SchedulerOutput(2, cached_requests=CachedRequests.of((CachedRequest("a", (), 4), CachedRequest("b", (), 3))), num_scheduled_tokens={"a": 1, "b": 1}),
    ]
    counts = []
    for sched in steps:
        device.trace.clear()
        runner.execute_model(sched).get()
        labels = list(device.trace)
        counts.append((sum(x.startswith("h2d") for x in labels), sum(x.startswith("apply") for x in labels),
                       sum(x.startswith("graph replay") for x in labels), sum(x.startswith("fused graph replay") for x in labels),
                       sum(x.startswith("copy first staging slot") for x in labels)))
    # The admissions: a mixed graph applies their diffs; their count reset reads the step buffer (no copy into it).
    assert counts == [(1, 0, 1, 0, 0), (0, 0, 0, 1, 0), (0, 0, 0, 1, 0)]
    assert runner.block_table.base[runner.state.req_to_row["a"], :2].tolist() == [0, 2]  # step 1's block, applied in the graph


def _python_lines_of_a_decode_step(num_reqs: int) -> int:
    """Python lines executed by one steady-state decode step (device work dropped: host bookkeeping only)."""
    import gc
    import sys

    device = Device("cpu")
    device.enqueue = lambda fn, label="": None  # the host side alone; nothing here reads results
    limits = RunnerLimits(vocab_size=256, max_num_reqs=num_reqs, max_model_len=64, max_num_batched_tokens=4 * num_reqs,
                          num_kv_blocks=num_reqs, block_size=16)
    runner = make_runner(_weights(), limits, device, 0)
    ids = [f"r{i}" for i in range(num_reqs)]
    p = SamplingParams(temperature=0.5)
    runner.execute_model(SchedulerOutput(0, new_requests=tuple(NewRequest(r, (1, 2, 3, 4), p, (i,)) for i, r in enumerate(ids)),
                                         num_scheduled_tokens={r: 4 for r in ids}))

    def decode(step: int) -> SchedulerOutput:
        return SchedulerOutput(step, cached_requests=CachedRequests.of(tuple(CachedRequest(r, (), 3 + step) for r in ids)),
                               num_scheduled_tokens={r: 1 for r in ids})

    runner.execute_model(decode(1))
    sched, lines = decode(2), [0]

    def tracer(frame, event, arg):
        if event == "line":
            lines[0] += 1
        return tracer

    # A collection inside the traced step would count the finalizers it runs (objects of earlier tests).
    gc.collect()
    gc.disable()
    sys.settrace(tracer)
    try:
        runner.execute_model(sched)
    finally:
        sys.settrace(None)
        gc.enable()
    return lines[0]


def test_steady_decode_step_has_no_python_loop_over_requests():
    """The bookkeeping of a decode step (no admissions, finishes, new blocks) runs the same Python lines
    for 8 requests as for 64: every per-request pass is a C-level one (map, dict views, numpy)."""
    small, large = _python_lines_of_a_decode_step(8), _python_lines_of_a_decode_step(64)
    assert large == small, f"{large - small} more Python lines for 56 more requests"


def test_planted_per_request_loop_is_caught(monkeypatch):
    """The test above can fail: a mirror update that walks the batch in Python shows up as extra lines."""
    from runnercheck.impl.state import RequestStateTable

    original = RequestStateTable.advance

    def advance_walking_requests(self, req_ids, num_scheduled, num_drafts):
        for req_id in req_ids:
            self.req_to_row[req_id]
        return original(self, req_ids, num_scheduled, num_drafts)

    monkeypatch.setattr(RequestStateTable, "advance", advance_walking_requests)
    assert _python_lines_of_a_decode_step(64) > _python_lines_of_a_decode_step(8)
