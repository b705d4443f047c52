"""The split-row sampler and logprobs on a GPU at V=151936, against the float64 oracle.

Real launches at the batch sizes the benchmark measures (1, 8, 64, 256 rows): every split path
(one-read Gumbel/greedy, chunk-max-bounded top-k gather, min-p threshold pass, per-row fallback,
gather overflow to fallback) must give the oracle's token, and a CUDA-graph replay of
`Sampler.sample` must give what the eager launches give.  Skipped without CUDA.
"""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runnercheck.impl.device import Device
from runnercheck.impl.interface import SamplingParams
from runnercheck.impl.kernels.sampling_split import MODE_DONE, MODE_FALLBACK, MODE_GATHER, MODE_THRESHOLD
from runnercheck.impl.sample import LogprobsComputer, Sampler, SamplingState
from test_sampler_harness import Agreement, LogitRow, RowRequest, admit, logit_row_tensors, reference_results, run_sampler

pytestmark = pytest.mark.gpu
ref = pytest.importorskip("runnercheck.reference.sampler")

VOCAB = 151936


@pytest.fixture(scope="module")
def gpu() -> Device:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return Device("cuda")


@pytest.fixture(scope="module")
def sampler(gpu: Device) -> Sampler:
    return Sampler(gpu, VOCAB, max_logprobs=20, max_num_rows=256)


def _logits(rows: int, seed: int, scale: float = 3.0, quantum: float = 0.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, VOCAB, generator=gen) * scale
    if quantum:
        logits = torch.round(logits / quantum) * quantum
    return logits


def _agree(tokens: list[int], results: list, where: object) -> Agreement:
    agreement = Agreement()
    for i, (tok, res) in enumerate(zip(tokens, results)):
        agreement.add(tok, res, (where, i))
    assert not agreement.mismatches, agreement.mismatches
    return agreement


params_strategy = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    top_k=st.sampled_from([-1, -1, 1, 20, 50, 148, 149, 150, 5000]),
    top_p=st.sampled_from([1.0, 1.0, 0.95, 0.9, 0.3]),
    min_p=st.sampled_from([0.0, 0.0, 0.02, 0.3]),
    repetition_penalty=st.sampled_from([1.0, 1.3]),
    frequency_penalty=st.sampled_from([0.0, 0.4]),
    presence_penalty=st.sampled_from([0.0, -0.5]),
)


@settings(max_examples=12, deadline=None)
@given(params=st.lists(params_strategy, min_size=1, max_size=4), num_rows=st.sampled_from([1, 3, 8]),
       scale=st.sampled_from([0.5, 3.0, 12.0]), quantum=st.sampled_from([0.0, 0.5]), seed=st.integers(0, 2**31))
def test_split_sampler_matches_oracle_hypothesis(gpu, sampler, params, num_rows, scale, quantum, seed):
    rng = random.Random(seed)
    requests = {row: RowRequest(p, rng.randrange(2**63), tuple(rng.randrange(VOCAB) for _ in range(20)),
                                tuple(rng.randrange(VOCAB) for _ in range(rng.randrange(8))))
                for row, p in enumerate(params)}
    state = SamplingState(gpu, len(params), VOCAB)
    admit(gpu, state, requests)
    rows = [LogitRow(rng.randrange(len(params)), rng.randrange(10**6), tuple(rng.randrange(VOCAB) for _ in range(i % 3)))
            for i in range(num_rows)]
    logits = _logits(num_rows, seed, scale, quantum)
    tokens = run_sampler(gpu, sampler, state, logits, rows).tokens.tolist()
    agreement = _agree(tokens, reference_results(logits, requests, rows), (params, seed))
    assert agreement.ties <= 1


def test_every_split_path_at_256_rows(gpu, sampler):
    """256 rows cycling through parameters that take each path; the paths are asserted, not assumed."""
    cases = [
        (SamplingParams(temperature=0.8), MODE_DONE),
        (SamplingParams(temperature=0.0, repetition_penalty=1.2), MODE_DONE),
        (SamplingParams(temperature=0.8, top_k=50, top_p=0.9), MODE_GATHER),
        (SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, frequency_penalty=0.2), MODE_GATHER),
        (SamplingParams(min_p=0.1), MODE_THRESHOLD),
        (SamplingParams(top_p=0.9), MODE_FALLBACK),
        (SamplingParams(top_k=5000), MODE_FALLBACK),
    ]
    rng = random.Random(3)
    requests = {row: RowRequest(p, rng.randrange(2**63), tuple(rng.randrange(VOCAB) for _ in range(30)),
                                tuple(rng.randrange(VOCAB) for _ in range(5)))
                for row, (p, _) in enumerate(cases)}
    state = SamplingState(gpu, len(cases), VOCAB)
    admit(gpu, state, requests)
    rows = [LogitRow(i % len(cases), 1000 + i) for i in range(256)]
    logits = _logits(256, 11)
    logits[::17] = torch.round(logits[::17] * 2) / 2  # rows full of exact ties
    tokens = run_sampler(gpu, sampler, state, logits, rows).tokens.tolist()
    modes = sampler.mode[:256].tolist()
    for i, lr in enumerate(rows):
        if i % 17:  # a tie row may overflow its chunk slots into the fallback: still the oracle's token
            assert modes[i] == cases[lr.state_row][1], (i, cases[lr.state_row][0], modes[i])
    _agree(tokens, reference_results(logits, requests, rows), "256 rows")


def test_gather_overflow_falls_back_to_the_row_kernel(gpu, sampler):
    """A chunk holding more top-k candidates than its slots: the row is redone by the fallback."""
    logits = _logits(2, 5)
    logits[:, 2048:2048 + 64] += 40.0  # 64 top entries in one chunk, top-k 50 -> overflow
    requests = {0: RowRequest(SamplingParams(top_k=50, top_p=0.95), 9, (1,))}
    state = SamplingState(gpu, 1, VOCAB)
    admit(gpu, state, requests)
    rows = [LogitRow(0, 7), LogitRow(0, 8)]
    tokens = run_sampler(gpu, sampler, state, logits, rows).tokens.tolist()
    assert sampler.mode[:2].tolist() == [MODE_FALLBACK, MODE_FALLBACK]
    _agree(tokens, reference_results(logits, requests, rows), "overflow")


@pytest.mark.parametrize("num_rows", [1, 8, 256])
def test_split_logprobs_match_float64(gpu, num_rows):
    computer = LogprobsComputer(gpu, VOCAB, 20, 256)
    logits = _logits(num_rows, 100 + num_rows)
    logits[1::7] = torch.round(logits[1::7] * 2) / 2  # ties in the top-20 lists: lower index first
    targets = torch.randint(0, VOCAB, (num_rows,), generator=torch.Generator().manual_seed(num_rows))
    out = computer.launch(gpu.to_device(logits), gpu.to_device(targets), num_rows, 20)
    lp = torch.log_softmax(logits.double(), dim=-1)
    got = out.logprob.cpu().double()
    assert torch.allclose(got, lp[torch.arange(num_rows), targets], atol=2e-4, rtol=1e-5)
    rank = 1 + (logits > logits[torch.arange(num_rows), targets][:, None]).sum(1)
    assert out.rank.cpu().long().tolist() == rank.tolist()
    order = torch.argsort(logits.double(), dim=1, descending=True, stable=True)[:, :20]
    assert out.top_ids.cpu().long().tolist() == order.tolist()
    assert torch.allclose(out.top_logprobs.cpu().double(), lp.gather(1, order), atol=2e-4, rtol=1e-5)
    modes = computer.mode[:num_rows].tolist()
    untied = [m for i, m in enumerate(modes) if i % 7 != 1]
    # untied rows: ~30 entries reach the 20th largest chunk max, far from the finish's 128: no fallback
    assert untied == [MODE_DONE] * len(untied), modes
    assert computer.arrivals[:num_rows].tolist() == [0] * num_rows  # counters reset for the next launch


def test_row_finish_ties_and_overflow_at_full_vocab(gpu):
    """Rows the row finish decides (DONE) and rows it must hand on (FALLBACK), with float64's answers,
    from the default computer and from one whose finish takes only 32 entries (more fallbacks)."""
    import dataclasses

    rows = 8
    logits = _logits(rows, 77)
    high = 30.0 + torch.arange(20.0)
    logits[1, 5000:5020] = high  # the whole top 20 in one sub-block
    logits[2, torch.arange(20) * 7000 + 3] = high  # spread: one per chunk
    logits[3, ::2048] = 40.0  # every chunk max ties at T = 40: the 20 lowest ids, 75 entries >= T
    logits[4, :300] = 50.0  # 300 entries tie at the top: more than the finish takes
    logits[5, 1000:1005] = 60.0  # 5 ties at the head, then 40 ties at T = 45 (one per chunk), 15 kept
    logits[5, torch.arange(40) * 3000 + 11] = 45.0
    targets = torch.tensor([0, 5000, 3, 2048, 299, 1002, 3, 4])
    order = torch.argsort(logits.double(), dim=1, descending=True, stable=True)[:, :20]
    lp = torch.log_softmax(logits.double(), dim=-1)
    default = LogprobsComputer(gpu, VOCAB, 20, rows)
    small = LogprobsComputer(gpu, VOCAB, 20, rows, dataclasses.replace(default.config, logprobs_candidates=32))
    for computer in (default, small):
        out = computer.launch(gpu.to_device(logits), gpu.to_device(targets), rows, 20)
        assert out.top_ids.cpu().long().tolist() == order.tolist()
        assert torch.allclose(out.top_logprobs.cpu().double(), lp.gather(1, order), atol=2e-4, rtol=1e-5)
        assert torch.allclose(out.logprob.cpu().double(), lp[torch.arange(rows), targets], atol=2e-4, rtol=1e-5)
    assert default.mode[:rows].tolist() == [MODE_DONE] * 4 + [MODE_FALLBACK] + [MODE_DONE] * 3
    assert small.mode[3:6].tolist() == [MODE_FALLBACK, MODE_FALLBACK, MODE_FALLBACK]  # 75, 300, 45 entries >= T


def test_cuda_graph_replay_equals_eager(gpu, sampler):
    """`Sampler.sample` captured once replays on new logits/positions exactly like eager launches."""
    params = [SamplingParams(temperature=0.8), SamplingParams(top_k=50, top_p=0.9), SamplingParams(min_p=0.1),
              SamplingParams(top_p=0.9), SamplingParams(temperature=0.0)]
    requests = {row: RowRequest(p, 77 + row, (row,)) for row, p in enumerate(params)}
    state = SamplingState(gpu, len(params), VOCAB)
    admit(gpu, state, requests)
    gpu.synchronize()
    rows = [LogitRow(i % len(params), 10 + i) for i in range(64)]
    state_rows, positions, _ = logit_row_tensors(gpu, rows)
    logits = gpu.to_device(_logits(64, 1))
    eager = []
    for seed in (2, 3):
        logits.copy_(gpu.to_device(_logits(64, seed)))
        positions.add_(1)
        torch.cuda.synchronize()
        eager.append(sampler.sample(logits, state, state_rows, positions, num_rows=64, max_num_logprobs=5)
                     .tokens.clone())
    torch.cuda.synchronize()
    positions.sub_(2)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        sampler.sample(logits, state, state_rows, positions, num_rows=64, max_num_logprobs=5)  # warm
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = sampler.sample(logits, state, state_rows, positions, num_rows=64, max_num_logprobs=5)
    torch.cuda.synchronize()
    for seed, expect in zip((2, 3), eager):
        logits.copy_(gpu.to_device(_logits(64, seed)))
        positions.add_(1)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.tokens, expect)
