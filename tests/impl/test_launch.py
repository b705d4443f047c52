"""The cheap Triton launch path (`runnercheck.impl.kernels.launch`): its specialization key on CPU; on a GPU, fast launches
that pick the compiled kernel Triton itself picks and compute what ``kernel[grid](...)`` computes."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from runnercheck.impl.kernels import launch as fast


def _scaled_copy(src_ptr, dst_ptr, n, scale, offset, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(dst_ptr + i, tl.load(src_ptr + i, mask=m) * scale + offset, mask=m)


_scaled_copy_kernel = triton.jit(do_not_specialize=["n"])(_scaled_copy)


def _plan():
    """The plan of the compiled (not interpreted) JITFunction: its parameters are what the key is made from."""
    if isinstance(_scaled_copy_kernel, JITFunction):
        return fast._plan_of(_scaled_copy_kernel)
    return fast._KernelPlan(JITFunction(_scaled_copy, do_not_specialize=["n"]))


def test_the_key_is_as_fine_as_tritons_specialization():
    plan = _plan()
    base = torch.zeros(64, dtype=torch.float32)
    key = lambda *values: fast.specialization_key(plan, values, 0)  # noqa: E731
    aligned = key(base, base, 10, 2.0, 3, 128)
    assert key(base[2:], base, 10, 2.0, 3, 128) != aligned  # 16-byte alignment of a pointer (8 bytes in)
    assert key(base[4:], base, 10, 2.0, 3, 128) == aligned  # 16 bytes in: aligned again
    assert key(base[1:], base, 10, 2.0, 3, 128) == key(base[3:], base, 10, 2.0, 3, 128)  # both unaligned
    assert key(base.to(torch.int32), base, 10, 2.0, 3, 128) != aligned  # dtype
    assert key(base, base, 11, 2.0, 3, 128) == aligned  # n is do_not_specialize: only its int type counts
    assert key(base, base, 2**40, 2.0, 3, 128) != aligned and key(base, base, 2**63, 2.0, 3, 128) != key(base, base, 2**40, 2.0, 3, 128)
    assert key(base, base, 10, 2.0, 1, 128) != aligned and key(base, base, 10, 2.0, 16, 128) != aligned  # specialized ints: exact
    assert key(base, base, 10, 2.5, 3, 128) != aligned and key(base, base, 10, 2.0, 3, 64) != aligned  # floats, constexprs: exact
    assert fast.specialization_key(plan, (base, base, 10, 2.0, 3, 128), 1) != aligned  # the device
    with pytest.raises(TypeError):
        key(base, base, 10, 2.0, [3], 128)  # unhashable: the caller falls back


def test_calls_the_key_cannot_cover_are_not_ordered():
    plan = _plan()
    x = torch.zeros(4)
    assert fast._ordered(plan, (x, x, 4, 1.0, 0), {"BLOCK": 4}) == [x, x, 4, 1.0, 0, 4]
    assert fast._ordered(plan, (x, x, 4, 1.0), {"BLOCK": 4}) is None  # a parameter left out
    assert fast._ordered(plan, (x, x, 4, 1.0, 0), {"BLOCK": 4, "num_warps": 1}) == [x, x, 4, 1.0, 0, 4]  # keyed by _options
    assert fast._ordered(plan, (x, x, 4, 1.0, 0), {"num_warps": 1, "num_stages": 2}) is None  # BLOCK left out
    assert fast._ordered(plan, (x, x, 4, 1.0, 0), {"BLOCK": 4, "enable_fp_fusion": False}) is None  # an option it does not key


def test_known_launch_options_key_by_exact_value():
    assert fast._options({}) == fast._options({"BLOCK": 4}) == (None,) * len(fast.LAUNCH_OPTIONS)
    assert fast._options({"BLOCK": 4, "num_warps": 4}) == (4,) + (None,) * (len(fast.LAUNCH_OPTIONS) - 1)
    assert fast._options({"maxnreg": None}) == fast._options({})  # None is Triton's default
    assert fast._options({"num_warps": 4}) != fast._options({"num_warps": 8})
    assert fast._options({"num_stages": 2, "num_warps": 4}) == fast._options({"num_warps": 4, "num_stages": 2})


def test_interpreted_launches_take_the_normal_path():
    if not fast.triton_interpreted():
        pytest.skip("the interpreter is off")
    assert not fast.fast_path_enabled()
    before = fast.launch_stats()
    src, dst = torch.arange(10, dtype=torch.float32), torch.zeros(10)
    fast.launch(_scaled_copy_kernel, (2,), src, dst, 10, 2.0, 1, BLOCK=8)
    assert dst.tolist() == [2 * v + 1 for v in range(10)]
    after = fast.launch_stats()
    assert after["slow"] == before["slow"] + 1 and after["fast"] == before["fast"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_fast_launches_pick_tritons_kernel_and_compute_the_same(monkeypatch):
    monkeypatch.delenv("RUNNERCHECK_SLOW_LAUNCH", raising=False)
    assert fast.fast_path_enabled()
    plan = _plan()
    src = torch.randn(4096, device="cuda")
    # The last two pass launch options: the same arguments with other num_warps are another compiled kernel.
    cases = [(src, 4096, 2.0, 3, {}), (src[1:], 4000, 0.5, 1, {}), (src[4:], 17, -1.0, 16, {}), (src, 3000, 2.0, 3, {}),
             (src[1:], 3999, 0.5, 1, {}), (src, 3000, 2.0, 3, {"num_warps": 2}), (src, 3000, 2.0, 3, {"num_warps": 8, "num_stages": 2})]
    before = fast.launch_stats()
    for _ in range(3):
        for s, n, scale, offset, options in cases:
            grid = (triton.cdiv(n, 256),)
            got, want = torch.zeros(4096, device="cuda"), torch.zeros(4096, device="cuda")
            fast.launch(_scaled_copy_kernel, grid, s, got, n, scale, offset, BLOCK=256, **options)
            compiled = _scaled_copy_kernel[grid](s, want, n, scale, offset, BLOCK=256, **options)
            torch.cuda.synchronize()
            assert torch.equal(got, want), (n, scale, offset, options)
            key = fast.call_key(plan, (s, got, n, scale, offset, 256), torch.cuda.current_device(), {"BLOCK": 256, **options})
            assert plan.compiled[key] is compiled, "the fast path holds a kernel Triton would not pick for these arguments"
    after = fast.launch_stats()
    assert after["fast"] - before["fast"] >= 2 * len(cases) - 1  # every repeat after the first round (3000 ~ 4096)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_runner_outputs_are_the_same_with_and_without_fast_launches(monkeypatch):
    from runnercheck.impl.device import Device
    from runnercheck.impl.interface import RunnerLimits, SamplingParams
    from runnercheck.impl.model.weights import preset, random_weights
    from runnercheck.impl.runner import ModelRunner
    from runnercheck.stress.sim.scheduler import SchedulerSim

    limits = RunnerLimits(vocab_size=256, max_num_reqs=4, max_model_len=48, max_num_batched_tokens=16, num_kv_blocks=40,
                          block_size=4, max_logprobs=3, max_num_draft_tokens=1)
    weights = random_weights(preset("micro"), seed=3)

    def run(slow: bool) -> list:
        if slow:
            monkeypatch.setenv("RUNNERCHECK_SLOW_LAUNCH", "1")
        else:
            monkeypatch.delenv("RUNNERCHECK_SLOW_LAUNCH", raising=False)
        runner = ModelRunner(weights, limits, Device("cuda"), base_seed=5, cuda_graphs=False)
        sched = SchedulerSim(limits, seed=1, draft_prob=0.5)
        for i in range(6):
            sched.add_request(f"r{i}", tuple(range(3, 6 + i)), SamplingParams(temperature=0.9, seed=i, max_tokens=12))
        outs = []
        while sched.has_work:
            out = runner.execute_model(sched.schedule()).get()
            outs.append(out)
            sched.update(out)
        return outs

    before = fast.launch_stats()
    fast_outs = run(slow=False)
    assert fast.launch_stats()["fast"] > before["fast"]
    assert run(slow=True) == fast_outs


class _FakeCompiled:
    """Stands in for triton's CompiledKernel: records launcher calls (the fields `launch` passes)."""

    function, packed_metadata = "function", "packed"

    def __init__(self, reject: bool = False):
        self.calls: list[tuple] = []
        self.reject = reject

    def run(self, *launch_args):
        if self.reject:
            raise TypeError("function takes exactly 12 arguments")
        self.calls.append(launch_args)


class _FakeKernel:
    """Stands in for a JITFunction: parameters x (pointer), n (do_not_specialize int), BLOCK; counts normal launches."""

    def __init__(self, compiled: _FakeCompiled):
        from types import SimpleNamespace

        self.params = [SimpleNamespace(name="x", do_not_specialize=False, do_not_specialize_on_alignment=False),
                       SimpleNamespace(name="n", do_not_specialize=True, do_not_specialize_on_alignment=False),
                       SimpleNamespace(name="BLOCK", do_not_specialize=False, do_not_specialize_on_alignment=False)]
        self.compiled = compiled
        self.normal: list[tuple] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.normal.append((grid, args, kwargs))
            return self.compiled

        return launch


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(fast, "_launch_gate_open", lambda: True)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 4242, raising=False)


def test_a_seen_key_calls_the_launcher_with_every_argument_in_order(fake_cuda):
    compiled = _FakeCompiled()
    kernel = _FakeKernel(compiled)
    x = torch.zeros(16)
    fast.launch(kernel, (3,), x, 5, BLOCK=8)  # first sight of the key: the normal path
    assert len(kernel.normal) == 1 and not compiled.calls
    fast.launch(kernel, (4, 2), x, 6, BLOCK=8)  # n is do_not_specialize: same key
    assert len(kernel.normal) == 1
    assert compiled.calls == [(4, 2, 1, 4242, "function", "packed", None, None, None, x, 6, 8)]
    fast.launch(kernel, (4,), x[1:], 6, BLOCK=8)  # unaligned pointer: a new key, the normal path
    fast.launch(kernel, (4,), x, 6, BLOCK=16)  # another constexpr: a new key
    fast.launch(kernel, (4,), x, 6, BLOCK=8, enable_fp_fusion=False)  # a launch option it does not key: always the normal path
    fast.launch(kernel, (4,), x, 6, BLOCK=8, enable_fp_fusion=False)
    fast.launch(kernel, (4,), x, 6)  # a parameter left to its default: the normal path
    assert len(kernel.normal) == 6 and len(compiled.calls) == 1


def test_launch_options_are_part_of_the_key(fake_cuda):
    compiled = _FakeCompiled()
    kernel = _FakeKernel(compiled)
    x = torch.zeros(16)
    fast.launch(kernel, (2,), x, 5, BLOCK=8, num_warps=2)  # first sight: the normal path, with the option
    assert kernel.normal == [((2,), (x, 5), {"BLOCK": 8, "num_warps": 2})]
    fast.launch(kernel, (2,), x, 7, BLOCK=8, num_warps=2)  # seen: the launcher, the option not among its arguments
    assert compiled.calls == [(2, 1, 1, 4242, "function", "packed", None, None, None, x, 7, 8)]
    fast.launch(kernel, (2,), x, 7, BLOCK=8, num_warps=4)  # another num_warps compiles another kernel: normal path
    fast.launch(kernel, (2,), x, 7, BLOCK=8)  # no option at all is its own key too
    fast.launch(kernel, (2,), x, 7, BLOCK=8, num_warps=2, num_stages=3)
    assert len(kernel.normal) == 4 and len(compiled.calls) == 1
    fast.launch(kernel, (2,), x, 7, BLOCK=8, num_warps=4)
    fast.launch(kernel, (2,), x, 7, BLOCK=8, num_stages=3, num_warps=2)
    assert len(kernel.normal) == 4 and len(compiled.calls) == 3


def test_a_launcher_that_rejects_the_arguments_turns_the_fast_path_off(fake_cuda):
    compiled = _FakeCompiled(reject=True)
    kernel = _FakeKernel(compiled)
    x = torch.zeros(16)
    fast.launch(kernel, (1,), x, 5, BLOCK=8)
    fast.launch(kernel, (1,), x, 5, BLOCK=8)  # the launcher raises before launching: relaunched the normal way
    fast.launch(kernel, (1,), x, 5, BLOCK=8)
    assert len(kernel.normal) == 3 and not fast._plan_of(kernel).usable


def test_host_int_helpers_match_triton():
    for n in range(0, 1100):
        assert fast.next_power_of_2(n) == triton.next_power_of_2(n), n
        for b in (1, 3, 128, 1024):
            assert fast.cdiv(n, b) == triton.cdiv(n, b), (n, b)
    assert fast.next_power_of_2(2**40 + 1) == triton.next_power_of_2(2**40 + 1)
