"""One pass over a step's `SchedulerOutput`: read it into arrays and check it, before any state changes.

`read_step` is the runner's boundary.  It applies the rules of
`runnercheck.impl.boundary.validate_scheduler_output` (the per-request form the oracle uses) plus the
runner's own (computed counts against unconfirmed drafts), but reads the cached and scheduled
requests with C-level passes (``map``, ``dict`` views, ``numpy``) and checks them with vectorised
comparisons against the host mirror (`runnercheck.impl.state.RequestStateTable` arrays).  Per item it walks
only what changed: finishes, preemptions, admissions, appended blocks and drafts.

When a vectorised check fails, the per-request validator runs on the same step to name the
request, field and error class exactly as the oracle would (`_diagnose`); the fast checks only
decide *whether* a step is bad.  So both forms hold the same rules, and the bad-input tests hold
them to the same verdicts.

A steady decode step -- the last accepted decode batch again, same requests in the same order,
one token each, nothing admitted, finished or preempted, no drafts -- is read by
`read_steady_step` instead: rows, order and query lengths are the last step's, so it reads only
the computed counts and appended blocks (C-level passes) and checks them against the mirror.  It
never raises past the container and step-id checks: any step it does not accept in full goes to
`read_step`, so the verdicts (and error classes) are `read_step`'s.  It tries the C twin of its
checks and Python reader first (`read_steady`, `impl/native/steady.c`, built at first use by
`runnercheck.impl.native`): one pass over the step's objects -- containers, step id, then the batch -- that
decides the same verdict whenever every object it reads has its exact type, and hands every other
step to the Python checks and reader (`_read_steady`), the reference.  A general step without
drafts is read the same way by ``read_general`` first (`impl/native/general.c`) -- the containers and
the step id, the leaving ids, the new requests (through `impl/native/boundary.c`'s check), the cached and
scheduled requests and the batch rules in one call, in one pass when the scheduled dict lists the cached
requests first and in their order -- and `read_step`'s own checks and parts, the reference, read every step
it declines.

The result, `StepArrays`, serves the row updates (`apply_cached`, block appends, admissions)
and the step plan (`runnercheck.impl.input_batch.plan_step`); nothing reads the `SchedulerOutput` again
except the admissions themselves.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, fields
from itertools import chain, compress, repeat
from types import ModuleType, NotImplementedType

import numpy as np

from runnercheck.impl.boundary import (
    check_block_ids,
    check_containers,
    check_gone,
    check_drafts,
    check_new_request,
    check_step_id,
    validate_scheduler_output,
)
from runnercheck.impl import native
from runnercheck.impl.exact_ints import RepeatedInt, equal_exact_ints
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.interface import (
    MAX_SEED,
    SAMPLING_FIELDS,
    CachedRequests,
    CapacityError,
    DuplicateRequestError,
    FinishedAndScheduledError,
    NewRequest,
    RunnerLimits,
    SamplingParams,
    ScheduledTokensError,
    SchedulerOutput,
    SchedulerOutputError,
    blocks_per_request,
)
from runnercheck.impl.state import RequestStateTable

_EMPTY = np.zeros(0, np.int64)
_ONES = np.ones(1024, np.int64)
_ONES.flags.writeable = False  # shared by steps: read-only slices


_ZEROS = np.zeros(1024, np.int64)
_ZEROS.flags.writeable = False
_NUM_ZEROS = len(_ZEROS)


def _ones(k: int) -> np.ndarray:
    return _ONES[:k] if k <= len(_ONES) else np.ones(k, np.int64)


def _zeros(k: int) -> np.ndarray:
    """``k`` zeros, read-only when shared (a step without drafts: its draft counts)."""
    return _ZEROS[:k] if k <= len(_ZEROS) else np.zeros(k, np.int64)


@dataclass(slots=True)
class StepArrays:
    """A checked step, as arrays in the orders the rest of the step needs."""

    gone: tuple[str, ...]  # finished + preempted ids, sorted (release order)
    cached_rows: np.ndarray  # int64 [C]: row of each cached request
    cached_computed: np.ndarray | None  # int64 [C]: its num_computed_tokens (None: the mirror's bounds, no rejection reported)
    cached_new_blocks: np.ndarray  # int64 [C]: blocks appended this step
    block_appends: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # (rows, counts, block ids) appended; None: none
    req_ids: tuple[str, ...]  # scheduled, batch order
    rows: np.ndarray  # int64 [R]: row of each scheduled request (-1 for a new one until it is admitted)
    new_positions: tuple[tuple[int, str], ...]  # (batch index, id) of scheduled new requests
    query_lens: np.ndarray  # int64 [R]
    starts: np.ndarray  # int64 [R]: computed tokens before the step (upper bound)
    ends: np.ndarray  # int64 [R]: starts + query_lens
    known: np.ndarray  # int64 [R]: tokens known before the step (upper bound; drafts not included)
    num_drafts: np.ndarray  # int64 [R]
    drafts: tuple[tuple[int, ...], ...] | None  # per scheduled request, batch order; None: no drafts this step
    num_tokens: int
    # The plan's summaries, from the pass that checked the counts (`_check_batch`): ``query_start_loc`` (int32
    # [R + 1]), the largest query and end (0 for no requests), and the query length every request shares (-1:
    # they differ, or none).
    query_starts: np.ndarray
    max_query_len: int
    max_end: int
    uniform_query_len: int
    # Read by `read_steady_step`: the last step's requests, order and one-token queries again (its
    # ``req_ids``, ``rows``, ``query_lens``, ``num_drafts`` and ``query_starts`` are the last step's objects, shared).
    steady: bool = False

    @property
    def is_decode(self) -> bool:
        """Every scheduled request computes exactly one token and there are no drafts."""
        return self.drafts is None and self.num_tokens == len(self.req_ids) > 0


# Its fields in order: what `impl/native/general.c` (read_general_of) stores slot by slot, without __init__ -- which
# must stay the dataclass's own (no __post_init__, no field made in it).
STEP_FIELDS = tuple(field.name for field in fields(StepArrays))
if hasattr(StepArrays, "__post_init__") or set(StepArrays.__slots__) != set(STEP_FIELDS):
    raise TypeError("StepArrays must stay a slots dataclass whose __init__ only stores its fields (general.c makes it)")


def _all_of(values: list, types: set) -> bool:
    return set(map(type, values)) <= types


def _rows_of(req_to_row: dict, ids: tuple) -> np.ndarray | None:
    """Row of each id, -1 where it holds none; None when an id cannot even be looked up (unhashable)."""
    try:
        return np.fromiter(map(req_to_row.get, ids, repeat(-1)), np.int64, len(ids))
    except TypeError:
        return None


def _hits(rows: np.ndarray, gone_rows: np.ndarray | None) -> bool:
    """Whether any of ``rows`` is one of the (few) rows leaving this step."""
    return gone_rows is not None and np.count_nonzero(rows[:, None] == gone_rows[None, :]) > 0


def _repeats(rows: np.ndarray, num_rows: int) -> bool:
    return int(np.count_nonzero(np.bincount(rows, minlength=num_rows))) != len(rows)


def _int_array(values: list) -> np.ndarray | None:
    """int64 array of Python ints; None when one does not fit (the per-request checks reject it)."""
    try:
        return np.array(values, np.int64) if values else _EMPTY
    except OverflowError:
        return None


def _appended_ids(block_lists: list, num_kv_blocks: int) -> list | None:
    """The block ids of ``block_lists`` (non-empty lists), in order; None when one is not an int in range."""
    appended = list(chain.from_iterable(block_lists))
    if set(map(type, appended)) != {int} or min(appended) < 0 or max(appended) >= num_kv_blocks:
        return None
    return appended


def read_steady_step(sched: SchedulerOutput, state: RequestStateTable, limits: RunnerLimits, last_step_id: int | None,
                     last: StepArrays | None) -> StepArrays | None:
    """The steady decode step, read and checked in O(1) Python plus C-level passes; None when ``sched`` is not one.

    Steady: nothing finished, preempted or admitted, no drafts, and the cached and scheduled
    requests are ``last``'s (the last accepted step, a decode step: `StepArrays.is_decode`), in its
    order, one token each.  Rows, batch order and query lengths are then ``last``'s, and only the
    computed counts and appended blocks are read and checked against the host mirror.  The checks
    are `read_step`'s rules for such a step; whenever one fails (or the step is not steady) this
    returns None and the caller runs `read_step`, which rejects the step with the error that names
    the request and field.  Raises only what `read_step` raises first (containers, step id).
    """
    if _native_reader is not None:
        read = read_steady_native(_native_reader, sched, state, limits, last, last_step_id)
        if read is not NotImplemented:
            return read
    check_containers(sched)
    check_step_id(sched.step_id, last_step_id)
    if (last is None or sched.new_requests or sched.finished_req_ids or sched.preempted_req_ids or sched.draft_token_ids
            or sched.num_device_drafts):
        return None
    try:
        return _read_steady(sched, state, limits, last)
    except (TypeError, ValueError):  # an element whose comparison or truth value fails: `read_step` names it
        return None


# The C twin of `read_steady_step`'s checks and `_read_steady` (`impl/native/steady.c`); None without a compiler
# or with RUNNERCHECK_NATIVE=0.
_native_reader = native.load("steady")
# The C twins of `read_step`'s parts, and its whole for a step without drafts (`impl/native/general.c`); None: the
# Python parts alone.
_native_general = native.load("general")
# The C twin of `runnercheck.impl.boundary.check_new_request` (`impl/native/boundary.c`); None: the reference alone.
_native_boundary = native.load("boundary")


# The sampling fields' rules as the C check of a new request reads them (`impl/native/boundary.c`'s field_rules): per
# row of the interface's table (name, is int, neutral, low, high, low open, high open), bounds as floats, absent ones
# infinite.  Made once from the table: a new field needs no C.
BOUNDARY_RULES: tuple[tuple[str, bool, float, float, float, bool, bool], ...] = tuple(
    (sys.intern(f.name), f.is_int, float(f.neutral), -math.inf if f.low is None else float(f.low),
     math.inf if f.high is None else float(f.high), f.low_open, f.high_open) for f in SAMPLING_FIELDS)


def _check_new_args(limits: RunnerLimits) -> tuple:
    """What the C check of a new request takes after the request (`_new_request_prefill`, `read_general`), made
    once for the limits asked last (a runner's never change)."""
    global _check_new_last
    if _check_new_last[0] is not limits:
        _check_new_last = (limits, (
            NewRequest, SamplingParams, limits.vocab_size, limits.max_logprobs, limits.max_model_len, limits.num_kv_blocks,
            blocks_per_request(limits.max_model_len, limits.block_size), limits.block_size, MAX_SEED, BOUNDARY_RULES))
    return _check_new_last[1]


_check_new_last: tuple[RunnerLimits | None, tuple] = (None, ())


def _general_targets(state: RequestStateTable, limits: RunnerLimits) -> tuple:
    """What ``read_general_of`` (`impl/native/general.c`) takes besides the step, its last id and the batch hint, made
    once for the table and limits asked last (a runner's never change; the table's mirror arrays are its own for its
    lifetime, written in place)."""
    global _general_last
    targets = (SchedulerOutput, CachedRequests, state.req_to_row, _native_boundary.check_new_request,
               _check_new_args(limits), limits.max_num_reqs, state.num_computed, state.num_blocks, state.num_tokens,
               limits.block_size, limits.max_model_len, limits.max_num_batched_tokens, limits.num_kv_blocks,
               StepArrays, STEP_FIELDS, _ZEROS)
    _general_last = (state, limits, targets)
    return targets


_general_last: tuple = (None, None, ())


@hot_path
def _new_request_prefill(req: object, limits: RunnerLimits) -> int:
    """`check_new_request`'s verdict on one new request (its prefill length), decided in C when the C twin takes
    the request; the reference decides every other request and names every rejection."""
    if _native_boundary is not None:
        n = _native_boundary.check_new_request(req, *_check_new_args(limits))
        if type(n) is int:
            return n
    return check_new_request(req, limits)


def read_steady_native(reader: ModuleType, sched: SchedulerOutput, state: RequestStateTable, limits: RunnerLimits,
                       last: StepArrays | None, last_step_id: int | None = None) -> StepArrays | None | NotImplementedType:
    """`read_steady_step` by ``reader`` (a build of `impl/native/steady.c`): the same StepArrays or None, or
    NotImplemented when the step holds an object of another type than the exact ones it reads, or a step id
    the Python checks reject (the Python reader decides those and names the error)."""
    last_ids, last_rows = (None, None) if last is None else (last.req_ids, last.rows)
    got = reader.read_steady(sched, SchedulerOutput, CachedRequests, last_step_id, last_ids, last_rows,
                             state.num_computed, state.num_blocks, state.num_tokens, limits.block_size,
                             limits.num_kv_blocks, limits.max_model_len, limits.max_num_batched_tokens)
    if got is None or got is NotImplemented:
        return got
    return _steady_arrays(last, *got)


def _steady_arrays(last: StepArrays, starts: np.ndarray, ends: np.ndarray, known: np.ndarray,
                   appends: tuple[np.ndarray, np.ndarray, np.ndarray] | None, max_end: int) -> StepArrays:
    """A checked steady step: ``last``'s requests, rows and one-token queries again; the cached updates touch
    only the rows that appended blocks (every other shift and count is 0)."""
    # Positional, in field order (a keyword call of twenty fields costs ~0.6 us, every step).
    return StepArrays(
        (), appends[0] if appends is not None else _EMPTY, None,  # gone, cached_rows, cached_computed
        appends[1] if appends is not None else _EMPTY, appends, last.req_ids,  # cached_new_blocks, block_appends, req_ids
        last.rows, (), last.query_lens, starts, ends, known,  # rows, new_positions, query_lens, starts, ends, known
        last.num_drafts, None, len(starts), last.query_starts,  # num_drafts, drafts, num_tokens, query_starts
        last.max_query_len, max_end, last.uniform_query_len, True,  # max_query_len, max_end, uniform_query_len, steady
    )


_ONE_EACH = RepeatedInt(1)  # the scheduled counts of a steady step
_NO_HINT = (None, None)  # no `RequestStateTable.batch_hint`: the C readers look every cached id up


def _read_steady(sched: SchedulerOutput, state: RequestStateTable, limits: RunnerLimits, last: StepArrays) -> StepArrays | None:
    # Whole-tuple operations only (`check_containers` made the three cached tuples parallel tuples).
    req_ids, cached, scheduled = last.req_ids, sched.cached_requests, sched.num_scheduled_tokens
    n = len(req_ids)
    if cached.req_ids != req_ids or len(scheduled) != n or tuple(scheduled) != req_ids:
        return None
    rows = last.rows
    starts = state.num_computed[rows]
    # Exact ints, one each, and computed counts equal to the mirror's bound (no draft rejection
    # reported, nothing to shift): one C-level pass each (`runnercheck.impl.exact_ints`).
    if not _ONE_EACH.matches(list(scheduled.values())) or not equal_exact_ints(cached.num_computed_tokens, starts):
        return None
    # Appended blocks: the requests with a non-empty list, found in one C-level pass; every other
    # entry must be the empty tuple (anything else -- an empty list or str, None -- goes to `read_step`).
    block_lists = cached.new_block_ids
    appending_at = list(compress(range(n), block_lists))
    k = len(appending_at)
    if block_lists.count(()) != n - k:
        return None
    num_blocks = state.num_blocks[rows]
    appends = None
    if k:
        appending = list(map(block_lists.__getitem__, appending_at))
        if not _all_of(appending, {tuple, list}):
            return None
        appended = _appended_ids(appending, limits.num_kv_blocks)
        if appended is None:
            return None
        with_blocks = np.array(appending_at, np.int64)
        # Usually one block each (a decode crossing into a new block).
        counts_appended = _ones(k) if len(appended) == k else np.fromiter(map(len, appending), np.int64, k)
        grown = num_blocks[with_blocks] + counts_appended
        # Only these rows grow, and every row held at most a row's worth before.
        if int(grown.max()) > blocks_per_request(limits.max_model_len, limits.block_size):
            return None
        num_blocks[with_blocks] = grown
        appends = (rows[with_blocks], counts_appended, np.array(appended, np.int64))
    # Past what the blocks hold (ceil(end / bs) > blocks <=> start >= blocks * bs, with end = start + 1).
    # Not past the known tokens: the last step's `advance` left every one of these rows with
    # num_tokens >= num_computed + 1 (a decode step samples), and a steady step changes neither
    # count before this check.
    if np.count_nonzero(starts >= num_blocks * limits.block_size) or n > limits.max_num_batched_tokens:
        return None
    ends = starts + 1
    max_end = int(ends.max())
    if max_end > limits.max_model_len:
        return None
    return _steady_arrays(last, starts, ends, state.num_tokens[rows], appends, max_end)


def read_step(sched: SchedulerOutput, state: RequestStateTable, limits: RunnerLimits, last_step_id: int | None, *,
              containers_checked: bool = False) -> StepArrays:
    """Check ``sched`` against the host mirror and read it into `StepArrays`; changes nothing.

    Raises a `SchedulerOutputError` subclass naming the request and field.  ``containers_checked``: the
    caller ran `check_containers` and `check_step_id` on this step already (`read_steady_step` did).
    """
    r2r = state.req_to_row
    if _native_general is not None and _native_boundary is not None:
        # The containers and the step id are checked in this one C call too (any doubt: it declines, and the checks
        # below name the error); so is the absence of drafts.
        last = _general_last
        targets = last[2] if last[0] is state and last[1] is limits else _general_targets(state, limits)
        got = _native_general.read_general_of(sched, targets, last_step_id, *(state.batch_hint or _NO_HINT))
        if type(got) is StepArrays:  # an accepted step, made in C: the parts below would read the same
            return got
        if got is not NotImplemented:  # the same as a tuple (a batch past `_ZEROS`)
            (gone, crows, cnew, appends, req_ids, query_lens, rows, known, starts, end, total, query_starts, max_query_len,
             max_end, uniform_query_len, new_positions) = got
            return StepArrays(  # positional, in field order (as `_steady_arrays`)
                gone, crows, None, cnew, appends, req_ids,  # gone .. req_ids
                rows, new_positions, query_lens, starts, end, known,  # rows .. known
                _ZEROS[:n] if (n := len(req_ids)) <= _NUM_ZEROS else _zeros(n),  # num_drafts (`_zeros`, frameless)
                None, total, query_starts, max_query_len, max_end, uniform_query_len,  # drafts ..
            )
    if not containers_checked:
        check_containers(sched)
        check_step_id(sched.step_id, last_step_id)
    cached = sched.cached_requests

    gone = check_gone(sched, r2r)

    new: dict[str, tuple[int, int, int]] = {}  # id -> (prefill length, blocks, prefix-cache hit)
    for req in sched.new_requests:
        n = _new_request_prefill(req, limits)
        rid = req.req_id
        if rid in new or (rid in r2r and rid not in gone):
            raise DuplicateRequestError("request id already live", req_id=rid, field="req_id")
        if rid in gone:
            raise FinishedAndScheduledError("finished/preempted and re-added in one step", req_id=rid, field="req_id")
        new[rid] = (n, len(req.block_ids), req.num_computed_tokens)
    num_live_after = len(r2r) - len(gone) + len(new)
    if num_live_after > limits.max_num_reqs:
        raise CapacityError(f"{num_live_after} live requests > max_num_reqs {limits.max_num_reqs}", field="new_requests")

    # Mirror after this step's cached updates, by row (copies: the table is changed only by the commit).
    num_tokens, num_computed, num_blocks = state.num_tokens, state.num_computed, state.num_blocks
    nc = len(cached)
    crows, ccomp, cnew, appends, ids = _EMPTY, None, _EMPTY, None, ()
    # Rows of the requests leaving this step: neither cached nor scheduled may name them.
    gone_rows = np.fromiter(map(r2r.__getitem__, gone), np.int64, len(gone)) if gone else None
    hint = state.batch_hint or _NO_HINT  # the last batch's ids and rows: most cached rows found without a look-up
    if nc:
        ids = cached.req_ids
        got = NotImplemented if _native_general is None else _native_general.read_cached(
            ids, cached.num_computed_tokens, cached.new_block_ids, r2r, _EMPTY if gone_rows is None else gone_rows,
            num_computed, num_blocks, blocks_per_request(limits.max_model_len, limits.block_size), limits.num_kv_blocks, *hint)
        if got is None or got is NotImplemented:  # the reference decides: it names a bad request, reads a shift
            crows, ccomp, cnew, appends, shift = _read_cached(sched, state, limits, last_step_id, gone_rows)
        else:
            (crows, cnew, appends), shift = got, None
        if appends is not None:
            num_blocks = num_blocks.copy()
            num_blocks[crows] += cnew
        if shift is not None:
            num_tokens, num_computed = num_tokens.copy(), num_computed.copy()
            num_tokens[crows] -= shift
            num_computed[crows] = ccomp

    scheduled = sched.num_scheduled_tokens
    got = NotImplemented if _native_general is None else _native_general.read_scheduled(
        scheduled, r2r, _EMPTY if gone_rows is None else gone_rows, num_tokens, num_computed, num_blocks)
    if got is NotImplemented:
        got = _read_scheduled(scheduled, r2r, gone_rows, ids, crows, num_tokens, num_computed, num_blocks)
    if got is None:
        _diagnose(sched, state, limits, last_step_id)
    req_ids, query_lens, rows, known, starts, blocks = got
    nr = len(req_ids)
    new_positions: list[tuple[int, str]] = []
    for i in (rows < 0).nonzero()[0].tolist():  # per item: new (or unknown) ids
        rid = req_ids[i]
        if rid not in new:
            _diagnose(sched, state, limits, last_step_id)
        known[i], blocks[i], starts[i] = new[rid]
        new_positions.append((i, rid))

    num_drafts, drafts = _zeros(nr), None
    if sched.draft_token_ids:
        num_drafts = np.zeros(nr, np.int64)
        index_of = dict(zip(req_ids, range(nr)))
        per_request: list[tuple[int, ...]] = [()] * nr
        for rid, d in sched.draft_token_ids.items():  # per item: drafts
            k = check_drafts(rid, d, limits)
            i = index_of.get(rid)
            if i is None:
                raise ScheduledTokensError("drafts for an unscheduled request", req_id=rid, field="draft_token_ids")
            num_drafts[i] = k
            per_request[i] = tuple(d)
        drafts = tuple(per_request)

    with_drafts = num_drafts if drafts is not None else None
    got = NotImplemented if _native_general is None else _native_general.check_batch(
        query_lens, starts, known, blocks, with_drafts, limits.block_size, limits.max_model_len, limits.max_num_batched_tokens)
    if got is NotImplemented:
        got = _check_batch(query_lens, starts, known, blocks, with_drafts, limits)
    if got is None:
        _diagnose(sched, state, limits, last_step_id)
    end, total, query_starts, max_query_len, max_end, uniform_query_len = got
    return StepArrays(
        gone=tuple(sorted(gone)), cached_rows=crows, cached_computed=ccomp, cached_new_blocks=cnew, block_appends=appends,
        req_ids=req_ids, rows=rows, new_positions=tuple(new_positions), query_lens=query_lens, starts=starts, ends=end, known=known,
        num_drafts=num_drafts, drafts=drafts, num_tokens=total, query_starts=query_starts, max_query_len=max_query_len,
        max_end=max_end, uniform_query_len=uniform_query_len,
    )


def _read_cached(sched: SchedulerOutput, state: RequestStateTable, limits: RunnerLimits, last_step_id: int | None,
                 gone_rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, tuple | None, np.ndarray | None]:
    """The cached requests of a checked step: (rows, computed counts, new block counts, block appends, shifts).

    Computed counts and shifts are None when every count is the mirror's bound (no rejected drafts).
    Rejects through `_diagnose`.  The reference of the C ``read_cached`` (`impl/native/general.c`).
    """
    r2r, cached = state.req_to_row, sched.cached_requests
    nc = len(cached)
    # Ids are checked through the row lookup: a non-string, empty, new or unknown id has no row.
    ids = cached.req_ids
    crows = _rows_of(r2r, ids)
    if crows is None or np.count_nonzero(crows < 0) or _hits(crows, gone_rows) or _repeats(crows, state.max_num_reqs):
        _diagnose(sched, state, limits, last_step_id)
    block_lists = cached.new_block_ids
    if not _all_of(block_lists, {tuple, list}):
        _diagnose(sched, state, limits, last_step_id)
    upper = state.num_computed[crows]
    ccomp = shift = None  # the counts are the mirror's bounds unless the scheduler reports rejected drafts
    if not equal_exact_ints(cached.num_computed_tokens, upper):
        ccomp, shift = _computed_counts(cached.num_computed_tokens, upper, crows, sched, state, limits, last_step_id)
    cnew = np.fromiter(map(len, block_lists), np.int64, nc)
    with_blocks = cnew.nonzero()[0]
    appends = None
    if len(with_blocks):  # only the requests that appended blocks, checked in C-level passes
        appended = _appended_ids(list(map(block_lists.__getitem__, with_blocks.tolist())), limits.num_kv_blocks)
        if appended is None:
            for i in with_blocks.tolist():  # names the first bad block id
                check_block_ids(block_lists[i], limits.num_kv_blocks, ids[i], "new_block_ids")
        if (state.num_blocks[crows] + cnew).max() > blocks_per_request(limits.max_model_len, limits.block_size):
            _diagnose(sched, state, limits, last_step_id)
        appends = (crows[with_blocks], cnew[with_blocks], np.array(appended, np.int64))
    return crows, ccomp, cnew, appends, shift


def _read_scheduled(scheduled: dict, r2r: dict, gone_rows: np.ndarray | None, cached_ids: tuple, cached_rows: np.ndarray,
                    num_tokens: np.ndarray, num_computed: np.ndarray, num_blocks: np.ndarray) -> tuple | None:
    """(batch ids, query lengths, rows: -1 for an id that holds none, and each row's tokens known, computed and
    blocks in the given mirror arrays: 0 for -1); None when a count is not an int of 64 bits, an id cannot be
    looked up or a scheduled row is leaving this step (``gone_rows``).  The reference of the C
    ``read_scheduled`` (`impl/native/general.c`)."""
    req_ids = tuple(scheduled)
    counts = list(scheduled.values())
    query_lens = _int_array(counts) if _all_of(counts, {int}) else None
    if query_lens is None:
        return None
    nc, nr = len(cached_ids), len(req_ids)
    # The usual batch lists the cached requests first, in their order: their rows are known.
    if nc and req_ids[:nc] == cached_ids:
        rows = np.concatenate((cached_rows, _rows_of(r2r, req_ids[nc:]))) if nr > nc else cached_rows.copy()
    else:
        rows = _rows_of(r2r, req_ids)
    if rows is None or _hits(rows, gone_rows):
        return None
    new = rows < 0
    safe_rows = np.maximum(rows, 0)
    known, starts, blocks = num_tokens[safe_rows], num_computed[safe_rows], num_blocks[safe_rows]
    known[new] = starts[new] = blocks[new] = 0
    return req_ids, query_lens, rows, known, starts, blocks


def _check_batch(query_lens: np.ndarray, starts: np.ndarray, known: np.ndarray, blocks: np.ndarray,
                 num_drafts: np.ndarray | None, limits: RunnerLimits) -> tuple[np.ndarray, int, np.ndarray, int, int, int] | None:
    """(ends, token total, query starts, largest query, largest end, shared query length or -1) of a batch whose
    every count is >= 1, inside the tokens known (to their end exactly with drafts), the blocks held and the
    model's length, with a total inside the budget; else None.  The reference of the C ``check_batch``
    (`impl/native/general.c`)."""
    # A count above the budget is rejected before any sum: a 64-bit sum could wrap past it.
    if np.count_nonzero((query_lens <= 0) | (query_lens > limits.max_num_batched_tokens)):
        return None
    end = starts + query_lens
    known_all = known if num_drafts is None else known + num_drafts
    bad = (end > known_all) | ((end + (limits.block_size - 1)) // limits.block_size > blocks) | (end > limits.max_model_len)
    if num_drafts is not None:
        bad |= (num_drafts > 0) & (end != known_all)
    total = int(query_lens.sum())
    if np.count_nonzero(bad) or total > limits.max_num_batched_tokens:
        return None
    query_starts = np.zeros(len(query_lens) + 1, np.int32)
    query_starts[1:] = query_lens.cumsum()
    if not len(query_lens):
        return end, total, query_starts, 0, 0, -1
    shared = int(query_lens[0]) if not np.count_nonzero(query_lens != query_lens[0]) else -1
    return end, total, query_starts, int(query_lens.max()), int(end.max()), shared


def _computed_counts(computed: tuple, upper: np.ndarray, crows: np.ndarray, sched: SchedulerOutput, state: RequestStateTable,
                     limits: RunnerLimits, last_step_id: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The cached requests' computed counts when some differ from the mirror's bounds ``upper``: (counts, shifts).

    A count may sit below its bound by at most the row's unconfirmed drafts (the scheduler reports
    their rejection); anything else is rejected through `_diagnose`."""
    counts = _int_array(computed) if _all_of(computed, {int}) else None
    if counts is None:
        _diagnose(sched, state, limits, last_step_id)
    shift = upper - counts
    # One comparison for the window [upper - unconfirmed, upper]: a negative shift (and a negative
    # count, since unconfirmed <= upper) wraps to a huge unsigned value.
    bad = shift.view(np.uint64) > state.unconfirmed_drafts[crows].view(np.uint64)
    if np.count_nonzero(bad):
        _diagnose(sched, state, limits, last_step_id, computed_count_error=int(bad.nonzero()[0][0]))
    return counts, shift


def _diagnose(sched: SchedulerOutput, state: RequestStateTable, limits: RunnerLimits, last_step_id: int | None,
              computed_count_error: int | None = None) -> None:
    """A vectorised check failed: raise the error the per-request validator names for this step."""
    validate_scheduler_output(sched, state.mirror_for(sched), limits, last_step_id)
    if computed_count_error is not None:
        # The oracle knows exact counts; the runner's bound is loose by the unconfirmed drafts.
        cached = sched.cached_requests
        rid, computed = cached.req_ids[computed_count_error], cached.num_computed_tokens[computed_count_error]
        row = state.req_to_row[rid]
        upper = int(state.num_computed[row])
        lowest = upper - int(state.unconfirmed_drafts[row])
        want = f"{upper}" if lowest == upper else f"[{lowest}, {upper}]"
        raise ScheduledTokensError(
            f"num_computed_tokens {computed} disagrees with the {want} tokens scheduled so far",
            req_id=rid, field="num_computed_tokens",
        )
    raise SchedulerOutputError("rejected by the runner's array checks, though the per-request checks pass")
