"""A bucketed step's device side reads its counts from device memory (issue 14 item 1): the header-driven
staged-write apply, the first staging slot copied into the fixed step buffer, and a steady-state graphed
step that enqueues exactly one fused replay (its copies inside)."""
from __future__ import annotations

import pytest
import torch

from runnercheck.impl.buffers import StagingPool, StagingWriter
from runnercheck.impl.device import Device
from runnercheck.impl.interface import RunnerLimits, SamplingParams
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import ModelRunner
from runnercheck.impl.staged_writes import StagedWriteGroup, StagedWriteTensor, launch_apply_from_header
from runnercheck.stress.sim.scheduler import SchedulerSim


def _group_with_diffs(dev: Device) -> tuple[StagedWriteGroup, StagedWriteTensor, StagedWriteTensor]:
    group = StagedWriteGroup(dev, "test")
    a = StagedWriteTensor(dev, (5, 6), torch.int32, "a", fill=-1, group=group)
    b = StagedWriteTensor(dev, (2, 7), torch.float32, "b", fill=0.5, group=group)
    group.seal()
    for row in range(5):
        a.stage(row, row % 3, list(range(10 * row, 10 * row + 3)))
    a.stage(2, 1, [99])  # overlapping: later wins
    b.stage(0, 3, [1.25, -2.0])
    return group, a, b


@pytest.mark.parametrize("num_programs", [1, 3])
def test_header_driven_apply_equals_the_launch_per_diff(num_programs):
    dev = Device("cpu")
    expected_group, ea, eb = _group_with_diffs(dev)
    pool = StagingPool(dev, num_slots=2, capacity_bytes=4096)
    writer = StagingWriter(pool, 0)
    expected_group.flush(writer)
    writer.submit()
    expected_group.enqueue_apply()

    group, a, b = _group_with_diffs(dev)
    writer = StagingWriter(pool, 1)
    group.flush(writer)
    slot = writer.slot
    num_diffs, table = group.take_single_pack(slot)
    assert num_diffs > 1 and table >= 0
    writer.submit()
    group.enqueue_apply()  # taken: nothing left to enqueue
    assert torch.equal(a.base, torch.full((5, 6), -1, dtype=torch.int32)), "a taken pack was applied eagerly too"
    header = torch.tensor([num_diffs, table], dtype=torch.int32)
    launch_apply_from_header(group.arena, slot.device[: slot.capacity_bytes // 4 * 4].view(torch.int32), header, num_programs)
    assert torch.equal(a.base, ea.base) and torch.equal(b.base, eb.base)


def test_header_with_no_diffs_writes_nothing():
    dev = Device("cpu")
    group, a, _ = _group_with_diffs(dev)
    group.members[0]._pending.clear()
    group.members[1]._pending.clear()
    before = group.arena.clone()
    words = torch.full((64,), 7, dtype=torch.int32)
    launch_apply_from_header(group.arena, words, torch.tensor([0, 0], dtype=torch.int32), 2)
    assert torch.equal(group.arena, before)


def test_take_single_pack_refuses_a_pack_outside_the_slot_and_split_packs():
    dev = Device("cpu")
    group, _, _ = _group_with_diffs(dev)
    pool = StagingPool(dev, num_slots=2, capacity_bytes=4096)
    writer = StagingWriter(pool, 0)
    writer.first_slot(16)
    other = pool.slots[1]
    group.flush(writer)
    assert group.take_single_pack(other) is None  # not where the pack sits: the eager apply stays
    assert group._applies, "a refused take dropped the eager apply"
    assert group.take_single_pack(writer.first) is not None


@pytest.mark.parametrize("kind", ["cpu", "sim"])
@pytest.mark.parametrize("redirect", [True, False])
def test_first_slot_lands_in_the_step_buffer(kind, redirect):
    """Redirected: the slot's one H2D goes to the step buffer.  Not redirected (or overflowed): the slot keeps its
    own copy and one device copy fills the step buffer, after every H2D of the step."""
    dev = Device(kind, seed=3, lag_policy="lag-2-steps") if kind == "sim" else Device(kind)
    pool = StagingPool(dev, num_slots=3, capacity_bytes=256)
    step_buffer = dev.zeros(256, torch.uint8)
    writer = StagingWriter(pool, 0)
    first = writer.first_slot(32)
    first.host[:32].copy_(torch.arange(32, dtype=torch.uint8))
    if not redirect:
        writer.alloc(60, torch.int32)  # does not fit: the first slot is submitted to its own buffer now
    writer.submit(step_buffer, redirect=redirect)
    assert first.copy_to is None
    dev.synchronize()
    assert step_buffer[:32].tolist() == list(range(32))
    assert (first.device[:32].tolist() == list(range(32))) is (not redirect)


# --------------------------------------------------------------------------- the runner's steady state

LIMITS = RunnerLimits(vocab_size=256, max_num_reqs=4, max_model_len=64, max_num_batched_tokens=16, num_kv_blocks=48,
                      block_size=4, max_logprobs=3, max_num_draft_tokens=0)


def test_a_steady_graphed_decode_step_is_one_fused_replay():
    """Every bucketed decode step -- the first after the prefill (the general step) and the steady steps after
    it -- is one enqueue, its bucket's fused replay (`runnercheck.impl.lanes`), block appends included."""
    runner = ModelRunner(random_weights(preset("micro"), seed=2), LIMITS, Device("cpu"), base_seed=1)
    sched = SchedulerSim(LIMITS, seed=0)
    for i in range(4):
        sched.add_request(f"r{i}", (3 + i, 4, 5), SamplingParams(temperature=0.8, seed=i, max_tokens=30))
    labels: list[list[str]] = []
    enqueue = runner.device.enqueue

    def record(fn, label=""):
        labels[-1].append(label)
        enqueue(fn, label)

    runner.device.enqueue = record
    replayed = []
    for _ in range(12):
        labels.append([])
        sched.update(runner.execute_model(sched.schedule()).get())
        replayed.append(runner.last_step_stats.graph_replayed)
    # The prefill step (admissions: its own kernels) replays a mixed graph; the decode steps follow.
    assert all(replayed) and any("mixed" in label for label in labels[0]), labels[0]
    graphed = labels[1:]
    assert len(graphed) >= 8, replayed  # block appends (staged diffs) happen on several of them
    for step in graphed:
        assert len(step) == 1 and step[0].startswith("fused graph replay"), step
    assert runner.cuda_graph_stats()["fused_replays"] == len(graphed) + ("fused" in labels[0][0])
