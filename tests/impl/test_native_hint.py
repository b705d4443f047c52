"""The cached reader's batch hint (`runnercheck.impl.state.RequestStateTable.batch_hint`, `impl/native/general.c` read_cached).

A cached id that is the same object as one of the last planned batch's next few ids (past requests
that left) takes that batch's row instead of a look-up in ``req_to_row``.  The hint is an accelerator,
never a source of truth: on generated batches -- the last batch's ids again, some gone, some new, the
order shuffled, equal ids that are other objects -- the reader with the hint returns exactly what it
returns without it (the rows ``req_to_row`` holds); a build that takes the row after the hint's
is caught by that comparison.  The table clears the hint at every admission and release, so it never
names a row that changed hands: a request released and admitted again (the same id object, another
row) is read at its new row, and a table that kept its hint past a release is caught.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import runnercheck.impl.step_reader as step_reader
from runnercheck.impl.device import Device
from runnercheck.impl.interface import CachedRequests, NewRequest, SamplingParams, SchedulerOutput
from runnercheck.impl.state import RequestStateTable
from test_native import LIMITS, MAX_BLOCKS, _planted, general, needs_native

NUM_ROWS = LIMITS.max_num_reqs


def _copy(rid: str) -> str:
    return "".join(list(rid))  # equal, another object


@st.composite
def hinted_batches(draw):
    """(req_to_row, hint ids, hint rows, cached ids): a valid hint (every hint id holds its row) and a batch of
    live ids drawn around it."""
    rows = draw(st.permutations(range(NUM_ROWS)))
    live = [f"r{i}" for i in range(draw(st.integers(1, NUM_ROWS)))]
    req_to_row = {rid: rows[i] for i, rid in enumerate(live)}
    hint_ids = tuple(draw(st.lists(st.sampled_from(live), unique=True, max_size=len(live))))
    kept = [rid for rid in hint_ids if draw(st.booleans()) or draw(st.booleans())]  # most stay, in order
    others = [rid for rid in live if rid not in kept and draw(st.booleans())]
    cached = kept + others
    if draw(st.booleans()):
        cached = draw(st.permutations(cached))
    # Equal ids that are other objects: found by the look-up, never by the hint.
    cached = [_copy(rid) if draw(st.integers(0, 4)) == 0 else rid for rid in cached]
    hint_rows = np.array([req_to_row[rid] for rid in hint_ids], np.int64)
    return req_to_row, hint_ids, hint_rows, tuple(cached)


def _read(c_reader, req_to_row: dict, cached: tuple, hint_ids, hint_rows):
    computed = np.zeros(NUM_ROWS, np.int64)
    blocks = np.ones(NUM_ROWS, np.int64)
    return c_reader.read_cached(cached, (0,) * len(cached), ((),) * len(cached), req_to_row, step_reader._EMPTY,
                                computed, blocks, MAX_BLOCKS, LIMITS.num_kv_blocks, hint_ids, hint_rows)


def _assert_hint_changes_nothing(c_reader, batch) -> None:
    req_to_row, hint_ids, hint_rows, cached = batch
    with_hint = _read(c_reader, req_to_row, cached, hint_ids, hint_rows)
    without = _read(c_reader, req_to_row, cached, None, None)
    assert isinstance(with_hint, tuple) and isinstance(without, tuple), (with_hint, without)
    expected = [req_to_row[rid] for rid in cached]
    assert with_hint[0].tolist() == without[0].tolist() == expected, (with_hint[0], expected, hint_ids, cached)


@needs_native
@settings(max_examples=300, deadline=None)
@given(hinted_batches())
def test_the_hint_finds_the_rows_a_look_up_finds(batch):
    _assert_hint_changes_nothing(general, batch)


_R2R = {"a": 6, "b": 2, "c": 7, "d": 0, "f": 1, "g": 3, "h": 5, "e": 4}
_HINT = ("a", "b", "c", "d", "f", "g", "h")
HAND_CASES = {  # cached ids around the hint ("a".."h" at rows 6, 2, 7, 0, 1, 3, 5; "e" not in it)
    "the same batch": ("a", "b", "c", "d", "f", "g", "h"),
    "one left": ("a", "c", "d", "f", "g", "h"),
    "three left in a row": ("a", "f", "g", "h"),
    "five left in a row (look-ups)": ("a", "h"),
    "one new at the end": ("a", "b", "c", "d", "f", "g", "h", "e"),
    "reordered": ("h", "g", "f", "d", "c", "b", "a"),
    "equal copies": (_copy("a"), "b", _copy("c"), "d"),
    "only new": ("e",),
}


@needs_native
@pytest.mark.parametrize("case", HAND_CASES)
def test_the_hint_finds_the_rows_a_look_up_finds_by_hand(case):
    hint_rows = np.array([_R2R[rid] for rid in _HINT], np.int64)
    _assert_hint_changes_nothing(general, (_R2R, _HINT, hint_rows, HAND_CASES[case]))


@needs_native
def test_planted_bug_a_reader_taking_the_row_after_the_hints_is_caught():
    planted = _planted("hint_off_by_one", "general")
    req_to_row = {"a": 3, "b": 5, "c": 1}
    ids = tuple(req_to_row)
    batch = (req_to_row, ids, np.array([3, 5, 1], np.int64), ids)
    _assert_hint_changes_nothing(general, batch)
    with pytest.raises(AssertionError):
        _assert_hint_changes_nothing(planted, batch)


def _req(rid: str) -> NewRequest:
    return NewRequest(rid, (1, 2, 3), SamplingParams(temperature=0.0), (0,))


def _step(step_id: int, ids: tuple[str, ...]) -> SchedulerOutput:
    return SchedulerOutput(step_id=step_id, new_requests=(), cached_requests=CachedRequests(ids, ((),) * len(ids), (0,) * len(ids)),
                           num_scheduled_tokens={rid: 1 for rid in ids}, finished_req_ids=frozenset())


def _rows_after_a_readmission() -> tuple[list[int], list[int]]:
    """A batch planned, one of its requests released and admitted again under the same id object (another row),
    then the same batch read: (the rows read, the rows ``req_to_row`` holds)."""
    table = RequestStateTable(Device("cpu"), max_num_reqs=4, max_model_len=16)
    ids = ("a", "b", "c")
    rows = np.array([table.admit(_req(rid), seed=0) for rid in ids], np.int64)
    table.plan_rows(ids, rows, rows + 1, rows + 3)
    assert table.batch_hint is not None and table.batch_hint[0] is ids
    table.release("a")
    table.admit(_req(ids[0]), seed=0)  # the free list's first row, not the one it held
    assert table.req_to_row["a"] != rows[0]
    step = step_reader.read_step(_step(0, ids), table, LIMITS, None)
    return step.rows.tolist(), [table.req_to_row[rid] for rid in ids]


@needs_native
def test_a_released_and_readmitted_request_is_read_at_its_new_row():
    got, want = _rows_after_a_readmission()
    assert got == want


@needs_native
def test_planted_bug_a_table_keeping_its_hint_past_a_release_is_caught(monkeypatch):
    release, admit = RequestStateTable.release, RequestStateTable.admit

    def keeping(method):
        def wrapper(self, *args, **kwargs):
            planned = self._planned  # the batch the hint reads
            result = method(self, *args, **kwargs)
            self._planned = planned
            return result
        return wrapper

    monkeypatch.setattr(RequestStateTable, "release", keeping(release))
    monkeypatch.setattr(RequestStateTable, "admit", keeping(admit))
    got, want = _rows_after_a_readmission()
    assert got != want, "a stale hint went unnoticed"
