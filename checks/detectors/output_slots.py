"""Output-slot checksums: what the host decodes from a pinned output slot must be what the step's D2H copied.

The runner's output ring (`runnercheck.impl.output.OutputSlots`) hands each step a pinned slot; the step's one
D2H copy fills it and the step's holder decodes it at ``get()`` (or when the ring wraps).  A ring
that hands the slot to a later step too early lets that step's D2H overwrite it first -- a race
whose window is a few microseconds on a GPU, so a differential check sees it only when the timing
happens to line up.  This check does not need the window to be hit exactly:

* right after each step's D2H, on the runner's stream, device work takes a weighted checksum of the
  device bytes the copy read (the pack buffer is not rewritten before the next step's pack, later
  in stream order) and copies it into a pinned record of this checker, then records an event;
* when the holder decodes its slot, the host takes the same checksum of the slot's bytes;
* once the checker's event has completed (queried without waiting, and at `finish`, which
  synchronizes), the two are compared.  A mismatch is a violation naming the slot, the step whose
  output was read and the later steps whose copies targeted that slot before the read.

The comparison never waits inside ``execute_model`` (the ring decodes a previous holder there):
digests taken at decode are kept until their device checksum is known.

How it attaches (from outside ``impl``, like `runnercheck.checks.detectors.kv_provenance`): it wraps the ring instance's
``enqueue_copy_out`` and each returned output's ``_materialise``.  Apply mutants before arming.

Ownership: an `OutputSlotChecksums` owns its checksum records (`runnercheck.checks.detectors.checksums.ChecksumRecords`:
pinned, one per in-flight step, written only by its device work) and its pending-step table (host);
it never writes a runner buffer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runnercheck.checks.detectors.checksums import ChecksumRecords, weighted_checksum_host


@dataclass
class _Pending:
    step: int
    slot: int
    nbytes: int
    record: int
    event: Any
    decoded: int | None = None  # the host checksum of the slot at decode
    overwriters: tuple[int, ...] = ()  # later steps whose copies targeted the slot before the decode


class OutputSlotChecksums:
    """Attach to a runner's output ring; see the module docstring."""

    def __init__(self, runner: Any):
        self.runner = runner
        self.ring = runner.outputs
        self.device = runner.device
        self.records = ChecksumRecords(self.device)
        self._pending: dict[int, _Pending] = {}  # step id -> its copy, until compared
        self._slot_steps: dict[int, list[int]] = {}  # slot -> steps whose copies targeted it, not yet decoded
        self.steps_checked = 0
        self.unchecked = 0  # steps given up (never decoded within RECORDS later copies)
        self.violations = 0
        self.errors: list[str] = []
        self._undo: list[Any] = []

    def attach(self) -> "OutputSlotChecksums":
        ring = self.ring
        enqueue_copy_out = ring.enqueue_copy_out

        def enqueue_copy_out_checked(slot: int, layout: Any, results: dict, meta: Any) -> Any:
            output = enqueue_copy_out(slot, layout, results, meta)
            self._after_copy(output, slot, layout.nbytes, meta.step_id)
            return output

        had = "enqueue_copy_out" in vars(ring)
        self._undo.append(lambda: setattr(ring, "enqueue_copy_out", enqueue_copy_out) if had else delattr(ring, "enqueue_copy_out"))
        ring.enqueue_copy_out = enqueue_copy_out_checked
        return self

    def detach(self) -> None:
        while self._undo:
            self._undo.pop()()

    # ------------------------------------------------------------------ per step
    def _after_copy(self, output: Any, slot: int, nbytes: int, step: int) -> None:
        pack = self.ring.pack
        record, event, evicted = self.records.take(step, lambda: pack[:nbytes], f"output checksum step{step}")
        if evicted is not None and self._pending.pop(evicted, None) is not None:
            # A step RECORDS copies old that was never decoded (or whose checksum is still queued):
            # give it up rather than wait here, inside execute_model.
            self.unchecked += 1
        pending = _Pending(step, slot, nbytes, record, event)
        for earlier in self._slot_steps.get(slot, ()):
            if earlier in self._pending:
                self._pending[earlier].overwriters += (step,)
        self._slot_steps.setdefault(slot, []).append(step)
        self._pending[step] = pending
        materialise = output._materialise

        def materialise_checked() -> None:
            data = self.ring.slots[slot][:nbytes].numpy()
            pending.decoded = weighted_checksum_host(data)
            self._slot_steps[slot].remove(step)
            materialise()
            self._compare_ready()

        output._materialise = materialise_checked

    def _compare_ready(self) -> None:
        for step, p in list(self._pending.items()):
            if p.decoded is None or not p.event.is_complete():
                continue
            del self._pending[step]
            self.steps_checked += 1
            copied = self.records.value(p.record)
            if copied != p.decoded:
                self.violations += 1
                by = f"overwritten by the copy of step(s) {', '.join(map(str, p.overwriters))}" if p.overwriters \
                    else "no later copy targeted it: written by the host or read before its copy completed"
                self.errors.append(f"output slot {p.slot}: step {step} decoded bytes its D2H did not copy ({by})")

    def finish(self) -> int:
        """Wait for the checksums in flight and compare every decoded step; returns the violation count."""
        self.records.drain()
        self._compare_ready()
        return self.violations


def arm_output_checksums(runner: Any) -> OutputSlotChecksums | None:
    """Attach to ``runner``'s output ring (None for a runner without one: a third-party runner)."""
    ring = getattr(runner, "outputs", None)
    if ring is None or not all(hasattr(ring, a) for a in ("enqueue_copy_out", "slots", "pack")):
        return None
    return OutputSlotChecksums(runner).attach()


__all__ = ["OutputSlotChecksums", "arm_output_checksums"]
