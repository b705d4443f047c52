"""A tile product whose rows do not depend on their place in the tile, compiled or interpreted.

Compiled, ``tl.dot`` runs on the tensor cores: every output element of a tile is accumulated by the
same instruction sequence, whichever row it sits in.  Under Triton's interpreter ``tl.dot`` is
numpy's matmul, i.e. the host's BLAS, and BLAS micro-kernels do not promise that: OpenBLAS's
Haswell/Zen sgemm gives a row at tile row 6 other bits than the same row at tile row 0.  A kernel
that must be batch invariant (a row's result independent of what shares its launch, see
`runnercheck.impl.kernels.batch_invariant`) would then be invariant on the GPU and not on the CPU
it is tested on.  `tile_dot` with ``ROW_EXACT=True`` (what `row_exact_dot` returns under the
interpreter) sums the elementwise products over ``K`` in fp32 instead: one fixed order per output
element, for any host.
"""
from __future__ import annotations

import triton
import triton.language as tl

from runnercheck.impl.device import triton_interpreted


@triton.jit
def tile_dot(a, b, acc, PRECISION: tl.constexpr, ROW_EXACT: tl.constexpr):
    """``acc + a @ b`` (``a`` ``[M, K]``, ``b`` ``[K, N]``, ``acc`` fp32 ``[M, N]``)."""
    if ROW_EXACT:
        out = acc + tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    else:
        out = tl.dot(a, b, acc, input_precision=PRECISION)
    return out


def row_exact_dot() -> bool:
    """The ``ROW_EXACT`` constexpr a launch passes: on under Triton's interpreter."""
    return triton_interpreted()


__all__ = ["tile_dot", "row_exact_dot"]
