"""Per-row KV block tables, appended to through staged diffs.

Ownership
---------
``table`` -- a `StagedWriteTensor` ``[max_num_reqs, max_blocks_per_req]`` int32 on the device (in the
runner's `StagedWriteGroup` when one is given), for
the runner's lifetime; row r holds the physical KV block ids of the request in state row r, in
order.  Its one writer is the staged-write apply kernel: a new request stages its whole list at
column 0, a cached request stages only the blocks appended this step, at the column after its
last one.  Cells past a row's count are stale and never read (the input-prep kernel indexes only
blocks covering computed positions).  The per-step gather into batch order and the slot mapping
are done by the input-prep kernel (`runnercheck.impl.kernels.input_prep`), which reads this tensor.

Host state: none.  How many blocks each row holds is the request state's mirror
(`runnercheck.impl.state.RequestStateTable.num_blocks`, the only copy: the host is the only source of block ids);
appends are placed at the columns its ``append_blocks`` returns.
"""
from __future__ import annotations

import numpy as np
import torch

from runnercheck.impl.buffers import StagingWriter
from runnercheck.impl.staged_writes import StagedWriteGroup, StagedWriteTensor
from runnercheck.impl.device import Device
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.interface import blocks_per_request


class BlockTable:
    """Block ids of every row (device, staged appends).  See the module docstring."""

    def __init__(self, device: Device, max_num_reqs: int, max_model_len: int, block_size: int,
                 group: StagedWriteGroup | None = None):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.max_blocks_per_req = blocks_per_request(max_model_len, block_size)
        self.table = StagedWriteTensor(device, (max_num_reqs, self.max_blocks_per_req), torch.int32, "block_table", group=group)

    @property
    def base(self) -> torch.Tensor:
        return self.table.base

    @hot_path
    def assign(self, row: int, block_ids: tuple[int, ...]) -> None:
        """A newly admitted row's whole block list (a reused row is overwritten from column 0)."""
        if block_ids:
            self.table.stage_list(row, list(block_ids))  # a fresh list: kept as the pending diff

    def append(self, row: int, start: int, block_ids: tuple[int, ...]) -> None:
        """``block_ids`` after the ``start`` blocks ``row`` holds."""
        if block_ids:
            self.table.stage(row, start, block_ids)

    @hot_path
    def append_many(self, rows: np.ndarray, starts: np.ndarray, counts: np.ndarray, block_ids: np.ndarray) -> None:
        """Appends to several rows at once: ``block_ids`` holds ``counts[i]`` ids for ``rows[i]``, in order, placed
        after the ``starts[i]`` it holds (rows distinct, none admitted this step; checked at the boundary to fit
        the table: `runnercheck.impl.step_reader`)."""
        self.table.stage_ragged(rows, starts, counts, block_ids, checked=True)

    @hot_path
    def flush(self, writer: StagingWriter) -> None:
        self.table.flush(writer)

    def enqueue_apply(self) -> None:
        self.table.enqueue_apply()
