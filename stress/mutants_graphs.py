"""CUDA-graph mutants (registered in the `stress.mutants` catalogue): bugs of bucketed, graph-replayed steps.

Each models a bug graph-capturing runners have shipped, planted from outside ``impl/`` into a live
runner's graph manager (`impl.graphs.CudaGraphManager`, ``runner.graphs``):

* ``graph_buffer_reallocated``: a persistent buffer re-allocated after capture -- the graph keeps
  the old address while eager code uses the new one (on cpu/sim the recorded launches hold the old
  tensor, so it diverges there too);
* ``padding_row_writes_live_state``: padding rows of a bucket point at state row 0 instead of the
  -1 sentinel, so the padding request advances a live row's counts and last token;
* ``predicate_admits_larger_batch``: the bucket lookup rounds down and the graph's predicate drops
  its size check, so a batch larger than its bucket replays and its last requests are never run;
* ``graph_init_only_at_capture``: the per-query-length offsets are written by the capture warm-up
  instead of at init; eager execution (``--eager``, which this mutant runs) reads zeros.

All four use the ``decode`` workload (up to 4 requests, buckets 1, 2, 4: a batch of 3 pads one row
or, rounded down, loses one).  Killed by the differential check (runner vs the float64 oracle).
"""
from __future__ import annotations

import bisect
from typing import Any

from stress.mutants import AppliedMutant, _mutant


@_mutant("graph_buffer_reallocated", "state", ("differential",), "decode", ("graphs", "state"),
         "the row-state table re-allocated after capture: graph replays read and write the stale address")
def _graph_buffer_reallocated(runner: Any, m: AppliedMutant) -> None:
    table = runner.state.row_state
    m.set(table, "base", table.base.clone())


@_mutant("padding_row_writes_live_state", "state", ("differential",), "decode", ("graphs",),
         "bucket padding rows filled with state row 0 instead of the -1 sentinel: the padding request advances row 0")
def _padding_row_writes_live_state(runner: Any, m: AppliedMutant) -> None:
    inputs, device = runner.graphs.inputs, runner.device
    enqueue_pad = inputs.enqueue_pad

    def pad_with_row_zero(rows: Any, drafts: Any, num_reqs: int, num_drafts: int, size: int) -> None:
        enqueue_pad(rows, drafts, num_reqs, num_drafts, size)
        if size > num_reqs:
            padded = inputs.rows
            device.enqueue(lambda: padded[num_reqs:size].zero_(), "pad rows with row 0")

    m.set(inputs, "enqueue_pad", pad_with_row_zero)


@_mutant("predicate_admits_larger_batch", "state", ("differential",), "decode", ("graphs",),
         "bucket lookup rounds down and the graph predicate skips its size check: a batch larger than its bucket replays")
def _predicate_admits_larger_batch(runner: Any, m: AppliedMutant) -> None:
    graphs = runner.graphs
    sizes = graphs.capture_sizes

    def bucket_rounded_down(num_reqs: int) -> int | None:
        i = bisect.bisect_right(sizes, num_reqs) - 1
        return sizes[max(i, 0)]

    m.set(graphs, "bucket_for", bucket_rounded_down)
    for graph in graphs.graphs.values():
        def admits_any_size(num_reqs: int, query_len: int, num_drafts_each: int, num_top: int, mode: Any = graph.key.mode) -> bool:
            return query_len == mode.query_len and num_drafts_each == mode.query_len - 1 and num_top == mode.num_top

        m.set(graph, "admits", admits_any_size)


@_mutant("graph_init_only_at_capture", "state", ("differential",), "decode", ("graphs",),
         "per-query-length offsets written by the capture warm-up only; eager execution (run here) reads zeros")
def _graph_init_only_at_capture(runner: Any, m: AppliedMutant) -> None:
    graphs = runner.graphs
    inputs = graphs.inputs
    offsets = [*inputs.query_start.values(), *inputs.logits_start.values(), *inputs.draft_start.values()]
    saved = [t.clone() for t in offsets]

    def zero() -> None:
        for t in offsets:
            t.zero_()

    def restore() -> None:
        for t, s in zip(offsets, saved):
            t.copy_(s)

    device = runner.device
    device.enqueue(zero, "mutant: offsets init never wrote")  # in stream order, ahead of every later step
    m._undo.append(restore)  # undo restores at once (a mutated runner's queue may hold broken work)
    capture = graphs.capture

    def capture_then_fill_offsets() -> None:
        capture()
        inputs.fill_offsets()

    m.set(graphs, "capture", capture_then_fill_offsets)
    m.set(graphs, "enabled", False)  # the bug lives in eager execution: run it


__all__: list[str] = []
