"""Batch-invariant matmul and RMSNorm: every output row is computed the same way whatever the batch.

Why: library kernels pick their tiling (and with it the order in which a dot product or a row's
sum of squares is accumulated) from the problem shape -- cuBLAS picks a split-K or a different tile
for 3 rows than for 300, and a row reduction over few rows splits each row over several blocks
(vLLM #48391: a norm's block size chosen from num_tokens).  A row's float result then depends on how
many other rows share the launch, so the same request yields different logits alone and in a batch.

The kernels here fix the tiles (``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K`` for the matmul, one program
and one ``BLOCK`` per row for the norm) independently of the number of rows, accumulate in fp32
over ``K`` in ``BLOCK_K`` steps in one fixed order, and never split a reduction over programs:
each output element's arithmetic is a function of its own row and the weights only.  Rows past
``M`` are masked (read as 0, never written), so padding and batchmates cannot leak into a row.
fp32 inputs use IEEE products (no tf32), so the result also stays at fp32 accuracy.
Tile products go through `runnercheck.impl.kernels.tile_dot` so that a row's bits also do not depend
on its place in the tile when the kernels run interpreted on a CPU.

Used by `runnercheck.impl.model.forward.PagedDecoder` when built with ``batch_invariant=True``
(`runnercheck.impl.runner.make_runner`'s keyword; the invariance checker passes it).  Launch-only
host code: nothing here reads device data on the host.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from runnercheck.impl.kernels.launch import launch as launch_kernel
from runnercheck.impl.kernels.tile_dot import row_exact_dot, tile_dot

# Fixed tiles: they must not depend on the number of rows (that is the point).  64x64x32 keeps an
# H100/H200 busy for the built-in model's shapes; K is walked in BLOCK_K steps in one order.
BLOCK_M = 64
BLOCK_N = 64
BLOCK_K = 32
NUM_WARPS = 4


class BatchInvariantInputError(ValueError):
    """A matmul/norm call whose operands do not fit (raised before any launch)."""


@triton.jit
def _bi_matmul_kernel(
    a_ptr, w_ptr, bias_ptr, res_ptr, out_ptr, M, N, K,
    stride_am, stride_wn, stride_rm, stride_om,
    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROW_EXACT_DOT: tl.constexpr,
):
    """``out[m, n] = res[m, n] + bias[n] + sum_k a[m, k] * w[n, k]`` for one fixed tile."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + cols[None, :] * stride_wn + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tile_dot(a, w, acc, PRECISION, ROW_EXACT_DOT)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_RESIDUAL:
        acc += tl.load(res_ptr + rows[:, None] * stride_rm + cols[None, :],
                       mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _bi_rms_norm_kernel(x_ptr, w_ptr, out_ptr, N, stride_x, stride_o, eps, BLOCK: tl.constexpr):
    """One row per program; the sum of squares is one fixed-``BLOCK`` tree reduction, never split."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / N
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    y = x * (1.0 / tl.sqrt(mean_square + eps)) * w
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=ok)


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise BatchInvariantInputError(message)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """``residual + x @ weight.T + bias`` (``x`` ``[M, K]``, ``weight`` ``[N, K]``) in ``x``'s dtype,
    accumulated in fp32 with tiles that do not depend on ``M``."""
    _require(x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1],
             f"linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit [M, K] @ [N, K].T")
    _require(x.stride(1) == 1 and weight.stride(1) == 1, "linear: rows of x and weight must be contiguous")
    M, K = x.shape
    N = weight.shape[0]
    _require(bias is None or (bias.dim() == 1 and bias.shape[0] == N), f"linear: bias must be [{N}]")
    _require(residual is None or (residual.shape == (M, N) and residual.stride(1) == 1),
             f"linear: residual must be [{M}, {N}] with contiguous rows")
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return out
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    launch_kernel(_bi_matmul_kernel, grid,
        x, weight, bias if bias is not None else out, residual if residual is not None else out, out, M, N, K,
        x.stride(0), weight.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0),
        HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, ROW_EXACT_DOT=row_exact_dot(), num_warps=NUM_WARPS)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dim of ``x`` ``[M, N]``, one program per row."""
    _require(x.dim() == 2 and weight.shape == (x.shape[1],), f"rms_norm: x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    _require(x.stride(1) == 1, "rms_norm: rows of x must be contiguous")
    M, N = x.shape
    out = torch.empty_like(x)
    if M == 0:
        return out
    launch_kernel(_bi_rms_norm_kernel, (M,), x, weight, out, N, x.stride(0), out.stride(0), float(eps),
                  BLOCK=triton.next_power_of_2(N), num_warps=NUM_WARPS)
    return out


__all__ = ["linear", "rms_norm", "BatchInvariantInputError", "BLOCK_M", "BLOCK_N", "BLOCK_K"]
