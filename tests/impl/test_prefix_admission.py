"""Admission with a prefix-cache hit (`NewRequest.num_computed_tokens`): the runner computes from
the hit, never writes the cached positions, shares the blocks across block-table rows and matches
the oracle; bad hits are rejected with typed errors before any state (runner or oracle) changes."""
from __future__ import annotations

import hashlib

import pytest
import torch

from runnercheck.impl.device import Device
from runnercheck.impl.boundary import validate_prefix_hit
from runnercheck.impl.interface import (
    CachedRequest,
    CachedRequests,
    NewRequest,
    PrefixHitAlignmentError,
    PrefixHitBlocksError,
    PrefixHitError,
    PrefixHitLengthError,
    PrefixHitPromptLogprobsError,
    RunnerLimits,
    SamplingParams,
    SchedulerOutput,
    SchedulerOutputError,
)
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import ModelRunner, make_runner
from runnercheck.impl.state import NUM_COMPUTED
from runnercheck.reference.runner import ReferenceRunner

BS = 4
LIMITS = RunnerLimits(vocab_size=256, max_num_reqs=4, max_model_len=64, max_num_batched_tokens=16, num_kv_blocks=12, block_size=BS)
GREEDY = SamplingParams(temperature=0.0, max_tokens=4)
PROMPT_A = (5, 9, 2, 7, 1, 1, 8, 3, 4)
PROMPT_B = PROMPT_A[:8] + (6, 6)  # shares a's two leading blocks


def _weights():
    config = preset("micro")
    assert config.vocab_size == LIMITS.vocab_size
    return random_weights(config, seed=3)


def _fingerprint(runner: ModelRunner) -> str:
    st, h = runner.state, hashlib.sha256()
    h.update(repr(sorted((k, v.num_tokens, v.num_computed_upper, v.num_blocks) for k, v in st.live.items())).encode())
    h.update(repr((sorted(st.req_to_row.items()), list(st._free), st._next_generation)).encode())
    h.update(st.prefill_tokens.numpy().tobytes() + st.num_blocks.tobytes())
    h.update(repr((st.row_state.num_pending, runner.block_table.table.num_pending, runner.sampling_state.num_pending,
                   runner.device.step_index, [s.state for s in runner.staging.slots])).encode())
    return h.hexdigest()


def _first_step() -> SchedulerOutput:
    return SchedulerOutput(0, new_requests=(NewRequest("a", PROMPT_A, GREEDY, (0, 1, 2)),), num_scheduled_tokens={"a": 9})


def _hit_step(**changes) -> SchedulerOutput:
    fields = dict(req_id="b", prompt_token_ids=PROMPT_B, sampling_params=GREEDY, block_ids=(0, 1, 3), num_computed_tokens=8)
    fields.update(changes)
    new = NewRequest(**fields)
    scheduled = len(new.prefill_token_ids) - new.num_computed_tokens if isinstance(new.num_computed_tokens, int) else 2
    return SchedulerOutput(1, new_requests=(new,), cached_requests=CachedRequests.of((CachedRequest("a", (), 9),)),
                           num_scheduled_tokens={"a": 1, "b": max(1, scheduled)})


@pytest.mark.parametrize("kind", ["cpu", "sim"])
def test_a_hit_computes_from_the_hit_shares_blocks_and_matches_the_oracle(kind: str) -> None:
    weights = _weights()
    device = Device(kind, seed=0, lag_policy="random-drain") if kind == "sim" else Device(kind)
    runner, oracle = make_runner(weights, LIMITS, device, 0), ReferenceRunner(weights, LIMITS, base_seed=0)
    steps = [_first_step(), _hit_step()]
    got = [runner.execute_model(steps[0]).get()]
    device.synchronize()
    k_before, v_before = runner.model.kv_cache.k[:, :2].clone(), runner.model.kv_cache.v[:, :2].clone()
    got.append(runner.execute_model(steps[1]).get())
    steps.append(SchedulerOutput(2, cached_requests=CachedRequests.of((CachedRequest("a", (), 10), CachedRequest("b", (), 10))),
                                 num_scheduled_tokens={"a": 1, "b": 1}))
    got.append(runner.execute_model(steps[2]).get())
    device.synchronize()
    for sched, out in zip(steps, got):
        assert out.token_dict() == oracle.execute_model(sched).token_dict()
    assert all(len(t) == 1 for t in got[1].sampled_token_ids)  # b sampled right after its 2 uncached tokens
    # The cached positions were never written again: a's blocks 0 and 1 hold a's KV, bit for bit.
    assert torch.equal(runner.model.kv_cache.k[:, :2], k_before) and torch.equal(runner.model.kv_cache.v[:, :2], v_before)
    rows = runner.state.row_of("a"), runner.state.row_of("b")
    table = runner.block_table.base
    assert table[rows[0], :2].tolist() == table[rows[1], :2].tolist() == [0, 1]  # shared, in both rows
    assert int(runner.state.base[rows[1], NUM_COMPUTED]) == 11 and runner.state.live["b"].num_computed_upper == 11


def _bad_hits() -> list[tuple[type, dict]]:
    return [
        (PrefixHitAlignmentError, dict(num_computed_tokens=6)),
        (PrefixHitLengthError, dict(num_computed_tokens=12)),  # the whole 10-token prefill and more
        (PrefixHitLengthError, dict(prompt_token_ids=PROMPT_B[:8], num_computed_tokens=8)),  # the whole prefill
        (PrefixHitLengthError, dict(num_computed_tokens=-4)),
        (PrefixHitLengthError, dict(num_computed_tokens=True)),
        (PrefixHitLengthError, dict(num_computed_tokens=8.0)),
        (PrefixHitLengthError, dict(num_computed_tokens="8")),
        (PrefixHitBlocksError, dict(block_ids=(0,))),
        (PrefixHitPromptLogprobsError, dict(sampling_params=SamplingParams(temperature=0.0, prompt_logprobs=1))),
    ]


def test_bad_hits_are_typed_errors_and_leave_runner_and_oracle_untouched() -> None:
    weights = _weights()
    runner, oracle = make_runner(weights, LIMITS, Device("sim", seed=0), 0), ReferenceRunner(weights, LIMITS, base_seed=0)
    first = _first_step()
    runner.execute_model(first).get()
    oracle.execute_model(first)
    for cls, changes in _bad_hits():
        bad = _hit_step(**changes)
        before, oracle_before = _fingerprint(runner), oracle.host_mirror()
        for target in (runner, oracle):
            with pytest.raises(cls) as info:
                target.execute_model(bad)
            assert isinstance(info.value, PrefixHitError) and isinstance(info.value, SchedulerOutputError)
            assert info.value.req_id == "b" and info.value.field in ("num_computed_tokens", "block_ids")
        assert _fingerprint(runner) == before, f"{cls.__name__} {changes} changed runner state"
        assert oracle.host_mirror() == oracle_before
    good = _hit_step()  # the same runner still takes the good step
    assert runner.execute_model(good).get().token_dict() == oracle.execute_model(good).token_dict()


def test_validate_prefix_hit_accepts_what_it_should() -> None:
    validate_prefix_hit(NewRequest("x", (1,) * 5, SamplingParams(prompt_logprobs=1), (0, 1)), BS)  # no hit: logprobs fine
    validate_prefix_hit(NewRequest("x", (1,) * 5, GREEDY, (0, 1), num_computed_tokens=4), BS)
    # A resumed request's prefill is prompt + outputs: a hit may cover outputs too, never the last token.
    validate_prefix_hit(NewRequest("x", (1, 2, 3), GREEDY, (0, 1, 2), (4, 5, 6, 7, 8, 9), num_computed_tokens=8), BS)
    with pytest.raises(PrefixHitLengthError):
        validate_prefix_hit(NewRequest("x", (1, 2, 3), GREEDY, (0, 1), (4, 5, 6, 7, 8), num_computed_tokens=8), BS)
