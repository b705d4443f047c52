"""Device-side checksums read back without a wait: the shared machinery of the slot checksum checks.

`runnercheck.checks.detectors.output_slots` (pinned output slots) and `runnercheck.checks.detectors.staging_slots` (staging slots) both compare a
checksum the device takes of some bytes, in stream order, with one the host takes of the bytes it
believes are there.  The device's value lands in a pinned record (one per in-flight item, written by
an enqueued non-blocking copy) and is read only once an event recorded after it has completed --
queried, never waited on inside a runner step; `ChecksumRecords.drain` is the one place that waits.

The checksum is ``sum(byte * (i mod P + 1))`` over the bytes (P = 65521): one flipped or swapped
byte changes it, and the sum stays below 2**63 for any slot size.

Ownership: a `ChecksumRecords` owns its pinned record ring (``values``: int64, host pinned, lifetime
of the checker, written only by the device copies it enqueues).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

RECORDS = 64  # in-flight items whose device checksum is kept (far above any scheduler's lookahead)
_WEIGHT_PERIOD = 65521


def weighted_checksum_host(data: np.ndarray) -> int:
    """The checksum of ``data`` (uint8), exactly as `device_checksum` computes it."""
    weights = np.arange(len(data), dtype=np.int64) % _WEIGHT_PERIOD + 1
    return int((data.astype(np.int64) * weights).sum())


def device_checksum(data: torch.Tensor) -> torch.Tensor:
    """The checksum of ``data`` (uint8, any device) as a one-element int64 tensor on that device."""
    weights = torch.arange(data.numel(), dtype=torch.int64, device=data.device) % _WEIGHT_PERIOD + 1
    return (data.to(torch.int64) * weights).sum().view(1)


class ChecksumRecords:
    """A ring of pinned records, each filled by one enqueued device checksum; see the module docstring."""

    def __init__(self, device: Any, records: int = RECORDS):
        self.device = device
        self.values = device.pinned(records, torch.int64)
        self.values.fill_(-1)
        self._next = 0
        self._owner: dict[int, Any] = {}  # record -> the key (step, slot, ...) whose checksum it holds

    def take(self, key: Any, data: Callable[[], torch.Tensor], label: str) -> tuple[int, Any, Any]:
        """Enqueue the checksum of ``data()`` (evaluated in stream order) into the next record.

        Returns ``(record, event, evicted)``: the event completes once the record holds the value;
        ``evicted`` is the key whose record this reuses (its value is lost: the caller gives it up),
        or None.
        """
        record = self._next
        self._next = (record + 1) % len(self.values)
        evicted = self._owner.pop(record, None)
        host = self.values[record : record + 1]

        def checksum() -> None:
            host.copy_(device_checksum(data()), non_blocking=True)

        self.device.enqueue(checksum, label)
        self._owner[record] = key
        return record, self.device.record_event(), evicted

    def value(self, record: int) -> int:
        """The record's checksum; only valid once the event `take` returned has completed."""
        self._owner.pop(record, None)
        return int(self.values[record])

    def drain(self) -> None:
        """Wait for every enqueued checksum (end of a run, never inside a step)."""
        self.device.synchronize()


__all__ = ["ChecksumRecords", "device_checksum", "weighted_checksum_host", "RECORDS"]
