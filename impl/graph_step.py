"""The bucketed (padded) step: its persistent inputs and its device work, ready to capture.

A *bucketed* step is a uniform decode batch (every request scheduled ``query_len = 1 + k`` tokens
with exactly ``k`` drafts) padded from ``num_reqs`` up to a capture size ``size``, or a *mixed*
batch (any query lengths -- decodes next to prefill chunks -- and no drafts) padded up to a
token size ``tokens`` and ``size`` requests (`GraphKey`, mode `MIXED`).  Its device work
is input prep -> forward -> sampler (logprobs included when the mode asks; the all-greedy launch in a greedy
mode, no filter launches in an unfiltered one: `GraphMode`) -> [a draft model's
verification] -> post-update -> penalty-count update -> output pack -> [a draft model's proposal:
`runnercheck.impl.draft_proposer.DraftModelProposer.padded_launches`], with every shape taken from the bucket (``size``, ``query_len``, the mode's
top-n) and every varying fact read from device tensors, so one recording serves every batch of
its bucket.  `build_padded_step` binds those launches to the persistent buffers *when it is
called*: `runnercheck.impl.graphs.CudaGraphManager` calls it once per (size, mode) at capture and replays the
result; eager execution calls it again every step, so a buffer re-allocated after capture shows
up as a difference between the two, on CPU too.

Padding: rows ``[num_reqs, size)`` are -1 (`runnercheck.impl.kernels.input_prep.PADDING_ROW`): the input-prep
and post-update kernels give such a request token 0 at slot -1 (no KV write), read sampling
parameters from a dummy row, and write no row state, no penalty counts, no ``num_sampled`` of a
live request and nothing the output pack copies.  In a mixed step a padding request has no tokens
(its query starts repeat the step's token count, `PaddedInputs.mixed_cu`; attention skips it), and
tokens ``[num_tokens, tokens)`` belong to no request (the input-prep tail gives them slot -1); its
one sampling row reads the step's last token and is never copied out.

The step's counts are device data too: a bucketed step's staging slot is copied (its one H2D)
into the fixed-address step buffer below, whose header (`runnercheck.impl.kernels.input_prep.HEADER_WORDS`)
holds the number of real requests and drafts, where the step's staged-write diffs sit and which
admitted rows' penalty counts start at zero.  The recorded launches start with the staged-write
apply, the count reset and the bucket padding, all reading that header, so a bucketed step --
admissions included -- is one H2D, one replay, one D2H + event (a steady one is a single fused
replay with both copies inside: `runnercheck.impl.lanes`).

Ownership: `PaddedInputs` owns, on the device, for the runner's lifetime, at fixed addresses:

    step_bytes      uint8 [staging slot bytes]           a copy of the bucketed step's first staging slot (same offsets:
                                                         `runnercheck.impl.input_batch.InputBatch.staging_layout`, then the diff table);
                                                         written by that slot's H2D (or one device copy of it) each bucketed step
    rows            int32 [max_num_reqs]                 real state rows then -1; written by the pad kernel each bucketed step
    drafts          int32 [max_num_reqs * max(1, D)]     the step's drafts; written by the pad kernel each bucketed step
    query_start[q], logits_start[q], draft_start[q]
                    int32 [max_num_reqs + 1] per query length q: i*q, i*q, i*(q-1); written once, at init
                    (a mixed step reads logits_start[1] and draft_start[1]: one sampling row, no drafts, per request)
    mixed_cu        int32 [max_num_reqs + 1]             a mixed step's query starts, padding requests empty; written by
                                                         the pad kernel each mixed step

The other buffers a step binds belong to their owners (input batch, model, sampler, sampling
state, request state, output ring) and keep their documented writers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from runnercheck.impl.device import Device
from runnercheck.impl.kernels.input_prep import (HEADER_NUM_DIFFS, HEADER_NUM_RESETS, HEADER_WORDS, PADDING_ROW, launch_pad_step_inputs,
                                     launch_prepare_inputs)
from runnercheck.impl.kernels.post_update import launch_post_update
from runnercheck.impl.output import OutputLayout
from runnercheck.impl.staged_writes import launch_apply_from_header

# Programs of the in-graph staged-write apply: a fixed grid striding over the step's diffs.  On
# CPU the interpreter runs programs one after another (~0.4 ms each), so one does all the work.
APPLY_PROGRAMS_CUDA = 64


MIXED = 0  # the `GraphMode.query_len` of a mixed step: any query lengths, no drafts
# A mode's sampler launch sets as its (``greedy``, ``unfiltered``) fields: all the split passes, the split passes
# without the filter launches, the all-greedy launch.  Each bucket is captured once per row (`runnercheck.impl.graphs`).
SAMPLER_TWINS: tuple[tuple[bool, bool], ...] = ((False, False), (False, True), (True, False))


@dataclass(frozen=True)
class GraphMode:
    """What a graph was captured for besides its size: tokens per request (`MIXED`: any), top-n logprobs (-1: none)
    and which of the sampler's launch sets it holds: the all-greedy launch (``greedy``: every live request has
    temperature 0, as the host knows it: `runnercheck.impl.state.RequestStateTable.all_greedy`), the split passes
    without the filter launches (``unfiltered``: no live request has a filter on:
    `runnercheck.impl.state.RequestStateTable.unfiltered`), or all the split passes (neither).  Not both."""

    query_len: int
    num_top: int
    greedy: bool = False
    unfiltered: bool = False

    def __post_init__(self) -> None:
        if self.greedy and self.unfiltered:
            raise ValueError("a graph mode is greedy or unfiltered, not both (the greedy launch has no filter launches)")

    def describe(self) -> str:
        return (("mixed" if self.query_len == MIXED else f"q{self.query_len}") + (f"-lp{self.num_top}" if self.num_top >= 0 else "")
                + ("-greedy" if self.greedy else "") + ("-unfiltered" if self.unfiltered else ""))


@dataclass(frozen=True)
class GraphKey:
    """A bucket: ``size`` requests (padding included) of ``mode``; a mixed bucket also bounds its ``tokens``."""

    size: int
    mode: GraphMode
    tokens: int = 0  # a mixed bucket's tokens, padding included (a decode bucket's are size * query_len)

    @property
    def mixed(self) -> bool:
        return self.mode.query_len == MIXED

    @property
    def num_tokens(self) -> int:
        """The tokens the bucket's launches prepare (padding included)."""
        return self.tokens if self.mixed else self.size * self.mode.query_len

    @property
    def num_sampling_rows(self) -> int:
        """Its sampling rows: one per request of a mixed bucket, one per token of a decode bucket."""
        return self.size if self.mixed else self.num_tokens

    def describe(self) -> str:
        tokens = f"{self.tokens}t" if self.mixed else ""
        return f"{self.size}x{tokens}{self.mode.describe()}"


@dataclass
class PaddedStep:
    """The launches of one bucketed step, in stream order, and the dict the sampler output lands in.

    ``result["packed"]`` is the `runnercheck.impl.output.OutputLayout` the step's last launch packs its output
    into (the bucket's padded shape), so the step's output needs only the D2H copy.
    """

    key: GraphKey
    launches: list[tuple[str, Callable[[], None]]]
    result: dict[str, Any] = field(default_factory=dict)


class PaddedInputs:
    """Persistent inputs of bucketed steps (see the module docstring for ownership)."""

    def __init__(self, device: Device, max_num_reqs: int, max_num_draft_tokens: int, query_lens: tuple[int, ...],
                 staging_bytes: int, layout: dict[str, tuple[int, int, torch.dtype]]):
        self.device = device
        self.max_num_reqs = max_num_reqs
        self.max_num_draft_tokens = max_num_draft_tokens
        self.step_bytes = device.zeros(staging_bytes, torch.uint8)
        self.step_words = self.step_bytes[: staging_bytes // 4 * 4].view(torch.int32)

        def view(name: str) -> torch.Tensor:
            offset, n, dtype = layout[name]
            return self.step_bytes[offset : offset + n * dtype.itemsize].view(dtype)

        self.header, self.step_rows, self.step_drafts, self.step_cu = view("header"), view("rows"), view("drafts"), view("cu")
        if self.header.numel() != HEADER_WORDS:
            raise ValueError(f"the staging layout's header has {self.header.numel()} words, not {HEADER_WORDS}")
        self.apply_header = self.header[HEADER_NUM_DIFFS:]  # (diffs, table word offset), as the apply kernel reads them
        self.reset_header = self.header[HEADER_NUM_RESETS:]  # (admitted rows, their word offset): the count reset
        self.apply_programs = APPLY_PROGRAMS_CUDA if device.is_cuda else 1
        self.rows = device.full(max_num_reqs, PADDING_ROW, torch.int32)
        self.drafts = device.zeros(max_num_reqs * max(1, max_num_draft_tokens), torch.int32)
        self.mixed_cu = device.zeros(max_num_reqs + 1, torch.int32)
        self.query_start: dict[int, torch.Tensor] = {}
        self.logits_start: dict[int, torch.Tensor] = {}
        self.draft_start: dict[int, torch.Tensor] = {}
        for q in query_lens:
            self.query_start[q] = device.zeros(max_num_reqs + 1, torch.int32)
            self.logits_start[q] = device.zeros(max_num_reqs + 1, torch.int32)
            self.draft_start[q] = device.zeros(max_num_reqs + 1, torch.int32)
        self.fill_offsets()

    def fill_offsets(self) -> None:
        """The per-query-length offsets every bucketed step reads (init phase; eager needs them as much as replay)."""
        index = torch.arange(self.max_num_reqs + 1, dtype=torch.int32)
        for q in self.query_start:
            self.query_start[q].copy_(index * q)
            self.logits_start[q].copy_(index * q)
            self.draft_start[q].copy_(index * (q - 1))
        self.device._stream_waits_for_current()

    def launch_pad(self, size: int, query_len: int) -> None:
        """Launch (inside device work or a capture) the copy of the step buffer's rows/drafts into the padded
        inputs, rows past the header's request count set to -1; a mixed step (``query_len`` `MIXED`) pads its
        query starts instead of drafts."""
        mixed = query_len == MIXED
        launch_pad_step_inputs(header=self.header, rows=self.step_rows, drafts=self.step_drafts, padded_rows=self.rows,
                               padded_drafts=self.drafts, size=size, max_drafts_total=0 if mixed else size * (query_len - 1),
                               cu=self.step_cu if mixed else None, padded_cu=self.mixed_cu if mixed else None)

    def launch_apply(self, arena: torch.Tensor) -> None:
        """Launch (inside device work or a capture) the staged-write apply of the diffs the header names."""
        launch_apply_from_header(arena, self.step_words, self.apply_header, self.apply_programs)


def build_padded_step(runner: Any, inputs: PaddedInputs, key: GraphKey) -> PaddedStep:
    """The launches of a bucketed step for ``key``, bound to the buffers the runner holds *now*.

    ``runner`` is the `runnercheck.impl.runner.ModelRunner` (its input batch, model, sampler, sampling state,
    request state, block table, output ring and limits).
    """
    ib, model, sampler, sampling_state = runner.input_batch, runner.model, runner.sampler, runner.sampling_state
    row_state, prefill, table = runner.state.base, runner.state.prefill_tokens, runner.block_table.base
    num_sampled, row_valid = runner.outputs.num_sampled, runner.outputs.row_valid
    block_size, max_drafts, max_seq_len = runner.block_table.block_size, runner.limits.max_num_draft_tokens, runner.limits.max_model_len
    size, q, num_top, greedy, unfiltered = key.size, key.mode.query_len, key.mode.num_top, key.mode.greedy, key.mode.unfiltered
    num_tokens, num_rows = key.num_tokens, key.num_sampling_rows
    padded_rows, padded_drafts = inputs.rows, inputs.drafts
    if key.mixed:
        # Query lengths vary: the pad kernel writes the starts; one sampling row and no drafts a request.
        cu, logits_start, draft_start = inputs.mixed_cu, inputs.logits_start[1], inputs.draft_start[1]
        max_query_len, known_tokens = min(num_tokens, max_seq_len), 0  # bounds; the kernels read the step's from cu
    else:
        cu, logits_start, draft_start = inputs.query_start[q], inputs.logits_start[q], inputs.draft_start[q]
        max_query_len, known_tokens = q, num_tokens
    draft_prefix = ib.logits_draft_prefix if q > 1 else None
    logits_indices = ib.logits_indices[:num_rows]
    step = PaddedStep(key, [])
    result = step.result
    arena = runner.staged_writes.arena
    outputs = runner.outputs
    # The bucket's padded shape: the host reads the first num_reqs requests of it (`runnercheck.impl.output.decode_output`).
    layout = result["packed"] = OutputLayout.build(size, num_rows, num_top, 0, -1)

    # Looked up on ``inputs`` when they run (not bound here): a test harness may wrap them, then recapture.
    def apply_staged() -> None:
        inputs.launch_apply(arena)

    def reset_counts() -> None:
        sampling_state.launch_reset_from_header(inputs.step_words, inputs.reset_header)

    def pad() -> None:
        inputs.launch_pad(size, q)

    def prepare() -> None:
        launch_prepare_inputs(
            rows=padded_rows, cu=cu, logits_start=logits_start, draft_start=draft_start, drafts=padded_drafts,
            prompt_token_index=padded_rows, row_state=row_state, prefill_tokens=prefill, block_table=table,
            input_ids=ib.input_ids, positions=ib.positions, slot_mapping=ib.slot_mapping,
            query_start_loc=ib.query_start_loc, seq_lens=ib.seq_lens, idx_mapping=ib.idx_mapping,
            block_table_out=ib.block_table, logits_indices=ib.logits_indices, logits_rows=ib.logits_state_rows,
            logits_positions=ib.logits_positions, draft_prefix=ib.logits_draft_prefix,
            num_reqs=size, num_tokens=known_tokens, padded_num_tokens=num_tokens,
            num_sampling_rows=num_rows, num_prompt_rows=0, kv_block_size=block_size, max_drafts=max_drafts,
        )

    def forward() -> None:
        # max_seq_len is a bound, not the step's value: the kernels read the lengths from seq_lens.
        hidden = model.forward(
            ib.input_ids, ib.positions, ib.slot_mapping, ib.query_start_loc, ib.seq_lens, ib.block_table, logits_indices,
            num_reqs=size, num_tokens=num_tokens, max_query_len=max_query_len, max_seq_len=max_seq_len, return_hidden=True,
        )
        result["logits"] = model.compute_logits(hidden)

    def sample() -> None:
        # A greedy mode's real rows all have temperature 0 (its padding rows' tokens are never used, whatever the
        # parameters of the row they read): one read of the logits (`runnercheck.impl.kernels.sampling_greedy`).  An
        # unfiltered mode's real rows have no filter on: the plan launch decides them (padding rows' tokens, again,
        # are never used).
        result["out"] = sampler.sample(result["logits"], sampling_state, ib.logits_state_rows, ib.logits_positions,
                                       num_rows=num_rows, draft_prefix=draft_prefix, max_num_logprobs=num_top,
                                       all_greedy=greedy, unfiltered=unfiltered)

    def post_update() -> None:
        launch_post_update(rows=padded_rows, cu=cu, logits_start=logits_start, draft_start=draft_start, drafts=padded_drafts,
                           sampled=sampler.tokens, row_state=row_state, num_sampled=num_sampled, row_valid=row_valid,
                           num_reqs=size, max_drafts=max_drafts)

    def count_sampled() -> None:
        sampling_state.launch_post_update(ib.logits_state_rows, sampler.tokens, row_valid, num_rows)

    def pack() -> None:
        outputs.pack_results(layout, result)

    # A draft-model proposer's verification (after the sampler) and proposal (after post-update): in the bucket.
    padded_launches = getattr(runner.proposer, "padded_launches", None)
    verify, propose = padded_launches(inputs, key, result, sampler, row_state) if padded_launches else ([], [])
    step.launches += [("apply staged writes", apply_staged), ("reset admitted counts", reset_counts),
                      ("pad step inputs", pad), ("input prep", prepare),
                      ("forward", forward), ("sample", sample), *verify, ("post update", post_update),
                      ("count sampled tokens", count_sampled), ("pack output", pack), *propose]
    return step


__all__ = ["MIXED", "GraphKey", "GraphMode", "PaddedInputs", "PaddedStep", "build_padded_step"]
