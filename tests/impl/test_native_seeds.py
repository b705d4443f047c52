"""A request's derived seed in C (`impl/native/seeds.c`) against its reference, `runnercheck.impl.interface.effective_seed`.

On generated ids (any text, lengths across BLAKE2b's 128-byte blocks) and base seeds (all of int64) the C twin
gives the reference's seed, declines what it does not take (a bool, an int past 64 bits, bytes, a str subclass,
an id UTF-8 cannot encode) with NotImplemented, and `runnercheck.impl.seeds.request_seed` -- what the runner asks -- always
answers as the reference does.  A build one mixing round short (the plant ``seed_rounds``) is caught by
the same comparison.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import runnercheck.impl.native as native
import runnercheck.impl.seeds as seeds_module
from runnercheck.impl.interface import SamplingParams, effective_seed
from runnercheck.impl.seeds import request_seed
from test_native import Odd, _planted

seeds_c = native.load("seeds")
needs_native = pytest.mark.skipif(seeds_c is None, reason="impl/native not built (or RUNNERCHECK_NATIVE=0)")

UNSEEDED = SamplingParams()
BASE_SEEDS = st.integers(-(2**63), 2**63 - 1)
# Ids of every length up to three blocks (the text's UTF-8 may be longer than its characters).
IDS = st.text(max_size=400)


@needs_native
@settings(max_examples=300, deadline=None)
@given(base_seed=BASE_SEEDS, req_id=IDS)
def test_the_c_seed_is_the_reference_seed(base_seed: int, req_id: str) -> None:
    assert seeds_c.derived_seed(base_seed, req_id) == effective_seed(UNSEEDED, req_id, base_seed)


@needs_native
@pytest.mark.parametrize("prefix_and_id", [0, 1, 126, 127, 128, 129, 255, 256, 257, 383, 384, 385])
def test_messages_on_every_side_of_a_block_boundary(prefix_and_id: int) -> None:
    """"0:" plus an id: messages of exactly 0, 1 and 2 blocks, and one byte either side of each."""
    req_id = "x" * max(0, prefix_and_id - 2)
    assert seeds_c.derived_seed(0, req_id) == effective_seed(UNSEEDED, req_id, 0)


@needs_native
@pytest.mark.parametrize("base_seed, req_id", [
    (True, "r1"), (2**64, "r1"), (-(2**63) - 1, "r1"), (1.0, "r1"), (0, b"r1"), (0, Odd("r1")), (0, "r\ud800"), (0, 7),
])
def test_what_the_c_seed_declines(base_seed, req_id) -> None:
    assert seeds_c.derived_seed(base_seed, req_id) is NotImplemented


@pytest.mark.parametrize("base_seed, req_id", [(3, "r1"), (True, "r1"), (2**64, "r1"), (0, Odd("r1")), (5, "é" * 300)])
def test_request_seed_answers_as_the_reference(base_seed, req_id) -> None:
    assert request_seed(UNSEEDED, req_id, base_seed) == effective_seed(UNSEEDED, req_id, base_seed)
    own = SamplingParams(seed=42)
    assert request_seed(own, req_id, base_seed) == 42 == effective_seed(own, req_id, base_seed)


def test_request_seed_raises_what_the_reference_raises() -> None:
    """An id UTF-8 cannot encode: the C twin declines, the reference's encoder error reaches the caller."""
    with pytest.raises(UnicodeEncodeError):
        effective_seed(UNSEEDED, "r\ud800", 0)
    with pytest.raises(UnicodeEncodeError):
        request_seed(UNSEEDED, "r\ud800", 0)


def test_request_seed_without_the_c_twin(monkeypatch) -> None:
    monkeypatch.setattr(seeds_module, "_seeds", None)
    assert request_seed(UNSEEDED, "r9", 11) == effective_seed(UNSEEDED, "r9", 11)


@settings(max_examples=50, deadline=None)
@given(base_seed=BASE_SEEDS, req_id=IDS)
def test_a_round_short_build_is_caught(base_seed: int, req_id: str) -> None:
    """The planted build differs from the reference on every input tried (a digest bit per 2**63 agrees by chance)."""
    planted = _planted("seed_rounds", "seeds")
    assert planted.derived_seed(base_seed, req_id) != effective_seed(UNSEEDED, req_id, base_seed)
