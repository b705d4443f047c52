"""The request state table's writes in C (`impl/native/rows.c`) against their numpy references.

On generated batches each C function leaves the table's arrays exactly as its reference
(`RequestStateTable.advance`'s no-draft update, `append_blocks`, `admit`'s mirror writes) leaves them,
declines what it does not take (another dtype, a frozen array, a row out of range, a
token outside int32) with NotImplemented before writing anything, and builds with planted bugs (an
advance that forgets the sampled token, appends placed after their own blocks, prefill tokens one
column late) are caught by the same comparisons.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import runnercheck.impl.native as native
import runnercheck.impl.state as state_module
from runnercheck.impl.device import Device
from runnercheck.impl.interface import NewRequest, SamplingParams, effective_seed
from runnercheck.impl.block_table import BlockTable
from runnercheck.impl.sample.state import SamplingState
from runnercheck.impl.staged_writes import StagedWriteGroup
from runnercheck.impl.admission import AdmissionWriters
from runnercheck.impl.state import RequestStateTable
from test_native import _planted

rows_module = native.load("rows")
needs_native = pytest.mark.skipif(rows_module is None, reason="impl/native not built (or RUNNERCHECK_NATIVE=0)")

# --------------------------------------------------------------------------- the mirror's advance

NUM_ROWS = 8


def _advanced(c_module, rows: np.ndarray, ends: np.ndarray, known: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(num_tokens, num_computed) after `RequestStateTable.advance` of a planned decode batch, with ``c_module``
    as its C twin (None: numpy)."""
    table = SimpleNamespace(num_tokens=np.arange(NUM_ROWS, dtype=np.int64) * 3, num_computed=np.arange(NUM_ROWS, dtype=np.int64),
                            unconfirmed_drafts=np.zeros(NUM_ROWS, np.int64), req_to_row={}, _prefilling={})
    req_ids = tuple(f"r{r}" for r in rows)
    table._planned = (req_ids, rows, ends, known)
    saved = state_module._rows
    state_module._rows = c_module
    try:
        RequestStateTable.advance(table, req_ids, None, None)
    finally:
        state_module._rows = saved
    return table.num_tokens, table.num_computed


@st.composite
def decode_batches(draw):
    n = draw(st.integers(0, NUM_ROWS))
    rows = np.array(draw(st.permutations(range(NUM_ROWS)))[:n], np.int64)
    ends = np.array([draw(st.integers(1, 100)) for _ in range(n)], np.int64)
    known = ends + np.array([draw(st.integers(-1, 3)) for _ in range(n)], np.int64)  # at, past or behind the end
    return rows, ends, known


def assert_c_agrees(name: str, written, c_module, *case) -> None:
    """``written(c_module, *case)`` -- the arrays a table method leaves -- equal with ``c_module`` and with numpy
    (None); the message names the C function ``name``."""
    got, want = written(c_module, *case), written(None, *case)
    assert all(np.array_equal(a, b) for a, b in zip(got, want)), f"C {name}: {got}\nnumpy: {want}"


@needs_native
@settings(max_examples=200, deadline=None)
@given(decode_batches())
def test_c_advance_writes_what_numpy_writes(batch):
    assert_c_agrees("advance", _advanced, rows_module, *batch)


@needs_native
def test_c_advance_declines_what_it_cannot_read():
    rows = np.array([1, 2], np.int64)
    assert rows_module.advance_decode(rows.astype(np.int32), rows, rows, np.zeros(4, np.int64), np.zeros(4, np.int64)) is NotImplemented
    frozen = np.zeros(4, np.int64)
    frozen.flags.writeable = False
    assert rows_module.advance_decode(rows, rows, rows, frozen, np.zeros(4, np.int64)) is NotImplemented
    out_of_range = np.zeros(2, np.int64)
    assert rows_module.advance_decode(np.array([1, 9], np.int64), rows, rows, out_of_range, out_of_range) is NotImplemented
    assert not out_of_range.any()  # declined before writing


def test_planted_bug_c_advance_forgetting_the_sampled_token_is_caught():
    forgetting = _planted("no_sample", "rows")
    at_the_end = (np.array([3], np.int64), np.array([10], np.int64), np.array([10], np.int64))
    with pytest.raises(AssertionError, match="C advance"):
        assert_c_agrees("advance", _advanced, forgetting, *at_the_end)


@st.composite
def block_appends(draw):
    """Block counts of every row and this step's appends: distinct rows, a few blocks each."""
    counts = np.array(draw(st.lists(st.integers(0, 40), min_size=NUM_ROWS, max_size=NUM_ROWS)), np.int64)
    n = draw(st.integers(0, NUM_ROWS))
    rows = np.array(draw(st.permutations(range(NUM_ROWS)))[:n], np.int64)
    appended = np.array([draw(st.integers(1, 3)) for _ in range(n)], np.int64)
    return counts, rows, appended


def _appended(c_module, counts: np.ndarray, rows: np.ndarray, appended: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, counts after) by ``c_module``'s ``append_counts`` (None: `RequestStateTable.append_blocks`'s numpy)."""
    table = RequestStateTable(Device("cpu"), max_num_reqs=len(counts), max_model_len=64)
    table.num_blocks[:] = counts
    if c_module is None:
        saved, state_module._rows = state_module._rows, None
        try:
            starts = table.append_blocks(rows, appended)
        finally:
            state_module._rows = saved
    else:
        starts = c_module.append_counts(table.num_blocks, rows, appended)
    return starts, table.num_blocks


@needs_native
@settings(max_examples=200, deadline=None)
@given(block_appends())
def test_c_block_appends_place_and_count_what_numpy_does(appends):
    assert_c_agrees("append_counts", _appended, rows_module, *appends)


@needs_native
def test_c_block_appends_decline_what_they_cannot_take():
    counts = np.array([1, 2, 3], np.int64)
    for rows in (np.array([3], np.int64), np.array([-1], np.int64), np.array([1], np.int32)):
        assert rows_module.append_counts(counts, rows, np.ones(len(rows), np.int64)) is NotImplemented, rows
    frozen = counts.copy()
    frozen.flags.writeable = False
    assert rows_module.append_counts(frozen, np.array([1], np.int64), np.ones(1, np.int64)) is NotImplemented
    assert counts.tolist() == [1, 2, 3]  # declined before writing


@needs_native
def test_c_block_appends_naming_a_row_twice_do_what_numpy_does():
    """Not a step the boundary lets through, but the C twin still matches its reference: every start read first,
    the later count written last."""
    assert_c_agrees("append_counts", _appended, rows_module, np.array([4, 0, 7], np.int64), np.array([1, 1], np.int64),
                    np.array([2, 3], np.int64))


def test_planted_bug_c_appends_placed_after_their_own_blocks_are_caught():
    planted = _planted("starts_after_append", "rows")
    one_append = (np.array([4, 0, 7], np.int64), np.array([2], np.int64), np.array([1], np.int64))
    with pytest.raises(AssertionError, match="C append_counts"):
        assert_c_agrees("append_counts", _appended, planted, *one_append)


# --------------------------------------------------------------------------- an admission's row

MODEL_LEN = 16


@st.composite
def admissions(draw):
    """A request admitted into a table with one live request already: its prompt, outputs, blocks and parameters."""
    prompt = tuple(draw(st.lists(st.integers(0, 99), min_size=1, max_size=MODEL_LEN // 2)))
    outputs = tuple(draw(st.lists(st.integers(0, 99), max_size=MODEL_LEN - len(prompt))))
    params = SamplingParams(logprobs=draw(st.one_of(st.none(), st.integers(0, 5))),
                            prompt_logprobs=draw(st.one_of(st.none(), st.integers(0, 5))))
    blocks = tuple(range(draw(st.integers(1, 4))))
    hit = draw(st.integers(0, len(prompt) - 1))
    return NewRequest("new", prompt, params, blocks, num_computed_tokens=hit, output_token_ids=outputs)


def _table_after(c_module, act, history_reads: bool = False) -> RequestStateTable:
    """A 3-row table after ``act(table)``, run with ``c_module`` as `runnercheck.impl.state`'s C twin (None: the reference)."""
    table = RequestStateTable(Device("cpu"), max_num_reqs=3, max_model_len=MODEL_LEN)
    table.history_reads = history_reads
    saved, state_module._rows = state_module._rows, c_module
    try:
        act(table)
    finally:
        state_module._rows = saved
    return table


def _admit_next_to_old(table: RequestStateTable, req: NewRequest, old_params: SamplingParams = SamplingParams()) -> None:
    table.admit(NewRequest("old", (5, 6, 7), old_params, (9,)), seed=1)
    table.admit(req, seed=2)


def _admitted(c_module, req: NewRequest) -> list[np.ndarray]:
    """Every array `RequestStateTable.admit` writes, after admitting ``req`` next to a live request, with
    ``c_module`` as the C twin of its mirror writes (None: numpy)."""
    table = _table_after(c_module, lambda t: _admit_next_to_old(t, req))
    return [table.prefill_tokens.numpy().copy(), *(column.copy() for column in table._admitted_columns)]


@needs_native
@settings(max_examples=100, deadline=None)
@given(admissions())
def test_c_admission_writes_the_row_numpy_writes(req):
    assert_c_agrees("admit_row", _admitted, rows_module, req)


@needs_native
def test_c_admission_declines_what_it_cannot_take():
    prefill = np.zeros((2, 4), np.int32)
    column = np.zeros(2, np.int64)
    frozen = column.copy()
    frozen.flags.writeable = False
    for args in ((prefill, 2, [1], (column,), (1,)),  # a row past the table
                 (prefill, 0, [1] * 5, (column,), (1,)),  # more tokens than a row holds
                 (prefill, 0, [1 << 40], (column,), (1,)),  # a token outside int32
                 (prefill, 0, [True], (column,), (1,)),  # not an exact int
                 (prefill, 0, (1,), (frozen,), (1,)),
                 (prefill, 0, (1,), (column,), (1.0,)),
                 (prefill.astype(np.int64), 0, (1,), (column,), (1,)),
                 (prefill[:, ::2], 0, (1,), (column,), (1,)),  # not C-contiguous
                 (prefill, 0, (1,), (column, column), (1,))):  # a value missing
        assert rows_module.admit_row(*args) is NotImplemented, args
    assert not prefill.any() and not column.any()  # declined before writing


def test_planted_bug_c_admission_writing_the_prefill_one_column_late_is_caught():
    planted = _planted("prefill_shifted", "rows")
    with pytest.raises(AssertionError, match="C admit_row"):
        assert_c_agrees("admit_row", _admitted, planted, NewRequest("new", (3, 4), SamplingParams(), (0,)))


def _admitted_table(c_module, req: NewRequest) -> list:
    """Everything `RequestStateTable.admit` leaves besides its arrays, after admitting ``req`` next to a live request
    (``c_module``: its C twin; None: the reference): the rows' records, the look-ups, the row-state diffs staged, the
    counts and the next generation."""
    table = _table_after(c_module, lambda t: _admit_next_to_old(t, req, SamplingParams(logprobs=1)))
    return [np.array(repr((table.rows, sorted(table.req_to_row.items()), sorted(table._prefilling.items()),
                           table.row_state._pending, table.num_logprob_rows, table.num_prompt_logprob_rows,
                           table._next_generation)))]


@needs_native
@settings(max_examples=100, deadline=None)
@given(admissions())
def test_c_admission_records_the_request_as_the_reference_does(req):
    assert_c_agrees("admit_request", _admitted_table, rows_module, req)


@needs_native
def test_c_admission_of_a_request_it_cannot_take_declines_before_writing():
    """``admit_request`` declines -- nothing written, the reference then admits -- for a request it does not read."""
    table = RequestStateTable(Device("cpu"), max_num_reqs=2, max_model_len=4)
    targets = table._admit_targets
    good = NewRequest("a", (1, 2), SamplingParams(), (0,))
    for req in (NewRequest("a", [1, 2], SamplingParams(), (0,)),  # a list prompt: not the exact tuple it reads
                NewRequest("a", (1, 2), SamplingParams(), (0,), output_token_ids=(1 << 40,)),  # a token outside int32
                NewRequest("a", (1, 2, 3), SamplingParams(), (0,), output_token_ids=(4, 5)),  # longer than a row
                NewRequest("a", (), SamplingParams(), (0,)),  # no last token
                NewRequest("a", (1, True), SamplingParams(), (0,)),  # not an exact int
                SimpleNamespace(**vars(good))):  # not a NewRequest
        assert rows_module.admit_request(targets, req, 7, 0, 0) is NotImplemented, req
    assert rows_module.admit_request(targets, good, 7, 2, 0) is NotImplemented  # a row past the table
    assert rows_module.admit_request(targets, good, 7.0, 0, 0) is NotImplemented  # a seed that is not an exact int
    assert not table._prefill_np.any() and not table.req_to_row and not table._prefilling and table.rows == [None, None]
    assert all((column == column[0]).all() for column in table._admitted_columns)  # every row as it was made
    staged, asks_logprobs, asks_prompt = rows_module.admit_request(targets, good, 7, 1, 0)
    assert staged == [0, 2, 2, 2, 2] and (asks_logprobs, asks_prompt) == (False, False)
    assert table.req_to_row == {"a": 1} and table.rows[1].seed == 7 and table._prefill_np[1, :2].tolist() == [1, 2]


def test_planted_bug_c_admission_recording_the_previous_generation_is_caught():
    planted = _planted("admit_generation_reused", "rows")
    with pytest.raises(AssertionError, match="C admit_request"):
        assert_c_agrees("admit_request", _admitted_table, planted, NewRequest("new", (3, 4), SamplingParams(), (0,)))


# --------------------------------------------------------------------------- a release's row

def _released(c_module, req: NewRequest, release_first: bool) -> list[np.ndarray]:
    """Every array and count `RequestStateTable.release` writes, after admitting ``req`` next to a live request and
    releasing one of them, with ``c_module`` as the C twin of its mirror writes (None: numpy)."""
    table = _table_after(c_module, lambda t: _admit_and_release(t, req, release_first))
    counts = np.array([table.num_logprob_rows, table.num_prompt_logprob_rows], np.int64)
    return [*(column.copy() for column in table._admitted_columns), counts]


def _admit_and_release(table: RequestStateTable, req: NewRequest, release_first: bool) -> int:
    _admit_next_to_old(table, req, SamplingParams(logprobs=2))
    table._batch_event = "the newest marker"  # a marked step: a release notes it for a row still prefilling
    return table.release("old" if release_first else "new")


@needs_native
@settings(max_examples=100, deadline=None)
@given(admissions(), st.booleans())
def test_c_release_writes_the_row_numpy_writes(req, release_first):
    assert_c_agrees("swap_row", _released, rows_module, req, release_first)


def _released_table(c_module, req: NewRequest, release_first: bool, history_reads: bool = False) -> list:
    """Everything `RequestStateTable.release` leaves besides its arrays, as `_released` sets it up (its step's marker
    a stand-in): the look-ups, the records, the rows still prefilling, each row's last reading step, the free list
    and the counts."""
    released = []
    table = _table_after(c_module, lambda t: released.append(_admit_and_release(t, req, release_first)), history_reads)
    return [np.array(repr((released, sorted(table.req_to_row.items()), table.rows, sorted(table._prefilling.items()),
                           table._reads_over, list(table._free), table.num_logprob_rows, table.num_prompt_logprob_rows,
                           table._planned)))]


@needs_native
@settings(max_examples=100, deadline=None)
@given(admissions(), st.booleans(), st.booleans())
def test_c_release_records_what_the_reference_records(req, release_first, history_reads):
    assert_c_agrees("release_request", _released_table, rows_module, req, release_first, history_reads)


@needs_native
def test_c_release_of_an_id_without_a_row_declines_and_the_reference_names_it():
    table = RequestStateTable(Device("cpu"), max_num_reqs=2, max_model_len=4)
    assert rows_module.release_request(table._release_targets, "ghost", None, False) is NotImplemented
    with pytest.raises(state_module.RowStateError, match="ghost"):
        table.release("ghost")
    assert list(table._free) == [0, 1] and table.generation.tolist() == [-1, -1]


def test_planted_bug_c_release_forgetting_a_prefilling_rows_last_reader_is_caught():
    planted = _planted("release_reads_over_kept", "rows")
    with pytest.raises(AssertionError, match="C release_request"):
        assert_c_agrees("release_request", _released_table, planted, NewRequest("new", (3, 4), SamplingParams(), (0,)), True)


@needs_native
def test_c_release_declines_what_it_cannot_take():
    column = np.arange(2, dtype=np.int64)
    frozen = column.copy()
    frozen.flags.writeable = False
    for args in ((2, (column,), (-1,)),  # a row past the column
                 (-1, (column,), (-1,)),
                 (0, (frozen,), (-1,)),
                 (0, (column,), (-1.0,)),
                 (0, (column,), (True,)),  # not an exact int
                 (0, (column.astype(np.int32),), (-1,)),
                 (0, (column, column), (-1,)),  # a value missing
                 (0, (column,) * 17, (-1,) * 17)):  # more columns than it writes
        assert rows_module.swap_row(*args) is NotImplemented, args
    assert column.tolist() == [0, 1]  # declined before writing
    assert rows_module.swap_row(1, (column,), (-1,)) == (1,) and column.tolist() == [0, -1]


def test_planted_bug_c_release_reading_back_what_it_wrote_is_caught():
    planted = _planted("swap_returns_new", "rows")
    with pytest.raises(AssertionError, match="C swap_row"):
        assert_c_agrees("swap_row", _released, planted, NewRequest("new", (3, 4), SamplingParams(), (0,)), True)


# --------------------------------------------------------------------------- an admission with its stagings

@st.composite
def staged_admissions(draw):
    """A request (`admissions`) with the sampling parameters and blocks an admission stages: an own seed or none,
    parameters given as floats or ints, no blocks at all (a request whose prompt is all cached? -- an empty list)."""
    req = draw(admissions())
    params = SamplingParams(temperature=draw(st.sampled_from([0.0, 0.7, 1, 2])), top_k=draw(st.sampled_from([-1, 5])),
                            top_p=draw(st.sampled_from([1.0, 0.9])), repetition_penalty=draw(st.sampled_from([1.0, 2])),
                            seed=draw(st.one_of(st.none(), st.integers(0, 2**40))),
                            logprobs=req.sampling_params.logprobs, prompt_logprobs=req.sampling_params.prompt_logprobs)
    blocks = req.block_ids if draw(st.booleans()) else ()
    return NewRequest(req.req_id, req.prompt_token_ids, params, blocks, num_computed_tokens=req.num_computed_tokens,
                      output_token_ids=req.output_token_ids)


def _staged_owners(c_module, block_cells: bool = False):
    """A table, block table and sampling state in one group, and the writers of `admit_staged` (C twin ``c_module``;
    None: the reference)."""
    group = StagedWriteGroup(Device("cpu"), "admissions")
    table = RequestStateTable(Device("cpu"), max_num_reqs=3, max_model_len=MODEL_LEN, group=group)
    blocks = BlockTable(Device("cpu"), 3, MODEL_LEN, 4, group=group)
    sampling = SamplingState(Device("cpu"), 3, 100, group=group)
    group.seal()
    if block_cells:
        blocks.table.stage_scalar(2, 1)  # a cell pending: `stage_list` would stage another way
    writers = AdmissionWriters.of(table, blocks, sampling)
    if c_module is None:
        writers = AdmissionWriters(blocks, sampling, writers.targets, None)
    return table, blocks, sampling, writers


def _staged(c_module, req: NewRequest, block_cells: bool = False) -> list:
    """Everything an admission of ``req`` next to a live request leaves in the table, the block table and the sampling
    state, and the seeds it notes (``c_module``: `admit_staged`'s C twin, with `runnercheck.impl.state`'s; None: the reference)."""
    saved, state_module._rows = state_module._rows, c_module
    try:
        table, blocks, sampling, writers = _staged_owners(c_module, block_cells)
        seeds: dict[str, int] = {}
        for admitted in (NewRequest("old", (5, 6, 7), SamplingParams(logprobs=1), (9,)), req):
            table.admit_staged(admitted, 123, writers, seeds)
    finally:
        state_module._rows = saved
    group = table.row_state.group
    return [table.prefill_tokens.numpy().copy(), *(column.copy() for column in table._admitted_columns),
            np.array(repr((table.rows, sorted(table.req_to_row.items()), sorted(table._prefilling.items()),
                           table.row_state._pending, blocks.table._pending, [t.name for t in group._dirty],
                           sampling.admission_records, sampling._pending_admissions, seeds, table.num_logprob_rows,
                           table.num_prompt_logprob_rows, table._next_generation, list(table._free))))]


@needs_native
@settings(max_examples=100, deadline=None)
@given(staged_admissions())
def test_c_staged_admission_stages_what_the_owners_methods_stage(req):
    assert_c_agrees("admit_staged", _staged, rows_module, req)


@needs_native
def test_c_staged_admission_with_a_block_cell_pending_declines_and_the_reference_stages_it():
    req = NewRequest("new", (3, 4), SamplingParams(), (0, 1))
    table, blocks, sampling, writers = _staged_owners(rows_module, block_cells=True)
    assert rows_module.admit_staged(table._admit_targets, writers.targets, req, 1, writers.derive, 0, 0, {}) is NotImplemented
    assert not table.req_to_row and not blocks.table._pending and not sampling.admission_records  # nothing written
    assert_c_agrees("admit_staged", _staged, rows_module, req, True)


@needs_native
def test_c_staged_admission_declines_before_writing():
    """What ``admit_staged`` does not read -- a seed it cannot derive or take, a parameter of another type, what
    ``admit_request`` declines -- leaves every owner as it was."""
    table, blocks, sampling, writers = _staged_owners(rows_module)
    good = NewRequest("a", (1, 2), SamplingParams(), (0,))
    cases = [(good, 1 << 70), (good, -1.5),  # a base seed derived_seed declines
             (NewRequest("a", (1, 2), SamplingParams(seed=True), (0,)), 1),  # an own seed that is not an exact int
             (NewRequest("a", (1, 2), SamplingParams(temperature=np.float32(1.0)), (0,)), 1),
             (NewRequest("a", (1, 2), SamplingParams(top_k=5.0), (0,)), 1),
             (NewRequest("a", (1, 2), SamplingParams(), tuple(range(MODEL_LEN))), 1),  # more blocks than a row holds
             (NewRequest("a", [1, 2], SamplingParams(), (0,)), 1)]  # what admit_request declines
    for req, base_seed in cases:
        seeds: dict[str, int] = {}
        got = rows_module.admit_staged(table._admit_targets, writers.targets, req, base_seed, writers.derive, 0, 0, seeds)
        assert got is NotImplemented, req
        assert not seeds
    assert not table.req_to_row and not table._prefilling and table.rows == [None] * 3 and not table._prefill_np.any()
    assert not table.row_state._pending and not blocks.table._pending and not table.row_state.group._dirty
    assert not sampling.admission_records and not sampling._pending_admissions
    seeds = {}
    assert rows_module.admit_staged(table._admit_targets, writers.targets, good, 1, writers.derive, 0, 0, seeds) is not NotImplemented
    assert seeds == {"a": effective_seed(good.sampling_params, "a", 1)} and table.req_to_row == {"a": 0}
    assert blocks.table._pending == [(0, 0, [0])] and [t.name for t in table.row_state.group._dirty] == ["row_state", "block_table"]
    assert sampling.admission_records == {0: ((1.0, -1, 1.0, 0.0, 1.0, 0.0, 0.0, seeds["a"]), (1, 2))}


def test_planted_bug_c_staged_admission_that_never_joins_the_dirty_list_is_caught():
    planted = _planted("staged_never_joins", "rows")
    with pytest.raises(AssertionError, match="C admit_staged"):
        assert_c_agrees("admit_staged", _staged, planted, NewRequest("new", (3, 4), SamplingParams(), (0,)))


# --------------------------------------------------------------------------- the end of a row's prefill reads

@st.composite
def prefill_reads(draw):
    """Rows still prefilling (row -> prefill length) and the mirror's computed counts and unconfirmed drafts."""
    rows = draw(st.lists(st.integers(0, NUM_ROWS - 1), unique=True, max_size=NUM_ROWS))
    prefilling = {row: draw(st.integers(1, 40)) for row in rows}
    computed = np.array(draw(st.lists(st.integers(0, 50), min_size=NUM_ROWS, max_size=NUM_ROWS)), np.int64)
    unconfirmed = np.array(draw(st.lists(st.integers(0, 3), min_size=NUM_ROWS, max_size=NUM_ROWS)), np.int64)
    return prefilling, computed, unconfirmed


def _prefill_reads_ended(c_module, prefilling: dict, computed: np.ndarray, unconfirmed: np.ndarray) -> list[np.ndarray]:
    """The rows still prefilling and each row's last reader after `RequestStateTable.advance`'s end of the prefill
    reads (``c_module``: its C twin; None: `_end_prefill_reads`)."""
    table = SimpleNamespace(num_computed=computed, unconfirmed_drafts=unconfirmed, _prefilling=dict(prefilling),
                            _reads_over=[None] * NUM_ROWS, _batch_event="newest")
    if c_module is None:
        RequestStateTable._end_prefill_reads(table)
    else:
        assert c_module.end_prefill_reads(table._prefilling, computed, unconfirmed, table._reads_over, "newest") is True
    return [np.array(repr((table._prefilling, table._reads_over)))]


@needs_native
@settings(max_examples=200, deadline=None)
@given(prefill_reads())
def test_c_end_of_prefill_reads_moves_the_rows_the_reference_moves(case):
    assert_c_agrees("end_prefill_reads", _prefill_reads_ended, rows_module, *case)


@needs_native
def test_c_end_of_prefill_reads_declines_before_writing():
    computed, unconfirmed = np.full(40, 9, np.int64), np.zeros(40, np.int64)
    for prefilling, over in (({1: 2.0}, [None] * 40), ({True: 2}, [None] * 40), ({41: 2}, [None] * 40),
                             ({1: 2}, [None] * 1),  # a row past the readers' list
                             ({row: 1 for row in range(17)}, [None] * 40)):  # more rows ended than it holds
        before = dict(prefilling)
        assert rows_module.end_prefill_reads(prefilling, computed, unconfirmed, over, "e") is NotImplemented
        assert prefilling == before and set(over) == {None}
    assert rows_module.end_prefill_reads({1: 2}, computed.astype(np.int32), unconfirmed, [None] * 40, "e") is NotImplemented


def test_planted_bug_c_prefill_reads_ended_early_are_caught():
    planted = _planted("prefill_ends_early", "rows")
    half_computed = ({2: 10}, np.full(NUM_ROWS, 4, np.int64), np.zeros(NUM_ROWS, np.int64))
    with pytest.raises(AssertionError, match="C end_prefill_reads"):
        assert_c_agrees("end_prefill_reads", _prefill_reads_ended, planted, *half_computed)
