"""Staging-slot lifetime assertions: a checker that watches every transition of a `StagingPool`.

Every slot must cycle ``FREE -> WRITING -> IN_FLIGHT -> FREE`` (`runnercheck.impl.buffers`).  The pool itself
refuses an ``alloc`` outside WRITING; what it cannot see is a write through a host view kept from
an earlier ``alloc``, or a pool bug that frees a slot early.  The checker closes those gaps:

* the transition graph: any other edge (a slot handed out while in flight, freed while being
  written, submitted twice) is a violation;
* a checksum of ``slot.host[:used_bytes]`` taken at submit (-> IN_FLIGHT) must match when the slot
  is retired (IN_FLIGHT -> FREE): a host write while the H2D copy may not have run yet is caught
  even if it went through a stale reference;
* the slot's event must have completed when it is retired (checked without the side effects of
  `DeviceEvent.query`, which on ``sim`` lets the lag policy run work and would hide the bug);
* a checksum taken at retirement must still match at the next acquire: nobody writes a FREE slot.

``mode="error"`` raises `StagingLifetimeError` (naming slot, step and states) from the transition
that exposes the violation; ``mode="count"`` records it in ``errors`` and counts ``violations``.

Ownership: the checker owns only its checksum table (host, one entry per watched slot, lifetime of
the attachment, written by its observer).  It never writes a slot.
"""
from __future__ import annotations

import hashlib
from typing import Any

from runnercheck.impl.buffers import SlotState, StagingLifetimeError, StagingPool, StagingSlot
from runnercheck.impl.device import DeviceEvent

LEGAL_TRANSITIONS = frozenset({
    (SlotState.FREE, SlotState.WRITING),
    (SlotState.WRITING, SlotState.IN_FLIGHT),
    (SlotState.IN_FLIGHT, SlotState.FREE),
})
MODES = ("error", "count")


def slot_checksum(slot: StagingSlot, nbytes: int) -> bytes:
    """A digest of the first ``nbytes`` host bytes of ``slot`` (pinned host memory, no device read)."""
    return hashlib.blake2b(slot.host[:nbytes].numpy(), digest_size=16).digest()


def event_completed(event: DeviceEvent) -> bool:
    """Whether ``event`` has completed, without running any queued work (unlike ``query`` on sim)."""
    return bool(event.is_complete())


class LifetimeChecker:
    """Attach to one or more pools; every slot transition is checked (see the module docstring)."""

    def __init__(self, mode: str = "error"):
        if mode not in MODES:
            raise ValueError(f"LifetimeChecker mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.violations = 0
        self.errors: list[StagingLifetimeError] = []
        self.transitions = 0
        self._pools: list[StagingPool] = []
        # (id(pool), slot index) -> (state the digest belongs to, nbytes, digest, event)
        self._sums: dict[tuple[int, int], tuple[SlotState, int, bytes, DeviceEvent | None]] = {}

    # ------------------------------------------------------------------ attachment
    def attach(self, pool: StagingPool) -> "LifetimeChecker":
        if any(p is pool for p in self._pools):
            raise ValueError("this LifetimeChecker is already attached to that pool")
        self._pools.append(pool)
        pool.observers.append(self._observe)
        for slot in pool.slots:  # slots already in flight are checked from their next submit on
            self._sums.pop((id(pool), slot.index), None)
        return self

    def detach(self, pool: StagingPool) -> None:
        if self._observe in pool.observers:
            pool.observers.remove(self._observe)
        self._pools = [p for p in self._pools if p is not pool]
        for slot in pool.slots:
            self._sums.pop((id(pool), slot.index), None)

    # ------------------------------------------------------------------ checks
    def _violation(self, message: str, slot: StagingSlot, state: SlotState) -> None:
        error = StagingLifetimeError(message, slot=slot.index, step=slot.step, state=state)
        self.violations += 1
        self.errors.append(error)
        if self.mode == "error":
            raise error

    def _pool_of(self, slot: StagingSlot) -> StagingPool:
        for pool in self._pools:
            if 0 <= slot.index < len(pool.slots) and pool.slots[slot.index] is slot:
                return pool
        raise StagingLifetimeError("transition of a slot that belongs to no attached pool", slot=slot.index, step=slot.step)

    def _observe(self, slot: StagingSlot, old: SlotState, new: SlotState) -> None:
        self.transitions += 1
        key = (id(self._pool_of(slot)), slot.index)
        recorded = self._sums.pop(key, None)
        if (old, new) not in LEGAL_TRANSITIONS:
            self._violation(f"illegal staging-slot transition {old.value} -> {new.value}", slot, new)
            return
        if new is SlotState.IN_FLIGHT:
            event = getattr(slot, "event", None)
            if event is None or not event.recorded:
                self._violation("slot submitted without a recorded event", slot, new)
            self._sums[key] = (new, slot.used_bytes, slot_checksum(slot, slot.used_bytes), event)
        elif old is SlotState.IN_FLIGHT:
            self._check_retire(slot, recorded)
            self._sums[key] = (SlotState.FREE, slot.used_bytes, slot_checksum(slot, slot.used_bytes), None)
        elif old is SlotState.FREE and recorded is not None:
            _, nbytes, digest, _ = recorded
            if slot_checksum(slot, nbytes) != digest:
                self._violation("host bytes of a FREE staging slot changed before it was acquired again", slot, old)

    def _check_retire(self, slot: StagingSlot, recorded: Any) -> None:
        if recorded is None:
            return  # in flight before the checker was attached
        _, nbytes, digest, event = recorded
        if event is not None and not event_completed(event):
            self._violation("staging slot freed before its event completed (the H2D copy may not have run)", slot, SlotState.IN_FLIGHT)
        if slot_checksum(slot, nbytes) != digest:
            self._violation("host bytes of the staging slot changed while it was in flight (write after submit)", slot, SlotState.IN_FLIGHT)

    def summary(self) -> str:
        if not self.violations:
            return f"staging lifetime: {self.transitions} transitions, no violations"
        lines = [f"staging lifetime: {self.violations} violation(s) in {self.transitions} transitions"]
        lines += [f"  {e}" for e in self.errors[:20]]
        return "\n".join(lines)
