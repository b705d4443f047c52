"""SamplingState: admission through staged writes, count reset/rebuild kernels, post-update counts.

Runs on the lagging ``sim`` device (interpreted kernels), where work runs after the host has moved
on: the state must come out right without the host reading anything back.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from runnercheck.impl.buffers import StagingPool, StagingWriter
from runnercheck.impl.device import Device
from runnercheck.impl.interface import SamplingParams, SamplingParamsError, TokenOutOfVocabError
from runnercheck.impl.sample import SamplingState, SamplingStateError, prompt_bitmask_words

VOCAB = 300
ROWS = 4

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="sim-device kernels run interpreted (CPU only)")


@pytest.fixture
def sim() -> Device:
    return Device("sim", seed=5, lag_policy="lag-1-steps")


def _step(dev: Device, state: SamplingState, pool: StagingPool, step: int) -> StagingWriter:
    writer = StagingWriter(pool, step)
    state.flush(writer)
    writer.submit()
    state.enqueue_apply()
    dev.begin_step()
    return writer


def _counts(tokens, vocab: int = VOCAB) -> torch.Tensor:
    return torch.bincount(torch.tensor(list(tokens), dtype=torch.int64), minlength=vocab).to(torch.int32)


def test_prompt_bitmask_words():
    words = prompt_bitmask_words([0, 31, 32, 299, 31], VOCAB).view(np.uint32)
    assert words.shape == (10,)
    assert words[0] == (1 | (1 << 31)) and words[1] == 1 and words[9] == 1 << (299 - 288)
    assert int(np.count_nonzero(words)) == 3


def test_admission_applies_params_seed_mask_and_counts(sim):
    state = SamplingState(sim, ROWS, VOCAB)
    pool = StagingPool(sim, num_slots=4, capacity_bytes=1 << 14)
    params = SamplingParams(temperature=0.5, top_k=7, top_p=0.8, min_p=0.1, repetition_penalty=1.3,
                            frequency_penalty=0.4, presence_penalty=-0.2)
    state.add_request(2, params, 12345678901, (5, 6, 5, 299), (7, 7, 8))
    state.add_request(0, SamplingParams(), 1, (1,))
    _step(sim, state, pool, 0)
    assert sim.num_pending > 0  # lagging: nothing applied yet, and the host did not wait
    sim.synchronize()
    assert state.temperature.base[2].item() == pytest.approx(0.5)
    assert state.top_k.base[2].item() == 7 and state.top_k.base[0].item() == -1
    assert state.top_p.base[2].item() == pytest.approx(0.8)
    assert state.min_p.base[2].item() == pytest.approx(0.1)
    assert state.repetition_penalty.base[2].item() == pytest.approx(1.3)
    assert state.frequency_penalty.base[2].item() == pytest.approx(0.4)
    assert state.presence_penalty.base[2].item() == pytest.approx(-0.2)
    assert state.seed.base[2].item() == 12345678901
    assert np.array_equal(state.prompt_mask.base[2].numpy(), prompt_bitmask_words((5, 6, 299), VOCAB))
    assert torch.equal(state.output_counts[2], _counts((7, 7, 8)))  # a resumed request's earlier outputs
    assert int(state.output_counts[0].sum()) == 0


def test_readmission_resets_counts_without_uploading_the_vocabulary(sim):
    state = SamplingState(sim, ROWS, VOCAB)
    pool = StagingPool(sim, num_slots=4, capacity_bytes=1 << 14)
    state.add_request(1, SamplingParams(), 3, (9,), tuple(range(50)))
    _step(sim, state, pool, 0)
    sim.synchronize()
    assert int(state.output_counts[1].sum()) == 50
    state.add_request(1, SamplingParams(), 4, (10,), (2,))  # the row is reused by another request
    writer = _step(sim, state, pool, 1)
    sim.synchronize()
    assert torch.equal(state.output_counts[1], _counts((2,)))
    assert writer.bytes < VOCAB * 4  # the reset is a kernel, not V uploaded zeros
    assert np.array_equal(state.prompt_mask.base[1].numpy(), prompt_bitmask_words((10,), VOCAB))


def test_latest_admission_of_a_row_wins(sim):
    state = SamplingState(sim, ROWS, VOCAB)
    pool = StagingPool(sim, num_slots=4, capacity_bytes=1 << 14)
    state.add_request(3, SamplingParams(temperature=0.2), 1, (1,), (4, 4))
    state.add_request(3, SamplingParams(temperature=0.9), 2, (2,), (6,))
    _step(sim, state, pool, 0)
    sim.synchronize()
    assert state.temperature.base[3].item() == pytest.approx(0.9) and state.seed.base[3].item() == 2
    assert torch.equal(state.output_counts[3], _counts((6,)))


def test_post_update_counts_accepted_tokens_including_duplicates(sim):
    state = SamplingState(sim, ROWS, VOCAB)
    pool = StagingPool(sim, num_slots=4, capacity_bytes=1 << 14)
    for row in range(ROWS):
        state.add_request(row, SamplingParams(), row, (1,))
    _step(sim, state, pool, 0)
    rows = sim.to_device(torch.tensor([0, 0, 0, 2, 3, 3], dtype=torch.int32))
    tokens = sim.to_device(torch.tensor([5, 5, 7, 299, 8, 9], dtype=torch.int64))
    valid = sim.to_device(torch.tensor([1, 1, 0, 1, 1, 0], dtype=torch.int32))
    state.enqueue_post_update(rows, tokens, valid, 6)
    state.enqueue_post_update(rows, tokens, None, 4)  # all of the first four accepted
    sim.synchronize()
    assert torch.equal(state.output_counts[0], _counts((5, 5, 5, 5, 7)))
    assert torch.equal(state.output_counts[2], _counts((299, 299)))
    assert torch.equal(state.output_counts[3], _counts((8,)))
    assert int(state.output_counts[1].sum()) == 0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        (dict(row=ROWS), SamplingStateError),
        (dict(row=-1), SamplingStateError),
        (dict(params=SamplingParams(top_p=0.0)), SamplingParamsError),
        (dict(params=SamplingParams(temperature=-1.0)), SamplingParamsError),
        (dict(seed=-5), SamplingParamsError),
        (dict(seed=2**63), SamplingParamsError),
        (dict(prompt=(1, VOCAB)), TokenOutOfVocabError),
        (dict(outputs=(-1,)), TokenOutOfVocabError),
        (dict(params="greedy"), SamplingStateError),
    ],
)
def test_bad_admission_raises_and_stages_nothing(sim, kwargs, error):
    state = SamplingState(sim, ROWS, VOCAB)
    args = dict(row=1, params=SamplingParams(), seed=1, prompt=(1, 2), outputs=(3,))
    args.update(kwargs)
    with pytest.raises(error):
        state.add_request(args["row"], args["params"], args["seed"], args["prompt"], args["outputs"])
    assert state.num_pending == 0
    assert all(t.num_pending == 0 for t in (state.temperature, state.seed, state.prompt_mask, state.top_k))
