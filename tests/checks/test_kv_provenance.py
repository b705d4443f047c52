"""The KV provenance check (`runnercheck.checks.detectors.kv_provenance`): clean on a correct runner with prefix hits, and
naming the step, request, block, slot and provenance of each planted KV bug.

The scenario: request ``a`` (an 8-token system prompt + 2 tokens) is computed, then ``b`` (the same
system prompt + 1 token) is admitted with an 8-token prefix hit on ``a``'s two leading blocks.
"""
from __future__ import annotations

from collections import deque

import pytest
import torch

from runnercheck.checks.detectors.kv_provenance import KVProvenanceError, arm_kv_provenance, prefix_hashes
from runnercheck.impl.device import Device
from runnercheck.impl.interface import SamplingParams
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import make_runner
from runnercheck.impl.state import NUM_COMPUTED
from runnercheck.stress.sim.scheduler import SchedulerSim, SchedulerSimError
from runnercheck.stress.run.config import default_limits

SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18]
BLOCK = 4


def _setup(kind: str = "sim"):
    config = preset("micro")
    limits = default_limits(config, max_num_reqs=3, block_size=BLOCK, num_kv_blocks=12, max_num_batched_tokens=16)
    device = Device(kind, seed=0, lag_policy="random-drain") if kind == "sim" else Device(kind)
    runner = make_runner(random_weights(config, seed=0), limits, device)
    return runner, SchedulerSim(limits, seed=0, max_inflight_steps=1)


def _drive(runner, sim: SchedulerSim, ticks: int = 6, later: tuple = ()) -> list:
    """``a`` first; ``b`` once ``a``'s prefill was scheduled (so it hits ``a``'s blocks); ``later``: (tick, id, prompt)."""
    sim.add_request("a", SYSTEM + [1, 2], SamplingParams(temperature=0.0, max_tokens=3))
    pending: deque = deque()
    steps = []
    try:
        for tick in range(ticks):
            if tick == 1:
                sim.add_request("b", SYSTEM + [3], SamplingParams(temperature=0.0, max_tokens=2))
            for when, rid, prompt in later:
                if when == tick:
                    sim.add_request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=1))
            if sim.can_schedule:
                steps.append(sim.schedule())
                pending.append(runner.execute_model(steps[-1]))
            while pending and (len(pending) > 1 or not sim.can_schedule):
                sim.update(pending.popleft().get())
        while pending:
            sim.update(pending.popleft().get())
    except SchedulerSimError:  # a planted bug broke the output contract (a token missing): stop driving
        for out in pending:
            out.get()
    return steps


def _hit_step(steps: list):
    return next(s for s in steps if any(r.num_computed_tokens for r in s.new_requests))


def test_a_correct_runner_with_prefix_hits_is_clean_and_the_shadow_holds_the_shared_prefix() -> None:
    runner, sim = _setup()
    checker = arm_kv_provenance(runner)
    steps = _drive(runner, sim)
    hit = _hit_step(steps).new_requests[0]
    assert hit.req_id == "b" and hit.num_computed_tokens == 8 and sim.stats.hit_rate > 0
    assert checker.finish() == [] and checker.num_violations == 0, checker.summary()
    assert checker.read_steps_checked == checker.steps_checked >= 3
    hashes = prefix_hashes(SYSTEM)
    for p in range(8):  # b read a's KV: the shared slots hold a's writes of the system prompt
        slot = hit.block_ids[p // BLOCK] * BLOCK + p % BLOCK
        found = (int(checker.shadow_tok[slot]), int(checker.shadow_pos[slot]), int(checker.shadow_hash[slot]))
        assert found == (SYSTEM[p], p, hashes[p])
    assert "clean" in checker.summary()


def _plant_recompute_last_cached_block(runner) -> None:
    state, admit = runner.state, runner.state.admit_staged

    def admit_one_block_early(req, base_seed, writers, seeds):
        row = admit(req, base_seed, writers, seeds)
        if req.num_computed_tokens:
            state.row_state.stage(row, NUM_COMPUTED, [req.num_computed_tokens - BLOCK])
        return row

    state.admit_staged = admit_one_block_early


def test_a_cached_position_written_again_is_named() -> None:
    runner, sim = _setup()
    _plant_recompute_last_cached_block(runner)
    checker = arm_kv_provenance(runner)
    steps = _drive(runner, sim)
    hit_step = _hit_step(steps)
    b = hit_step.new_requests[0]
    v = checker.finish()[0]
    assert (v.step, v.req_id, v.kind) == (hit_step.step_id, "b", "write-position")
    assert v.position == 8 and v.found[1] == 4  # position 4 (a cached one) written where the schedule computes 8
    assert v.block == b.block_ids[1] and v.slot == b.block_ids[1] * BLOCK  # into the shared block
    assert "write-position" in v.line() and "request 'b'" in v.line()
    with pytest.raises(KVProvenanceError, match="write-position"):
        checker.assert_clean()


def test_a_hit_one_block_too_long_reads_another_prefix_or_nothing() -> None:
    runner, sim = _setup()
    lookup = sim.blocks.lookup
    spare: list[int] = []

    def lookup_one_too_many(hashes):
        found = lookup(hashes)
        if found and len(found) < len(hashes) and not spare:
            spare.extend(sim.blocks.allocate(1))  # a fresh block whose KV nobody wrote
            sim.blocks.register(spare[0], -1)
            sim.blocks.release(spare)
        return found + spare[:1] if found and len(found) < len(hashes) else found

    sim.blocks.lookup = lookup_one_too_many
    checker = arm_kv_provenance(runner)
    _drive(runner, sim, ticks=6, later=((2, "c", SYSTEM + SYSTEM[:4] + [5]),))  # 2 blocks match, 3 are claimed
    reads = [v for v in checker.finish() if v.kind == "read-provenance"]
    assert reads, checker.summary()
    v = reads[0]
    assert v.req_id == "c" and v.block == spare[0] and v.found is None and 8 <= v.position < 12
    assert v.expected[1] == v.position and "never written" in v.line()


def test_a_write_outside_the_requests_blocks_is_named() -> None:
    runner, sim = _setup()
    ib, enqueue_prepare = runner.input_batch, runner.input_batch.enqueue_prepare
    num_slots = runner.limits.num_kv_blocks * BLOCK

    def prepare_then_shift_slots(plan, *args, **kwargs):
        enqueue_prepare(plan, *args, **kwargs)
        slots = ib.slot_mapping[: plan.num_tokens]  # one block further on (wrapping: stay inside the cache)
        runner.device.enqueue(lambda: slots.copy_((slots + BLOCK) % num_slots), "plant: next block")

    ib.enqueue_prepare = prepare_then_shift_slots
    runner.graphs.mixed_sizes = ()  # the prefill runs eager, through the planted input prep
    checker = arm_kv_provenance(runner)
    steps = _drive(runner, sim, ticks=2)
    v = checker.finish()[0]
    assert (v.step, v.req_id, v.kind, v.position) == (steps[0].step_id, "a", "write-slot", 0)
    assert v.slot == (steps[0].new_requests[0].block_ids[0] * BLOCK + BLOCK) % num_slots
    assert "the schedule's slot" in v.line()


def test_the_device_record_path_keeps_the_first_violation_without_host_reads() -> None:
    """The cuda bookkeeping (first violation + count in device tensors), exercised on CPU tensors."""
    runner, sim = _setup("cpu")
    _plant_recompute_last_cached_block(runner)
    checker = arm_kv_provenance(runner)
    checker.on_cuda = True  # record in tensors; `finish` reads them back
    _drive(runner, sim)
    assert checker.violations == []
    (v,) = checker.finish()
    assert v.kind == "write-position" and v.req_id == "b" and checker.num_violations >= 1
    assert int(checker.count) == checker.num_violations


@pytest.mark.gpu
def test_on_cuda_the_sampled_check_is_clean_catches_a_planted_bug_and_never_syncs() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from runnercheck.checks.detectors.sync import arm_runner
    from runnercheck.checks.detectors.sync import unaccounted_syncs_message

    runner, sim = _setup("cuda")
    report = arm_runner(runner, "count")
    checker = arm_kv_provenance(runner, sample_every=2)
    _drive(runner, sim)
    assert unaccounted_syncs_message(report, runner) is None, report.summary()  # the check added no host sync
    assert checker.finish() == [] and checker.read_steps_checked >= 1, checker.summary()
    runner, sim = _setup("cuda")
    _plant_recompute_last_cached_block(runner)
    checker = arm_kv_provenance(runner, sample_every=2)
    _drive(runner, sim)
    v = checker.finish()[0]
    assert v.kind == "write-position" and v.req_id == "b"


def _three_decodes(plant: bool):
    """Three requests decoding together on a runner whose buckets are 1, 2, 4: each decode step pads one request."""
    config = preset("micro")
    limits = default_limits(config, max_num_reqs=4, block_size=BLOCK, num_kv_blocks=12, max_num_batched_tokens=16)
    runner = make_runner(random_weights(config, seed=0), limits, Device("sim", seed=0, lag_policy="random-drain"))
    graphs, ib = runner.graphs, runner.input_batch
    if plant:  # the padding token writes the slot the first live token writes (same values on a GPU: invisible in tokens)
        run = graphs.run

        def run_then_alias_padding(key, *args, **kwargs):
            result = run(key, *args, **kwargs)
            if key.mixed:  # the prefill step: planted in the decode steps only
                return result
            live = ib.slot_mapping[0:1]
            pad = ib.slot_mapping[key.num_tokens - 1 : key.num_tokens]
            runner.device.enqueue(lambda: pad.copy_(live), "plant: padding aliases a live slot")
            return result

        graphs.run = run_then_alias_padding
    checker = arm_kv_provenance(runner)
    sim = SchedulerSim(limits, seed=0, max_inflight_steps=1)
    for rid, prompt in (("a", [1, 2, 3]), ("b", [4, 5]), ("c", [6, 7, 8, 9])):
        sim.add_request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=4))
    while sim.can_schedule:
        sim.update(runner.execute_model(sim.schedule()).get())
    return runner, checker


def test_a_padding_token_that_writes_a_live_slot_is_named_and_clean_padding_is_not() -> None:
    runner, checker = _three_decodes(plant=False)
    assert runner.graphs.stats()["padded_eager"] + runner.graphs.stats()["replays"] > 0
    assert checker.finish() == [] and checker.num_violations == 0
    runner, checker = _three_decodes(plant=True)
    v = checker.finish()[0]
    assert v.kind == "padding-write" and v.req_id == "padding token 3", v.line()
    assert "padding of a bucketed step must write nothing" in v.line()
