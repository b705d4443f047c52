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
        # Word views of both buffers, made once (the host one as numpy: per-step writes make no tensors).
        whole = capacity_bytes // 4 * 4
        self.host_words = self.host.numpy()[:whole].view(np.int32)
        self.device_words = self.device[:whole].view(torch.int32)
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

    def alloc_words(self, n: int) -> tuple[np.ndarray, torch.Tensor]:
        """`alloc` of ``n`` int32 words, the host side as a numpy view (no tensor made on the host)."""
        if self.state is not SlotState.WRITING:
            raise StagingLifetimeError("alloc on a staging slot that is not being written", slot=self.index, step=self.step, state=self.state)
        start = -(-self.used_bytes // _ALIGN) * _ALIGN
        if start + 4 * n > self.capacity_bytes:
            raise StagingCapacityError(f"{4 * n} bytes do not fit in slot {self.index} ({self.capacity_bytes - start} left)")
        self.used_bytes = start + 4 * n
        return self.host_words[start // 4 : start // 4 + n], self.device_words[start // 4 : start // 4 + n]

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
    def first_slot(self, reserve_bytes: int) -> StagingSlot:
        """Acquire the step's first slot with its leading ``reserve_bytes`` kept for a fixed layout
        (the caller writes them through views of its own, while the slot is WRITING)."""
        if self.slot is not None:
            raise StagingLifetimeError("first_slot after the writer already holds a slot", slot=self.slot.index, step=self.step)
        if reserve_bytes > self.pool.capacity_bytes:
            raise StagingCapacityError(f"a reserved layout of {reserve_bytes} bytes does not fit a {self.pool.capacity_bytes}-byte slot")
        self.slot = self.pool.acquire(self.step)
        self.num_slots_used += 1
        self.slot.used_bytes = reserve_bytes
        return self.slot

    def trim_reserved(self, used_bytes: int) -> None:
        """Give back the end of the reservation made by `first_slot`: only ``used_bytes`` of it were written."""
        if self.slot is None or self.num_slots_used != 1 or used_bytes > self.slot.used_bytes:
            raise StagingLifetimeError("trim_reserved without a larger reservation in the writer's first slot", step=self.step)
        self.slot.used_bytes = used_bytes

    @hot_path
    def alloc_words(self, n: int) -> tuple[np.ndarray, torch.Tensor]:
        """``n`` 32-bit words: a numpy host view to fill now and the int32 device view kernels read later."""
        if self.slot is None or not self.slot.fits(n, torch.int32):
            if self.slot is not None:
                self._submit_current()
            self.slot = self.pool.acquire(self.step)
            self.num_slots_used += 1
        return self.slot.alloc_words(n)

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
        if dtype == torch.int32 and not isinstance(values, torch.Tensor):
            src_words = np.asarray(values, np.int32).reshape(-1)
            host_words, dev_words = self.alloc_words(src_words.size)
            host_words[:] = src_words
            return dev_words
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


@triton.jit(do_not_specialize=["values_offset"])
def _apply_word_diffs_kernel(arena_ptr, staged_ptr, values_offset, BLOCK: tl.constexpr):
    """Diff ``d``: copy ``staged[values_offset + src : + length]`` to ``arena[dst : + length]`` (32-bit words)."""
    d = tl.program_id(0)
    dst = tl.load(staged_ptr + 3 * d).to(tl.int64)
    length = tl.load(staged_ptr + 3 * d + 1)
    src = tl.load(staged_ptr + 3 * d + 2).to(tl.int64) + values_offset
    for chunk in range(0, length, BLOCK):
        cols = chunk + tl.arange(0, BLOCK)
        mask = cols < length
        tl.store(arena_ptr + dst + cols, tl.load(staged_ptr + src + cols, mask=mask), mask=mask)


_APPLY_BLOCK = 128
_META_WORDS = 3  # (destination word, length in words, source word) per diff
_NP_DTYPES = {torch.int32: np.int32, torch.float32: np.float32, torch.int64: np.int64}


class StagedWriteGroup:
    """Persistent device tensors that share one int32 word arena, written by ONE apply launch per step.

    Owner: whoever constructs it (the runner for its row state, block table and sampling state;
    a standalone `StagedWriteTensor` owns a private group of its own).  ``arena`` lives on the
    device for the owner's lifetime; each member's ``base`` is a view into it (int32, float32 or
    int64 -- 4- and 8-byte elements as one or two words).  Its one writer is the apply kernel
    enqueued by `enqueue_apply`.  `flush` gathers every member's merged diffs into one staging
    allocation (diff table + values) -- more only when they do not fit one slot.
    The arena is allocated by `seal` (or the first ``base`` access); members join before that.
    """

    def __init__(self, device: Device, name: str):
        self.device = device
        self.name = name
        self.members: list[StagedWriteTensor] = []
        self._dirty: list[StagedWriteTensor] = []  # members with pending diffs, in the order they got them
        self.arena: torch.Tensor | None = None
        self._num_words = 0
        self._applies: list[Callable[[], None]] = []
        self.h2d_bytes_last_flush = 0

    def _join(self, tensor: "StagedWriteTensor") -> int:
        if self.arena is not None:
            raise RuntimeError(f"staged-write group {self.name!r} is sealed: {tensor.name!r} cannot join")
        offset = -(-self._num_words // 16) * 16  # 64-byte aligned members (int64 views need 8)
        self._num_words = offset + tensor.num_words
        self.members.append(tensor)
        return offset

    def seal(self) -> None:
        """Allocate the arena and fill each member's view (init time)."""
        if self.arena is not None:
            return
        self.arena = self.device.empty(max(1, self._num_words), torch.int32)
        for t in self.members:
            view = self.arena[t.word_offset : t.word_offset + t.num_words].view(t.dtype).view(t.shape)
            view.fill_(t.fill)
            t._base = view
        self.device._stream_waits_for_current()

    @hot_path
    def flush(self, writer: StagingWriter) -> None:
        """Pack every member's pending diffs into staging and prepare the apply launch (enqueued by `enqueue_apply`).

        Values are gathered per element type (int32, float32, int64) and turned into words with one
        numpy conversion each; the diff table holds (destination word, words, source word).
        """
        self.h2d_bytes_last_flush = 0
        by_dtype: dict[torch.dtype, tuple[list[int], list[int], list]] = {}
        dst_parts: list[np.ndarray] = []  # ragged diffs, already arrays
        len_parts: list[np.ndarray] = []
        word_parts: list[np.ndarray] = []
        dirty, self._dirty = self._dirty, []
        for t in dirty:
            words_per, base, cols = t.words_per_element, t.word_offset, t.num_cols
            if t._pending:
                diffs = t._merged_diffs()
                t._pending.clear()
                dst, lens, values = by_dtype.setdefault(t.dtype, ([], [], []))
                for row, start, vals in diffs:
                    dst.append(base + (row * cols + start) * words_per)
                    lens.append(len(vals) * words_per)
                    values.extend(vals)
            for rows, starts, lens_r, vals in t._ragged:
                dst_parts.append(base + (rows * cols + starts) * words_per)
                len_parts.append(lens_r * words_per)
                word_parts.append(np.asarray(vals, _NP_DTYPES[t.dtype]).view(np.int32))
            t._ragged.clear()
        for dtype, (dst, lens, values) in by_dtype.items():
            dst_parts.append(np.array(dst, np.int64))
            len_parts.append(np.array(lens, np.int64))
            word_parts.append(np.array(values, _NP_DTYPES[dtype]).view(np.int32))
        if not dst_parts:
            return
        self.seal()
        dst = np.concatenate(dst_parts) if len(dst_parts) > 1 else dst_parts[0]
        lens = np.concatenate(len_parts) if len(len_parts) > 1 else len_parts[0]
        values = np.concatenate(word_parts) if len(word_parts) > 1 else word_parts[0]
        src = np.zeros(len(lens), np.int64)
        lens[:-1].cumsum(out=src[1:])
        limit = writer.pool.capacity_bytes // 4 - 4  # words of one slot, less alignment
        if _META_WORDS * len(lens) + len(values) <= limit:
            self._applies = [self._pack(dst, lens, src, values, writer)]
        else:
            self._applies = [self._pack(*batch, writer) for batch in _word_batches(dst, lens, src, values, limit)]

    def _pack(self, dst: np.ndarray, lens: np.ndarray, src: np.ndarray, values: np.ndarray, writer: StagingWriter) -> Callable[[], None]:
        n = len(lens)
        meta_words = _META_WORDS * n
        host, staged = writer.alloc_words(meta_words + len(values))
        meta = host[:meta_words].reshape(n, _META_WORDS)
        meta[:, 0], meta[:, 1], meta[:, 2] = dst, lens, src
        host[meta_words:] = values
        self.h2d_bytes_last_flush += 4 * (meta_words + len(values))
        arena = self.arena

        def apply() -> None:
            _apply_word_diffs_kernel[(n,)](arena, staged, meta_words, BLOCK=_APPLY_BLOCK)

        return apply

    @hot_path
    def enqueue_apply(self) -> None:
        """Enqueue the launch(es) prepared by the last `flush` (call after the writer submitted)."""
        applies, self._applies = self._applies, []
        for apply in applies:
            self.device.enqueue(apply, f"apply {self.name}")


def _word_batches(dst: np.ndarray, lens: np.ndarray, src: np.ndarray, values: np.ndarray, limit: int) -> list[tuple]:
    """Split diffs into batches whose table + values fit ``limit`` words, cutting long diffs at even words.

    Merged diffs never overlap, so the batches may be applied in any order.
    """
    max_piece = max(2, (limit - _META_WORDS) // 2 * 2)
    batches: list[tuple] = []
    cur_dst: list[int] = []
    cur_len: list[int] = []
    cur_vals: list[np.ndarray] = []
    used = 0
    for d, n, s in zip(dst.tolist(), lens.tolist(), src.tolist()):
        for cut in range(0, n, max_piece):
            piece = min(max_piece, n - cut)
            if cur_len and used + _META_WORDS + piece > limit:
                batches.append(_batch(cur_dst, cur_len, cur_vals))
                cur_dst, cur_len, cur_vals, used = [], [], [], 0
            cur_dst.append(d + cut)
            cur_len.append(piece)
            cur_vals.append(values[s + cut : s + cut + piece])
            used += _META_WORDS + piece
    if cur_len:
        batches.append(_batch(cur_dst, cur_len, cur_vals))
    return batches


def _batch(dst: list[int], lens: list[int], vals: list[np.ndarray]) -> tuple:
    lens_arr = np.array(lens, np.int64)
    src = np.zeros(len(lens), np.int64)
    lens_arr[:-1].cumsum(out=src[1:])
    return np.array(dst, np.int64), lens_arr, src, np.concatenate(vals)


class StagedWriteTensor:
    """A persistent device tensor written only through staged diffs.

    Owner: whoever constructs it (the state table, the block table, the sampler state).
    ``base`` lives on the device for the owner's lifetime, a view into its `StagedWriteGroup`'s
    arena (``group``: shared with other tensors, flushed and applied by the group's owner; None:
    a private group, flushed and applied through this tensor).  Its one writer is the group's
    apply kernel.  Pending diffs live on the host until a flush (or `discard_pending`); diffs that
    overlap within a row are merged there, later writes winning.
    """

    def __init__(self, device: Device, shape: int | tuple[int, ...], dtype: torch.dtype, name: str, fill: float | int = 0,
                 group: StagedWriteGroup | None = None):
        self.device = device
        self.name = name
        if dtype not in _NP_DTYPES:
            raise ValueError(f"{name}: StagedWriteTensor holds int32, float32 or int64, got {dtype}")
        self.dtype = dtype
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if len(shape) not in (1, 2):
            raise ValueError(f"{name}: StagedWriteTensor is 1-D or 2-D, got shape {shape}")
        self.shape = shape
        self.num_rows = shape[0]
        self.num_cols = shape[1] if len(shape) == 2 else 1
        self.fill = fill
        self.words_per_element = dtype.itemsize // 4
        self.num_words = self.num_rows * self.num_cols * self.words_per_element
        self._private = group is None
        self.group = StagedWriteGroup(device, name) if group is None else group
        self.word_offset = self.group._join(self)
        self._base: torch.Tensor | None = None
        self._pending: list[tuple[int, int, list]] = []
        self._ragged: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # from `stage_ragged`
        if self._private:
            self.group.seal()

    @property
    def base(self) -> torch.Tensor:
        if self._base is None:
            self.group.seal()
        return self._base

    @property
    def h2d_bytes_last_flush(self) -> int:
        return self.group.h2d_bytes_last_flush

    @property
    def num_pending(self) -> int:
        return len(self._pending) + len(self._ragged)

    def stage(self, row: int, start: int, values: Sequence[float | int] | np.ndarray) -> None:
        """Record ``base[row, start:start+len(values)] = values`` for the next flush."""
        values = list(values.tolist() if isinstance(values, np.ndarray) else values)
        if not 0 <= row < self.num_rows:
            raise IndexError(f"{self.name}: row {row} outside [0, {self.num_rows})")
        if start < 0 or start + len(values) > self.num_cols:
            raise IndexError(f"{self.name}: columns [{start}, {start + len(values)}) outside [0, {self.num_cols})")
        if values:
            if not self._pending and not self._ragged:
                self.group._dirty.append(self)  # the group flushes only members with diffs
            self._pending.append((row, start, values))

    def stage_ragged(self, rows: np.ndarray, starts: np.ndarray, lens: np.ndarray, values: np.ndarray) -> None:
        """Record ``base[rows[i], starts[i]:starts[i]+lens[i]] = `` the next ``lens[i]`` of ``values``, for all i
        at once.  These cells must not be written by the tensor's other diffs of the step (no merge)."""
        if len(rows) == 0:
            return
        if rows.min() < 0 or rows.max() >= self.num_rows or starts.min() < 0 or (starts + lens).max() > self.num_cols \
                or int(lens.sum()) != len(values):
            raise IndexError(f"{self.name}: ragged diffs outside [0, {self.num_rows}) x [0, {self.num_cols})")
        if not self._pending and not self._ragged:
            self.group._dirty.append(self)
        self._ragged.append((rows, starts, lens, values))

    def stage_scalar(self, row: int, value: float | int) -> None:
        self.stage(row, 0, [value])

    def discard_pending(self) -> None:
        self._pending.clear()
        self._ragged.clear()

    def _merged_diffs(self) -> list[tuple[int, int, list]]:
        if len(self._pending) == 1:
            return list(self._pending)
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

    @hot_path
    def flush(self, writer: StagingWriter) -> None:
        """A private group: pack the pending diffs and prepare the apply.  A shared group's owner flushes it instead."""
        if self._private:
            self.group.flush(writer)

    def enqueue_apply(self) -> None:
        """A private group: enqueue the apply prepared by the last `flush` (after the writer submitted)."""
        if self._private:
            self.group.enqueue_apply()
