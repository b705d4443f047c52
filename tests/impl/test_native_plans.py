"""The plain step plan in C (`impl/native/plans.c` plain_plan) against its reference, `runnercheck.impl.input_batch._plain_plan`.

On generated steps (any request count, rows, query lengths and bounds, a shared query length or none) the C plan
holds every field the reference's holds, each array with the same dtype and values; what it does not read (a step
with drafts, rows of another dtype, another type) it declines; a run that admits plans its plain steps in C; and a
build that plants a bug (each row taken from the next request) is caught by the same comparison.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import runnercheck.impl.input_batch as input_batch
import runnercheck.impl.native as native
from runnercheck.impl.input_batch import StepPlan, _plain_parts, _plain_plan
from runnercheck.impl.step_reader import StepArrays
from test_native import _Counting, _planted, admitting_run

plans = native.load("plans")
needs_native = pytest.mark.skipif(plans is None, reason="impl/native not built (or RUNNERCHECK_NATIVE=0)")


def _step(rows: list[int], lens: list[int], starts: list[int]) -> StepArrays:
    """A checked step without drafts: its rows, query lengths and the summaries the reader computes."""
    n = len(rows)
    rows, lens, starts = np.array(rows, np.int64), np.array(lens, np.int64), np.array(starts, np.int64)
    query_starts = np.zeros(n + 1, np.int32)
    np.cumsum(lens, out=query_starts[1:], dtype=np.int32)
    shared = int(lens[0]) if n and (lens == lens[0]).all() else -1
    ends = starts + lens
    return StepArrays((), rows[:0], None, rows[:0], None, tuple(f"r{r}" for r in rows), rows, (), lens, starts, ends,
                      ends.copy(), np.zeros(n, np.int64), None, int(lens.sum()), query_starts, int(lens.max(initial=0)),
                      int(ends.max(initial=0)), shared)


@st.composite
def plain_steps(draw) -> StepArrays:
    n = draw(st.integers(0, 12))
    return _step(draw(st.permutations(range(16)))[:n], [draw(st.integers(1, 5)) for _ in range(n)],
                 [draw(st.integers(0, 30)) for _ in range(n)])


def _fields(plan: StepPlan) -> list:
    """Every field of ``plan``: arrays as (dtype, values), the rest as they are."""
    return [(value.dtype, value.tolist()) if isinstance(value, np.ndarray) else value
            for value in (getattr(plan, f.name) for f in dataclasses.fields(plan))]


def _planned(c_module, step: StepArrays) -> StepPlan:
    n = len(step.req_ids)
    plan = c_module.plain_plan(input_batch._PLAIN_TARGETS, step, input_batch._PLAIN.get(n) or _plain_parts(n))
    assert type(plan) is StepPlan, plan
    return plan


@needs_native
@settings(max_examples=150, deadline=None)
@given(plain_steps())
def test_c_plain_plan_is_the_reference_plan(step):
    assert _fields(_planned(plans, step)) == _fields(_plain_plan(step))


@needs_native
def test_c_plain_plan_declines_what_it_does_not_read():
    step = _step([3, 1, 7], [1, 1, 1], [4, 9, 2])
    parts = _plain_parts(len(step.req_ids))
    for odd in (dataclasses.replace(step, drafts=((),) * len(step.req_ids)),  # drafts: the general plan's
                dataclasses.replace(step, rows=step.rows.astype(np.int32)),
                dataclasses.replace(step, uniform_query_len=1.0)):
        assert plans.plain_plan(input_batch._PLAIN_TARGETS, odd, parts) is NotImplemented
    assert plans.plain_plan(input_batch._PLAIN_TARGETS, (step,), parts) is NotImplemented  # not a StepArrays
    other_plan = (dict,) + input_batch._PLAIN_TARGETS[1:]
    assert plans.plain_plan(other_plan, step, parts) is NotImplemented  # a type whose slots are not the fields
    assert plans.plain_plan(input_batch._PLAIN_TARGETS, step, parts[:3]) is NotImplemented


@needs_native
def test_a_run_that_admits_plans_its_plain_steps_in_c(monkeypatch):
    """Every plain step of the bad-input suite's run is planned in C: the reference never runs."""
    counting, by_reference = _Counting(plans), []
    monkeypatch.setattr(input_batch, "_plans", counting)
    monkeypatch.setattr(input_batch, "_plain_plan", lambda step: by_reference.append(step))
    admitted, _ = admitting_run()
    assert admitted and counting.done.get("plain_plan", 0) >= 2 and not by_reference, counting.done


def test_planted_bug_c_plain_plan_taking_each_row_from_the_next_request_is_caught():
    planted = _planted("plan_rows_shifted", "plans")
    step = _step([3, 1, 7], [1, 4, 1], [4, 9, 2])
    assert _fields(_planned(planted, step)) != _fields(_plain_plan(step))
