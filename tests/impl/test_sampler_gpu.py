"""The sampler on a GPU at a real vocabulary size (151936), against the float64 oracle.

Default launch shapes (1024-entry candidate sets, wide blocks): the one-pass Gumbel for plain
rows, one or two narrowing passes plus a candidate gather for top-k/top-p rows, bracket and
full-threshold passes for flat top-p and large top-k.  Skipped without CUDA.
"""
from __future__ import annotations

import math
import random

import pytest
import torch

from runnercheck.impl.device import Device
from runnercheck.impl.interface import SamplingParams
from runnercheck.impl.sample import Sampler, SamplingState
from test_sampler_harness import Agreement, LogitRow, RowRequest, admit, reference_results, run_sampler

pytestmark = pytest.mark.gpu
ref = pytest.importorskip("runnercheck.reference.sampler")

VOCAB = 151936

PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7, top_k=50, top_p=0.9),
    SamplingParams(top_p=0.9),
    SamplingParams(top_p=0.999, temperature=1.3),
    SamplingParams(min_p=0.05),
    SamplingParams(top_k=5000),
    SamplingParams(top_k=3, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.4),
    SamplingParams(temperature=0.0, repetition_penalty=1.5),
    SamplingParams(top_k=200, top_p=0.95, min_p=0.01, temperature=1.1, frequency_penalty=-0.3),
    SamplingParams(top_k=1),
    SamplingParams(top_p=0.5, temperature=0.2),
]


@pytest.fixture(scope="module")
def gpu() -> Device:
    return Device("cuda")


def _logits(rows: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    scales = torch.tensor([1.0, 2.5, 6.0, 12.0])[torch.arange(rows) % 4]
    logits = torch.randn(rows, VOCAB, generator=gen) * scales[:, None]
    logits[1::5] = torch.round(logits[1::5] * 2) / 2  # rows full of exact ties
    return logits


def test_large_vocab_matches_reference(gpu):
    rng = random.Random(7)
    sampler = Sampler(gpu, VOCAB, max_logprobs=20, max_num_rows=64)
    agreement = Agreement()
    for trial in range(3):
        state = SamplingState(gpu, len(PARAMS), VOCAB)
        requests = {
            row: RowRequest(p, rng.randrange(2**63), tuple(rng.randrange(VOCAB) for _ in range(40)),
                            tuple(rng.randrange(VOCAB) for _ in range(rng.randrange(20))))
            for row, p in enumerate(PARAMS)
        }
        admit(gpu, state, requests)
        rows = [LogitRow(r, rng.randrange(10**6), tuple(rng.randrange(VOCAB) for _ in range(r % 3)))
                for r in range(len(PARAMS))]
        logits = _logits(len(rows), trial)
        out = run_sampler(gpu, sampler, state, logits, rows, num_logprobs=20)
        tokens = out.tokens.tolist()
        for i, res in enumerate(reference_results(logits, requests, rows)):
            agreement.add(tokens[i], res, (trial, i, PARAMS[i]))
        for i in range(len(rows)):
            expect = ref.token_logprobs(logits[i], tokens[i], 20)
            assert out.rank[i].item() == expect.rank
            assert out.logprob[i].item() == pytest.approx(expect.logprob, abs=2e-4, rel=1e-5)
            assert tuple(out.top_ids[i].tolist()) == expect.top_token_ids
    print(f"\nV={VOCAB}: {agreement.rows} rows, {agreement.ties} ties")
    assert not agreement.mismatches, agreement.mismatches
    assert agreement.ties <= 2


def test_large_vocab_filters_keep_the_reference_set(gpu):
    """Many positions per filtered row: every sampled token lies in the oracle's kept set."""
    logits = _logits(1, 99)[0]
    sampler = Sampler(gpu, VOCAB, max_logprobs=0, max_num_rows=64)
    for params in (SamplingParams(top_k=50, top_p=0.9, temperature=0.7), SamplingParams(top_p=0.9),
                   SamplingParams(min_p=0.1, temperature=2.0), SamplingParams(top_k=3000)):
        kept = (ref.filtered_scores(logits, params, (), ()) > -math.inf).to(gpu.torch_device)
        state = SamplingState(gpu, 1, VOCAB)
        admit(gpu, state, {0: RowRequest(params, 5, (1,))})
        batch = logits.expand(64, VOCAB).contiguous()
        out = run_sampler(gpu, sampler, state, batch, [LogitRow(0, p) for p in range(64)])
        assert bool(kept[out.tokens].all()), params
        assert out.tokens.unique().numel() > 1


def test_no_host_sync_on_cuda(gpu):
    sync = pytest.importorskip("runnercheck.checks.detectors.sync")
    sampler = Sampler(gpu, VOCAB, max_logprobs=5, max_num_rows=8)
    state = SamplingState(gpu, 2, VOCAB)
    admit(gpu, state, {0: RowRequest(SamplingParams(top_k=50, top_p=0.9, presence_penalty=0.5), 1, (3,), (4,))})
    logits = torch.randn(8, VOCAB, device=gpu.torch_device)
    rows = torch.zeros(8, dtype=torch.int32, device=gpu.torch_device)
    positions = torch.arange(8, dtype=torch.int64, device=gpu.torch_device)
    tokens = torch.zeros(8, dtype=torch.int64, device=gpu.torch_device)
    valid = torch.ones(8, dtype=torch.int32, device=gpu.torch_device)
    sampler.sample(logits, state, rows, positions, num_rows=8, max_num_logprobs=5)  # compile outside the scope
    state.launch_post_update(rows, tokens, valid, 8)
    gpu.synchronize()
    with sync.forbid_host_sync("cuda") as scope:
        def step() -> None:
            out = sampler.sample(logits, state, rows, positions, num_rows=8, max_num_logprobs=5)
            state.launch_post_update(rows, out.tokens, valid, 8)

        gpu.enqueue(step, "sample")
    assert scope.count == 0
    gpu.synchronize()
