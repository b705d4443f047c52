"""The step reader's C twins (`impl/native/steady.c`, `general.c`) against their Python references.

The steady reader:

The Python reader (`runnercheck.impl.step_reader._read_steady`) is the reference: on every generated step
near a steady state -- ids swapped, renamed or mistyped, scheduled counts off, computed counts
off by one or of another type, block lists empty, out of range, too long or of another type --
the C reader returns the same verdict (None, or `StepArrays` equal field by field) or
NotImplemented, and NotImplemented only when some object it reads is not of its exact type.
A build of the C reader with a planted bug (it trusts the mirror's computed counts) is caught
by the same comparison.  The C reader also makes `read_steady_step`'s checks (containers, step id, nothing
admitted, finished or drafted): with it and without it, generated steps with those changed get the same
error, None or arrays; a build that accepts a stale step id is caught.

The general reader's C blocks (`impl/native/general.c`: ``read_cached``, ``read_scheduled``, ``check_batch``) against their
Python references (`_read_cached`, `_read_scheduled`, `_check_batch`) in the same way, on generated
cached requests (ids unknown, repeated or leaving, counts inside or outside the drafts' window),
scheduled counts and batches (counts past each bound, one that wraps a 64-bit sum); the planted build
that trusts the mirror is caught by the cached block's comparison too.

(The general reader's one pass is tested in test_native_lockstep.py; the staged writes' packing,
`impl/native/staging.c`, in test_native_staging.py; the request state table's writes, `impl/native/rows.c`, in
test_native_rows.py; an admission's derived seed, `impl/native/seeds.c`, in test_native_seeds.py; the loader and
the patched builds of planted bugs in test_native_build.py.)
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import native_plants
import runnercheck.impl.native as native
import runnercheck.impl.staged_writes as staged_writes
import runnercheck.impl.state as state_module
import runnercheck.impl.step_reader as step_reader
from runnercheck.impl.interface import (CachedRequests, DuplicateRequestError, NewRequest, RunnerLimits, SamplingParams,
                            SchedulerOutput, SchedulerOutputError, StepIdError)
from runnercheck.impl.step_reader import StepArrays, _read_steady, read_steady_native

LIMITS = RunnerLimits(vocab_size=256, max_num_reqs=8, max_model_len=64, max_num_batched_tokens=16, num_kv_blocks=48,
                      block_size=4)
MAX_BLOCKS = 16  # 64 tokens / 4 per block

reader = native.load("steady")
general = native.load("general")
needs_native = pytest.mark.skipif(reader is None or general is None, reason="impl/native not built (or RUNNERCHECK_NATIVE=0)")


def _planted(plant: str, name: str = "steady"):
    """A build of impl/native/<name>.c with a planted bug (a key of native_plants.PLANTS); skips where nothing can be
    compiled, fails where the plant no longer applies."""
    return native_plants.planted(plant, name)


class Odd(str):
    """A str subclass: equal to its text, but not the exact type the C reader reads."""


def _python_verdict(sched, state, last):
    try:
        return _read_steady(sched, state, LIMITS, last)
    except (TypeError, ValueError):
        return None  # as `read_steady_step` answers


def _same(a: StepArrays | None, b: StepArrays | None) -> bool:
    if a is None or b is None:
        return a is b
    for name in StepArrays.__slots__:
        x, y = getattr(a, name), getattr(b, name)
        if name == "block_appends":
            if (x is None) != (y is None) or (x is not None and not all(np.array_equal(p, q) for p, q in zip(x, y))):
                return False
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not np.array_equal(x, y):
                return False
        elif x != y:
            return False
    return True


def assert_readers_agree(c_reader, sched: SchedulerOutput, state, last: StepArrays, exactly_typed: bool) -> None:
    got = read_steady_native(c_reader, sched, state, LIMITS, last)
    if got is NotImplemented:
        assert not exactly_typed, "the C reader declined a step whose every object has its exact type"
        return
    want = _python_verdict(sched, state, last)
    assert _same(got, want), f"C reader: {got}\nPython reader: {want}"


def _mirror(rows: list[int], computed: list[int], tokens_ahead: list[int]) -> SimpleNamespace:
    """The three host-mirror arrays the steady readers read (the rest of the table is not touched)."""
    num_computed = np.zeros(LIMITS.max_num_reqs, np.int64)
    num_tokens = np.zeros(LIMITS.max_num_reqs, np.int64)
    num_blocks = np.zeros(LIMITS.max_num_reqs, np.int64)
    for row, c, ahead in zip(rows, computed, tokens_ahead):
        num_computed[row], num_tokens[row] = c, c + ahead
        # Enough blocks for the tokens before the step; one short when the step crosses into a new block.
        num_blocks[row] = c // LIMITS.block_size + (c % LIMITS.block_size != 0 or c == 0)
    return SimpleNamespace(num_computed=num_computed, num_tokens=num_tokens, num_blocks=num_blocks)


def _last(req_ids: tuple, rows: list[int]) -> StepArrays:
    n = len(req_ids)
    ones = np.ones(n, np.int64)
    return StepArrays(gone=(), cached_rows=np.zeros(0, np.int64), cached_computed=None, cached_new_blocks=np.zeros(0, np.int64),
                      block_appends=None, req_ids=req_ids, rows=np.array(rows, np.int64), new_positions=(), query_lens=ones,
                      starts=np.zeros(n, np.int64), ends=ones, known=ones, num_drafts=np.zeros(n, np.int64), drafts=None,
                      num_tokens=n, query_starts=np.arange(n + 1, dtype=np.int32), max_query_len=1, max_end=1,
                      uniform_query_len=1)


# Replacements for one entry of a field, and whether each keeps every object of its exact type.
ODD_COUNTS = (True, 1.0, None, np.int64(1), "1")
ODD_BLOCK_LISTS = (None, "", "4", np.array([3]), frozenset({3}), (True,), (3.0,), (np.int64(3),))


@st.composite
def steps(draw):
    n = draw(st.integers(1, 6))
    rows = draw(st.permutations(range(LIMITS.max_num_reqs)))[:n]
    computed = [draw(st.integers(0, 60)) for _ in range(n)]
    ahead = [draw(st.integers(1, 3)) for _ in range(n)]
    state = _mirror(rows, computed, ahead)
    req_ids = tuple(f"r{row}" for row in rows)
    last = _last(req_ids, rows)
    cached_ids = list(req_ids)
    scheduled = {rid: 1 for rid in req_ids}
    claimed = [int(state.num_computed[row]) for row in rows]
    # A block where the step crosses into one (start a multiple of the block size), else none.
    block_lists = [(draw(st.integers(0, LIMITS.num_kv_blocks - 1)),) if c % LIMITS.block_size == 0 and c else ()
                   for c in computed]
    exactly_typed = True
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, n - 1))
        kind = draw(st.sampled_from(["id", "id odd", "key order", "scheduled", "scheduled odd", "computed",
                                     "computed odd", "blocks", "blocks odd", "blocks list", "drop block"]))
        if kind == "id":
            cached_ids[i] = draw(st.sampled_from(["ghost", req_ids[(i + 1) % n], "r" + str(rows[i])]))
        elif kind == "id odd":
            cached_ids[i] = draw(st.sampled_from([Odd(req_ids[i]), 7, None]))
            exactly_typed = False
        elif kind == "key order" and n > 1:
            scheduled = dict(reversed(list(scheduled.items())))
        elif kind == "scheduled":
            scheduled[req_ids[i]] = draw(st.sampled_from([0, 2, -1, 2**70]))
        elif kind == "scheduled odd":
            scheduled[req_ids[i]] = draw(st.sampled_from(ODD_COUNTS))
            exactly_typed = False
        elif kind == "computed":
            c = computed[i]
            claimed[i] = draw(st.sampled_from([c + 1, c - 1, -1, 2**70, 2**40]))
        elif kind == "computed odd":
            claimed[i] = draw(st.sampled_from(ODD_COUNTS))
            exactly_typed = False
        elif kind == "blocks":
            block_lists[i] = draw(st.sampled_from([
                [5], [], (LIMITS.num_kv_blocks,), (-1,), tuple(range(20, 20 + MAX_BLOCKS + 1)), (3, 4), [2**70]]))
        elif kind == "blocks odd":
            block_lists[i] = draw(st.sampled_from(ODD_BLOCK_LISTS))
            exactly_typed = False
        elif kind == "blocks list":
            block_lists[i] = draw(st.sampled_from([[1], [1, 2]]))
        elif kind == "drop block":
            block_lists[i] = ()
    cached = CachedRequests(tuple(cached_ids), tuple(block_lists), tuple(claimed))
    return SchedulerOutput(step_id=9, cached_requests=cached, num_scheduled_tokens=scheduled), state, last, exactly_typed


@needs_native
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps())
def test_c_reader_agrees_with_the_python_reader(case):
    sched, state, last, exactly_typed = case
    assert_readers_agree(reader, sched, state, last, exactly_typed)


@needs_native
def test_c_reader_reads_a_steady_step_with_appends():
    rows = [3, 0, 5]
    state = _mirror(rows, [8, 9, 12], [1, 1, 1])
    last = _last(("a", "b", "c"), rows)
    sched = SchedulerOutput(step_id=2, cached_requests=CachedRequests(("a", "b", "c"), ((7,), (), [11, 12]), (8, 9, 12)),
                            num_scheduled_tokens={"a": 1, "b": 1, "c": 1})
    got = read_steady_native(reader, sched, state, LIMITS, last)
    assert got is not None and got is not NotImplemented
    assert got.starts.tolist() == [8, 9, 12] and got.ends.tolist() == [9, 10, 13] and got.known.tolist() == [9, 10, 13]
    assert [a.tolist() for a in got.block_appends] == [[3, 5], [1, 2], [7, 11, 12]]
    assert got.cached_rows is got.block_appends[0]
    assert_readers_agree(reader, sched, state, last, exactly_typed=True)


def test_planted_bug_c_reader_trusting_the_mirror_is_caught():
    """The comparison can fail: a build that never compares the scheduler's computed counts with the mirror."""
    trusting = _planted("trust_computed")
    rows = [1, 2]
    state = _mirror(rows, [5, 6], [1, 1])
    last = _last(("a", "b"), rows)
    off_by_one = SchedulerOutput(step_id=2, cached_requests=CachedRequests(("a", "b"), ((), ()), (5, 7)),
                                 num_scheduled_tokens={"a": 1, "b": 1})
    if reader is not None:
        assert_readers_agree(reader, off_by_one, state, last, exactly_typed=True)  # the real build rejects it too
    with pytest.raises(AssertionError, match="C reader"):
        assert_readers_agree(trusting, off_by_one, state, last, exactly_typed=True)


# --------------------------------------------------------------------------- the steady reader's checks

class OddCached(CachedRequests):
    """A `CachedRequests` subclass: `check_containers` rejects it, the C reader declines it."""


class OddSchedule(SchedulerOutput):
    """A `SchedulerOutput` subclass: the Python checks accept it, the C reader declines it."""


# Replacements of one top-level field: (field, value, every object still of its exact type).
FIELD_CHANGES = (
    ("step_id", -1, True), ("step_id", True, False), ("step_id", 9.0, False), ("step_id", "9", False),
    ("step_id", 2**70, False), ("step_id", 8, True), ("step_id", 10, True),
    ("new_requests", [], True), ("new_requests", None, False), ("new_requests", ("x",), True),
    ("finished_req_ids", set(), True), ("finished_req_ids", {"r0"}, True), ("finished_req_ids", [], False),
    ("preempted_req_ids", frozenset({"r1"}), True), ("preempted_req_ids", (), False),
    ("num_scheduled_tokens", None, False), ("num_scheduled_tokens", (), False),
    ("draft_token_ids", {"r0": (1,)}, True), ("draft_token_ids", [], False),
    ("num_device_drafts", {"r0": 1}, True), ("num_device_drafts", None, False),
    ("cached_requests", None, False), ("cached_requests", "odd", False), ("cached_requests", "lists", False),
    ("cached_requests", "short", False),
)


def _outcome(call):
    try:
        return call()
    except SchedulerOutputError as err:
        return type(err), str(err)


@needs_native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps(), st.lists(st.sampled_from(FIELD_CHANGES), max_size=2), st.sampled_from([None, 8, 9]), st.booleans(),
       st.booleans())
def test_c_reader_checks_the_step_as_the_python_checks(case, changes, last_step_id, subclass, no_last):
    """`read_steady_step` with the C reader against the Python checks and reader alone: the same error (class and
    text), None or arrays on steps with bad step ids, containers of other types, or something admitted, finished,
    preempted or drafted, with and without a last decode batch; the C reader declines only where an object is not
    of its exact type or the id is bad."""
    sched, state, last, exactly_typed = case
    if no_last:
        last = None  # no decode batch to repeat: the checks alone
    fields = {name: getattr(sched, name) for name in SchedulerOutput.__dataclass_fields__}
    cached = sched.cached_requests
    for name, value, exact in changes:
        if name == "cached_requests" and value == "odd":
            value = OddCached(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens)
        elif name == "cached_requests" and value == "lists":
            value = CachedRequests(list(cached.req_ids), cached.new_block_ids, cached.num_computed_tokens)
        elif name == "cached_requests" and value == "short":
            value = CachedRequests(cached.req_ids, cached.new_block_ids[1:], cached.num_computed_tokens)
        fields[name] = value
        exactly_typed &= exact
    sched = (OddSchedule if subclass else SchedulerOutput)(**fields)
    exactly_typed &= not subclass
    step_id = fields["step_id"]
    id_ok = type(step_id) is int and step_id >= 0 and (last_step_id is None or step_id > last_step_id)

    def python_only():
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(step_reader, "_native_reader", None)
            return step_reader.read_steady_step(sched, state, LIMITS, last_step_id, last)

    got = _outcome(lambda: step_reader.read_steady_step(sched, state, LIMITS, last_step_id, last))
    want = _outcome(python_only)
    if isinstance(want, StepArrays) or isinstance(got, StepArrays):
        assert _same(got, want), f"C reader: {got}\nPython reader: {want}"
    else:
        assert got == want, f"C reader: {got}\nPython reader: {want}"
    if exactly_typed and id_ok:
        assert read_steady_native(reader, sched, state, LIMITS, last, last_step_id) is not NotImplemented, \
            "the C reader declined a step whose every object has its exact type"


def test_planted_bug_c_reader_accepting_a_stale_step_id_is_caught():
    """The comparison can fail: a build whose steady reader never compares the step id with the last one."""
    stale = _planted("stale_step_id")
    rows = [1, 2]
    state = _mirror(rows, [5, 6], [1, 1])
    last = _last(("a", "b"), rows)
    repeated = SchedulerOutput(step_id=9, cached_requests=CachedRequests(("a", "b"), ((), ()), (5, 6)),
                               num_scheduled_tokens={"a": 1, "b": 1})
    with pytest.raises(StepIdError):
        step_reader.read_steady_step(repeated, state, LIMITS, 9, last)  # the real build (or Python) rejects it
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_reader, "_native_reader", stale)
        got = step_reader.read_steady_step(repeated, state, LIMITS, 9, last)
    assert isinstance(got, StepArrays), "the planted build should accept the repeated step id"


# --------------------------------------------------------------------------- the general reader's cached block

class Rejected(Exception):
    """What `_diagnose` raises here: the tests compare verdicts, not the error the full validator names."""


def _reject(*args, **kwargs):
    raise Rejected


def _general_mirror(rows: list[int], computed: list[int], unconfirmed: list[int]) -> SimpleNamespace:
    """What `_read_cached` reads of the table: the row map and the mirror's arrays."""
    mirror = _mirror(rows, computed, [1] * len(rows))
    mirror.req_to_row = {f"r{row}": row for row in rows}
    mirror.unconfirmed_drafts = np.zeros(LIMITS.max_num_reqs, np.int64)
    for row, k in zip(rows, unconfirmed):
        mirror.unconfirmed_drafts[row] = k
    mirror.max_num_reqs = LIMITS.max_num_reqs
    return mirror


def _c_cached(c_reader, sched, state, gone_rows):
    cached = sched.cached_requests
    return c_reader.read_cached(cached.req_ids, cached.num_computed_tokens, cached.new_block_ids, state.req_to_row,
                                step_reader._EMPTY if gone_rows is None else gone_rows, state.num_computed,
                                state.num_blocks, MAX_BLOCKS, LIMITS.num_kv_blocks)


def assert_cached_readers_agree(c_reader, sched, state, gone_rows, exactly_typed: bool) -> None:
    """C ``read_cached`` against `_read_cached`: NotImplemented only for an object of another type; None
    exactly when the Python reader rejects the step or reads a shift; else the same rows, counts and appends."""
    got = _c_cached(c_reader, sched, state, gone_rows)
    if got is NotImplemented:
        assert not exactly_typed, "the C reader declined cached requests whose every object has its exact type"
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_reader, "_diagnose", _reject)
        try:
            crows, _, cnew, appends, shift = step_reader._read_cached(sched, state, LIMITS, None, gone_rows)
            want = None if shift is not None else (crows, cnew, appends)
        except (Rejected, SchedulerOutputError):
            want = None
    if got is None or want is None:
        assert got is want, f"C reader: {got}\nPython reader: {want}"
        return
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), f"C reader: {got}\nPython reader: {want}"
    assert (got[2] is None) == (want[2] is None), f"C reader: {got}\nPython reader: {want}"
    if got[2] is not None:
        assert all(np.array_equal(a, b) for a, b in zip(got[2], want[2])), f"C reader: {got}\nPython reader: {want}"


@st.composite
def cached_blocks(draw):
    """The cached requests of a step that admits or finishes: live rows, some leaving (``gone_rows``), and
    entries near the accepted case -- ids unknown, repeated, leaving or mistyped, computed counts off (inside
    or outside the unconfirmed drafts' window) or mistyped, block lists empty, out of range, too long, mistyped."""
    n = draw(st.integers(1, 6))
    rows = draw(st.permutations(range(LIMITS.max_num_reqs)))[:n]
    computed = [draw(st.integers(0, 60)) for _ in range(n)]
    unconfirmed = [draw(st.integers(0, 2)) for _ in range(n)]
    state = _general_mirror(rows, computed, unconfirmed)
    listed = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    ids = [f"r{rows[i]}" for i in listed]
    claimed = [computed[i] for i in listed]
    block_lists: list = [(draw(st.integers(0, LIMITS.num_kv_blocks - 1)),) if draw(st.booleans()) else () for _ in listed]
    leaving = [rows[i] for i in range(n) if i not in listed and draw(st.booleans())]
    exactly_typed = True
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(ids) - 1))
        kind = draw(st.sampled_from(["id", "id odd", "leaving", "computed", "computed odd", "blocks", "blocks odd"]))
        if kind == "id":
            ids[i] = draw(st.sampled_from(["ghost", "", ids[(i + 1) % len(ids)]]))
        elif kind == "id odd":
            ids[i] = draw(st.sampled_from([Odd(ids[i]), 7, None]))
            exactly_typed = False
        elif kind == "leaving":
            leaving.append(rows[listed[i]])
        elif kind == "computed":
            c = computed[listed[i]]
            claimed[i] = draw(st.sampled_from([c + 1, c - 1, c - 2, -1, 2**70]))
        elif kind == "computed odd":
            claimed[i] = draw(st.sampled_from(ODD_COUNTS))
            exactly_typed = False
        elif kind == "blocks":
            block_lists[i] = draw(st.sampled_from([[5], [], (LIMITS.num_kv_blocks,), (-1,), tuple(range(MAX_BLOCKS + 1)),
                                                   (3, 4), [2**70]]))
        else:
            block_lists[i] = draw(st.sampled_from(ODD_BLOCK_LISTS))
            exactly_typed = False
    cached = CachedRequests(tuple(ids), tuple(block_lists), tuple(claimed))
    gone_rows = np.array(leaving, np.int64) if leaving else None
    return SchedulerOutput(step_id=9, cached_requests=cached), state, gone_rows, exactly_typed


@needs_native
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cached_blocks())
def test_c_cached_reader_agrees_with_the_python_reader(case):
    sched, state, gone_rows, exactly_typed = case
    assert_cached_readers_agree(general, sched, state, gone_rows, exactly_typed)


def test_planted_bug_c_cached_reader_trusting_the_mirror_is_caught():
    """The comparison can fail: the build whose readers never compare the computed counts with the mirror."""
    trusting = _planted("trust_computed", "general")
    state = _general_mirror([1, 2], [5, 6], [0, 0])
    off_by_one = SchedulerOutput(step_id=2, cached_requests=CachedRequests(("r1", "r2"), ((), ()), (5, 7)))
    if general is not None:
        assert_cached_readers_agree(general, off_by_one, state, None, True)  # the real build rejects it too
    with pytest.raises(AssertionError, match="C reader"):
        assert_cached_readers_agree(trusting, off_by_one, state, None, True)


@st.composite
def scheduled_counts(draw):
    """Scheduled counts of live, leaving and unknown ids, some keys or counts of other types."""
    rows = draw(st.permutations(range(LIMITS.max_num_reqs)))[: draw(st.integers(0, 5))]
    r2r = {f"r{row}": row for row in rows}
    keys = draw(st.lists(st.sampled_from([*r2r, "new", "other", Odd("r0"), 3]), max_size=6, unique=True))
    scheduled = {key: draw(st.sampled_from([1, 1, 4, 0, -2, 2**70, True, 1.0])) for key in keys}
    exactly_typed = all(type(k) is str and type(v) is int and v < 2**63 for k, v in scheduled.items())
    cached_ids = tuple(k for k in keys if k in r2r and type(k) is str)[: draw(st.integers(0, 3))]
    leaving = [row for row in rows if draw(st.integers(0, 4)) == 0]
    gone_rows = np.array(leaving, np.int64) if leaving else None
    mirror = [np.array([draw(st.integers(0, 99)) for _ in range(LIMITS.max_num_reqs)], np.int64) for _ in range(3)]
    return scheduled, r2r, gone_rows, cached_ids, mirror, exactly_typed


@needs_native
@settings(max_examples=300, deadline=None)
@given(scheduled_counts())
def test_c_scheduled_reader_agrees_with_the_python_reader(case):
    scheduled, r2r, gone_rows, cached_ids, mirror, exactly_typed = case
    got = general.read_scheduled(scheduled, r2r, step_reader._EMPTY if gone_rows is None else gone_rows, *mirror)
    if got is NotImplemented:
        assert not exactly_typed, "the C reader declined scheduled counts whose every object has its exact type"
        return
    cached_rows = np.array([r2r[rid] for rid in cached_ids], np.int64)
    want = step_reader._read_scheduled(scheduled, r2r, gone_rows, cached_ids, cached_rows, *mirror)
    if got is None or want is None:
        assert got is want, f"C reader: {got}\nPython reader: {want}"
        return
    assert got[0] == want[0] and all(np.array_equal(a, b) for a, b in zip(got[1:], want[1:])), \
        f"C reader: {got}\nPython reader: {want}"


BIG = 2**63 - 3  # a count whose sum with a start wraps a 64-bit integer


@st.composite
def batches(draw):
    """A batch's counts against its requests' mirror values: inside or just past each rule's bound."""
    n = draw(st.integers(1, 6))
    lens = np.array([draw(st.sampled_from([1, 1, 2, 4, 0, -1, 17, BIG])) for _ in range(n)], np.int64)
    starts = np.array([draw(st.integers(0, 62)) for _ in range(n)], np.int64)
    known = starts + np.array([draw(st.integers(0, 5)) for _ in range(n)], np.int64)
    blocks = np.array([draw(st.integers(0, MAX_BLOCKS)) for _ in range(n)], np.int64)
    drafts = np.array([draw(st.integers(0, 2)) for _ in range(n)], np.int64) if draw(st.booleans()) else None
    return lens, starts, known, blocks, drafts


def assert_batch_checks_agree(c_reader, lens, starts, known, blocks, drafts) -> None:
    got = c_reader.check_batch(lens, starts, known, blocks, drafts, LIMITS.block_size, LIMITS.max_model_len,
                               LIMITS.max_num_batched_tokens)
    want = step_reader._check_batch(lens, starts, known, blocks, drafts, LIMITS)
    if got is None or want is None:
        assert got is want, f"C check: {got}\nnumpy check: {want}"
        return
    (ends, total, starts_c, *summaries), (want_ends, want_total, want_starts, *want_summaries) = got, want
    assert starts_c.dtype == want_starts.dtype == np.int32, (starts_c.dtype, want_starts.dtype)
    assert (np.array_equal(ends, want_ends) and total == want_total and np.array_equal(starts_c, want_starts)
            and summaries == want_summaries), f"C check: {got}\nnumpy check: {want}"


@needs_native
@settings(max_examples=300, deadline=None)
@given(batches())
def test_c_batch_check_agrees_with_the_numpy_check(batch):
    assert_batch_checks_agree(general, *batch)


@needs_native
def test_a_count_that_wraps_the_total_is_rejected_by_both_checks():
    """Two counts whose int64 sum wraps below the budget: the per-request validator rejects it, so must both."""
    lens, starts = np.array([BIG, 10], np.int64), np.array([5, 0], np.int64)
    assert_batch_checks_agree(general, lens, starts, starts + 20, np.full(2, MAX_BLOCKS, np.int64), None)
    assert step_reader._check_batch(lens, starts, starts + 20, np.full(2, MAX_BLOCKS, np.int64), None, LIMITS) is None


# --------------------------------------------------------------------------- the Python twins

def test_the_runner_reads_steady_steps_with_the_python_twin(monkeypatch):
    """With the C reader off, `read_steady_step` still reads steady steps (the test_steady_step run, reader off)."""
    import test_steady_step

    monkeypatch.setattr(step_reader, "_native_reader", None)
    test_steady_step.test_steady_reader_agrees_with_the_full_reader_on_a_decode_run()


def test_the_bad_input_catalogue_holds_with_the_python_twin(monkeypatch):
    """The bad-input suite's variants (general steps 3 and 4, steady step 5) with the C readers and the C
    new-request check off: the same
    typed errors, no state changed (the suite itself runs with the C readers whenever they are built)."""
    from test_bad_inputs import _runner, _schedule, _throw, _variants_at_3, _variants_at_4, _variants_at_5

    monkeypatch.setattr(step_reader, "_native_reader", None)
    monkeypatch.setattr(step_reader, "_native_general", None)
    monkeypatch.setattr(step_reader, "_native_boundary", None)
    runner, outputs, seen = _runner(), [], {}
    for step, variants in enumerate((None, None, None, _variants_at_3, _variants_at_4, _variants_at_5)):
        if variants is not None:
            _throw(runner, variants(_schedule(step, outputs)), seen)
        outputs.append(runner.execute_model(_schedule(step, outputs)).get())
    assert len(seen) >= 100


def admitting_run() -> tuple[int, int]:
    """The bad-input suite's valid run (admissions, finishes, preemptions, drafts): (requests admitted, steps read
    as steady)."""
    from test_bad_inputs import NUM_STEPS, _runner, _schedule

    runner, outputs, admitted, steady = _runner(), [], 0, 0
    for step in range(NUM_STEPS):
        sched = _schedule(step, outputs)
        admitted += len(sched.new_requests)
        outputs.append(runner.execute_model(sched).get())
        steady += runner.last_step_stats.steady
    return admitted, steady


class _Counting:
    """A stand-in for the built module that counts how often each C function did the work (did not decline)."""

    def __init__(self, module):
        self._module = module
        self.done: dict[str, int] = {}

    def __getattr__(self, name: str):
        fn = getattr(self._module, name)

        def counted(*args):
            result = fn(*args)
            if result is not NotImplemented:
                self.done[name] = self.done.get(name, 0) + 1
            return result

        return counted


@needs_native
def test_a_decode_run_takes_the_c_path(monkeypatch):
    """The runner's steady steps are read, advanced and packed in C (a build that declined everything, or a
    call site that stopped calling it, would leave the numpy path silently doing the work)."""
    import test_steady_step

    counting, writing = _Counting(reader), _Counting(native.load("rows"))
    monkeypatch.setattr(step_reader, "_native_reader", counting)
    monkeypatch.setattr(state_module, "_rows", writing)
    monkeypatch.setattr(staged_writes, "_staging", packing := _Counting(native.load("staging")))
    test_steady_step.test_steady_reader_agrees_with_the_full_reader_on_a_decode_run()
    # The run's steady steps (>= 8 there) are read twice each: by the test and by the runner.
    assert counting.done.get("read_steady", 0) >= 16, counting.done
    assert writing.done.get("advance_decode", 0) >= 8, writing.done
    assert packing.done.get("pack_ragged", 0) >= 2, packing.done


@needs_native
def test_a_run_that_admits_reads_its_general_steps_in_c(monkeypatch):
    """The general reader's cached block and batch are read in C (admissions, finishes, drafts)."""
    from test_bad_inputs import NUM_STEPS

    counting, writing = _Counting(general), _Counting(native.load("rows"))
    monkeypatch.setattr(step_reader, "_native_general", counting)
    monkeypatch.setattr(state_module, "_rows", writing)
    admitted, steady = admitting_run()
    assert writing.done.get("admit_staged", 0) == admitted, writing.done  # every admission written in C, in one call
    assert writing.done.get("release_request", 0) >= 1, writing.done  # and the releases
    num_general = NUM_STEPS - steady
    # read_general reads the steps without drafts in one call (its parts inside); the others call the parts.
    done = counting.done.get
    assert done("read_general_of", 0) + done("read_scheduled", 0) == num_general, counting.done
    assert done("read_general_of", 0) >= 1 and done("read_scheduled", 0) >= 1, counting.done
    assert done("read_general_of", 0) + done("read_cached", 0) >= num_general - 1, counting.done  # the first step caches nothing


class _WithoutGeneral:
    """The built module with read_general declining every step: read_step then runs its parts one by one."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name: str):
        if name == "read_general_of":
            return lambda *args: NotImplemented
        return getattr(self._module, name)


def _without_drafts(sched: SchedulerOutput) -> SchedulerOutput:
    """``sched`` with its drafted requests scheduled for one token and no drafts (a step read_general reads)."""
    counts = {rid: (1 if rid in sched.draft_token_ids else n) for rid, n in sched.num_scheduled_tokens.items()}
    return dataclasses.replace(sched, draft_token_ids={}, num_scheduled_tokens=counts)


def _read_outcome(sched, runner):
    try:
        return step_reader.read_step(sched, runner.state, runner.limits, runner._last_step_id)
    except SchedulerOutputError as err:
        return type(err), str(err)


def _same_outcome(a, b) -> bool:
    if isinstance(a, StepArrays) and isinstance(b, StepArrays):
        return _same(a, b)
    return a == b


@needs_native
def test_c_general_reader_agrees_with_its_parts(monkeypatch):
    """read_general against read_step's parts (C and Python) on the bad-input suite's run and every one of its bad
    variants: the same StepArrays or the same error, class and text; it reads the run's steps without drafts."""
    from test_bad_inputs import _runner, _schedule, _variants_at_3, _variants_at_4, _variants_at_5

    counting, without = _Counting(general), _WithoutGeneral(general)
    runner, outputs, compared = _runner(), [], 0
    for step, variants in enumerate((None, None, None, _variants_at_3, _variants_at_4, _variants_at_5)):
        good = _schedule(step, outputs)
        bases = [good] if step != 3 else [good, _without_drafts(good)]  # step 3 drafts: read by the parts
        schedules = list(bases)
        if variants is not None:
            schedules += [bad for base in bases for _, _, bad, _ in variants(base)]
        for sched in schedules:
            monkeypatch.setattr(step_reader, "_native_general", counting)
            got = _read_outcome(sched, runner)
            monkeypatch.setattr(step_reader, "_native_general", without)
            want = _read_outcome(sched, runner)
            assert _same_outcome(got, want), f"step {step}: read_general {got}\nits parts {want}"
            compared += 1
        monkeypatch.setattr(step_reader, "_native_general", general)
        outputs.append(runner.execute_model(good).get())
    assert compared >= 100 and counting.done.get("read_general_of", 0) >= 3, (compared, counting.done)


def _runner_at_step_3():
    """The bad-input suite's runner after its first three steps, and its fourth step without drafts (a step
    read_general reads)."""
    from test_bad_inputs import _runner, _schedule

    runner, outputs = _runner(), []
    for step in range(3):
        outputs.append(runner.execute_model(_schedule(step, outputs)).get())
    return runner, _without_drafts(_schedule(3, outputs))


def test_planted_bug_general_reader_admitting_a_live_id_again_is_caught(monkeypatch):
    """The comparison above can fail: a build whose read_general takes a new request under an id that is live (and
    not leaving), which `read_step` rejects as a duplicate."""
    planted = _planted("live_id_readmitted", "general")
    runner, good = _runner_at_step_3()
    live = next(iter(runner.state.req_to_row))
    again = NewRequest(live, (1, 2), SamplingParams(), (9,))
    sched = dataclasses.replace(good, new_requests=good.new_requests + (again,))
    want = _read_outcome(sched, runner)
    assert want[0] is DuplicateRequestError, want
    monkeypatch.setattr(step_reader, "_native_general", planted)
    assert not _same_outcome(_read_outcome(sched, runner), want)


def test_planted_bug_general_reader_ignoring_the_new_requests_facts_is_caught(monkeypatch):
    """The comparison above can fail: a build whose read_general leaves a new request's prefix-cache hit at 0."""
    planted = _planted("new_hit_zero", "general")
    runner, good = _runner_at_step_3()
    hit = NewRequest("H", (1, 2, 3, 4, 5), SamplingParams(), (9, 10), num_computed_tokens=4)
    sched = dataclasses.replace(good, new_requests=good.new_requests + (hit,),
                                num_scheduled_tokens={**good.num_scheduled_tokens, "H": 1})
    monkeypatch.setattr(step_reader, "_native_general", _WithoutGeneral(general) if general is not None else None)
    want = _read_outcome(sched, runner)
    assert isinstance(want, StepArrays), want
    monkeypatch.setattr(step_reader, "_native_general", planted)
    assert not _same_outcome(_read_outcome(sched, runner), want)


@needs_native
def test_c_general_reader_makes_the_step_arrays_read_step_would_make(monkeypatch):
    """read_general_of stores a StepArrays slot by slot (no __init__): the same fields as the tuple it returns when
    that type's layout is not the one it reads, which read_step turns into a StepArrays itself."""
    runner, sched = _runner_at_step_3()
    made_in_c = _read_outcome(sched, runner)
    targets = step_reader._general_targets(runner.state, runner.limits)
    as_tuple = general.read_general_of(sched, targets[:-3] + (dict, targets[-2], targets[-1]), runner._last_step_id,
                                       *(runner.state.batch_hint or (None, None)))
    assert type(made_in_c) is StepArrays and type(as_tuple) is tuple  # another type: its layout is not read
    monkeypatch.setattr(step_reader, "_native_general", _WithoutGeneral(general))
    assert _same_outcome(made_in_c, _read_outcome(sched, runner))


def test_planted_bug_general_reader_storing_two_slots_swapped_is_caught(monkeypatch):
    """The comparison above can fail: a build whose StepArrays holds each step's starts where its ends belong."""
    planted = _planted("step_slots_swapped", "general")
    runner, sched = _runner_at_step_3()
    monkeypatch.setattr(step_reader, "_native_general", _WithoutGeneral(general) if general is not None else None)
    want = _read_outcome(sched, runner)
    monkeypatch.setattr(step_reader, "_native_general", planted)
    got = _read_outcome(sched, runner)
    assert type(got) is StepArrays and not _same_outcome(got, want)


def test_planted_bug_general_reader_accepting_a_stale_step_id_is_caught(monkeypatch):
    """read_general checks the step id itself (a step with no decode step before it reaches no other check
    first): a build that never compares it with the last one reads a repeated step id as a step."""
    planted = _planted("stale_step_id", "general")
    from test_bad_inputs import _runner, _schedule

    runner, outputs = _runner(), []
    for step in range(3):
        outputs.append(runner.execute_model(_schedule(step, outputs)).get())
    repeated = dataclasses.replace(_without_drafts(_schedule(3, outputs)), step_id=runner._last_step_id)
    with pytest.raises(StepIdError):
        step_reader.read_step(repeated, runner.state, runner.limits, runner._last_step_id)  # the real build rejects it
    monkeypatch.setattr(step_reader, "_native_general", planted)
    got = step_reader.read_step(repeated, runner.state, runner.limits, runner._last_step_id)
    assert isinstance(got, StepArrays), "the planted build should accept the repeated step id"
