"""Pinned staging slots: the one road from host to device for a step's data.

Staging slots
-------------
A `StagingSlot` is a pinned host byte buffer plus a device byte buffer of the same size.  Its
life is a cycle enforced here (and checked harder by ``checks/detectors/lifetime.py``)::

    FREE --acquire--> WRITING --submit--> IN_FLIGHT --event completed, retire--> FREE

* WRITING: the host fills the slot through `StagingSlot.alloc` views.  Nothing on the device
  reads it yet.
* IN_FLIGHT: `StagingPool.submit` enqueued one H2D copy of the used bytes and recorded an event
  right after it (or `StagingPool.submit_enqueued`: device work already enqueued reads them -- a
  fused steady step's lane copy, `runnercheck.impl.lanes` -- and the event follows that work).  The host must
  not write the slot until that event completes: on a real GPU (and on the ``sim`` device) the copy
  may not have run yet and would pick up the new bytes.
* FREE again once `event.query()` says the copy ran.  The device-side buffer is reused only by
  the slot's next H2D copy, which the stream orders after every kernel that read it.

Ownership: the `StagingPool` owns its slots (host buffers: pinned host, lifetime of the pool,
written by the host only in WRITING; device buffers: device, lifetime of the pool, written only by
the slot's own H2D copy).  Observers (the lifetime checker) see every transition.

Capacity fallback: a `StagingWriter` fills one slot at a time; when an allocation does not fit
it submits the current slot and continues in a freshly acquired one (stream order keeps every
copy ahead of the kernels that read it).  A raw `StagingWriter.alloc` larger than a whole slot
raises `StagingCapacityError` — size ``capacity_bytes`` for the largest compact per-step array.
`StagingWriter.first_slot` reserves the start of the step's first slot for a fixed layout whose
views the caller made once (`runnercheck.impl.input_batch`).  Staged diff writes into persistent device
tensors, which use these slots, live in `runnercheck.impl.staged_writes`.
"""
from __future__ import annotations

import enum
from typing import Callable, Sequence

import numpy as np
import torch

from runnercheck.impl.device import Device, DeviceEvent
from runnercheck.impl.hotpath import hot_path

_ALIGN = 16
COPY_GRANULE = 512  # H2D copy sizes are rounded up to this (see `StagingSlot.copy_views`)


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
        # Set by `StagingWriter.submit` for one submit: the device buffer the H2D copy lands in
        # instead of ``device`` (a bucketed step's fixed-address step buffer, `runnercheck.impl.graph_step`).
        self.copy_to: torch.Tensor | None = None
        # (source, target, copy size) -> (source view, target view): views made once, not per step
        # (slicing a device tensor costs host time); host objects only, owned by the slot.
        self._copy_views: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        # Set by a caller that filled the slot's leading ``kept_bytes`` through views of its own
        # (`runnercheck.impl.input_batch.InputBatch.stage`): an opaque note of what those bytes hold, so an
        # identical later fill can be skipped.  Any allocation over those bytes clears it.
        self.kept: object | None = None
        self.kept_bytes = 0

    def copy_views(self, target: torch.Tensor, nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(host[:n], target[:n])`` for an H2D of the first ``nbytes``, with ``n`` rounded up to a multiple of
        `COPY_GRANULE` (at most the slot): a few sizes, each sliced once.  The bytes past ``nbytes`` are
        stale and never read on the device (every reader stays inside what its step staged)."""
        n = min(-(-nbytes // COPY_GRANULE) * COPY_GRANULE, self.capacity_bytes)
        host = self.host
        key = (id(host), id(target), n)
        views = self._copy_views.get(key)
        # Identity checked too: an id may be reused once its tensor is gone (a test's scratch source).
        if views is None or views[0] is not host or views[1] is not target:
            if len(self._copy_views) >= 256:
                self._copy_views.clear()
            m = min(n, target.numel())
            views = self._copy_views[key] = (host, target, host[:m], target[:m])
        return views[2], views[3]

    def alloc(self, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Reserve ``n`` elements: a host view to fill now and the device view kernels read later."""
        if self.state is not SlotState.WRITING:
            raise StagingLifetimeError("alloc on a staging slot that is not being written", slot=self.index, step=self.step, state=self.state)
        itemsize = dtype.itemsize
        nbytes = n * itemsize
        start = -(-self.used_bytes // _ALIGN) * _ALIGN
        if start + nbytes > self.capacity_bytes:
            raise StagingCapacityError(f"{nbytes} bytes do not fit in slot {self.index} ({self.capacity_bytes - start} left)")
        if start < self.kept_bytes:
            self.kept, self.kept_bytes = None, 0
        self.used_bytes = start + nbytes
        return self.host[start : start + nbytes].view(dtype), self.device[start : start + nbytes].view(dtype)

    def alloc_words(self, n: int) -> tuple[np.ndarray, torch.Tensor]:
        """`alloc` of ``n`` int32 words, the host side as a numpy view (no tensor made on the host)."""
        host, start = self.reserve_words(n)
        return host, self.device_words[start : start + n]

    def reserve_words(self, n: int) -> tuple[np.ndarray, int]:
        """`alloc_words` without the device view: the host numpy view and the first word's index
        (``device_words[start : start + n]`` is the device side; made only where it is read)."""
        got = self.try_reserve_words(n)
        if got is None:
            start = -(-self.used_bytes // _ALIGN) * _ALIGN
            raise StagingCapacityError(f"{4 * n} bytes do not fit in slot {self.index} ({self.capacity_bytes - start} left)")
        return got

    def try_reserve_words(self, n: int) -> tuple[np.ndarray, int] | None:
        """`reserve_words`, or None (nothing reserved) when ``n`` words do not fit after what the slot holds."""
        first = self.try_reserve_index(n)
        return None if first is None else (self.host_words[first : first + n], first)

    def try_reserve_index(self, n: int) -> int | None:
        """`try_reserve_words` without the host view: the first word's index (None: nothing reserved, they do not fit);
        the caller writes ``host_words[first : first + n]`` itself."""
        if self.state is not SlotState.WRITING:
            raise StagingLifetimeError("alloc on a staging slot that is not being written", slot=self.index, step=self.step, state=self.state)
        start = -(-self.used_bytes // _ALIGN) * _ALIGN
        end = start + 4 * n
        if end > self.capacity_bytes:
            return None
        if start < self.kept_bytes:
            self.kept, self.kept_bytes = None, 0
        self.used_bytes = end
        return start // 4

    def free_index(self) -> int:
        """The first word a `reserve_words` would hand out next; the words from it to the slot's end are free to be
        written (``host_words[first:]``).  Reserves nothing (a caller that filled a prefix reserves exactly it next,
        at the same index: `claim_free_words`), but drops a `kept` note over them, as a reservation would."""
        if self.state is not SlotState.WRITING:
            raise StagingLifetimeError("free_index of a staging slot that is not being written", slot=self.index, step=self.step, state=self.state)
        start = -(-self.used_bytes // _ALIGN) * _ALIGN
        if start < self.kept_bytes:
            self.kept, self.kept_bytes = None, 0
        return start // 4

    def claim_free_words(self, first: int, n: int) -> None:
        """Reserve the ``n`` words from ``first`` that `free_index` handed out and the caller filled (`reserve_words`
        of exactly them, without handing them out again).  Raises when another allocation took them meanwhile."""
        start = -(-self.used_bytes // _ALIGN) * _ALIGN
        if self.state is not SlotState.WRITING or start != 4 * first or start + 4 * n > self.capacity_bytes:
            raise StagingLifetimeError("claim of free words that another allocation took, or that do not fit",
                                       slot=self.index, step=self.step, state=self.state)
        self.used_bytes = start + 4 * n

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
        # cuda: retire the slots known complete first and ask CUDA only if none is free (a query costs host
        # time).  sim/cpu always ask: a sim query is where its lag policy runs work, as a GPU progresses
        # while the host polls it.
        self._known_first = device.is_cuda

    def _transition(self, slot: StagingSlot, new: SlotState) -> None:
        """``slot`` into state ``new``, seen by every observer.  The per-step transitions call it only when there are
        observers: without any, the state is set where it changes (no call a step)."""
        old = slot.state
        slot.state = new
        if self.observers:
            for observer in list(self.observers):
                observer(slot, old, new)

    @hot_path
    def retire_completed(self, ask: bool = True) -> None:
        """Retire every in-flight slot whose copy has run.  ``ask=False``: only those known to have run
        (`DeviceEvent.known_complete`: no CUDA query, and no sim lag policy runs)."""
        for slot in self.slots:
            if slot.state is SlotState.IN_FLIGHT and (slot.event.query() if ask else slot.event.known_complete()):
                self._retire(slot)

    def _retire(self, slot: StagingSlot) -> None:
        if self.observers:  # `_transition`, called only for observers
            self._transition(slot, SlotState.FREE)
        else:
            slot.state = SlotState.FREE
        slot.event = None

    @hot_path
    def seek_free(self, index: int) -> bool:
        """Make slot ``index`` the one the next `acquire` takes, if it can be taken without a wait: FREE, or in
        flight with its copy run (asked of the device only when not known).  False (nothing changed) otherwise."""
        if index >= len(self.slots):
            return False
        slot = self.slots[index]
        if slot.state is SlotState.IN_FLIGHT and (slot.event.known_complete() or slot.event.query()):
            self._retire(slot)
        if slot.state is not SlotState.FREE:
            return False
        self._next = index
        return True

    @hot_path
    def acquire(self, step: int) -> StagingSlot:
        """A FREE slot, now WRITING.  Waits on the oldest in-flight copy only if none is free.

        On cuda it takes the next slot when it is free (`seek_free` made it so on a steady step), else it retires the
        slots known complete (a step's output read completes its copies: no CUDA query a step) and asks CUDA only
        when that leaves no slot free."""
        slot = self.slots[self._next]
        # The slot `seek_free` (or the last acquire) left next, when free: retiring the others can wait for a miss.
        if not (self._known_first and slot.state is SlotState.FREE and slot.step != step):
            slot = self._free_slot(step, ask=not self._known_first)
        if self._known_first and slot is None:
            slot = self._free_slot(step, ask=True)
        if slot is None:
            n = len(self.slots)
            in_flight = [s for s in self.slots if s.state is SlotState.IN_FLIGHT and s.step != step]
            if not in_flight:
                if all(s.step == step for s in self.slots):
                    raise StagingCapacityError(f"step {step} needs more than the pool's {n} staging slots of {self.capacity_bytes} bytes")
                raise StagingLifetimeError("no staging slot is free or in flight: every slot is being written")
            slot = min(in_flight, key=lambda s: s.step)
            self.num_backpressure_waits += 1
            slot.event.synchronize()  # runnercheck: allow-host-read backpressure: only when every slot is in flight
            self._retire(slot)
        self._next = (slot.index + 1) % len(self.slots)
        slot.step = step
        slot.used_bytes = 0
        if self.observers:  # `_transition`, called only for observers
            self._transition(slot, SlotState.WRITING)
        else:
            slot.state = SlotState.WRITING
        return slot

    def _free_slot(self, step: int, ask: bool) -> StagingSlot | None:
        self.retire_completed(ask)
        n = len(self.slots)
        # A slot already used in this step still has unread device data: the step's kernels are
        # enqueued after all of its copies, so reusing it now would overwrite what they read.
        for k in range(n):
            slot = self.slots[(self._next + k) % n]
            if slot.state is SlotState.FREE and slot.step != step:
                return slot
        return None

    @hot_path
    def submit(self, slot: StagingSlot) -> None:
        """Enqueue the slot's one H2D copy and record the event that frees it."""
        if slot.state is not SlotState.WRITING:
            raise StagingLifetimeError("submit of a slot that is not being written", slot=slot.index, step=slot.step, state=slot.state)
        nbytes = slot.used_bytes
        target, slot.copy_to = (slot.device if slot.copy_to is None else slot.copy_to), None
        if nbytes:
            host, dev = slot.copy_views(target, nbytes)
            self.device.enqueue(lambda: dev.copy_(host, non_blocking=True), f"h2d slot{slot.index} step{slot.step}")
        self.h2d_bytes_total += nbytes
        slot.event = self.device.record_event()
        if self.observers:  # `_transition`, called only for observers
            self._transition(slot, SlotState.IN_FLIGHT)
        else:
            slot.state = SlotState.IN_FLIGHT

    @hot_path
    def submit_enqueued(self, slot: StagingSlot, event: DeviceEvent, nbytes: int, landed_in: torch.Tensor) -> None:
        """`submit` of a slot whose first ``nbytes`` device work already enqueued copies into ``landed_in`` (a fused
        step's lane copy into its graph's step buffer, `runnercheck.impl.lanes`); ``event``, recorded after that work, frees it."""
        if slot.state is not SlotState.WRITING:
            raise StagingLifetimeError("submit of a slot that is not being written", slot=slot.index, step=slot.step, state=slot.state)
        self.h2d_bytes_total += nbytes
        slot.copy_to = None  # the copy is the enqueued work's; ``landed_in`` is where the step's readers find it
        slot.event = event
        if self.observers:  # `_transition`, called only for observers
            self._transition(slot, SlotState.IN_FLIGHT)
        else:
            slot.state = SlotState.IN_FLIGHT


class StagingWriter:
    """Hands out staging allocations for one step, rolling over to a new slot when one is full."""

    def __init__(self, pool: StagingPool, step: int):
        self.pool = pool
        self.step = step
        self.slot: StagingSlot | None = None
        self.bytes = 0
        self.num_slots_used = 0
        self.first: StagingSlot | None = None  # the step's first slot (the fixed layout of `first_slot`)
        self._first_submitted = 0  # its bytes, once submitted to its own device buffer (0: not yet)
        self._first_home: torch.Tensor | None = None  # where the first slot's device views point (`place_first`)

    @hot_path
    def first_slot(self, reserve_bytes: int) -> StagingSlot:
        """Acquire the step's first slot with its leading ``reserve_bytes`` kept for a fixed layout
        (the caller writes them through views of its own, while the slot is WRITING)."""
        if self.slot is not None:
            raise StagingLifetimeError("first_slot after the writer already holds a slot", slot=self.slot.index, step=self.step)
        if reserve_bytes > self.pool.capacity_bytes:
            raise StagingCapacityError(f"a reserved layout of {reserve_bytes} bytes does not fit a {self.pool.capacity_bytes}-byte slot")
        self.slot = self.first = self.pool.acquire(self.step)
        self.num_slots_used += 1
        self.slot.used_bytes = reserve_bytes
        return self.slot

    def trim_reserved(self, used_bytes: int) -> None:
        """Give back the end of the reservation made by `first_slot`: only ``used_bytes`` of it were written."""
        if self.slot is None or self.num_slots_used != 1 or used_bytes > self.slot.used_bytes:
            raise StagingLifetimeError("trim_reserved without a larger reservation in the writer's first slot", step=self.step)
        self.slot.used_bytes = used_bytes

    def place_first(self, home: torch.Tensor) -> None:
        """The first slot's bytes will reach ``home`` (a device uint8 buffer, same offsets: `submit` with
        ``first_to=home``) before any kernel reads them: device views of the first slot handed out from
        now on point into ``home``, so its H2D may go there directly (``redirect``) with no copy after it."""
        self._first_home = home

    @hot_path
    def alloc_words(self, n: int) -> tuple[np.ndarray, torch.Tensor]:
        """``n`` 32-bit words: a numpy host view to fill now and the int32 device view kernels read later."""
        host, slot, start = self.reserve_words(n)
        return host, self.words_view(slot, start, n)

    def words_view(self, slot: StagingSlot, start: int, n: int) -> torch.Tensor:
        """The int32 device view of words ``[start, start + n)`` of ``slot`` (`reserve_words`), in ``home`` when placed."""
        if slot is self.first and self._first_home is not None:
            return self._first_home[4 * start : 4 * (start + n)].view(torch.int32)
        return slot.device_words[start : start + n]

    @hot_path
    def reserve_words(self, n: int) -> tuple[np.ndarray, StagingSlot, int]:
        """`alloc_words` without the device view: (host view, the slot, first word index in its ``device_words``)."""
        slot = self.slot
        first = None if slot is None else slot.try_reserve_index(n)
        if first is None:
            slot, first = self._reserve_in_next_slot(n)
        return slot.host_words[first : first + n], slot, first

    @hot_path
    def reserve_index(self, n: int) -> tuple[StagingSlot, int]:
        """`reserve_words` without the host view: (the slot, first word index); the caller writes its
        ``host_words[first : first + n]`` (a word or two: no view object made)."""
        slot = self.slot
        first = None if slot is None else slot.try_reserve_index(n)
        if first is None:
            slot, first = self._reserve_in_next_slot(n)
        return slot, first

    def _reserve_in_next_slot(self, n: int) -> tuple[StagingSlot, int]:
        """``n`` words at the start of a new slot, the current one (if any) submitted first."""
        if self.slot is not None:
            self._submit_current()
        slot = self.slot = self.pool.acquire(self.step)
        self.num_slots_used += 1
        return slot, slot.reserve_words(n)[1]  # raises when n words exceed a whole slot

    def free_index(self) -> tuple[StagingSlot, int] | None:
        """The current slot's unreserved words (`StagingSlot.free_index`): (the slot, its first free word), or None
        before the writer holds a slot.  A caller that fills a prefix of them then claims exactly that prefix."""
        slot = self.slot
        return None if slot is None else (slot, slot.free_index())

    @hot_path
    def alloc(self, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.slot is None or not self.slot.fits(n, dtype):
            if self.slot is not None:
                self._submit_current()
            self.slot = self.pool.acquire(self.step)
            self.num_slots_used += 1
        host, dev = self.slot.alloc(n, dtype)
        if self.slot is self.first and self._first_home is not None:
            end = self.slot.used_bytes
            dev = self._first_home[end - n * dtype.itemsize : end].view(dtype)
        return host, dev

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
        if self.slot is self.first and self.slot.copy_to is None:
            self._first_submitted = self.slot.used_bytes
        self.pool.submit(self.slot)
        self.slot = None

    def submit_enqueued(self, event: DeviceEvent, nbytes: int, landed_in: torch.Tensor) -> None:
        """Submit the step's one slot, whose ``nbytes`` enqueued device work already copies into ``landed_in``
        (`StagingPool.submit_enqueued`)."""
        if self.slot is None or self.slot is not self.first or self.num_slots_used != 1:
            raise StagingLifetimeError("submit_enqueued of a step that does not hold exactly its first slot", step=self.step)
        self.bytes += nbytes
        self.pool.submit_enqueued(self.slot, event, nbytes, landed_in)
        self.slot = None

    @hot_path
    def submit(self, first_to: torch.Tensor | None = None, *, redirect: bool = False) -> None:
        """Submit the current slot.  Must come before the step's kernels that read the views.

        ``first_to`` (a device uint8 buffer at least a slot long): the first slot's bytes land
        there too, at the same offsets.  ``redirect=True`` (the caller reads nothing of the first
        slot through its device views): its own H2D copy goes there instead of the slot's device
        buffer, when it is still being written.  Otherwise one device-to-device copy follows.
        """
        redirected = first_to is not None and redirect and self.slot is not None and self.slot is self.first
        if redirected:
            self.slot.copy_to = first_to
        if self.slot is not None:
            self._submit_current()
        if first_to is not None and not redirected and self._first_submitted:
            n, src = self._first_submitted, self.first.device
            self.pool.device.enqueue(lambda: first_to[:n].copy_(src[:n], non_blocking=True), "copy first staging slot")
