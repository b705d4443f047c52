"""`InputBatch.stage` skips re-writing a steady plan's arrays into a slot that still holds them
(`StagingSlot.kept`), and writes them again once anything was allocated over them."""
from __future__ import annotations

import numpy as np

from impl.buffers import StagingPool, StagingWriter
from impl.device import Device
from impl.input_batch import InputBatch, StepPlan


def _plan(rows: list[int]) -> StepPlan:
    r = len(rows)
    ints = lambda values: np.array(values, np.int32)  # noqa: E731
    return StepPlan(
        req_ids=tuple(f"r{i}" for i in range(r)), rows=ints(rows), cu=ints(range(r + 1)), draft_start=np.zeros(r + 1, np.int32),
        drafts=np.zeros(0, np.int32), logits_start=ints(range(r + 1)), prompt_token_index=np.zeros(0, np.int32),
        prompt_targets=np.zeros(0, np.int64), prompt_requests=(), num_logprobs=(None,) * r, num_tokens=r, max_query_len=1,
        max_seq_len=9, max_num_logprobs=-1, max_num_prompt_logprobs=-1, query_lens=np.ones(r, np.int64),
        num_drafts=np.zeros(r, np.int64), uniform=(1, 0), logits_start64=np.arange(r + 1, dtype=np.int64),
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
