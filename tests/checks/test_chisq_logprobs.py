"""Logprob consistency of a third-party sampler that returns logprobs (`runnercheck.checks.chisq.logprobs`): a sampler
whose logprobs describe what it drew passes; one that reports them without the temperature (vLLM's processed
logprobs bug) is caught and named; a malformed answer is a contract failure; a sampler that does not take
``return_logprobs=`` is never asked."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from runnercheck.checks.chisq import execute as chisq_execute
from runnercheck.checks.chisq import plan as chisq_plan
from runnercheck.checks.chisq.cases import build_cases
from runnercheck.checks.chisq.logprobs import SamplerLogprobsError, check_logprobs_output, returns_logprobs
from runnercheck.checks.chisq.samplers import GumbelSampler, TokenHistory
from runnercheck.reference.sampler import expected_distribution

CPU = torch.device("cpu")
_SPEC = GumbelSampler()
_CASES = {c.name: c for c in build_cases(quick=True)}


def _logprobs(logits, params, history, *, temperature_one: bool = False) -> torch.Tensor:
    """float32 processed logprobs of each row: the log of the contract's distribution (one per distinct row)."""
    out = torch.empty(logits.shape, dtype=torch.float32)
    memo: dict = {}
    for i in range(logits.shape[0]):
        p = params[i]
        if temperature_one and p.temperature > 0:
            p = replace(p, temperature=1.0)
        h = history[i] if history is not None else TokenHistory()
        key = (logits[i].numpy().tobytes(), p, h)
        if key not in memo:
            memo[key] = torch.log(expected_distribution(logits[i].double(), p, h.prompt_ids, h.output_ids)).float()
        out[i] = memo[key]
    return out


def honest_sampler(logits, params, seeds, positions, *, history=None, return_logprobs=False):
    tokens = _SPEC(logits, params, seeds, positions, history=history)
    return (tokens, _logprobs(logits, params, history)) if return_logprobs else tokens


def no_temperature_sampler(logits, params, seeds, positions, *, history=None, return_logprobs=False):
    """Draws right; its processed logprobs forget the temperature."""
    tokens = _SPEC(logits, params, seeds, positions, history=history)
    return (tokens, _logprobs(logits, params, history, temperature_one=True)) if return_logprobs else tokens


def wrong_shape_sampler(logits, params, seeds, positions, *, return_logprobs=False):
    tokens = _SPEC(logits, params, seeds, positions)
    return (tokens, torch.zeros(logits.shape[0], 3)) if return_logprobs else tokens


def _run(sampler, names, samples=3000):
    opts = chisq_plan.RunOptions(quick=True, samples=samples, calibration=False, power=False, spec=False)
    return chisq_execute.run_cases(sampler, [_CASES[n] for n in names], opts, CPU)


def test_logprobs_that_describe_the_draws_pass():
    results, skipped = _run(honest_sampler, ["temperature-0.5-v97", "top-k-10-v97", "greedy-v97"])
    assert not skipped
    assert [t.name for t in results if not t.passed] == []
    names = {t.name for t in results}
    assert {"temperature-0.5-v97/logprobs-draws", "top-k-10-v97/logprobs-draws"} <= names
    assert not any(t.kind == "logprobs" for t in results)


def test_logprobs_without_temperature_are_caught_and_named():
    results, _ = _run(no_temperature_sampler, ["temperature-0.5-v97", "bind-k-t1.5-v32"])
    failed = [t for t in results if not t.passed]
    assert {t.name for t in failed} >= {"temperature-0.5-v97/logprobs", "bind-k-t1.5-v32/logprobs"}
    for t in failed:
        if t.kind == "logprobs":
            assert "without the temperature" in t.notes, t.notes
    # its draws are right: the plain chi-square tests of the same cases pass
    assert all(t.passed for t in results if t.kind == "chisq" and not t.name.endswith("logprobs-draws"))
    # and its draws disagree with what it reported
    assert any(not t.passed for t in results if t.name.endswith("logprobs-draws"))


def test_malformed_logprobs_are_a_contract_failure_and_plain_samplers_are_not_asked():
    results, _ = _run(wrong_shape_sampler, ["temperature-0.5-v97"], samples=500)
    assert [t.kind for t in results if not t.passed] == ["contract"]
    assert "logprobs of shape [500, 3]" in next(t.notes for t in results if not t.passed)
    assert not returns_logprobs(lambda logits, params, seeds, positions: None)
    with pytest.raises(SamplerLogprobsError, match="NaN"):
        check_logprobs_output((torch.zeros(2, dtype=torch.int64), torch.full((2, 4), float("nan"))), 2, 4)
    with pytest.raises(SamplerLogprobsError, match="sum to 1"):
        check_logprobs_output((torch.zeros(2, dtype=torch.int64), torch.zeros(2, 4)), 2, 4)
    ids, probs = check_logprobs_output((torch.zeros(2, dtype=torch.int64), torch.full((2, 4), float(np.log(0.25)))), 2, 4)
    assert ids.tolist() == [0, 0] and np.allclose(probs, 0.25)
