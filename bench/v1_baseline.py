"""A fair V1-style host-side input builder: the baseline for the host-cost benchmark.

This is the best a host-side design does, not a per-request Python loop: a persistent CPU batch
(numpy arrays kept across steps; a finished request's row is filled by moving the last row into
it, so live rows stay dense), inputs built with vectorised numpy every step, then the step's input
tensors *and the whole block table* uploaded through pinned buffers with non-blocking copies.

Ownership: every array here is host memory owned by `V1HostBatch` for its lifetime, written by
the host; the device tensors are owned by it too and written only by its uploads.
"""
from __future__ import annotations

from itertools import compress
from typing import Mapping, Sequence

import numpy as np
import torch

from runnercheck.impl.interface import CachedRequests


class V1HostBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_req: int, block_size: int, max_num_tokens: int, device: torch.device):
        self.max_num_reqs = max_num_reqs
        self.block_size = block_size
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_computed = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.block_table = np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int32)
        self.req_ids: list[str] = []
        self.row_of: dict[str, int] = {}
        pin = device.type == "cuda"
        self._pinned = {
            name: torch.empty(n, dtype=dt, pin_memory=pin)
            for name, n, dt in (
                ("input_ids", max_num_tokens, torch.int64),
                ("positions", max_num_tokens, torch.int64),
                ("slot_mapping", max_num_tokens, torch.int64),
                ("query_start_loc", max_num_reqs + 1, torch.int32),
                ("seq_lens", max_num_reqs, torch.int32),
                ("logits_indices", max_num_reqs, torch.int64),
            )
        }
        self._pinned_block_table = torch.empty((max_num_reqs, max_blocks_per_req), dtype=torch.int32, pin_memory=pin)
        self.device_tensors = {name: torch.empty_like(t, device=device) for name, t in self._pinned.items()}
        self.device_block_table = torch.empty_like(self._pinned_block_table, device=device)
        self.h2d_bytes_last_step = 0

    def add(self, req_id: str, token_ids: Sequence[int], block_ids: Sequence[int]) -> None:
        row = len(self.req_ids)
        self.req_ids.append(req_id)
        self.row_of[req_id] = row
        n = len(token_ids)
        self.token_ids[row, :n] = token_ids
        self.num_tokens[row] = n
        self.num_computed[row] = 0
        self.block_table[row, : len(block_ids)] = block_ids
        self.num_blocks[row] = len(block_ids)

    def remove(self, req_id: str) -> None:
        row = self.row_of.pop(req_id)
        last = len(self.req_ids) - 1
        if row != last:
            moved = self.req_ids[last]
            self.token_ids[row] = self.token_ids[last]
            self.num_computed[row] = self.num_computed[last]
            self.num_tokens[row] = self.num_tokens[last]
            self.block_table[row] = self.block_table[last]
            self.num_blocks[row] = self.num_blocks[last]
            self.req_ids[row] = moved
            self.row_of[moved] = row
        self.req_ids.pop()

    def append_blocks(self, req_id: str, block_ids: Sequence[int]) -> None:
        row = self.row_of[req_id]
        k = self.num_blocks[row]
        self.block_table[row, k : k + len(block_ids)] = block_ids
        self.num_blocks[row] = k + len(block_ids)

    def update_cached(self, cached: CachedRequests) -> None:
        """The cached requests' share of V1's ``_update_states``: append the blocks of those that have new ones.

        Read from the parallel tuples as V1 reads its ``CachedRequestData``; the few requests with
        new blocks are picked out by C-level iterators, not a Python test per request.
        """
        for req_id, block_ids in zip(compress(cached.req_ids, cached.new_block_ids), filter(None, cached.new_block_ids)):
            self.append_blocks(req_id, block_ids)

    def append_token(self, req_id: str, token: int) -> None:
        row = self.row_of[req_id]
        self.token_ids[row, self.num_tokens[row]] = token
        self.num_tokens[row] += 1

    def prepare_inputs(self, scheduled: Mapping[str, int]) -> dict[str, torch.Tensor]:
        """Build the step's inputs with vectorised numpy and upload them plus the whole block table.

        ``scheduled``: request id -> tokens, batch order (`SchedulerOutput.num_scheduled_tokens`),
        read with C-level passes over its views, not a Python generator per request.
        """
        rows = np.fromiter(map(self.row_of.__getitem__, scheduled), dtype=np.int64, count=len(scheduled))
        query_lens = np.fromiter(scheduled.values(), dtype=np.int64, count=len(scheduled))
        num_reqs = len(rows)
        cu = np.zeros(num_reqs + 1, dtype=np.int64)
        np.cumsum(query_lens, out=cu[1:])
        total = int(cu[-1])
        req_of_token = np.repeat(np.arange(num_reqs), query_lens)
        offset_in_req = np.arange(total) - cu[req_of_token]
        positions = self.num_computed[rows][req_of_token] + offset_in_req
        token_rows = rows[req_of_token]
        input_ids = self.token_ids[token_rows, positions]
        block_idx = positions // self.block_size
        slot_mapping = self.block_table[token_rows, block_idx].astype(np.int64) * self.block_size + positions % self.block_size
        seq_lens = self.num_computed[rows] + query_lens
        logits_indices = cu[1:] - 1
        self.num_computed[rows] += query_lens.astype(np.int32)

        p = self._pinned
        p["input_ids"][:total].numpy()[:] = input_ids
        p["positions"][:total].numpy()[:] = positions
        p["slot_mapping"][:total].numpy()[:] = slot_mapping
        p["query_start_loc"][: num_reqs + 1].numpy()[:] = cu
        p["seq_lens"][:num_reqs].numpy()[:] = seq_lens
        p["logits_indices"][:num_reqs].numpy()[:] = logits_indices
        self._pinned_block_table.numpy()[:] = self.block_table
        nbytes = 0
        lengths = {"input_ids": total, "positions": total, "slot_mapping": total, "query_start_loc": num_reqs + 1, "seq_lens": num_reqs, "logits_indices": num_reqs}
        for name, n in lengths.items():
            self.device_tensors[name][:n].copy_(p[name][:n], non_blocking=True)
            nbytes += n * p[name].element_size()
        self.device_block_table.copy_(self._pinned_block_table, non_blocking=True)
        nbytes += self._pinned_block_table.numel() * self._pinned_block_table.element_size()
        self.h2d_bytes_last_step = nbytes
        return {**{k: v[: lengths[k]] for k, v in self.device_tensors.items()}, "block_table": self.device_block_table}
