"""Every Triton kernel an eager step launches goes through `runnercheck.impl.kernels.launch.launch` with an argument
list the fast path can key (issue 14): a direct ``kernel[grid](...)`` costs a full ``JITFunction.run`` on
every eager step (~70 us each on the H200 host), and so does a call the key cannot cover.

Runs on CPU under the Triton interpreter, where every launch -- through `launch` or not -- ends in
``InterpretedFunction.__getitem__``; the test records there who called and with what."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from runnercheck.impl.kernels import launch as fast

interpreter = pytest.importorskip("triton.runtime.interpreter")


def _via_launch() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code is fast.launch.__code__:
            return True
        frame = frame.f_back
    return False


@pytest.fixture
def recorded(monkeypatch):
    if not fast.triton_interpreted():
        pytest.skip("records launches through the Triton interpreter")
    calls: list[tuple] = []
    original = interpreter.InterpretedFunction.__getitem__

    def getitem(self, grid):
        via = _via_launch()
        run = original(self, grid)

        def record(*args, **kwargs):
            calls.append((self, via, args, kwargs))
            return run(*args, **kwargs)

        return record

    monkeypatch.setattr(interpreter.InterpretedFunction, "__getitem__", getitem)
    return calls


def _keyable(kernel, args: tuple, kwargs: dict) -> bool:
    params = [SimpleNamespace(name=n, do_not_specialize=False, do_not_specialize_on_alignment=False) for n in kernel.arg_names]
    plan = fast._KernelPlan(SimpleNamespace(params=params))
    ordered = fast._ordered(plan, args, kwargs)
    if ordered is None:
        return False
    try:
        fast.call_key(plan, ordered, 0, kwargs)
    except TypeError:
        return False
    return True


def _run_eager_steps(speculative=None, draft_prob: float = 0.0, ngram_spec_tokens: int = 0) -> int:
    from runnercheck.impl.device import Device
    from runnercheck.impl.interface import RunnerLimits, SamplingParams
    from runnercheck.impl.model.weights import preset, random_weights
    from runnercheck.impl.runner import ModelRunner
    from runnercheck.stress.sim.scheduler import SchedulerSim

    limits = RunnerLimits(vocab_size=256, max_num_reqs=4, max_model_len=48, max_num_batched_tokens=16, num_kv_blocks=40,
                          block_size=4, max_logprobs=3, max_num_draft_tokens=2)
    runner = ModelRunner(random_weights(preset("micro"), seed=3), limits, Device("cpu"), base_seed=5, cuda_graphs=False,
                         speculative=speculative)
    sched = SchedulerSim(limits, seed=1, draft_prob=draft_prob, ngram_spec_tokens=ngram_spec_tokens)
    for i in range(5):  # penalties, a filter, logprobs and prompt logprobs: every kernel family of an eager step
        sched.add_request(f"r{i}", tuple(range(3, 7 + i)), SamplingParams(
            temperature=0.9 if i % 2 else 0.0, seed=i, max_tokens=4, repetition_penalty=1.1, frequency_penalty=0.2,
            top_k=3 if i == 3 else -1,
            logprobs=2 if i % 2 else None, prompt_logprobs=1 if i == 1 else None))
    steps = 0
    while sched.has_work and steps < 12:
        out = runner.execute_model(sched.schedule()).get()
        sched.update(out)
        steps += 1
    return steps


def test_every_eager_launch_goes_through_the_fast_launcher_with_a_keyable_call(recorded):
    _run_eager_steps(draft_prob=0.5)
    assert recorded, "no launch recorded: the test no longer sees the runner's kernels"
    names = {kernel.fn.__name__ for kernel, *_ in recorded}
    # the families an eager step with penalties, logprobs and prompt logprobs must launch
    for family in ("sampler_block", "sampler_row", "logprobs_block", "token_logprobs", "add_token_counts",
                   "zero_count_rows", "post_update", "prepare_inputs", "paged_attention", "apply_word_diffs"):
        assert any(family in n for n in names), (family, sorted(names))
    direct = sorted({kernel.fn.__name__ for kernel, via, *_ in recorded if not via})
    assert not direct, f"launched as kernel[grid](...), not through impl.kernels.launch: {direct}"
    unkeyed = sorted({kernel.fn.__name__ for kernel, _, args, kwargs in recorded if not _keyable(kernel, args, kwargs)})
    assert not unkeyed, f"calls the fast path cannot key (a default left out or an unknown option): {unkeyed}"


def test_ngram_proposer_launches_go_through_the_fast_launcher(recorded):
    from runnercheck.impl.interface import NgramConfig

    _run_eager_steps(speculative=NgramConfig(num_spec_tokens=2), ngram_spec_tokens=2)
    names = {kernel.fn.__name__ for kernel, *_ in recorded}
    assert any("ngram_propose" in n for n in names) and any("gather_drafts" in n for n in names), sorted(names)
    direct = sorted({kernel.fn.__name__ for kernel, via, *_ in recorded if not via})
    assert not direct, direct
    assert all(_keyable(kernel, args, kwargs) for kernel, _, args, kwargs in recorded)


def test_the_recorder_sees_a_direct_launch(recorded):
    """The check above can fail: a kernel launched directly is reported as such."""
    from tests.impl.test_launch import _scaled_copy_kernel

    src, dst = torch.arange(4, dtype=torch.float32), torch.zeros(4)
    _scaled_copy_kernel[(1,)](src, dst, 4, 1.0, 0, BLOCK=4)
    fast.launch(_scaled_copy_kernel, (1,), src, dst, 4, 1.0, 0, BLOCK=4, enable_fp_fusion=False)
    fast.launch(_scaled_copy_kernel, (1,), src, dst, 4, 1.0, 0, BLOCK=4, num_warps=1)
    assert [via for _, via, *_ in recorded] == [False, True, True]
    assert [_keyable(k, a, kw) for k, _, a, kw in recorded] == [True, False, True]
