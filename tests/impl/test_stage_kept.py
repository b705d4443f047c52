"""`InputBatch.stage` skips re-writing a steady plan's arrays into a slot that still holds them
(`StagingSlot.kept`), and writes them again once anything was allocated over them.  Its writes in C
(`impl/native/staging.c` put_words) leave the slot as its numpy writes do; a build that drops each
part's last value is caught, and put_words declines what it cannot take before writing anything."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import runnercheck.impl.input_batch as input_batch
import runnercheck.impl.native as native
from runnercheck.impl.buffers import StagingPool, StagingWriter
from runnercheck.impl.device import Device
from runnercheck.impl.input_batch import InputBatch, StepPlan
from test_native import _planted

staging = native.load("staging")


def _plan(rows: list[int]) -> StepPlan:
    r = len(rows)
    ints = lambda values: np.array(values, np.int32)  # noqa: E731
    return StepPlan(
        req_ids=tuple(f"r{i}" for i in range(r)), rows=ints(rows), cu=ints(range(r + 1)), draft_start=np.zeros(r + 1, np.int32),
        drafts=np.zeros(0, np.int32), logits_start=ints(range(r + 1)), prompt_token_index=np.zeros(0, np.int32),
        prompt_targets=np.zeros(0, np.int64), prompt_requests=(), num_logprobs=(None,) * r, num_tokens=r, max_query_len=1,
        max_seq_len=9, max_num_logprobs=-1, max_num_prompt_logprobs=-1, query_lens=np.ones(r, np.int64),
        num_drafts=np.zeros(r, np.int64), uniform=(1, 0), logits_start64=np.arange(r + 1, dtype=np.int64),
        num_reqs=r, num_prompt_rows=0,
    )


def _staged_rows(batch: InputBatch, slot, r: int) -> list[int]:
    offset, _, _ = batch._layout["rows"]
    return slot.host_words[offset // 4 : offset // 4 + r].tolist()


def _step(pool: StagingPool, batch: InputBatch, plan: StepPlan, step: int):
    writer = StagingWriter(pool, step)
    batch.stage(plan, writer)
    slot = writer.first
    writer.submit()
    pool.retire_completed()  # cpu: the copy ran inline, the slot is free again
    return slot


def test_arrays_rewritten_after_an_allocation_over_them():
    dev = Device("cpu")
    batch = InputBatch(dev, max_num_reqs=4, max_num_batched_tokens=8, max_blocks_per_req=2, max_num_draft_tokens=0)
    pool = StagingPool(dev, num_slots=1, capacity_bytes=4096)
    plan = _plan([3, 1, 2])
    slot = _step(pool, batch, plan, 0)
    assert _staged_rows(batch, slot, 3) == [3, 1, 2] and slot.kept is not None
    # Another step uses the slot from its first byte (an overflow slot): the kept arrays are gone.
    writer = StagingWriter(pool, 1)
    host, _ = writer.alloc_words(64)
    host[:] = -7
    writer.submit()
    pool.retire_completed()
    assert slot.kept is None
    _step(pool, batch, plan, 2)  # the same plan object again: must be written, not skipped
    assert _staged_rows(batch, slot, 3) == [3, 1, 2]


def test_unchanged_slot_is_not_rewritten():
    dev = Device("cpu")
    batch = InputBatch(dev, max_num_reqs=4, max_num_batched_tokens=8, max_blocks_per_req=2, max_num_draft_tokens=0)
    pool = StagingPool(dev, num_slots=1, capacity_bytes=4096)
    plan = _plan([0, 2])
    slot = _step(pool, batch, plan, 0)
    offset, _, _ = batch._layout["rows"]
    slot.host_words[offset // 4] = 99  # a marker a re-write would undo
    _step(pool, batch, plan, 1)
    assert _staged_rows(batch, slot, 2) == [99, 2], "the kept arrays were written again"
    other = _plan([0, 2])  # equal values, other arrays: written
    _step(pool, batch, other, 2)
    assert _staged_rows(batch, slot, 2) == [0, 2]


def _staged_words(c_module, rows: list[int], fill: int) -> list[int]:
    """A fresh slot's words (filled with ``fill`` first) after staging a plan of ``rows``, through ``c_module``'s
    put_words (None: numpy)."""
    dev = Device("cpu")
    batch = InputBatch(dev, max_num_reqs=8, max_num_batched_tokens=8, max_blocks_per_req=2, max_num_draft_tokens=0)
    pool = StagingPool(dev, num_slots=1, capacity_bytes=4096)
    pool.slots[0].host_words[:] = fill
    saved, input_batch._staging = input_batch._staging, c_module
    try:
        slot = _step(pool, batch, _plan(rows), 0)
    finally:
        input_batch._staging = saved
    return slot.host_words[: batch.staging_bytes // 4].tolist()


def assert_stages_agree(c_module, rows: list[int], fill: int) -> None:
    got, want = _staged_words(c_module, rows, fill), _staged_words(None, rows, fill)
    assert got == want, f"C put_words: {got}\nnumpy: {want}"


needs_native = pytest.mark.skipif(staging is None, reason="impl/native not built (or RUNNERCHECK_NATIVE=0)")


@needs_native
@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 7), max_size=8, unique=True), st.integers(-5, 5))
def test_c_stage_writes_what_numpy_writes(rows, fill):
    assert_stages_agree(staging, rows, fill)


def test_planted_bug_c_stage_dropping_each_parts_last_value_is_caught():
    planted = _planted("put_words_short", "staging")
    with pytest.raises(AssertionError, match="C put_words"):
        assert_stages_agree(planted, [3, 1, 2], -1)


@needs_native
def test_put_words_declines_what_it_cannot_take():
    words = np.zeros(8, np.int32)
    for parts in (((7, (1, 2)),),  # past the end
                  ((-1, (1,)),),
                  ((0, (1 << 31,)),),  # outside int32
                  ((0, (True,)),),
                  ((0, np.ones(2, np.int64)),),
                  ((0, [1, 2]),),  # a list, not a tuple
                  ((0, (1,)), (2,)),  # not a pair
                  ((0.0, (1,)),)):
        assert staging.put_words(words, parts) is NotImplemented, parts
    assert staging.put_words(words.astype(np.int64), ((0, (1,)),)) is NotImplemented
    assert not words.any()  # declined before writing
    assert staging.put_words(words, ((6, (4, 5)), (0, np.arange(3, dtype=np.int32)[::-1]))) is True
    assert words.tolist() == [2, 1, 0, 0, 0, 0, 4, 5]
