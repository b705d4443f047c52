"""The free list with quarantine: when a freed row of the request-state table may be taken again.

Device work enqueued in earlier steps may still read a freed row's pinned prefill tokens (the host
writes them directly, outside stream order).  A freed row therefore stays out of use until the event
recorded after the last step that could read them completes.  Input prep reads a row's pinned tokens
only below its prefill length, so only the rows still prefilling (and, with a proposer --
``history_reads`` -- every scheduled row) are marked used by a step (`RowQuarantine.mark_step`); a
decode step of rows past their prefill marks nothing.  Admission only *queries* events and waits
(counted in ``num_quarantine_waits``) only when every free row is still quarantined.  On cuda and cpu
it first asks whether the row's last reading step is already known complete -- an output read saw it
or a later one complete: no CUDA query --, then the newest marked step's marker (once it is complete
no row is in use), and only then the row's own.  A planned batch's rows get their last-use step
written only when the next batch comes while the batch's step is not known complete (a completed
batch is dropped unwritten).
"""
from __future__ import annotations

from collections import deque
from typing import Iterable

import numpy as np

from runnercheck.impl.device import Device, DeviceEvent
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.interface import CapacityError

_MAX_PENDING_USES = 64  # `mark_used`: steps whose markers are kept before it asks whether the oldest completed


class RowQuarantine:
    """The free list and the markers of the steps that may still read a row's pinned prefill tokens.

    Owns no tensor.  Host-only state, all ``[max_num_reqs]`` or shorter, for the table's lifetime: the free list
    (``_free``, oldest freed first), each row's last-use step (``_last_use_seq``) and the kept step markers
    (``_use_events``), the last marked batch (``_batch_rows``/``_batch_seq``/``_batch_event``), the rows still
    prefilling (``_prefilling``: row -> prefill length) and each row's last reading step once no later one reads it
    (``_reads_over``).  Written by its own methods and by the table's admission and release (`RequestStateTable`,
    their C twins in impl/native/rows.c included), which take rows from the free list, note prefilling rows, and give
    rows back with their last reader noted.

    A base of `runnercheck.impl.state.RequestStateTable`, not a member: those C twins write the free list and the
    prefill reads in the same call as the table's own rows, so both halves are one object -- one owner -- and this
    class holds only the quarantine's half of its code.
    """

    def __init__(self, device: Device, max_num_reqs: int):
        r = max_num_reqs
        self._free: deque[int] = deque(range(max_num_reqs))
        # Quarantine: the step (a sequence number) that last scheduled each row, and the events
        # of the steps whose work may still be running (oldest first; completed ones are dropped).
        self._last_use_seq = np.full(r, -1, np.int64)
        # The last batch's rows and step, written into `_last_use_seq` only when another batch comes or a
        # row's step is asked for: a steady step repeats its batch (the same rows array), one int a step.
        self._batch_rows: np.ndarray | None = None
        self._batch_seq = -1
        # Its step's marker, the newest: once it is complete every use is, and the batch need never be written.
        self._batch_event: DeviceEvent | None = None
        # A free row's check asks the newest marker first (complete: no look-up).  Not on sim, whose queries run
        # its lag policy: there the row's own marker is asked, as a seeded replay expects.
        self._ask_newest_first = device.kind != "sim"
        self._use_events: deque[tuple[int, DeviceEvent]] = deque()
        self._use_seq = 0
        # Rows whose prefill tokens a step may still read: admitted rows until the device's computed count passes
        # their prefill length (row -> prefill length).  With ``history_reads`` (a proposer reads every row's
        # tokens) every scheduled row reads them in every step.
        self._prefilling: dict[int, int] = {}
        self.history_reads = False
        # Per row, the marker of the last step that could have read its prefill tokens, once no later one can (set
        # when its prefill is computed, or at its release): known complete, the free row is out of use.
        self._reads_over: list[DeviceEvent | None] = [None] * r
        self.num_quarantine_waits = 0


    @property
    def num_free(self) -> int:
        return len(self._free)

    def _use_event(self, row: int) -> DeviceEvent | None:
        self._write_batch_uses()
        events = self._use_events
        # The kept markers are consecutive steps (dropped from the front only): the row's is found by its offset.
        i = int(self._last_use_seq[row]) - events[0][0] if events else -1
        return events[i][1] if 0 <= i < len(events) else None  # else never used, or its step was seen complete

    def is_quarantined(self, row: int) -> bool:
        if self._ask_newest_first:
            over = self._reads_over[row]
            if over is None or over.known_complete():  # its last reading step is over: asks CUDA nothing
                return False
            newest = self._batch_event
            if newest is not None and newest.query():  # in stream order: every use is over
                return False
        return any(not event.query() for event in self._last_readers(row))

    def _last_readers(self, row: int) -> list[DeviceEvent]:
        """The markers after which no step reads ``row``: its own last mark while one is kept (`mark_used`), and, where
        `mark_step` keeps none (``_ask_newest_first`` without ``history_reads``), the step its prefill reads ended with
        (``_reads_over``: noted when its prefill is seen computed, or the newest marker at its release -- the step
        that marked every row then prefilling, itself among them).  Callers wait for or ask each."""
        readers = [] if (event := self._use_event(row)) is None else [event]
        if self._ask_newest_first and not self.history_reads and (over := self._reads_over[row]) is not None:
            readers.append(over)
        return readers

    def free_rows(self) -> tuple[int, ...]:
        """The free list in order (quarantined rows included), for inspection."""
        return tuple(self._free)

    def quarantined_rows(self) -> tuple[int, ...]:
        """Free rows whose last step has not completed, read without letting a sim device run work."""
        return tuple(r for r in self._free if any(not event.is_complete() for event in self._last_readers(r)))

    def _take_free_row(self, req_id: str) -> int:
        if not self._free:
            raise CapacityError(f"no free row for {req_id!r}: all {len(self._reads_over)} rows are live", req_id=req_id)
        for i, row in enumerate(self._free):
            if not self.is_quarantined(row):
                del self._free[i]
                return row
        # Every free row may still be read by in-flight work: wait for the one freed first.
        row = self._free.popleft()
        self.num_quarantine_waits += 1
        for event in self._last_readers(row):
            event.synchronize()
        return row

    @hot_path
    def mark_step(self, rows: np.ndarray, event: DeviceEvent) -> None:
        """Mark a step's use of the rows whose prefill tokens it may read (before its `advance`): every scheduled
        row with ``history_reads``; else the rows still prefilling, scheduled or not (a superset is safe).  A step
        that reads none -- every decode step of rows past their prefill -- records nothing.

        Without ``history_reads``, where a free row's check reads its ``_reads_over`` marker first
        (``_ask_newest_first``), the step's marker becomes the newest and no per-row mark is kept: each of those rows
        is marked by every step until its prefill is seen computed or it is released, and both note the newest marker
        as its last reader (`_end_prefill_reads`, `release`), which is what `_last_readers` answers for it.  On sim
        every row keeps its own mark, as a seeded replay's queries expect."""
        if self.history_reads:
            self.mark_used(rows, event)
        elif self._prefilling:
            if self._ask_newest_first:
                self._batch_event = event
            else:
                self.mark_used(list(self._prefilling), event)  # usually one row: a list, no array made

    @hot_path
    def mark_used(self, rows: Iterable[int] | np.ndarray, event: DeviceEvent) -> None:
        """Record the event after which the step that scheduled ``rows`` no longer reads them.  ``rows``: an array, or a
        list the caller hands over (kept as it is until the next batch comes: never changed after)."""
        events = self._use_events
        # In stream order: every earlier step is done too.  Only markers known complete are dropped (no CUDA
        # query a step: a step's output marker is seen complete when it is read); a free row's check asks.
        while events and events[0][1].known_complete():
            events.popleft()
        if len(events) > _MAX_PENDING_USES:  # outputs not read: ask, so the list stays short
            while events and events[0][1].is_complete():
                events.popleft()
        self._use_seq += 1
        events.append((self._use_seq, event))
        if rows is not self._batch_rows:  # a planned batch's rows array is never changed after planning
            if self._batch_rows is not None and self._batch_event.known_complete():
                self._batch_rows = None  # its uses are over, and older marks point at completed steps too
            else:
                self._write_batch_uses()
            self._batch_rows = rows if type(rows) is list or isinstance(rows, np.ndarray) else np.asarray(rows, dtype=np.int64)
        self._batch_seq = self._use_seq
        self._batch_event = event

    def _write_batch_uses(self) -> None:
        rows = self._batch_rows
        if rows is not None:
            if type(rows) is list:  # a few prefilling rows (`mark_step`): cell by cell, no index array
                last_use, seq = self._last_use_seq, self._batch_seq
                for row in rows:
                    last_use[row] = seq
            else:
                self._last_use_seq[rows] = self._batch_seq
            self._batch_rows = None
