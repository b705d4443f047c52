"""SchedulerSim invariants, driven by a fake runner whose tokens are a pure function of position.

Because the fake runner's token at sequence index p of request r is ``f(r, p)``, a request that
was chunked, preempted, resumed, or decoded with drafts must produce exactly the outputs
``f(r, len(prompt)), f(r, len(prompt) + 1), ...`` -- any bookkeeping slip in the scheduler
(wrong num_computed, lost in-flight token, resumed too early) shows up as a wrong token.
"""
from __future__ import annotations

import hashlib
import random
from collections import deque

import pytest

from runnercheck.impl.interface import ModelRunnerOutput, RunnerLimits, SamplingParams, SchedulerOutput
from runnercheck.stress.run.runners import RunnerBoundaryMirror
from runnercheck.stress.sim.scheduler import RequestStatus, SchedulerSim, SchedulerSimError

VOCAB = 8  # small, so that drafts guessed from history get accepted now and then


def f(req_id: str, position: int) -> int:
    return hashlib.blake2b(f"{req_id}:{position}".encode(), digest_size=4).digest()[0] % VOCAB


class FakeRunner:
    """Validates every step at the boundary, tracks sequences, samples ``f(req, position)``.

    It also keeps a miniature KV cache: each slot ``(block, offset)`` holds the token prefix that
    was "computed" into it, and every step checks that each scheduled request's context (prefix
    hits included) is found in its blocks -- so a prefix-cache bookkeeping slip in the scheduler
    (a wrong hit, a shared block reused while referenced) fails here.
    """

    def __init__(self, limits: RunnerLimits):
        self.mirror = RunnerBoundaryMirror(limits)
        self.block_size = limits.block_size
        self.seqs: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.blocks: dict[str, list[int]] = {}
        self.kv: dict[tuple[int, int], tuple[int, ...]] = {}
        self.accepted_drafts = 0
        self.hits = 0

    def _check_context(self, rid: str, start: int, tokens: list[int]) -> None:
        bs, blocks = self.block_size, self.blocks[rid]
        for p in range(start):
            slot = (blocks[p // bs], p % bs)
            assert self.kv.get(slot) == tuple(tokens[: p + 1]), f"{rid}: position {p} in block {slot[0]} holds another prefix"

    def _write(self, rid: str, start: int, end: int, tokens: list[int]) -> None:
        bs, blocks = self.block_size, self.blocks[rid]
        for p in range(start, end):
            self.kv[(blocks[p // bs], p % bs)] = tuple(tokens[: p + 1])

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self.mirror.check(sched)
        for rid in sched.finished_req_ids | sched.preempted_req_ids:
            del self.seqs[rid], self.computed[rid], self.blocks[rid]
        for req in sched.new_requests:
            plen = len(req.prompt_token_ids)
            assert list(req.output_token_ids) == [f(req.req_id, plen + i) for i in range(len(req.output_token_ids))]
            self.seqs[req.req_id] = list(req.prefill_token_ids)
            self.computed[req.req_id] = req.num_computed_tokens
            self.blocks[req.req_id] = list(req.block_ids)
            self.hits += req.num_computed_tokens > 0
        for c in sched.cached_requests:
            self.computed[c.req_id] = c.num_computed_tokens
            self.blocks[c.req_id] += c.new_block_ids
        sampled = []
        for rid, n in sched.num_scheduled_tokens.items():
            seq, start = self.seqs[rid], self.computed[rid]
            drafts = list(sched.draft_token_ids.get(rid, ()))
            self._check_context(rid, start, seq)
            self._write(rid, start, start + n, seq + drafts)
            produced: list[int] = []
            if start + n == len(seq) + len(drafts):
                for j in range(len(drafts) + 1):
                    tok = f(rid, len(seq) + j)
                    produced.append(tok)
                    if j == len(drafts) or tok != drafts[j]:
                        break
                seq.extend(produced)
                self.accepted_drafts += len(produced) - 1
                self.computed[rid] = min(start + n, len(seq) - 1)
            else:
                assert start + n < len(seq), "scheduled past the known tokens"
                self.computed[rid] = start + n
            sampled.append(tuple(produced))
        out = ModelRunnerOutput(sched.step_id, tuple(sched.num_scheduled_tokens), tuple(sampled))
        self.mirror.observe(out)
        return out


def limits(**kw) -> RunnerLimits:
    base = dict(vocab_size=VOCAB, max_num_reqs=4, max_model_len=64, max_num_batched_tokens=16, num_kv_blocks=13, block_size=4)
    base.update(kw)
    return RunnerLimits(**base)


def drive(sim: SchedulerSim, runner: FakeRunner, *, ahead: int, on_tick=None, min_ticks: int = 0, max_ticks: int = 2000) -> list[SchedulerOutput]:
    """Run to completion keeping up to ``ahead`` steps' outputs undelivered."""
    pending: deque[ModelRunnerOutput] = deque()
    steps = []
    for tick in range(max_ticks):
        if on_tick is not None:
            on_tick(tick)
        if not sim.has_work and not pending and tick >= min_ticks:
            return steps
        if sim.can_schedule:
            sched = sim.schedule()
            sim.check_invariants()
            assert sched.total_num_scheduled_tokens <= sim.limits.max_num_batched_tokens
            steps.append(sched)
            pending.append(runner.execute(sched))
        while pending and (len(pending) > ahead or not sim.can_schedule):
            sim.update(pending.popleft())
            sim.check_invariants()
    raise AssertionError("scheduler did not finish")


def expected_outputs(req_id: str, prompt_len: int, params: SamplingParams, max_model_len: int) -> list[int]:
    out = []
    while True:
        tok = f(req_id, prompt_len + len(out))
        out.append(tok)
        if tok in params.stop_token_ids or len(out) >= params.max_tokens or prompt_len + len(out) >= max_model_len:
            return out


@pytest.mark.parametrize("ahead,draft_prob", [(0, 0.0), (1, 0.0), (1, 0.4), (2, 0.2)])
def test_random_workload_every_step_valid_and_outputs_exact(ahead: int, draft_prob: float) -> None:
    lim = limits()
    rng = random.Random(1234 + ahead)
    sim = SchedulerSim(lim, seed=5, max_inflight_steps=ahead, draft_prob=draft_prob)
    runner = FakeRunner(lim)
    prompts: dict[str, tuple[int, SamplingParams]] = {}
    aborted: set[str] = set()

    def on_tick(tick: int) -> None:
        if tick < 60 and rng.random() < 0.5:
            rid = f"q{len(prompts)}"
            plen = rng.randint(1, 30)
            stop = (f(rid, plen + rng.randint(0, 12)),) if rng.random() < 0.5 else ()
            params = SamplingParams(max_tokens=rng.randint(1, 20), stop_token_ids=stop)
            sim.add_request(rid, [rng.randrange(VOCAB) for _ in range(plen)], params)
            prompts[rid] = (plen, params)
        if tick < 60 and rng.random() < 0.1 and sim.running_ids:
            sim.preempt(rng.choice(sim.running_ids))
        if tick < 60 and rng.random() < 0.03 and sim.unfinished_ids:
            victim = rng.choice(sim.unfinished_ids)
            if sim.abort(victim):
                aborted.add(victim)

    steps = drive(sim, runner, ahead=ahead, on_tick=on_tick, min_ticks=60)
    assert set(sim.finished) == set(prompts)
    for rid, (plen, params) in prompts.items():
        want = expected_outputs(rid, plen, params, lim.max_model_len)
        got = list(sim.outputs(rid))
        if rid in aborted:
            assert got == want[: len(got)]
            assert sim.finished[rid] == "abort"
        else:
            assert got == want, rid
            assert sim.finished[rid] == ("stop" if got[-1] in params.stop_token_ids else "length")
    stats = sim.stats
    assert stats.preempted_for_blocks > 0 and stats.preempted_forced > 0 and stats.resumed > 0
    assert any(s.new_requests and any(r.output_token_ids for r in s.new_requests) for s in steps)
    assert any(len(s.num_scheduled_tokens) > 1 for s in steps)
    if draft_prob:
        assert stats.draft_steps > 0 and runner.accepted_drafts > 0
    if ahead:
        # one-step-ahead: some request decodes in consecutive steps, i.e. before its output arrived
        consecutive = sum(
            1 for a, b in zip(steps, steps[1:])
            if set(a.num_scheduled_tokens) & {c.req_id for c in b.cached_requests}
        )
        assert consecutive > 0


def test_chunked_prefill_respects_budget_and_samples_only_at_the_end() -> None:
    lim = limits(max_num_batched_tokens=16, num_kv_blocks=16)
    sim = SchedulerSim(lim, seed=0, max_inflight_steps=0)
    runner = FakeRunner(lim)
    sim.add_request("a", [i % VOCAB for i in range(40)], SamplingParams(max_tokens=2))
    steps = drive(sim, runner, ahead=0)
    assert [s.num_scheduled_tokens["a"] for s in steps[:4]] == [16, 16, 8, 1]
    assert [c.num_computed_tokens for s in steps[1:4] for c in s.cached_requests] == [16, 32, 40]
    assert sim.outputs("a") == tuple(expected_outputs("a", 40, SamplingParams(max_tokens=2), lim.max_model_len))


def test_async_decode_counts_the_in_flight_token() -> None:
    lim = limits()
    sim = SchedulerSim(lim, seed=0, max_inflight_steps=1)
    sim.add_request("a", [1, 2, 3], SamplingParams(max_tokens=5))
    s0 = sim.schedule()
    s1 = sim.schedule()  # before step 0's output: decode of the token step 0 samples
    assert s0.num_scheduled_tokens == {"a": 3}
    assert s1.num_scheduled_tokens == {"a": 1} and s1.cached_requests.num_computed_tokens[0] == 3
    with pytest.raises(SchedulerSimError, match="in flight"):
        sim.schedule()
    with pytest.raises(SchedulerSimError, match="oldest step in flight is 0"):
        sim.update(ModelRunnerOutput(1, ("a",), ((7,),)))


def test_max_tokens_never_overscheduled_with_async() -> None:
    lim = limits()
    sim = SchedulerSim(lim, seed=0, max_inflight_steps=1)
    sim.add_request("a", [1, 2, 3], SamplingParams(max_tokens=3))
    steps = drive(sim, FakeRunner(lim), ahead=1)
    sampling_steps = [s for s in steps if "a" in s.num_scheduled_tokens]
    assert len(sampling_steps) == 3  # prefill + 2 decodes: no wasted 4th sample
    assert sim.stats.dropped_tokens == 0 and sim.finished == {"a": "length"}
    assert "a" in steps[-1].finished_req_ids


def test_stop_token_late_sample_dropped_and_finished_id_sent_next_step() -> None:
    lim = limits()
    runner = FakeRunner(lim)
    rid = next(r for r in (f"a{i}" for i in range(100)) if f(r, 3) != f(r, 4))
    stop = f(rid, 4)  # the second output token
    sim = SchedulerSim(lim, seed=0, max_inflight_steps=1)
    sim.add_request(rid, [1, 2, 3], SamplingParams(max_tokens=10, stop_token_ids=(stop,)))
    outs = deque()
    outs.append(runner.execute(sim.schedule()))  # step 0: prefill, samples f(a,3)
    outs.append(runner.execute(sim.schedule()))  # step 1: decode, samples the stop token
    sim.update(outs.popleft())
    outs.append(runner.execute(sim.schedule()))  # step 2: decode scheduled before the stop is known
    sim.update(outs.popleft())  # the stop arrives
    assert sim.status(rid) is RequestStatus.FINISHED and sim.finished[rid] == "stop"
    s3 = sim.schedule()
    assert s3.finished_req_ids == {rid} and not s3.num_scheduled_tokens
    runner.execute(s3)
    sim.update(outs.popleft())  # step 2's token arrives after the finish: dropped
    assert sim.outputs(rid) == (f(rid, 3), stop) and sim.stats.dropped_tokens == 1


def test_preempted_request_resumes_only_after_its_outputs_arrive() -> None:
    lim = limits()
    runner = FakeRunner(lim)
    sim = SchedulerSim(lim, seed=0, max_inflight_steps=1)
    sim.add_request("a", [1, 2, 3], SamplingParams(max_tokens=6))
    o0 = runner.execute(sim.schedule())  # prefill samples f(a, 3), in flight
    assert sim.preempt("a")
    s1 = sim.schedule()
    assert s1.preempted_req_ids == {"a"} and not s1.new_requests
    o1 = runner.execute(s1)
    assert not sim.can_schedule  # blocked: its output is still in flight
    sim.update(o0)
    s2 = sim.schedule()
    assert [r.req_id for r in s2.new_requests] == ["a"]
    assert s2.new_requests[0].output_token_ids == (f("a", 3),)
    assert s2.num_scheduled_tokens["a"] == 4
    sim.update(o1)
    pending = deque([runner.execute(s2)])
    while sim.has_work:
        if sim.can_schedule:
            pending.append(runner.execute(sim.schedule()))
        while pending and (len(pending) > 1 or not sim.can_schedule):
            sim.update(pending.popleft())
    assert list(sim.outputs("a")) == expected_outputs("a", 3, SamplingParams(max_tokens=6), lim.max_model_len)


def test_block_shortage_preempts_the_most_recent_admission() -> None:
    lim = limits(num_kv_blocks=4, block_size=4, max_num_batched_tokens=32)
    sim = SchedulerSim(lim, seed=0, max_inflight_steps=0)
    runner = FakeRunner(lim)
    sim.add_request("old", [1] * 7, SamplingParams(max_tokens=8))
    sim.add_request("new", [2] * 7, SamplingParams(max_tokens=8))
    s0 = sim.schedule()  # both admitted: 2 + 2 blocks, pool empty
    assert set(s0.num_scheduled_tokens) == {"old", "new"} and sim.num_free_blocks == 0
    sim.update(runner.execute(s0))
    s1 = sim.schedule()  # both decode at position 7 (fits); then position 8 needs a 3rd block
    sim.update(runner.execute(s1))
    s2 = sim.schedule()
    assert s2.preempted_req_ids == {"new"} and "old" in s2.num_scheduled_tokens
    sim.update(runner.execute(s2))
    drive(sim, runner, ahead=0)
    for rid in ("old", "new"):
        assert list(sim.outputs(rid)) == expected_outputs(rid, 7, SamplingParams(max_tokens=8), lim.max_model_len)


def test_abort_running_is_announced_waiting_is_not() -> None:
    lim = limits(max_num_reqs=1)
    sim = SchedulerSim(lim, seed=0, max_inflight_steps=0)
    runner = FakeRunner(lim)
    sim.add_request("a", [1, 2], SamplingParams(max_tokens=4))
    sim.add_request("b", [1, 2], SamplingParams(max_tokens=4))
    sim.update(runner.execute(sim.schedule()))
    assert sim.abort("a") and sim.abort("b") and not sim.abort("a")
    s = sim.schedule()
    assert s.finished_req_ids == {"a"} and not s.num_scheduled_tokens
    sim.update(runner.execute(s))
    assert not sim.has_work and sim.finished == {"a": "abort", "b": "abort"}


def test_bad_calls_raise_typed_errors() -> None:
    lim = limits(num_kv_blocks=2, block_size=4)
    sim = SchedulerSim(lim, seed=0)
    sim.add_request("a", [1], SamplingParams(max_tokens=2))
    with pytest.raises(SchedulerSimError, match="already added"):
        sim.add_request("a", [1], SamplingParams())
    with pytest.raises(SchedulerSimError, match="more than the pool"):
        sim.add_request("big", [1] * 5, SamplingParams(max_tokens=8))
    with pytest.raises(SchedulerSimError, match="empty prompt"):
        sim.add_request("e", [], SamplingParams())
    with pytest.raises(SchedulerSimError, match="unknown request"):
        sim.abort("nope")
    with pytest.raises(SchedulerSimError, match="no step is in flight"):
        sim.update(ModelRunnerOutput(0, (), ()))
    assert not sim.preempt("a")  # waiting, not running
    s0 = sim.schedule()
    with pytest.raises(SchedulerSimError, match="returned 2 tokens"):
        sim.update(ModelRunnerOutput(s0.step_id, ("a",), ((1, 2),)))


def test_boundary_mirror_catches_a_planted_scheduling_bug() -> None:
    """The mirror exists to reject invalid steps: plant one (a decode past the known tokens)."""
    from dataclasses import replace

    from runnercheck.impl.interface import ScheduledTokensError

    lim = limits()
    sim = SchedulerSim(lim, seed=0, max_inflight_steps=0)
    runner = FakeRunner(lim)
    sim.add_request("a", [1, 2, 3], SamplingParams(max_tokens=4))
    sim.update(runner.execute(sim.schedule()))
    good = sim.schedule()
    bad = replace(good, num_scheduled_tokens={"a": good.num_scheduled_tokens["a"] + 1})
    with pytest.raises(ScheduledTokensError, match="runs past"):
        runner.mirror.check(bad)
    runner.execute(good)  # the mirror was left unchanged by the rejected step


def test_check_invariants_catches_a_block_owned_twice() -> None:
    lim = limits()
    sim = SchedulerSim(lim, seed=0)
    sim.add_request("a", [1] * 5, SamplingParams())
    sim.add_request("b", [1] * 5, SamplingParams())
    sim.schedule()
    sim.check_invariants()
    sim._running[1].blocks[0] = sim._running[0].blocks[0]  # plant the bug
    with pytest.raises(SchedulerSimError, match="refcount"):
        sim.check_invariants()


# --------------------------------------------------------------------------- prefix caching

SYSTEM = [3, 1, 4, 1, 5, 2, 6, 5]  # two full blocks of 4


def _finish_one(sim: SchedulerSim, runner: FakeRunner) -> None:
    drive(sim, runner, ahead=0)


def test_shared_system_prompt_hits_and_shares_blocks() -> None:
    lim = limits()
    sim = SchedulerSim(lim, seed=0, max_inflight_steps=0)
    runner = FakeRunner(lim)
    sim.add_request("a", SYSTEM + [7], SamplingParams(max_tokens=6))
    sim.update(runner.execute(sim.schedule()))  # a's prefill computed: its two full blocks are cached
    sim.add_request("b", SYSTEM + [0, 2], SamplingParams(max_tokens=3))
    s1 = sim.schedule()
    (new,) = s1.new_requests
    assert new.num_computed_tokens == 8 and s1.num_scheduled_tokens["b"] == 2
    a_blocks = runner.blocks["a"]
    assert new.block_ids[:2] == tuple(a_blocks[:2])  # shared, in both block-table rows
    assert all(sim.blocks.refcount(b) == 2 for b in new.block_ids[:2])
    sim.update(runner.execute(s1))
    sim.check_invariants()
    drive(sim, runner, ahead=0)
    for rid, plen, n in (("a", 9, 6), ("b", 10, 3)):
        assert list(sim.outputs(rid)) == expected_outputs(rid, plen, SamplingParams(max_tokens=n), lim.max_model_len)
    assert sim.stats.cached_tokens == 8 and sim.stats.prefix_hits == 1 and sim.stats.prefill_tokens == 19
    assert sim.stats.hit_rate == pytest.approx(8 / 19)


def test_hit_never_covers_the_whole_prefill_nor_prompt_logprob_requests() -> None:
    lim = limits()
    sim = SchedulerSim(lim, seed=0, max_inflight_steps=0)
    runner = FakeRunner(lim)
    sim.add_request("a", SYSTEM, SamplingParams(max_tokens=2))
    drive(sim, runner, ahead=0)
    sim.add_request("same", SYSTEM, SamplingParams(max_tokens=2))
    sim.add_request("logprobs", SYSTEM + [1], SamplingParams(max_tokens=2, prompt_logprobs=1))
    s = sim.schedule()
    hits = {r.req_id: r.num_computed_tokens for r in s.new_requests}
    assert hits == {"same": 4, "logprobs": 0}  # the whole 8-token prompt is cached, the last block is recomputed
    sim.update(runner.execute(s))
    drive(sim, runner, ahead=0)


def test_unreferenced_cached_blocks_are_evicted_least_recently_released_first() -> None:
    lim = limits(num_kv_blocks=6, max_num_reqs=1)
    sim = SchedulerSim(lim, seed=0, max_inflight_steps=0)
    runner = FakeRunner(lim)
    sim.add_request("a", [1, 1, 1, 1, 2], SamplingParams(max_tokens=1))  # caches [1,1,1,1]
    drive(sim, runner, ahead=0)
    sim.add_request("b", [2, 2, 2, 2, 3], SamplingParams(max_tokens=1))  # caches [2,2,2,2]
    drive(sim, runner, ahead=0)
    assert sim.blocks.num_cached == 2 and sim.num_free_blocks == 6
    sim.add_request("big", [0] * 17, SamplingParams(max_tokens=1))  # 5 blocks: the free ones, then one eviction
    drive(sim, runner, ahead=0)
    assert sim.stats.evictions >= 1
    sim.add_request("again-b", [2, 2, 2, 2, 5], SamplingParams(max_tokens=1))
    sim.add_request("again-a", [1, 1, 1, 1, 5], SamplingParams(max_tokens=1))
    s = sim.schedule()
    assert s.new_requests[0].num_computed_tokens == 4  # b's block (released later) survived
    sim.update(runner.execute(s))
    drive(sim, runner, ahead=0)
    assert sim.stats.prefix_hits == 1  # a's block, released first, was evicted


def test_preempting_one_sharer_keeps_the_shared_blocks_for_the_other() -> None:
    lim = limits()
    sim = SchedulerSim(lim, seed=0, max_inflight_steps=0)
    runner = FakeRunner(lim)
    sim.add_request("a", SYSTEM + [7], SamplingParams(max_tokens=8))
    sim.update(runner.execute(sim.schedule()))
    sim.add_request("b", SYSTEM + [0], SamplingParams(max_tokens=8))
    sim.update(runner.execute(sim.schedule()))
    shared = runner.blocks["b"][:2]
    assert sim.preempt("a")
    sim.update(runner.execute(sim.schedule()))
    assert all(sim.blocks.refcount(b) == 1 for b in shared)
    sim.check_invariants()
    drive(sim, runner, ahead=0)  # b keeps reading the shared blocks; a resumes with a hit
    for rid, plen in (("a", 9), ("b", 9)):
        assert list(sim.outputs(rid)) == expected_outputs(rid, plen, SamplingParams(max_tokens=8), lim.max_model_len)


def test_check_invariants_catches_a_reference_dropped_early() -> None:
    lim = limits()
    sim = SchedulerSim(lim, seed=0, max_inflight_steps=0)
    runner = FakeRunner(lim)
    sim.add_request("a", SYSTEM + [7], SamplingParams(max_tokens=8))
    sim.update(runner.execute(sim.schedule()))
    sim.add_request("b", SYSTEM + [0], SamplingParams(max_tokens=8))
    sim.update(runner.execute(sim.schedule()))
    sim.check_invariants()
    sim.blocks.release(runner.blocks["a"][:1])  # plant the bug: one reference too few
    with pytest.raises(SchedulerSimError, match="refcount"):
        sim.check_invariants()


def test_fake_kv_cache_catches_a_planted_hit_one_block_too_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """The miniature KV check in FakeRunner must be able to fail: plant a hit one block too long."""
    lim = limits()
    sim = SchedulerSim(lim, seed=0, max_inflight_steps=0)
    runner = FakeRunner(lim)
    sim.add_request("a", SYSTEM + [7, 7, 7, 7, 7], SamplingParams(max_tokens=2))
    sim.update(runner.execute(sim.schedule()))
    lookup = sim.blocks.lookup
    monkeypatch.setattr(sim.blocks, "lookup", lambda hashes: (lookup(hashes) + lookup(hashes[:1]))[: len(hashes)])
    sim.add_request("b", SYSTEM + [0, 0, 0, 0, 0], SamplingParams(max_tokens=2))  # shares 2 blocks, is told 3
    s = sim.schedule()
    assert s.new_requests[0].num_computed_tokens == 12
    with pytest.raises(AssertionError, match="another prefix"):
        runner.execute(s)


def _prefix_workload(rng: random.Random, sim: SchedulerSim, prompts: dict, tick: int) -> None:
    systems = ([2, 7, 1, 0, 3, 3, 1], [5, 5, 0, 1, 6, 2, 2, 7, 4])
    if tick < 80 and rng.random() < 0.6:
        rid = f"q{len(prompts)}"
        done = [r for r in sim.finished if r in prompts]
        if done and rng.random() < 0.3:  # continue a finished conversation
            old = rng.choice(done)
            prompt = prompts[old][0] + list(sim.outputs(old)) + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 4))]
        else:
            prompt = list(rng.choice(systems)) + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 8))]
        prompt = prompt[:40]
        params = SamplingParams(max_tokens=rng.randint(1, 8), prompt_logprobs=1 if rng.random() < 0.1 else None)
        sim.add_request(rid, prompt, params)
        prompts[rid] = (prompt, params)
    if tick < 80 and rng.random() < 0.08 and sim.running_ids:
        sim.preempt(rng.choice(sim.running_ids))


@pytest.mark.parametrize("ahead,draft_prob", [(0, 0.0), (1, 0.0), (1, 0.4), (2, 0.2)])
def test_prefix_workload_hits_often_and_outputs_exact(ahead: int, draft_prob: float) -> None:
    lim = limits(num_kv_blocks=16)
    rng = random.Random(99 + ahead)
    sim = SchedulerSim(lim, seed=3, max_inflight_steps=ahead, draft_prob=draft_prob)
    runner = FakeRunner(lim)
    prompts: dict[str, tuple[list[int], SamplingParams]] = {}
    drive(sim, runner, ahead=ahead, on_tick=lambda t: _prefix_workload(rng, sim, prompts, t), min_ticks=80)
    assert set(sim.finished) == set(prompts)
    for rid, (prompt, params) in prompts.items():
        assert list(sim.outputs(rid)) == expected_outputs(rid, len(prompt), params, lim.max_model_len), rid
    stats = sim.stats
    assert stats.hit_rate >= 0.3 and runner.hits == stats.prefix_hits > 5
    assert stats.evictions > 0 and stats.preempted_forced + stats.preempted_for_blocks > 0


def test_prefix_caching_off_never_hits() -> None:
    lim = limits(num_kv_blocks=16)
    rng = random.Random(7)
    sim = SchedulerSim(lim, seed=3, max_inflight_steps=1, prefix_caching=False)
    runner = FakeRunner(lim)
    prompts: dict = {}
    drive(sim, runner, ahead=1, on_tick=lambda t: _prefix_workload(rng, sim, prompts, t), min_ticks=80)
    assert sim.stats.cached_tokens == 0 and runner.hits == 0 and sim.blocks.num_cached == 0
