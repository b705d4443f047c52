"""The request-state table: rows, generations, quarantine of freed rows, the mirror, staged row state."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from runnercheck.impl.buffers import StagingPool, StagingWriter
from runnercheck.impl.device import Device, DeviceEvent
from runnercheck.impl.interface import (
    CachedRequest, CachedRequests, CapacityError, NewRequest, RunnerLimits, SamplingParams, ScheduledTokensError, SchedulerOutput,
)
import runnercheck.impl.state as state_module
from runnercheck.impl.step_reader import read_step
from runnercheck.impl.state import LAST_TOKEN, NUM_COMPUTED, NUM_TOKENS, PREFILL_LEN, PROMPT_LEN, RequestStateTable, RowStateError

P = SamplingParams(temperature=0.0)


def _req(rid: str, prompt: tuple[int, ...], outputs: tuple[int, ...] = ()) -> NewRequest:
    return NewRequest(rid, prompt, P, (0,), outputs)


def _apply(table: RequestStateTable, pool: StagingPool, step: int) -> None:
    writer = StagingWriter(pool, step)
    table.flush(writer)
    writer.submit()
    table.enqueue_apply()


def test_rows_generations_and_release_like_finish():
    table = RequestStateTable(Device("cpu"), max_num_reqs=3, max_model_len=16)
    rows = [table.admit(_req(r, (1, 2)), seed=0) for r in "abc"]
    assert sorted(rows) == [0, 1, 2] and table.num_free == 0
    gens = [table.generation_of(r) for r in "abc"]
    assert gens == sorted(set(gens))
    with pytest.raises(CapacityError):
        table.admit(_req("d", (1,)), seed=0)
    with pytest.raises(RowStateError):
        table.admit(_req("a", (1,)), seed=0)
    freed = table.release("b")  # preempted or finished: the same release
    assert "b" not in table.live and table.num_free == 1
    again = table.admit(_req("b", (1, 2), outputs=(3,)), seed=0)  # resumed: admitted as new
    assert again == freed and table.generation_of("b") > max(gens)
    assert table.info("b").is_resumed and table.info("b").prefill_len == 3 and table.info("b").prompt_len == 2
    with pytest.raises(RowStateError):
        table.release("zzz")


def test_admission_stages_row_state_and_prefill_tokens():
    dev = Device("cpu")
    table = RequestStateTable(dev, max_num_reqs=4, max_model_len=16)
    pool = StagingPool(dev, num_slots=2, capacity_bytes=1024)
    row = table.admit(_req("r", (5, 6, 7), outputs=(8, 9)), seed=0)
    assert table.prefill_tokens[row, :5].tolist() == [5, 6, 7, 8, 9]
    _apply(table, pool, 0)
    state = table.base[row]
    assert state[NUM_COMPUTED] == 0 and state[NUM_TOKENS] == 5 and state[PROMPT_LEN] == 3
    assert state[PREFILL_LEN] == 5 and state[LAST_TOKEN] == 9


def _read_row_later(dev: Device, table: RequestStateTable, row: int, n: int, sink: list) -> None:
    """Stand-in for an input-prep kernel of an earlier step: reads the row's pinned tokens when it runs."""
    src = table.prefill_tokens
    dev.enqueue(lambda: sink.append(src[row, :n].tolist()), "reader")
    table.mark_used([row], dev.record_event())


NEWEST_FIRST = pytest.mark.parametrize("newest_first", [False, True], ids=["row-marker", "newest-marker-first"])


@NEWEST_FIRST
def test_freed_row_is_quarantined_until_its_last_use_completes(newest_first):
    dev = Device("sim", lag_policy="lag-5-steps")
    table = RequestStateTable(dev, max_num_reqs=2, max_model_len=8)
    table._ask_newest_first = newest_first  # cuda and cpu ask the newest marker first; sim by default does not
    seen: list = []
    row_a = table.admit(_req("a", (1, 1, 1)), seed=0)
    table.admit(_req("c", (4,)), seed=0)
    _read_row_later(dev, table, row_a, 3, seen)
    table.release("a")
    assert table.is_quarantined(row_a)
    row_b = table.admit(_req("b", (2, 2, 2)), seed=0)  # the only free row is in use by queued work
    assert row_b == row_a and table.num_quarantine_waits == 1
    assert seen == [[1, 1, 1]], "the in-flight read saw the next request's tokens"


@NEWEST_FIRST
def test_quarantine_prefers_a_completed_row_without_waiting(newest_first):
    dev = Device("sim", lag_policy="lag-5-steps")
    table = RequestStateTable(dev, max_num_reqs=3, max_model_len=8)
    table._ask_newest_first = newest_first
    seen: list = []
    row_a = table.admit(_req("a", (1,)), seed=0)
    row_c = table.admit(_req("c", (3,)), seed=0)
    table.admit(_req("d", (4,)), seed=0)
    table.mark_used([row_c], dev.record_event())  # nothing queued: complete
    # c's prefill is computed by that step: its reads end there (a released row still prefilling would name the
    # newest marker at its release as its last reader on a newest-first table, whose steps mark no row of their own).
    table.advance(["c"], np.array([1]), None)
    _read_row_later(dev, table, row_a, 1, seen)
    table.release("a")
    table.release("c")
    assert table.admit(_req("b", (2,)), seed=0) == row_c
    assert table.num_quarantine_waits == 0 and dev.num_pending == 1


def test_planted_bug_without_quarantine_the_reader_sees_new_tokens(monkeypatch):
    """The quarantine test above can fail: without quarantine the queued read is corrupted."""
    monkeypatch.setattr(RequestStateTable, "is_quarantined", lambda self, row: False)
    dev = Device("sim", lag_policy="lag-5-steps")
    table = RequestStateTable(dev, max_num_reqs=2, max_model_len=8)
    seen: list = []
    row_a = table.admit(_req("a", (1, 1, 1)), seed=0)
    table.admit(_req("c", (4,)), seed=0)
    _read_row_later(dev, table, row_a, 3, seen)
    table.release("a")
    table.admit(_req("b", (2, 2, 2)), seed=0)
    dev.synchronize()
    assert seen == [[2, 2, 2]]


def _reused_row_read(newest_first: bool, history_reads: bool = False) -> list:
    """What a queued read of a freed row sees when later steps used other rows before the row is admitted again."""
    dev = Device("sim", lag_policy="lag-5-steps")
    table = RequestStateTable(dev, max_num_reqs=2, max_model_len=8)
    table._ask_newest_first = newest_first
    table.history_reads = history_reads
    seen: list = []
    row_a = table.admit(_req("a", (1, 1, 1)), seed=0)
    row_c = table.admit(_req("c", (4,)), seed=0)
    _read_row_later(dev, table, row_a, 3, seen)
    table.mark_used(np.array([row_c]), dev.record_event())  # a later step: the batch reading row_a is still queued
    table.release("a")
    table.admit(_req("b", (2, 2, 2)), seed=0)
    dev.synchronize()
    return seen


@NEWEST_FIRST
def test_a_row_stays_quarantined_while_a_step_that_read_it_is_queued_behind_later_steps(newest_first):
    assert _reused_row_read(newest_first) == [[1, 1, 1]]


@pytest.mark.parametrize("newest_first", [False, True], ids=["row-marker", "newest-marker-first-history-reads"])
def test_planted_bug_a_batch_not_recorded_while_its_step_may_run_is_caught(monkeypatch, newest_first):
    """The test above can fail: a table that drops a batch's last-use marks without knowing its step complete, where
    those marks answer for a free row -- on sim, and with ``history_reads`` (a newest-first table without it answers
    from each row's prefill reads, `RequestStateTable._last_readers`)."""
    monkeypatch.setattr(RequestStateTable, "_write_batch_uses", lambda self: setattr(self, "_batch_rows", None))
    assert _reused_row_read(newest_first, history_reads=newest_first) == [[2, 2, 2]]


def test_a_row_freed_after_a_completed_step_is_handed_out_without_a_query(monkeypatch):
    """Newest-first devices (cuda, cpu): a free row released while prefilling, after a step known complete, needs
    no query, even while a later step is queued -- the newest step at its release is the last that could read it."""
    dev = Device("sim", lag_policy="lag-5-steps")
    table = RequestStateTable(dev, max_num_reqs=2, max_model_len=8)
    table._ask_newest_first = True
    row_a = table.admit(_req("a", (1,)), seed=0)
    row_c = table.admit(_req("c", (3,)), seed=0)
    _read_row_later(dev, table, row_a, 1, [])
    table.release("a")
    dev.synchronize()  # the step that read row_a is over (seen: the sim's marker reports it complete)
    _read_row_later(dev, table, row_c, 1, [])  # a later step, still queued
    queries: list = []
    monkeypatch.setattr(DeviceEvent, "query", lambda self: queries.append(self) or False)
    assert table.admit(_req("b", (2,)), seed=0) == row_a
    assert queries == [] and table.num_quarantine_waits == 0


def _step_reading(dev: Device, table: RequestStateTable, rid: str, n: int, sink: list) -> None:
    """One step of ``rid``'s ``n`` next tokens through the table as the runner drives it (marker, then advance); its
    queued read sees the row's pinned tokens below its prefill length, as input prep does."""
    row, start = table.row_of(rid), int(table.num_computed[table.row_of(rid)])
    length = table.info(rid).prefill_len
    src = table.prefill_tokens
    dev.enqueue(lambda: sink.append(src[row, start:min(start + n, length)].tolist()), "input prep")
    table.mark_step(np.array([row]), dev.record_event())
    table.advance([rid], np.array([n]), None)


def _readmit_after_a_chunked_prefill(monkeypatch, reads_end_early: bool) -> list:
    """A row's prefill in two chunks, the second still queued when the row is freed and admitted again."""
    if reads_end_early:  # planted: the prefill counted as read one chunk before its last chunk ran (in the reference,
        monkeypatch.setattr(state_module, "_rows", None)  # which then runs alone)
        monkeypatch.setattr(RequestStateTable, "_end_prefill_reads", lambda self: (
            [self._reads_over.__setitem__(r, self._batch_event) for r in self._prefilling], self._prefilling.clear()))
    dev = Device("sim", lag_policy="lag-5-steps")
    table = RequestStateTable(dev, max_num_reqs=1, max_model_len=8)
    table._ask_newest_first = True
    seen: list = []
    table.admit(_req("a", (1, 1, 1, 1)), seed=0)
    _step_reading(dev, table, "a", 2, seen)
    dev.synchronize()  # the first chunk is done
    _step_reading(dev, table, "a", 2, seen)
    table.release("a")
    table.admit(_req("b", (2, 2, 2, 2)), seed=0)
    dev.synchronize()
    return seen


def test_a_row_stays_quarantined_until_its_last_prefill_chunk_ran(monkeypatch):
    assert _readmit_after_a_chunked_prefill(monkeypatch, False) == [[1, 1], [1, 1]]


def test_planted_bug_prefill_reads_ended_a_chunk_early_is_caught(monkeypatch):
    """The test above can fail: a table that ends a row's prefill reads before its last chunk hands the row out
    while that chunk's read is queued."""
    assert _readmit_after_a_chunked_prefill(monkeypatch, True) == [[1, 1], [2, 2]]


def test_planted_bug_a_free_rows_check_that_skips_its_prefill_reads_is_caught(monkeypatch):
    """Steps mark no row of their own on a newest-first table without ``history_reads`` (`RequestStateTable.mark_step`):
    a free row's last reader is then its prefill's last reading step alone.  A check that asks only for kept marks
    hands the row out while that step is queued."""
    monkeypatch.setattr(RequestStateTable, "_last_readers",
                        lambda self, row: [] if (event := self._use_event(row)) is None else [event])
    assert _readmit_after_a_chunked_prefill(monkeypatch, False) == [[1, 1], [2, 2]]


def test_decode_steps_mark_nothing_and_a_row_past_its_prefill_is_free_at_once(monkeypatch):
    """Decode steps read no prefill token (input prep reads the pinned row only below the prefill length): with no
    proposer they record no marker, and a row freed while they are queued is handed out without a query or wait."""
    dev = Device("sim", lag_policy="lag-5-steps")
    table = RequestStateTable(dev, max_num_reqs=2, max_model_len=16)
    table._ask_newest_first = True
    seen: list = []
    table.admit(_req("a", (1, 1)), seed=0)
    table.admit(_req("c", (3,)), seed=0)
    _step_reading(dev, table, "a", 2, seen)
    _step_reading(dev, table, "c", 1, seen)
    dev.synchronize()
    marked = len(table._use_events)
    for _ in range(3):  # decodes, queued behind the lag
        _step_reading(dev, table, "a", 1, seen)
    assert len(table._use_events) == marked and not table._prefilling
    table.release("a")
    queries: list = []
    monkeypatch.setattr(DeviceEvent, "query", lambda self: queries.append(self) or False)
    table.admit(_req("b", (2, 2)), seed=0)
    assert queries == [] and table.num_quarantine_waits == 0


def test_with_history_reads_every_step_marks_its_rows(monkeypatch):
    """A proposer reads every row's tokens in every step: then a row freed while a decode step is queued stays
    quarantined (the same decode steps as above, with ``history_reads``)."""
    dev = Device("sim", lag_policy="lag-5-steps")
    table = RequestStateTable(dev, max_num_reqs=1, max_model_len=16)
    table._ask_newest_first = True
    table.history_reads = True
    table.admit(_req("a", (1, 1)), seed=0)
    _step_reading(dev, table, "a", 2, [])
    dev.synchronize()
    _step_reading(dev, table, "a", 1, [])  # a decode, queued
    table.release("a")
    assert table.is_quarantined(0)
    table.admit(_req("b", (2, 2)), seed=0)
    assert table.num_quarantine_waits == 1


def test_a_batch_is_recorded_only_while_its_step_may_still_run():
    """A planned batch's last-use marks are written when the next batch comes only if its step may still run; a
    completed one is dropped unwritten (its rows' older marks point at completed steps too)."""
    dev = Device("sim", lag_policy="lag-5-steps")
    table = RequestStateTable(dev, max_num_reqs=4, max_model_len=8)
    rows = [table.admit(_req(name, (1,)), seed=0) for name in "abc"]
    _read_row_later(dev, table, rows[0], 1, [])  # queued: the sim runs it five steps later
    table.mark_used(np.array([rows[1]]), dev.record_event())
    assert table._last_use_seq[rows[0]] == 1  # written: its step may still run
    dev.synchronize()
    table.mark_used(np.array([rows[2]]), dev.record_event())
    assert table._last_use_seq[rows[1]] == -1 and not table.is_quarantined(rows[1])  # dropped unwritten


def _read(table: RequestStateTable, sched: SchedulerOutput):
    limits = RunnerLimits(vocab_size=64, max_num_reqs=table.max_num_reqs, max_model_len=table.max_model_len,
                          max_num_batched_tokens=64, num_kv_blocks=16, block_size=4)
    return read_step(sched, table, limits, None)


def test_mirror_follows_steps_and_rejects_unexplained_computed_counts():
    table = RequestStateTable(Device("cpu"), max_num_reqs=2, max_model_len=32)
    row = table.admit(NewRequest("a", tuple(range(10)), P, (0, 1, 2, 3)), seed=0)
    table.advance(["a"], {"a": 6}, {})  # partial chunk
    assert (table.live["a"].num_tokens, table.live["a"].num_computed_upper) == (10, 6)
    table.advance(["a"], {"a": 4}, {})  # completes the prefill: samples one token
    assert (table.live["a"].num_tokens, table.live["a"].num_computed_upper) == (11, 10)
    ok = SchedulerOutput(2, cached_requests=CachedRequests.of((CachedRequest("a", (), 10),)), num_scheduled_tokens={"a": 1})
    _read(table, ok)
    with pytest.raises(ScheduledTokensError, match="disagrees"):
        _read(table, SchedulerOutput(2, cached_requests=CachedRequests.of((CachedRequest("a", (), 9),))))
    # Drafts: a decode with 3 drafts may have 0..3 rejected; the scheduler may report any of those.
    table.advance(np.array(["a"]).tolist(), np.array([4]), np.array([3]))
    assert (table.live["a"].num_tokens, table.live["a"].num_computed_upper) == (15, 14)
    late = SchedulerOutput(3, cached_requests=CachedRequests.of((CachedRequest("a", (), 12),)), num_scheduled_tokens={"a": 1})
    step = _read(table, late)
    view = table.mirror_for(late)
    assert (view["a"].num_tokens, view["a"].num_computed_upper) == (13, 12)
    assert table.live["a"].num_tokens == 15, "reading a step must not change the table"
    with pytest.raises(ScheduledTokensError):
        _read(table, SchedulerOutput(3, cached_requests=CachedRequests.of((CachedRequest("a", (), 10),))))
    assert step.starts.tolist() == [12] and step.cached_rows.tolist() == [row]
    table.apply_cached(step.cached_rows, step.cached_computed, step.cached_new_blocks)
    assert (table.live["a"].num_tokens, table.live["a"].num_computed_upper) == (13, 12)
    assert table.unconfirmed_drafts[row] == 1
