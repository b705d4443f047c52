"""The sampler: docs/SAMPLING.md on the device, in five Triton launches (plus logprobs'); two when the caller knows
no row is filtered (``unfiltered``), one when it knows every row is greedy (``all_greedy``).

`Sampler.sample` is pure device work: it reads only host ints and tensor metadata, launches the
kernels of `runnercheck.impl.kernels.sampling` over ``num_rows`` logit rows (split passes over vocabulary
chunks, per-row combines, the per-row fallback; see that module), the logprobs launches of
`runnercheck.impl.sample.logprobs` when logprobs are asked for, and returns views of persistent output buffers.
Call it inside ``Device.enqueue`` like the rest of a step.

Ownership: a `Sampler` owns, on the device for its lifetime, with persistent addresses (so a CUDA
graph can capture the launches), sized at construction from ``max_num_rows`` (R) and the split
layout (``NB`` chunks per row, ``SLOT`` candidate slots per chunk, ``CAND`` candidates per row, the
first ``layout.cand`` of them used by the split path):

* outputs ``tokens`` (i64 ``[R]``) and ``nan_flags`` (i32 ``[R]``): written by the plan kernel,
  tokens overwritten by the finish and fallback kernels for the rows they decide;
* per-(row, chunk) partials ``part_best`` f32, ``part_token`` i32, ``part_max`` f32, ``part_flag``
  i32, ``part_inf`` i32, ``part_count`` i32 (``[R, NB]``) and ``chunk_slots`` i64 ``[R, NB, SLOT]``:
  written by the split kernels, read by the next combine of the same step;
* per-row plan ``mode`` i32, ``bound`` f32, ``row_max`` f32 (``[R]``): written by the plan kernel
  (``mode`` also by the finish kernel on overflow), read by the later launches of the step; after the
  step's last launch ``bound`` holds each row's kept threshold (the finish and fallback kernels write
  theirs; -inf for a row the plan decided), which processed logprobs read (`ProcessedScores`);
* ``scratch`` i64 ``[R, CAND]``: candidate compaction (finish kernel) and the fallback's gathers;
* the all-greedy launch's per-row accumulators ``greedy_packed`` i64, ``greedy_inf``,
  ``greedy_flag`` and ``greedy_arrivals`` i32 (``[R]``): written only by
  `sampling_greedy.greedy_argmax_kernel`, whose last program per row resets them, so they hold
  their reset values between steps.

Nothing is meaningful between steps.  Its `LogprobsComputer` owns the logprob buffers, its `ProcessedScores` the
processed-score rows.  A step's outputs are valid until the next `sample` call, so the runner
copies them out (one async D2H into a pinned output slot) in the same enqueue.

Per logit row ``i`` the kernel reads the state row ``logit_rows_to_state_rows[i]`` (several logit
rows may share one: drafts), the noise position ``positions[i]`` and, for penalties, the row's
draft prefix ``draft_prefix[i]`` (tokens counted as extra outputs, -1 padded).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from runnercheck.impl.device import Device
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.kernels.launch import launch
from runnercheck.impl.kernels.sampling_greedy import (INF_RESET, PACKED_RESET, greedy_argmax_kernel, greedy_spans,
                                                         greedy_stages)
from runnercheck.impl.kernels.sampling import (
    sampler_block_kernel,
    sampler_finish_kernel,
    sampler_plan_kernel,
    sampler_row_kernel,
    sampler_select_kernel,
    select_group,
)
from runnercheck.impl.sample.logprobs import (LogprobsComputer, LogprobsOutput, SelectionConfig, SplitLayout,
                                               default_selection_config)
from runnercheck.impl.sample.processed import ProcessedScores
from runnercheck.impl.sample.state import SamplingState


class SamplerError(ValueError):
    """Arguments the sampler cannot take (shapes, dtypes, row counts); nothing was launched."""


@dataclass(frozen=True)
class SamplerOutput:
    """Device views for ``num_rows`` rows.

    ``tokens`` i64 ``[N]``; ``nan_flags`` i32 ``[N]`` (1: the raw row held NaN or +inf).  With
    ``max_num_logprobs = K >= 0``: ``logprob`` f32 ``[N]`` and ``rank`` i32 ``[N]`` of the sampled
    token, ``top_ids`` i32 ``[N, K]`` and ``top_logprobs`` f32 ``[N, K]``; otherwise None.
    """

    tokens: torch.Tensor
    nan_flags: torch.Tensor
    logprob: torch.Tensor | None = None
    rank: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None


class Sampler:
    """Samples one token per logit row from a `SamplingState` (see the module docstring)."""

    def __init__(self, device: Device, vocab_size: int, max_logprobs: int = 20, *, max_num_rows: int = 256,
                 candidate_capacity: int | None = None, config: SelectionConfig | None = None,
                 processed_rows: int | None = None):
        if vocab_size < 1 or max_num_rows < 1 or max_logprobs < 0:
            raise SamplerError("need vocab_size >= 1, max_num_rows >= 1 and max_logprobs >= 0")
        self.device = device
        self.vocab_size = vocab_size
        self.max_logprobs = max_logprobs
        self.max_num_rows = max_num_rows
        self.config = config or default_selection_config(device, candidate_capacity)
        self.tokens = device.zeros(max_num_rows, torch.int64)
        self.nan_flags = device.zeros(max_num_rows, torch.int32)
        # (tokens[:n], nan_flags[:n]) per row count n, made once (host objects; at most max_num_rows + 1):
        # slicing the same buffers every eager step costs host time on a GPU host.
        self._row_views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # num_rows -> ((num_blocks, span), pipelined stages), host ints
        self._greedy_launches: dict[int, tuple[tuple[int, int], int]] = {}
        self._select_grids: dict[int, tuple[tuple[int, int], int]] = {}  # num_rows -> (select pass grid, its group)
        self.layout = layout = SplitLayout.of(self.config, vocab_size)
        per_chunk = (max_num_rows, layout.num_blocks)
        self.part_best = device.zeros(per_chunk, torch.float32)
        self.part_token = device.zeros(per_chunk, torch.int32)
        self.part_max = device.zeros(per_chunk, torch.float32)
        self.part_flag = device.zeros(per_chunk, torch.int32)
        self.part_inf = device.zeros(per_chunk, torch.int32)
        self.part_count = device.zeros(per_chunk, torch.int32)
        self.chunk_slots = device.zeros((max_num_rows, layout.num_blocks, layout.slot), torch.int64)
        self.mode = device.zeros(max_num_rows, torch.int32)
        self.bound = device.zeros(max_num_rows, torch.float32)
        self.row_max = device.zeros(max_num_rows, torch.float32)
        self.scratch = device.zeros((max_num_rows, self.config.candidates), torch.int64)
        self._no_drafts = device.full(1, -1, torch.int32)
        self.greedy_packed = device.full(max_num_rows, PACKED_RESET, torch.int64)
        self.greedy_inf = device.full(max_num_rows, INF_RESET, torch.int32)
        self.greedy_flag = device.zeros(max_num_rows, torch.int32)
        self.greedy_arrivals = device.zeros(max_num_rows, torch.int32)
        self.logprobs = LogprobsComputer(device, vocab_size, max_logprobs, max_num_rows, self.config)
        self.processed = ProcessedScores(device, vocab_size, max_num_rows, self.layout.chunk, processed_rows)

    def _check(self, logits: torch.Tensor, state: SamplingState, rows_map: torch.Tensor, positions: torch.Tensor,
               num_rows: int, draft_prefix: torch.Tensor | None, max_num_logprobs: int) -> None:
        if isinstance(num_rows, bool) or not isinstance(num_rows, int) or not 0 <= num_rows <= self.max_num_rows:
            raise SamplerError(f"num_rows={num_rows!r} outside [0, {self.max_num_rows}]")
        if not isinstance(state, SamplingState) or state.vocab_size != self.vocab_size:
            raise SamplerError("state must be a SamplingState over the same vocabulary")
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype != torch.float32:
            raise SamplerError("logits must be a float32 tensor [rows, vocab]")
        if logits.shape[1] != self.vocab_size or logits.stride(1) != 1 or logits.shape[0] < num_rows:
            raise SamplerError(f"logits shape {tuple(logits.shape)} does not cover {num_rows} rows of {self.vocab_size} contiguous columns")
        for name, t, dtypes in (("logit_rows_to_state_rows", rows_map, (torch.int32,)),
                                ("positions", positions, (torch.int64,))):
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] < num_rows or t.dtype not in dtypes:
                raise SamplerError(f"{name} must be a 1-D {dtypes[0]} tensor of at least {num_rows} entries")
        if draft_prefix is not None:
            ok = (isinstance(draft_prefix, torch.Tensor) and draft_prefix.dim() == 2 and draft_prefix.dtype == torch.int32
                  and draft_prefix.shape[0] >= num_rows and draft_prefix.stride(1) == 1)
            if not ok:
                raise SamplerError("draft_prefix must be an int32 tensor [>= num_rows, max_drafts] with contiguous columns")
        if isinstance(max_num_logprobs, bool) or not isinstance(max_num_logprobs, int) or not -1 <= max_num_logprobs <= self.max_logprobs:
            raise SamplerError(f"max_num_logprobs={max_num_logprobs!r} outside [-1, {self.max_logprobs}]")

    def penalty_rows(self, state: SamplingState, draft_prefix: torch.Tensor | None) -> tuple:
        """The kernels' penalty inputs: ``(prompt_mask, its stride, output_counts, its stride, drafts, draft stride,
        num_drafts)``, the draft prefix (or none) in the kernels' form."""
        if draft_prefix is None or draft_prefix.shape[1] == 0:
            drafts, draft_stride, num_drafts = self._no_drafts, 0, 0
        else:
            drafts, draft_stride, num_drafts = draft_prefix, draft_prefix.stride(0), draft_prefix.shape[1]
        return (state.prompt_mask.base, state.prompt_mask.base.stride(0), state.output_counts,
                state.output_counts.stride(0), drafts, draft_stride, num_drafts)

    @hot_path
    def sample(self, logits: torch.Tensor, state: SamplingState, logit_rows_to_state_rows: torch.Tensor,
               positions: torch.Tensor, *, num_rows: int, draft_prefix: torch.Tensor | None = None,
               max_num_logprobs: int = -1, all_greedy: bool = False, unfiltered: bool = False,
               processed_logprobs: bool = False) -> SamplerOutput:
        """Sample rows ``[0, num_rows)`` of ``logits`` (float32 ``[>= num_rows, V]``).

        ``logit_rows_to_state_rows`` int32, ``positions`` int64 (noise positions), both
        ``[>= num_rows]``; ``draft_prefix`` int32 ``[num_rows, max_drafts]`` or None.  Launches
        only; reads no device data on the host.  ``all_greedy``: the caller knows (from its own
        host copy of the parameters) that every row has temperature 0; the rows are then decided
        by one launch that reads the logits once (`sampling_greedy`) instead of the split passes.
        A row that is not greedy would be sampled greedily: the caller must not guess.  ``unfiltered``: the
        caller knows no row has a filter on (top-k, top-p or min-p at temperature > 0; `SamplingParams.filtered`):
        the plan launch decides every row, so the select, finish and fallback launches are skipped (at 256 rows
        of a 151936 vocabulary the select launch alone is ~39k programs that would exit at once).  A filtered row
        would then keep its unfiltered Gumbel-max token: again the caller must not guess.  With ``all_greedy``
        the greedy launch is taken whatever ``unfiltered`` says.
        ``processed_logprobs``: some row's state row may ask for processed logprobs (the caller's host
        mirror says a live request does); the logprobs then run on `ProcessedScores`' rows (raw rows copied
        as they are), else straight on ``logits`` (all raw: no extra pass).
        """
        self._check(logits, state, logit_rows_to_state_rows, positions, num_rows, draft_prefix, max_num_logprobs)
        for name, flag in (("all_greedy", all_greedy), ("unfiltered", unfiltered),
                           ("processed_logprobs", processed_logprobs)):
            if not isinstance(flag, bool):
                raise SamplerError(f"{name} must be a bool, not {flag!r}")
        views = self._row_views.get(num_rows)
        if views is None:
            views = self._row_views[num_rows] = (self.tokens[:num_rows], self.nan_flags[:num_rows])
        tokens, flags = views
        if num_rows == 0:
            return SamplerOutput(tokens, flags)
        c, lay = self.config, self.layout
        # The interface's table of sampling fields, in its order: (temperature, the filters), the penalties.  The
        # kernels take them positionally in that order (a new field of the table is a new kernel argument there).
        params, penalties = state.kernel_params()
        penalty_rows = self.penalty_rows(state, draft_prefix)
        split = (num_rows, lay.num_blocks)
        if all_greedy:
            shape = self._greedy_launches.get(num_rows)
            if shape is None:
                spans = greedy_spans(self.vocab_size, num_rows, c.greedy_sub, c.greedy_programs)
                stages = greedy_stages(spans[1], c.greedy_sub, c.greedy_stages)
                shape = self._greedy_launches[num_rows] = (spans, stages)
            spans, stages = shape
            launch(greedy_argmax_kernel, (num_rows, spans[0]),
                logits, logits.stride(0), logit_rows_to_state_rows, *penalties, *penalty_rows, self.greedy_packed,
                self.greedy_inf, self.greedy_flag, self.greedy_arrivals, tokens, flags, *spans,
                self.vocab_size, SUB=c.greedy_sub, STAGES=stages, num_warps=c.greedy_warps)
            return self._with_logprobs(logits, tokens, flags, num_rows, max_num_logprobs,
                                       (state, logit_rows_to_state_rows, penalty_rows) if processed_logprobs else None)
        launch(sampler_block_kernel, split,
            logits, logits.stride(0), logit_rows_to_state_rows, positions, *params, *penalties, state.seed.base,
            *penalty_rows, self.part_best, self.part_token, self.part_max, self.part_flag, self.part_inf,
            lay.num_blocks, self.vocab_size, CHUNK=lay.chunk, num_warps=c.block_num_warps,
            maxnreg=c.block_maxnreg or None)
        launch(sampler_plan_kernel, (num_rows,),
            logit_rows_to_state_rows, *params, self.part_best, self.part_token, self.part_max, self.part_flag,
            self.part_inf, lay.num_blocks, self.mode, self.bound, self.row_max, tokens, flags, self.vocab_size,
            NB_P2=lay.nb_p2, CAND=lay.cand, COLS=lay.cols, num_warps=4)
        if not unfiltered:
            self._filter_launches(logits, state, logit_rows_to_state_rows, positions, num_rows, params, penalties,
                                  penalty_rows, tokens, flags)
        return self._with_logprobs(logits, tokens, flags, num_rows, max_num_logprobs,
                                   (state, logit_rows_to_state_rows, penalty_rows) if processed_logprobs else None)

    def _filter_launches(self, logits: torch.Tensor, state: SamplingState, logit_rows_to_state_rows: torch.Tensor,
                         positions: torch.Tensor, num_rows: int, params: tuple, penalties: tuple, penalty_rows: tuple,
                         tokens: torch.Tensor, flags: torch.Tensor) -> None:
        """The launches after the plan, for the rows it left open (filtered rows; the others exit at once)."""
        c, lay = self.config, self.layout
        select = self._select_grids.get(num_rows)
        if select is None:
            group = select_group(num_rows, lay.num_blocks, c.select_programs) if c.select_programs else 1
            select = self._select_grids[num_rows] = ((num_rows, -(-lay.num_blocks // group)), group)
        grid, group = select
        launch(sampler_select_kernel, grid,
            logits, logits.stride(0), logit_rows_to_state_rows, positions, state.temperature.base, *penalties,
            state.seed.base, *penalty_rows, self.mode, self.bound, self.part_best, self.part_token,
            self.part_max, self.part_count, self.chunk_slots, lay.num_blocks, group, self.vocab_size,
            CHUNK=lay.chunk, SLOT=lay.slot, GROUPED=group > 1, num_warps=c.split_warps)
        launch(sampler_finish_kernel, (num_rows,),
            logit_rows_to_state_rows, positions, *params, state.seed.base, self.mode, self.row_max,
            self.part_best, self.part_token, self.part_count, self.chunk_slots, self.scratch, lay.num_blocks,
            tokens, self.bound, self.vocab_size, NB_P2=lay.nb_p2, SCRATCH=c.candidates, CAND=lay.cand, SLOT=lay.slot,
            GROUP=lay.group, COLS=lay.cols, num_warps=c.num_warps)
        launch(sampler_row_kernel, (num_rows,),
            logits, logits.stride(0), logit_rows_to_state_rows, positions, *params, *penalties, state.seed.base,
            *penalty_rows, self.scratch, self.mode, tokens, flags, self.bound, self.vocab_size,
            BLOCK=c.block, NARROW_BLOCK=c.narrow_block, CAND=c.candidates,
            NPIV=c.pivots, MAX_PASSES=c.max_passes, num_warps=c.num_warps)

    def _with_logprobs(self, logits: torch.Tensor, tokens: torch.Tensor, flags: torch.Tensor, num_rows: int,
                       max_num_logprobs: int, processed: tuple | None) -> SamplerOutput:
        if max_num_logprobs < 0:
            return SamplerOutput(tokens, flags)
        lp = self.score_tokens(logits, tokens, num_rows, max_num_logprobs, processed)
        return SamplerOutput(tokens, flags, lp.logprob, lp.rank, lp.top_ids, lp.top_logprobs)

    @hot_path
    def score_tokens(self, logits: torch.Tensor, tokens: torch.Tensor, num_rows: int, num_top: int,
                     processed: tuple | None = None) -> LogprobsOutput:
        """Logprobs of ``tokens`` (launches only) into this sampler's logprob buffers: on the raw ``logits``, or
        with ``processed = (state, logit_rows_to_state_rows, penalty_rows)`` of this step's `sample` call, on the
        processed scores of the rows that ask for them (`ProcessedScores`; the kept thresholds are the ones
        this step's sampling left in ``bound``).  The draft model's verification re-scores its tokens here."""
        if processed is None:
            return self.logprobs.launch(logits, tokens, num_rows, num_top)
        state, rows_map, penalty_rows = processed
        return self.processed.launch(logits, state, rows_map, penalty_rows, self.bound, tokens, num_rows, num_top,
                                     self.logprobs)
