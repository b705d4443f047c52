"""Block tables: whole lists at admission, appends at the right column, limits checked at the boundary."""
from __future__ import annotations

import numpy as np
import pytest

from runnercheck.impl.block_table import BlockTable
from runnercheck.impl.buffers import StagingPool, StagingWriter
from runnercheck.impl.device import Device
from runnercheck.impl.boundary import validate_scheduler_output
from runnercheck.impl.interface import (
    BlockIdError,
    CachedRequest,
    CachedRequests,
    LiveRequest,
    NewRequest,
    RunnerLimits,
    SamplingParams,
    SchedulerOutput,
    blocks_per_request,
)


def _flush(bt: BlockTable, pool: StagingPool, step: int) -> None:
    writer = StagingWriter(pool, step)
    bt.flush(writer)
    writer.submit()
    bt.enqueue_apply()


@pytest.mark.parametrize("kind", ["cpu", "sim"])
def test_assign_append_and_reuse(kind):
    dev = Device(kind, lag_policy="lag-1-steps") if kind == "sim" else Device(kind)
    pool = StagingPool(dev, num_slots=4, capacity_bytes=1024)
    bt = BlockTable(dev, max_num_reqs=3, max_model_len=20, block_size=4)
    assert bt.max_blocks_per_req == 5 == blocks_per_request(20, 4)
    bt.assign(0, (7, 3))
    bt.assign(2, (9,))
    _flush(bt, pool, 0)
    dev.begin_step()
    bt.append(0, 2, (11,))
    bt.append(0, 3, (12, 13))  # two appends in one step land where they are placed
    bt.append(2, 1, ())
    _flush(bt, pool, 1)
    dev.begin_step()
    bt.assign(2, (1, 2))  # a new request in a reused row overwrites from column 0
    bt.append_many(np.array([2], np.int64), np.array([2], np.int64), np.array([1], np.int64), np.array([4], np.int64))
    _flush(bt, pool, 2)
    dev.synchronize()
    assert bt.base[0].tolist() == [7, 3, 11, 12, 13]
    assert bt.base[2, :3].tolist() == [1, 2, 4]


def test_boundary_rejects_rows_that_overflow():
    """The per-request limit is a boundary rule (`validate_scheduler_output`; the runner's `read_step` holds the same)."""
    limits = RunnerLimits(vocab_size=8, max_num_reqs=2, max_model_len=8, max_num_batched_tokens=8, num_kv_blocks=8, block_size=4)
    assert blocks_per_request(limits.max_model_len, limits.block_size) == 2
    p = SamplingParams()
    validate_scheduler_output(SchedulerOutput(0, new_requests=(NewRequest("a", (1,), p, (0, 1)),)), {}, limits)
    with pytest.raises(BlockIdError, match="3 blocks > 2"):
        validate_scheduler_output(SchedulerOutput(0, new_requests=(NewRequest("a", (1,), p, (0, 1, 2)),)), {}, limits)
    live = {"a": LiveRequest(num_tokens=5, num_computed_upper=4, num_blocks=2)}
    with pytest.raises(BlockIdError) as info:
        validate_scheduler_output(SchedulerOutput(1, cached_requests=CachedRequests.of((CachedRequest("a", (5,), 4),))), live, limits)
    assert info.value.req_id == "a" and info.value.field == "new_block_ids"
