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


def test_the_full_chunk_mutant_is_silent_unless_the_chunk_is_full() -> None:
    """Off a full chunk the inclusive end scores every row: only traffic whose prompt-logprob rows fill the chunk
    (the token budget) can kill it."""
    import torch

    import runnercheck.impl.eager_step as eager_step_module
    from runnercheck.impl.device import Device
    from runnercheck.impl.model.weights import preset, random_weights
    from runnercheck.impl.runner import make_runner
    from runnercheck.impl.sample.logprobs import LogprobsOutput
    from runnercheck.stress.run.config import default_limits

    config = preset("micro")
    runner = make_runner(random_weights(config, seed=0), default_limits(config, max_num_batched_tokens=8), Device("sim", seed=0))
    computer = runner.prompt_logprobs
    chunk = computer.max_num_rows
    scored: list[int] = []
    computer.launch = lambda logits, targets, n, top, out=None: scored.append(n)  # records the rows each launch scores
    out = LogprobsOutput(torch.zeros(chunk), torch.zeros(chunk, dtype=torch.int32), torch.zeros(chunk, 1, dtype=torch.int32),
                         torch.zeros(chunk, 1))
    targets = torch.zeros(chunk, dtype=torch.int64)

    def rows_scored(n: int) -> int:
        scored.clear()
        eager_step_module.prompt_logprobs_chunked(lambda s, e: torch.zeros(e - s, 4), targets, n, 1, computer, out,
                                                  chunk_rows=chunk)
        return sum(scored)

    assert [rows_scored(n) for n in (1, chunk - 1, chunk)] == [1, chunk - 1, chunk]
    with catalogue.apply("prompt_logprobs_full_chunk_drops_last_row", runner=runner):
        assert [rows_scored(n) for n in (1, chunk - 1, chunk)] == [1, chunk - 1, chunk - 1]
