"""The draft-model proposer (`runnercheck.impl.draft_proposer`) and its rejection-sampling verification in the runner.

* `runnercheck.impl.sample.probs.drawn_distribution` (the p and q the verifier reads: what the sampler drew
  from) equals the oracle's `runnercheck.reference.sampler.distribution` row for row;
* the runner with ``speculative=DraftModelConfig(...)`` produces the oracle's tokens exactly, with
  an unrelated draft model (drafts mostly rejected: residual resamples) and with the target as its
  own draft (drafts accepted: bonus tokens), greedy and random requests mixed, logprobs included;
* the differential under lag finds 0 divergences and 0 host syncs, and fails when the proposer or
  the verification is dropped (planted bugs);
* a draft sample spread over vocabulary spans draws the oracle's token whatever the span width;
* bad inputs raise typed errors before any state changes.
"""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from runnercheck.impl.device import Device
from runnercheck.impl.interface import (
    CachedRequest,
    CachedRequests,
    DeviceDraftsError,
    DraftModelConfig,
    NewRequest,
    RunnerLimits,
    SamplingParams,
    SchedulerOutput,
)
from runnercheck.impl.model.weights import DraftVocabMismatchError, preset, random_weights
from runnercheck.impl.runner import ModelRunner
from runnercheck.impl.runner_config import RunnerConfigError
from runnercheck.impl.sample import SamplingState
from runnercheck.impl.sample.probs import drawn_distribution
from runnercheck.impl.sample.sampler import Sampler
from test_sampler_harness import LogitRow, RowRequest, admit, logit_row_tensors

LIMITS = RunnerLimits(vocab_size=256, max_num_reqs=3, max_model_len=64, max_num_batched_tokens=24, num_kv_blocks=40,
                      block_size=4, max_num_draft_tokens=3)


# --------------------------------------------------------------------------- p and q


# (vocabulary, widest span): one span a row; three spans (a partial last one); one span walked in four blocks of
# 1024 (the last one empty) -- on cpu and on cuda alike
@pytest.mark.parametrize("vocab, span", [(40, 4096), (150, 64), (2500, 4096)])
@pytest.mark.parametrize("kind", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_drawn_distributions_equal_the_oracle_distribution(kind: str, vocab: int, span: int) -> None:
    from runnercheck.reference.sampler import distribution

    dev = Device(kind)
    gen = torch.Generator().manual_seed(3)
    requests = {
        0: RowRequest(SamplingParams(temperature=0.8, top_k=5), 1, (1, 2, 3), (4,)),
        1: RowRequest(SamplingParams(temperature=1.3, top_p=0.6, min_p=0.05), 2, (7,)),
        2: RowRequest(SamplingParams(temperature=0.0, repetition_penalty=1.5), 3, (0, 9), (9, 9)),
        3: RowRequest(SamplingParams(temperature=1.0, repetition_penalty=1.4, frequency_penalty=0.5,
                                     presence_penalty=0.7), 4, (5, 6), (6, 8, 8)),
    }
    rows = [LogitRow(0, 4), LogitRow(1, 1), LogitRow(2, 4), LogitRow(3, 5), LogitRow(3, 6, (8, 11)), LogitRow(0, 5, (3,)),
            LogitRow(1, 2), LogitRow(1, 3)]
    logits = torch.randn((len(rows), vocab), generator=gen, dtype=torch.float64) * 3
    logits[6, 7], logits[6, 2] = math.inf, math.nan  # non-finite rule: a point mass on the +inf
    logits[7] = -math.inf  # every entry -inf: token 0
    state = SamplingState(dev, 4, vocab)
    admit(dev, state, requests)
    state_rows, positions, prefix = logit_row_tensors(dev, rows)
    box = {}
    logits_dev = dev.to_device(logits.to(torch.float32))
    sampler = Sampler(dev, vocab, max_num_rows=len(rows))

    def sample_then_distribution() -> None:
        sampler.sample(logits_dev, state, state_rows, positions, num_rows=len(rows), draft_prefix=prefix)
        box["p"] = drawn_distribution(sampler, logits_dev, state, state_rows, prefix, len(rows), span_tokens=span)

    dev.enqueue(sample_then_distribution, "p")
    dev.synchronize()
    got = box["p"].cpu()
    for i, row in enumerate(rows):
        req = requests[row.state_row]
        want, fragile = distribution(logits[i], req.params, req.prompt, req.outputs + row.drafts)
        assert not fragile
        torch.testing.assert_close(got[i].double(), want, atol=1e-5, rtol=1e-4, msg=f"row {i}")


# --------------------------------------------------------------------------- the runner against the oracle


def _run(spec: DraftModelConfig, steps: int = 7, kind: str = "sim") -> tuple[int, int]:
    """Runner and oracle over the same schedule (3 requests, device drafts every decode); (drafts, accepted)."""
    from runnercheck.reference.runner import ReferenceRunner

    weights = random_weights(preset("micro"), seed=2)
    runner = ModelRunner(weights, LIMITS, Device(kind), base_seed=1, speculative=spec, cuda_graphs=False)
    oracle = ReferenceRunner(weights, LIMITS, base_seed=1, proposer=spec)
    reqs = (NewRequest("A", (5, 6, 5, 6, 5, 6), SamplingParams(temperature=0.0, max_tokens=40), tuple(range(0, 16))),
            NewRequest("B", (9, 9, 9, 9), SamplingParams(temperature=2.5, seed=4, max_tokens=40, logprobs=2), tuple(range(16, 32))),
            NewRequest("C", (1, 2, 3), SamplingParams(temperature=3.0, max_tokens=40, top_k=60, repetition_penalty=1.3),
                       tuple(range(32, 40))))
    known = {r.req_id: len(r.prompt_token_ids) for r in reqs}
    sched = SchedulerOutput(0, new_requests=reqs, num_scheduled_tokens=dict(known))
    drafts = accepted = 0
    asked = {"A": 2, "B": 3, "C": 1}
    for step in range(1, steps + 1):
        got, want = runner.execute_model(sched).get(), oracle.execute_model(sched)
        assert got.sampled_token_ids == want.sampled_token_ids, step
        assert [[lp.token_id for lp in lps] if lps else lps for lps in got.logprobs] == \
               [[lp.token_id for lp in lps] if lps else lps for lps in want.logprobs]
        for rid, toks in got.token_dict().items():
            known[rid] += len(toks)
            if step > 1:
                drafts, accepted = drafts + asked[rid], accepted + len(toks) - 1
        sched = SchedulerOutput(step, cached_requests=CachedRequests.of(tuple(CachedRequest(r, (), known[r] - 1) for r in asked)),
                                num_scheduled_tokens={r: 1 + k for r, k in asked.items()}, num_device_drafts=dict(asked))
    return drafts, accepted


@pytest.mark.parametrize("chunk", [2, 16, 4096])
def test_a_draft_sample_over_spans_draws_the_oracle_token(chunk: int) -> None:
    """`launch_draft_sample`: the Gumbel-max of ``log q + g`` (draft stream) per row, spans combined with the lowest
    token at the largest score: the oracle's `resample` token, rows with exact zeros and a point mass included."""
    from runnercheck.impl.kernels.draft_model import launch_draft_sample
    from runnercheck.impl.kernels.spec_verify import spans_of
    from runnercheck.reference.rng import DRAFT_STREAM
    from runnercheck.reference.spec_verify import resample

    dev, vocab, num_reqs, k, j = Device("cpu"), 37, 4, 2, 1
    gen = torch.Generator().manual_seed(7)
    q = torch.rand(num_reqs + 1, k, vocab, generator=gen, dtype=torch.float64)
    q[:, :, ::3] = 0.0  # exact zeros: never drawn
    q[2, j] = 0.0
    q[2, j, 35] = 1.0  # a point mass in the last, partial span
    q = (q / q.sum(dim=2, keepdim=True).clamp(min=1e-30)).to(torch.float32)
    rows = torch.tensor([3, 0, 2, 1], dtype=torch.int32)
    state_rows = torch.tensor([1, 0, 3, 2], dtype=torch.int32)
    positions = torch.tensor([5, 9, 2**20, 0], dtype=torch.int64)
    seeds = torch.tensor([11, 2**62 + 3, 7, 123456789], dtype=torch.int64)
    proposed = torch.full((num_reqs + 1, k), -1, dtype=torch.int32)
    next_tokens = torch.zeros(num_reqs, dtype=torch.int64)
    span, spans = spans_of(vocab, chunk)
    partials = dev.zeros((num_reqs, 4, spans), torch.int32)
    launch_draft_sample(rows=rows, state_rows=state_rows, positions=positions, seeds=seeds, q_buf=q, proposed=proposed,
                        next_tokens=next_tokens, partials=partials, chunk=span, j=j, num_reqs=num_reqs)
    for i in range(num_reqs):
        want, _ = resample(q[int(rows[i]), j].double(), int(seeds[int(state_rows[i])]), int(positions[i]), DRAFT_STREAM)
        assert int(next_tokens[i]) == want == int(proposed[int(rows[i]), j]), (i, chunk)
    assert int(next_tokens[2]) == 35


@pytest.mark.parametrize("span_tokens", [4, 16, 4096])
def test_the_q_gather_copies_every_span_of_each_draft_row_and_nothing_else(span_tokens: int) -> None:
    """`launch_gather_draft_probs`: request i's draft j lands, whole, at step row ``draft_start[i] + j``, one program
    per (request, draft, span): 37 tokens in spans of 4 (a partial last one), 16 and one; requests with fewer
    drafts than the launch's width, and none, write nothing past their own rows."""
    from runnercheck.impl.kernels.draft_model import launch_gather_draft_probs

    vocab, k = 37, 3
    q = torch.rand(5, k, vocab, generator=torch.Generator().manual_seed(3))
    rows = torch.tensor([4, 0, 2, 1], dtype=torch.int32)
    draft_start = torch.tensor([0, 3, 3, 4, 6], dtype=torch.int32)  # 3, 0, 1 and 2 drafts
    out = torch.full((8, vocab), -1.0)
    launch_gather_draft_probs(rows=rows, draft_start=draft_start, q_buf=q, out=out, num_reqs=4, max_drafts=k,
                              span_tokens=span_tokens)
    want = torch.full((8, vocab), -1.0)
    for i in range(4):
        for j in range(int(draft_start[i + 1] - draft_start[i])):
            want[int(draft_start[i]) + j] = q[int(rows[i]), j]
    assert torch.equal(out, want), span_tokens


def test_an_unrelated_draft_model_is_verified_token_for_token_like_the_oracle() -> None:
    drafts, accepted = _run(DraftModelConfig("micro-draft", 3, weights_seed=5), steps=5)
    assert drafts > 0 and accepted < drafts  # rejections: residual resamples


def test_the_target_as_its_own_draft_is_accepted_and_matches_the_oracle() -> None:
    drafts, accepted = _run(DraftModelConfig("micro", 3, weights_seed=2), steps=5)
    assert accepted > drafts // 2  # p == q up to fp32: accepted, with bonus tokens


def _differential(steps: int, kind: str = "sim", draft: str = "micro-draft", **scheduler_changes):
    from runnercheck.stress.run.harness import ChurnOps, checked_run
    from runnercheck.stress.cli.verify import plan_runs

    planned = plan_runs("sim", 0, "runnercheck.impl.runner:make_runner", quick=True)[0]
    if kind != "sim":
        planned = replace(planned, config=replace(planned.config, device=kind, lag_policy=None))
    churn = replace(planned.churn, max_unfinished=3, max_new_tokens=16, preempt_prob=0.05, abort_prob=0.0)
    config = replace(planned.config, steps=steps, draft_source="random", logits_fault=None,
                     scheduler=replace(planned.config.scheduler, draft_prob=0.0, prefix_caching=False, ngram_spec_tokens=3,
                                       draft_model=draft, **scheduler_changes))
    return checked_run(config, ChurnOps(churn), name="draft-model")


def test_draft_model_under_lag_matches_the_oracle_with_no_host_sync() -> None:
    findings = _differential(16, draft="micro", max_inflight_steps=2)
    assert findings.crash is None and findings.passed, findings.first_divergence_line()
    assert findings.violations("sync") == 0 and findings.violations("lifetime") == 0
    spec = findings.result.spec_stats
    assert spec["draft_tokens"] > 0 and spec["accepted_tokens"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("draft", ["micro-draft", "micro"])
def test_draft_model_on_cuda_matches_the_oracle_with_no_host_sync(draft: str) -> None:
    findings = _differential(120, "cuda", draft=draft, max_inflight_steps=2)
    assert findings.crash is None and findings.passed, findings.first_divergence_line()
    assert findings.violations("sync") == 0 and findings.violations("lifetime") == 0
    assert findings.result.spec_stats["draft_tokens"] > 0


def test_planted_bug_dropped_verification_is_caught_by_the_differential(monkeypatch) -> None:
    """Without the verify launch the sampler's own (noise-stream) tokens meet the drafts by exact match:
    other tokens than rejection sampling's, which the differential sees."""
    from runnercheck.impl.draft_proposer import DraftModelProposer

    monkeypatch.setattr(DraftModelProposer, "enqueue_verify", lambda self, *args, **kwargs: None)
    with pytest.raises(AssertionError):
        _run(DraftModelConfig("micro-draft", 3, weights_seed=5), steps=3)


def test_planted_bug_a_draft_model_that_never_proposes_is_caught(monkeypatch) -> None:
    from runnercheck.impl.draft_proposer import DraftModelProposer

    monkeypatch.setattr(DraftModelProposer, "enqueue_propose", lambda self, *args, **kwargs: None)
    with pytest.raises(AssertionError):
        _run(DraftModelConfig("micro", 3, weights_seed=2), steps=3)


# --------------------------------------------------------------------------- bad input


def test_bad_configs_raise_typed_errors() -> None:
    from runnercheck.reference.runner import ReferenceRunner

    weights = random_weights(preset("micro"), seed=0)
    with pytest.raises(RunnerConfigError, match="vocabulary"):
        ModelRunner(weights, LIMITS, Device("cpu"), speculative=DraftModelConfig("tiny-draft", 2))
    with pytest.raises(DraftVocabMismatchError):
        ReferenceRunner(weights, LIMITS, proposer=DraftModelConfig("tiny-draft", 2))
    with pytest.raises(RunnerConfigError, match="num_spec_tokens"):
        ModelRunner(weights, LIMITS, Device("cpu"), speculative=DraftModelConfig("micro-draft", 4))
    with pytest.raises(ValueError):
        DraftModelConfig("micro-draft", 0)


def test_bad_steps_raise_before_any_state_changes() -> None:
    """k above the configured maximum, explicit drafts, a prefix hit, drafts for an unscheduled request:
    `DeviceDraftsError` on both sides, and the next good step still matches the oracle."""
    from runnercheck.reference.runner import ReferenceRunner

    spec = DraftModelConfig("micro-draft", 2)
    weights = random_weights(preset("micro"), seed=0)
    runner = ModelRunner(weights, LIMITS, Device("sim"), base_seed=1, speculative=spec, cuda_graphs=False)
    oracle = ReferenceRunner(weights, LIMITS, base_seed=1, proposer=spec)
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=20)
    first = SchedulerOutput(0, new_requests=(NewRequest("A", (1, 2, 3), params, (0, 1)),), num_scheduled_tokens={"A": 3})
    known = 3 + len(runner.execute_model(first).get().sampled_token_ids[0])
    oracle.execute_model(first)
    decode = dict(cached_requests=CachedRequests.of((CachedRequest("A", (), known - 1),)), num_scheduled_tokens={"A": 3})
    bad = [
        SchedulerOutput(1, **decode, num_device_drafts={"A": 3}),  # k above num_spec_tokens
        SchedulerOutput(1, **decode, draft_token_ids={"A": (4, 5)}),  # explicit drafts carry no q
        SchedulerOutput(1, **decode, num_device_drafts={"A": 2, "B": 1}),  # an unscheduled request
        SchedulerOutput(1, new_requests=(NewRequest("P", (1, 2, 3, 4, 5), params, (8, 9), num_computed_tokens=4),),
                        num_scheduled_tokens={"P": 1}),  # a prefix hit
    ]
    for sched in bad:
        for side in (runner, oracle):
            with pytest.raises(DeviceDraftsError):
                side.execute_model(sched)
    good = SchedulerOutput(1, **decode, num_device_drafts={"A": 2})
    assert runner.execute_model(good).get().sampled_token_ids == oracle.execute_model(good).sampled_token_ids
