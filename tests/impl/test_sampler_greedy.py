"""The all-greedy launch (`runnercheck.impl.kernels.sampling_greedy`) against the split passes and the oracle.

Lowest index on exact ties (also across chunks and for -0.0 == +0.0), the non-finite rule (NaN as
-inf and flagged; the lowest +inf wins; all -inf -> 0), penalties and draft prefixes, and repeated
launches (the per-row accumulators reset themselves).  Interpreted on CPU: vocabulary 300.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from runnercheck.impl.device import Device
from runnercheck.impl.interface import SamplingParams
from runnercheck.impl.kernels.sampling_greedy import MIN_PIPELINED_STEPS, greedy_spans, greedy_stages
from runnercheck.impl.sample import Sampler, SamplingState
from runnercheck.impl.sample.logprobs import default_selection_config
from test_sampler_harness import LogitRow, RowRequest, admit, logit_row_tensors, reference_results

VOCAB = 300


@pytest.fixture(scope="module")
def dev() -> Device:
    return Device("cuda" if torch.cuda.is_available() else "cpu")


def _run(device: Device, sampler: Sampler, state: SamplingState, logits: torch.Tensor, rows: list[LogitRow],
         all_greedy: bool) -> tuple[list[int], list[int]]:
    state_rows, positions, prefix = logit_row_tensors(device, rows)
    logits_dev = device.to_device(logits.to(torch.float32))
    box = {}

    def work() -> None:
        box["out"] = sampler.sample(logits_dev, state, state_rows, positions, num_rows=len(rows), draft_prefix=prefix,
                                    all_greedy=all_greedy)

    device.enqueue(work, "sample")
    device.synchronize()
    return box["out"].tokens.tolist(), box["out"].nan_flags.tolist()


def _logits() -> torch.Tensor:
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(8, VOCAB, generator=gen)
    logits[1] = 0.0
    logits[1, 0] = -0.0  # -0.0 == +0.0: the lowest index still wins
    logits[2] = torch.round(logits[2] * 2) / 2  # coarse: exact ties across chunks
    logits[2, [77, 250]] = 9.0
    logits[3, 5] = math.nan
    logits[4, [40, 290]] = math.inf
    logits[4, 7] = math.nan
    logits[5] = -math.inf
    logits[6, 100] = torch.finfo(torch.float32).max  # FLT_MAX: finite, beats everything
    logits[6, 200] = math.nan  # a NaN alone flags a penalty-free row
    logits[7, 150] = math.inf  # a row with penalties: its +inf wins and flags
    return logits


@pytest.mark.parametrize("programs,sub,stages", [(None, 0, 1), (32, 64, 1), (8, 16, 3)],
                         ids=["one-span-a-row", "three-spans-a-row", "one-span-pipelined"])
def test_all_greedy_launch_equals_the_split_passes_and_the_oracle(dev, programs, sub, stages) -> None:
    """32 programs over 8 rows: spans of 128 tokens, combined by the atomics (row 2's tie at 77 and 250 crosses
    spans); the default: each row one program walking the whole vocabulary.  Pipelined: one span a row in 19
    steps of 16 tokens, the loop's loads software-pipelined three deep (compiled on cuda; the interpreter runs
    it as plain loads)."""
    config = default_selection_config(dev)
    if programs is not None:  # small steps on cuda too (its default step, 2048, is a whole row of this vocabulary)
        config = dataclasses.replace(config, greedy_programs=programs, greedy_sub=sub, greedy_stages=stages)
    blocks, span = greedy_spans(VOCAB, 8, config.greedy_sub, config.greedy_programs)
    assert blocks == (3 if programs == 32 else 1)
    assert greedy_stages(span, config.greedy_sub, config.greedy_stages) == stages
    sampler = Sampler(dev, VOCAB, max_logprobs=0, max_num_rows=8, config=config)
    state = SamplingState(dev, 2, VOCAB)
    requests = {0: RowRequest(SamplingParams(temperature=0.0), 5, (1, 2)),
                1: RowRequest(SamplingParams(temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.3,
                                             presence_penalty=0.2), 6, (3, 4, 5), (77, 77, 9))}
    admit(dev, state, requests)
    rows = [LogitRow(i % 2, 10 + i, (250,) if i == 2 else ()) for i in range(8)]
    logits = _logits()
    split = _run(dev, sampler, state, logits, rows, all_greedy=False)
    for _ in range(2):  # the second launch starts from the accumulators the first reset
        assert _run(dev, sampler, state, logits, rows, all_greedy=True) == split
    expected = [r.token for r in reference_results(logits, requests, rows)]
    assert split[0] == expected
    assert split[1] == [0, 0, 0, 1, 1, 0, 1, 1]
    assert split[0][4] == 40 and split[0][5] == 0 and split[0][1] == 0
    assert split[0][6] == 100 and split[0][7] == 150


@pytest.mark.gpu
def test_all_greedy_launch_at_the_full_vocabulary_cuda() -> None:
    """Compiled, [256, 151936]: the one-launch argmax equals the split passes and torch.argmax (no penalties)."""
    device = Device("cuda")
    vocab, rows = 151936, 256
    sampler = Sampler(device, vocab, max_logprobs=0, max_num_rows=rows)
    state = SamplingState(device, 1, vocab)
    admit(device, state, {0: RowRequest(SamplingParams(temperature=0.0), 1, (0,))})
    gen = torch.Generator().manual_seed(2)
    logits = torch.round(torch.randn(rows, vocab, generator=gen) * 4)  # many exact ties at the top
    logits[3, 151935] = 1e30
    logits[4] = -math.inf
    logits[5, 17] = math.nan
    table = [LogitRow(0, i) for i in range(rows)]
    fast = _run(device, sampler, state, logits, table, all_greedy=True)
    assert fast == _run(device, sampler, state, logits, table, all_greedy=False)
    assert fast[0] == torch.argmax(torch.nan_to_num(logits, nan=-math.inf), dim=1).tolist()
    for stages in (1, 3):  # the span loop's loads plain and software-pipelined, whichever the default is
        other = Sampler(device, vocab, max_logprobs=0, max_num_rows=rows,
                        config=dataclasses.replace(sampler.config, greedy_stages=stages))
        assert _run(device, other, state, logits, table, all_greedy=True) == fast
    # 8 rows: ~32 spans a row, combined by the atomics
    assert greedy_spans(vocab, 8, sampler.config.greedy_sub, sampler.config.greedy_programs)[0] > 16
    few = _run(device, sampler, state, logits[:8], table[:8], all_greedy=True)
    assert few == _run(device, sampler, state, logits[:8], table[:8], all_greedy=False) and few[0] == fast[0][:8]


def test_greedy_spans_cover_the_row_in_about_the_asked_programs() -> None:
    for vocab, rows, sub, programs in ((151936, 256, 2048, 256), (151936, 1, 2048, 256), (151936, 8, 2048, 256),
                                       (300, 8, 64, 32), (300, 1, 64, 1000), (5, 3, 64, 4)):
        blocks, span = greedy_spans(vocab, rows, sub, programs)
        assert span % sub == 0 and (blocks - 1) * span < vocab <= blocks * span
        assert blocks == 1 or rows * blocks <= programs + rows * 2


def test_a_penalty_overflow_to_inf_is_not_a_raw_inf(dev) -> None:
    """A repetition penalty below 1 divides a seen positive logit by it: near FLT_MAX that overflows to +inf.  The
    non-finite rule is about the raw logits: a raw +inf later in the row still wins and flags, and without one the
    overflowed score is the plain argmax (unflagged).  Both launches agree with the oracle (a launch that took the
    first +inf *score* for a raw +inf picks token 20 in row 0)."""
    sampler = Sampler(dev, VOCAB, max_logprobs=0, max_num_rows=2)
    state = SamplingState(dev, 1, VOCAB)
    requests = {0: RowRequest(SamplingParams(temperature=0.0, repetition_penalty=0.5), 3, (20, 21))}
    admit(dev, state, requests)
    rows = [LogitRow(0, 10), LogitRow(0, 11)]
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(5))
    logits[:, 20] = torch.finfo(torch.float32).max / 1.5  # seen: / 0.5 overflows to +inf
    logits[0, 260] = math.inf  # raw
    expected = [r.token for r in reference_results(logits, requests, rows)]
    assert expected == [260, 20]
    for all_greedy in (False, True):
        tokens, flags = _run(dev, sampler, state, logits, rows, all_greedy=all_greedy)
        assert tokens == expected, all_greedy
        assert flags == [1, 0], all_greedy


def test_short_spans_load_plainly_whatever_the_stages_asked() -> None:
    assert greedy_stages(2048 * MIN_PIPELINED_STEPS, 2048, 3) == 3
    assert greedy_stages(2048 * (MIN_PIPELINED_STEPS - 1), 2048, 3) == 1
    assert greedy_stages(151552, 2048, 1) == 1
