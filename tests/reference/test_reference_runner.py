"""ReferenceRunner driven by hand-written SchedulerOutputs.

The expected tokens come from `generate`, a plain decode loop over `ReferenceModel` and
`runnercheck.reference.sampler.sample` with no scheduling at all: chunking, preemption, drafts and tie
adoption must not change what a request produces.
"""
from __future__ import annotations

import dataclasses

import pytest

from runnercheck.impl import interface as itf
from runnercheck.impl.interface import (
    AsyncOutput,
    CachedRequest,
    CachedRequests,
    ModelRunnerOutput,
    NewRequest,
    Runner,
    RunnerLimits,
    SamplingParams,
    SchedulerOutput,
    TokenLogprobs,
    effective_seed,
)
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.reference.model import ReferenceModel
from runnercheck.reference.runner import AsyncReferenceRunner, ReadyOutput, ReferenceRunner, ReferenceRunnerError
from runnercheck.reference.sampler import sample, token_logprobs

WEIGHTS = random_weights(preset("micro"), seed=0)
LIMITS = RunnerLimits(
    vocab_size=256, max_num_reqs=3, max_model_len=64, max_num_batched_tokens=48, num_kv_blocks=64,
    block_size=4, max_logprobs=5, max_num_draft_tokens=3,
)
BASE_SEED = 77
MODEL = ReferenceModel(WEIGHTS)

PARAMS_A = SamplingParams(temperature=0.9, top_k=40, repetition_penalty=1.2, frequency_penalty=0.4, logprobs=2, prompt_logprobs=1)
PARAMS_B = SamplingParams(temperature=0.0, presence_penalty=0.5)
PARAMS_C = SamplingParams(temperature=1.1, top_p=0.9, min_p=0.02, seed=1234, presence_penalty=1.0)
PROMPT_A = tuple(range(30, 40))  # 10 tokens
PROMPT_B = (5, 9, 200, 17, 3)
PROMPT_C = (101, 102, 103, 7, 7, 7, 50)


def blocks(first: int) -> tuple[int, ...]:
    return tuple(range(first, first + 16))  # 16 blocks x 4 = max_model_len: never short


def new(rid: str, prompt, params, first_block: int = 0, outputs=()) -> NewRequest:
    return NewRequest(rid, tuple(prompt), params, blocks(first_block), tuple(outputs))


def sched(step_id: int, scheduled: dict, new_requests=(), cached=(), finished=(), preempted=(), drafts=None) -> SchedulerOutput:
    return SchedulerOutput(
        step_id=step_id, new_requests=tuple(new_requests), cached_requests=CachedRequests.of(tuple(cached)),
        num_scheduled_tokens=dict(scheduled), finished_req_ids=frozenset(finished),
        preempted_req_ids=frozenset(preempted), draft_token_ids=dict(drafts or {}),
    )


def generate(prompt, params: SamplingParams, seed: int, count: int) -> list[int]:
    tokens, outputs = list(prompt), []
    for _ in range(count):
        row = MODEL.logits(tokens)[-1]
        tok = sample(row, params, seed, len(tokens), list(prompt), outputs).token
        tokens.append(tok)
        outputs.append(tok)
    return outputs


def assert_same_logprobs(got: TokenLogprobs, want: TokenLogprobs) -> None:
    """Exact on ids and ranks; logprobs to float64 rounding (prefixes of other lengths round differently)."""
    assert (got.token_id, got.rank, got.top_token_ids) == (want.token_id, want.rank, want.top_token_ids)
    assert got.logprob == pytest.approx(want.logprob, rel=1e-9, abs=1e-12)
    assert got.top_logprobs == pytest.approx(want.top_logprobs, rel=1e-9, abs=1e-12)


def seed_of(rid: str, params: SamplingParams) -> int:
    return effective_seed(params, rid, BASE_SEED)


# --------------------------------------------------------------------------- the scripted scenario


def scenario(runner: ReferenceRunner) -> list[ModelRunnerOutput]:
    """Chunked prefill, decode, a third request joining, finish, preempt and resume."""
    outs: list[ModelRunnerOutput] = []
    run = lambda s: outs.append(runner.execute_model(s))  # noqa: E731
    run(sched(0, {"A": 6, "B": 5}, [new("A", PROMPT_A, PARAMS_A, 0), new("B", PROMPT_B, PARAMS_B, 16)]))
    run(sched(1, {"A": 4, "B": 1}, cached=[CachedRequest("A", (), 6), CachedRequest("B", (), 5)]))
    run(sched(2, {"B": 1, "A": 1}))  # no cached entries: the runner's own counts
    run(sched(3, {"A": 1, "C": 7, "B": 1}, [new("C", PROMPT_C, PARAMS_C, 32)]))
    run(sched(4, {"C": 1, "A": 1}, finished={"B"}))
    run(sched(5, {"C": 1}, preempted={"A"}))
    resumed = new("A", PROMPT_A, PARAMS_A, 48, outputs=runner_outputs_seen(outs, "A"))
    run(sched(6, {"A": 8, "C": 1}, [resumed]))
    run(sched(7, {"A": 6, "C": 1}, cached=[CachedRequest("A", (), 8)]))
    run(sched(8, {"A": 1, "C": 1}))
    run(sched(9, {"A": 1}))
    return outs


def runner_outputs_seen(outs: list[ModelRunnerOutput], rid: str) -> list[int]:
    seen: list[int] = []
    for out in outs:
        seen.extend(out.token_dict().get(rid, ()))
    return seen


@pytest.fixture(scope="module")
def scenario_run() -> tuple[ReferenceRunner, list[ModelRunnerOutput]]:
    runner = ReferenceRunner(WEIGHTS, LIMITS, base_seed=BASE_SEED)
    return runner, scenario(runner)


@pytest.fixture(scope="module")
def scenario_outputs(scenario_run) -> list[ModelRunnerOutput]:
    return scenario_run[1]


def test_scenario_runner_state(scenario_run) -> None:
    runner, outs = scenario_run
    assert runner.num_live == 2 and set(runner.live_req_ids()) == {"A", "C"}
    # the resumed request's outputs include those from before its preemption
    assert runner.outputs("A") == tuple(runner_outputs_seen(outs, "A"))
    assert runner.outputs("C") == tuple(runner_outputs_seen(outs, "C"))
    assert runner.num_computed("A") == len(PROMPT_A) + 7 - 1
    with pytest.raises(itf.UnknownRequestError):
        runner.outputs("B")


def test_scenario_tokens_equal_plain_generation(scenario_outputs) -> None:
    outs = scenario_outputs
    a, b, c = (runner_outputs_seen(outs, rid) for rid in "ABC")
    assert len(a) == 7 and len(b) == 4 and len(c) == 6
    assert a == generate(PROMPT_A, PARAMS_A, seed_of("A", PARAMS_A), 7)
    assert b == generate(PROMPT_B, PARAMS_B, 0, 4)
    assert c == generate(PROMPT_C, PARAMS_C, 1234, 6)


def test_resumed_request_matches_uninterrupted_run(scenario_outputs) -> None:
    runner = ReferenceRunner(WEIGHTS, LIMITS, base_seed=BASE_SEED)
    tokens = list(runner.execute_model(sched(0, {"A": 10}, [new("A", PROMPT_A, PARAMS_A)])).sampled_token_ids[0])
    for step in range(1, 7):
        tokens += runner.execute_model(sched(step, {"A": 1})).sampled_token_ids[0]
    assert runner.outputs("A") == tuple(tokens)
    assert tokens == runner_outputs_seen(scenario_outputs, "A")


def test_scenario_output_structure(scenario_outputs) -> None:
    outs = scenario_outputs
    assert [o.step_id for o in outs] == list(range(10))
    assert outs[0].req_ids == ("A", "B") and outs[2].req_ids == ("B", "A") and outs[3].req_ids == ("A", "C", "B")
    # partial prefill chunks sample nothing; a request asking for logprobs gets an empty tuple then
    assert outs[0].sampled_token_ids[0] == () and outs[0].logprobs[0] == ()
    assert len(outs[0].sampled_token_ids[1]) == 1 and outs[0].logprobs[1] is None
    assert outs[6].token_dict()["A"] == ()
    # seeds: every request entering in that step, the resumed one with its old seed
    assert outs[0].seeds == {"A": seed_of("A", PARAMS_A), "B": seed_of("B", PARAMS_B)}
    assert outs[3].seeds == {"C": 1234}
    assert outs[6].seeds == {"A": seed_of("A", PARAMS_A)}
    assert all(o.seeds == {} for i, o in enumerate(outs) if i not in (0, 3, 6))
    for out in outs:
        assert len(out.nan_flags) == len(out.req_ids) and not any(out.nan_flags)
        assert len(out.logprobs) == len(out.req_ids)


def test_logprobs_and_prompt_logprobs(scenario_outputs) -> None:
    outs = scenario_outputs
    prompt_logits = MODEL.logits(PROMPT_A)
    first, second = outs[0].prompt_logprobs["A"], outs[1].prompt_logprobs["A"]
    assert len(first) == 6 and len(second) == 3  # positions 0..5, then 6..8 (9 has no next prompt token)
    for i, lp in enumerate(first + second):
        assert_same_logprobs(lp, token_logprobs(prompt_logits[i], PROMPT_A[i + 1], 1))
    # never repeated for the resumed request, never for requests that did not ask
    assert all("A" not in o.prompt_logprobs for o in outs[2:])
    assert all(set(o.prompt_logprobs) <= {"A"} for o in outs)
    # per sampled token of A: its logprob under the raw logits of the position before it
    a_tokens = runner_outputs_seen(outs, "A")
    sequence = list(PROMPT_A) + a_tokens
    logits = MODEL.logits(sequence)
    got = [lp for o in outs for rid, lps in zip(o.req_ids, o.logprobs) if rid == "A" for lp in lps]
    assert len(got) == len(a_tokens)
    for k, lp in enumerate(got):
        position = len(PROMPT_A) + k
        assert_same_logprobs(lp, token_logprobs(logits[position - 1], sequence[position], 2))


def test_last_results_describe_the_sampled_tokens() -> None:
    runner = ReferenceRunner(WEIGHTS, LIMITS, base_seed=BASE_SEED)
    out = runner.execute_model(sched(0, {"A": 6, "B": 5}, [new("A", PROMPT_A, PARAMS_A), new("B", PROMPT_B, PARAMS_B)]))
    assert set(runner.last_results) == {"B"}
    assert [r.token for r in runner.last_results["B"]] == list(out.token_dict()["B"])
    assert runner.last_results["B"][0].gap > 0
    runner.execute_model(sched(1, {"A": 4}))
    assert set(runner.last_results) == {"A"}


# --------------------------------------------------------------------------- bad input


def _snapshot(runner: ReferenceRunner):
    return (
        {rid: dataclasses.astuple(lr) for rid, lr in runner.host_mirror().items()},
        {rid: runner.outputs(rid) for rid in runner.live_req_ids()},
        {rid: [dataclasses.astuple(r) for r in rs] for rid, rs in runner.last_results.items()},
    )


def _bad_schedules() -> list[tuple[type, object]]:
    """One bad step per error class, for a runner holding A (decoding) and B (decoding)."""
    ok_new = new("D", (1, 2, 3), SamplingParams(), 0)
    return [
        (itf.SchedulerOutputError, "not a SchedulerOutput"),
        (itf.UnknownRequestError, sched(3, {"A": 1}, finished={"ghost"})),
        (itf.DuplicateRequestError, sched(3, {"A": 1}, [new("A", (1, 2), SamplingParams())])),
        (itf.TokenOutOfVocabError, sched(3, {"D": 3}, [dataclasses.replace(ok_new, prompt_token_ids=(1, 256, 3))])),
        (itf.ScheduledTokensError, sched(3, {"A": 2, "B": 1})),  # A knows only one uncomputed token
        (itf.MaxModelLenError, sched(3, {"A": 1}, [dataclasses.replace(ok_new, prompt_token_ids=(1,) * 65)])),
        (itf.BlockIdError, sched(3, {"A": 1}, cached=[CachedRequest("A", (64,), 11)])),
        (itf.SamplingParamsError, sched(3, {"D": 3}, [dataclasses.replace(ok_new, sampling_params=SamplingParams(temperature=-1.0))])),
        (itf.LogprobsLimitError, sched(3, {"D": 3}, [dataclasses.replace(ok_new, sampling_params=SamplingParams(logprobs=6))])),
        (itf.FinishedAndScheduledError, sched(3, {"A": 1, "B": 1}, finished={"B"})),
        (itf.CapacityError, sched(3, {"A": 1}, [ok_new, new("E", (4, 5), SamplingParams(), 8)])),
    ]


def _two_request_run(runner: ReferenceRunner, hook=None) -> list[dict[str, tuple[int, ...]]]:
    steps = [
        sched(0, {"A": 10, "B": 5}, [new("A", PROMPT_A, PARAMS_A), new("B", PROMPT_B, PARAMS_B, 16)]),
        sched(1, {"A": 1, "B": 1}),
        sched(2, {"B": 1, "A": 1}),
        sched(3, {"A": 1, "B": 1}),
        sched(4, {"A": 1}, finished={"B"}),
    ]
    tokens = []
    for step in steps:
        if step.step_id == 3 and hook:
            hook(runner)
        tokens.append(runner.execute_model(step).token_dict())
    return tokens


@pytest.fixture(scope="module")
def clean_two_request_run() -> list[dict[str, tuple[int, ...]]]:
    return _two_request_run(ReferenceRunner(WEIGHTS, LIMITS, base_seed=BASE_SEED))


@pytest.mark.parametrize("error_class, bad", _bad_schedules(), ids=lambda v: v.__name__ if isinstance(v, type) else "")
def test_bad_schedule_raises_typed_error_and_changes_nothing(error_class, bad, clean_two_request_run) -> None:
    clean = clean_two_request_run

    def reject(runner: ReferenceRunner) -> None:
        before = _snapshot(runner)
        with pytest.raises(itf.SchedulerOutputError) as caught:
            runner.execute_model(bad)
        assert type(caught.value) is error_class, caught.value
        assert _snapshot(runner) == before

    assert _two_request_run(ReferenceRunner(WEIGHTS, LIMITS, base_seed=BASE_SEED), hook=reject) == clean


def test_valid_parts_of_a_rejected_step_are_not_applied() -> None:
    runner = ReferenceRunner(WEIGHTS, LIMITS, base_seed=BASE_SEED)
    runner.execute_model(sched(0, {"A": 10, "B": 5}, [new("A", PROMPT_A, PARAMS_A), new("B", PROMPT_B, PARAMS_B, 16)]))
    before = _snapshot(runner)
    bad = sched(1, {"A": 1, "D": 2}, [new("D", (1, 999), SamplingParams())], finished={"B"})
    with pytest.raises(itf.TokenOutOfVocabError):
        runner.execute_model(bad)
    assert _snapshot(runner) == before and runner.num_live == 2


def test_step_failing_midway_commits_nothing(monkeypatch, clean_two_request_run) -> None:
    """Planted fault: the model raises on the second request of a step; the first one's work is dropped."""
    clean = clean_two_request_run

    def fail_midway(runner: ReferenceRunner) -> None:
        before = _snapshot(runner)
        real_logits = runner.model.logits
        calls = []

        def flaky(token_ids):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("planted fault")
            return real_logits(token_ids)

        monkeypatch.setattr(runner.model, "logits", flaky)
        with pytest.raises(RuntimeError, match="planted fault"):
            runner.execute_model(sched(3, {"A": 1, "B": 1}))
        monkeypatch.setattr(runner.model, "logits", real_logits)
        assert _snapshot(runner) == before

    assert _two_request_run(ReferenceRunner(WEIGHTS, LIMITS, base_seed=BASE_SEED), hook=fail_midway) == clean


def test_replace_output_token_rejects_bad_arguments() -> None:
    runner = ReferenceRunner(WEIGHTS, LIMITS)
    runner.execute_model(sched(0, {"A": 10}, [new("A", PROMPT_A, PARAMS_A)]))
    with pytest.raises(itf.UnknownRequestError):
        runner.replace_output_token("ghost", 0, 1)
    with pytest.raises(ReferenceRunnerError):
        runner.replace_output_token("A", 1, 1)  # only one output so far
    with pytest.raises(itf.TokenOutOfVocabError):
        runner.replace_output_token("A", 0, 256)
    with pytest.raises(itf.UnknownRequestError):
        runner.outputs("ghost")


def test_constructor_checks_limits_against_the_model() -> None:
    with pytest.raises(ReferenceRunnerError):
        ReferenceRunner(WEIGHTS, dataclasses.replace(LIMITS, vocab_size=512))
    with pytest.raises(ReferenceRunnerError):
        ReferenceRunner(WEIGHTS, dataclasses.replace(LIMITS, max_model_len=1000))


# --------------------------------------------------------------------------- drafts


PARAMS_D = SamplingParams(temperature=1.0, frequency_penalty=0.7, repetition_penalty=1.3, logprobs=1)
PROMPT_D = (11, 12, 13, 14, 15)


def test_drafts_give_the_same_outputs_as_no_drafts() -> None:
    truth = generate(PROMPT_D, PARAMS_D, seed_of("D", PARAMS_D), 9)
    wrong = lambda tok: (tok + 1) % 256  # noqa: E731
    runner = ReferenceRunner(WEIGHTS, LIMITS, base_seed=BASE_SEED)
    steps = []
    steps.append(runner.execute_model(sched(0, {"D": 5}, [new("D", PROMPT_D, PARAMS_D)])))
    assert steps[-1].sampled_token_ids == ((truth[0],),)
    # two right drafts and a wrong one: both accepted, then the disagreeing target token
    steps.append(runner.execute_model(sched(1, {"D": 4}, drafts={"D": (truth[1], truth[2], wrong(truth[3]))})))
    assert steps[-1].sampled_token_ids == ((truth[1], truth[2], truth[3]),)
    assert runner.num_computed("D") == len(PROMPT_D) + 3
    # all drafts right: accepted plus the bonus token; the scheduler states the count explicitly
    steps.append(runner.execute_model(sched(
        2, {"D": 3}, cached=[CachedRequest("D", (), len(PROMPT_D) + 3)], drafts={"D": (truth[4], truth[5])})))
    assert steps[-1].sampled_token_ids == ((truth[4], truth[5], truth[6]),)
    # first draft wrong: only the target token
    steps.append(runner.execute_model(sched(3, {"D": 2}, drafts={"D": (wrong(truth[7]),)})))
    assert steps[-1].sampled_token_ids == ((truth[7],),)
    steps.append(runner.execute_model(sched(4, {"D": 1})))
    assert runner.outputs("D") == tuple(truth)
    for out in steps:
        assert len(out.logprobs[0]) == len(out.sampled_token_ids[0]) and not out.nan_flags[0]
    assert [r.token for r in runner.last_results["D"]] == [truth[8]]


def test_draft_rows_count_preceding_drafts_as_outputs() -> None:
    params = SamplingParams(temperature=0.0, presence_penalty=2.0, repetition_penalty=3.0)
    prompt = (88, 81, 165, 25)  # found by search: here the penalty on d_1 decides row 1's token
    truth = generate(prompt, params, 0, 4)
    uncounted = sample(MODEL.logits(list(prompt) + truth[:2])[-1], params, 0, len(prompt) + 2, prompt, truth[:1])
    assert uncounted.token != truth[2], "the case lost its power: pick another prompt"
    runner = ReferenceRunner(WEIGHTS, LIMITS)
    runner.execute_model(sched(0, {"G": 4}, [new("G", prompt, params)]))
    out = runner.execute_model(sched(1, {"G": 3}, drafts={"G": (truth[1], truth[2])}))
    assert out.sampled_token_ids == ((truth[1], truth[2], truth[3]),)


def test_rejected_drafts_are_not_penalised() -> None:
    # A wrong draft repeated many times must not leak into later penalties (frequency 0.7 per count).
    truth = generate(PROMPT_D, PARAMS_D, seed_of("D", PARAMS_D), 4)
    runner = ReferenceRunner(WEIGHTS, LIMITS, base_seed=BASE_SEED)
    runner.execute_model(sched(0, {"D": 5}, [new("D", PROMPT_D, PARAMS_D)]))
    bad_draft = (truth[1] + 1) % 256
    runner.execute_model(sched(1, {"D": 4}, drafts={"D": (bad_draft,) * 3}))
    runner.execute_model(sched(2, {"D": 1}))
    runner.execute_model(sched(3, {"D": 1}))
    assert runner.outputs("D") == tuple(truth)


# --------------------------------------------------------------------------- tie adoption


def test_replaced_token_feeds_later_steps_and_penalties() -> None:
    params = SamplingParams(temperature=0.8, frequency_penalty=2.0, repetition_penalty=1.5)
    runner = ReferenceRunner(WEIGHTS, LIMITS, base_seed=BASE_SEED)
    runner.execute_model(sched(0, {"R": 5}, [new("R", PROMPT_B, params)]))
    runner.execute_model(sched(1, {"R": 1}))
    runner.execute_model(sched(2, {"R": 1}))
    original = runner.outputs("R")
    adopted = (original[-1] + 17) % 256
    runner.replace_output_token("R", 0, adopted)
    assert runner.outputs("R") == original[:-1] + (adopted,)
    later = runner.execute_model(sched(3, {"R": 1})).sampled_token_ids[0]
    later += runner.execute_model(sched(4, {"R": 1})).sampled_token_ids[0]

    # the same continuation as a request resumed with the adopted token among its outputs
    seed = seed_of("R", params)
    tokens = list(PROMPT_B) + list(original[:-1]) + [adopted]
    expected = []
    for _ in range(2):
        row = MODEL.logits(tokens)[-1]
        tok = sample(row, params, seed, len(tokens), PROMPT_B, tokens[len(PROMPT_B):]).token
        tokens.append(tok)
        expected.append(tok)
    assert list(later) == expected
    resumed = ReferenceRunner(WEIGHTS, LIMITS, base_seed=BASE_SEED)
    out = resumed.execute_model(sched(0, {"R": 8}, [new("R", PROMPT_B, params, outputs=original[:-1] + (adopted,))]))
    assert out.sampled_token_ids[0] == (expected[0],)

    # an older output can be replaced too (index counted from the latest)
    runner.replace_output_token("R", 3, 0)
    assert runner.outputs("R")[-4] == 0


# --------------------------------------------------------------------------- protocol


def test_async_wrapper_satisfies_runner_protocol() -> None:
    oracle = ReferenceRunner(WEIGHTS, LIMITS, base_seed=BASE_SEED)
    wrapped = AsyncReferenceRunner(oracle)
    assert isinstance(wrapped, Runner)
    pending = wrapped.execute_model(sched(0, {"B": 5}, [new("B", PROMPT_B, PARAMS_B)]))
    assert isinstance(pending, AsyncOutput) and isinstance(pending, ReadyOutput)
    assert pending.get().sampled_token_ids == ((generate(PROMPT_B, PARAMS_B, 0, 1)[0],),)
    assert oracle.num_live == 1
    direct = oracle.execute_model_async(sched(1, {"B": 1})).get()
    assert direct.sampled_token_ids[0] == tuple(generate(PROMPT_B, PARAMS_B, 0, 2)[1:])
