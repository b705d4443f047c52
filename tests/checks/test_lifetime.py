"""Staging-slot lifetime checker: a correct pool passes; each planted lifetime bug is caught."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from runnercheck.checks.detectors.lifetime import LifetimeChecker, event_completed
from runnercheck.impl.buffers import SlotState, StagingLifetimeError, StagingPool, StagingWriter
from runnercheck.impl.staged_writes import StagedWriteTensor
from runnercheck.impl.device import Device


def _pool(policy: str = "lag-2-steps", num_slots: int = 3, seed: int = 0) -> tuple[Device, StagingPool]:
    dev = Device("sim", seed=seed, lag_policy=policy)
    return dev, StagingPool(dev, num_slots=num_slots, capacity_bytes=512)


def _run_steps(dev: Device, pool: StagingPool, steps: int, seed: int = 0) -> list[list[int]]:
    """A correct producer: each step stages values, submits, and copies them out on the device."""
    rng = np.random.default_rng(seed)
    outs = []
    for step in range(steps):
        dev.begin_step()
        writer = StagingWriter(pool, step)
        for _ in range(2):  # two arrays of up to 320 bytes: some steps roll over to a second slot
            values = rng.integers(0, 1000, size=int(rng.integers(1, 41)))
            dev_view = writer.stage_array(values, torch.int64)
            out = dev.pinned(len(values), torch.int64)
            outs.append((values.tolist(), out, dev_view))
        writer.submit()
        for _, out, dev_view in outs[-2:]:
            dev.enqueue(lambda out=out, v=dev_view: out.copy_(v), f"read{step}")
    dev.synchronize()
    return [got.tolist() == want for want, got, _ in outs]


@pytest.mark.parametrize("policy", ["run-immediately", "lag-2-steps", "random-drain"])
def test_correct_run_has_no_violations(policy: str) -> None:
    dev, pool = _pool(policy)
    checker = LifetimeChecker().attach(pool)
    assert all(_run_steps(dev, pool, 30))
    pool.retire_completed()
    assert checker.violations == 0 and checker.errors == []
    assert checker.transitions >= 3 * 30 - 2 * len(pool.slots)
    assert pool.num_backpressure_waits > 0 or policy != "lag-2-steps"  # the wait path is covered too
    assert "no violations" in checker.summary()


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the apply kernel on sim tensors needs TRITON_INTERPRET=1")
def test_correct_staged_write_tensor_run_has_no_violations() -> None:
    dev, pool = _pool("random-drain", num_slots=2)
    checker = LifetimeChecker().attach(pool)
    table = StagedWriteTensor(dev, (4, 8), torch.int32, "table")
    expected = np.zeros((4, 8), dtype=np.int32)
    rng = np.random.default_rng(1)
    for step in range(20):
        dev.begin_step()
        row, start = int(rng.integers(0, 4)), int(rng.integers(0, 6))
        vals = rng.integers(0, 100, size=2).tolist()
        table.stage(row, start, vals)
        expected[row, start : start + 2] = vals
        writer = StagingWriter(pool, step)
        table.flush(writer)
        writer.submit()
        table.enqueue_apply()
    dev.synchronize()
    assert table.base.tolist() == expected.tolist()
    assert checker.violations == 0


def test_write_after_submit_through_a_retained_view_is_caught_at_retirement() -> None:
    dev, pool = _pool("lag-2-steps")
    checker = LifetimeChecker().attach(pool)
    slot = pool.acquire(step=7)
    host_view, dev_view = slot.alloc(4, torch.int64)
    host_view.copy_(torch.tensor([1, 2, 3, 4]))
    pool.submit(slot)
    host_view[0] = 99  # the bug: the queued H2D copy has not run yet
    with pytest.raises(StagingLifetimeError) as info:
        for _ in range(4):
            dev.begin_step()
            pool.retire_completed()
    message = str(info.value)
    assert "write after submit" in message and f"slot {slot.index}" in message and "step 7" in message
    assert "IN_FLIGHT" in message
    assert info.value.slot == slot.index and info.value.step == 7
    assert dev_view.tolist() == [99, 2, 3, 4]  # what the bug did to the device on a lagging GPU


def test_count_mode_counts_without_raising() -> None:
    dev, pool = _pool("lag-2-steps")
    checker = LifetimeChecker(mode="count").attach(pool)
    for step in range(3):
        slot = pool.acquire(step)
        host_view, _ = slot.alloc(2, torch.int32)
        host_view.fill_(step)
        pool.submit(slot)
        host_view.fill_(-1)
    dev.synchronize()
    pool.retire_completed()
    assert checker.violations == 3 and len(checker.errors) == 3
    assert sorted(e.step for e in checker.errors) == [0, 1, 2]
    assert "3 violation(s)" in checker.summary()


def test_alloc_after_submit_raises() -> None:
    _, pool = _pool()
    LifetimeChecker().attach(pool)
    slot = pool.acquire(step=1)
    slot.alloc(4, torch.int32)
    pool.submit(slot)
    with pytest.raises(StagingLifetimeError, match="not being written"):
        slot.alloc(4, torch.int32)


def test_pool_that_frees_before_the_event_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def retire_without_waiting(self: StagingPool, ask: bool = True) -> None:
        for slot in self.slots:
            if slot.state is SlotState.IN_FLIGHT:  # the bug: no event.query()
                self._retire(slot)

    monkeypatch.setattr(StagingPool, "retire_completed", retire_without_waiting)
    dev, pool = _pool("lag-2-steps")
    LifetimeChecker().attach(pool)
    slot = pool.acquire(step=0)
    slot.alloc(4, torch.int32)[0].fill_(5)
    pool.submit(slot)
    with pytest.raises(StagingLifetimeError, match="freed before its event completed") as info:
        pool.acquire(step=1)
    assert info.value.slot == slot.index and info.value.step == 0


def test_event_check_does_not_drain_the_sim_queue() -> None:
    dev = Device("sim", lag_policy="lag-2-steps")
    dev.enqueue(lambda: None, "h2d")
    event = dev.record_event()
    dev.set_lag_policy({"name": "random-drain", "seed": 0, "p_stall": 0.0})
    assert not event_completed(event)
    assert dev.num_pending == 1
    assert event.query() and dev.num_pending == 0  # query() runs work: the checker must not use it


def test_pool_that_hands_out_an_in_flight_slot_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def acquire_without_backpressure(self: StagingPool, step: int):
        slot = self.slots[0]  # the bug: reuse slot 0 whatever its state
        slot.step, slot.used_bytes = step, 0
        self._transition(slot, SlotState.WRITING)
        return slot

    monkeypatch.setattr(StagingPool, "acquire", acquire_without_backpressure)
    _, pool = _pool("lag-2-steps")
    LifetimeChecker().attach(pool)
    slot = pool.acquire(0)
    slot.alloc(1, torch.int64)
    pool.submit(slot)
    with pytest.raises(StagingLifetimeError, match="illegal staging-slot transition IN_FLIGHT -> WRITING"):
        pool.acquire(1)


def test_write_to_a_free_slot_is_caught_at_next_acquire() -> None:
    dev, pool = _pool("run-immediately", num_slots=1)
    LifetimeChecker().attach(pool)
    slot = pool.acquire(0)
    host_view, _ = slot.alloc(4, torch.int32)
    host_view.fill_(3)
    pool.submit(slot)
    pool.retire_completed()
    assert slot.state is SlotState.FREE
    host_view.fill_(4)  # stale writer after the slot was freed
    with pytest.raises(StagingLifetimeError, match="FREE staging slot changed"):
        pool.acquire(1)


def test_attach_detach_and_bad_mode() -> None:
    dev, pool = _pool()
    checker = LifetimeChecker()
    checker.attach(pool)
    with pytest.raises(ValueError, match="already attached"):
        checker.attach(pool)
    checker.detach(pool)
    assert pool.observers == []
    slot = pool.acquire(0)
    host_view, _ = slot.alloc(1, torch.int32)
    pool.submit(slot)
    host_view.fill_(1)
    dev.synchronize()
    pool.retire_completed()
    assert checker.violations == 0
    with pytest.raises(ValueError, match="mode"):
        LifetimeChecker(mode="loud")


@pytest.mark.gpu
def test_cuda_write_after_submit_is_caught() -> None:
    dev = Device("cuda")
    pool = StagingPool(dev, num_slots=2, capacity_bytes=1 << 12)
    checker = LifetimeChecker(mode="count").attach(pool)
    for step in range(8):
        dev.inject_delay(2000)  # the GPU lags, so the copy is still queued
        slot = pool.acquire(step)
        host_view, _ = slot.alloc(256, torch.int32)
        host_view.fill_(step)
        pool.submit(slot)
        if step == 5:
            host_view.fill_(-1)
    dev.synchronize()
    pool.retire_completed()
    assert checker.violations == 1 and checker.errors[0].step == 5
