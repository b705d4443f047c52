"""Staging-slot checksums: what a step's kernels read from a staging slot must be what its host staged.

A step's host data reaches the device one way: the host fills a pinned staging slot, one H2D copy
moves the used bytes into the slot's device buffer, and the step's kernels (staged-write applies,
input prep, the graph's padding) read them there (`runnercheck.impl.buffers`).  If the host rewrites the slot
before the copy has run -- a ring that recycles a slot without waiting for its event -- the copy
moves the next step's bytes and the kernels compute on them.  (A bucketed step's first slot may be
copied straight into the graph's step buffer, ``slot.copy_to``: then that buffer is what is checked.)  `runnercheck.checks.detectors.lifetime` sees the recycling
on the host; this check sees what the device actually read, without needing the race window to be
hit by a delay, and names both owners:

* at submit, the host takes a checksum of the bytes it staged (the bytes the copy should move); a fused
  step's slot (`runnercheck.impl.lanes`: its graph copies the slot in itself) is checked the same way, at its
  ``submit_enqueued``, against the graph's step buffer it lands in;
* when ``execute_model`` returns, every kernel of the step that reads the slot is enqueued, so a
  device checksum of the slot's device bytes enqueued then sees what those readers saw (nothing but
  the slot's own next H2D writes the device buffer, and it comes later in stream order);
* once the checksum's event has completed (queried, never waited on in a step; `finish` drains),
  the two are compared.  A mismatch names the slot, the step whose kernels read it and the later
  steps that took the slot before the comparison.

How it attaches (from outside ``impl``): it wraps the pool instance's ``submit`` and ``submit_enqueued``
and the runner's ``execute_model``, and observes the pool's transitions.  Apply mutants before arming.

Ownership: a `StagingSlotChecksums` owns its checksum records (`runnercheck.checks.detectors.checksums.ChecksumRecords`)
and its pending table (host); it never writes a slot.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runnercheck.checks.detectors.checksums import ChecksumRecords, weighted_checksum_host


@dataclass
class _Submitted:
    step: int
    slot: int
    nbytes: int
    staged: int  # the host checksum of the bytes at submit
    target: Any  # the device buffer the slot's H2D wrote (its own, or a buffer the copy was redirected to)
    record: int = -1
    event: Any = None
    later_owners: list[int] = field(default_factory=list)  # steps that took the slot before the comparison


class StagingSlotChecksums:
    """Attach to a runner's staging pool; see the module docstring."""

    def __init__(self, runner: Any):
        self.runner = runner
        self.pool = runner.staging
        self.records = ChecksumRecords(runner.device)
        self._this_step: list[_Submitted] = []  # submitted during the current execute_model
        self._pending: dict[int, _Submitted] = {}  # record -> submission, until compared
        self.slots_checked = 0
        self.unchecked = 0
        self.violations = 0
        self.errors: list[str] = []
        self._undo: list[Any] = []

    def attach(self) -> "StagingSlotChecksums":
        pool, runner = self.pool, self.runner
        submit, execute_model = pool.submit, runner.execute_model

        def submit_checked(slot: Any) -> None:
            nbytes = slot.used_bytes
            staged = weighted_checksum_host(slot.host[:nbytes].numpy()) if nbytes else 0
            redirected = getattr(slot, "copy_to", None)
            target = slot.device if redirected is None else redirected
            submit(slot)
            if nbytes:
                self._this_step.append(_Submitted(slot.step, slot.index, nbytes, staged, target))

        submit_enqueued = pool.submit_enqueued

        def submit_enqueued_checked(slot: Any, event: Any, nbytes: int, landed_in: Any) -> None:
            # A fused step's lane copy moves the slot's leading bytes (more than it staged) into ``landed_in``.
            used = slot.used_bytes
            staged = weighted_checksum_host(slot.host[:used].numpy()) if used else 0
            submit_enqueued(slot, event, nbytes, landed_in)
            if used:
                self._this_step.append(_Submitted(slot.step, slot.index, used, staged, landed_in))

        def execute_model_checked(sched: Any) -> Any:
            self._this_step.clear()
            try:
                return execute_model(sched)
            finally:  # a rejected step may still have submitted nothing; whatever it submitted is checked
                self._after_step()

        self._patch(pool, "submit", submit, submit_checked)
        self._patch(pool, "submit_enqueued", submit_enqueued, submit_enqueued_checked)
        self._patch(runner, "execute_model", execute_model, execute_model_checked)
        pool.observers.append(self._observe)
        self._undo.append(lambda: pool.observers.remove(self._observe))
        return self

    def _patch(self, obj: Any, name: str, original: Any, checked: Any) -> None:
        had = name in vars(obj)
        self._undo.append(lambda: setattr(obj, name, original) if had else delattr(obj, name))
        setattr(obj, name, checked)

    def detach(self) -> None:
        while self._undo:
            self._undo.pop()()

    # ------------------------------------------------------------------ per step
    def _observe(self, slot: Any, old: Any, new: Any) -> None:
        if new.value != "WRITING":
            return
        for sub in self._pending.values():
            if sub.slot == slot.index and slot.step != sub.step:
                sub.later_owners.append(slot.step)

    def _after_step(self) -> None:
        for sub in self._this_step:
            device_bytes, nbytes = sub.target, sub.nbytes
            sub.record, sub.event, _ = self.records.take(
                (sub.step, sub.slot), lambda d=device_bytes, n=nbytes: d[:n], f"staging checksum slot{sub.slot} step{sub.step}")
            if self._pending.pop(sub.record, None) is not None:
                self.unchecked += 1  # its checksum never completed within RECORDS later ones: given up, not waited for
            self._pending[sub.record] = sub
        self._this_step.clear()
        self._compare_ready()

    def _compare_ready(self) -> None:
        for record, sub in list(self._pending.items()):
            if not sub.event.is_complete():
                continue
            del self._pending[record]
            self.slots_checked += 1
            if self.records.value(record) != sub.staged:
                self.violations += 1
                by = (f"the slot was taken by step(s) {', '.join(map(str, sub.later_owners))} before the copy ran"
                      if sub.later_owners else "no later step took the slot: its device bytes were written by something else")
                self.errors.append(f"staging slot {sub.slot}: step {sub.step}'s kernels read bytes its host did not stage ({by})")

    def finish(self) -> int:
        """Wait for the checksums in flight and compare them all; returns the violation count."""
        self.records.drain()
        self._compare_ready()
        return self.violations


def arm_staging_checksums(runner: Any) -> StagingSlotChecksums | None:
    """Attach to ``runner``'s staging pool (None for a runner without one: a third-party runner)."""
    pool = getattr(runner, "staging", None)
    if pool is None or not all(hasattr(pool, a) for a in ("submit", "slots", "observers")):
        return None
    return StagingSlotChecksums(runner).attach()


__all__ = ["StagingSlotChecksums", "arm_staging_checksums"]
