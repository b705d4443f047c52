"""The admission boundary's C twin (`impl/native/boundary.c`) against `runnercheck.impl.boundary.check_new_request`.

On generated new requests -- every field valid, out of its range, or of another type (bools, numpy
scalars, str subclasses, floats for ints, ints beyond 64 bits, subclasses of the request and of its
parameters) -- the C function returns the reference's prefill length, or None exactly where the
reference raises a `SchedulerOutputError`, or NotImplemented; NotImplemented only when some field is
not of its exact expected type.  A build with a planted bug (a top_p of 0 accepted) is caught by the
same comparison, and a run that admits requests checks them in C.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import runnercheck.impl.native as native
import runnercheck.impl.step_reader as step_reader
from runnercheck.impl.boundary import check_new_request
from runnercheck.impl.interface import MAX_SEED, NewRequest, RunnerLimits, SamplingParams, SchedulerOutputError, blocks_per_request
from runnercheck.impl.step_reader import BOUNDARY_RULES
from test_native import Odd, _Counting, _planted, admitting_run

LIMITS = RunnerLimits(vocab_size=64, max_num_reqs=8, max_model_len=32, max_num_batched_tokens=32, num_kv_blocks=40,
                      block_size=4, max_logprobs=5)

boundary = native.load("boundary")
needs_native = pytest.mark.skipif(boundary is None, reason="impl/native not built (or RUNNERCHECK_NATIVE=0)")


@dataclass(frozen=True)
class OddRequest(NewRequest):
    """A subclass: the reference takes it, the C twin leaves it to the reference."""


@dataclass(frozen=True)
class OddParams(SamplingParams):
    pass


def _c_verdict(c_module, req: object):
    return c_module.check_new_request(req, NewRequest, SamplingParams, LIMITS.vocab_size, LIMITS.max_logprobs,
                                      LIMITS.max_model_len, LIMITS.num_kv_blocks,
                                      blocks_per_request(LIMITS.max_model_len, LIMITS.block_size), LIMITS.block_size,
                                      MAX_SEED, BOUNDARY_RULES)


def _reference_verdict(req: object):
    try:
        return check_new_request(req, LIMITS)
    except SchedulerOutputError:
        return None
    except (TypeError, ValueError, OverflowError) as err:  # an odd value the reference fails on untyped
        return err


def assert_verdicts_agree(c_module, req: object, exactly_typed: bool) -> None:
    got, want = _c_verdict(c_module, req), _reference_verdict(req)
    if got is NotImplemented:
        assert not exactly_typed, f"C declined an exactly typed request: {req!r}"
        return
    assert got == want if got is not None else want is None, f"C: {got!r}, reference: {want!r}, request: {req!r}"


FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty", "seed",
          "logprobs", "prompt_logprobs", "max_tokens", "stop_token_ids", "prompt", "outputs", "blocks", "hit", "rid",
          "params_class", "request_class")


@st.composite
def new_requests(draw):
    """(request, exactly typed): every field valid but at most two, each of which is invalid (a rule fails) or
    odd (another type)."""
    perturbed = draw(st.sets(st.sampled_from(FIELDS), max_size=2))
    typed: list[bool] = []

    def c(name: str, valid: list, invalid: list, odd: list = ()):
        if name not in perturbed:
            return draw(st.sampled_from(valid))
        kind = draw(st.sampled_from(["invalid", "odd"] if odd else ["invalid"]))
        typed.append(kind != "odd")
        return draw(st.sampled_from(invalid if kind == "invalid" else odd))

    params = SamplingParams(
        temperature=c("temperature", [0.0, 0.8, 1, 2.5], [-0.1, float("nan"), float("inf"), -1],
                      [True, np.float32(1.0), "1", 10**30]),
        top_k=c("top_k", [-1, 1, 50], [0, -2, -10**6], [True, 2.0, np.int64(5), 10**30, -10**30]),
        top_p=c("top_p", [1.0, 0.5, 1], [0.0, 1.5, float("nan"), 0, -1], [None, np.float64(0.5)]),
        min_p=c("min_p", [0.0, 0.3, 1.0, 0], [-0.1, 1.1, float("nan")], ["0"]),
        repetition_penalty=c("repetition_penalty", [1.0, 1.3, 2], [0.0, -1.0, float("inf")], [False]),
        frequency_penalty=c("frequency_penalty", [0.0, -2.0, 2, 1.5], [2.1, -3, float("nan")], [np.float32(0.1)]),
        presence_penalty=c("presence_penalty", [0.0, 0.5], [-2.5, float("-inf")], [None]),
        seed=c("seed", [None, 0, 7, MAX_SEED], [-1, MAX_SEED + 1, 10**30], [True, 3.0]),
        logprobs=c("logprobs", [None, 0, 5], [-1, 6, 10**30], [True, 1.0]),
        prompt_logprobs=c("prompt_logprobs", [None, None, 0, 2], [-1, 9], [True, 2.0]),
        max_tokens=c("max_tokens", [1, 16, 1 << 20], [0, -5], [True, 3.5, 10**30]),
        stop_token_ids=c("stop_token_ids", [(), (1, 63), [5]], [(64,), (-1,), (10**30,)],
                         [None, (True,), (np.int64(3),), "ab"]),
    )
    prompt = c("prompt", [tuple(range(1, 9)), [3] * 20, (0, 63)], [(), (64,), (5, -1), (10**30,), (1,) * 33],
               [(1, True), (np.int64(3),), (2.0,), "abc", None])
    outputs = c("outputs", [(), (), (4, 5)], [(64,), (1,) * 30], [(np.int32(1),), None])
    blocks = c("blocks", [(0, 1, 2), (39, 0, 1, 2), [7, 8, 9]], [(40,), (-1,), tuple(range(9))], [(1.0,), (True,), None])
    hit = c("hit", [0, 0, 4, 8], [3, 12, 40, -4, 10**30], [True, 4.0, np.int64(4), None])
    rid = c("rid", ["r1", "x" * 40], [""], [Odd("r1"), 5, None])
    if c("params_class", [False], [False], [True]):
        params = OddParams(**{name: getattr(params, name) for name in SamplingParams.__dataclass_fields__})
    cls = OddRequest if c("request_class", [False], [False], [True]) else NewRequest
    return cls(rid, prompt, params, blocks, outputs, hit), all(typed)


@needs_native
@settings(max_examples=600, deadline=None)
@given(new_requests())
def test_c_new_request_check_agrees_with_the_reference(case):
    assert_verdicts_agree(boundary, *case)


@needs_native
def test_c_new_request_check_accepts_a_plain_request():
    req = NewRequest("r", (1, 2, 3, 4, 5), SamplingParams(temperature=0.7, top_k=5, seed=3), (0, 1), num_computed_tokens=4)
    assert _c_verdict(boundary, req) == 5 == check_new_request(req, LIMITS)
    assert _c_verdict(boundary, "not a request") is NotImplemented


def test_planted_bug_c_new_request_check_accepting_top_p_zero_is_caught():
    top_p_zero = _planted("top_p_zero", "boundary")
    req = NewRequest("r", (1, 2, 3), replace(SamplingParams(), top_p=0.0), (0,))
    with pytest.raises(AssertionError, match="C: 3"):
        assert_verdicts_agree(top_p_zero, req, True)


@needs_native
def test_a_run_that_admits_checks_its_new_requests_in_c(monkeypatch):
    counting = _Counting(boundary)
    monkeypatch.setattr(step_reader, "_native_boundary", counting)
    admitted, _ = admitting_run()
    assert admitted and counting.done.get("check_new_request", 0) == admitted, counting.done
