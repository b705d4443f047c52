"""A planted out-of-bounds Triton store, for ``ci/sanitizer.sh`` to prove compute-sanitizer catches one.

The kernel stores a whole block of 1024 elements into a 1000-element tensor with no mask: 24
``Invalid __global__ write``s past the end of the allocation.  Memcheck sees them only when the
tensor is its own ``cudaMalloc`` (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, which the script sets):
inside a cached block the bytes past the tensor belong to the allocator and the write looks legal.

The verdict is compute-sanitizer's (its error summary and ``--error-exitcode``), not this test's:
without the sanitizer the store silently corrupts whatever follows, so the test runs only when
``RUNNERCHECK_UNDER_SANITIZER=1`` (the script sets it) and is skipped everywhere else, the
``gpu_tests`` job included.
"""
from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.sanitizer,
    pytest.mark.skipif(os.environ.get("RUNNERCHECK_UNDER_SANITIZER") != "1",
                       reason="planted out-of-bounds write: runs only under compute-sanitizer (ci/sanitizer.sh)"),
]

SIZE, BLOCK = 1000, 1024


@triton.jit
def oob_store_kernel(out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, offs.to(tl.float32))  # the bug: no `mask=offs < n`


def test_planted_out_of_bounds_store_for_the_sanitizer() -> None:
    out = torch.empty(SIZE, dtype=torch.float32, device="cuda")
    oob_store_kernel[(1,)](out, BLOCK=BLOCK)
    torch.cuda.synchronize()  # under memcheck the launch is reported; what happens after does not matter
