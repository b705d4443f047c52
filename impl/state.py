"""The request-state table: stable rows, the host mirror, and per-row persistent device state.

A request lives in one *row* from admission until it finishes or is preempted.  Preemption frees
the row exactly like a finish; a resumed request is admitted again as a new request (new row, new
generation number), its prefill being its prompt plus the outputs it already produced.

Tensors (owner: `RequestStateTable`; the four questions for each)
------------------------------------------------------------------
``row_state`` -- a `StagedWriteTensor` ``[max_num_reqs, NUM_ROW_FIELDS]`` int32 (in the runner's
    `StagedWriteGroup` when one is given), on the device, for
    the table's lifetime; a row's cells are meaningful from its admission to its release.  Columns:

    * ``NUM_COMPUTED``: tokens whose KV is in the cache;
    * ``NUM_TOKENS``: every token the device knows, including the last sampled token that lives
      only on the device (so a decode computes position ``NUM_TOKENS - 1``);
    * ``PROMPT_LEN``: the user's prompt (penalties and prompt logprobs count only these);
    * ``PREFILL_LEN``: what the runner was given at admission (prompt, plus outputs on resume);
    * ``LAST_TOKEN``: the last sampled token.

    Writers, device kernels only: the staged-write apply kernel at admission (all columns) and
    the post-update kernel after sampling (``NUM_COMPUTED``, ``NUM_TOKENS``, ``LAST_TOKEN``).  The
    device count is the authority; the host never reads it.
``prefill_tokens`` -- pinned host ``[max_num_reqs, max_model_len]`` int32, for the table's
    lifetime.  Written by the host only, at admission, into the admitted row; read by the
    input-prep kernel over UVA on CUDA (a plain host tensor on cpu/sim).
Host-only state: row <-> request id, generation numbers, the last planned batch (its ids, rows and counts:
``batch_hint``, cleared by every admission and release), the quarantine's (`RowQuarantine`: the free list, the
last-use step of each row, the rows still prefilling and each row's last reading step once it is over), and the
host mirror -- numpy arrays
``[max_num_reqs]`` indexed by row, owned by the table, written only by its own methods (admission,
release, `apply_cached`, `append_blocks`, `advance`), each vectorised over the step's rows:

    num_tokens, num_computed     upper bounds of the device's NUM_TOKENS / NUM_COMPUTED
    num_blocks                   KV blocks the request holds (exact; the block table's columns in use)
    unconfirmed_drafts           drafts scheduled whose acceptance the host has not learned: the
                                 device counts may sit up to this many tokens below the bounds
    generation                   admission number of the row's request (-1: free)
    prompt_len                   the user's prompt length
    num_logprobs                 top logprobs asked for (-1: none)
    prompt_logprobs              top prompt logprobs asked for (-1: none, or a resumed request)

and counts over the live rows: those asking for logprobs, for prompt logprobs, and those sampling with
temperature > 0 (``num_random_rows``: `all_greedy`) and those sampling with a filter on (``num_filtered_rows``:
`unfiltered`), moved at admission and release.

The free list with its quarantine (when a freed row may be taken again: in-flight steps may still read its
pinned prefill tokens) is `runnercheck.impl.quarantine.RowQuarantine`, a base of the table; an admission's staging
into the block table and the sampling state is handed over by `runnercheck.impl.admission.AdmissionWriters`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np
import torch

from runnercheck.impl import native
from runnercheck.impl.buffers import StagingWriter
from runnercheck.impl.staged_writes import StagedWriteGroup, StagedWriteTensor
from runnercheck.impl.device import Device
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.interface import CachedRequests, LiveRequest, NewRequest, SamplingParams
from runnercheck.impl.quarantine import RowQuarantine
from runnercheck.impl.seeds import request_seed

if TYPE_CHECKING:
    from runnercheck.impl.admission import AdmissionWriters

# `advance_decode`, `append_counts`, `admit_request`, `admit_staged`, `release_request`, `end_prefill_reads`, `admit_row`
# and `swap_row`: the C twins of `advance`'s no-draft update, `append_blocks`, `admit`'s and `release`'s writes
# (`_admit_reference`, `_release_reference`), `admit_staged`'s, `_end_prefill_reads` and of the mirror writes inside
# those references (`impl/native/rows.c`); None: Python only.
_rows = native.load("rows")

_RELEASED_VALUES = (-1, -1, -1)  # a free row: no generation, no logprobs asked (`RequestStateTable.release`)

NUM_COMPUTED = 0
NUM_TOKENS = 1
PROMPT_LEN = 2
PREFILL_LEN = 3
LAST_TOKEN = 4
NUM_ROW_FIELDS = 5


class RowStateError(RuntimeError):
    """Internal misuse of the table (freeing an unknown request, admitting a live id)."""


@dataclass(slots=True)
class RowInfo:
    """Host-side facts about the request in one row that the arrays do not hold (written at admission)."""

    req_id: str
    generation: int
    params: SamplingParams
    seed: int
    prompt_len: int
    prefill_len: int
    is_resumed: bool


class RequestStateTable(RowQuarantine):
    """Rows, generation numbers, the host mirror, per-row device state; the free list with its quarantine from its
    base (`RowQuarantine`, which owns no tensor).

    See the module docstring for the ownership of every tensor and array.
    """

    def __init__(self, device: Device, max_num_reqs: int = 1024, max_model_len: int = 2048,
                 group: StagedWriteGroup | None = None):
        if max_num_reqs < 1 or max_model_len < 1:
            raise ValueError(f"need max_num_reqs >= 1 and max_model_len >= 1, got {max_num_reqs}, {max_model_len}")
        RowQuarantine.__init__(self, device, max_num_reqs)  # the free list, its markers and the prefill reads
        self.device = device
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.row_state = StagedWriteTensor(device, (max_num_reqs, NUM_ROW_FIELDS), torch.int32, "row_state", group=group)
        self.prefill_tokens = device.pinned((max_num_reqs, max_model_len), torch.int32)
        self.prefill_tokens.zero_()
        self._prefill_np = self.prefill_tokens.numpy()

        r = max_num_reqs
        self.num_tokens = np.zeros(r, np.int64)
        self.num_computed = np.zeros(r, np.int64)
        self.num_blocks = np.zeros(r, np.int64)
        self.unconfirmed_drafts = np.zeros(r, np.int64)
        self.generation = np.full(r, -1, np.int64)
        self.prompt_len = np.zeros(r, np.int64)
        self.num_logprobs = np.full(r, -1, np.int64)
        self.prompt_logprobs = np.full(r, -1, np.int64)
        # What an admission writes into its row, in the order `admit` gives the values.
        self._admitted_columns = (self.num_tokens, self.num_computed, self.num_blocks, self.unconfirmed_drafts,
                                  self.prompt_len, self.num_logprobs, self.prompt_logprobs, self.generation)
        # What a release writes into its row (`_RELEASED_VALUES`), in that order.
        self._released_columns = (self.generation, self.num_logprobs, self.prompt_logprobs)
        self.num_logprob_rows = 0  # live rows asking for logprobs / prompt logprobs (plans skip both when 0)
        self.num_prompt_logprob_rows = 0
        # Live rows whose request samples with temperature > 0 (`all_greedy`), counted from the host's own copy of each
        # request's parameters at admission and release.
        self.num_random_rows = 0
        # Live rows whose request samples with a filter on (`SamplingParams.filtered`: `unfiltered`), counted alike.
        self.num_filtered_rows = 0

        self.req_to_row: dict[str, int] = {}
        self.rows: list[RowInfo | None] = [None] * max_num_reqs
        self._next_generation = 0
        # The rows of the last planned batch, so `advance` need not look its ids up again (and the reader's
        # `batch_hint`).  Any admission or release clears it, so it never names a row that changed hands.
        self._planned: tuple[Sequence[str], np.ndarray, np.ndarray, np.ndarray] | None = None
        # What `admit`'s C twin writes into (`admit_request`): objects this table holds for its lifetime.
        self._admit_targets = (NewRequest, self._prefill_np, self._admitted_columns, self._prefilling, self.rows, RowInfo,
                               self.req_to_row)
        self._release_targets = (self.req_to_row, self.rows, self._released_columns, _RELEASED_VALUES, self._prefilling,
                                 self._reads_over, self._free.append)

    # ------------------------------------------------------------------ queries
    @property
    def num_live(self) -> int:
        return len(self.req_to_row)

    @property
    def all_greedy(self) -> bool:
        """Whether every live request has temperature 0 (so every row of a step does): the sampler may then take its
        all-greedy launch (`runnercheck.impl.sample.Sampler.sample`, ``all_greedy``), which gives every greedy row the
        token the split passes give it -- penalties, draft prefixes, logprobs and the non-finite rule included, the
        filters being off at temperature 0 (docs/SAMPLING.md step 2).  Conservative: a batch of greedy rows next to
        a live request with temperature > 0 that this step does not schedule takes the split passes (same tokens).
        O(1): a count kept at admission and release, never a read of the device's parameters."""
        return self.num_random_rows == 0

    @property
    def unfiltered(self) -> bool:
        """Whether no live request samples with a filter (`runnercheck.impl.interface.SamplingParams.filtered`: top-k,
        top-p or min-p at a temperature above 0): the sampler may then stop after its plan launch, which decides every
        unfiltered row (`runnercheck.impl.sample.Sampler.sample`, ``unfiltered``), skipping the filter launches.
        Conservative as `all_greedy` is, and O(1): a count kept at admission and release."""
        return self.num_filtered_rows == 0

    @property
    def live(self) -> dict[str, LiveRequest]:
        """A snapshot of the mirror as `LiveRequest` s (for inspection and the per-request validator; not hot)."""
        return {rid: LiveRequest(int(self.num_tokens[row]), int(self.num_computed[row]), int(self.num_blocks[row]))
                for rid, row in self.req_to_row.items()}

    @property
    def batch_hint(self) -> tuple[tuple[str, ...], np.ndarray] | None:
        """The last planned batch's ids and rows while every one of its ids still holds that row (None after any
        admission or release): the reader finds a cached request's row there without a look-up (`runnercheck.impl.native`
        read_cached)."""
        planned = self._planned
        return planned[:2] if planned is not None and type(planned[0]) is tuple else None

    def row_of(self, req_id: str) -> int:
        return self.req_to_row[req_id]

    def info(self, req_id: str) -> RowInfo:
        return self.rows[self.req_to_row[req_id]]

    def generation_of(self, req_id: str) -> int:
        return self.info(req_id).generation

    def mirror_for(self, sched: object) -> dict[str, LiveRequest]:
        """The mirror as the per-request validator sees it, corrected for draft rejections the scheduler reports.

        A scheduler that learned that drafts were rejected lowers ``num_computed_tokens``; rejection
        lowers the known length by the same amount, so both upper bounds move down together (never
        by more than the drafts still unconfirmed).  Pure, and only used to diagnose a bad step.
        """
        view = self.live
        cached = getattr(sched, "cached_requests", None)
        # Any step, even a malformed one (the validator then names what is wrong): read what can be read.
        if type(cached) is not CachedRequests or type(cached.req_ids) is not tuple or type(cached.num_computed_tokens) is not tuple:
            return view
        for rid, computed in zip(cached.req_ids, cached.num_computed_tokens):
            row = self.req_to_row.get(rid) if isinstance(rid, str) else None
            if row is None or not isinstance(computed, int) or isinstance(computed, bool):
                continue
            shift = int(self.num_computed[row]) - computed
            if 0 < shift <= self.unconfirmed_drafts[row]:
                lr = view[rid]
                view[rid] = LiveRequest(lr.num_tokens - shift, lr.num_computed_upper - shift, lr.num_blocks)
        return view

    # ------------------------------------------------------------------ commits
    @hot_path
    def release(self, req_id: str) -> int:
        """Free a finished or preempted request's row (it stays quarantined until its last use completes)."""
        # The look-ups, the record, the mirror's row, the reads noted and the free list: one C call when built.
        row = self.req_to_row.get(req_id)
        params = None if row is None else self.rows[row].params  # read before the release clears the row
        got = NotImplemented if _rows is None else _rows.release_request(self._release_targets, req_id, self._batch_event,
                                                                          self.history_reads)
        if got is NotImplemented:
            got = self._release_reference(req_id)
        if params is not None and params.temperature != 0:
            self.num_random_rows -= 1
            self.num_filtered_rows -= params.filtered
        self._planned = None
        if got[1]:  # the counts move only for a request that asked (the usual one did not)
            self.num_logprob_rows -= 1
        if got[2]:
            self.num_prompt_logprob_rows -= 1
        return got[0]

    def _release_reference(self, req_id: str) -> tuple[int, bool, bool]:
        """`release`'s writes (the reference of ``release_request`` in impl/native/rows.c).  Returns the row and whether
        its request asked for logprobs and for prompt logprobs."""
        row = self.req_to_row.pop(req_id, None)
        if row is None:
            raise RowStateError(f"release of {req_id!r}, which holds no row")
        self.rows[row] = None
        # The mirror's row freed (`_released_columns`), the logprob asks it held read back: one C call when built.
        held = None if _rows is None else _rows.swap_row(row, self._released_columns, _RELEASED_VALUES)
        if held is None or held is NotImplemented:
            held = (int(self.generation[row]), int(self.num_logprobs[row]), int(self.prompt_logprobs[row]))
            self.generation[row] = self.num_logprobs[row] = self.prompt_logprobs[row] = -1
        was_prefilling = self._prefilling.pop(row, None) is not None  # a freed row prefills nothing, proposer or not
        if self.history_reads or was_prefilling:
            self._reads_over[row] = self._batch_event  # the newest marked step may have read it
        self._free.append(row)
        return row, held[1] >= 0, held[2] >= 0

    def admit(self, req: NewRequest, seed: int) -> int:
        """Give `req` a row: write its prefill tokens (pinned) and stage its row-state diffs."""
        row = self._take_row(req.req_id)
        self._admit_into(req, seed, row)
        return row

    def _admit_into(self, req: NewRequest, seed: int, row: int) -> None:
        generation = self._next_generation
        # The row's tokens, mirror, RowInfo and look-ups: one C call when `runnercheck.impl.native` built it (`admit_request`).
        got = NotImplemented if _rows is None else _rows.admit_request(self._admit_targets, req, seed, row, generation)
        if got is NotImplemented:
            got = self._admit_reference(req, seed, row, generation)
        self.row_state.stage_list(row, got[0])
        self._count_admission(got)
        self._count_sampling(req.sampling_params)

    @hot_path
    def admit_staged(self, req: NewRequest, base_seed: int, writers: AdmissionWriters, seeds: dict[str, int]) -> int:
        """`admit` with the rest of a runner's admission: the request's seed (`runnercheck.impl.seeds.request_seed`, noted in
        ``seeds`` under its id), its block list (`BlockTable.assign`) and its sampling record
        (`SamplingState.add_request`, the request checked at the boundary).  One C call when `runnercheck.impl.native` built it
        (`admit_staged` in impl/native/rows.c, which stages into those owners' pending diffs and records as their own
        methods do), else `admit`'s writes and those methods: the reference."""
        row = self._take_row(req.req_id)
        generation = self._next_generation
        got = NotImplemented if writers.derive is None else _rows.admit_staged(
            self._admit_targets, writers.targets, req, base_seed, writers.derive, row, generation, seeds)
        if got is NotImplemented:
            seed = request_seed(req.sampling_params, req.req_id, base_seed)
            self._admit_into(req, seed, row)  # counts a random row itself
            writers.block_table.assign(row, req.block_ids)
            writers.sampling_state.add_request(row, req.sampling_params, seed, req.prompt_token_ids,
                                               req.output_token_ids, checked=True)
            seeds[req.req_id] = seed
            return row
        if got[1] or got[2]:
            self._count_admission(got)
        else:  # `_count_admission` of the usual request (no logprobs asked), without its frame
            self._next_generation = generation + 1
        self._count_sampling(req.sampling_params)
        return row

    def _count_sampling(self, params: SamplingParams) -> None:
        """An admitted request's part of `all_greedy`'s and `unfiltered`'s counts."""
        if params.temperature != 0:
            self.num_random_rows += 1
            self.num_filtered_rows += params.filtered

    def _count_admission(self, got: tuple[list[int], bool, bool]) -> None:
        self._next_generation += 1
        if got[1]:  # the counts move only for a request that asked (the usual one did not)
            self.num_logprob_rows += 1
        if got[2]:
            self.num_prompt_logprob_rows += 1

    def _take_row(self, req_id: str) -> int:
        """The row an admission of ``req_id`` takes (out of the free list), before anything is written."""
        if req_id in self.req_to_row:
            raise RowStateError(f"admit of {req_id!r}, which is already live")
        free = self._free
        # The oldest free row when its last reading step is known over -- `is_quarantined`'s first answer, asked
        # here without its frames (the usual admission); any other case goes through `_take_free_row`.
        if free and self._ask_newest_first and ((over := self._reads_over[free[0]]) is None or over.known_complete()):
            row = free.popleft()
        else:
            row = self._take_free_row(req_id)
        self._planned = None
        return row

    def _admit_reference(self, req: NewRequest, seed: int, row: int, generation: int) -> tuple[list[int], bool, bool]:
        """`admit`'s writes into ``row`` (the reference of ``admit_request`` in impl/native/rows.c): its prefill tokens,
        the mirror's row, its `RowInfo`, ``_prefilling`` and ``req_to_row``.  Returns the row-state values to stage and
        whether the request asks for logprobs and for prompt logprobs."""
        prefill = req.prefill_token_ids
        prompt_len, prefill_len = len(req.prompt_token_ids), len(prefill)
        hit = req.num_computed_tokens  # prefix-cache hit: the first step computes from there
        params = req.sampling_params
        num_logprobs = -1 if params.logprobs is None else params.logprobs
        prompt_logprobs = -1 if params.prompt_logprobs is None or req.is_resumed else params.prompt_logprobs
        # The mirror's row, in `_admitted_columns` order: one C call when `runnercheck.impl.native` built it.
        values = (prefill_len, hit, len(req.block_ids), 0, prompt_len, num_logprobs, prompt_logprobs, generation)
        if _rows is None or _rows.admit_row(self._prefill_np, row, prefill, self._admitted_columns, values) is NotImplemented:
            self._prefill_np[row, :prefill_len] = prefill
            for column, value in zip(self._admitted_columns, values):
                column[row] = value
        self._prefilling[row] = prefill_len
        self.rows[row] = RowInfo(req.req_id, generation, params, seed, prompt_len, prefill_len, req.is_resumed)
        self.req_to_row[req.req_id] = row
        return [hit, prefill_len, prompt_len, prefill_len, prefill[-1]], num_logprobs >= 0, prompt_logprobs >= 0

    @hot_path
    def apply_cached(self, rows: np.ndarray, num_computed: np.ndarray | None, num_new_blocks: np.ndarray | None) -> None:
        """Adopt the scheduler's (checked) computed counts and appended blocks for the cached ``rows``.

        A computed count below the mirror's bound reports rejected drafts: the known length moves
        down by the same amount, and those drafts are no longer unconfirmed.  ``num_computed=None``:
        the counts are the mirror's (a steady step's, checked equal), only the blocks move;
        ``num_new_blocks=None``: the blocks are moved by `append_blocks`.
        """
        if len(rows) == 0:
            return
        shift = None if num_computed is None else self.num_computed[rows] - num_computed
        if shift is not None and np.count_nonzero(shift):  # usually none: the counts are the mirror's
            self.unconfirmed_drafts[rows] -= shift
            self.num_tokens[rows] -= shift
            self.num_computed[rows] = num_computed
        if num_new_blocks is not None:
            self.num_blocks[rows] += num_new_blocks

    @hot_path
    def append_blocks(self, rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The block counts of ``rows`` (distinct; checked at the boundary to fit) before this step's appends --
        the columns the block table writes them at -- then moved past them.  One C call when `runnercheck.impl.native`
        built it (``append_counts``); this numpy is its reference."""
        if _rows is not None:
            starts = _rows.append_counts(self.num_blocks, rows, counts)
            if starts is not NotImplemented:
                return starts
        starts = self.num_blocks[rows]
        self.num_blocks[rows] = starts + counts
        return starts

    def plan_rows(self, req_ids: Sequence[str], rows: np.ndarray, ends: np.ndarray, known: np.ndarray) -> None:
        """Remember a planned batch: its rows, where each request's tokens end, and the tokens known
        before the step (this step's `advance` on the same ids uses them instead of looking up again)."""
        self._planned = (req_ids, rows, ends, known)

    @hot_path
    def advance(self, req_ids: Sequence[str], num_scheduled: Mapping[str, int] | np.ndarray,
                num_drafts: Mapping[str, int] | np.ndarray | None) -> None:
        """Move the mirror past one step: each scheduled request computed its tokens and may have sampled.

        ``num_scheduled``/``num_drafts``: per request, as mappings by id or arrays in ``req_ids`` order
        (``num_drafts=None``: the batch had no drafts).
        """
        planned = self._planned
        k = None if num_drafts is None else _in_order(num_drafts, req_ids)
        if planned is not None and planned[0] is req_ids:
            rows, end, known = planned[1], planned[2], planned[3]
        else:
            rows = np.fromiter(map(self.req_to_row.__getitem__, req_ids), np.int64, len(req_ids))
            end, known = self.num_computed[rows] + _in_order(num_scheduled, req_ids), self.num_tokens[rows]
        if k is not None and np.count_nonzero(k):
            samples = end == known + k  # reached the end of what is known
            self.num_tokens[rows] = np.where(samples, end + 1, known)
            self.unconfirmed_drafts[rows] += np.where(samples, k, 0)
            self.num_computed[rows] = end
        # end <= known (checked at the boundary): a request that reached the end samples one more.
        elif _rows is None or _rows.advance_decode(rows, end, known, self.num_tokens, self.num_computed) is NotImplemented:
            self.num_tokens[rows] = np.maximum(known, end + 1)
            self.num_computed[rows] = end
        if self._prefilling and (_rows is None or _rows.end_prefill_reads(
                self._prefilling, self.num_computed, self.unconfirmed_drafts, self._reads_over, self._batch_event) is not True):
            self._end_prefill_reads()

    def _end_prefill_reads(self) -> None:
        """Rows whose prefill the device has surely computed (the mirror's bound less its unconfirmed drafts) leave
        `_prefilling`: no later step reads their tokens, so the step just marked was their last reader.  The reference
        of ``end_prefill_reads`` in impl/native/rows.c, which `advance` calls first."""
        computed, unconfirmed, prefilling = self.num_computed, self.unconfirmed_drafts, self._prefilling
        ended = [row for row, length in prefilling.items() if computed.item(row) - unconfirmed.item(row) >= length]
        for row in ended:  # usually one row: Python ints, no numpy scalars
            del prefilling[row]
            self._reads_over[row] = self._batch_event

    @hot_path
    def flush(self, writer: StagingWriter) -> None:
        self.row_state.flush(writer)

    def enqueue_apply(self) -> None:
        self.row_state.enqueue_apply()

    # ------------------------------------------------------------------ views for kernels
    @property
    def base(self) -> torch.Tensor:
        return self.row_state.base

    def prefill_tokens_of(self, row: int) -> np.ndarray:
        """The host's own view of a row's pinned prefill tokens (host-written, never device-written)."""
        return self._prefill_np[row]

    def rows_array(self, req_ids: Iterable[str]) -> np.ndarray:
        return np.fromiter((self.req_to_row[r] for r in req_ids), dtype=np.int32)


def _in_order(values: Mapping[str, int] | np.ndarray, req_ids: Sequence[str]) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values.astype(np.int64, copy=False)
    return np.fromiter((values.get(r, 0) for r in req_ids), np.int64, len(req_ids))
