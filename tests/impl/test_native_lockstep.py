"""read_general's one-pass reader (`impl/native/general.c` read_in_lockstep) against its passes.

A general step as a decode batch usually brings it -- the scheduled dict listing the cached requests
first, each key the very object of its cached id and in that order, then the new requests -- is read
in one pass; any other step, and any step where a rule fails, goes to read_cached, read_scheduled and
check_batch as before (the variant ``general_passes_only`` of tests/impl/native_plants.py builds the reader with those passes alone:
the reference here).  Over a churning decode workload (admissions and finishes every few steps, the
runner's host side stepping its mirror with the device work dropped), each step and a set of damaged
copies of it -- counts off by one, a block out of range, the dict reordered, an equal id that is
another object, a missing or extra request -- must read the same through both builds.  A build whose
one-pass reader skips the known-tokens rule is caught by that comparison.  The batch the one pass accepts
becomes the next hint, whose ids are not read for their type again; any other hint's are (a build that
trusts every hint takes a str subclass the passes decline).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import runnercheck.impl.step_reader as step_reader
from runnercheck.bench import case_runner
from runnercheck.bench.common import BenchContext
from runnercheck.impl.device import Device
from runnercheck.impl.interface import CachedRequests, SchedulerOutput
from test_native import Odd, _planted, general, needs_native

PASSES_ONLY = "general_passes_only"


def _copy(rid: str) -> str:
    return "".join(list(rid))  # equal, another object


def _workload(num_reqs: int = 12, churn: float = 0.08):
    device = Device("cpu", seed=0, lag_policy="run-immediately")
    case_runner.drop_device_work(device)  # the host side alone: its mirror steps as on a GPU
    return case_runner.host_cost_setup(BenchContext(device, quick=False), num_reqs, churn)


def _read(module, sched: SchedulerOutput, runner):
    state, limits = runner.state, runner.limits
    return module.read_general(
        sched, SchedulerOutput, CachedRequests, None, state.req_to_row, step_reader._native_boundary.check_new_request,
        step_reader._check_new_args(limits), limits.max_num_reqs, state.num_computed, state.num_blocks, state.num_tokens,
        limits.block_size, limits.max_model_len, limits.max_num_batched_tokens, limits.num_kv_blocks,
        *(state.batch_hint or step_reader._NO_HINT))


def _read_hinted(module, sched: SchedulerOutput, runner, hint_ids: tuple, hint_rows: np.ndarray):
    """`_read` with the hint given, not the runner's."""
    saved = runner.state._planned
    runner.state._planned = (hint_ids, hint_rows, None, None)
    try:
        return _read(module, sched, runner)
    finally:
        runner.state._planned = saved


def _same(a, b) -> bool:
    if a is NotImplemented or b is NotImplemented:
        return a is b
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and x.dtype == y.dtype
                    and np.array_equal(x, y)):
                return False
        elif isinstance(x, tuple) and x and isinstance(x[0], np.ndarray):  # the appends
            if not (isinstance(y, tuple) and len(x) == len(y) and all(np.array_equal(p, q) for p, q in zip(x, y))):
                return False
        elif x != y:
            return False
    return True


def _with_cached(sched: SchedulerOutput, **fields) -> SchedulerOutput:
    return dataclasses.replace(sched, cached_requests=dataclasses.replace(sched.cached_requests, **fields))


def _damaged(sched: SchedulerOutput, num_kv_blocks: int):
    """Copies of ``sched`` each with one thing wrong or unusual (named), for the builds to read alike."""
    cached, counts = sched.cached_requests, sched.num_scheduled_tokens
    if not cached.req_ids:
        return
    first, last = cached.req_ids[0], cached.req_ids[-1]
    computed = list(cached.num_computed_tokens)
    for shift in (1, -1):
        yield f"computed {shift:+d}", _with_cached(sched, num_computed_tokens=tuple([computed[0] + shift] + computed[1:]))
    for count in (0, counts[last] + 1, 1 << 62):
        yield f"count {count}", dataclasses.replace(sched, num_scheduled_tokens={**counts, last: count})
    blocks = list(cached.new_block_ids)
    yield "block out of range", _with_cached(sched, new_block_ids=tuple([tuple(blocks[0]) + (num_kv_blocks,)] + blocks[1:]))
    yield "blocks as a list", _with_cached(sched, new_block_ids=tuple([list(blocks[0])] + blocks[1:]))
    yield "dict reordered", dataclasses.replace(sched, num_scheduled_tokens={
        **{k: v for k, v in counts.items() if k != first}, first: counts[first]})
    yield "equal id, another object", dataclasses.replace(sched, num_scheduled_tokens={
        (_copy(k) if k == last else k): v for k, v in counts.items()})
    yield "cached id not scheduled", dataclasses.replace(sched, num_scheduled_tokens={
        k: v for k, v in counts.items() if k != last})
    yield "unknown id scheduled", dataclasses.replace(sched, num_scheduled_tokens={**counts, "nobody": 1})
    yield "cached id twice", _with_cached(sched, req_ids=cached.req_ids[:-1] + (first,))
    if sched.finished_req_ids:
        gone = next(iter(sched.finished_req_ids))
        yield "finished and scheduled", dataclasses.replace(sched, num_scheduled_tokens={**counts, gone: 1})
    for req in sched.new_requests:
        yield "new past its prefill", dataclasses.replace(sched, num_scheduled_tokens={
            **counts, req.req_id: len(req.prompt_token_ids) + 1})
        yield "new id equal, another object", dataclasses.replace(sched, num_scheduled_tokens={
            (_copy(k) if k == req.req_id else k): v for k, v in counts.items()})


@needs_native
def test_the_one_pass_reader_reads_as_the_passes_over_a_churning_workload():
    passes = _planted(PASSES_ONLY, "general")
    runner, work, limits = _workload()
    compared = accepted = admitting = 0
    for _ in range(60):
        sched = work.next_step()
        for name, damaged in [("as scheduled", sched), *_damaged(sched, limits.num_kv_blocks)]:
            got, want = _read(general, damaged, runner), _read(passes, damaged, runner)
            assert _same(got, want), f"step {sched.step_id}, {name}:\none pass {got}\npasses {want}"
            compared += 1
            accepted += got is not NotImplemented
        admitting += bool(sched.new_requests)
        runner.execute_model(sched).get()
    assert admitting >= 10 and accepted >= 60 and compared >= 600, (admitting, accepted, compared)


@needs_native
def test_a_finishing_step_is_read_in_one_pass():
    """The one-pass reader's mark: a step that admits nothing keeps the cached ids' own tuple as its batch."""
    runner, work, _ = _workload(churn=0.0)
    runner.execute_model(work.next_step()).get()
    sched = work.next_step()
    gone = sched.cached_requests.req_ids[0]
    keep = slice(1, None)
    cached = sched.cached_requests
    finishing = dataclasses.replace(
        sched, finished_req_ids=frozenset({gone}),
        cached_requests=CachedRequests(cached.req_ids[keep], cached.new_block_ids[keep], cached.num_computed_tokens[keep]),
        num_scheduled_tokens={k: v for k, v in sched.num_scheduled_tokens.items() if k != gone})
    got = _read(general, finishing, runner)
    assert got is not NotImplemented and got[0] == (gone,)
    assert got[4] is finishing.cached_requests.req_ids
    want = _read(_planted(PASSES_ONLY, "general"), finishing, runner)
    assert _same(got, want) and want[4] is not finishing.cached_requests.req_ids


def test_planted_bug_one_pass_reader_skipping_the_known_tokens_is_caught():
    """The comparison above can fail: a one-pass reader that never reads the tokens known accepts a cached request
    scheduled past them, which the passes (and `read_step`) reject."""
    planted = _planted("lockstep_known_unread", "general")
    passes = _planted(PASSES_ONLY, "general")
    runner, work, _ = _workload()
    caught = 0
    for _ in range(10):
        sched = work.next_step()
        last = sched.cached_requests.req_ids[-1]
        past = dataclasses.replace(sched, num_scheduled_tokens={**sched.num_scheduled_tokens, last: 2})
        if not _same(_read(planted, past, runner), _read(passes, past, runner)):
            caught += 1
        runner.execute_model(sched).get()
    assert caught == 10


@needs_native
def test_only_the_batch_the_one_pass_accepted_is_trusted_as_a_hint():
    """An id found in the hint is not read for its type when the hint is the batch the one pass accepted last (each
    of its ids was an exact str); any other hint's ids are.  A build that trusts every hint takes an id of another
    type (an equal str subclass) that an unchecked hint holds, which the passes decline."""
    runner, work, _ = _workload(churn=0.0)
    sched = work.next_step()
    got = _read(general, sched, runner)
    assert got is not NotImplemented
    ids, rows = got[4], got[6]
    assert _same(_read_hinted(general, sched, runner, ids, rows), got)  # the checked batch as the hint
    odd = Odd(ids[0])
    odd_ids = (odd, *ids[1:])
    cached = sched.cached_requests
    oddly = dataclasses.replace(
        sched, cached_requests=CachedRequests(odd_ids, cached.new_block_ids, cached.num_computed_tokens),
        num_scheduled_tokens={(odd if k == ids[0] else k): v for k, v in sched.num_scheduled_tokens.items()})
    for module in (general, _planted(PASSES_ONLY, "general")):
        assert _read_hinted(module, oddly, runner, odd_ids, rows) is NotImplemented
    trusting = _planted("hint_trusted", "general")
    assert _read_hinted(trusting, oddly, runner, odd_ids, rows) is not NotImplemented
