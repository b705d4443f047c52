"""Processed-logprob traffic: random churn draws the mode for some requests that ask for logprobs, from a stream of
its own (every other draw of a seed stays what it was), traces round-trip it, and the coverage counter counts the
compared rows of processed requests (a gated feature of `runnercheck.stress.run.coverage.FEATURES`)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from runnercheck.checks.compare import StepComparison
from runnercheck.impl.interface import ModelRunnerOutput, NewRequest, RunnerLimits, SamplingParams, SchedulerOutput
from runnercheck.stress.run.coverage import FEATURES, PROCESSED_FEATURE, CoverageCounter, zero_features
from runnercheck.stress.run.driver import StepReport
from runnercheck.stress.sim.churn import Churn, ChurnConfig, params_from_dict, params_to_dict

LIMITS = RunnerLimits(vocab_size=64, max_num_reqs=4, max_model_len=64, max_num_batched_tokens=16, num_kv_blocks=32,
                      block_size=4)


def test_churn_draws_the_mode_from_its_own_stream():
    churn = Churn(LIMITS, 7)
    drawn = [churn._params(5) for _ in range(400)]
    plain = Churn(LIMITS, 7, ChurnConfig(processed_logprobs_prob=0.0))
    without = [plain._params(5) for _ in range(400)]
    assert [replace(p, logprobs_mode="raw") for p in drawn] == without  # nothing else moved
    processed = [p for p in drawn if p.logprobs_mode == "processed"]
    asked = [p for p in drawn if p.logprobs is not None]
    assert processed and all(p.logprobs is not None for p in processed) and len(processed) < len(asked)
    assert params_from_dict(params_to_dict(processed[0])) == processed[0]
    assert params_from_dict({"logprobs": 1}).logprobs_mode == "raw"  # a trace from before the field


def test_coverage_counts_processed_rows_and_gates_on_them():
    assert PROCESSED_FEATURE in FEATURES
    counter = CoverageCounter(LIMITS)
    for rid, mode in (("p", "processed"), ("r", "raw")):
        req = NewRequest(rid, (1, 2, 3), SamplingParams(logprobs=1, logprobs_mode=mode), (0,))
        sched = SchedulerOutput(0 if rid == "p" else 1, (req,), num_scheduled_tokens={rid: 3})
        got = ModelRunnerOutput(sched.step_id, (rid,), ((5,),), nan_flags=(False,))
        counter.observe(StepReport(0, sched, got, None, StepComparison(step=sched.step_id)))
    totals = counter.totals()
    assert totals[PROCESSED_FEATURE] == 1
    assert PROCESSED_FEATURE in zero_features({**totals, PROCESSED_FEATURE: 0})


def test_a_runner_that_declares_no_processed_logprobs_is_asked_for_raw_ones():
    from runnercheck.impl.interface import LogprobsModeError, runner_logprobs_modes
    from types import SimpleNamespace

    from runnercheck.stress.run.harness import ChurnOps, make_ops
    from runnercheck.stress.run.runners import SimpleRunner

    class OldRunner:  # written before processed logprobs: declares nothing
        pass

    class BadRunner:
        logprobs_modes = ("raw", "log-softmax")

    assert runner_logprobs_modes(OldRunner()) == ("raw",)
    assert runner_logprobs_modes(SimpleRunner) == ("raw", "processed")
    with pytest.raises(LogprobsModeError, match="logprobs_modes"):
        runner_logprobs_modes(BadRunner())
    config = SimpleNamespace(limits=LIMITS, seed=7)  # what make_ops reads of a RunConfig
    assert make_ops(ChurnOps(), config, OldRunner()).config.processed_logprobs_prob == 0.0
    assert make_ops(ChurnOps(), config, SimpleRunner).config.processed_logprobs_prob == 0.3
