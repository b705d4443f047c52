"""Steady lanes: a graphed step's H2D and D2H copies made inside its one graph replay.

A steady decode step (`runnercheck.impl.runner.ModelRunner._execute_steady`) used to enqueue three things: the
H2D copy of its staging slot into the step buffer, the graph replay, the D2H copy of the packed
output into an output slot.  On the H200's host each call costs 4-10 us, and with its events and
the Python around them they were about half of a 64-request step.  A *fused* graph does all three
in one replay (`runnercheck.impl.graphs.CudaGraphManager` captures one per single-token bucket and one per
mixed bucket).  The general step takes one too when its staged bytes fit the bucket's copy-in: a
mixed bucket's has room for one admission's diffs (an admission next to decodes, the churn step):

    lane copy in (staging slot -> step buffer) | the bucketed step | lane copy out (pack -> output slot) | advance

Lane ``l`` is the pair (staging slot ``l``, output slot ``l``) for ``l < num_lanes`` =
min(staging slots, output slots).  The copies read and write the lane's pinned host buffers from
the device (`runnercheck.impl.kernels.lanes`), and the lane a replay uses is ``counter % num_lanes``, read on the
device: a captured graph cannot take an argument, so the host does not say which lane each step; it
keeps the counter's mirror (``lane``) and enqueues a fused replay only when the step it staged sits
in that lane's staging slot and its output slot is that lane's (`fits`).  The host takes the lane's
slots by seeking both rings to it (`runnercheck.impl.buffers.StagingPool.seek_free`,
`runnercheck.impl.output.OutputSlots.seek_free`), which succeeds only when the ring could hand the slot out
without a wait (a staging slot whose copy has run, an output slot whose last output was read); the
staging slot's and the output's event is the one recorded after the replay.  A step that does not
fit takes the three enqueues; when the lane was busy the rings moved on without it, so that step
also sets the counter to the output ring's next slot (`follow_rings`: one device fill, in stream order),
and the lanes follow the rings again from the next step.

At construction the copies are tried once on scratch buffers (`usable`): a device whose pinned
memory a kernel cannot address leaves the steady step on its three enqueues, with one warning.

Ownership: `SteadyLanes` owns, on the device, for the runner's lifetime: ``counter`` (int64 [1], the
lane of the next fused replay; written by the fused graphs' advance launch and by the fills of
`follow_rings` and `reset`, all in stream order), ``staging_table`` and ``output_table`` (int64
[num_lanes], the lanes' pinned host addresses, written once at construction); and on the host
``lane`` (the counter's value once every enqueued replay and fill has run; written by `take`,
`follow_rings` and `reset`).  The pinned buffers stay their rings'.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from runnercheck.impl.buffers import StagingPool, StagingWriter
from runnercheck.impl.device import Device, _run_as_device_work
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.kernels.interpreted_memory import reachable_through
from runnercheck.impl.kernels.lanes import launch_lane_advance, launch_lane_copy
from runnercheck.impl.output import OutputSlots

log = logging.getLogger(__name__)

_DIFF_WORDS_PER_REQUEST = 5  # a block append's diff-table entry (3 words) and its value, plus slack for a second block


class SteadyLanes:
    """The lanes of the fused steady step; see the module docstring."""

    def __init__(self, device: Device, staging: StagingPool, outputs: OutputSlots, prefix_bytes: int,
                 admission_bytes: int = 0):
        self.device = device
        self.staging, self.outputs = staging, outputs
        self.num_lanes = min(len(staging.slots), len(outputs.slots))
        # The slot objects each lane stands for: a ring whose slots were replaced (a mutant's, a test's) fits no lane.
        self.staging_slots = list(staging.slots[: self.num_lanes])
        self.output_buffers = list(outputs.slots[: self.num_lanes])
        self.prefix_bytes = prefix_bytes  # a decode step's compact arrays: the staging layout through ``logits_start``
        self.admission_bytes = admission_bytes  # the staged diffs of one admitted request (a mixed bucket's copy-in room)
        self.staging_table = self._addresses([s.host for s in self.staging_slots])
        self.output_table = self._addresses(self.output_buffers)
        self.counter = device.zeros(1, torch.int64)
        self.lane = 0
        self.usable = self._try_copies()

    def _addresses(self, buffers: list[torch.Tensor]) -> torch.Tensor:
        table = self.device.empty(len(buffers), torch.int64)
        table.copy_(torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64))
        reachable_through(table, buffers)  # the lane copies dereference these (interpreted: bounds-checked against them)
        self.device._stream_waits_for_current()
        return table

    def in_bytes(self, size: int, mixed: bool = False) -> int:
        """Bytes the lane copy-in of a bucket of ``size`` requests reads: the compact arrays and room for one
        diff-table entry and two values per request (a steady step's block appends); a mixed bucket's also
        room for one admission's diffs (a step that admits more, or a longer prompt's, takes the three enqueues)."""
        room = self.admission_bytes if mixed else 0
        return min(self.prefix_bytes + 16 + 4 * _DIFF_WORDS_PER_REQUEST * size + room, self.staging.capacity_bytes)

    def launches(self, in_bytes: int, step_bytes: torch.Tensor,
                 out_bytes: int) -> tuple[list[tuple[str, Callable[[], None]]], list[tuple[str, Callable[[], None]]]]:
        """The launches a fused step puts before and after a bucketed step's: (copy in), (copy out of the output
        ring's pack buffer, advance)."""
        counter, staging_table, output_table, pack = self.counter, self.staging_table, self.output_table, self.outputs.pack

        def copy_in() -> None:
            launch_lane_copy(counter, staging_table, step_bytes, in_bytes, to_host=False)

        def copy_out() -> None:
            launch_lane_copy(counter, output_table, pack, out_bytes, to_host=True)

        num_lanes = self.num_lanes

        def advance() -> None:
            launch_lane_advance(counter, num_lanes)

        return [("lane copy in", copy_in)], [("lane copy out", copy_out), ("lane advance", advance)]

    @hot_path
    def seek(self) -> bool:
        """Seek both rings to the next lane's slots, if both can hand them out without a wait (each ring's
        ``seek_free``); False when either cannot (the step then takes the three enqueues)."""
        lane = self.lane
        return self.outputs.seek_free(lane) and self.staging.seek_free(lane)

    def fits(self, writer: StagingWriter, output_slot: int, in_bytes: int) -> bool:
        """Whether a step staged through ``writer`` into output slot ``output_slot`` can be the next fused replay:
        all its staged bytes in its first slot, which is the lane's staging slot, within the copy-in's
        ``in_bytes``, and the output slot the lane's."""
        lane = self.lane
        first = writer.first
        return (writer.slot is first and first is self.staging_slots[lane] and first.used_bytes <= in_bytes
                and output_slot == lane and self.outputs.slots[output_slot] is self.output_buffers[lane])

    def take(self) -> int:
        """Note one fused replay enqueued (its lane); the device counter follows when it runs."""
        lane = self.lane
        self.lane = (lane + 1) % self.num_lanes
        return lane

    def follow_rings(self) -> None:
        """After a step the rings served without the lane: make the output ring's next slot (lane 0 when it is
        not one) the next fused replay's, by one fill after the work enqueued so far."""
        lane = self.outputs.next_slot
        lane = lane if lane < self.num_lanes else 0
        if lane != self.lane:
            counter = self.counter
            self.device.enqueue(lambda: counter.fill_(lane), "lane counter resync")
            self.lane = lane

    def reset(self) -> None:
        """Counter and mirror back to lane 0 (init phase: at capture), after every replay already enqueued."""
        counter = self.counter
        self.device.enqueue(counter.zero_, "lane counter reset")
        self.lane = 0

    def _try_copies(self) -> bool:
        """Both copies and the advance on scratch buffers, compared on the host (init phase: compiles them too)."""
        dev = self.device
        try:
            host_in, host_out = dev.pinned(64, torch.uint8), dev.pinned(64, torch.uint8)
            host_in.copy_(torch.arange(64, dtype=torch.uint8))
            host_out.zero_()
            table_in, table_out = self._addresses([host_out, host_in]), self._addresses([host_out, host_out])
            counter, scratch = dev.zeros(1, torch.int64), dev.zeros(64, torch.uint8)

            def work() -> None:
                launch_lane_advance(counter, 2)  # lane 1: host_in
                launch_lane_copy(counter, table_in, scratch, 64, to_host=False)
                scratch.add_(1)
                launch_lane_copy(counter, table_out, scratch, 64, to_host=True)

            if dev.is_cuda:
                dev.enqueue(work, "lane copies, tried once")
                dev.synchronize()
            else:  # run here: a sim queue or a bench that drops device work (`runnercheck.bench.case_runner`) would not run it
                _run_as_device_work(work)
            ok = torch.equal(host_out, torch.arange(1, 65, dtype=torch.uint8))
        except Exception as exc:  # a device or Triton build that cannot address pinned memory from a kernel
            log.warning("steady lanes off: a kernel could not copy pinned host memory (%s: %s); steady steps "
                        "enqueue their copies separately", type(exc).__name__, exc)
            return False
        if not ok:
            log.warning("steady lanes off: a kernel's copy of pinned host memory read wrong bytes; steady steps "
                        "enqueue their copies separately")
        return ok


__all__ = ["SteadyLanes"]
