"""`SamplingState.add_request(..., checked=True)` (the runner's admissions, already checked at the boundary)
stages exactly what the checked path stages; the default still rejects bad arguments."""
from __future__ import annotations

import numpy as np
import pytest

from runnercheck.impl.device import Device
from runnercheck.impl.interface import SamplingParams, TokenOutOfVocabError
from runnercheck.impl.sample.state import SamplingState


def _staged(state: SamplingState) -> list:
    return [[(row, start, list(vals)) for row, start, vals in t.pending_writes()] for t in state._staged]


def test_checked_admissions_stage_the_same_words():
    params = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.2,
                            frequency_penalty=0.3, presence_penalty=0.1, seed=11)
    outputs = (np.int64(4), 7, 7)  # numpy ints arrive from some schedulers: both paths store Python ints
    a, b = SamplingState(Device("cpu"), 4, 100), SamplingState(Device("cpu"), 4, 100)
    a.add_request(2, params, 11, (1, 2, 99, 64), outputs)
    b.add_request(2, params, 11, (1, 2, 99, 64), outputs, checked=True)
    assert _staged(a) == _staged(b) and _staged(a)[0]
    assert a._pending_admissions == b._pending_admissions == {2: [4, 7, 7]}
    assert all(type(t) is int for t in b._pending_admissions[2])


def test_unchecked_admissions_still_reject_bad_tokens():
    state = SamplingState(Device("cpu"), 4, 100)
    with pytest.raises(TokenOutOfVocabError):
        state.add_request(0, SamplingParams(), 1, (1, 100))
    assert state.num_pending == 0 and not any(_staged(state))
