"""Staging slots (`runnercheck.impl.buffers`) and staged writes (`runnercheck.impl.staged_writes`): lifetimes, later-wins, capacity rollover, groups, races on sim."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from runnercheck.impl.buffers import (
    SlotState,
    StagingCapacityError,
    StagingLifetimeError,
    StagingPool,
    StagingWriter,
)
from runnercheck.impl.device import Device
from runnercheck.impl.staged_writes import StagedWriteGroup, StagedWriteTensor


def _flush_all(pool: StagingPool, step: int, tensors: list[StagedWriteTensor]) -> StagingWriter:
    writer = StagingWriter(pool, step)
    for t in tensors:
        t.flush(writer)
    writer.submit()
    for t in tensors:
        t.enqueue_apply()
    return writer


@pytest.mark.parametrize("kind", ["cpu", "sim"])
def test_staged_writes_apply_and_later_wins(kind):
    dev = Device(kind, seed=1, lag_policy="lag-1-steps") if kind == "sim" else Device(kind)
    pool = StagingPool(dev, num_slots=4, capacity_bytes=4096)
    table = StagedWriteTensor(dev, (4, 8), torch.int32, "table", fill=-1)
    table.stage(1, 2, [5, 6, 7])
    table.stage(1, 3, [9])  # overlaps: later wins
    table.stage(3, 0, [1, 2])
    _flush_all(pool, 0, [table])
    dev.synchronize()
    expect = torch.full((4, 8), -1, dtype=torch.int32)
    expect[1, 2:5] = torch.tensor([5, 9, 7], dtype=torch.int32)
    expect[3, 0:2] = torch.tensor([1, 2], dtype=torch.int32)
    assert torch.equal(table.base, expect)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float32, torch.int64])
def test_long_rows_staged_as_arrays_apply_beside_scalars_and_later_writes_still_win(dtype):
    """A row of >= 64 elements is flushed as one array (a prompt bitmask at a real vocabulary), not Python ints."""
    dev = Device("cpu")
    pool = StagingPool(dev, num_slots=4, capacity_bytes=8192)
    table = StagedWriteTensor(dev, (3, 100), dtype, "table", fill=0)
    long_row = np.arange(100).astype(np.float64) * 3
    table.stage(0, 0, long_row)  # alone in its row: one array diff
    table.stage(2, 0, long_row + 1)
    table.stage(2, 10, [-5])  # later, same row: merged by cell, the later write wins
    table.stage(1, 4, [7, 8])
    _flush_all(pool, 0, [table])
    expect = torch.zeros((3, 100), dtype=dtype)
    expect[0] = torch.as_tensor(long_row, dtype=dtype)
    expect[2] = torch.as_tensor(long_row + 1, dtype=dtype)
    expect[2, 10] = -5
    expect[1, 4:6] = torch.tensor([7, 8], dtype=dtype)
    assert torch.equal(table.base, expect)


def test_slot_cycle_and_reuse_waits_for_event():
    dev = Device("sim", lag_policy="lag-5-steps")
    pool = StagingPool(dev, num_slots=2, capacity_bytes=256)
    seen: list[tuple[int, str, str]] = []
    pool.observers.append(lambda s, old, new: seen.append((s.index, old.value, new.value)))
    a = pool.acquire(0)
    a.alloc(4, torch.int64)[0].fill_(1)
    pool.submit(a)
    b = pool.acquire(1)
    pool.submit(b)
    assert a.state is SlotState.IN_FLIGHT and b.state is SlotState.IN_FLIGHT
    c = pool.acquire(2)  # none free: waits on the oldest in-flight copy
    assert c is a and pool.num_backpressure_waits == 1
    assert seen[:3] == [(0, "FREE", "WRITING"), (0, "WRITING", "IN_FLIGHT"), (1, "FREE", "WRITING")]


def test_cuda_order_takes_a_free_next_slot_and_retires_the_others_on_a_miss():
    """On cuda (`StagingPool._known_first`, forced here on a host device whose work runs at once) the next slot is
    taken when free, with no pass over the others; the first miss retires every slot known complete."""
    pool = StagingPool(Device("cpu"), num_slots=3, capacity_bytes=256)
    pool._known_first = True
    a = pool.acquire(0)
    pool.submit(a)
    b = pool.acquire(1)
    assert b.index == 1 and a.state is SlotState.IN_FLIGHT  # complete, not retired yet
    pool.submit(b)
    c = pool.acquire(2)
    pool.submit(c)
    d = pool.acquire(3)  # the next slot (0) is in flight: a miss
    assert d is a and b.state is SlotState.FREE and c.state is SlotState.FREE
    assert pool.num_backpressure_waits == 0


def test_alloc_after_submit_is_a_lifetime_error():
    dev = Device("sim")
    pool = StagingPool(dev, num_slots=2, capacity_bytes=256)
    slot = pool.acquire(0)
    pool.submit(slot)
    with pytest.raises(StagingLifetimeError, match="slot 0"):
        slot.alloc(1, torch.int32)
    with pytest.raises(StagingLifetimeError):
        pool.submit(slot)


def test_capacity_rollover_and_oversize():
    dev = Device("cpu")
    pool = StagingPool(dev, num_slots=4, capacity_bytes=96)
    t = StagedWriteTensor(dev, (2, 40), torch.int32, "wide")
    t.stage(0, 0, list(range(10)))
    t.stage(1, 0, list(range(10, 20)))
    writer = _flush_all(pool, 0, [t])
    assert writer.num_slots_used >= 2  # meta (32 B) + values (80 B) do not fit one 96 B slot: rollover
    assert t.base[0, :10].tolist() == list(range(10)) and t.base[1, :10].tolist() == list(range(10, 20))
    w2 = StagingWriter(pool, 1)
    with pytest.raises(StagingCapacityError):
        w2.alloc(100, torch.int64)


def test_bad_stage_is_rejected_and_changes_nothing():
    dev = Device("cpu")
    t = StagedWriteTensor(dev, (2, 4), torch.float32, "p")
    with pytest.raises(IndexError):
        t.stage(2, 0, [1.0])
    with pytest.raises(IndexError):
        t.stage(0, 3, [1.0, 2.0])
    assert t.num_pending == 0


def test_a_handed_over_list_stages_as_stage_does_and_bad_rows_are_rejected_unchanged():
    """`stage_list` keeps the caller's list as the pending diff; it merges with the other diffs (later wins) and
    rejects what `stage` rejects, with nothing staged."""
    dev = Device("cpu")
    pool = StagingPool(dev, num_slots=4, capacity_bytes=4096)
    table = StagedWriteTensor(dev, (4, 8), torch.int32, "table", fill=-1)
    values = [5, 6, 7]
    table.stage_list(1, values)
    assert table._pending[0][2] is values
    table.stage(1, 1, [9])  # overlaps: later wins
    for row, bad in ((4, [1]), (-1, [1]), (0, [0] * 9)):
        with pytest.raises(IndexError):
            table.stage_list(row, bad)
    assert table.num_pending == 2
    _flush_all(pool, 0, [table])
    dev.synchronize()
    assert table.base[1, :3].tolist() == [5, 9, 7] and (table.base[[0, 2, 3]] == -1).all()


def test_sim_race_when_host_rewrites_in_flight_slot():
    """The race class: rewrite a submitted slot before its copy ran -> the device sees new bytes."""
    dev = Device("sim", lag_policy="lag-2-steps")
    pool = StagingPool(dev, num_slots=2, capacity_bytes=256)
    slot = pool.acquire(0)
    host, devview = slot.alloc(4, torch.int32)
    host.copy_(torch.tensor([1, 2, 3, 4], dtype=torch.int32))
    pool.submit(slot)
    host.fill_(0)  # a stale reference written after submit
    dev.synchronize()
    assert devview.tolist() == [0, 0, 0, 0]


def test_large_diffs_split_across_slots():
    """A step's diffs larger than a slot are batched and cut by columns; the result is unchanged."""
    dev = Device("sim", lag_policy="random-drain", seed=4)
    pool = StagingPool(dev, num_slots=12, capacity_bytes=128)
    t = StagedWriteTensor(dev, (3, 100), torch.int32, "wide", fill=0)
    t.stage(0, 0, list(range(100)))
    t.stage(2, 10, list(range(500, 560)))
    t.stage(1, 5, [7])
    writer = _flush_all(pool, 0, [t])
    dev.synchronize()
    assert writer.num_slots_used > 3
    assert t.base[0].tolist() == list(range(100))
    assert t.base[2, 10:70].tolist() == list(range(500, 560)) and t.base[2, :10].tolist() == [0] * 10
    assert t.base[1].tolist() == [0] * 5 + [7] + [0] * 94


def test_pool_too_small_for_one_step_is_a_typed_error_not_a_race():
    """Reusing a slot inside the step that filled it would overwrite data its kernels still read."""
    dev = Device("sim", lag_policy="run-immediately")
    pool = StagingPool(dev, num_slots=2, capacity_bytes=128)
    t = StagedWriteTensor(dev, (3, 100), torch.int32, "wide", fill=0)
    t.stage(0, 0, list(range(100)))
    t.stage(2, 0, list(range(100)))
    with pytest.raises(StagingCapacityError, match="needs more than"):
        _flush_all(pool, 0, [t])


# --------------------------------------------------------------------------- staged-write groups


def _group_of_three(dev: Device) -> tuple:
    group = StagedWriteGroup(dev, "test")
    ints = StagedWriteTensor(dev, (3, 4), torch.int32, "ints", fill=-1, group=group)
    floats = StagedWriteTensor(dev, 3, torch.float32, "floats", fill=0.5, group=group)
    longs = StagedWriteTensor(dev, (3, 4), torch.int64, "longs", fill=7, group=group)
    group.seal()
    return group, ints, floats, longs


def _flush_group(dev: Device, group: StagedWriteGroup, pool: StagingPool, step: int = 0) -> tuple[StagingWriter, int]:
    """Flush ``group`` through one writer, submit, enqueue its apply and run it: (the writer, device calls enqueued)."""
    writer = StagingWriter(pool, step)
    enqueued = dev.num_enqueued
    group.flush(writer)
    writer.submit()
    group.enqueue_apply()
    dev.synchronize()
    return writer, dev.num_enqueued - enqueued


@pytest.mark.parametrize("capacity", [4096, 48])
def test_group_applies_every_member_in_one_launch_per_slot(capacity):
    """int32, float32 and int64 members share one arena; a flush is one staging allocation and one
    apply launch (more only when a slot is too small, then int64 values are never cut in half)."""
    dev = Device("sim", seed=2, lag_policy="random-drain")
    group, ints, floats, longs = _group_of_three(dev)
    assert (ints.base.tolist(), floats.base.tolist(), longs.base.tolist()) == ([[-1] * 4] * 3, [0.5] * 3, [[7] * 4] * 3)
    ints.stage(0, 1, [1, 2, 3])
    ints.stage(0, 2, [9])  # later wins within a member
    floats.stage_scalar(2, 1.25)
    longs.stage(1, 0, [2**40 + 5, -(2**35), 3, 2**50 + 1])
    writer, enqueued = _flush_group(dev, group, StagingPool(dev, num_slots=8, capacity_bytes=capacity))
    applies = enqueued - writer.num_slots_used  # minus the H2D copies
    if capacity == 4096:
        assert (applies, writer.num_slots_used) == (1, 1)
    else:  # one launch per batch that fits a slot
        assert applies > 1
    assert ints.base[0].tolist() == [-1, 1, 9, 3] and ints.base[1].tolist() == [-1] * 4
    assert floats.base.tolist() == [0.5, 0.5, 1.25]
    assert longs.base.tolist() == [[7] * 4, [2**40 + 5, -(2**35), 3, 2**50 + 1], [7] * 4]
    assert ints.num_pending == floats.num_pending == longs.num_pending == 0


def test_scalar_cells_of_every_member_apply_in_the_one_launch_and_later_writes_win_across_kinds():
    """`stage_scalar` goes to the group's cell table (flushed per element type, not member by member); a cell
    and a row diff of the same cell in one step still apply in staging order, whichever came first."""
    dev = Device("sim", seed=3, lag_policy="random-drain")
    group, ints, floats, longs = _group_of_three(dev)
    floats.stage_scalar(0, 1.5)
    floats.stage_scalar(0, 2.5)  # the later write of a cell wins inside the table
    floats.stage_scalar(1, -3.0)
    longs.stage_scalar(2, 2**45 + 3)
    ints.stage_scalar(1, 11)
    ints.stage(1, 0, [12, 13])  # a row diff after a cell of its row: the row diff wins
    longs.stage(0, 0, [4, 5])
    longs.stage_scalar(0, 6)  # a cell after a row diff of its row: the cell wins
    assert (ints.num_pending, floats.num_pending, longs.num_pending) == (2, 2, 3)
    pool = StagingPool(dev, num_slots=4, capacity_bytes=4096)
    writer, enqueued = _flush_group(dev, group, pool)
    assert enqueued - writer.num_slots_used == 1  # one apply launch
    assert floats.base.tolist() == [2.5, -3.0, 0.5]
    assert ints.base[1].tolist() == [12, 13, -1, -1]
    assert longs.base[0].tolist() == [6, 5, 7, 7] and longs.base[2].tolist() == [2**45 + 3, 7, 7, 7]
    assert ints.num_pending == floats.num_pending == longs.num_pending == 0
    floats.stage_scalar(2, 9.0)
    floats.discard_pending()  # a discarded cell is never written
    ints.stage_scalar(0, 1)
    _flush_group(dev, group, pool, step=1)
    assert floats.base.tolist() == [2.5, -3.0, 0.5] and ints.base[0, 0] == 1


def test_members_of_a_group_are_flushed_by_the_group_not_by_themselves():
    dev = Device("cpu")
    group, ints, _, _ = _group_of_three(dev)
    ints.stage(2, 0, [4])
    pool = StagingPool(dev, num_slots=2, capacity_bytes=1024)
    writer = StagingWriter(pool, 0)
    ints.flush(writer)  # a shared member: the group's owner flushes
    assert ints.num_pending == 1 and writer.slot is None
    group.flush(writer)
    writer.submit()
    group.enqueue_apply()
    assert ints.base[2, 0] == 4
    with pytest.raises(RuntimeError, match="sealed"):
        StagedWriteTensor(dev, 2, torch.int32, "late", group=group)


def test_first_slot_reserves_a_fixed_layout_and_diffs_follow_it():
    dev = Device("cpu")
    pool = StagingPool(dev, num_slots=2, capacity_bytes=256)
    writer = StagingWriter(pool, 0)
    slot = writer.first_slot(64)
    assert slot.state is SlotState.WRITING and slot.used_bytes == 64
    writer.trim_reserved(16)
    host, dev_view = writer.alloc_words(4)
    host[:] = [1, 2, 3, 4]
    assert slot.used_bytes == 32  # 16-byte aligned, right after the kept part of the reservation
    writer.submit()
    assert dev_view.tolist() == [1, 2, 3, 4]
    with pytest.raises(StagingCapacityError):
        StagingWriter(pool, 1).first_slot(512)


def test_free_index_names_the_words_the_next_reservation_hands_out():
    """A flush may fill the current slot's free words before it knows its size (`StagedWriteGroup._pack_members`):
    the reservation of that prefix hands out those same words, and a kept note over them is dropped at once."""
    dev = Device("cpu")
    pool = StagingPool(dev, num_slots=2, capacity_bytes=256)
    writer = StagingWriter(pool, 0)
    assert writer.free_index() is None  # no slot yet
    slot = writer.first_slot(20)
    slot.kept, slot.kept_bytes = "compact arrays", 48
    same_slot, first = writer.free_index()
    assert same_slot is slot and first == 8  # after the reservation, 16-byte aligned
    assert slot.kept is None and slot.used_bytes == 20  # the note over those words is gone; nothing reserved
    slot.host_words[first:first + 3] = [7, 8, 9]
    host, got_slot, start = writer.reserve_words(3)
    assert got_slot is slot and start == first and host.tolist() == [7, 8, 9]
    writer.submit()
    with pytest.raises(StagingLifetimeError):
        slot.free_index()  # in flight: not writable


def test_a_reserved_index_is_the_words_reserve_words_would_hand_out_and_rolls_over_a_full_slot():
    """`StagingWriter.reserve_index` reserves as `reserve_words` does (alignment, a kept note dropped, a new slot when
    the current one is full, the full one submitted), without making a view: the caller writes ``host_words``."""
    dev = Device("cpu")
    pool = StagingPool(dev, num_slots=2, capacity_bytes=64)
    writer = StagingWriter(pool, 0)
    slot = writer.first_slot(20)
    slot.kept, slot.kept_bytes = "compact arrays", 48
    got_slot, first = writer.reserve_index(2)
    assert got_slot is slot and first == 8 and slot.used_bytes == 40 and slot.kept is None
    got_slot.host_words[first: first + 2] = [5, 6]
    _, view_slot, view_first = writer.reserve_words(1)
    assert view_slot is slot and view_first == 12  # after the indexed words, aligned
    rolled, start = writer.reserve_index(4)  # 16 bytes do not fit after 52: the next slot, from its start
    assert rolled is not slot and start == 0 and writer.bytes == 52 and writer.num_slots_used == 2  # the full one submitted
    with pytest.raises(StagingCapacityError):
        writer.reserve_index(17)  # more than a whole slot
    assert slot.host_words[8:10].tolist() == [5, 6]


def test_claimed_free_words_are_reserved_and_a_claim_after_another_allocation_raises():
    """`claim_free_words` reserves the prefix a caller filled from `free_index` (the in-place diff table), and
    refuses words another allocation took meanwhile, words past the slot's end, and a slot no longer being written."""
    dev = Device("cpu")
    pool = StagingPool(dev, num_slots=2, capacity_bytes=256)
    writer = StagingWriter(pool, 0)
    slot = writer.first_slot(20)
    _, first = writer.free_index()
    slot.host_words[first:first + 2] = [5, 6]
    slot.claim_free_words(first, 2)
    assert slot.used_bytes == 4 * (first + 2)
    host, _, start = writer.reserve_words(1)  # the next allocation starts after the claimed words
    assert start >= first + 2
    _, stale = writer.free_index()
    writer.reserve_words(1)  # takes the words `stale` named
    with pytest.raises(StagingLifetimeError):
        slot.claim_free_words(stale, 1)
    _, first = writer.free_index()
    with pytest.raises(StagingLifetimeError):
        slot.claim_free_words(first, 64)  # past the slot's end
    writer.submit()
    with pytest.raises(StagingLifetimeError):
        slot.claim_free_words(first, 1)  # in flight


@pytest.mark.parametrize("redirect", [True, False], ids=["redirected", "copied"])
def test_views_of_a_placed_first_slot_read_the_home_buffer_the_slot_lands_in(redirect):
    """`place_first`: views handed out after it point into the home buffer (a bucketed step's step buffer), which
    the slot's own H2D (redirected) or a device copy after it fills; views of a second slot stay the slot's."""
    dev = Device("cpu")
    pool = StagingPool(dev, num_slots=3, capacity_bytes=64)
    home = dev.zeros(64, torch.uint8)
    writer = StagingWriter(pool, 0)
    slot = writer.first_slot(16)
    writer.place_first(home)
    words = writer.stage_array([7, 8, 9], torch.int32)
    floats = writer.stage_array([0.5, 1.5], torch.float32)
    spilled = writer.stage_array(list(range(12)), torch.int32)  # does not fit: the second slot
    assert words.data_ptr() == home.data_ptr() + 16 and floats.data_ptr() == home.data_ptr() + 32
    assert writer.slot is not slot and spilled.data_ptr() != home.data_ptr() + 48
    writer.submit(home, redirect=redirect)
    assert words.tolist() == [7, 8, 9] and floats.tolist() == [0.5, 1.5] and spilled.tolist() == list(range(12))


def test_a_placed_view_whose_home_is_never_filled_reads_stale_bytes():
    """The planted bug: views placed in a home the slot's bytes never reach (no ``first_to`` at submit)."""
    dev = Device("cpu")
    pool = StagingPool(dev, num_slots=2, capacity_bytes=64)
    home = dev.zeros(64, torch.uint8)
    writer = StagingWriter(pool, 0)
    writer.first_slot(16)
    writer.place_first(home)
    words = writer.stage_array([7, 8, 9], torch.int32)
    writer.submit()
    assert words.tolist() == [0, 0, 0]


def test_ragged_diffs_land_with_the_other_diffs_in_one_launch():
    dev = Device("sim", seed=3, lag_policy="random-drain")
    group, ints, floats, _ = _group_of_three(dev)
    ints.stage(0, 0, [5])
    ints.stage_ragged(np.array([1, 2]), np.array([1, 0]), np.array([2, 3]), np.array([7, 8, 9, 10, 11]))
    floats.stage_scalar(0, 2.0)
    with pytest.raises(IndexError):
        ints.stage_ragged(np.array([2]), np.array([3]), np.array([2]), np.array([1, 2]))  # past the row
    _, enqueued = _flush_group(dev, group, StagingPool(dev, num_slots=2, capacity_bytes=1024))
    assert enqueued == 2  # one H2D, one apply
    assert ints.base.tolist() == [[5, -1, -1, -1], [-1, 7, 8, -1], [9, 10, 11, -1]]
    assert floats.base.tolist() == [2.0, 0.5, 0.5] and ints.num_pending == 0
