"""Race drivers for `runnercheck verify`: churn that reuses rows quickly, and a GPU made to lag.

On ``sim`` the device's seeded lag policy (`runnercheck.impl.device`) decides how far queued work trails the
host.  On ``cuda`` the only way to make a real GPU trail the host is to give it more to do than
the host: before each step's device work the driver enqueues ``device.inject_delay(us)`` (a
``torch.cuda._sleep`` spin kernel on the runner's stream).  When the mean delay exceeds the host's
time per scheduler tick, the GPU falls further behind every tick until the host blocks on the
oldest output it must read -- so the GPU runs as many steps behind as the scheduler keeps in
flight (``max_inflight_steps``), while finished and preempted requests free their rows and new
ones take them over.  Delays are random (seeded), so the lag varies and the GPU sometimes
catches up.

The delay is recorded as a ``random-delay`` policy (`runnercheck.stress.run.config.RandomDelay`), the
``delay_policy`` field of a repro file, so `runnercheck replay` re-applies it.

`calibrate_cuda_delay` turns a measured host tick into that policy; `measure_host_tick_us` measures
it with a short warm-up run (which also compiles the Triton kernels before the timed runs).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Sequence

from runnercheck.stress.sim.churn import Churn, ChurnConfig
from runnercheck.stress.run.driver import DifferentialRun
from runnercheck.stress.run.harness import build_session
from runnercheck.stress.run.config import RandomDelay, RunConfig, TargetedDelay

# Short, frequent requests with frequent aborts and preemptions: rows are freed and re-admitted
# every few ticks, the pattern in which a stale row or staging buffer gets read.
RACE_CHURN = ChurnConfig(
    add_prob=0.8, max_adds_per_tick=2, max_unfinished=10, abort_prob=0.12, preempt_prob=0.15,
    max_prompt_len=16, max_new_tokens=10, param_plan=True,
)

# The host's tick is multiplied by this on average on the GPU: > 1 means the GPU always falls behind.
DEFAULT_LAG_FACTOR = 2.0
# Delays are drawn for this share of steps; the others let the GPU catch up a little.
DEFAULT_DELAY_PROB = 0.85


def calibrate_cuda_delay(seed: int, host_tick_us: float, *, lag_factor: float = DEFAULT_LAG_FACTOR,
                         p: float = DEFAULT_DELAY_PROB, targets: Sequence[str] | None = None) -> dict:
    """A ``random-delay`` policy whose mean delay per step is ``lag_factor`` host ticks; with
    ``targets``, a ``targeted-delay`` policy with the same draw before each targeted reader.

    Both draw ``uniform(0, max_us)`` with probability ``p``, a mean of ``p * max_us / 2`` (per step,
    or per reader of a target: about one per step each).
    """
    if not host_tick_us > 0:
        raise ValueError(f"host_tick_us must be > 0, got {host_tick_us!r}")
    if not lag_factor > 0 or not 0 < p <= 1:
        raise ValueError(f"need lag_factor > 0 and p in (0, 1], got {lag_factor!r}, {p!r}")
    max_us = 2.0 * lag_factor * host_tick_us / p
    if targets is not None:
        return TargetedDelay(seed, round(max_us, 1), p, targets).describe()
    return RandomDelay(seed, round(max_us, 1), p).describe()


def measure_host_tick_us(config: RunConfig, ticks: int = 12, churn: ChurnConfig = RACE_CHURN) -> float:
    """Median wall time of one scheduler tick (runner step + oracle + scheduling) without delays.

    The median skips the first ticks' kernel compilation on cuda; CSAN is left off (it slows every op).
    """
    session = build_session(replace(config, csan=False))
    stamps: list[float] = []
    churn_ops = Churn(config.limits, config.seed, churn)

    def before_tick(tick: int, scheduler) -> None:
        stamps.append(time.perf_counter())
        churn_ops(tick, scheduler)

    DifferentialRun(session.runner, session.oracle, session.scheduler, before_tick=before_tick).run(ticks)
    stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return 1e6 * statistics.median(gaps) if gaps else 0.0


__all__ = ["RACE_CHURN", "DEFAULT_LAG_FACTOR", "DEFAULT_DELAY_PROB", "calibrate_cuda_delay", "measure_host_tick_us"]
