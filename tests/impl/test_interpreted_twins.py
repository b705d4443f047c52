"""`runnercheck.impl.kernels.interpreted_twins`: each numpy twin gives its Triton function's bits for every argument
shape the kernels use (and the ones they could), and the test process runs the twins."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from runnercheck.impl.device import triton_interpreted
from runnercheck.impl.kernels import rng, sampling_select
from runnercheck.impl.kernels.interpreted_twins import (install_interpreted_twins, philox4x32_numpy, philox_rounds,
                                                        sorted_descending_numpy, uninstall_interpreted_twins)

interpreted = pytest.mark.skipif(not triton_interpreted(), reason="kernels run on a GPU, not in the interpreter")
N = 16


@triton.jit
def _philox_shapes_kernel(seed_ptr, out_ptr, position, STREAM: tl.constexpr, N: tl.constexpr):
    """Every shape a caller gives philox4x32: a block of counters, a 2-D broadcast, all scalars, and the
    helpers built on it (the speculative streams' 64 bits, the sampler's hi chunk and lo words)."""
    seed = tl.load(seed_ptr + tl.program_id(0))
    lanes = tl.arange(0, N)
    base = out_ptr + tl.program_id(0) * (8 * N + N * N)
    w0, w1, w2, w3 = rng.philox4x32(seed, lanes * 977 - 5, position, STREAM)
    tl.store(base + lanes, w0)
    tl.store(base + N + lanes, w1)
    tl.store(base + 2 * N + lanes, w2)
    tl.store(base + 3 * N + lanes, w3)
    s0, s1, s2, s3 = rng.philox4x32(seed, seed * 0 + 3, position, STREAM)  # all scalars
    tl.store(base + 4 * N, s0)
    tl.store(base + 4 * N + 1, s1 ^ s2 ^ s3)
    hi, lo = rng.philox_64bits(seed, position + lanes, lanes, rng.ACCEPT_STREAM)
    tl.store(base + 5 * N + lanes, hi)
    tl.store(base + 6 * N + lanes, lo ^ rng.noise_lo(seed, position, lanes))
    tl.store(base + 7 * N + lanes, rng.noise_hi_chunk(seed, position, 8, N))
    grid = rng.philox4x32(seed, lanes[:, None] + lanes[None, :] * N, position + lanes[None, :], STREAM)[3]
    tl.store(base + 8 * N + lanes[:, None] * N + lanes[None, :], grid)


def _launch(seeds: list[int], position: int, stream: int) -> torch.Tensor:
    seed = torch.tensor(seeds, dtype=torch.int64)
    out = torch.zeros(len(seeds) * (8 * N + N * N), dtype=torch.int32)
    _philox_shapes_kernel[(len(seeds),)](seed, out, position, STREAM=stream, N=N)
    return out


@interpreted
def test_the_test_process_runs_the_twins():
    from triton.runtime import interpreter

    table = interpreter.InterpretedFunction.rewritten_fn
    assert table.get(rng.philox4x32.fn) is philox4x32_numpy
    assert table.get(sampling_select.sorted_descending.fn) is sorted_descending_numpy


def _without_twins(launch):
    """``launch()`` with the interpreter running the Triton bodies, the twins back in place afterwards."""
    from triton.runtime import interpreter

    try:
        uninstall_interpreted_twins(interpreter)
        return launch()
    finally:
        assert install_interpreted_twins(interpreter)


@interpreted
@pytest.mark.parametrize("stream", [0, 1, 2, 3, 4])
def test_numpy_philox_gives_the_triton_functions_bits(stream: int):
    seeds = [0, 1, 2**63 - 1, -(2**62) - 12345, 0x1234_5678_9ABC_DEF0]  # negative: the two's complement key words
    position = 2**33 + 7  # above 2^32: the counter word takes its low 32 bits
    written = _without_twins(lambda: _launch(seeds, position, stream))
    twin = _launch(seeds, position, stream)
    assert torch.equal(twin, written)
    assert written.unique().numel() > written.numel() // 2  # real words, not a constant both got wrong


def test_the_numpy_rounds_give_random123s_published_answer():
    # counter 0, key 0: 0x6627e8d5 0xe169c58d 0xbc57ac4c 0x9b00dbd8 (Random123's kat_vectors, philox4x32_10)
    words = philox_rounds(np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64), 0)
    assert [int(w[0]) for w in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


@interpreted
def test_a_python_int_counter_is_refused_as_the_triton_function_refuses_it():
    seed = tl.tensor(__import__("triton.runtime.interpreter", fromlist=["TensorHandle"]).TensorHandle(
        np.array([5], np.int64), tl.int64), tl.int64)
    with pytest.raises(TypeError, match="counter must be an integer tensor"):
        philox4x32_numpy(seed, 3, seed, 0)


@triton.jit
def _sort_kernel(src_ptr, dst_ptr, N: tl.constexpr):
    lanes = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(dst_ptr + lanes, sampling_select.sorted_descending(tl.load(src_ptr + lanes)))


@interpreted
def test_numpy_sort_gives_the_bitonic_sorts_row():
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(-2**62, 2**62, (64,), generator=g),
            torch.randint(-3, 3, (64,), generator=g),  # ties
            torch.tensor([-2**63, 2**63 - 1, 0, -1] * 16),  # the int64 extremes and the empty-slot marker's sign
            torch.sort(torch.randint(0, 99, (64,), generator=g)).values]  # already ascending
    src = torch.stack(rows).contiguous()

    def launch():
        dst = torch.zeros_like(src)
        _sort_kernel[(len(rows),)](src, dst, N=64)
        return dst

    written = _without_twins(launch)
    assert torch.equal(launch(), written)
    assert torch.equal(written, torch.sort(src, dim=1, descending=True).values)
