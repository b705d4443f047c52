"""Logprobs, ranks and top-n lists (sampled tokens and prompt chunks) against the float64 oracle.

Small candidate capacities force the selection paths: the row finish's overflow to the per-row
fallback, its bracket gathers, and massive ties at the n-th value (lowest ids kept, in token order).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runnercheck.impl.device import Device
from runnercheck.impl.interface import SamplingParams
from runnercheck.impl.sample import LogprobsComputer, LogprobsError, LogprobsOutput, SelectionConfig, prompt_logprobs_chunked
from test_sampler_harness import LogitRow, RowRequest, admit, run_sampler

ref = pytest.importorskip("runnercheck.reference.sampler")
# The interpreter runs kernels in numpy, which warns on the -inf arithmetic of all -inf rows.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

VOCAB = 300
MAX_LOGPROBS = 5


@pytest.fixture(scope="module")
def dev() -> Device:
    return Device("cuda" if torch.cuda.is_available() else "cpu")


def _computer(dev: Device, capacity: int, finish: int = 16, sub: int = 16) -> LogprobsComputer:
    # 64-column chunks of ``sub``-token sub-blocks: a 300-token row spans 5 chunks; ``finish`` caps the
    # entries >= T the row finish takes (beyond: the per-row fallback, whose bracket gathers small
    # ``capacity`` values force)
    config = SelectionConfig(block=64, narrow_block=64, candidates=capacity, num_warps=4, logprobs_sub=sub,
                             logprobs_candidates=finish)
    return LogprobsComputer(dev, VOCAB, MAX_LOGPROBS, 8, config)


def _assert_matches(out: LogprobsOutput, logits: torch.Tensor, targets: list[int], num_top: int) -> None:
    for i, target in enumerate(targets):
        expect = ref.token_logprobs(logits[i], target, num_top)
        assert out.rank[i].item() == expect.rank, i
        if expect.logprob == expect.logprob:  # an all -inf row has a NaN logprob in both
            assert out.logprob[i].item() == pytest.approx(expect.logprob, abs=1e-5, rel=1e-5), i
        assert tuple(out.top_ids[i].tolist()) == expect.top_token_ids, i
        got = out.top_logprobs[i].tolist()
        for g, e in zip(got, expect.top_logprobs):
            if e == e and e != float("-inf"):
                assert g == pytest.approx(e, abs=1e-5, rel=1e-5), i


def _special_rows(gen: torch.Generator) -> torch.Tensor:
    logits = torch.randn(6, VOCAB, generator=gen) * 3
    logits[1] = torch.round(logits[1])  # many exact ties
    logits[2] = 0.0
    logits[2, 250] = 1.0  # one winner, then 299 tied entries spread over every span
    logits[3, 10] = float("nan")
    logits[4] = float("-inf")
    logits[5, 100:] = float("-inf")
    return logits


@pytest.mark.parametrize("finish", [4, 32])
@pytest.mark.parametrize("capacity", [8, 64])
def test_logprobs_ranks_and_top_lists(dev, capacity, finish):
    computer = _computer(dev, capacity, finish)
    logits = _special_rows(torch.Generator().manual_seed(capacity))
    targets = [3, 4, 5, 6, 7, 8]
    logits_dev = dev.to_device(logits)
    targets_dev = dev.to_device(torch.tensor(targets))
    for num_top in (0, 1, MAX_LOGPROBS):
        out = computer.launch(logits_dev, targets_dev, len(targets), num_top)
        if dev.is_cuda:
            dev.synchronize()
        _assert_matches(out, logits, targets, num_top)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31), scale=st.sampled_from([0.1, 1.0, 30.0]), quantum=st.sampled_from([0.0, 0.25, 2.0]),
       num_top=st.integers(0, MAX_LOGPROBS), capacity=st.sampled_from([8, 32]), finish=st.sampled_from([4, 8, 32]),
       sub=st.sampled_from([2, 16, 64]))
def test_logprobs_random_rows(dev, seed, scale, quantum, num_top, capacity, finish, sub):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, VOCAB, generator=gen) * scale
    if quantum:
        logits = torch.round(logits / quantum) * quantum
    targets = torch.randint(0, VOCAB, (3,), generator=gen).tolist()
    out = _computer(dev, capacity, finish, sub).launch(dev.to_device(logits), dev.to_device(torch.tensor(targets)), 3,
                                                       num_top)
    _assert_matches(out, logits, targets, num_top)


def test_sampler_reports_logprobs_of_its_tokens(dev):
    from runnercheck.impl.sample import Sampler, SamplingState

    config = SelectionConfig(block=64, narrow_block=64, candidates=16, num_warps=4)
    sampler = Sampler(dev, VOCAB, max_logprobs=MAX_LOGPROBS, max_num_rows=4, config=config)
    state = SamplingState(dev, 2, VOCAB)
    requests = {0: RowRequest(SamplingParams(top_k=20, repetition_penalty=1.5), 9, (4, 5)),
                1: RowRequest(SamplingParams(temperature=0.0), 1, (6,))}
    admit(dev, state, requests)
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(4)) * 2
    out = run_sampler(dev, sampler, state, logits, [LogitRow(0, 1), LogitRow(1, 2), LogitRow(0, 3)], num_logprobs=3)
    tokens = out.tokens.tolist()
    # logprobs come from the raw logits, not the penalised/filtered distribution
    view = LogprobsOutput(out.logprob, out.rank, out.top_ids, out.top_logprobs)
    _assert_matches(view, logits, tokens, 3)


def test_prompt_logprobs_in_chunks_equal_one_launch(dev):
    computer = _computer(dev, 16)
    positions = 7
    logits = torch.randn(positions, VOCAB, generator=torch.Generator().manual_seed(8)) * 4
    logits_dev = dev.to_device(logits)
    prompt = torch.randint(0, VOCAB, (positions + 1,), generator=torch.Generator().manual_seed(9))
    targets = dev.to_device(prompt[1:].clone())
    calls = []

    def compute_logits(start: int, end: int) -> torch.Tensor:
        calls.append((start, end))
        return logits_dev[start:end]

    out = LogprobsOutput(dev.zeros(positions, torch.float32), dev.zeros(positions, torch.int32),
                         dev.zeros((positions, MAX_LOGPROBS), torch.int32), dev.zeros((positions, MAX_LOGPROBS), torch.float32))
    prompt_logprobs_chunked(compute_logits, targets, positions, 2, computer, out, chunk_rows=3)
    assert calls == [(0, 3), (3, 6), (6, 7)]  # peak logits: 3 rows, whatever the prompt length
    view = LogprobsOutput(out.logprob, out.rank, out.top_ids[:, :2], out.top_logprobs[:, :2])
    _assert_matches(view, logits, prompt[1:].tolist(), 2)


def test_bad_arguments(dev):
    computer = _computer(dev, 16)
    logits = dev.zeros((2, VOCAB), torch.float32)
    targets = dev.zeros(2, torch.int64)
    with pytest.raises(LogprobsError, match="num_top"):
        computer.launch(logits, targets, 2, MAX_LOGPROBS + 1)
    with pytest.raises(LogprobsError, match="num_rows"):
        computer.launch(logits, targets, 9, 1)
    with pytest.raises(LogprobsError, match="float32"):
        computer.launch(logits.double(), targets, 2, 1)
    with pytest.raises(LogprobsError, match="target_ids"):
        computer.launch(logits, targets.float(), 2, 1)


def test_row_finish_takes_every_tie_at_the_bound_and_overflows_exactly(dev):
    """The failures the row finish could have, planted: the bound ``T`` (5th largest chunk max) tied by
    more than 5 chunks, ties inside the top 5 across sub-blocks, and more entries (or sub-blocks)
    ``>= T`` than the finish takes, which must go to the per-row fallback (mode 3), never be cut.

    64-token chunks of 16-token sub-blocks, the finish takes at most 8 entries.
    """
    computer = _computer(dev, 64, finish=8)
    gen = torch.Generator().manual_seed(21)
    logits = torch.randn(5, VOCAB, generator=gen)
    logits[0, [10, 11, 70, 140, 200, 290]] = 7.0  # every chunk's max ties at T = 7, two in chunk 0
    logits[1, [3, 70, 140, 200, 290, 20, 21]] = torch.tensor([9.0, 8.0, 8.0, 7.0, 7.0, 8.0, 7.0])  # 7 >= T = 7
    logits[2, 64:72] = 6.0  # chunk 1: 8 entries at its max, the 5th chunk max: T = 6, 12 entries >= T
    logits[2, [3, 140, 200, 290]] = 9.0
    logits[3, :] = 0.5  # every entry ties: all 19 sub-blocks reach T
    logits[4, [1, 17, 33, 49, 65, 81, 97, 113, 129, 200, 290]] = 5.0  # T = 5 in 11 sub-blocks
    targets = [10, 21, 64, 7, 49]
    logits_dev, targets_dev = dev.to_device(logits), dev.to_device(torch.tensor(targets))
    out = computer.launch(logits_dev, targets_dev, 5, MAX_LOGPROBS)
    _assert_matches(out, logits, targets, MAX_LOGPROBS)
    assert computer.mode[:5].tolist() == [0, 0, 3, 3, 3]
    assert out.top_ids[0].tolist() == [10, 11, 70, 140, 200]
    assert out.top_ids[1].tolist() == [3, 20, 70, 140, 21]
    out = computer.launch(logits_dev, targets_dev, 5, 3)  # top 3: all 5 chunks tie at T = 7 in row 0
    _assert_matches(out, logits, targets, 3)
    assert computer.mode[:2].tolist() == [0, 0]
    assert out.top_ids[0].tolist() == [10, 11, 70]
    wide = LogprobsComputer(dev, VOCAB, MAX_LOGPROBS, 8, dataclasses.replace(computer.config, logprobs_chunk=128))
    out = wide.launch(logits_dev, targets_dev, 5, MAX_LOGPROBS)  # top 5 of 3 chunks: T cannot bound
    _assert_matches(out, logits, targets, MAX_LOGPROBS)
    assert wide.mode[:5].tolist() == [3] * 5


@pytest.mark.parametrize("field, value", [("logprobs_sub", 3), ("logprobs_sub", 1), ("logprobs_candidates", 6),
                                          ("logprobs_candidates", 1)])
def test_bad_row_finish_config(dev, field, value):
    config = SelectionConfig(block=64, narrow_block=64, candidates=16, num_warps=4, **{field: value})
    with pytest.raises(LogprobsError, match=field):
        LogprobsComputer(dev, VOCAB, MAX_LOGPROBS, 2, config)
