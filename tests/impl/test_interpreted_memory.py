"""`runnercheck.impl.kernels.interpreted_memory`: an interpreted kernel's load, store or atomic outside the
launch's tensors is a `KernelMemoryError` naming the kernel, the operation, the address and the nearest
argument -- and the process survives it (without the checks it dies of SIGSEGV)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from runnercheck.impl.device import triton_interpreted
from runnercheck.impl.kernels.interpreted_memory import (
    MEMORY_FAULT_HOOKS,
    OFF_ENV,
    KernelMemoryError,
    check_interpreted_memory,
    memory_layout_known,
    reachable_through,
)

interpreted = pytest.mark.skipif(not triton_interpreted(), reason="kernels run on a GPU, not in the interpreter")
ROOT = Path(__file__).resolve().parents[2]


@triton.jit
def _gather_kernel(src, idx, dst, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    rows = tl.load(idx + offsets, mask=mask, other=0)
    tl.store(dst + offsets, tl.load(src + rows, mask=mask), mask=mask)


@triton.jit
def _scatter_kernel(dst, idx, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(dst + tl.load(idx + offsets, mask=mask, other=0), offsets.to(tl.float32), mask=mask)


@triton.jit
def _count_kernel(counts, idx, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    tl.atomic_add(counts + tl.load(idx + offsets, mask=mask, other=0), tl.full((BLOCK,), 1, tl.int32), mask=mask)


@triton.jit
def _through_table_kernel(table, dst, n, BLOCK: tl.constexpr):
    host = tl.load(table).to(tl.pointer_type(tl.float32))
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(dst + offsets, tl.load(host + offsets, mask=mask), mask=mask)


def _gather(idx: list[int], src_len: int = 16) -> torch.Tensor:
    src = torch.arange(src_len, dtype=torch.float32)
    dst = torch.zeros(len(idx))
    _gather_kernel[(1,)](src, torch.tensor(idx, dtype=torch.int64), dst, len(idx), BLOCK=8)
    return dst


@interpreted
def test_the_test_process_has_it_installed():
    from triton.runtime import interpreter

    assert check_interpreted_memory() is True and check_interpreted_memory() is True  # idempotent
    assert memory_layout_known(interpreter)  # seen through the wrappers this and speed_up_interpreter installed
    assert memory_layout_known(SimpleNamespace()) is False


@interpreted
def test_an_index_past_the_source_is_a_typed_error_naming_kernel_operation_address_and_argument():
    assert _gather([0, 3, 15, 1]).tolist() == [0.0, 3.0, 15.0, 1.0]  # in bounds: unchanged results
    with pytest.raises(KernelMemoryError) as caught:
        _gather([0, 3, 16, 1])  # one element past ``src``
    e = caught.value
    assert (e.kernel, e.operation, e.nbytes, e.lanes, e.active) == ("_gather_kernel", "load", 4, 1, 4)
    assert "argument 'src' (float32[16]" in e.nearest and "at byte offset 64 of its 64" in e.nearest
    assert e.where == f"{Path(__file__).name}:{_gather_kernel.fn.__code__.co_firstlineno + 5}"  # the tl.load line
    assert str(e).startswith(f"kernel _gather_kernel at {e.where}: load of 4 byte(s) at {e.address:#x}")


@interpreted
def test_masked_off_lanes_are_not_checked_and_views_are_bounded_by_their_own_elements():
    src = torch.arange(8, dtype=torch.float32)
    dst = torch.zeros(4)
    idx = torch.tensor([0, 1, 2, 3, 1 << 40, 1 << 40, 1 << 40, 1 << 40])
    _gather_kernel[(1,)](src, idx, dst, 4, BLOCK=8)  # lanes 4..7 masked off: their garbage is never dereferenced
    assert dst.tolist() == [0.0, 1.0, 2.0, 3.0]
    view = torch.arange(16, dtype=torch.float32)[2:6]  # the storage goes on, the argument does not
    with pytest.raises(KernelMemoryError, match="argument 'src' \\(float32\\[4\\]"):
        _gather_kernel[(1,)](view, torch.tensor([0, 4]), torch.zeros(2), 2, BLOCK=8)
    with pytest.raises(KernelMemoryError, match="2 byte\\(s\\) before its start|8 byte\\(s\\) before its start"):
        _gather_kernel[(1,)](view, torch.tensor([-2]), torch.zeros(1), 1, BLOCK=8)


@interpreted
def test_stores_and_atomics_out_of_range_raise_before_writing_anything():
    dst = torch.zeros(4)
    with pytest.raises(KernelMemoryError) as caught:
        _scatter_kernel[(1,)](dst, torch.tensor([0, 1, 9]), 3, BLOCK=4)
    assert caught.value.operation == "store" and dst.tolist() == [0.0] * 4  # the whole store refused
    counts = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(KernelMemoryError) as caught:
        _count_kernel[(1,)](counts, torch.tensor([1, 4]), 2, BLOCK=2)
    assert caught.value.operation == "atomic_rmw" and "argument 'counts'" in caught.value.nearest


@interpreted
def test_memory_reachable_through_a_table_argument_is_allowed_once_declared():
    buffers = [torch.arange(4, dtype=torch.float32) + 10 * i for i in range(2)]
    table = torch.tensor([buffers[1].data_ptr()], dtype=torch.int64)
    dst = torch.zeros(4)
    with pytest.raises(KernelMemoryError, match="_through_table_kernel"):
        _through_table_kernel[(1,)](table, dst, 4, BLOCK=4)
    reachable_through(table, buffers)
    _through_table_kernel[(1,)](table, dst, 4, BLOCK=4)
    assert dst.tolist() == [10.0, 11.0, 12.0, 13.0]
    with pytest.raises(KernelMemoryError, match="buffer 1 reachable through argument 'table' \\(float32\\[4\\]"):
        _through_table_kernel[(1,)](table, dst, 5, BLOCK=8)  # one element past the buffer the table points at


@interpreted
def test_every_fault_reaches_the_hooks_even_one_the_caller_swallows():
    seen: list[KernelMemoryError] = []
    MEMORY_FAULT_HOOKS.append(seen.append)
    try:
        try:
            _gather([20])
        except KernelMemoryError:
            pass
    finally:
        MEMORY_FAULT_HOOKS.remove(seen.append)
    assert len(seen) == 1 and seen[0].kernel == "_gather_kernel"


_CHILD = textwrap.dedent("""
    import torch, triton, triton.language as tl
    from runnercheck.impl.kernels.interpreted_memory import KernelMemoryError, check_interpreted_memory

    @triton.jit
    def gather(src, idx, dst, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(dst + offsets, tl.load(src + tl.load(idx + offsets)))

    print("checked", check_interpreted_memory(), flush=True)
    idx = torch.tensor([0, 1, 1 << 40, 2])  # a terabyte past the source: unmapped
    try:
        gather[(1,)](torch.arange(4.0), idx, torch.zeros(4), BLOCK=4)
    except KernelMemoryError as e:
        print("caught", e.operation, e.kernel, flush=True)
""")


@interpreted
def test_a_wild_index_is_an_error_the_process_survives_and_without_the_checks_it_dies_of_sigsegv(tmp_path: Path):
    script = tmp_path / "wild.py"
    script.write_text(_CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop(OFF_ENV, None)
    checked = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.split() == ["checked", "True", "caught", "load", "gather"]
    unchecked = subprocess.run([sys.executable, str(script)], env={**env, OFF_ENV: "1"}, capture_output=True, text=True,
                               timeout=120)
    assert unchecked.stdout.split() == ["checked", "False"] and unchecked.returncode == -11  # the planted bug is real
