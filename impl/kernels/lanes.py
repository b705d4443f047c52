"""Lane copies: device kernels that read or write a pinned host buffer chosen by a device-side counter.

A steady step's graph (`runnercheck.impl.lanes`) starts by copying its staging bytes from the host and ends by
copying its packed output to the host, with no separate copy calls: the pinned buffer of each lane
is addressed from the kernel directly (CUDA's unified addressing: a pointer from ``cudaHostAlloc``,
which backs torch's pinned memory, is valid in device code), and which lane a replay uses is
``counter % num_lanes``, read on the device, so one captured graph serves every lane.  The counter
is advanced (modulo the lanes) by `launch_lane_advance`, the last launch of such a step, after every
program of both copies has read it.

On CPU (the Triton interpreter) the same kernels dereference the host addresses directly.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from runnercheck.impl.kernels.launch import launch

LANE_COPY_BLOCK = 4096  # bytes per program


@triton.jit(do_not_specialize=["nbytes", "num_lanes"])
def _lane_copy_kernel(counter_ptr, table_ptr, device_ptr, nbytes, num_lanes, TO_HOST: tl.constexpr, BLOCK: tl.constexpr):
    lane = tl.load(counter_ptr) % num_lanes
    host_ptr = tl.load(table_ptr + lane).to(tl.pointer_type(tl.uint8))
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < nbytes
    if TO_HOST:
        tl.store(host_ptr + offsets, tl.load(device_ptr + offsets, mask=mask), mask=mask)
    else:
        tl.store(device_ptr + offsets, tl.load(host_ptr + offsets, mask=mask), mask=mask)


@triton.jit(do_not_specialize=["num_lanes"])
def _lane_advance_kernel(counter_ptr, num_lanes):
    tl.store(counter_ptr, (tl.load(counter_ptr) + 1) % num_lanes)


def launch_lane_copy(counter: torch.Tensor, table: torch.Tensor, device_bytes: torch.Tensor, nbytes: int,
                     *, to_host: bool) -> None:
    """Copy ``nbytes`` between ``device_bytes`` (uint8, device) and the pinned buffer whose address is
    ``table[counter % len(table)]`` (int64 addresses): into it when ``to_host``, out of it otherwise.
    Interpreted, the buffers must be declared reachable through ``table``
    (`runnercheck.impl.kernels.interpreted_memory.reachable_through`), or the access is a memory fault."""
    grid = (max(1, triton.cdiv(nbytes, LANE_COPY_BLOCK)),)
    launch(_lane_copy_kernel, grid, counter, table, device_bytes, nbytes, table.numel(), TO_HOST=to_host,
           BLOCK=LANE_COPY_BLOCK)


def launch_lane_advance(counter: torch.Tensor, num_lanes: int) -> None:
    """``counter = (counter + 1) % num_lanes`` on the device (one program: after the step's lane copies, in stream order)."""
    launch(_lane_advance_kernel, (1,), counter, num_lanes)


__all__ = ["LANE_COPY_BLOCK", "launch_lane_advance", "launch_lane_copy"]
