"""The input batch: persistent device inputs of one step, and the host plan that fills them.

`StepPlan` (host, numpy, O(scheduled requests)) describes a step in batch order: the state rows,
``query_start_loc``, drafts, where each request's logit rows start, prompt-logprob rows and the
host ints the kernels and the forward need (upper bounds from the host mirror where the device
holds the exact value).  `InputBatch.stage` writes the plan's compact arrays into the step's
staging slot; `InputBatch.enqueue_prepare` enqueues the input-prep kernel, which fills the
persistent buffers from device row state.

Ownership: `InputBatch` owns every buffer below; all live on the device at fixed addresses for
the runner's lifetime (CUDA graphs replay against them), hold one step's contents, and are
written only by the input-prep kernel:

    input_ids, positions, slot_mapping     int64 [max_num_batched_tokens]
    query_start_loc                        int32 [max_num_reqs + 1]
    seq_lens, idx_mapping                  int32 [max_num_reqs]
    block_table                            int32 [max_num_reqs, max_blocks_per_req] (gathered by idx_mapping)
    logits_indices                         int64 [max_logit_rows] (sampling rows, then prompt-logprob rows)
    logits_state_rows                      int32 [max_sampling_rows] (state row of each sampling row)
    logits_positions                       int64 [max_sampling_rows] (noise position of each sampling row)
    logits_draft_prefix                    int32 [max_sampling_rows, max_num_draft_tokens] (drafts before each row)
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from runnercheck.impl import native
from runnercheck.impl.block_table import BlockTable
from runnercheck.impl.buffers import StagingSlot, StagingWriter
from runnercheck.impl.device import Device
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.kernels.input_prep import (HEADER_DIFF_TABLE, HEADER_NUM_DIFFS, HEADER_NUM_DRAFTS, HEADER_NUM_REQS, HEADER_NUM_RESETS,
                                     HEADER_RESET_ROWS, HEADER_WORDS,
                                     launch_prepare_inputs)
from runnercheck.impl.output import PromptLogprobRequest
from runnercheck.impl.state import RequestStateTable
from runnercheck.impl.step_reader import STEP_FIELDS, StepArrays

_staging = native.load("staging")  # `put_words`: the header and compact arrays in one C call; None: numpy only
_plans = native.load("plans")  # `plain_plan`, the C twin of `_plain_plan`; None: Python only
# The header `stage` writes, in word order: the request and draft counts, then the four words filled later (0 now).
if (HEADER_NUM_REQS, HEADER_NUM_DRAFTS, HEADER_WORDS) != (0, 1, 6):
    raise ImportError("runnercheck.impl.input_batch.stage writes the step header in the order of impl.kernels.input_prep's HEADER_*")


@dataclass(slots=True)
class StepPlan:
    """One step in batch order, computed on the host from the schedule and the host mirror."""

    req_ids: tuple[str, ...]
    rows: np.ndarray  # int32 [R]: state row of each request
    cu: np.ndarray  # int32 [R + 1]: query_start_loc
    draft_start: np.ndarray  # int32 [R + 1]
    drafts: np.ndarray  # int32 [D]
    logits_start: np.ndarray  # int32 [R + 1]: request i owns sampling rows [logits_start[i], logits_start[i+1])
    prompt_token_index: np.ndarray  # int32 [P]: batch token index of each prompt-logprob row
    prompt_targets: np.ndarray  # int64 [P]: the next prompt token each row is scored against
    prompt_requests: tuple[PromptLogprobRequest, ...]
    num_logprobs: tuple[int | None, ...]
    num_tokens: int
    max_query_len: int
    max_seq_len: int  # upper bound (host mirror)
    max_num_logprobs: int  # -1: nobody asked this step
    max_num_prompt_logprobs: int  # -1: no prompt-logprob rows this step
    query_lens: np.ndarray  # int64 [R]
    num_drafts: np.ndarray  # int64 [R]
    uniform: tuple[int, int] | None  # (query_len, drafts) shared by every request; None: they differ (or no requests)
    logits_start64: np.ndarray  # int64 copy of ``logits_start`` (what the step's output metadata holds)
    # len(req_ids) and len(prompt_token_index): read several times a step, stored rather than recounted.
    num_reqs: int
    num_prompt_rows: int

    @property
    def num_sampling_rows(self) -> int:
        return int(self.logits_start[-1])


def plan_step(step: StepArrays, state: RequestStateTable, previous: StepPlan | None = None) -> StepPlan:
    """Build the step's plan from its checked arrays (after admission and `apply_cached`, before `advance`).

    Vectorised over the batch; per item only for requests with drafts or prompt logprobs.
    ``previous``: the plan of the last step when ``step`` is steady (`StepArrays.steady`: its
    requests, order and one-token queries): every array of it holds again, so it is reused and only
    the sequence-length bound moves -- unless a live request asks for prompt logprobs (their rows
    depend on positions).
    """
    if previous is not None and step.steady and previous.req_ids is step.req_ids and not state.num_prompt_logprob_rows:
        return _replan(previous, step.max_end)
    if (step.drafts is None and not state.num_logprob_rows and not state.num_prompt_logprob_rows
            and (n := len(step.req_ids)) < len(_COUNTING32)):
        # `_plain_plan` in C (`impl/native/plans.c`) when built: the plan made slot by slot, no Python frame.
        plan = NotImplemented if _plans is None else _plans.plain_plan(_PLAIN_TARGETS, step, _PLAIN.get(n) or _plain_parts(n))
        return _plain_plan(step) if plan is NotImplemented else plan
    return _general_plan(step, state)


def _plain_plan(step: StepArrays) -> StepPlan:
    """`_general_plan` of a step without drafts, logprobs or prompt logprobs (most admitting steps): every part
    besides the step's own arrays is shared by the plans of its request count (`_plain_parts`)."""
    draft_start, logits_start, logits_start64, num_logprobs = _PLAIN.get(len(step.req_ids)) or _plain_parts(len(step.req_ids))
    return StepPlan(  # positional, in field order, as `_general_plan`
        step.req_ids, step.rows.astype(np.int32), step.query_starts, draft_start, _NO_DRAFTS, logits_start, _NO_PROMPT_INDEX,
        _NO_PROMPT_TARGETS, (), num_logprobs, step.num_tokens, step.max_query_len, step.max_end, -1, -1, step.query_lens,
        step.num_drafts, (step.uniform_query_len, 0) if step.uniform_query_len >= 0 else None, logits_start64,
        len(step.req_ids), 0)


def _general_plan(step: StepArrays, state: RequestStateTable) -> StepPlan:
    req_ids, rows, query_lens, starts = step.req_ids, step.rows, step.query_lens, step.starts
    num_reqs = len(req_ids)
    num_drafts = step.num_drafts

    cu = step.query_starts  # summed by the reader's batch check, with the largest query and end
    if step.drafts is None and num_reqs < len(_COUNTING32):
        # No drafts: one sampling row per request, no draft offsets (shared read-only arrays).
        drafts = _NO_DRAFTS
        draft_start, logits_start, logits_start64, _ = _PLAIN.get(num_reqs) or _plain_parts(num_reqs)
    else:
        draft_start = np.zeros(num_reqs + 1, dtype=np.int32)
        logits_start = np.zeros(num_reqs + 1, dtype=np.int32)
        logits_start64 = None
        num_drafts.cumsum(out=draft_start[1:])
        (num_drafts + 1).cumsum(out=logits_start[1:])
        drafts = (_NO_DRAFTS if step.drafts is None else
                  np.fromiter((t for d in step.drafts for t in d), dtype=np.int32, count=int(draft_start[-1])))

    max_num_logprobs, num_logprobs = -1, (None,) * num_reqs
    if state.num_logprob_rows:  # somebody live asked for logprobs
        asked = state.num_logprobs[rows]
        max_num_logprobs = int(asked.max()) if num_reqs else -1
        if max_num_logprobs >= 0:
            num_logprobs = tuple(None if n < 0 else n for n in asked.tolist())

    prompt_requests: list[PromptLogprobRequest] = []
    prompt_index_parts: list[np.ndarray] = []
    prompt_target_parts: list[np.ndarray] = []
    offset = 0
    # Positions p computed this step with p + 1 < prompt_len score prompt token p + 1.
    with_prompt = _NO_ROWS
    if state.num_prompt_logprob_rows:
        prompt_k = state.prompt_logprobs[rows]
        stops = np.minimum(step.ends, state.prompt_len[rows] - 1)
        with_prompt = ((prompt_k >= 0) & (stops > starts)).nonzero()[0].tolist()
    for i in with_prompt:
        first, stop = int(starts[i]), int(stops[i])
        positions = np.arange(first, stop, dtype=np.int64)
        prompt_index_parts.append(cu[i] + positions - first)
        prompt_target_parts.append(state.prefill_tokens_of(int(rows[i]))[first + 1 : stop + 1].astype(np.int64))
        prompt_requests.append(PromptLogprobRequest(req_ids[i], offset, stop - first, int(prompt_k[i])))
        offset += stop - first

    prompt_token_index = np.concatenate(prompt_index_parts).astype(np.int32) if prompt_index_parts else _NO_PROMPT_INDEX
    # Positional, in field order (a keyword call of twenty-one fields costs ~0.5 us a step), as `_replan`.
    return StepPlan(
        req_ids,
        rows.astype(np.int32),  # rows
        cu,
        draft_start,
        drafts,
        logits_start,
        prompt_token_index,
        np.concatenate(prompt_target_parts) if prompt_target_parts else _NO_PROMPT_TARGETS,  # prompt_targets
        tuple(prompt_requests),
        num_logprobs,
        step.num_tokens,
        step.max_query_len,
        step.max_end,  # max_seq_len
        max_num_logprobs,
        max((p.num_top for p in prompt_requests), default=-1) if prompt_requests else -1,  # max_num_prompt_logprobs
        query_lens,
        num_drafts,
        _uniform(query_lens, num_drafts) if step.drafts is not None else  # uniform
        ((step.uniform_query_len, 0) if step.uniform_query_len >= 0 else None),
        logits_start.astype(np.int64) if logits_start64 is None else logits_start64,  # logits_start64
        num_reqs,
        len(prompt_token_index),  # num_prompt_rows
    )


def _replan(p: StepPlan, max_seq_len: int) -> StepPlan:
    return StepPlan(p.req_ids, p.rows, p.cu, p.draft_start, p.drafts, p.logits_start, p.prompt_token_index, p.prompt_targets,
                    p.prompt_requests, p.num_logprobs, p.num_tokens, p.max_query_len, max_seq_len, p.max_num_logprobs,
                    p.max_num_prompt_logprobs, p.query_lens, p.num_drafts, p.uniform, p.logits_start64, p.num_reqs,
                    p.num_prompt_rows)


def _uniform(query_lens: np.ndarray, num_drafts: np.ndarray) -> tuple[int, int] | None:
    """(query length, drafts) shared by every request of a step with drafts (without: `StepArrays.uniform_query_len`)."""
    if not len(query_lens):
        return None
    q, k = int(query_lens[0]), int(num_drafts[0])
    if np.count_nonzero(query_lens != q) or np.count_nonzero(num_drafts != k):
        return None
    return q, k


_NO_DRAFTS = np.zeros(0, np.int32)
# A no-draft plan's draft offsets and logit-row starts: slices of these, shared by every plan (read-only).
_ZEROS32 = np.zeros(4097, np.int32)
_COUNTING32 = np.arange(4097, dtype=np.int32)
_COUNTING64 = np.arange(4097, dtype=np.int64)
for _shared in (_ZEROS32, _COUNTING32, _COUNTING64, _NO_DRAFTS):
    _shared.flags.writeable = False
_NO_ROWS: list[int] = []
# The no-draft plans' shared parts by request count (`_plain_parts`): one set of slices for each count, not one a step.
_PLAIN: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, tuple[None, ...]]] = {}
_NO_PROMPT_INDEX = np.zeros(0, np.int32)
_NO_PROMPT_TARGETS = np.zeros(0, np.int64)
# What ``plain_plan`` takes besides the step and its parts.  It makes a StepPlan without its __init__, which must stay
# the dataclass's own (no __post_init__).
_PLAN_FIELDS = tuple(field.name for field in fields(StepPlan))
if hasattr(StepPlan, "__post_init__") or set(StepPlan.__slots__) != set(_PLAN_FIELDS):
    raise TypeError("StepPlan must stay a slots dataclass whose __init__ only stores its fields (plans.c makes it)")
_PLAIN_TARGETS = (StepPlan, _PLAN_FIELDS, StepArrays, STEP_FIELDS, _NO_DRAFTS, _NO_PROMPT_INDEX, _NO_PROMPT_TARGETS)


def _plain_parts(num_reqs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[None, ...]]:
    """A no-draft plan's draft offsets, logit-row starts (int32, int64) and, with no logprobs asked, logprob counts."""
    parts = _PLAIN[num_reqs] = (_ZEROS32[: num_reqs + 1], _COUNTING32[: num_reqs + 1], _COUNTING64[: num_reqs + 1],
                                (None,) * num_reqs)
    return parts


_NP_DTYPES = {torch.int32: np.int32, torch.int64: np.int64}


@dataclass(frozen=True)
class StagedStepArrays:
    """Device views (inside the step's staging slot, fixed layout, sized for the worst step) of the plan's compact arrays."""

    rows: torch.Tensor
    cu: torch.Tensor
    draft_start: torch.Tensor
    drafts: torch.Tensor
    logits_start: torch.Tensor
    prompt_token_index: torch.Tensor
    prompt_targets: torch.Tensor
    header: torch.Tensor  # the step's counts (`runnercheck.impl.kernels.input_prep.HEADER_WORDS`), read by bucketed steps


class InputBatch:
    """Persistent per-step device inputs (see the module docstring for ownership)."""

    def __init__(self, device: Device, *, max_num_reqs: int, max_num_batched_tokens: int, max_blocks_per_req: int, max_num_draft_tokens: int):
        self.device = device
        self.max_num_reqs = max_num_reqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_draft_tokens = max_num_draft_tokens
        self.max_sampling_rows = max_num_reqs * (1 + max_num_draft_tokens)
        self.max_prompt_rows = max_num_batched_tokens
        self.max_logit_rows = self.max_sampling_rows + self.max_prompt_rows
        t, r = max_num_batched_tokens, max_num_reqs
        self.input_ids = device.zeros(t, torch.int64)
        self.positions = device.zeros(t, torch.int64)
        self.slot_mapping = device.full(t, -1, torch.int64)
        self.query_start_loc = device.zeros(r + 1, torch.int32)
        self.seq_lens = device.zeros(r, torch.int32)
        self.idx_mapping = device.zeros(r, torch.int32)
        self.block_table = device.zeros((r, max_blocks_per_req), torch.int32)
        self.logits_indices = device.zeros(self.max_logit_rows, torch.int64)
        self.logits_state_rows = device.zeros(self.max_sampling_rows, torch.int32)
        self.logits_positions = device.zeros(self.max_sampling_rows, torch.int64)
        self.logits_draft_prefix = device.full((self.max_sampling_rows, max(1, max_num_draft_tokens)), -1, torch.int32)
        self._layout = self.staging_layout(max_num_reqs, max_num_batched_tokens, max_num_draft_tokens)
        # The first word of the header and of each array `stage` writes on every step (`_staging.put_words`).
        self._words = tuple(self._layout[name][0] // 4 for name in ("header", "rows", "cu", "draft_start", "logits_start"))
        # Where each array's region ends (bytes): what a step that writes up to it keeps (`stage`: `trim_reserved`).
        self._ends = {name: offset + n * dtype.itemsize for name, (offset, n, dtype) in self._layout.items()}
        self.staging_bytes = self.staging_bytes_needed(max_num_reqs, max_num_batched_tokens, max_num_draft_tokens)
        self._views_by_slot: dict[int, tuple[dict[str, np.ndarray], StagedStepArrays, StagingSlot]] = {}

    @staticmethod
    def staging_layout(max_num_reqs: int, max_num_batched_tokens: int, max_num_draft_tokens: int) -> dict[str, tuple[int, int, torch.dtype]]:
        """Where each compact per-step array sits at the start of a staging slot: name -> (byte offset, max elements, dtype).

        A fixed layout (16-byte aligned, sized for the worst step), so each slot's device views
        are made once and a step only fills the host side.
        """
        r, t = max_num_reqs, max_num_batched_tokens
        # The header first: a bucketed step's graph reads its counts from it (`runnercheck.impl.graph_step`).
        fields = [("header", HEADER_WORDS, torch.int32), ("rows", r, torch.int32), ("cu", r + 1, torch.int32), ("draft_start", r + 1, torch.int32),
                  ("logits_start", r + 1, torch.int32), ("drafts", r * max(1, max_num_draft_tokens), torch.int32),
                  ("prompt_token_index", t, torch.int32), ("prompt_targets", t, torch.int64)]
        layout, cursor = {}, 0
        for name, n, dtype in fields:
            layout[name] = (cursor, n, dtype)
            cursor += -(-(n * dtype.itemsize) // 16) * 16
        return layout

    @staticmethod
    def staging_bytes_needed(max_num_reqs: int, max_num_batched_tokens: int, max_num_draft_tokens: int) -> int:
        """Bytes of the fixed layout of one step's compact arrays (`staging_layout`)."""
        layout = InputBatch.staging_layout(max_num_reqs, max_num_batched_tokens, max_num_draft_tokens)
        offset, n, dtype = layout["prompt_targets"]
        return offset + -(-(n * dtype.itemsize) // 16) * 16

    def _slot_views(self, slot: StagingSlot) -> tuple[dict[str, np.ndarray], StagedStepArrays]:
        """The host (numpy) and device views of ``slot``'s compact arrays, made on its first use."""
        views = self._views_by_slot.get(slot.index)
        if views is None or views[2] is not slot:
            host_bytes = slot.host.numpy()
            host, dev = {}, {}
            for name, (offset, n, dtype) in self._layout.items():
                nbytes = n * dtype.itemsize
                host[name] = host_bytes[offset : offset + nbytes].view(_NP_DTYPES[dtype])
                dev[name] = slot.device[offset : offset + nbytes].view(dtype)
            views = (host, StagedStepArrays(**dev), slot)
            self._views_by_slot[slot.index] = views
        return views[0], views[1]

    @hot_path
    def stage(self, plan: StepPlan, writer: StagingWriter) -> StagedStepArrays:
        """Write the plan's compact arrays into the reserved start of the step's first staging slot."""
        slot = writer.first_slot(self.staging_bytes)
        host, staged = self._slot_views(slot)
        r = plan.num_reqs
        header = (r, len(plan.drafts), 0, 0, 0, 0)  # HEADER_NUM_REQS, HEADER_NUM_DRAFTS, the diffs' and resets' words
        # A steady step's plan shares its arrays with the last one (`_replan`): a slot that already
        # holds them (they were written there by a step since which nothing was allocated over
        # them: `StagingSlot.kept`) is not written again.
        kept = slot.kept
        fresh = not (type(kept) is tuple and kept[0] is plan.rows and kept[1] is plan.cu and kept[2] is plan.draft_start
                     and kept[3] is plan.logits_start)
        words = self._words
        parts = ((words[0], header), (words[1], plan.rows), (words[2], plan.cu), (words[3], plan.draft_start),
                 (words[4], plan.logits_start)) if fresh else ((words[0], header),)
        if _staging is None or _staging.put_words(slot.host_words, parts) is NotImplemented:
            host["header"][:] = header
            if fresh:
                host["rows"][:r] = plan.rows
                host["cu"][: r + 1] = plan.cu
                host["draft_start"][: r + 1] = plan.draft_start
                host["logits_start"][: r + 1] = plan.logits_start
        if fresh:
            slot.kept, slot.kept_bytes = (plan.rows, plan.cu, plan.draft_start, plan.logits_start), self._ends["logits_start"]
        last = "logits_start"
        if len(plan.drafts):
            host["drafts"][: len(plan.drafts)] = plan.drafts
            last = "drafts"
        p = plan.num_prompt_rows
        if p:
            host["prompt_token_index"][:p] = plan.prompt_token_index
            host["prompt_targets"][:p] = plan.prompt_targets
            last = "prompt_targets"
        # Regions past the last one written are not read this step: the slot's next allocations
        # (the staged diffs) may use their bytes, and the H2D copy stops short of them.
        writer.trim_reserved(self._ends[last])
        return staged

    @hot_path
    def set_header_diffs(self, slot: StagingSlot, num_diffs: int, table_word: int) -> None:
        """Name in ``slot``'s header the staged-write diffs a bucketed step's graph applies (slot still WRITING)."""
        header = self._slot_views(slot)[0]["header"]
        header[HEADER_NUM_DIFFS], header[HEADER_DIFF_TABLE] = num_diffs, table_word

    @hot_path
    def set_header_counts(self, slot: StagingSlot, diffs: tuple[int, int] | None, resets: tuple[int, int] | None) -> None:
        """`set_header_diffs` of ``diffs`` and, when not None, the admitted rows whose penalty counts a bucketed
        step's graph zeroes, ``resets`` = (rows, first word), in one look-up of the header (slot still WRITING)."""
        header = self._slot_views(slot)[0]["header"]
        if diffs is not None:
            header[HEADER_NUM_DIFFS], header[HEADER_DIFF_TABLE] = diffs
        if resets is not None:
            header[HEADER_NUM_RESETS], header[HEADER_RESET_ROWS] = resets

    @hot_path
    def enqueue_prepare(self, plan: StepPlan, staged: StagedStepArrays, state: RequestStateTable, block_table: BlockTable) -> None:
        """Enqueue the input-prep kernel for the step (after the staging slot's H2D and the staged-write applies)."""
        num_reqs, num_tokens = plan.num_reqs, plan.num_tokens
        num_sampling_rows, num_prompt_rows = plan.num_sampling_rows, plan.num_prompt_rows
        row_state, prefill, table = state.base, state.prefill_tokens, block_table.base
        block_size, max_drafts = block_table.block_size, self.max_num_draft_tokens

        def prepare() -> None:
            launch_prepare_inputs(
                rows=staged.rows, cu=staged.cu, logits_start=staged.logits_start, draft_start=staged.draft_start,
                drafts=staged.drafts, prompt_token_index=staged.prompt_token_index,
                row_state=row_state, prefill_tokens=prefill, block_table=table,
                input_ids=self.input_ids, positions=self.positions, slot_mapping=self.slot_mapping,
                query_start_loc=self.query_start_loc, seq_lens=self.seq_lens, idx_mapping=self.idx_mapping,
                block_table_out=self.block_table, logits_indices=self.logits_indices,
                logits_rows=self.logits_state_rows, logits_positions=self.logits_positions,
                draft_prefix=self.logits_draft_prefix,
                num_reqs=num_reqs, num_tokens=num_tokens, padded_num_tokens=num_tokens,
                num_sampling_rows=num_sampling_rows, num_prompt_rows=num_prompt_rows,
                kv_block_size=block_size, max_drafts=max_drafts,
            )

        self.device.enqueue(prepare, "input prep")
