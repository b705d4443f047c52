"""The model runner: one step = validate, update rows, stage, enqueue everything, return at once.

Phases are explicit: construction is ``init`` (allocate every persistent buffer) then ``capture``
(`runnercheck.impl.graphs.CudaGraphManager`: one graph per (capture size, mode), recorded closures on
cpu/sim), `profile` runs a dummy forward to measure memory (nothing correctness needs happens
there; it uses its own scratch inputs, so it may run before or after capture), `execute_model`
runs steps and never captures.  This module is the step's orchestration; its pieces live in their own modules:
the limits' checks, staging sizes and the proposer's construction (`runnercheck.impl.runner_config`), rows and the
host mirror (`runnercheck.impl.state`; the free list's quarantine: `runnercheck.impl.quarantine`; an admission's
staging into the other owners: `runnercheck.impl.admission`), block tables (`runnercheck.impl.block_table`), the step
plan and input buffers (`runnercheck.impl.input_batch`), the input-prep and post-update kernels
(`runnercheck.impl.kernels`), the model (`runnercheck.impl.model.forward`) and its profile forward
(`runnercheck.impl.model.profile`), sampling (`runnercheck.impl.sample`), the output ring and step outputs
(`runnercheck.impl.output`), and a step's device work -- bucketed (`runnercheck.impl.graph_step`) or eager
(`runnercheck.impl.eager_step`).

Device work of a step, in one submit order on the one stream: H2D of the staging slot -> staged
write applies -> input prep -> forward -> sampler -> post-update -> pack + one D2H into a pinned
output slot -> event.  A uniform decode batch pads its rows into a capture-size bucket, and a
mixed batch without drafts (decodes next to admitted prompts) into a token-size bucket, and runs
apply .. post-update as one graph replay (`runnercheck.impl.graph_step`): its slot's H2D lands in the graph's
fixed step buffer, whose header carries the step's counts, and the graph packs the step's output,
so such a step -- admissions included: their diffs and count resets are named in the header --
enqueues only the H2D, the replay and the output copy (a resumed request's earlier outputs are
counted by a kernel of their own).  When its staged bytes fit its bucket's lane copy (`runnercheck.impl.lanes`:
a decode step's block appends, or one admission next to decodes) it enqueues one thing: the bucket's
fused graph, which copies the slot in and the output out itself.
Other batches (drafts that differ, prompt logprobs, above the largest bucket) run eager.
A step whose live requests all have temperature 0 (`runnercheck.impl.state.RequestStateTable.all_greedy`, a host
count kept at admission and release) samples with the all-greedy launch -- eager, or its bucket's greedy mode
(`runnercheck.impl.graph_step.GraphMode.greedy`) -- instead of the split passes: the same tokens, one read of the logits.
Likewise a step where no live request has a filter on (`runnercheck.impl.state.RequestStateTable.unfiltered`) takes the
split passes without their filter launches (the sampler's ``unfiltered``; `GraphMode.unfiltered`).
A step that repeats the last decode batch (`runnercheck.impl.step_reader.read_steady_step`) reuses its plan;
after a bucketed step it runs `ModelRunner._execute_steady`, whose host side is the read of the
counts and blocks, a few vectorised mirror updates and ONE enqueue -- its bucket's fused graph,
which copies the staging slot in and the output out itself (`runnercheck.impl.lanes`) -- inside one stream
switch (`Device.on_stream`).  `execute_model` never waits in steady state; `AsyncStepOutput.get()` is the
one wait.  Step N+1 may be submitted before step N's output is read (async scheduling): every
count the next step needs lives on the device.

Speculative decoding: drafts come from the scheduler (``draft_token_ids``) or, with
``speculative=NgramConfig(...)`` / ``DraftModelConfig(...)``, from the runner's own proposer on the device
(`runnercheck.impl.ngram_proposer`, `runnercheck.impl.draft_proposer`: gathered before input prep, proposed after post-update,
never read on the host; the draft model's drafts are verified by rejection sampling between the
sampler and post-update).

Ownership: the runner owns its components (each documents its tensors); it holds no tensor of
its own.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from runnercheck.impl.block_table import BlockTable
from runnercheck.impl.buffers import StagingPool, StagingWriter
from runnercheck.impl.staged_writes import StagedWriteGroup
from runnercheck.impl.device import Device
from runnercheck.impl.eager_step import enqueue_eager_step
from runnercheck.impl.graph_step import GraphKey, build_padded_step
from runnercheck.impl.graphs import CudaGraphManager, validate_capture_sizes, validate_mixed_sizes
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.input_batch import InputBatch, StagedStepArrays, StepPlan, plan_step
from runnercheck.impl.lanes import SteadyLanes
from runnercheck.impl.boundary import check_device_drafts
from runnercheck.impl.interface import (
    LOGPROBS_MODES,
    DraftModelConfig,
    ModelRunnerOutput,
    NgramConfig,
    RunnerLimits,
    SchedulerOutput,
)
from runnercheck.impl.draft_proposer import DraftModelProposer
from runnercheck.impl.ngram_proposer import NgramProposer
from runnercheck.impl.model.forward import PagedDecoder
from runnercheck.impl.model.profile import profile_forward
from runnercheck.impl.model.weights import ModelWeights
from runnercheck.impl.output import AsyncStepOutput, OutputSlots, ReadyOutput, StepOutputMeta
from runnercheck.impl.runner_config import admission_staging_bytes, check_limits, make_proposer, staging_capacity
from runnercheck.impl.sample import LogprobsComputer, Sampler, SamplingState
from runnercheck.impl.admission import AdmissionWriters
from runnercheck.impl.state import RequestStateTable
from runnercheck.impl.step_reader import StepArrays, read_steady_step, read_step

_NO_SEEDS: dict[str, int] = {}  # a steady step admits nobody (read-only: `StepOutputMeta` copies it)


@dataclass(frozen=True)
class StepStats:
    step_id: int
    num_reqs: int
    num_tokens: int
    h2d_bytes: int
    num_enqueued: int
    host_seconds: float
    graph_replayed: bool = False  # the step's device work was one graph replay
    graph_fallback: str | None = None  # why a step with tokens ran eager (`runnercheck.impl.graphs.FALLBACK_REASONS`)
    steady: bool = False  # read by the steady-state reader (`runnercheck.impl.step_reader.read_steady_step`), its plan reused


class ModelRunner:
    """A vLLM-MRV2-style runner over the built-in paged decoder.  See the module docstring."""

    logprobs_modes = LOGPROBS_MODES  # raw and processed (`runnercheck.impl.interface.runner_logprobs_modes`)

    def __init__(
        self, weights: ModelWeights, limits: RunnerLimits, device: Device, *, base_seed: int = 0,
        dtype: torch.dtype | None = None, staging_slots: int = 8, staging_bytes: int | None = None, output_slots: int = 8,
        cuda_graphs: bool = True, capture_sizes: Sequence[int] | None = None, mixed_sizes: Sequence[int] | None = None,
        speculative: NgramConfig | DraftModelConfig | None = None, batch_invariant: bool = False,
    ):
        check_limits(weights, limits)
        validate_capture_sizes(capture_sizes, limits.max_num_reqs)  # typed errors before anything is allocated
        validate_mixed_sizes(mixed_sizes, limits.max_num_reqs, limits.max_num_batched_tokens)
        self.weights = weights
        self.limits = limits
        self.device = device
        self.base_seed = base_seed
        # fp32 by default: the runner is judged token-for-token against a float64 oracle.
        self.dtype = dtype or torch.float32
        self._staging_slots = staging_slots
        self._staging_bytes = staging_bytes
        self._output_slots = output_slots
        self._last_stats: tuple | None = None  # `StepStats` fields of the last step, built on first read
        self._last_step_id: int | None = None  # step ids must increase (checked at the boundary)
        self._step: StepArrays | None = None  # the step being executed, read once by `_check`
        # The last accepted decode step and its plan: a steady step repeats both (`read_steady_step`).
        self._last_decode: tuple[StepArrays, StepPlan] | None = None
        self._steady_key: GraphKey | None = None  # set after a bucketed decode step: its steady successors' graph
        self._cuda_graphs = cuda_graphs
        self._capture_sizes = capture_sizes
        self._mixed_sizes = mixed_sizes
        self.batch_invariant = batch_invariant  # the decoder's fixed-tile kernels (`PagedDecoder`)
        self.speculative = speculative  # the proposer's config (None: drafts come only from the scheduler)
        self._device_drafts: dict[str, int] = {}  # the step being executed: request -> device drafts asked for
        self._init()
        self.graphs.capture()

    # ------------------------------------------------------------------ init
    def _init(self) -> None:
        lim, dev = self.limits, self.device
        # Row state, block tables and sampling parameters share one arena: one apply launch per step.
        self.staged_writes = StagedWriteGroup(dev, "row state, block tables, sampling params")
        self.state = RequestStateTable(dev, lim.max_num_reqs, lim.max_model_len, group=self.staged_writes)
        self.block_table = BlockTable(dev, lim.max_num_reqs, lim.max_model_len, lim.block_size, group=self.staged_writes)
        self.input_batch = InputBatch(
            dev, max_num_reqs=lim.max_num_reqs, max_num_batched_tokens=lim.max_num_batched_tokens,
            max_blocks_per_req=self.block_table.max_blocks_per_req, max_num_draft_tokens=lim.max_num_draft_tokens,
        )
        self.model = PagedDecoder(self.weights, dev, dtype=self.dtype, num_kv_blocks=lim.num_kv_blocks, block_size=lim.block_size,
                                  batch_invariant=self.batch_invariant)
        self.sampling_state = SamplingState(dev, lim.max_num_reqs, lim.vocab_size, group=self.staged_writes)
        self.staged_writes.seal()
        # An admission's stagings past the table's own (block list, sampling record): one C call with its row.
        self._admission_writers = AdmissionWriters.of(self.state, self.block_table, self.sampling_state)
        self.sampler = Sampler(dev, lim.vocab_size, lim.max_logprobs, max_num_rows=self.input_batch.max_sampling_rows)
        self.prompt_logprobs = LogprobsComputer(dev, lim.vocab_size, lim.max_logprobs, self.input_batch.max_prompt_rows)
        # Host: the live requests asking for processed logprobs (their steps' logprobs take the processed pass).
        self.processed_logprobs_reqs: set[str] = set()
        self.outputs = OutputSlots(
            dev, num_slots=self._output_slots, max_num_reqs=lim.max_num_reqs,
            max_logit_rows=self.input_batch.max_sampling_rows, max_prompt_rows=self.input_batch.max_prompt_rows,
            max_logprobs=lim.max_logprobs,
        )
        admission_bytes = admission_staging_bytes(self.sampling_state.num_mask_words, self.block_table.max_blocks_per_req)
        capacity = staging_capacity(self._staging_bytes, lim, self.block_table.max_blocks_per_req)
        self.staging = StagingPool(dev, self._staging_slots, capacity)
        self.proposer: NgramProposer | DraftModelProposer | None = None
        if self.speculative is not None:
            self.proposer = make_proposer(dev, self.speculative, lim, self.weights.config, dtype=self.dtype,
                                          sampling_state=self.sampling_state, input_batch=self.input_batch)
            self.state.history_reads = True  # a proposer reads every row's tokens, its prefill's too, in every step
        graphed = self._cuda_graphs
        draft_model = isinstance(self.proposer, DraftModelProposer)
        staging_layout = InputBatch.staging_layout(lim.max_num_reqs, lim.max_num_batched_tokens, lim.max_num_draft_tokens)
        offset, n, dtype = staging_layout["logits_start"]  # a decode step's compact arrays end there
        # A proposer's steps never take the fused path (its gathers run before the replay): no lanes for a
        # draft model, whose fused captures would double its capture time for nothing.
        self.lanes = SteadyLanes(dev, self.staging, self.outputs, offset + n * dtype.itemsize,
                                 admission_bytes) if graphed and not draft_model else None
        self.graphs = CudaGraphManager(  # a draft model: uniform decode buckets only (its proposal is per request)
            dev, enabled=graphed, capture_sizes=self._capture_sizes, max_num_reqs=lim.max_num_reqs,
            max_num_batched_tokens=lim.max_num_batched_tokens, max_num_draft_tokens=lim.max_num_draft_tokens, max_logprobs=lim.max_logprobs,
            build_step=lambda inputs, key: build_padded_step(self, inputs, key), staging_bytes=capacity,
            staging_layout=staging_layout, lanes=self.lanes, mixed_sizes=() if draft_model else self._mixed_sizes,
            spec_query_len=1 + self.speculative.num_spec_tokens if draft_model else None,
        )

    # ------------------------------------------------------------------ profile
    def profile(self) -> dict[str, Any]:
        """A dummy forward over the largest batch, to measure memory (`runnercheck.impl.model.profile`)."""
        lim = self.limits
        return profile_forward(self.model, self.device, num_tokens=min(lim.max_num_batched_tokens, lim.max_model_len),
                               max_blocks_per_req=self.block_table.max_blocks_per_req,
                               max_logit_rows=self.input_batch.max_sampling_rows)

    # ------------------------------------------------------------------ execute
    @hot_path
    def execute_model(self, sched: SchedulerOutput) -> AsyncStepOutput | ReadyOutput:
        started = time.perf_counter()
        with self.device.on_stream():  # one stream switch per step, not one per enqueue
            return self._execute(sched, started)

    @hot_path
    def _execute(self, sched: SchedulerOutput, started: float) -> AsyncStepOutput | ReadyOutput:
        step = self._check(sched)
        if step.steady and self._steady_key is not None:
            return self._execute_steady(step, sched.step_id, started)
        enqueued_before = self.device.num_enqueued
        self.device.begin_step()
        self._step = step
        seeds = self._update_rows(sched)
        self._last_step_id = sched.step_id

        # One staging slot (more only when admissions overflow it), one H2D, one apply launch for
        # every staged diff: the compact arrays first, at the slot's fixed layout, then the diffs.
        writer = StagingWriter(self.staging, sched.step_id)
        key = reason = in_bytes = output_slot = None
        lane_free = False
        proposer, device_drafts = self.proposer, self._device_drafts
        if step.req_ids:
            plan = plan_step(step, self.state, self._last_decode[1] if step.steady else None)
            is_decode = step.is_decode
            self._last_decode = (step, plan) if is_decode else None
            if device_drafts:
                proposer.mark_placeholders(plan, device_drafts)
            key, reason = self.graphs.select(plan.num_reqs, plan.uniform, plan.num_prompt_rows, plan.max_num_logprobs,
                                             plan.num_tokens, len(plan.drafts), self.state.all_greedy,
                                             self.state.unfiltered)
            if key is not None and plan.max_num_logprobs >= 0 and self.processed_logprobs_reqs:
                # graphs capture raw logprobs only; a live request asking for processed ones runs the step eager
                key, reason = None, "processed logprobs"
            if isinstance(proposer, DraftModelProposer):
                proposer.mark_bucketed(key is not None)  # a bucket verifies and proposes inside its graph
            if key is not None and proposer is None:
                in_bytes, lane_free, output_slot = self._seek_lane(key)
            staged = self.input_batch.stage(plan, writer)
        if key is not None and proposer is None:
            # The bucketed step's first slot lands in the step buffer: an admission's kernels read it there.
            writer.place_first(self.graphs.inputs.step_bytes)
        self.staged_writes.flush(writer)
        admitted = self.sampling_state.num_pending > 0  # its own kernels (count resets) follow admissions only
        if admitted:
            self.sampling_state.flush(writer)
        step_buffer, packed, resets = None, None, None
        if key is not None:
            # A bucketed step: its graph applies the diffs itself when they sit in the first slot
            # (the usual case), reading counts and the table from the step buffer's header.
            step_buffer = self.graphs.inputs.step_bytes
            packed = self.staged_writes.take_single_pack(writer.first)  # as `_pack_for_graph`, with the resets
            resets = self.sampling_state.take_resets(writer.first) if admitted else None  # their count reset: in the graph too
            if packed is not None or resets is not None:
                self.input_batch.set_header_counts(writer.first, packed, resets)
        # The fused step copies the slot in and the output out itself, when nothing runs eager before it.
        fused = (lane_free and packed is not None and (resets is not None or not admitted)
                 and self.lanes.fits(writer, output_slot, in_bytes))
        if not fused:
            # The first slot's one H2D goes straight to the step buffer unless an eager apply reads the slot
            # through its own device views (then a device copy follows); so does the proposer (its gather and
            # propose kernels read the step's rows through the slot's views).
            writer.submit(step_buffer, redirect=packed is not None and proposer is None)
            self._enqueue_applies(admitted)
        if proposer is not None:
            proposer.note_step(step, sched.new_requests, self.state.req_to_row)
        if not step.req_ids:
            self._last_decode = self._steady_key = None
            self._record_stats(sched.step_id, 0, 0, writer.bytes, enqueued_before, started)
            return ReadyOutput(ModelRunnerOutput(sched.step_id, (), (), (), {}, (), seeds))

        if device_drafts:
            # A bucketed step's graph pads the drafts it finds in the step buffer: the gather writes there.
            staged = proposer.enqueue_gather(staged, plan.num_reqs,
                                             out=self.graphs.inputs.step_drafts if key is not None else None)
        result, fallback = self._enqueue_device_step(plan, staged, key, reason, fused)
        if proposer is not None:
            proposer.enqueue_propose(staged, plan.num_reqs, self.outputs.num_sampled, self.sampler.tokens,
                                     self.state.base, self.state.prefill_tokens)
        output = self._enqueue_output(sched.step_id, plan, result, seeds, output_slot)
        self._close_lane(writer, fused, in_bytes, output)
        # A bucketed decode step whose diffs its graph applied: the steady steps after it repeat it
        # through `_execute_steady` (its plan and key hold while nothing is admitted or finished).
        self._steady_key = key if (is_decode and packed is not None and not admitted and proposer is None
                                   and not self.state.num_prompt_logprob_rows) else None

        self.state.mark_step(step.rows, output.event)  # int64: the plan's int32 copy would cost a cast per scatter
        self.state.plan_rows(plan.req_ids, step.rows, step.ends, step.known)
        self.state.advance(plan.req_ids, plan.query_lens, plan.num_drafts if len(plan.drafts) else None)
        self._record_stats(sched.step_id, plan.num_reqs, plan.num_tokens, writer.bytes, enqueued_before, started,
                           fallback is None and self.graphs.enabled, fallback, step.steady)
        return output

    @hot_path
    def _execute_steady(self, step: StepArrays, step_id: int, started: float) -> AsyncStepOutput:
        """A steady step after a bucketed decode step (``_steady_key``): the general step less what it would
        recompute to the same result -- the plan, the graph key, the admissions and releases.

        Its host side: the appended blocks, the slot (whose compact arrays the last steps left in
        place: `runnercheck.impl.buffers.StagingSlot.kept`), the diffs, then one enqueue -- the bucket's fused graph,
        which copies the slot in and the output out itself (`runnercheck.impl.lanes`) -- or, when the step does not
        fit the next lane, the H2D, the replay and the output's D2H.
        """
        enqueued_before = self.device.num_enqueued
        self.device.begin_step()
        self._step = step
        plan = self._last_decode[1]
        self._last_decode = (step, plan)
        self._last_step_id = step_id
        appends = step.block_appends
        if appends is not None:
            rows, counts, block_ids = appends
            self.block_table.append_many(rows, self.state.append_blocks(rows, counts), counts, block_ids)
        key = self._steady_key
        in_bytes, lane_free, output_slot = self._seek_lane(key)
        writer = StagingWriter(self.staging, step_id)
        staged = self.input_batch.stage(plan, writer)
        self.staged_writes.flush(writer)
        packed = self._pack_for_graph(writer)
        fused = lane_free and packed is not None and self.lanes.fits(writer, output_slot, in_bytes)
        if not fused:
            writer.submit(self.graphs.inputs.step_bytes, redirect=packed is not None)
            self.staged_writes.enqueue_apply()  # only when the diffs overflowed the first slot
        # Through `_enqueue_device_step`, as every step with tokens: the hook point of the checks that
        # follow a step's device work (`runnercheck.checks.detectors.kv_provenance`).
        result, _ = self._enqueue_device_step(plan, staged, key, None, fused)
        output = self._enqueue_output(step_id, plan, result, _NO_SEEDS, output_slot)
        self._close_lane(writer, fused, in_bytes, output)
        self._steady_key = key if packed is not None else None
        self.state.mark_step(step.rows, output.event)
        self.state.plan_rows(plan.req_ids, step.rows, step.ends, step.known)
        self.state.advance(plan.req_ids, plan.query_lens, None)
        self._record_stats(step_id, plan.num_reqs, plan.num_tokens, writer.bytes, enqueued_before, started,
                           self.graphs.enabled, None, True)
        return output

    @hot_path
    def _seek_lane(self, key: GraphKey) -> tuple[int | None, bool, int | None]:
        """A bucketed step's fused graph, before its slots are taken: (its copy-in bytes, None when the bucket
        has no fused graph; whether both rings' next lane is free without a wait, `runnercheck.impl.lanes`; the output
        slot, acquired now when there is a fused graph, else by `_enqueue_output`)."""
        in_bytes = self.graphs.fused(key)
        if in_bytes is None:
            return None, False, None
        return in_bytes, self.lanes.seek(), self.outputs.acquire()

    @hot_path
    def _close_lane(self, writer: StagingWriter, fused: bool, in_bytes: int | None, output: AsyncStepOutput) -> None:
        """After the step's output is enqueued: a fused step's slot is submitted as copied in by its replay
        (its output's event ends the slot's use); an unfused one leaves the rings' lanes where its slots were."""
        if fused:
            writer.submit_enqueued(output.event, in_bytes, self.graphs.inputs.step_bytes)
        elif in_bytes is not None:
            self.lanes.follow_rings()

    @hot_path
    def _pack_for_graph(self, writer: StagingWriter) -> tuple[int, int] | None:
        """A bucketed step's staged diffs, when the last flush packed them into the first slot: named in its
        header, so the graph applies them (the prepared eager apply is dropped).  None: they are applied eagerly."""
        packed = self.staged_writes.take_single_pack(writer.first)
        if packed is not None:
            self.input_batch.set_header_diffs(writer.first, *packed)
        return packed

    def _check(self, sched: SchedulerOutput) -> StepArrays:
        """All-or-nothing boundary: every check runs before any state (host, pinned or staged) changes.

        Device drafts (`SchedulerOutput.num_device_drafts`) are checked first, then the step is read
        with k stand-in ids per such request (the device gathers the real ones)."""
        self._device_drafts = {}
        if isinstance(self.proposer, DraftModelProposer) and isinstance(sched, SchedulerOutput):
            self.proposer.check_schedule(sched)  # raises DeviceDraftsError: explicit drafts, prefix hits
        if getattr(sched, "num_device_drafts", None) and isinstance(sched, SchedulerOutput):
            if self.proposer is None:
                check_device_drafts(sched, self.limits, None, lambda rid: False)  # raises DeviceDraftsError
            counts = self.proposer.check(sched, self.state.req_to_row)
            step = read_step(NgramProposer.placeholder_schedule(sched, counts), self.state, self.limits, self._last_step_id)
            self._device_drafts = counts
            return step
        last = self._last_decode
        # No decode step to repeat, or a step that admits (an exact tuple's truth cannot raise): no steady step.
        # `read_step` checks the containers itself.
        if last is None or (type(sched) is SchedulerOutput and type(sched.new_requests) is tuple and sched.new_requests):
            return read_step(sched, self.state, self.limits, self._last_step_id)
        step = read_steady_step(sched, self.state, self.limits, self._last_step_id, last[0])
        # `read_steady_step` checked the containers and the step id before it declined.
        return step if step is not None else read_step(sched, self.state, self.limits, self._last_step_id,
                                                       containers_checked=True)

    def _update_rows(self, sched: SchedulerOutput) -> dict[str, int]:
        """Releases and admissions per item; cached requests' counts and block appends from the step's arrays."""
        step = self._step
        for req_id in step.gone:
            self.state.release(req_id)
        if self.processed_logprobs_reqs:
            self.processed_logprobs_reqs.difference_update(step.gone)
        seeds: dict[str, int] = {}
        if sched.new_requests:  # `read_step` checked each request: its sampling record is staged unchecked
            admit, writers, base_seed = self.state.admit_staged, self._admission_writers, self.base_seed
            note_mode, processed_reqs = self.sampling_state.note_logprobs_mode, self.processed_logprobs_reqs
            for req in sched.new_requests:
                row = admit(req, base_seed, writers, seeds)
                processed = req.sampling_params.logprobs_mode == "processed"
                note_mode(row, processed)
                if processed:
                    processed_reqs.add(req.req_id)
        for i, req_id in step.new_positions:
            step.rows[i] = self.state.req_to_row[req_id]
        if step.cached_computed is not None:  # rejected drafts reported: the computed counts move
            self.state.apply_cached(step.cached_rows, step.cached_computed, None)
        appends = step.block_appends
        if appends is not None:  # only the rows that appended blocks change (as in a steady step)
            rows, counts, block_ids = appends
            self.block_table.append_many(rows, self.state.append_blocks(rows, counts), counts, block_ids)
        return seeds

    def _enqueue_applies(self, admitted: bool) -> None:
        self.staged_writes.enqueue_apply()
        if admitted:
            self.sampling_state.enqueue_apply()

    def _enqueue_device_step(self, plan: StepPlan, staged: StagedStepArrays, key: GraphKey | None,
                             reason: str | None, fused: bool = False) -> tuple[dict, str | None]:
        """Input prep .. post-update: a bucketed step ``key`` (one graph replay, or the same launches eagerly),
        else eager (``reason``: why, from `CudaGraphManager.select`).  ``fused``: the bucket's fused graph
        (`CudaGraphManager.run`), its staging copy-in and output copy-out included.

        Returns the dict the sampler output lands in and the fallback reason (None: bucketed).
        """
        graphs = self.graphs
        if key is None:
            graphs.count_fallback(reason)
            self.input_batch.enqueue_prepare(plan, staged, self.state, self.block_table)
            return enqueue_eager_step(self, plan, staged, self.state.all_greedy, self.state.unfiltered), reason
        return graphs.run(key, fused=True) if fused else graphs.run(key), None

    def cuda_graph_stats(self) -> dict[str, Any]:
        """``{"enabled", "replays", "fallbacks": {reason: steps}}`` (plus padded-eager steps, graph count, sizes)."""
        return self.graphs.stats()

    def _enqueue_output(self, step_id: int, plan: StepPlan, result: dict, seeds: dict[str, int],
                        slot: int | None = None) -> AsyncStepOutput:
        """The step's output: the D2H into ``slot`` (acquired here when None) and its event."""
        layout = result.get("packed")  # a bucketed step packs itself at its bucket's layout
        if layout is None:
            layout = self.outputs.layout((plan.num_reqs, plan.num_sampling_rows, plan.max_num_logprobs, plan.num_prompt_rows,
                                          plan.max_num_prompt_logprobs))
        meta = StepOutputMeta(step_id, plan.req_ids, plan.logits_start64, plan.num_logprobs,
                              plan.prompt_requests, plan.prompt_targets, seeds)
        if slot is None:
            slot = self.outputs.acquire()
        return self.outputs.enqueue_copy_out(slot, layout, result, meta)

    @property
    def last_step_stats(self) -> StepStats | None:
        """What the last executed step did (None before the first)."""
        fields = self._last_stats
        if type(fields) is tuple:  # made into the frozen record only when read: not a per-step cost
            fields = self._last_stats = StepStats(*fields)
        return fields

    def _record_stats(self, step_id: int, num_reqs: int, num_tokens: int, h2d_bytes: int, enqueued_before: int, started: float,
                      graph_replayed: bool = False, graph_fallback: str | None = None, steady: bool = False) -> None:
        self._last_stats = (step_id, num_reqs, num_tokens, h2d_bytes, self.device.num_enqueued - enqueued_before,
                            time.perf_counter() - started, graph_replayed, graph_fallback, steady)


def make_runner(weights: ModelWeights, limits: RunnerLimits, device: Device, base_seed: int = 0, *,
                cuda_graphs: bool = True, speculative: NgramConfig | DraftModelConfig | None = None,
                batch_invariant: bool = False) -> ModelRunner:
    """The factory `runnercheck stress` and the differential driver use (``runnercheck.impl.runner:make_runner``).

    ``cuda_graphs=False`` (the CLI's ``--eager``) runs bucketed steps eagerly instead of replaying graphs;
    ``speculative`` turns the n-gram (`runnercheck.impl.ngram_proposer`) or draft-model (`runnercheck.impl.draft_proposer`) proposer on;
    ``batch_invariant=True`` makes the target model's forward batch-invariant (fixed-tile kernels,
    `runnercheck.impl.kernels.batch_invariant`; `runnercheck invariance` asks for it).
    """
    return ModelRunner(weights, limits, device, base_seed=base_seed, cuda_graphs=cuda_graphs, speculative=speculative,
                       batch_invariant=batch_invariant)
