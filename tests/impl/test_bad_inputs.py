"""Bad `SchedulerOutput`s at the runner's boundary: every class typed, atomic, and harmless to the run.

A short run on cpu (prefill, decode, block appends, drafts, admission, finish) is executed twice:
cleanly, and with every bad variant below thrown at the runner before steps 3 and 4 (step 4
follows a step with unconfirmed drafts).  Each bad step must raise its `SchedulerOutputError`
subclass, leave a fingerprint of all runner state unchanged (host mirror, row table, device row
state, block table, sampling state, staging pool, pending diffs, step-id watermark), and the
per-request validator the oracle uses must reach the same verdict (except for the runner's own
computed-count rule).  The run that saw the bad inputs must then produce bit-identical outputs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Callable

import numpy as np
import pytest

from runnercheck.impl.device import Device
from runnercheck.impl.boundary import validate_scheduler_output
from runnercheck.impl.interface import (
    BlockIdError,
    CachedRequest,
    CachedRequests,
    CapacityError,
    DeviceDraftsError,
    DuplicateRequestError,
    FinishedAndScheduledError,
    LogprobsLimitError,
    MaxModelLenError,
    NewRequest,
    NgramConfig,
    RunnerLimits,
    SamplingParams,
    SamplingParamsError,
    ScheduledTokensError,
    SchedulerOutput,
    SchedulerOutputError,
    SchedulerOutputTypeError,
    StepIdError,
    TokenOutOfVocabError,
    UnknownRequestError,
)
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import ModelRunner

LIMITS = RunnerLimits(vocab_size=256, max_num_reqs=4, max_model_len=64, max_num_batched_tokens=16, num_kv_blocks=40, block_size=4)
PA = SamplingParams(temperature=0.8, seed=1)
PB = SamplingParams(temperature=0.0)
PC = SamplingParams(temperature=1.0, top_k=20, logprobs=2)
A = NewRequest("A", (3, 1, 4, 1, 5), PA, (0, 1))
B = NewRequest("B", (9, 2, 6), PB, (2,))
C = NewRequest("C", (5, 5, 5, 5), PC, (5,))


def _schedule(step: int, outputs: list) -> SchedulerOutput:
    """The valid run.  ``outputs[i]`` is step i's `ModelRunnerOutput` (read synchronously)."""
    if step == 0:
        return SchedulerOutput(0, new_requests=(A, B), num_scheduled_tokens={"A": 5, "B": 3})
    if step == 1:
        return SchedulerOutput(1, cached_requests=CachedRequests.of((CachedRequest("A", (), 5), CachedRequest("B", (), 3))),
                               num_scheduled_tokens={"A": 1, "B": 1})
    if step == 2:
        return SchedulerOutput(2, cached_requests=CachedRequests.of((CachedRequest("A", (), 6), CachedRequest("B", (3,), 4))),
                               num_scheduled_tokens={"A": 1, "B": 1})
    if step == 3:  # A decodes with two drafts; C is admitted
        return SchedulerOutput(3, new_requests=(C,), cached_requests=CachedRequests.of((CachedRequest("A", (4,), 7), CachedRequest("B", (), 5))),
                               num_scheduled_tokens={"A": 3, "B": 1, "C": 4}, draft_token_ids={"A": (7, 8)})
    accepted = len(outputs[3].token_dict()["A"]) - 1
    if step == 4:  # B finishes; A's count reports how many drafts were accepted
        return SchedulerOutput(4, cached_requests=CachedRequests.of((CachedRequest("A", (), 8 + accepted), CachedRequest("C", (6,), 4))),
                               num_scheduled_tokens={"A": 1, "C": 1}, finished_req_ids=frozenset({"B"}))
    return SchedulerOutput(5, cached_requests=CachedRequests.of((CachedRequest("A", (), 9 + accepted), CachedRequest("C", (), 5))),
                           num_scheduled_tokens={"A": 1, "C": 1})


NUM_STEPS = 6


def _runner() -> ModelRunner:
    # Small staging slots, so the fingerprint can hash every byte of them.
    return ModelRunner(random_weights(preset("micro"), seed=3), LIMITS, Device("cpu"), base_seed=5, staging_bytes=8192)


def _run(before_step: Callable[[int, ModelRunner, list], None] | None = None) -> list:
    runner, outputs = _runner(), []
    for step in range(NUM_STEPS):
        if before_step is not None:
            before_step(step, runner, outputs)
        outputs.append(runner.execute_model(_schedule(step, outputs)).get())
    return outputs


@pytest.fixture(scope="module")
def clean_outputs() -> list:
    return _run()


def fingerprint(runner: ModelRunner) -> str:
    """Everything a rejected step must leave as it was (on cpu the device tensors are read directly)."""
    st, ss, pool = runner.state, runner.sampling_state, runner.staging
    h = hashlib.sha256()

    def put(*parts: object) -> None:
        for p in parts:
            h.update(p.tobytes() if isinstance(p, np.ndarray) else repr(p).encode())

    # host mirror and row table
    put(st.num_tokens, st.num_computed, st.num_blocks, st.unconfirmed_drafts, st.generation, st.prompt_len,
        st.num_logprobs, st.prompt_logprobs, st._last_use_seq, st._batch_rows, st._batch_seq)
    put(sorted(st.req_to_row.items()), st.rows, list(st._free), st._next_generation, st._use_seq, st.prefill_tokens.numpy())
    # device row state, block table, sampling state (all in the shared arena) and penalty counts
    put(runner.staged_writes.arena.numpy(), ss.output_counts.numpy())
    # pending work: staged diffs, admissions, prepared applies
    put([(t.name, list(t._pending), t.num_pending) for t in runner.staged_writes.members], ss._pending_admissions,
        len(runner.staged_writes._applies), ss.num_prepared_kernels)
    # staging pool
    put([(s.state, s.step, s.used_bytes) for s in pool.slots], pool._next, pool.h2d_bytes_total,
        [s.host.numpy() for s in pool.slots])
    # the step boundary itself
    put(runner._last_step_id, runner.device.step_index, runner.device.num_enqueued, runner.outputs._next)
    return h.hexdigest()


# --------------------------------------------------------------------------- the catalogue

class _CachedRequestsSubclass(CachedRequests):
    """Equal to a good `CachedRequests`, but a subclass (could override the equality or iteration the readers use)."""


Variant = tuple[str, type, SchedulerOutput | object, bool]  # (name, error class, bad step, oracle agrees)


def _sp(**changes: object) -> SamplingParams:
    return dataclasses.replace(PC, **changes)


def _variants_at_3(good: SchedulerOutput) -> list[Variant]:
    r = dataclasses.replace
    D = NewRequest("D", (1, 2), PB, (7,))

    def with_new(req: object, n: int | None = 2, rid: str = "D") -> SchedulerOutput:
        sched = dict(good.num_scheduled_tokens)
        if n is not None:
            sched[rid] = n
        return r(good, new_requests=good.new_requests + (req,), num_scheduled_tokens=sched)

    def with_params(name: str, cls: type, **changes: object) -> Variant:
        return (f"sampling_params.{name}", cls, with_new(r(D, sampling_params=_sp(**changes))), True)

    def cached(a: CachedRequest) -> SchedulerOutput:
        return r(good, cached_requests=CachedRequests.of((a, cr[1])))

    cr = tuple(good.cached_requests)  # `CachedRequest` views
    ca = cr[0]
    sched = good.num_scheduled_tokens
    T = SchedulerOutputTypeError
    v: list[Variant] = [
        # the step id
        ("step_id None", StepIdError, r(good, step_id=None), True),
        ("step_id reused", StepIdError, r(good, step_id=2), True),
        ("step_id older", StepIdError, r(good, step_id=0), True),
        ("step_id bool", StepIdError, r(good, step_id=True), True),
        ("step_id float", StepIdError, r(good, step_id=3.0), True),
        ("step_id negative", StepIdError, r(good, step_id=-1), True),
        ("step_id str", StepIdError, r(good, step_id="3"), True),
        # containers
        ("not a SchedulerOutput", SchedulerOutputError, {"step_id": 3}, True),
        ("None for the step", SchedulerOutputError, None, True),
        ("finished_req_ids list", T, r(good, finished_req_ids=["B"]), True),
        ("preempted_req_ids list", T, r(good, preempted_req_ids=["B"]), True),
        ("finished_req_ids None", T, r(good, finished_req_ids=None), True),
        ("new_requests None", T, r(good, new_requests=None), True),
        ("new_requests a bare NewRequest", T, r(good, new_requests=C), True),
        ("cached_requests None", T, r(good, cached_requests=None), True),
        ("cached_requests a set", T, r(good, cached_requests=set(cr)), True),
        ("num_scheduled_tokens pairs", T, r(good, num_scheduled_tokens=list(sched.items())), True),
        ("draft_token_ids None", T, r(good, draft_token_ids=None), True),
        ("cached_requests a tuple of CachedRequest", T, r(good, cached_requests=cr), True),
        ("cached_requests a list of CachedRequest", T, r(good, cached_requests=list(cr)), True),
        ("cached_requests a bare CachedRequest", T, r(good, cached_requests=ca), True),
        ("cached_requests a CachedRequests subclass", T,
         r(good, cached_requests=_CachedRequestsSubclass(*dataclasses.astuple(good.cached_requests))), True),
        ("cached req_ids a list", T, r(good, cached_requests=r(good.cached_requests, req_ids=list(good.cached_requests.req_ids))), True),
        ("cached req_ids None", T, r(good, cached_requests=r(good.cached_requests, req_ids=None)), True),
        ("cached req_ids a str", T, r(good, cached_requests=r(good.cached_requests, req_ids="AB")), True),
        ("cached new_block_ids a list", T,
         r(good, cached_requests=r(good.cached_requests, new_block_ids=list(good.cached_requests.new_block_ids))), True),
        ("cached num_computed a list", T,
         r(good, cached_requests=r(good.cached_requests, num_computed_tokens=list(good.cached_requests.num_computed_tokens))), True),
        ("cached num_computed an array", T, r(good, cached_requests=r(
            good.cached_requests, num_computed_tokens=np.array(good.cached_requests.num_computed_tokens))), True),
        ("cached req_ids longer than the rest", T,
         r(good, cached_requests=r(good.cached_requests, req_ids=good.cached_requests.req_ids + ("C",))), True),
        ("cached num_computed shorter than the rest", T,
         r(good, cached_requests=r(good.cached_requests, num_computed_tokens=good.cached_requests.num_computed_tokens[:1])), True),
        ("cached new_block_ids longer than the rest", T,
         r(good, cached_requests=r(good.cached_requests, new_block_ids=good.cached_requests.new_block_ids + ((),))), True),
        ("cached requests left out (A's new block with them)", BlockIdError, r(good, cached_requests=CachedRequests()), True),
        ("new_requests holds a CachedRequest", T, r(good, new_requests=(ca,)), True),
        ("finished id an int", T, r(good, finished_req_ids=frozenset({1})), True),
        ("finished id empty", T, r(good, finished_req_ids=frozenset({""})), True),
        # a new request's fields
        ("sampling_params None", T, with_new(r(D, sampling_params=None)), True),
        ("sampling_params a dict", T, with_new(r(D, sampling_params={"temperature": 1.0})), True),
        ("prompt a str", T, with_new(r(D, prompt_token_ids="12")), True),
        ("prompt None", T, with_new(r(D, prompt_token_ids=None)), True),
        ("prompt token float", T, with_new(r(D, prompt_token_ids=(1, 2.0))), True),
        ("prompt token bool", T, with_new(r(D, prompt_token_ids=(1, True))), True),
        ("prompt token out of vocab", TokenOutOfVocabError, with_new(r(D, prompt_token_ids=(1, 256))), True),
        ("prompt token negative", TokenOutOfVocabError, with_new(r(D, prompt_token_ids=(-1, 2))), True),
        ("output token out of vocab", TokenOutOfVocabError, with_new(r(D, output_token_ids=(300,)), n=3), True),
        ("output tokens None", T, with_new(r(D, output_token_ids=None)), True),
        ("block_ids None", T, with_new(r(D, block_ids=None)), True),
        ("block id float", T, with_new(r(D, block_ids=(7.0,))), True),
        ("block id out of range", BlockIdError, with_new(r(D, block_ids=(LIMITS.num_kv_blocks,))), True),
        ("block id negative", BlockIdError, with_new(r(D, block_ids=(-1,))), True),
        ("req_id an int", T, with_new(r(D, req_id=5), rid=5), True),
        ("req_id empty", T, with_new(r(D, req_id=""), rid=""), True),
        ("req_id None", T, with_new(r(D, req_id=None), n=None), True),
        ("empty prompt", ScheduledTokensError, with_new(r(D, prompt_token_ids=()), n=1), True),
        ("prefill past max_model_len", MaxModelLenError, with_new(r(D, prompt_token_ids=(1,) * 65, block_ids=tuple(range(7, 23))), n=1), True),
        ("more blocks than a row holds", BlockIdError, with_new(r(D, block_ids=tuple(range(7, 24)))), True),
        ("too few blocks for the tokens", BlockIdError, with_new(r(D, prompt_token_ids=(1,) * 6), n=6), True),
        ("new id twice in one step", DuplicateRequestError, with_new(r(C, block_ids=(9,)), n=None), True),
        ("new id already live", DuplicateRequestError, with_new(r(D, req_id="B"), rid="B", n=None), True),
        ("new id finished in the same step", FinishedAndScheduledError,
         r(with_new(r(D, req_id="B"), rid="B", n=None), finished_req_ids=frozenset({"B"})), True),
        ("more live requests than rows", CapacityError,
         r(with_new(D), new_requests=good.new_requests + (D, r(D, req_id="E", block_ids=(8,))),
           num_scheduled_tokens={**sched, "D": 2, "E": 2}), True),
        # sampling params
        with_params("temperature negative", SamplingParamsError, temperature=-1.0),
        with_params("temperature nan", SamplingParamsError, temperature=math.nan),
        with_params("temperature inf", SamplingParamsError, temperature=math.inf),
        with_params("temperature str", SamplingParamsError, temperature="hot"),
        with_params("temperature bool", SamplingParamsError, temperature=True),
        with_params("top_k 0", SamplingParamsError, top_k=0),
        with_params("top_k -2", SamplingParamsError, top_k=-2),
        with_params("top_k float", SamplingParamsError, top_k=2.5),
        with_params("top_p 0", SamplingParamsError, top_p=0.0),
        with_params("top_p above 1", SamplingParamsError, top_p=1.5),
        with_params("min_p negative", SamplingParamsError, min_p=-0.1),
        with_params("min_p above 1", SamplingParamsError, min_p=2.0),
        with_params("repetition_penalty 0", SamplingParamsError, repetition_penalty=0.0),
        with_params("repetition_penalty nan", SamplingParamsError, repetition_penalty=math.nan),
        with_params("frequency_penalty above 2", SamplingParamsError, frequency_penalty=3.0),
        with_params("presence_penalty below -2", SamplingParamsError, presence_penalty=-3.0),
        with_params("seed negative", SamplingParamsError, seed=-1),
        with_params("seed 2^63", SamplingParamsError, seed=2**63),
        with_params("seed bool", SamplingParamsError, seed=False),
        with_params("logprobs negative", SamplingParamsError, logprobs=-1),
        with_params("logprobs over the limit", LogprobsLimitError, logprobs=LIMITS.max_logprobs + 1),
        with_params("prompt_logprobs over the limit", LogprobsLimitError, prompt_logprobs=LIMITS.max_logprobs + 1),
        with_params("max_tokens 0", SamplingParamsError, max_tokens=0),
        with_params("max_tokens bool", SamplingParamsError, max_tokens=True),
        with_params("stop token out of vocab", TokenOutOfVocabError, stop_token_ids=(256,)),
        with_params("stop tokens None", T, stop_token_ids=None),
        # cached requests
        ("cached id unknown", UnknownRequestError, cached(r(ca, req_id="ghost")), True),
        ("cached id twice", DuplicateRequestError, r(good, cached_requests=CachedRequests.of(cr + (ca,))), True),
        ("cached and finished", FinishedAndScheduledError, r(good, finished_req_ids=frozenset({"A"})), True),
        ("cached id an int", T, cached(r(ca, req_id=7)), True),
        ("cached id is this step's new request", DuplicateRequestError,
         r(good, cached_requests=CachedRequests.of(cr + (CachedRequest("C", (), 0),))), True),
        ("num_computed None", T, cached(r(ca, num_computed_tokens=None)), True),
        ("num_computed float", T, cached(r(ca, num_computed_tokens=7.0)), True),
        ("num_computed bool", T, cached(r(ca, num_computed_tokens=True)), True),
        ("num_computed negative", ScheduledTokensError, cached(r(ca, num_computed_tokens=-1)), True),
        ("num_computed huge", ScheduledTokensError, cached(r(ca, num_computed_tokens=2**70)), True),
        ("num_computed above the scheduled count", ScheduledTokensError, cached(r(ca, num_computed_tokens=8)), True),
        ("num_computed below, no drafts in flight", ScheduledTokensError,
         r(good, cached_requests=CachedRequests.of((ca, r(cr[1], num_computed_tokens=4)))), False),
        ("new_block_ids None", T, cached(r(ca, new_block_ids=None)), True),
        ("new_block_ids a str", T, cached(r(ca, new_block_ids="4")), True),
        ("new block float", T, cached(r(ca, new_block_ids=(4.0,))), True),
        ("new block out of range", BlockIdError, cached(r(ca, new_block_ids=(LIMITS.num_kv_blocks,))), True),
        ("new blocks past a row", BlockIdError, cached(r(ca, new_block_ids=tuple(range(20, 35)))), True),
        # scheduled counts
        ("scheduled id unknown", UnknownRequestError, r(good, num_scheduled_tokens={**sched, "ghost": 1}), True),
        ("scheduled id an int", T, r(good, num_scheduled_tokens={**sched, 9: 1}), True),
        ("scheduled 0", ScheduledTokensError, r(good, num_scheduled_tokens={**sched, "B": 0}), True),
        ("scheduled negative", ScheduledTokensError, r(good, num_scheduled_tokens={**sched, "B": -1}), True),
        ("scheduled float", T, r(good, num_scheduled_tokens={**sched, "B": 1.0}), True),
        ("scheduled bool", T, r(good, num_scheduled_tokens={**sched, "B": True}), True),
        ("scheduled None", T, r(good, num_scheduled_tokens={**sched, "B": None}), True),
        ("scheduled huge", ScheduledTokensError, r(good, num_scheduled_tokens={**sched, "B": 2**70}), True),
        ("scheduled past the known tokens", ScheduledTokensError, r(good, num_scheduled_tokens={**sched, "B": 2}), True),
        ("scheduled past the token budget", ScheduledTokensError,
         with_new(r(D, prompt_token_ids=(1,) * 9, block_ids=(7, 8, 9)), n=9), True),
        ("scheduled and finished", FinishedAndScheduledError, r(good, finished_req_ids=frozenset({"B"}),
                                                                 cached_requests=CachedRequests.of(cr[:1])), True),
        ("scheduled and preempted", FinishedAndScheduledError, r(good, preempted_req_ids=frozenset({"B"}),
                                                                  cached_requests=CachedRequests.of(cr[:1])), True),
        ("scheduled id empty", T, r(good, num_scheduled_tokens={**sched, "": 1}), True),
        # finished / preempted
        ("finished unknown", UnknownRequestError, r(good, finished_req_ids=frozenset({"ghost"})), True),
        ("preempted unknown", UnknownRequestError, r(good, preempted_req_ids=frozenset({"ghost"})), True),
        ("finished and preempted", DuplicateRequestError,
         r(good, finished_req_ids=frozenset({"B"}), preempted_req_ids=frozenset({"B"}), cached_requests=CachedRequests.of(cr[:1]),
           num_scheduled_tokens={"A": 3, "C": 4}), True),
        # drafts
        ("drafts for an unscheduled request", ScheduledTokensError, r(good, draft_token_ids={"A": (7, 8), "ghost": (1,)}), True),
        ("draft out of vocab", TokenOutOfVocabError, r(good, draft_token_ids={"A": (7, 256)}), True),
        ("too many drafts", ScheduledTokensError,
         r(good, draft_token_ids={"A": (1,) * 5}, num_scheduled_tokens={**sched, "A": 6}), True),
        ("drafts without the whole remainder", ScheduledTokensError, r(good, num_scheduled_tokens={**sched, "A": 2}), True),
        ("drafts None", T, r(good, draft_token_ids={"A": None}), True),
        ("draft token float", T, r(good, draft_token_ids={"A": (7, 8.0)}), True),
        ("drafts keyed by an int", T, r(good, draft_token_ids={"A": (7, 8), 3: (1,)}), True),
    ]
    return v


def _variants_at_4(good: SchedulerOutput) -> list[Variant]:
    """After a step with two drafts in flight: the computed-count window and the step id again."""
    r = dataclasses.replace
    cr = tuple(good.cached_requests)
    ca = cr[0]
    return [
        ("step_id reused after drafts", StepIdError, r(good, step_id=3), True),
        ("num_computed below the drafts window", ScheduledTokensError,
         r(good, cached_requests=CachedRequests.of((r(ca, num_computed_tokens=7), cr[1]))), False),
        ("num_computed above the drafts window", ScheduledTokensError,
         r(good, cached_requests=CachedRequests.of((r(ca, num_computed_tokens=11), cr[1]))), True),
        ("finished twice (finished earlier)", UnknownRequestError, r(good, finished_req_ids=frozenset({"B", "ghost"})), True),
    ]


def _variants_at_5(good: SchedulerOutput) -> list[Variant]:
    """A steady step (the last step's requests, order and one-token queries: `runnercheck.impl.step_reader.read_steady_step`)."""
    r = dataclasses.replace
    ca, cc = good.cached_requests
    cs = good.cached_requests
    sched = good.num_scheduled_tokens
    T = SchedulerOutputTypeError

    def cached(a: CachedRequest) -> SchedulerOutput:
        return r(good, cached_requests=CachedRequests.of((a, cc)))

    return [
        ("steady: step_id reused", StepIdError, r(good, step_id=4), True),
        ("steady: cached id unknown", UnknownRequestError, cached(r(ca, req_id="ghost")), True),
        ("steady: cached id twice", DuplicateRequestError, r(good, cached_requests=CachedRequests.of((ca, cc, ca))), True),
        ("steady: cached id an int", T, cached(r(ca, req_id=7)), True),
        ("steady: cached_requests a tuple of CachedRequest", T, r(good, cached_requests=(ca, cc)), True),
        ("steady: cached req_ids a list", T, r(good, cached_requests=r(cs, req_ids=list(cs.req_ids))), True),
        ("steady: cached num_computed a list", T, r(good, cached_requests=r(cs, num_computed_tokens=list(cs.num_computed_tokens))), True),
        ("steady: cached new_block_ids a list", T, r(good, cached_requests=r(cs, new_block_ids=list(cs.new_block_ids))), True),
        ("steady: cached num_computed shorter than the rest", T,
         r(good, cached_requests=r(cs, num_computed_tokens=cs.num_computed_tokens[:1])), True),
        ("steady: cached new_block_ids shorter than the rest", T, r(good, cached_requests=r(cs, new_block_ids=((),))), True),
        ("steady: cached req_ids shorter than the rest", T, r(good, cached_requests=r(cs, req_ids=cs.req_ids[:1])), True),
        ("steady: num_computed a numpy int", T, cached(r(ca, num_computed_tokens=np.int64(ca.num_computed_tokens))), True),
        ("steady: num_computed a str", T, cached(r(ca, num_computed_tokens=str(ca.num_computed_tokens))), True),
        ("steady: cached id None", T, cached(r(ca, req_id=None)), True),
        ("steady: new block a numpy int", T, cached(r(ca, new_block_ids=(np.int64(30),))), True),
        ("steady: num_computed of the other request (swapped)", ScheduledTokensError,
         r(good, cached_requests=r(cs, num_computed_tokens=cs.num_computed_tokens[::-1])), True),
        ("steady: num_computed None", T, cached(r(ca, num_computed_tokens=None)), True),
        ("steady: num_computed float", T, cached(r(ca, num_computed_tokens=float(ca.num_computed_tokens))), True),
        ("steady: num_computed bool", T, cached(r(ca, num_computed_tokens=True)), True),
        ("steady: num_computed negative", ScheduledTokensError, cached(r(ca, num_computed_tokens=-1)), True),
        ("steady: num_computed huge", ScheduledTokensError, cached(r(ca, num_computed_tokens=2**70)), True),
        ("steady: num_computed above the scheduled count", ScheduledTokensError,
         cached(r(ca, num_computed_tokens=ca.num_computed_tokens + 1)), True),
        ("steady: num_computed below, no drafts in flight", ScheduledTokensError,
         cached(r(ca, num_computed_tokens=ca.num_computed_tokens - 1)), False),
        ("steady: new_block_ids None", T, cached(r(ca, new_block_ids=None)), True),
        ("steady: new_block_ids an empty str", T, cached(r(ca, new_block_ids="")), True),
        ("steady: new_block_ids a str", T, cached(r(ca, new_block_ids="4")), True),
        ("steady: new_block_ids an array", T, cached(r(ca, new_block_ids=np.array([30, 31]))), True),
        ("steady: new block float", T, cached(r(ca, new_block_ids=(30.0,))), True),
        ("steady: new block bool", T, cached(r(ca, new_block_ids=(True,))), True),
        ("steady: new block out of range", BlockIdError, cached(r(ca, new_block_ids=(LIMITS.num_kv_blocks,))), True),
        ("steady: new blocks past a row", BlockIdError, cached(r(ca, new_block_ids=tuple(range(20, 35)))), True),
        ("steady: scheduled id unknown", UnknownRequestError, r(good, num_scheduled_tokens={**sched, "ghost": 1}), True),
        ("steady: scheduled id an int", T, r(good, num_scheduled_tokens={**sched, 9: 1}), True),
        ("steady: scheduled 0", ScheduledTokensError, r(good, num_scheduled_tokens={**sched, "C": 0}), True),
        ("steady: scheduled negative", ScheduledTokensError, r(good, num_scheduled_tokens={**sched, "C": -1}), True),
        ("steady: scheduled float", T, r(good, num_scheduled_tokens={**sched, "C": 1.0}), True),
        ("steady: scheduled bool", T, r(good, num_scheduled_tokens={**sched, "C": True}), True),
        ("steady: scheduled None", T, r(good, num_scheduled_tokens={**sched, "C": None}), True),
        ("steady: scheduled huge", ScheduledTokensError, r(good, num_scheduled_tokens={**sched, "C": 2**70}), True),
        ("steady: scheduled past the known tokens", ScheduledTokensError, r(good, num_scheduled_tokens={**sched, "C": 2}), True),
        ("steady: scheduled and finished", FinishedAndScheduledError, r(good, finished_req_ids=frozenset({"C"}),
                                                                         cached_requests=CachedRequests.of((ca,))), True),
        ("steady: drafts for an unscheduled request", ScheduledTokensError, r(good, draft_token_ids={"ghost": (1,)}), True),
    ]


def _throw(runner: ModelRunner, variants: list[Variant], seen: dict[str, type]) -> None:
    for name, cls, bad, oracle_agrees in variants:
        before = fingerprint(runner)
        with pytest.raises(SchedulerOutputError) as caught:
            runner.execute_model(bad)
        assert type(caught.value) is cls, f"{name}: {type(caught.value).__name__}: {caught.value}"
        assert fingerprint(runner) == before, f"{name}: a rejected step changed runner state"
        if oracle_agrees:
            with pytest.raises(cls):
                validate_scheduler_output(bad, runner.state.mirror_for(bad), LIMITS, runner._last_step_id)
        else:  # the runner's own rule: the oracle knows exact counts and accepts
            validate_scheduler_output(bad, runner.state.mirror_for(bad), LIMITS, runner._last_step_id)
        assert name not in seen, f"variant {name!r} listed twice"
        seen[name] = cls


def test_bad_inputs_are_typed_atomic_and_leave_the_run_bit_identical(clean_outputs):
    seen: dict[str, type] = {}

    def inject(step: int, runner: ModelRunner, outputs: list) -> None:
        if step == 3:
            _throw(runner, _variants_at_3(_schedule(3, outputs)), seen)
        elif step == 4:
            _throw(runner, _variants_at_4(_schedule(4, outputs)), seen)
        elif step == 5:
            _throw(runner, _variants_at_5(_schedule(5, outputs)), seen)

    outputs = _run(inject)
    assert len(seen) >= 100, f"only {len(seen)} bad-input classes"
    assert outputs == clean_outputs, "the run that saw bad inputs diverged from the clean run"


def test_steady_steps_are_read_by_the_steady_reader():
    """Step 5 (the catalogue's steady step) and step 2 take `read_steady_step`; the others `read_step`."""
    runner, outputs, steady = _runner(), [], []
    for step in range(NUM_STEPS):
        outputs.append(runner.execute_model(_schedule(step, outputs)).get())
        steady.append(runner.last_step_stats.steady)
    assert steady == [False, False, True, False, False, True]


def test_planted_bug_steady_reader_trusting_the_mirror_is_caught(monkeypatch):
    """The steady variants can fail: a steady reader that takes the computed counts from its own mirror
    (never comparing the scheduler's) lets a wrong count through."""
    import runnercheck.impl.runner as runner_module
    import runnercheck.impl.step_reader as step_reader

    def trusting(sched, state, limits, last_step_id, last):
        cached = getattr(sched, "cached_requests", None)
        if last is not None and type(cached) is CachedRequests and type(cached.req_ids) is tuple and all(
                isinstance(rid, str) and rid in state.req_to_row for rid in cached.req_ids):
            fixed = tuple(int(state.num_computed[state.req_to_row[rid]]) for rid in cached.req_ids)
            sched = dataclasses.replace(sched, cached_requests=dataclasses.replace(cached, num_computed_tokens=fixed))
        return step_reader.read_steady_step(sched, state, limits, last_step_id, last)

    monkeypatch.setattr(runner_module, "read_steady_step", trusting)
    runner, outputs = _runner(), []
    for step in range(5):
        outputs.append(runner.execute_model(_schedule(step, outputs)).get())
    bad = _variants_at_5(_schedule(5, outputs))
    above = [v for v in bad if v[0] == "steady: num_computed above the scheduled count"]
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        _throw(runner, above, {})


def test_planted_bug_finishes_applied_before_the_step_id_check_is_caught(monkeypatch):
    """The test above can fail: the pre-#18 order (finishes applied, then the step rejected) changes state."""
    original = ModelRunner._check

    def releases_first(self: ModelRunner, sched: SchedulerOutput):
        for rid in sorted(getattr(sched, "finished_req_ids", ()) or ()):
            if rid in self.state.req_to_row:
                self.state.release(rid)
        return original(self, sched)

    monkeypatch.setattr(ModelRunner, "_check", releases_first)
    runner, outputs = _runner(), []
    for step in range(3):
        outputs.append(runner.execute_model(_schedule(step, outputs)).get())
    bad = dataclasses.replace(_schedule(3, outputs), step_id=2, finished_req_ids=frozenset({"B"}))
    before = fingerprint(runner)
    with pytest.raises(StepIdError):
        runner.execute_model(bad)
    assert fingerprint(runner) != before


def test_planted_bug_boundary_that_detects_but_does_not_raise_is_caught(monkeypatch):
    """The catalogue can fail: a boundary whose array checks flag a bad step but let it through is reported."""
    import runnercheck.impl.step_reader as step_reader

    monkeypatch.setattr(step_reader, "_diagnose", lambda *args, **kwargs: None)
    runner, outputs = _runner(), []
    for step in range(3):
        outputs.append(runner.execute_model(_schedule(step, outputs)).get())
    good = _schedule(3, outputs)
    ca, cb = good.cached_requests
    bad = dataclasses.replace(good, cached_requests=CachedRequests.of((dataclasses.replace(ca, num_computed_tokens=-1), cb)))
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        _throw(runner, [("num_computed negative", ScheduledTokensError, bad, True)], {})


# --------------------------------------------------------------------------- device drafts (n-gram proposer)

SPEC = NgramConfig(num_spec_tokens=2)


def _spec_schedule(step: int, outputs: list) -> SchedulerOutput:
    """The valid run with A's two drafts at step 3 taken from the runner's proposer (count only)."""
    sched = _schedule(step, outputs)
    if step == 3:
        return dataclasses.replace(sched, draft_token_ids={}, num_device_drafts={"A": 2})
    return sched


def _spec_variants(good: SchedulerOutput) -> list[tuple[str, type, SchedulerOutput]]:
    r = dataclasses.replace
    sched = good.num_scheduled_tokens
    return [
        ("device drafts above num_spec_tokens", DeviceDraftsError,
         r(good, num_device_drafts={"A": 3}, num_scheduled_tokens={**sched, "A": 4})),
        ("device drafts for an unscheduled request", DeviceDraftsError, r(good, num_device_drafts={"A": 2, "ghost": 1})),
        ("device drafts for a live request not scheduled", DeviceDraftsError,
         r(good, num_device_drafts={"A": 2, "B": 1}, num_scheduled_tokens={"A": 3, "C": 4},
           cached_requests=CachedRequests.of(list(good.cached_requests)[:1]))),
        ("device and explicit drafts for one request", DeviceDraftsError, r(good, draft_token_ids={"A": (7, 8)})),
        ("device drafts before the first sample", DeviceDraftsError,
         r(good, num_device_drafts={"A": 2, "C": 1}, num_scheduled_tokens={**sched, "C": 5})),
        ("device draft count negative", DeviceDraftsError, r(good, num_device_drafts={"A": -1})),
        ("device draft count float", DeviceDraftsError, r(good, num_device_drafts={"A": 2.0})),
        ("device draft count bool", DeviceDraftsError, r(good, num_device_drafts={"A": True})),
        ("device drafts keyed by an int", SchedulerOutputTypeError, r(good, num_device_drafts={"A": 2, 4: 1})),
        ("num_device_drafts None", SchedulerOutputTypeError, r(good, num_device_drafts=None)),
        ("device drafts without the whole remainder", ScheduledTokensError, r(good, num_scheduled_tokens={**sched, "A": 2})),
    ]


def _spec_fingerprint(runner: ModelRunner) -> str:
    p = runner.proposer
    return fingerprint(runner) + hashlib.sha256(
        p.has_proposal.tobytes() + p.proposed.numpy().tobytes() + p.history.numpy().tobytes()).hexdigest()


def test_bad_device_drafts_are_typed_atomic_agree_with_the_oracle_and_leave_the_run_identical() -> None:
    from runnercheck.reference.runner import ReferenceRunner

    weights = random_weights(preset("micro"), seed=3)

    def run(throw: bool) -> tuple[list, list]:
        runner = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=5, staging_bytes=8192, speculative=SPEC)
        oracle = ReferenceRunner(weights, LIMITS, base_seed=5, proposer=SPEC)
        outputs, expected = [], []
        for step in range(NUM_STEPS):
            good = _spec_schedule(step, outputs)
            if throw and step == 3:
                for name, cls, bad in _spec_variants(good):
                    before = _spec_fingerprint(runner)
                    with pytest.raises(SchedulerOutputError) as caught:
                        runner.execute_model(bad)
                    assert type(caught.value) is cls, f"{name}: {type(caught.value).__name__}: {caught.value}"
                    assert _spec_fingerprint(runner) == before, f"{name}: a rejected step changed runner state"
                    with pytest.raises(cls):
                        oracle.execute_model(bad)
            outputs.append(runner.execute_model(good).get())
            expected.append(oracle.execute_model(good))
        return outputs, expected

    clean, expected = run(False)
    assert [o.sampled_token_ids for o in clean] == [e.sampled_token_ids for e in expected]
    thrown, _ = run(True)
    assert thrown == clean, "the run that saw bad device drafts diverged from the clean run"


def test_device_drafts_asked_of_a_runner_without_a_proposer_are_rejected() -> None:
    runner, outputs = _runner(), []
    for step in range(3):
        outputs.append(runner.execute_model(_schedule(step, outputs)).get())
    before = fingerprint(runner)
    with pytest.raises(DeviceDraftsError):
        runner.execute_model(_spec_schedule(3, outputs))
    assert fingerprint(runner) == before


def test_planted_bug_unchecked_parallel_lengths_is_caught(monkeypatch):
    """The struct's own variants can fail: a boundary that never checks the three tuples are parallel
    lets an unequal-length `CachedRequests` reach the array reads, which fail untyped (or misread)."""
    import runnercheck.impl.boundary as boundary

    monkeypatch.setattr(boundary, "check_cached_containers", lambda cached: None)
    runner, outputs = _runner(), []
    for step in range(5):
        outputs.append(runner.execute_model(_schedule(step, outputs)).get())
    unequal = [v for v in _variants_at_5(_schedule(5, outputs)) if "shorter than the rest" in v[0]]
    assert len(unequal) == 3
    for variant in unequal:
        with pytest.raises((pytest.fail.Exception, AssertionError, ValueError, IndexError)):
            _throw(runner, [variant], {})


def test_cached_requests_views_round_trip():
    views = (CachedRequest("a", (3, 4), 7), CachedRequest("b", (), 2))
    cached = CachedRequests.of(views)
    assert cached == CachedRequests(("a", "b"), ((3, 4), ()), (7, 2))
    assert tuple(cached) == views and len(cached) == 2 and bool(CachedRequests()) is False
    with pytest.raises(ValueError):  # views of tuples that are not parallel: no silent truncation
        tuple(dataclasses.replace(cached, num_computed_tokens=(7,)))
