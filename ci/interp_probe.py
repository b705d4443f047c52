"""Exit 0 when Triton's interpreter runs a kernel here (triton 3.6's fails with numpy >= 2.4)."""
import os

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


x = torch.zeros(5, dtype=torch.int32)
_add_one[(1,)](x, 5, BLOCK=8)
assert x.tolist() == [1] * 5
