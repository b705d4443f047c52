"""The steady decode step: `runnercheck.impl.step_reader.read_steady_step` reads what `read_step` reads, rejects what it rejects.

The host side of a graphed steady step is counted too: it makes no torch call outside its fused graph
replay (each costs ~5-25 us of host time on the H200 box; the replay copies the step in and out itself).

A decode run on cpu (three requests, 4-token blocks, so every fourth step appends a block per
request) compares the steady reader's arrays with the full reader's on every step the steady
reader accepts, and checks that the runner took the steady path exactly there.  A steady step
whose request crosses a block boundary without its new block is rejected with the full reader's
error, leaving the runner's state as it was.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from torch.overrides import TorchFunctionMode

from runnercheck.bench.workload import DecodeWorkload
from runnercheck.impl.device import Device
from runnercheck.impl.interface import BlockIdError, RunnerLimits, SamplingParams
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import ModelRunner
from runnercheck.impl.step_reader import read_steady_step, read_step
from test_bad_inputs import fingerprint

LIMITS = RunnerLimits(vocab_size=256, max_num_reqs=4, max_model_len=64, max_num_batched_tokens=16, num_kv_blocks=48, block_size=4)
PARAMS = SamplingParams(temperature=0.8, seed=7, max_tokens=1 << 20)


def _setup() -> tuple[ModelRunner, DecodeWorkload]:
    runner = ModelRunner(random_weights(preset("micro"), seed=3), LIMITS, Device("cpu"), base_seed=5)
    work = DecodeWorkload(num_reqs=3, prompt_len=5, vocab_size=LIMITS.vocab_size, block_size=LIMITS.block_size,
                          num_blocks=LIMITS.num_kv_blocks, token_budget=LIMITS.max_num_batched_tokens, churn=0.0,
                          params=PARAMS, seed=1)
    return runner, work


def _both(runner: ModelRunner, sched):
    last = runner._last_decode
    fast = read_steady_step(sched, runner.state, runner.limits, runner._last_step_id, last[0] if last is not None else None)
    return fast, read_step(sched, runner.state, runner.limits, runner._last_step_id)


def test_steady_reader_agrees_with_the_full_reader_on_a_decode_run():
    runner, work = _setup()
    steady_steps = with_appends = 0
    for _ in range(14):
        sched = work.next_step()
        fast, full = _both(runner, sched)
        if fast is not None:
            steady_steps += 1
            assert fast.req_ids == full.req_ids and fast.num_tokens == full.num_tokens and fast.gone == ()
            for name in ("rows", "query_lens", "starts", "ends", "known", "num_drafts", "query_starts"):
                assert np.array_equal(getattr(fast, name), getattr(full, name)), name
            # Both build StepArrays positionally: every summary lands in its own field.
            for name in ("max_query_len", "max_end", "uniform_query_len", "drafts", "cached_computed", "new_positions"):
                assert getattr(fast, name) == getattr(full, name), name
            assert fast.steady and not full.steady
            # The cached updates: the steady reader names only the rows that appended blocks.
            assert np.array_equal(fast.cached_rows, full.cached_rows[full.cached_new_blocks > 0])
            assert np.array_equal(fast.cached_new_blocks, full.cached_new_blocks[full.cached_new_blocks > 0])
            assert (fast.block_appends is None) == (full.block_appends is None)
            if fast.block_appends is not None:
                with_appends += 1
                assert all(np.array_equal(a, b) for a, b in zip(fast.block_appends, full.block_appends))
        runner.execute_model(sched).get()
        assert runner.last_step_stats.steady == (fast is not None)
    assert steady_steps >= 8, steady_steps  # the run settles into steady decode steps
    assert with_appends >= 2, with_appends  # ... some of which append blocks


def test_steady_step_missing_its_new_block_is_rejected_and_changes_nothing():
    runner, work = _setup()
    crossed = False
    for _ in range(14):
        sched = work.next_step()
        fast, _ = _both(runner, sched)
        if fast is not None and fast.block_appends is not None and not crossed:
            crossed = True
            stripped = dataclasses.replace(sched.cached_requests, new_block_ids=((),) * len(sched.cached_requests))
            bad = dataclasses.replace(sched, cached_requests=stripped)
            before = fingerprint(runner)
            with pytest.raises(BlockIdError):
                runner.execute_model(bad)
            assert fingerprint(runner) == before
        runner.execute_model(sched).get()
        if crossed:
            assert runner.last_step_stats.steady  # the good step after the rejection is still steady
            break
    assert crossed, "the run never reached a steady step that appends a block"


class _TorchCalls(TorchFunctionMode):
    """Counts torch calls made while active, except while ``paused`` (inside a graph replay)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += not self.paused
        return func(*args, **(kwargs or {}))


def test_a_graphed_steady_step_makes_no_torch_call_outside_its_replay():
    """On cuda a replay is one call whatever the graph holds; on cpu its recorded launches run, so they are not counted."""
    runner, work = _setup()
    counter = _TorchCalls()
    enqueue = runner.device.enqueue

    def enqueue_pausing_in_replays(fn, label: str = "") -> None:
        counter.paused = "graph replay" in label
        try:
            enqueue(fn, label)
        finally:
            counter.paused = False

    runner.device.enqueue = enqueue_pausing_in_replays
    counts = []
    for step in range(18):
        sched = work.next_step()
        before = counter.count
        with counter:
            out = runner.execute_model(sched)
        out.get()
        stats = runner.last_step_stats
        # From step 10 every staging slot of the ring (8) has been used once: their views exist.
        if step >= 10 and stats.steady and stats.graph_replayed:
            counts.append(counter.count - before)
    assert len(counts) >= 6, counts
    # The staging slot's copy in and the packed output's copy out are inside the fused replay: a step
    # that copies, slices, views or packs on the host again shows up here.
    assert set(counts) == {0}, counts


def _force_general_path(runner: ModelRunner) -> None:
    """Make every step take the general path: the fused steady path is never armed."""
    execute = runner._execute

    def execute_unarmed(sched, started):
        runner._steady_key = None
        return execute(sched, started)

    runner._execute = execute_unarmed


def test_fused_steady_steps_match_the_general_path_token_for_token_and_in_device_state():
    """After a bucketed decode step the steady steps run `ModelRunner._execute_steady`; a runner forced
    onto the general path must produce the same tokens, row state and block table, step for step."""
    fused, work = _setup()
    general, work_general = _setup()
    _force_general_path(general)
    calls = []
    execute_steady = fused._execute_steady
    fused._execute_steady = lambda *args: calls.append(args[1]) or execute_steady(*args)
    for _ in range(18):
        sched = work.next_step()
        a, b = fused.execute_model(sched).get(), general.execute_model(work_general.next_step()).get()
        assert a.sampled_token_ids == b.sampled_token_ids and a.req_ids == b.req_ids
        assert fused.last_step_stats.steady == general.last_step_stats.steady
    assert len(calls) >= 8, calls  # most steps of the run are fused steady steps
    assert fused.state.base.equal(general.state.base)
    assert fused.block_table.base.equal(general.block_table.base)
    assert np.array_equal(fused.state.num_blocks, general.state.num_blocks)


def test_every_step_with_tokens_passes_through_the_device_step_hook():
    """`_enqueue_device_step` is where checks that follow a step's device work attach
    (`runnercheck.checks.detectors.kv_provenance`): the fused steady path must go through it too."""
    runner, work = _setup()
    seen = []
    enqueue_device_step = runner._enqueue_device_step

    def hooked(plan, *args):
        seen.append(plan.req_ids)
        return enqueue_device_step(plan, *args)

    runner._enqueue_device_step = hooked
    steady = 0
    for _ in range(14):
        before = len(seen)
        runner.execute_model(work.next_step()).get()
        steady += runner.last_step_stats.steady
        assert len(seen) == before + 1
    assert steady >= 8


def test_limits_past_int32_are_refused_before_anything_is_allocated():
    """Counts and block ids live in int32 device tensors, and the steady reader compares the scheduler's
    counts with the mirror's as int32 (`runnercheck.impl.exact_ints`): a limit past that range is a config error."""
    from runnercheck.impl.runner_config import RunnerConfigError

    too_many_blocks = dataclasses.replace(LIMITS, num_kv_blocks=2**31)
    with pytest.raises(RunnerConfigError, match="int32"):
        ModelRunner(random_weights(preset("micro"), seed=3), too_many_blocks, Device("cpu"))
