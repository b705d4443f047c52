"""The bucketed (padded) decode step: its persistent inputs and its device work, ready to capture.

A *bucketed* step is a uniform decode batch (every request scheduled ``query_len = 1 + k`` tokens
with exactly ``k`` drafts) padded from ``num_reqs`` up to a capture size ``size``.  Its device work
is input prep -> forward -> sampler (logprobs included when the mode asks) -> post-update ->
penalty-count update, with every shape taken from the bucket (``size``, ``query_len``, the mode's
top-n) and every varying fact read from device tensors, so one recording serves every batch of
its bucket.  `build_padded_step` binds those launches to the persistent buffers *when it is
called*: `impl.graphs.CudaGraphManager` calls it once per (size, mode) at capture and replays the
result; eager execution calls it again every step, so a buffer re-allocated after capture shows
up as a difference between the two, on CPU too.

Padding: rows ``[num_reqs, size)`` are -1 (`impl.kernels.input_prep.PADDING_ROW`): the input-prep
and post-update kernels give such a request token 0 at slot -1 (no KV write), read sampling
parameters from a dummy row, and write no row state, no penalty counts, no ``num_sampled`` of a
live request and nothing the output pack copies.

Ownership: `PaddedInputs` owns, on the device, for the runner's lifetime, at fixed addresses:

    rows            int32 [max_num_reqs]                 real state rows then -1; written by the pad kernel each bucketed step
    drafts          int32 [max_num_reqs * max(1, D)]     the step's drafts; written by the pad kernel each bucketed step
    query_start[q], logits_start[q], draft_start[q]
                    int32 [max_num_reqs + 1] per query length q: i*q, i*q, i*(q-1); written once, at init

The other buffers a step binds belong to their owners (input batch, model, sampler, sampling
state, request state, output ring) and keep their documented writers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from impl.device import Device
from impl.hotpath import hot_path
from impl.kernels.input_prep import PADDING_ROW, launch_pad_step_inputs, launch_prepare_inputs
from impl.kernels.post_update import launch_post_update


@dataclass(frozen=True)
class GraphMode:
    """What a graph was captured for besides its size: tokens per request and top-n logprobs (-1: none)."""

    query_len: int
    num_top: int

    def describe(self) -> str:
        return f"q{self.query_len}" + (f"-lp{self.num_top}" if self.num_top >= 0 else "")


@dataclass(frozen=True)
class GraphKey:
    size: int
    mode: GraphMode

    def describe(self) -> str:
        return f"{self.size}x{self.mode.describe()}"


@dataclass
class PaddedStep:
    """The launches of one bucketed step, in stream order, and the dict the sampler output lands in."""

    key: GraphKey
    launches: list[tuple[str, Callable[[], None]]]
    result: dict[str, Any] = field(default_factory=dict)


class PaddedInputs:
    """Persistent inputs of bucketed steps (see the module docstring for ownership)."""

    def __init__(self, device: Device, max_num_reqs: int, max_num_draft_tokens: int, query_lens: tuple[int, ...]):
        self.device = device
        self.max_num_reqs = max_num_reqs
        self.rows = device.full(max_num_reqs, PADDING_ROW, torch.int32)
        self.drafts = device.zeros(max_num_reqs * max(1, max_num_draft_tokens), torch.int32)
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

    @hot_path
    def enqueue_pad(self, rows: torch.Tensor, drafts: torch.Tensor, num_reqs: int, num_drafts: int, size: int) -> None:
        """Enqueue the copy of a step's staged rows/drafts into these buffers, rows past ``num_reqs`` set to -1."""
        padded_rows, padded_drafts = self.rows, self.drafts

        def pad() -> None:
            launch_pad_step_inputs(rows=rows, drafts=drafts, padded_rows=padded_rows, padded_drafts=padded_drafts,
                                   num_reqs=num_reqs, num_drafts=num_drafts, size=size)

        self.device.enqueue(pad, "pad step inputs")


def build_padded_step(runner: Any, inputs: PaddedInputs, key: GraphKey) -> PaddedStep:
    """The launches of a bucketed step for ``key``, bound to the buffers the runner holds *now*.

    ``runner`` is the `impl.runner.ModelRunner` (its input batch, model, sampler, sampling state,
    request state, block table, output ring and limits).
    """
    ib, model, sampler, sampling_state = runner.input_batch, runner.model, runner.sampler, runner.sampling_state
    row_state, prefill, table = runner.state.base, runner.state.prefill_tokens, runner.block_table.base
    num_sampled, row_valid = runner.outputs.num_sampled, runner.outputs.row_valid
    block_size, max_drafts, max_seq_len = runner.block_table.block_size, runner.limits.max_num_draft_tokens, runner.limits.max_model_len
    size, q, num_top = key.size, key.mode.query_len, key.mode.num_top
    num_tokens = size * q
    padded_rows, padded_drafts = inputs.rows, inputs.drafts
    cu, logits_start, draft_start = inputs.query_start[q], inputs.logits_start[q], inputs.draft_start[q]
    draft_prefix = ib.logits_draft_prefix if q > 1 else None
    logits_indices = ib.logits_indices[:num_tokens]
    step = PaddedStep(key, [])
    result = step.result

    def prepare() -> None:
        launch_prepare_inputs(
            rows=padded_rows, cu=cu, logits_start=logits_start, draft_start=draft_start, drafts=padded_drafts,
            prompt_token_index=padded_rows, row_state=row_state, prefill_tokens=prefill, block_table=table,
            input_ids=ib.input_ids, positions=ib.positions, slot_mapping=ib.slot_mapping,
            query_start_loc=ib.query_start_loc, seq_lens=ib.seq_lens, idx_mapping=ib.idx_mapping,
            block_table_out=ib.block_table, logits_indices=ib.logits_indices, logits_rows=ib.logits_state_rows,
            logits_positions=ib.logits_positions, draft_prefix=ib.logits_draft_prefix,
            num_reqs=size, num_tokens=num_tokens, padded_num_tokens=num_tokens,
            num_sampling_rows=num_tokens, num_prompt_rows=0, kv_block_size=block_size, max_drafts=max_drafts,
        )

    def forward() -> None:
        # max_seq_len is a bound, not the step's value: the kernels read the lengths from seq_lens.
        hidden = model.forward(
            ib.input_ids, ib.positions, ib.slot_mapping, ib.query_start_loc, ib.seq_lens, ib.block_table, logits_indices,
            num_reqs=size, num_tokens=num_tokens, max_query_len=q, max_seq_len=max_seq_len, return_hidden=True,
        )
        result["logits"] = model.compute_logits(hidden)

    def sample() -> None:
        result["out"] = sampler.sample(result["logits"], sampling_state, ib.logits_state_rows, ib.logits_positions,
                                       num_rows=num_tokens, draft_prefix=draft_prefix, max_num_logprobs=num_top)

    def post_update() -> None:
        launch_post_update(rows=padded_rows, cu=cu, logits_start=logits_start, draft_start=draft_start, drafts=padded_drafts,
                           sampled=sampler.tokens, row_state=row_state, num_sampled=num_sampled, row_valid=row_valid,
                           num_reqs=size, max_drafts=max_drafts)

    def count_sampled() -> None:
        sampling_state.launch_post_update(ib.logits_state_rows, sampler.tokens, row_valid, num_tokens)

    step.launches += [("input prep", prepare), ("forward", forward), ("sample", sample), ("post update", post_update),
                      ("count sampled tokens", count_sampled)]
    return step


__all__ = ["GraphKey", "GraphMode", "PaddedInputs", "PaddedStep", "build_padded_step"]
