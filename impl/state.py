"""The request-state table: stable rows, the host mirror, and per-row persistent device state.

A request lives in one *row* from admission until it finishes or is preempted.  Preemption frees
the row exactly like a finish; a resumed request is admitted again as a new request (new row, new
generation number), its prefill being its prompt plus the outputs it already produced.

Tensors (owner: `RequestStateTable`; the four questions for each)
------------------------------------------------------------------
``row_state`` -- a `StagedWriteTensor` ``[max_num_reqs, NUM_ROW_FIELDS]`` int32, on the device, for
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
Host-only state: row <-> request id, free list, generation numbers, the last-use event of each
row, and the `LiveRequest` mirror (upper bounds of the device counts) used for validation.

Quarantine: device work enqueued in earlier steps may still read a freed row's pinned prefill
tokens (the host writes them directly, outside stream order).  A freed row therefore stays out of
use until the event recorded after the last step that scheduled it completes.  Admission only
*queries* events; it waits (counted in ``num_quarantine_waits``) only when every free row is
still quarantined.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np
import torch

from impl.buffers import StagedWriteTensor, StagingWriter
from impl.device import Device, DeviceEvent
from impl.hotpath import hot_path
from impl.interface import (
    CachedRequest,
    CapacityError,
    LiveRequest,
    NewRequest,
    SamplingParams,
    ScheduledTokensError,
    SchedulerOutput,
)

NUM_COMPUTED = 0
NUM_TOKENS = 1
PROMPT_LEN = 2
PREFILL_LEN = 3
LAST_TOKEN = 4
NUM_ROW_FIELDS = 5


class RowStateError(RuntimeError):
    """Internal misuse of the table (freeing an unknown request, admitting a live id)."""


@dataclass
class RowInfo:
    """Host-side facts about the request in one row (written by the host at admission)."""

    req_id: str
    generation: int
    params: SamplingParams
    seed: int
    prompt_len: int
    prefill_len: int
    is_resumed: bool
    # Drafts scheduled for this request whose acceptance the host has not learned: the device
    # counts may sit up to this many tokens below the mirror's upper bounds.
    unconfirmed_drafts: int = 0


class RequestStateTable:
    """Rows, free list with quarantine, generation numbers, the host mirror, per-row device state.

    See the module docstring for the ownership of every tensor.
    """

    def __init__(self, device: Device, max_num_reqs: int = 1024, max_model_len: int = 2048):
        if max_num_reqs < 1 or max_model_len < 1:
            raise ValueError(f"need max_num_reqs >= 1 and max_model_len >= 1, got {max_num_reqs}, {max_model_len}")
        self.device = device
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.row_state = StagedWriteTensor(device, (max_num_reqs, NUM_ROW_FIELDS), torch.int32, "row_state")
        self.prefill_tokens = device.pinned((max_num_reqs, max_model_len), torch.int32)
        self.prefill_tokens.zero_()
        self._prefill_np = self.prefill_tokens.numpy()

        self.req_to_row: dict[str, int] = {}
        self.rows: list[RowInfo | None] = [None] * max_num_reqs
        self.live: dict[str, LiveRequest] = {}
        self._free: deque[int] = deque(range(max_num_reqs))
        self._last_use: list[DeviceEvent | None] = [None] * max_num_reqs
        self._next_generation = 0
        self.num_quarantine_waits = 0

    # ------------------------------------------------------------------ queries
    @property
    def num_live(self) -> int:
        return len(self.req_to_row)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def row_of(self, req_id: str) -> int:
        return self.req_to_row[req_id]

    def info(self, req_id: str) -> RowInfo:
        return self.rows[self.req_to_row[req_id]]

    def generation_of(self, req_id: str) -> int:
        return self.info(req_id).generation

    def is_quarantined(self, row: int) -> bool:
        event = self._last_use[row]
        return event is not None and not event.query()

    def free_rows(self) -> tuple[int, ...]:
        """The free list in order (quarantined rows included), for inspection."""
        return tuple(self._free)

    def quarantined_rows(self) -> tuple[int, ...]:
        """Free rows whose last step has not completed, read without letting a sim device run work."""
        return tuple(r for r in self._free if self._last_use[r] is not None and not self._last_use[r].is_complete())

    # ------------------------------------------------------------------ boundary (pure)
    def mirror_for(self, sched: SchedulerOutput) -> dict[str, LiveRequest]:
        """The mirror to validate `sched` against, corrected for draft rejections the scheduler reports.

        A scheduler that learned that drafts were rejected lowers ``num_computed_tokens``; rejection
        lowers the known length by the same amount, so both upper bounds move down together (never
        by more than the drafts still unconfirmed).  Pure: the table is not changed.  Without such a
        correction this is the live mirror itself, to be read and not kept: the step's commits update it.
        """
        view: dict[str, LiveRequest] | None = None
        for cached in sched.cached_requests:
            lr = self.live.get(cached.req_id) if isinstance(cached, CachedRequest) else None
            if lr is None or cached.num_computed_tokens == lr.num_computed_upper:  # nothing rejected (the usual step)
                continue
            shift = _rejection_shift(cached.num_computed_tokens, lr, self.rows[self.req_to_row[cached.req_id]])
            if shift:
                if view is None:
                    view = dict(self.live)  # copied only when a rejection moves a bound (rare)
                view[cached.req_id] = LiveRequest(lr.num_tokens - shift, lr.num_computed_upper - shift, lr.num_blocks)
        return self.live if view is None else view

    def check_computed_counts(self, sched: SchedulerOutput) -> None:
        """Reject a cached ``num_computed_tokens`` that no device state can explain.

        Positions come from the device-resident count.  Without drafts it equals the tokens
        scheduled so far, so the scheduler must send exactly that; with unconfirmed drafts it may
        be lower by at most their number.
        """
        for cached in sched.cached_requests:
            lr = self.live[cached.req_id]
            if cached.num_computed_tokens == lr.num_computed_upper:
                continue
            info = self.rows[self.req_to_row[cached.req_id]]
            lowest = lr.num_computed_upper - info.unconfirmed_drafts
            if not lowest <= cached.num_computed_tokens <= lr.num_computed_upper:
                want = f"{lr.num_computed_upper}" if lowest == lr.num_computed_upper else f"[{lowest}, {lr.num_computed_upper}]"
                raise ScheduledTokensError(
                    f"num_computed_tokens {cached.num_computed_tokens} disagrees with the {want} tokens scheduled so far",
                    req_id=cached.req_id, field="num_computed_tokens",
                )

    # ------------------------------------------------------------------ commits
    @hot_path
    def release(self, req_id: str) -> int:
        """Free a finished or preempted request's row (it stays quarantined until its last use completes)."""
        row = self.req_to_row.pop(req_id, None)
        if row is None:
            raise RowStateError(f"release of {req_id!r}, which holds no row")
        del self.live[req_id]
        self.rows[row] = None
        self._free.append(row)
        return row

    @hot_path
    def admit(self, req: NewRequest, seed: int) -> int:
        """Give `req` a row: write its prefill tokens (pinned) and stage its row-state diffs."""
        if req.req_id in self.req_to_row:
            raise RowStateError(f"admit of {req.req_id!r}, which is already live")
        row = self._take_free_row(req.req_id)
        prefill = req.prefill_token_ids
        prompt_len, prefill_len = len(req.prompt_token_ids), len(prefill)
        self._prefill_np[row, :prefill_len] = prefill
        hit = req.num_computed_tokens  # prefix-cache hit: the first step computes from there
        self.row_state.stage(row, 0, [hit, prefill_len, prompt_len, prefill_len, prefill[-1]])
        self.rows[row] = RowInfo(req.req_id, self._next_generation, req.sampling_params, seed, prompt_len, prefill_len, req.is_resumed)
        self._next_generation += 1
        self.req_to_row[req.req_id] = row
        self.live[req.req_id] = LiveRequest(num_tokens=prefill_len, num_computed_upper=hit, num_blocks=len(req.block_ids))
        return row

    def _take_free_row(self, req_id: str) -> int:
        if not self._free:
            raise CapacityError(f"no free row for {req_id!r}: all {self.max_num_reqs} rows are live", req_id=req_id)
        for i, row in enumerate(self._free):
            if not self.is_quarantined(row):
                del self._free[i]
                return row
        # Every free row may still be read by in-flight work: wait for the one freed first.
        row = self._free.popleft()
        self.num_quarantine_waits += 1
        self._last_use[row].synchronize()
        return row

    @hot_path
    def apply_cached(self, sched: SchedulerOutput) -> None:
        """Adopt the scheduler's computed counts (already checked) and block counts into the mirror."""
        for cached in sched.cached_requests:
            lr = self.live[cached.req_id]
            info = self.rows[self.req_to_row[cached.req_id]]
            shift = lr.num_computed_upper - cached.num_computed_tokens
            info.unconfirmed_drafts -= shift
            # In place: the mirror's entries are this table's own (mirror_for hands them out read-only).
            lr.num_tokens -= shift
            lr.num_computed_upper = cached.num_computed_tokens
            lr.num_blocks += len(cached.new_block_ids)

    @hot_path
    def advance(self, req_ids: Iterable[str], num_scheduled: Mapping[str, int], num_drafts: Mapping[str, int]) -> None:
        """Move the mirror past one step: each scheduled request computed its tokens and may have sampled."""
        for req_id in req_ids:
            lr = self.live[req_id]
            n, k = num_scheduled[req_id], num_drafts.get(req_id, 0)
            end = lr.num_computed_upper + n
            num_tokens = lr.num_tokens
            if end == lr.num_tokens + k:  # reached the end of what is known: it samples
                num_tokens = end + 1
                self.rows[self.req_to_row[req_id]].unconfirmed_drafts += k
            lr.num_tokens, lr.num_computed_upper = num_tokens, end

    def mark_used(self, rows: Iterable[int], event: DeviceEvent) -> None:
        """Record the event after which the step that scheduled ``rows`` no longer reads them."""
        for row in rows:
            self._last_use[row] = event

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


def _rejection_shift(num_computed: object, lr: LiveRequest, info: RowInfo) -> int:
    if not isinstance(num_computed, int) or isinstance(num_computed, bool):
        return 0
    shift = lr.num_computed_upper - num_computed
    return shift if 0 < shift <= info.unconfirmed_drafts else 0
