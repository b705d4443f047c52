"""The staged writes' packing in C (`impl/native/staging.c`) against its Python references.

On generated writes the C functions produce exactly the words their references produce: the
one-ragged diff table (`StagedWriteGroup._flush_one_ragged`'s numpy code), a general flush's diff
table from its gathered parts (`_join_parts` + `_fill_diff_table`: row diffs of three element types,
single-element cells, ragged sets and whole array rows in one group) and the prompt-token bitmask
(`runnercheck.impl.sample.state._prompt_bitmask_reference`); a sampling state's admission records packed in C
leave every member as their reference (`SamplingState._stage_admissions`, then the numpy flush)
leaves it, and keep their order against other writes.  Each declines what it does not take --
another type, dtype or length -- with NotImplemented and writes nothing.  Builds with planted bugs
(every source offset 0, bit 31 of each mask word lost, records' int64 rows one word apart) are
caught by the same comparisons, and a run that admits requests is packed in C.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import runnercheck.impl.native as native
import runnercheck.impl.sample.state as sampling_state_module
import runnercheck.impl.staged_writes as staged_writes
from runnercheck.impl.buffers import StagingPool, StagingWriter
from runnercheck.impl.device import Device
from runnercheck.impl.interface import SamplingParams
from runnercheck.impl.sample.state import SamplingState, _prompt_bitmask_reference
from runnercheck.impl.staged_writes import StagedWriteGroup, StagedWriteTensor
from test_native import _Counting, _planted, admitting_run

staging = native.load("staging")
needs_native = pytest.mark.skipif(staging is None, reason="impl/native not built (or RUNNERCHECK_NATIVE=0)")

TABLE_ROWS, TABLE_COLS = 6, 8
MASK_WORDS = 80  # a row of 64 words or more is staged as one array (`staged_writes._ARRAY_DIFF_MIN`)


def _flushed(c_module, stage) -> tuple[list[int], list]:
    """(the diff table's words, every member's base after the apply): ``stage(members)`` records writes into a
    group of four members on cpu, flushed with ``c_module`` as the group's C twin (None: numpy)."""
    dev = Device("cpu")
    group = StagedWriteGroup(dev, "packed")
    members = {
        "table": StagedWriteTensor(dev, (TABLE_ROWS, TABLE_COLS), torch.int32, "table", fill=-1, group=group),
        "scale": StagedWriteTensor(dev, TABLE_ROWS, torch.float32, "scale", fill=1.0, group=group),
        "seed": StagedWriteTensor(dev, TABLE_ROWS, torch.int64, "seed", fill=0, group=group),
        "mask": StagedWriteTensor(dev, (TABLE_ROWS, MASK_WORDS), torch.int32, "mask", fill=0, group=group),
    }
    group.seal()
    stage(members)
    writer = _flush_with(group, c_module)
    slot, start, n, _ = group._applies[0]
    words = slot.host_words[start : start + group.h2d_bytes_last_flush // 4].tolist()
    _apply(group, writer)
    return words, [m.base.tolist() for m in members.values()]


def _flush_with(group: StagedWriteGroup, c_module) -> StagingWriter:
    """``group`` flushed into a fresh two-slot pool's writer, with ``c_module`` as the C twin of the packing and of
    the prompt bitmask (None: numpy, the references)."""
    writer = StagingWriter(StagingPool(group.device, num_slots=2, capacity_bytes=1 << 14), 0)
    saved = staged_writes._staging, sampling_state_module._staging
    staged_writes._staging = sampling_state_module._staging = c_module
    try:
        group.flush(writer)
    finally:
        staged_writes._staging, sampling_state_module._staging = saved
    return writer


def _apply(group: StagedWriteGroup, writer: StagingWriter) -> None:
    """Submit the flushed writer, apply the group's diffs and wait for them."""
    writer.submit()
    group.enqueue_apply()
    group.device.synchronize()


# --------------------------------------------------------------------------- the one-ragged diff table

def _ragged_table(c_module, rows, starts, lens, values):
    return _flushed(c_module, lambda m: m["table"].stage_ragged(rows, starts, lens, values))


@st.composite
def ragged_sets(draw):
    n = draw(st.integers(1, TABLE_ROWS))
    rows = np.array(draw(st.permutations(range(TABLE_ROWS)))[:n], np.int64)
    lens = np.array([draw(st.integers(1, 3)) for _ in range(n)], np.int64)
    starts = np.array([draw(st.integers(0, TABLE_COLS - int(k))) for k in lens], np.int64)
    values = np.array([draw(st.integers(0, 1000)) for _ in range(int(lens.sum()))], np.int64)
    return rows, starts, lens, values


def assert_diff_tables_agree(c_module, rows, starts, lens, values) -> None:
    got, want = _ragged_table(c_module, rows, starts, lens, values), _ragged_table(None, rows, starts, lens, values)
    assert got == want, f"C diff table: {got}\nnumpy diff table: {want}"


@needs_native
@settings(max_examples=60, deadline=None)
@given(ragged_sets())
def test_c_diff_table_is_the_numpy_diff_table(ragged):
    assert_diff_tables_agree(staging, *ragged)


def test_planted_bug_c_diff_table_with_every_source_at_zero_is_caught():
    zero_sources = _planted("source_zero", "staging")
    two_appends = (np.array([1, 4], np.int64), np.array([2, 0], np.int64), np.ones(2, np.int64), np.array([17, 23], np.int64))
    with pytest.raises(AssertionError, match="C diff table"):
        assert_diff_tables_agree(zero_sources, *two_appends)


# --------------------------------------------------------------------------- a general flush's diff table

@st.composite
def general_writes(draw):
    """Writes in staging order: ("row", member, row, start, values), ("cell", member, row, value),
    ("mask", row, words) and at most one ("ragged", rows, starts, lens, values) into the table's rows
    that nothing else writes."""
    writes = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["row", "cell", "mask"]))
        row = draw(st.integers(0, TABLE_ROWS - 1))
        if kind == "mask":
            writes.append(("mask", row, np.array(draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=MASK_WORDS,
                                                               max_size=MASK_WORDS)), np.int32)))
            continue
        member = draw(st.sampled_from(["table", "scale", "seed"]))
        value = {"table": st.integers(-2**31, 2**31 - 1), "scale": st.floats(-1e6, 1e6, width=32),
                 "seed": st.integers(-2**63, 2**63 - 1)}[member]
        value = draw(value)
        if kind == "cell" or member != "table":
            writes.append(("cell", member, row, value) if kind == "cell" else ("row", member, row, 0, [value]))
        else:
            start = draw(st.integers(0, TABLE_COLS - 1))
            count = draw(st.integers(1, TABLE_COLS - start))
            writes.append(("row", "table", row, start, [draw(st.integers(-2**31, 2**31 - 1)) for _ in range(count)]))
    if draw(st.booleans()):  # appends into rows the other writes leave alone (a ragged set is never merged)
        free = [r for r in range(TABLE_ROWS) if not any(w[0] != "mask" and w[1] == "table" and w[2] == r for w in writes)]
        if free:
            rows = np.array(free[: draw(st.integers(1, len(free)))], np.int64)
            lens = np.ones(len(rows), np.int64)
            writes.append(("ragged", rows, np.zeros(len(rows), np.int64), lens, np.arange(len(rows), dtype=np.int64) + 7))
    return writes


def _stage_all(writes):
    def stage(members):
        for write in writes:
            if write[0] == "row":
                members[write[1]].stage(write[2], write[3], write[4])
            elif write[0] == "cell":
                members[write[1]].stage_scalar(write[2], write[3])
            elif write[0] == "mask":
                members["mask"].stage(write[1], 0, write[2])
            else:
                members["table"].stage_ragged(*write[1:])
    return stage


@needs_native
@settings(max_examples=40, deadline=None)
@given(general_writes())
def test_c_general_diff_table_is_the_numpy_diff_table(writes):
    if not writes:
        return  # nothing staged: nothing is packed
    got, want = _flushed(staging, _stage_all(writes)), _flushed(None, _stage_all(writes))
    assert got == want, f"C diff table: {got[0]}\nnumpy diff table: {want[0]}"


def test_planted_bug_c_general_diff_table_with_every_source_at_zero_is_caught():
    zero_sources = _planted("source_zero", "staging")
    writes = [("cell", "scale", 1, 0.5), ("cell", "seed", 2, 9), ("row", "table", 3, 1, [4, 5])]
    assert _flushed(zero_sources, _stage_all(writes)) != _flushed(None, _stage_all(writes))


@needs_native
def test_pack_members_declines_what_it_cannot_take():
    none: list = []
    table32 = (0, 8, 0)  # word offset, columns, element code: an int32 member
    rows, ones = np.array([1], np.int64), np.ones(1, np.int64)
    declined = [
        [(*table32, [(1, 0, [3, 2**31])], none)],  # a value outside int32
        [(*table32, [(1, 0, [3, True])], none)],  # a bool
        [(*table32, [(1, 0, [np.int32(3)])], none)],  # a numpy scalar (a merged row's)
        [(0, 8, 1, [(1, 0, [1])], none)],  # an int in a float32 member
        [(*table32, [(1, 0, np.array([3], np.int64))], none)],  # an array of another dtype than the member's
        [(*table32, [(1, 0, (3,))], none)],  # a tuple of values
        [(*table32, [(1.0, 0, [3])], none)],  # a float row
        [(0, 8, 1, none, [(rows, rows, ones, ones)])],  # a ragged set of a float32 member
        [(*table32, none, [(rows, rows, ones * 2, ones)])],  # lengths that do not sum to the values
        [(*table32, none, [(rows.astype(np.int32), rows, ones, ones)])],  # int32 rows
        [(0, 8, 3, none, none)],  # no such element code
        (tuple(table32) + (none, none),),  # a tuple of members
    ]
    for members in declined:
        assert staging.pack_members(None, members, ()) is NotImplemented, members
    for table, code in [({4: 1}, 1), ({4: 1.5}, 0), ({4: 2**31}, 0), ({4: 2**63}, 2), ({4: True}, 0), ({4: 1e39}, 1),
                        ({4.0: 1}, 0), ({4: 1}, 3)]:
        assert staging.pack_members(None, [], ((table, code),)) is NotImplemented, (table, code)
    assert staging.pack_members(None, [], [({4: 1}, 0)]) is NotImplemented  # a list of cell tables
    members = [(*table32, [(1, 2, [5, 6])], [(rows, rows, ones, ones * 9)])]
    assert staging.pack_members(None, members, (({4: float("inf")}, 1), ({6: -2}, 2))) == (4, 6, False)
    words = np.full(3 * 4 + 5, -1, np.int32)  # one word short: nothing written, the size to reserve
    assert staging.pack_members(words, members, (({4: float("inf")}, 1), ({6: -2}, 2))) == (4, 6, False)
    assert (words == -1).all()
    assert staging.pack_members(words.astype(np.int64), members, ()) is NotImplemented
    words = np.full(3 * 4 + 6 + 2, -1, np.int32)  # longer than the table: the words after it are not touched
    assert staging.pack_members(words, members, (({4: float("inf")}, 1), ({6: -2}, 2))) == (4, 6, True)
    assert words[-2:].tolist() == [-1, -1]
    # The ragged entry first, then the list diff, then the cells; sources count up through the lengths.
    assert words[:12].tolist() == [9, 1, 0, 10, 2, 1, 4, 1, 3, 6, 2, 4]
    assert words[12:15].tolist() == [9, 5, 6]
    assert words[15:16].view(np.float32)[0] == np.inf and words[16:].view(np.int64)[0] == -2


@needs_native
def test_a_table_packed_from_a_first_word_is_the_table_packed_alone():
    """``first`` (a reservation's first word in a slot's words: no view made) writes the same table from that word,
    and leaves the words around it; a table that does not fit after it, or a first word past the end, declines."""
    rows, starts, lens, values = np.array([1, 4], np.int64), np.array([2, 0], np.int64), np.ones(2, np.int64), np.array([17, 23], np.int64)
    alone = np.zeros(8, np.int32)
    assert staging.pack_ragged(alone, rows, starts, lens, values, 8, 3) is True
    slot_words = np.full(20, -1, np.int32)
    assert staging.pack_ragged(slot_words, rows, starts, lens, values, 8, 3, 5) is True
    assert slot_words[5:13].tolist() == alone.tolist() and (slot_words[:5] == -1).all() and (slot_words[13:] == -1).all()
    for first in (13, 21, -2):
        assert staging.pack_ragged(np.full(20, -1, np.int32), rows, starts, lens, values, 8, 3, first) is NotImplemented
    members = [((0, 8, 0, [(1, 2, [5, 6])], []))]
    alone = np.zeros(8, np.int32)
    assert staging.pack_members(alone, members, (), None, False, 0) == (1, 2, True, 0)
    slot_words = np.full(20, -1, np.int32)
    assert staging.pack_members(slot_words, members, (), None, False, 15) == (1, 2, True, 0)
    assert slot_words[15:20].tolist() == alone[:5].tolist() and (slot_words[:15] == -1).all()
    assert staging.pack_members(slot_words, members, (), None, False, 16) == (1, 2, False, 0)  # 4 words left: sized
    assert staging.pack_members(slot_words, members, (), None, False, 21) is NotImplemented


# --------------------------------------------------------------------------- the prompt bitmask

@st.composite
def prompts(draw):
    vocab = draw(st.integers(1, 300))
    tokens = draw(st.lists(st.integers(0, vocab - 1), max_size=40))
    return (tuple(tokens) if draw(st.booleans()) else tokens), vocab


def _c_bitmask(c_module, tokens, vocab) -> np.ndarray | None:
    words = np.full((vocab + 31) // 32, 12345, np.int32)
    return words if c_module.prompt_bitmask(words, tokens, vocab) is True else None


@needs_native
@settings(max_examples=100, deadline=None)
@given(prompts())
def test_c_prompt_bitmask_is_the_numpy_bitmask(prompt):
    tokens, vocab = prompt
    assert np.array_equal(_c_bitmask(staging, tokens, vocab), _prompt_bitmask_reference(tokens, vocab))
    assert np.array_equal(sampling_state_module.prompt_bitmask_words(tokens, vocab), _prompt_bitmask_reference(tokens, vocab))


def test_planted_bug_c_prompt_bitmask_losing_bit_31_is_caught():
    lost = _planted("mask_bit31_lost", "staging")
    tokens = (3, 31, 40)
    assert not np.array_equal(_c_bitmask(lost, tokens, 64), _prompt_bitmask_reference(tokens, 64))


@needs_native
def test_prompt_bitmask_declines_what_it_cannot_take():
    words = np.full(2, 7, np.int32)
    for tokens, vocab, out in [((1, 64), 64, words), ((1, -1), 64, words), ((True,), 64, words), ((np.int64(3),), 64, words),
                               (np.array([1]), 64, words), ((1,), 65, words), ((1,), 64, words.astype(np.int64)),
                               ((2**70,), 64, words)]:
        before = out.copy()
        assert staging.prompt_bitmask(out, tokens, vocab) is NotImplemented
        assert np.array_equal(out, before)
    # What the C function declines, the reference reads (numpy ints from an unchecked caller).
    assert np.array_equal(sampling_state_module.prompt_bitmask_words((np.int64(33),), 64), _prompt_bitmask_reference((33,), 64))


# --------------------------------------------------------------------------- admission records

VOCAB, STATE_ROWS = 200, 5  # 7 mask words: the reference stages a mask row as a list diff


@st.composite
def admissions(draw):
    """add_request calls (a row may be admitted twice: the later call wins) next to another member's row diffs and
    ragged appends, as a runner's step stages them."""
    calls = []
    for _ in range(draw(st.integers(1, 4))):
        params = SamplingParams(
            temperature=draw(st.sampled_from([0.0, 0.7, 1.0, 1e-3])), top_k=draw(st.sampled_from([-1, 1, 50, VOCAB])),
            top_p=draw(st.sampled_from([1.0, 0.5, 1e-6])), min_p=draw(st.sampled_from([0.0, 0.25])),
            repetition_penalty=draw(st.sampled_from([1.0, 1.3])), frequency_penalty=draw(st.sampled_from([0.0, -0.5])),
            presence_penalty=draw(st.sampled_from([0.0, 2.0])))
        prompt = draw(st.lists(st.integers(0, VOCAB - 1), max_size=12))
        kind = draw(st.sampled_from(["tuple", "list", "numpy ints"]))
        prompt = tuple(prompt) if kind == "tuple" else ([np.int64(t) for t in prompt] if kind == "numpy ints" else prompt)
        calls.append((draw(st.integers(0, STATE_ROWS - 1)), params, draw(st.integers(0, 2**63 - 1)), prompt))
    diffs = [(draw(st.integers(0, STATE_ROWS - 1)), draw(st.lists(st.integers(0, 999), min_size=1, max_size=3)))
             for _ in range(draw(st.integers(0, 3)))]
    return calls, diffs


def _admitted(c_module, calls, diffs) -> list:
    """Every base of a shared group holding a sampling state and a row table, after ``calls`` and ``diffs`` are
    flushed and applied with ``c_module`` as the C twin (None: the reference stages the records)."""
    dev = Device("cpu")
    group = StagedWriteGroup(dev, "runner")
    table = StagedWriteTensor(dev, (STATE_ROWS, 4), torch.int32, "rows", fill=-1, group=group)
    state = SamplingState(dev, STATE_ROWS, VOCAB, group=group)
    group.seal()
    for row, values in diffs:
        table.stage(row, 0, values)
    for row, params, seed, prompt in calls:
        state.add_request(row, params, seed, prompt, checked=True)
    _apply(group, _flush_with(group, c_module))
    return [m.base.tolist() for m in group.members]


@needs_native
@settings(max_examples=30, deadline=None)
@given(admissions())
def test_c_admission_records_write_what_the_reference_stages(case):
    """Records packed in C (`pack_members` with the sampling state's admissions) leave every member as the reference
    leaves it: the records staged as cells and mask row diffs, flushed by numpy."""
    got, want = _admitted(staging, *case), _admitted(None, *case)
    assert got == want, f"C records: {got}\nreference: {want}"


@pytest.mark.parametrize("c_module", [staging, None], ids=["C", "reference"])
@pytest.mark.parametrize("direct_first", [True, False], ids=["write-then-admit", "admit-then-write"])
def test_a_direct_write_and_an_admission_of_one_row_keep_their_order(c_module, direct_first):
    """Records wait for the flush, but another write to their tensors in the same step stages them first: the later
    of the two writes wins, whichever it is, with the C packing and with the reference."""
    if c_module is None and staging is None:
        pytest.skip("the C build is the other case")
    dev = Device("cpu")
    group = StagedWriteGroup(dev, "runner")
    state = SamplingState(dev, STATE_ROWS, VOCAB, group=group)
    group.seal()
    admit = lambda: state.add_request(2, SamplingParams(temperature=0.5), 7, (1, 2), checked=True)  # noqa: E731
    write = lambda: state.temperature.stage_scalar(2, 0.25)  # noqa: E731
    for call in ((write, admit) if direct_first else (admit, write)):
        call()
    _apply(group, _flush_with(group, c_module))
    assert state.temperature.base[2].item() == (0.5 if direct_first else 0.25)
    assert state.seed.base[2].item() == 7


def test_planted_bug_admission_records_with_one_word_rows_are_caught():
    """The comparison above can fail: a build that puts each record's int64 seed one word per row apart."""
    planted = _planted("record_row_stride_one", "staging")
    calls = [(3, SamplingParams(), 12345, (1, 2, 3))]
    assert _admitted(planted, calls, []) != _admitted(None, calls, [])


def _counts_after_admitting(c_module, rows: tuple[int, ...]) -> tuple[list, tuple | None]:
    """(every row's output counts, the group's listing of the admitted rows) after admissions into ``rows`` of a
    sampling state whose counts were all ones, flushed with ``c_module`` as the C twin (None: the reference, which
    lists nothing: the state reserves its reset's rows itself), then applied with its count reset."""
    dev = Device("cpu")
    group = StagedWriteGroup(dev, "runner")
    state = SamplingState(dev, STATE_ROWS, VOCAB, group=group)
    group.seal()
    state.output_counts.fill_(1)
    for row in rows:
        state.add_request(row, SamplingParams(), 7, (1, 2), checked=True)
    writer = StagingWriter(StagingPool(dev, num_slots=2, capacity_bytes=1 << 14), 0)
    saved = staged_writes._staging, sampling_state_module._staging
    staged_writes._staging = sampling_state_module._staging = c_module
    try:
        group.flush(writer)
        listed = group.listed_rows
        state.flush(writer)
    finally:
        staged_writes._staging, sampling_state_module._staging = saved
    listing = None if listed is None else (_listed_words(listed), state._reset_rows is listed, group.listed_rows)
    writer.submit()
    group.enqueue_apply()
    state.enqueue_apply()
    dev.synchronize()
    return state.output_counts.sum(dim=1).tolist(), listing


def _listed_words(listed: tuple) -> list[int]:
    _, slot, first, count = listed
    return slot.host_words[first : first + count].tolist()


@needs_native
def test_c_admission_records_list_their_rows_for_the_count_reset():
    """A flush that packs the records in C lists their rows after the table; the sampling state's count reset reads
    them there (no word of its own), and zeroes the same rows as the reference, which lists nothing."""
    counts, listing = _counts_after_admitting(staging, (3, 1))
    assert listing == ([3, 1], True, None)  # taken by the state's flush
    want, nothing_listed = _counts_after_admitting(None, (3, 1))
    assert nothing_listed is None and counts == want == [VOCAB, 0, VOCAB, 0, VOCAB]


def test_planted_bug_admitted_rows_listed_one_row_off_are_caught():
    """The comparison above can fail: a build that lists each admitted row as the row after it resets the wrong
    row's counts."""
    planted = _planted("listed_row_next", "staging")
    counts, _ = _counts_after_admitting(planted, (1,))
    assert counts != _counts_after_admitting(None, (1,))[0]


# --------------------------------------------------------------------------- the runner

@needs_native
def test_a_run_that_admits_packs_in_c(monkeypatch):
    """An admitting run's general flushes, its admissions' parameters and prompt bitmasks included, take the C path
    (a build that declined everything, or a call site that stopped calling it, would leave numpy silently doing the
    work): the reference (`SamplingState._stage_admissions`, which builds each bitmask by `prompt_bitmask`) never runs."""
    counting = _Counting(staging)
    monkeypatch.setattr(staged_writes, "_staging", counting)
    monkeypatch.setattr(sampling_state_module, "_staging", counting)
    admitted, _ = admitting_run()
    assert admitted and counting.done.get("prompt_bitmask", 0) == 0, counting.done
    assert counting.done.get("pack_members", 0) >= 2, counting.done
