"""The reach mutants (`runnercheck.stress.mutants.reach`) are killed by the runs of ``verify --quick`` on sim:
each through the traffic issue 60 added (whole-row logits faults, the lag mix that holds steps, the
per-step scheduler invariants).  Each test runs the one quick-plan run that reaches the bug, short."""
from __future__ import annotations

import dataclasses

import pytest

from runnercheck.stress.mutants import catalogue
from runnercheck.stress.mutants.reach import REACH_MUTANTS

RUNNER = "runnercheck.impl.runner:make_runner"


def _run(index: int, ticks: int, mutant: str | None):
    from runnercheck.stress.cli.verify import plan_runs
    from runnercheck.stress.run.harness import ChurnOps, checked_run

    planned = plan_runs("sim", 0, RUNNER, quick=True, ticks=ticks)[index]
    return checked_run(dataclasses.replace(planned.config, mutant=mutant), ChurnOps(planned.churn))


def test_reach_mutants_are_in_the_catalogue() -> None:
    for name in REACH_MUTANTS:
        assert "differential" in catalogue.get(name).checks


@pytest.mark.parametrize("name,index,ticks,kind", [
    pytest.param("neg_inf_row_not_token_zero", 0, 60, ("token",), marks=pytest.mark.slow),
    ("output_read_before_event", 1, 30, None),  # the lag-1 run reads outputs before their events
    ("block_leaked_on_release", 0, 30, ("scheduler-invariant",)),
    # The micro-draft run: every rejection resamples from max(0, p - q), which the bug replaces by the target's token.
    pytest.param("draft_rejection_keeps_target_sample", 4, 8, ("token",), marks=pytest.mark.slow),
])
def test_killed_by_the_quick_plan(name: str, index: int, ticks: int, kind) -> None:
    findings = _run(index, ticks, name)
    assert not findings.result.ok, f"{name} survived"
    if kind is not None:
        assert findings.result.first_divergence.kind in kind, findings.first_divergence_line()
    assert findings.repro().first_divergence == findings.first_divergence_line()


@pytest.mark.slow
def test_control_of_the_same_run_is_clean() -> None:
    findings = _run(0, 60, None)
    assert findings.result.ok, findings.first_divergence_line()
