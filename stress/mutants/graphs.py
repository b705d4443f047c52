"""CUDA-graph mutants (registered in the `runnercheck.stress.mutants.catalogue` catalogue): bugs of bucketed, graph-replayed steps.

Each models a bug graph-capturing runners have shipped, planted from outside ``impl/`` into a live
runner's graph manager (`runnercheck.impl.graphs.CudaGraphManager`, ``runner.graphs``):

* ``graph_buffer_reallocated``: a persistent buffer re-allocated after capture -- the graph keeps
  the old address while eager code uses the new one (on cpu/sim the recorded launches hold the old
  tensor, so it diverges there too);
* ``padding_row_writes_live_state``: padding rows of a bucket repeat the batch's last row instead
  of the -1 sentinel, so the padding request advances that live row again and counts its token twice;
* ``predicate_admits_larger_batch``: the bucket lookup rounds down and the graph's predicate drops
  its size check, so a batch larger than its bucket replays and its last requests are never run;
* ``graph_init_only_at_capture``: the per-query-length offsets are written by the capture warm-up
  instead of at init; eager execution (``--eager``, which this mutant runs) reads zeros;
* ``mixed_tail_left_stale``: a mixed bucket's input prep is told the bucket's token count for the
  step's, so it pads no tail: the padding tokens keep the ids, positions and KV slots an earlier
  step left there, and write those slots again -- slots that may since belong to another request;
* ``graph_skips_admitted_count_reset``: a bucketed step names its admissions' count reset in its
  header instead of running it eagerly, but the graph's reset does nothing: a row reused by a new
  request keeps the penalty counts of the one before (workload ``reuse-penalties``: two rows, short
  penalised requests);
* ``draft_q_not_refreshed``: a draft-model bucket's rejection sampling reads a draft-distribution buffer
  the gather before each replay no longer refreshes (re-allocated after capture: the graph keeps the
  old address), so drafts are judged against stale q;
* ``draft_propose_before_post_update``: a draft-model bucket captures its proposal before post-update,
  so the draft decodes from the previous step's last token at stale positions (workload ``draft-model``
  for both: uniform decodes of 3 device drafts are bucketed).

They use the ``decode`` workload (up to 4 requests, buckets 1, 2, 4: a batch of 3 pads one row or,
rounded down, loses one); the padding mutant uses ``decode-penalties`` (registered here: decode
with penalties), the mixed-tail mutant ``steady`` (prompts joining decodes: mixed steps).
``graph_buffer_reallocated`` also turns mixed graphs off, so prefill steps run eager against the new
address while decode steps replay against the old.  On cpu/sim the padding program runs after the live one and advances the row twice
(the differential sees the wrong position); on an H200 both programs of the one launch read the
row at once and store the same values, so tokens stay right (it survived the differential in two
H200 runs): KV provenance kills it there, as a padding token that writes a live KV slot.  The
batch that loses a row to a smaller bucket leaves its KV writes one position behind, which KV
provenance sees first on cpu/sim.
"""
from __future__ import annotations

import bisect
from types import SimpleNamespace
from typing import Any, Callable

import torch

from runnercheck.impl import graph_step
from runnercheck.impl.kernels.input_prep import HEADER_NUM_REQS

from runnercheck.stress.mutants.kernels import MutantTargetError
from runnercheck.stress.mutants.registry import AppliedMutant, _mutant


@_mutant("graph_buffer_reallocated", "state", ("differential", "provenance"), "decode", ("graphs", "state"),
         "the row-state table re-allocated after capture: graph replays read and write the stale address")
def _graph_buffer_reallocated(runner: Any, m: AppliedMutant) -> None:
    table = runner.state.row_state
    m.set(table, "_base", table.base.clone())  # base is a property over the staged-write arena
    # Prefill steps run eager (no mixed graphs), against the new address, decode steps replay against the old.
    m.set(runner.graphs, "mixed_sizes", ())


@_mutant("padding_row_writes_live_state", "state", ("differential", "provenance"), "decode-penalties", ("graphs",),
         "bucket padding rows repeat the batch's last row instead of the -1 sentinel: padding advances and counts a live row")
def _padding_row_writes_live_state(runner: Any, m: AppliedMutant) -> None:
    inputs = runner.graphs.inputs
    launch_pad = inputs.launch_pad

    def pad_with_last_row(size: int, query_len: int) -> None:
        # Inside the bucketed step (device work or capture): the real request count is on the device.
        launch_pad(size, query_len)
        padded = inputs.rows[:size]
        num_reqs = inputs.header[HEADER_NUM_REQS : HEADER_NUM_REQS + 1].to(torch.int64)
        last = padded.index_select(0, (num_reqs - 1).clamp(min=0))
        index = torch.arange(size, device=padded.device)
        padded.copy_(torch.where(index >= num_reqs, last, padded))

    m.set(inputs, "launch_pad", pad_with_last_row)
    recapture_graphs(runner, m)


def recapture_graphs(runner: Any, m: AppliedMutant) -> None:
    """CUDA graphs hold the launches they captured: capture again with the mutant; undo puts the
    original captures back (recorded closures on cpu/sim look patched names up when they run anyway).
    A runner without captured graphs is left alone."""
    graphs = getattr(runner, "graphs", None)
    if graphs is None or not graphs.captured:
        return
    for name in ("graphs", "fused_graphs", "fused_in_bytes"):
        m.set(graphs, name, getattr(graphs, name))
    graphs.recapture()


@_mutant("predicate_admits_larger_batch", "state", ("differential", "provenance"), "decode", ("graphs",),
         "bucket lookup rounds down and the graph predicate skips its size check: a batch larger than its bucket replays")
def _predicate_admits_larger_batch(runner: Any, m: AppliedMutant) -> None:
    graphs = runner.graphs
    sizes = graphs.capture_sizes

    def bucket_rounded_down(num_reqs: int) -> int | None:
        i = bisect.bisect_right(sizes, num_reqs) - 1
        return sizes[max(i, 0)]

    m.set(graphs, "bucket_for", bucket_rounded_down)
    for graph in graphs.graphs.values():
        def admits_any_size(num_reqs: int, query_len: int, num_drafts_each: int, num_top: int, num_tokens: int = 0,
                            mode: Any = graph.key.mode) -> bool:
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



@_mutant("mixed_tail_left_stale", "state", ("provenance", "differential"), "steady", ("graphs",),
         "a mixed bucket's input prep takes the bucket's token count for the step's: padding tokens keep an earlier "
         "step's ids and KV slots and write there")
def _mixed_tail_left_stale(runner: Any, m: AppliedMutant) -> None:
    prepare = graph_step.launch_prepare_inputs

    def prepare_without_tail(**kwargs: Any) -> None:
        if kwargs["num_tokens"] == 0:  # a mixed bucket's (`runnercheck.impl.graph_step`): 0 keeps the tail program on
            kwargs["num_tokens"] = kwargs["padded_num_tokens"]
        prepare(**kwargs)

    m.set(graph_step, "launch_prepare_inputs", prepare_without_tail)
    recapture_graphs(runner, m)


@_mutant("graph_skips_admitted_count_reset", "state", ("differential",), "reuse-penalties", ("graphs", "sampling_state"),
         "a bucketed step drops its admissions' eager count reset, but its graph never zeroes their rows: a reused "
         "row keeps the last request's penalty counts")
def _graph_skips_admitted_count_reset(runner: Any, m: AppliedMutant) -> None:
    m.set(runner.sampling_state, "launch_reset_from_header", lambda step_words, header: None)
    recapture_graphs(runner, m)


def _draft_proposer(runner: Any) -> Any:
    from runnercheck.impl.draft_proposer import DraftModelProposer

    proposer = getattr(runner, "proposer", None)
    if not isinstance(proposer, DraftModelProposer):
        raise MutantTargetError("a draft-model graph mutant needs a runner with the draft-model proposer")
    return proposer


@_mutant("draft_q_not_refreshed", "state", ("differential",), "draft-model", ("graphs", "proposer"),
         "the draft-distribution step buffer re-allocated after capture: the gather before each replay refreshes the "
         "new one while the graph's rejection sampling reads the stale one")
def _draft_q_not_refreshed(runner: Any, m: AppliedMutant) -> None:
    proposer = _draft_proposer(runner)
    m.set(proposer, "step_q", proposer.step_q.clone())  # the bucket bound (captured) the old address


@_mutant("draft_propose_before_post_update", "state", ("differential",), "draft-model", ("graphs", "proposer"),
         "a draft-model bucket's proposal captured before post-update: the draft decodes from the previous step's "
         "last token at stale positions")
def _draft_propose_before_post_update(runner: Any, m: AppliedMutant) -> None:
    proposer = _draft_proposer(runner)
    launches = proposer.padded_launches

    def propose_before_post_update(inputs: Any, key: Any, result: dict, sampler: Any, row_state: Any) -> tuple:
        verify, propose = launches(inputs, key, result, sampler, row_state)
        return verify + propose, []  # right after the verification, ahead of post-update

    m.set(proposer, "padded_launches", propose_before_post_update)
    recapture_graphs(runner, m)


def after_graph_input_prep(runner: Any, m: AppliedMutant, fix: Callable[[Any, Any], None], label: str) -> None:
    """Plant ``fix(input_batch, plan)`` right after input prep in bucketed steps too, and capture again.

    `runnercheck.stress.mutants.catalogue` plants input-prep bugs after the eager ``enqueue_prepare``; a bucketed step
    runs its input prep inside the graph, so the same bug goes into every (size, mode) step the
    manager builds (``plan`` carries the bucket's sizes) and the graphs are captured again with it.
    A runner without a graph manager is left alone.
    """
    graphs = getattr(runner, "graphs", None)
    if graphs is None:
        return
    build, input_batch = graphs._build_step, runner.input_batch

    def build_with_fix(inputs: Any, key: Any) -> Any:
        step = build(inputs, key)
        plan = SimpleNamespace(num_reqs=key.size, num_tokens=key.num_tokens, num_sampling_rows=key.num_sampling_rows)
        after = [name for name, _ in step.launches].index("input prep") + 1
        step.launches.insert(after, (label, lambda: fix(input_batch, plan)))
        return step

    m.set(graphs, "_build_step", build_with_fix)
    if graphs.captured:
        m.set(graphs, "graphs", {})
        m.set(graphs, "captured", False)
        graphs.capture()


__all__ = ["after_graph_input_prep", "recapture_graphs"]
