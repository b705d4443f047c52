"""Steady lanes (`runnercheck.impl.lanes`): a fused step copies its staging slot in and its output out inside its replay.

The lane copies read and write pinned host buffers chosen on the device by a counter the fused
step advances; the host only mirrors that counter.  These tests pin what that rests on: the copy
kernels follow the counter, the host's mirror and the device's counter agree after every replay,
a step that does not fit its lane (its slots busy, its diffs too many) takes the three enqueues
without a wait, a runner whose lanes failed their trial at construction never fuses, and a mirror
that drifts from the counter (the bug the mirror exists to prevent) shows up as wrong tokens.
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch

from runnercheck.bench.workload import DecodeWorkload
from runnercheck.impl import lanes as lanes_module
from runnercheck.impl.device import Device
from runnercheck.impl.interface import RunnerLimits, SamplingParams
from runnercheck.impl.kernels.interpreted_memory import reachable_through
from runnercheck.impl.kernels.lanes import launch_lane_advance, launch_lane_copy
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import ModelRunner

LIMITS = RunnerLimits(vocab_size=256, max_num_reqs=4, max_model_len=64, max_num_batched_tokens=16, num_kv_blocks=48, block_size=4)
PARAMS = SamplingParams(temperature=0.8, seed=7, max_tokens=1 << 20)


def _runner(device: Device | None = None, **kwargs) -> ModelRunner:
    return ModelRunner(random_weights(preset("micro"), seed=3), LIMITS, device or Device("cpu"), base_seed=5, **kwargs)


def _workload(num_reqs: int = 3, params: SamplingParams = PARAMS) -> DecodeWorkload:
    return DecodeWorkload(num_reqs=num_reqs, prompt_len=5, vocab_size=LIMITS.vocab_size, block_size=LIMITS.block_size,
                          num_blocks=LIMITS.num_kv_blocks, token_budget=LIMITS.max_num_batched_tokens, churn=0.0,
                          params=params, seed=1)


def _run(runner: ModelRunner, steps: int, work: DecodeWorkload | None = None) -> list[tuple]:
    work = work or _workload()
    return [runner.execute_model(work.next_step()).get().sampled_token_ids for _ in range(steps)]


def test_the_copies_follow_the_device_counter():
    dev = Device("cpu")
    hosts = [dev.pinned(40, torch.uint8) for _ in range(3)]
    for i, h in enumerate(hosts):
        h.copy_(torch.arange(40, dtype=torch.uint8) + 10 * i)
    table = torch.tensor([h.data_ptr() for h in hosts], dtype=torch.int64)
    reachable_through(table, hosts)  # interpreted, the kernels' accesses are bounds-checked: declare what the table reaches
    counter = torch.tensor([4], dtype=torch.int64)  # lane 4 % 3 = 1
    into = torch.zeros(40, dtype=torch.uint8)
    launch_lane_copy(counter, table, into, 33, to_host=False)
    assert into[:33].tolist() == hosts[1][:33].tolist() and into[33:].eq(0).all()
    launch_lane_advance(counter, 3)  # lane (4 + 1) % 3 = 2
    launch_lane_copy(counter, table, torch.full((40,), 7, dtype=torch.uint8), 40, to_host=True)
    assert hosts[2].eq(7).all() and hosts[1][0] == 10 and counter.item() == 2


def test_fused_steps_agree_with_unfused_ones_and_the_mirror_tracks_the_counter():
    fused, plain = _runner(), _runner()
    plain.graphs.fused_in_bytes.clear()  # no bucket has a fused step: every steady step takes the three enqueues
    work_a, work_b = _workload(), _workload()
    for _ in range(20):
        a = fused.execute_model(work_a.next_step()).get()
        b = plain.execute_model(work_b.next_step()).get()
        assert a.sampled_token_ids == b.sampled_token_ids
        assert fused.lanes.counter.item() == fused.lanes.lane
    fused_replays = fused.cuda_graph_stats()["fused_replays"]
    assert fused_replays >= 14 and plain.cuda_graph_stats()["fused_replays"] == 0
    assert fused_replays > fused.lanes.num_lanes  # every lane was used, and reused
    assert fused.state.base.equal(plain.state.base) and fused.block_table.base.equal(plain.block_table.base)


def test_a_busy_lane_is_skipped_without_a_wait_and_the_lanes_follow_the_rings_again():
    """On sim with the device two steps behind and each output read two steps late: the prefill asks for prompt
    logprobs (an eager step: the rings serve it without the lanes, whose mirror stays at lane 0), so the first
    decode step finds lane 0's output slot holding the prefill's unread output.  That step takes the three
    enqueues, with no host wait, and moves the counter to the output ring's next slot; every step after it is fused."""
    from runnercheck.checks.detectors import sync as sync_check

    device = Device("sim", seed=1, lag_policy="lag-2-steps")
    runner = _runner(device)
    sync_check.arm_runner(runner, "error")
    work = _workload(params=dataclasses.replace(PARAMS, prompt_logprobs=1))
    outputs, enqueues = [], []
    for _ in range(16):
        outputs.append(runner.execute_model(work.next_step()))
        enqueues.append(runner.last_step_stats.num_enqueued)
        if len(outputs) > 2:
            outputs[-3].get()
    assert runner.cuda_graph_stats()["fallbacks"] == {"prompt_logprobs": 1}
    assert enqueues[1] == 4, enqueues  # H2D, plain replay, D2H, the counter's fill
    assert enqueues[2:] == [1] * 14, enqueues
    device.synchronize()
    assert runner.lanes.counter.item() == runner.lanes.lane


def test_a_step_whose_diffs_outgrow_the_lane_copy_takes_the_three_enqueues(monkeypatch):
    runner = _runner()
    reference = _run(_runner(), 16)
    monkeypatch.setattr(runner.graphs, "fused_in_bytes", {k: 64 for k in runner.graphs.fused_in_bytes})
    assert _run(runner, 16) == reference  # 64 bytes hold less than the compact arrays: no step fits
    # H2D, replay, D2H, and the counter's fill: the step took the lane's slots, so the lanes follow the rings.
    assert runner.cuda_graph_stats()["fused_replays"] == 0 and runner.last_step_stats.num_enqueued == 4


def test_lanes_that_fail_their_trial_are_off_and_steady_steps_still_run(monkeypatch, caplog):
    """Planted: a device whose kernels read the wrong pinned buffer (a lane copy off by one)."""
    real = lanes_module.launch_lane_copy

    def off_by_one(counter, table, device_bytes, nbytes, *, to_host):
        real(counter + 1, table, device_bytes, nbytes, to_host=to_host)

    monkeypatch.setattr(lanes_module, "launch_lane_copy", off_by_one)
    with caplog.at_level(logging.WARNING, logger="runnercheck.impl.lanes"):
        runner = _runner()
    assert not runner.lanes.usable and "steady lanes off" in caplog.text
    assert runner.graphs.fused(runner._steady_key) is None and runner.graphs.lanes is None
    monkeypatch.setattr(lanes_module, "launch_lane_copy", real)
    reference = _run(_runner(), 12)
    assert _run(runner, 12) == reference
    assert runner.cuda_graph_stats()["fused_replays"] == 0 and runner.last_step_stats.steady


def test_a_mirror_that_drifts_from_the_counter_is_wrong_tokens():
    """Planted: the host skips a lane (its mirror one ahead of the device counter): each fused step then
    replays with another lane's stale bytes in, and its output lands in another slot.  (It skips once every
    lane holds a steady step's bytes: an earlier skip reads bytes of another layout, and the staged-write
    apply trusts the diff table it finds -- on CPU a segfault, on a GPU an illegal address.)"""
    reference = _run(_runner(), 30)
    runner = _runner()
    take, taken = runner.lanes.take, []

    def take_and_skip():
        lane = take()
        taken.append(lane)
        if len(taken) == 2 * runner.lanes.num_lanes:
            runner.lanes.lane = (runner.lanes.lane + 1) % runner.lanes.num_lanes
        return lane

    runner.lanes.take = take_and_skip
    got = _run(runner, 30)
    assert len(taken) > 2 * runner.lanes.num_lanes and got != reference


@pytest.mark.gpu
def test_fused_steady_steps_on_cuda_match_unfused_ones_with_one_enqueue_and_no_host_sync():
    """On the GPU the lane copies read and write pinned memory from the kernels (unified addressing):
    async steady steps, each one enqueue, give the tokens of a runner whose steady steps take the three."""
    from runnercheck.checks.detectors import sync as sync_check

    limits = RunnerLimits(vocab_size=256, max_num_reqs=4, max_model_len=128, max_num_batched_tokens=16, num_kv_blocks=200,
                          block_size=4)

    def runner_and_work():
        runner = ModelRunner(random_weights(preset("micro"), seed=3), limits, Device("cuda"), base_seed=5)
        work = DecodeWorkload(num_reqs=3, prompt_len=5, vocab_size=256, block_size=4, num_blocks=200, token_budget=16,
                              churn=0.0, params=PARAMS, seed=1)
        return runner, work

    (fused, work_a), (plain, work_b) = runner_and_work(), runner_and_work()
    assert fused.lanes.usable
    plain.graphs.fused_in_bytes.clear()
    expected = [plain.execute_model(work_b.next_step()).get().sampled_token_ids for _ in range(60)]
    for _ in range(4):  # prefill and first decode steps, outside the armed scope
        fused.execute_model(work_a.next_step()).get()
    report = sync_check.arm_runner(fused, "error")
    got, pending, enqueues = [], None, []
    for _ in range(56):  # async scheduling: each output read after the next step is issued
        out = fused.execute_model(work_a.next_step())
        enqueues.append(fused.last_step_stats.num_enqueued)
        if pending is not None:
            got.append(pending.get().sampled_token_ids)
        pending = out
    got.append(pending.get().sampled_token_ids)
    assert got == expected[4:]
    assert not report.events and set(enqueues) == {1}, (report.events, enqueues)
    fused.device.synchronize()
    assert fused.lanes.counter.item() == fused.lanes.lane and fused.cuda_graph_stats()["fused_replays"] >= 56
