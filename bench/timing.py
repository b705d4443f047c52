"""Timing helpers: device time from CUDA events (triton.testing.do_bench), host time from perf_counter."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def device_time_us(fn: Callable[[], object], *, cuda: bool, warmup_ms: int = 25, rep_ms: int = 100, cpu_reps: int = 3) -> float:
    """Median device time of ``fn`` in microseconds (CUDA events on a GPU; wall time on CPU)."""
    if cuda:
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")) * 1000.0
    fn()
    samples = []
    for _ in range(cpu_reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def kernel_times_us(fn: Callable[[], object], calls: int = 20) -> dict[str, float]:
    """Device time per call of each kernel ``fn`` launches (CUDA only; torch.profiler over ``calls`` eager calls after
    one untimed), by kernel name, largest first: where a launch sequence's time goes."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time / calls
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def host_time_us(fn: Callable[[], object], reps: int) -> list[float]:
    """Host-side wall time of each call, microseconds."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def copy_bandwidth_bytes_per_s(cuda: bool, nbytes: int = 1 << 30) -> float:
    """Measured device-to-device copy bandwidth (bytes read + written per second)."""
    if not cuda:
        nbytes = 1 << 24
    dev = "cuda" if cuda else "cpu"
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).uniform_()
    dst = torch.empty_like(src)
    us = device_time_us(lambda: dst.copy_(src), cuda=cuda)
    return 2 * nbytes / (us * 1e-6)


def peak_extra_memory_bytes(fn: Callable[[], object], cuda: bool) -> int | None:
    """Peak memory allocated by ``fn`` beyond what was allocated before it (CUDA only)."""
    if not cuda:
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - base)
