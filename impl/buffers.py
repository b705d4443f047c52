"""Pinned staging slots and staged diff writes into persistent device tensors.

Staging slots
-------------
A `StagingSlot` is a pinned host byte buffer plus a device byte buffer of the same size.  Its
life is a cycle enforced here (and checked harder by ``checks/lifetime.py``)::

    FREE --acquire--> WRITING --submit--> IN_FLIGHT --event completed, retire--> FREE

* WRITING: the host fills the slot through `StagingSlot.alloc` views.  Nothing on the device
  reads it yet.
* IN_FLIGHT: `StagingPool.submit` enqueued one H2D copy of the used bytes and recorded an event
  right after it.  The host must not write the slot until that event completes: on a real GPU
  (and on the ``sim`` device) the copy may not have run yet and would pick up the new bytes.
* FREE again once `event.query()` says the copy ran.  The device-side buffer is reused only by
  the slot's next H2D copy, which the stream orders after every kernel that read it.

Ownership: the `StagingPool` owns its slots (host buffers: pinned host, lifetime of the pool,
written by the host only in WRITING; device buffers: device, lifetime of the pool, written only by
the slot's own H2D copy).  Observers (the lifetime checker) see every transition.

Staged writes
-------------
A `StagedWriteTensor` owns a persistent device tensor ``base`` (``[rows]`` or ``[rows, cols]``)
whose only writer is its apply kernel.  The host records ragged diffs ``(row, start, values)``;
`flush` packs them into staging allocations and enqueues one Triton kernel that scatters them
into ``base``.  Later writes to the same cell win: diffs that overlap within a row are merged on
the host (cell by cell, in order) before packing, so no two kernel programs write one cell.

Capacity fallback: a `StagingWriter` fills one slot at a time; when an allocation does not fit
it submits the current slot and continues in a freshly acquired one (stream order keeps every
copy ahead of the kernels that read it).  `StagedWriteTensor.flush` splits a step's diffs into
batches whose arrays each fit a slot (cutting a long diff by columns), one apply launch per batch, so
staged writes of any size fit.  A raw `StagingWriter.alloc` larger than a whole slot raises
`StagingCapacityError` — size ``capacity_bytes`` for the largest compact per-step array.
"""
from __future__ import annotations

import enum
from typing import Callable, Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from impl.device import Device, DeviceEvent
from impl.hotpath import hot_path

_ALIGN = 16


class SlotState(enum.Enum):
    FREE = "FREE"
    WRITING = "WRITING"
    IN_FLIGHT = "IN_FLIGHT"


class StagingLifetimeError(RuntimeError):
    """A staging slot used outside its lifetime (written while in flight, freed early, ...)."""

    def __init__(self, message: str, *, slot: int | None = None, step: int | None = None, state: SlotState | None = None):
        detail = []
        if slot is not None:
            detail.append(f"slot {slot}")
        if step is not None:
            detail.append(f"step {step}")
        if state is not None:
            detail.append(f"state {state.value}")
        super().__init__(f"{message} ({', '.join(detail)})" if detail else message)
        self.slot, self.step, self.state = slot, step, state


class StagingCapacityError(ValueError):
    """One staging allocation larger than a whole slot."""


class StagingSlot:
    """One pinned host buffer and its device mirror.  Owned by a `StagingPool`."""

    def __init__(self, index: int, device: Device, capacity_bytes: int):
        self.index = index
        self.capacity_bytes = capacity_bytes
        self.host = device.pinned(capacity_bytes, torch.uint8)
        self.device = device.empty(capacity_bytes, torch.uint8)
        self.state = SlotState.FREE
        self.step = -1
        self.used_bytes = 0
        self.event: DeviceEvent | None = None

    def alloc(self, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Reserve ``n`` elements: a host view to fill now and the device view kernels read later."""
        if self.state is not SlotState.WRITING:
            raise StagingLifetimeError("alloc on a staging slot that is not being written", slot=self.index, step=self.step, state=self.state)
        itemsize = dtype.itemsize
        nbytes = n * itemsize
        start = -(-self.used_bytes // _ALIGN) * _ALIGN
        if start + nbytes > self.capacity_bytes:
            raise StagingCapacityError(f"{nbytes} bytes do not fit in slot {self.index} ({self.capacity_bytes - start} left)")
        self.used_bytes = start + nbytes
        return self.host[start : start + nbytes].view(dtype), self.device[start : start + nbytes].view(dtype)

    def fits(self, n: int, dtype: torch.dtype) -> bool:
        itemsize = dtype.itemsize
        start = -(-self.used_bytes // _ALIGN) * _ALIGN
        return start + n * itemsize <= self.capacity_bytes


Observer = Callable[[StagingSlot, SlotState, SlotState], None]


class StagingPool:
    """A ring of staging slots whose reuse is governed by events (see the module docstring)."""

    def __init__(self, device: Device, num_slots: int = 8, capacity_bytes: int = 1 << 18):
        if num_slots < 1 or capacity_bytes < _ALIGN:
            raise ValueError("StagingPool needs at least one slot of at least 16 bytes")
        self.device = device
        self.capacity_bytes = capacity_bytes
        self.slots = [StagingSlot(i, device, capacity_bytes) for i in range(num_slots)]
        self.observers: list[Observer] = []
        self.h2d_bytes_total = 0
        self.num_backpressure_waits = 0
        self._next = 0

    def _transition(self, slot: StagingSlot, new: SlotState) -> None:
        old = slot.state
        slot.state = new
        for observer in list(self.observers):
            observer(slot, old, new)

    @hot_path
    def retire_completed(self) -> None:
        for slot in self.slots:
            if slot.state is SlotState.IN_FLIGHT and slot.event.query():
                self._retire(slot)

    def _retire(self, slot: StagingSlot) -> None:
        self._transition(slot, SlotState.FREE)
        slot.event = None

    @hot_path
    def acquire(self, step: int) -> StagingSlot:
        """A FREE slot, now WRITING.  Waits on the oldest in-flight copy only if none is free."""
        self.retire_completed()
        n = len(self.slots)
        # A slot already used in this step still has unread device data: the step's kernels are
        # enqueued after all of its copies, so reusing it now would overwrite what they read.
        for k in range(n):
            slot = self.slots[(self._next + k) % n]
            if slot.state is SlotState.FREE and slot.step != step:
                break
        else:
            in_flight = [s for s in self.slots if s.state is SlotState.IN_FLIGHT and s.step != step]
            if not in_flight:
                if all(s.step == step for s in self.slots):
                    raise StagingCapacityError(f"step {step} needs more than the pool's {n} staging slots of {self.capacity_bytes} bytes")
                raise StagingLifetimeError("no staging slot is free or in flight: every slot is being written")
            slot = min(in_flight, key=lambda s: s.step)
            self.num_backpressure_waits += 1
            slot.event.synchronize()  # runnercheck: allow-host-read backpressure: only when every slot is in flight
            self._retire(slot)
        self._next = (slot.index + 1) % n
        slot.step = step
        slot.used_bytes = 0
        self._transition(slot, SlotState.WRITING)
        return slot

    @hot_path
    def submit(self, slot: StagingSlot) -> None:
        """Enqueue the slot's one H2D copy and record the event that frees it."""
        if slot.state is not SlotState.WRITING:
            raise StagingLifetimeError("submit of a slot that is not being written", slot=slot.index, step=slot.step, state=slot.state)
        nbytes = slot.used_bytes
        if nbytes:
            host, dev = slot.host[:nbytes], slot.device[:nbytes]
            self.device.enqueue(lambda: dev.copy_(host, non_blocking=True), f"h2d slot{slot.index} step{slot.step}")
        self.h2d_bytes_total += nbytes
        slot.event = self.device.record_event()
        self._transition(slot, SlotState.IN_FLIGHT)


class StagingWriter:
    """Hands out staging allocations for one step, rolling over to a new slot when one is full."""

    def __init__(self, pool: StagingPool, step: int):
        self.pool = pool
        self.step = step
        self.slot: StagingSlot | None = None
        self.bytes = 0
        self.num_slots_used = 0

    @hot_path
    def alloc(self, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.slot is None or not self.slot.fits(n, dtype):
            if self.slot is not None:
                self._submit_current()
            self.slot = self.pool.acquire(self.step)
            self.num_slots_used += 1
        return self.slot.alloc(n, dtype)

    def stage_array(self, values: Sequence | np.ndarray | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Copy host values into the slot; returns the device view (valid after submit, in stream order)."""
        src = torch.as_tensor(np.asarray(values), dtype=dtype) if not isinstance(values, torch.Tensor) else values.to(dtype)
        host_view, dev_view = self.alloc(src.numel(), dtype)
        host_view.copy_(src.reshape(-1))
        return dev_view

    def _submit_current(self) -> None:
        self.bytes += self.slot.used_bytes
        self.pool.submit(self.slot)
        self.slot = None

    @hot_path
    def submit(self) -> None:
        """Submit the current slot.  Must come before the step's kernels that read the views."""
        if self.slot is not None:
            self._submit_current()


# --------------------------------------------------------------------------- staged writes


@triton.jit
def _apply_staged_writes_kernel(base_ptr, row_ptr, start_ptr, len_ptr, offset_ptr, values_ptr, num_cols, BLOCK: tl.constexpr):
    diff = tl.program_id(0)
    row = tl.load(row_ptr + diff).to(tl.int64)
    start = tl.load(start_ptr + diff)
    length = tl.load(len_ptr + diff)
    offset = tl.load(offset_ptr + diff)
    for chunk in range(0, length, BLOCK):
        cols = chunk + tl.arange(0, BLOCK)
        mask = cols < length
        vals = tl.load(values_ptr + offset + cols, mask=mask)
        tl.store(base_ptr + row * num_cols + start + cols, vals, mask=mask)


class StagedWriteTensor:
    """A persistent device tensor written only through staged diffs.

    Owner: whoever constructs it (the state table, the block table, the sampler state).
    ``base`` lives on the device for the owner's lifetime and its one writer is the apply kernel
    enqueued by `flush`.  Pending diffs live on the host until `flush` (or `discard_pending`).
    """

    def __init__(self, device: Device, shape: int | tuple[int, ...], dtype: torch.dtype, name: str, fill: float | int = 0):
        self.device = device
        self.name = name
        self.dtype = dtype
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if len(shape) not in (1, 2):
            raise ValueError(f"{name}: StagedWriteTensor is 1-D or 2-D, got shape {shape}")
        self.shape = shape
        self.num_rows = shape[0]
        self.num_cols = shape[1] if len(shape) == 2 else 1
        self.base = device.full(shape, fill, dtype)
        self._pending: list[tuple[int, int, list]] = []
        self._applies: list[Callable[[], None]] = []
        self.h2d_bytes_last_flush = 0

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def stage(self, row: int, start: int, values: Sequence[float | int] | np.ndarray) -> None:
        """Record ``base[row, start:start+len(values)] = values`` for the next flush."""
        values = list(values.tolist() if isinstance(values, np.ndarray) else values)
        if not 0 <= row < self.num_rows:
            raise IndexError(f"{self.name}: row {row} outside [0, {self.num_rows})")
        if start < 0 or start + len(values) > self.num_cols:
            raise IndexError(f"{self.name}: columns [{start}, {start + len(values)}) outside [0, {self.num_cols})")
        if values:
            self._pending.append((row, start, values))

    def stage_scalar(self, row: int, value: float | int) -> None:
        self.stage(row, 0, [value])

    def discard_pending(self) -> None:
        self._pending.clear()

    def _merged_diffs(self) -> list[tuple[int, int, list]]:
        by_row: dict[int, list[tuple[int, list]]] = {}
        for row, start, values in self._pending:
            by_row.setdefault(row, []).append((start, values))
        merged: list[tuple[int, int, list]] = []
        for row, diffs in by_row.items():
            if len(diffs) == 1:
                merged.append((row, diffs[0][0], diffs[0][1]))
                continue
            cells: dict[int, float | int] = {}
            for start, values in diffs:  # in staging order: later writes overwrite
                for j, v in enumerate(values):
                    cells[start + j] = v
            cols = sorted(cells)
            run_start, run = cols[0], [cells[cols[0]]]
            for c in cols[1:]:
                if c == run_start + len(run):
                    run.append(cells[c])
                else:
                    merged.append((row, run_start, run))
                    run_start, run = c, [cells[c]]
            merged.append((row, run_start, run))
        return merged

    def _batches(self, diffs: list[tuple[int, int, list]], slot_bytes: int) -> list[list[tuple[int, int, list]]]:
        """Split diffs into batches whose two staging arrays (meta, values) each fit one slot.

        A diff longer than a slot holds is cut by columns into several diffs; merged diffs never
        overlap, so batches can be applied in any order.
        """
        itemsize = self.dtype.itemsize
        meta_bytes = 16  # four int32 per diff
        max_values = max(1, slot_bytes // itemsize)
        max_diffs = max(1, slot_bytes // meta_bytes)
        batches: list[list[tuple[int, int, list]]] = [[]]
        num_values = 0
        for row, start, values in diffs:
            for cut in range(0, len(values), max_values):
                piece = values[cut : cut + max_values]
                if batches[-1] and (num_values + len(piece) > max_values or len(batches[-1]) >= max_diffs):
                    batches.append([])
                    num_values = 0
                batches[-1].append((row, start + cut, piece))
                num_values += len(piece)
        return batches

    @hot_path
    def flush(self, writer: StagingWriter) -> None:
        """Pack pending diffs into staging and prepare the apply kernel(s) (enqueued by `enqueue_apply`).

        Diffs that would not fit one staging slot are split into several batches (one apply launch
        each), so a step never needs a single allocation larger than a slot.
        """
        self.h2d_bytes_last_flush = 0
        if not self._pending:
            return
        diffs = self._merged_diffs()
        self._pending.clear()
        applies = []
        for batch in self._batches(diffs, writer.pool.capacity_bytes):
            applies.append(self._pack(batch, writer))
        self._applies = applies

    def _pack(self, diffs: list[tuple[int, int, list]], writer: StagingWriter) -> Callable[[], None]:
        n = len(diffs)
        meta = np.empty((4, n), dtype=np.int32)
        flat: list = []
        for i, (row, start, values) in enumerate(diffs):
            meta[:, i] = (row, start, len(values), len(flat))
            flat.extend(values)
        meta_dev = writer.stage_array(meta, torch.int32)
        values_dev = writer.stage_array(flat, self.dtype)
        self.h2d_bytes_last_flush += meta.nbytes + len(flat) * values_dev.element_size()
        base, num_cols = self.base, self.num_cols
        max_len = max(len(v) for _, _, v in diffs)
        block = max(16, min(1024, triton.next_power_of_2(max_len)))

        def apply() -> None:
            _apply_staged_writes_kernel[(n,)](
                base, meta_dev[0:n], meta_dev[n : 2 * n], meta_dev[2 * n : 3 * n], meta_dev[3 * n : 4 * n], values_dev, num_cols, BLOCK=block
            )

        return apply

    def enqueue_apply(self) -> None:
        """Enqueue the kernel(s) prepared by the last `flush` (call after the writer submitted)."""
        applies, self._applies = self._applies, []
        for apply in applies:
            self.device.enqueue(apply, f"apply {self.name}")
