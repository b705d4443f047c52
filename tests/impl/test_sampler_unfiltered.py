"""The sampler's ``unfiltered`` launch set: the split passes without the filter launches (select, finish, fallback).

When the caller knows no row has a filter on (`SamplingParams.filtered`), the plan launch decides every row; the
tokens, flags and logprobs (raw and processed) are those of all five launches -- temperature and greedy rows,
penalties, draft prefixes, non-finite rows -- and the oracle's.  The flag is honoured as given: a filtered row
under it keeps the plan's token, which the filters would change (the caller must not guess; the runner's count
is tested in test_runner_launch_sets.py).  Interpreted on CPU: vocabulary 300.
"""
from __future__ import annotations

import math

import pytest
import torch

import runnercheck.impl.sample.sampler as sampler_module
from runnercheck.impl.device import Device
from runnercheck.impl.interface import SamplingParams
from runnercheck.impl.sample import Sampler, SamplingState
from test_sampler_harness import LogitRow, RowRequest, admit, logit_row_tensors, reference_results

VOCAB = 300
ROWS = 6


@pytest.fixture(scope="module")
def dev() -> Device:
    return Device("cuda" if torch.cuda.is_available() else "cpu")


def _logits() -> torch.Tensor:
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(ROWS, VOCAB, generator=gen) * 2.0
    logits[2, 17] = math.nan  # flagged, sampled as -inf
    logits[3, [40, 290]] = math.inf  # the lowest +inf wins
    logits[4] = -math.inf  # nothing finite: token 0
    return logits


def _run(device: Device, sampler: Sampler, state: SamplingState, logits: torch.Tensor, rows: list[LogitRow],
         **flags) -> tuple:
    state_rows, positions, prefix = logit_row_tensors(device, rows)
    logits_dev = device.to_device(logits.to(torch.float32))
    box = {}

    def work() -> None:
        box["out"] = sampler.sample(logits_dev, state, state_rows, positions, num_rows=len(rows), draft_prefix=prefix,
                                    max_num_logprobs=2, **flags)

    device.enqueue(work, "sample")
    device.synchronize()
    out = box["out"]
    return tuple(t.cpu().clone() for t in (out.tokens, out.nan_flags, out.logprob, out.rank, out.top_ids,
                                           out.top_logprobs))


def _assert_same(got: tuple, expected: tuple) -> None:
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)  # bit for bit; a NaN logprob (row 4) too


def _launched(monkeypatch) -> list[str]:
    names: list[str] = []
    launch = sampler_module.launch

    def counting(kernel, grid, *args, **kwargs):
        names.append(kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__)
        return launch(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(sampler_module, "launch", counting)
    return names


@pytest.mark.parametrize("processed", [False, True], ids=["raw-logprobs", "processed-logprobs"])
def test_unfiltered_rows_get_the_five_launches_tokens_and_logprobs_from_two(dev, monkeypatch, processed) -> None:
    mode = "processed" if processed else "raw"
    sampler = Sampler(dev, VOCAB, max_logprobs=2, max_num_rows=ROWS)
    state = SamplingState(dev, 3, VOCAB)
    requests = {0: RowRequest(SamplingParams(temperature=0.7, logprobs_mode=mode), 21, (1, 2)),
                1: RowRequest(SamplingParams(temperature=1.3, repetition_penalty=1.4, frequency_penalty=0.3,
                                             presence_penalty=0.2, logprobs_mode=mode), 22, (3, 4, 5), (77, 77, 9)),
                2: RowRequest(SamplingParams(temperature=0.0, top_k=3, top_p=0.5, logprobs_mode=mode), 23, (6,))}
    assert not any(r.params.filtered for r in requests.values())  # filters at temperature 0 are off
    admit(dev, state, requests)
    rows = [LogitRow(i % 3, 30 + i, (250,) if i == 1 else ()) for i in range(ROWS)]
    logits = _logits()
    flags = {"processed_logprobs": True} if processed else {}
    names = _launched(monkeypatch)
    every = _run(dev, sampler, state, logits, rows, **flags)
    five = list(names)
    names.clear()
    unfiltered = _run(dev, sampler, state, logits, rows, unfiltered=True, **flags)
    _assert_same(unfiltered, every)
    assert [r.token for r in reference_results(logits, requests, rows)] == every[0].tolist()
    assert every[1].tolist() == [0, 0, 1, 1, 0, 0]
    sampling = ["sampler_block_kernel", "sampler_plan_kernel"]
    assert five[:5] == sampling + ["sampler_select_kernel", "sampler_finish_kernel", "sampler_row_kernel"]
    assert names[:2] == sampling and "sampler_select_kernel" not in names  # then the logprobs' launches
    assert names[2:] == five[5:]


def test_the_flag_is_honoured_as_given_a_filtered_row_keeps_the_plans_token(dev) -> None:
    """The caller's word is not checked on the device (it would cost the launches it saves): a top-k 5 row under
    ``unfiltered`` keeps the plan's token, its plain argmax (a filtered row draws its noise after the plan), where
    the filter launches sample among the five."""
    sampler = Sampler(dev, VOCAB, max_logprobs=2, max_num_rows=ROWS)
    state = SamplingState(dev, 1, VOCAB)
    requests = {0: RowRequest(SamplingParams(temperature=5.0, top_k=5), 3, (1,))}
    admit(dev, state, requests)
    rows = [LogitRow(0, 40 + i) for i in range(ROWS)]
    logits = torch.randn(ROWS, VOCAB, generator=torch.Generator().manual_seed(2)) * 0.1
    filtered = _run(dev, sampler, state, logits, rows)[0]
    assert filtered.tolist() == [r.token for r in reference_results(logits, requests, rows)]
    top5 = logits.topk(5, dim=1).indices
    assert bool((top5 == filtered[:, None]).any(dim=1).all())
    assert filtered.tolist() != logits.argmax(dim=1).tolist()  # sampled among the five
    assert _run(dev, sampler, state, logits, rows, unfiltered=True)[0].tolist() == logits.argmax(dim=1).tolist()


@pytest.mark.parametrize("params,filtered", [
    (SamplingParams(), False),
    (SamplingParams(temperature=0.0, top_k=5, top_p=0.5, min_p=0.1), False),
    (SamplingParams(top_k=5), True),
    (SamplingParams(top_p=0.999), True),
    (SamplingParams(top_p=1.0, top_k=-1, min_p=0.0), False),
    (SamplingParams(min_p=1e-30), True),  # 0 in fp32, so the kernels leave it off: the host errs towards filtering
    (SamplingParams(temperature=1e-30, top_k=1), True),
    (SamplingParams(repetition_penalty=1.5, frequency_penalty=1.0, presence_penalty=-1.0), False),
])
def test_filtered_is_the_filter_rows_of_the_table_at_a_temperature(params, filtered) -> None:
    assert params.filtered is filtered


def test_every_filter_row_of_the_table_sends_a_row_past_the_plan_and_is_filtered_on_the_host(dev) -> None:
    """The host's predicate and the kernels' agree row by row of `SAMPLING_FIELDS`: a row with one filter on (its draw's
    low end, at temperature 1) is filtered on the host and left open by the plan launch (its mode not DONE); the same
    row at temperature 0, or with only a penalty on, is neither.  A filter added to the table but not to the kernels'
    ``filtered`` (or the reverse) fails here."""
    from runnercheck.impl.interface import SAMPLING_FIELDS
    from runnercheck.impl.kernels.sampling_split import MODE_DONE

    filters = [f for f in SAMPLING_FIELDS if f.stage == "filter"]
    cases = [SamplingParams(**{f.name: type(f.neutral)(f.draw[0])}) for f in filters]
    cases += [SamplingParams(temperature=0.0, **{f.name: type(f.neutral)(f.draw[0])}) for f in filters]
    cases += [SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5), SamplingParams()]
    expected = [True] * len(filters) + [False] * (len(filters) + 2)
    assert [p.filtered for p in cases] == expected
    sampler = Sampler(dev, VOCAB, max_logprobs=2, max_num_rows=len(cases))
    state = SamplingState(dev, len(cases), VOCAB)
    admit(dev, state, {i: RowRequest(p, 7 + i, (1, 2)) for i, p in enumerate(cases)})
    rows = [LogitRow(i, 5) for i in range(len(cases))]
    logits = torch.randn(len(cases), VOCAB, generator=torch.Generator().manual_seed(3))
    _run(dev, sampler, state, logits, rows, unfiltered=True)  # the block and plan launches only: the plan's modes
    open_rows = (sampler.mode[: len(cases)].cpu() != MODE_DONE.value).tolist()  # a Triton constexpr
    assert open_rows == expected
