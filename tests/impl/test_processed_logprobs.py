"""Processed logprobs (``SamplingParams.logprobs_mode="processed"``, docs/SAMPLING.md "Logprobs"): the mode is
validated at the boundary with a typed error and no state change; the oracle's are the log of its own
`distribution`; the runner's equal the oracle's per step, next to raw requests and across a row handed from a
processed request to a raw one, on sim with the sync detector armed (no host read beyond the counted waits)."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from runnercheck.impl.device import Device
from runnercheck.impl.interface import (CachedRequests, LogprobsModeError, NewRequest, SamplingParams, SamplingParamsError,
                                        SchedulerOutput)
from runnercheck.impl.runner import make_runner
from runnercheck.reference.runner import ReferenceRunner
from runnercheck.reference.sampler import distribution, processed_scores, request_token_logprobs
from runnercheck.checks.detectors import sync as sync_check
from tests.impl.test_runner import LIMITS, ScriptedScheduler, _Req, _weights, drive, oracle_judge

P = "processed"


@pytest.mark.parametrize("mode", ["Processed", "", None, 1, b"raw"])
def test_a_bad_mode_is_a_typed_error_at_the_boundary_and_changes_nothing(mode):
    with pytest.raises(LogprobsModeError, match="logprobs_mode") as info:
        SamplingParams(logprobs=1, logprobs_mode=mode).validate(LIMITS.vocab_size, LIMITS.max_logprobs, "r")
    assert isinstance(info.value, SamplingParamsError) and info.value.field == "logprobs_mode"
    runner = make_runner(_weights(), LIMITS, Device("cpu"), 0)
    bad = NewRequest("r", (1, 2, 3), SamplingParams(logprobs=1, logprobs_mode=mode), (0,))
    with pytest.raises(LogprobsModeError):
        runner.execute_model(SchedulerOutput(0, (bad,), CachedRequests(), {"r": 3}))
    assert runner.state.num_live == 0 and not runner.processed_logprobs_reqs
    good = replace(bad, sampling_params=SamplingParams(logprobs=1, logprobs_mode=P))
    out = runner.execute_model(SchedulerOutput(0, (good,), CachedRequests(), {"r": 3})).get()
    assert len(out.logprobs[0]) == 1 and runner.processed_logprobs_reqs == {"r"}


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7, top_k=5, repetition_penalty=1.3, logprobs=0, logprobs_mode=P),
    SamplingParams(temperature=1.8, top_p=0.6, min_p=0.05, frequency_penalty=0.4, logprobs=0, logprobs_mode=P),
    SamplingParams(temperature=2.0, logprobs=0, logprobs_mode=P),
])
def test_the_oracles_processed_logprobs_are_the_log_of_its_distribution(params):
    logits = torch.randn(64, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    probs, _ = distribution(logits, params, (1, 2), (3, 3, 4))
    row = replace(params, logprobs=64)
    lp = request_token_logprobs(logits, int(torch.argmax(probs)), row, (1, 2), (3, 3, 4))
    got = torch.zeros(64, dtype=torch.float64)
    got[list(lp.top_token_ids)] = torch.tensor(lp.top_logprobs, dtype=torch.float64).exp()
    assert torch.allclose(got, probs, atol=1e-12)
    assert sum(p > 0 for p in probs.tolist()) < 64 or params.top_k == -1 and params.top_p == 1.0 and params.min_p == 0.0
    raw = request_token_logprobs(logits, 0, replace(row, logprobs_mode="raw"))
    assert raw.logprob == pytest.approx(float(logits[0] - torch.logsumexp(logits, 0)))


def test_greedy_processed_logprobs_are_the_temperature_one_distribution():
    logits = torch.randn(32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    greedy = SamplingParams(temperature=0.0, top_k=3, presence_penalty=0.5, logprobs=2, logprobs_mode=P)
    scores, fragile = processed_scores(logits, greedy, (), (5,))
    expected = torch.log(distribution(logits, replace(greedy, temperature=1.0, top_k=-1), (), (5,))[0])
    assert not fragile and torch.allclose(scores - torch.logsumexp(scores, 0), expected, atol=1e-12)
    lp = request_token_logprobs(logits, int(torch.argmax(scores)), greedy, (), (5,))
    assert lp.rank == 1 and math.isfinite(lp.logprob) and lp.logprob < 0


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.9, min_p=0.1, logprobs=2, logprobs_mode=P),
    SamplingParams(temperature=0.9, top_p=0.8, logprobs=2, logprobs_mode=P),
    SamplingParams(temperature=0.9, top_k=4, top_p=0.8, min_p=0.1, logprobs=2, logprobs_mode=P),
])
@pytest.mark.parametrize("fill", ["nan", "-inf", "nan/-inf"])
def test_the_oracles_processed_logprobs_of_a_row_with_nothing_finite_keep_nothing(params, fill):
    """A row with no finite entry (the faults' all-NaN and NaN/-inf rows: flagged, token 0) has no top for min-p or
    top-p to measure from: its processed scores are all -inf, not a crash (the H100's verify run 5 died here)."""
    logits = torch.full((16,), float("-inf"), dtype=torch.float64)
    if fill != "-inf":
        logits[:: 1 if fill == "nan" else 2] = float("nan")
    scores, fragile = processed_scores(logits, params, (1,), (2, 3))
    assert not fragile and bool((scores == -math.inf).all())
    lp = request_token_logprobs(logits, 0, params, (1,), (2, 3))
    assert len(lp.top_token_ids) == 2


def _scenario() -> ScriptedScheduler:
    """Processed requests of every sampling path (greedy with a penalty, top-k, top-p, min-p) next to raw ones;
    two rows, so rows pass from processed to raw requests and back; a preemption resumes a processed request."""
    sp = SamplingParams
    arrivals = [
        _Req("a", tuple(range(3, 11)), sp(temperature=0.0, repetition_penalty=1.3, logprobs=3, logprobs_mode=P, max_tokens=3), 0),
        _Req("b", (7, 8, 9), sp(temperature=0.7, seed=1234, top_k=20, top_p=0.9, logprobs=4, logprobs_mode=P, max_tokens=4), 0),
        _Req("c", (100, 101, 102), sp(temperature=1.3, min_p=0.05, frequency_penalty=0.5, logprobs=2, max_tokens=3), 1),
        _Req("d", (42,), sp(temperature=0.5, top_k=3, logprobs=5, logprobs_mode=P, max_tokens=3), 2),
        _Req("e", (50, 51), sp(temperature=1.9, top_p=0.5, presence_penalty=0.7, logprobs=1, max_tokens=2), 3),
        _Req("f", (5, 6), sp(temperature=0.8, min_p=0.2, logprobs=3, logprobs_mode=P, max_tokens=3), 4),
    ]
    return ScriptedScheduler(replace(LIMITS, max_num_reqs=2), arrivals, preempt_at={3: "b"})


def test_runner_processed_logprobs_match_the_oracle_on_sim_without_host_syncs():
    weights, limits = _weights(), replace(LIMITS, max_num_reqs=2)
    runner = make_runner(weights, limits, Device("sim", seed=3, lag_policy="lag-2-steps"), 5)
    oracle = ReferenceRunner(weights, limits, base_seed=5)
    syncs = sync_check.arm_runner(runner, "count")
    stats: dict = {}
    trace = drive(runner, oracle_judge(oracle, stats), _scenario())
    waits = runner.state.num_quarantine_waits + runner.staging.num_backpressure_waits + runner.outputs.num_backpressure_waits
    assert syncs.count == waits, syncs.summary()
    entries = {rid: [lp for lp in lps] for _, out in trace for rid, lps in zip(out.req_ids, out.logprobs) if lps}
    assert stats["tokens"] >= 15 and set(entries) == set("abcdef")
    # a filtered processed row reports -inf for tokens the sampler could not draw (d keeps 3 of 256, top-5 asked)
    assert any(lp.top_logprobs[-1] == -math.inf for lp in entries["d"])
    assert not any(-math.inf in lp.top_logprobs for lp in entries["c"] + entries["e"])  # raw requests
    if runner.graphs.enabled:
        assert runner.cuda_graph_stats()["fallbacks"].get("processed logprobs", 0) > 0


@pytest.mark.gpu
def test_runner_processed_logprobs_match_the_oracle_cuda():
    weights, limits = _weights(), replace(LIMITS, max_num_reqs=2)
    runner = make_runner(weights, limits, Device("cuda"), 5)
    oracle = ReferenceRunner(weights, limits, base_seed=5)
    stats: dict = {}
    drive(runner, oracle_judge(oracle, stats), _scenario())
    assert stats["tokens"] >= 15
