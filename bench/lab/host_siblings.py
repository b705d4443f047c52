"""Which of this machine's CPUs slow a Python loop on another when they compute: hidden SMT siblings.

    python -m runnercheck.bench.lab.host_siblings [--cpu 0] [--out FILE.json]

A lent VM can present two hyperthreads of one physical core as two cores with one thread each (`lscpu` then
says nothing).  The runner's launch thread polls on one CPU while the step's Python runs on another; if the two
are siblings, the poll takes execution slots from the step.  This pins a timed Python loop to ``--cpu`` and, in
turn, a busy loop to each other CPU, and reports the timed loop's slowdown against no competitor (medians of
alternating rounds: the host's speed drifts).  A sibling -- two busy hyperthreads share one core's execution
units -- shows as a slowdown well above the rest; no outlier means the CPUs the guest sees do not share cores.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

from runnercheck.bench.common import print_and_write_json

ROUNDS = 5
# A lent host's own speed drifts between rounds (the H200 host of run 106 read 0.70-1.11x with no sibling at all), so a
# CPU just above the margin is a hint to re-run, not a verdict.
SIBLING_MARGIN = 1.15


def _busy(cpu: int, stop) -> None:
    os.sched_setaffinity(0, {cpu})
    while not stop.is_set():
        for _ in range(10000):
            pass


def _timed_loop_us() -> float:
    start = time.perf_counter()
    total = 0
    for i in range(200_000):
        total += i & 7
    return (time.perf_counter() - start) * 1e6


def measure(cpu: int) -> dict[str, object]:
    """The timed loop's median on ``cpu`` with each other CPU busy, divided by its median with none busy."""
    allowed = os.sched_getaffinity(0)
    others = sorted(allowed - {cpu})
    os.sched_setaffinity(0, {cpu})
    try:
        alone: list[float] = []
        beside: dict[int, list[float]] = {other: [] for other in others}
        ctx = multiprocessing.get_context("fork")
        for _ in range(ROUNDS):
            for other in others:
                alone.append(min(_timed_loop_us() for _ in range(3)))
                stop = ctx.Event()
                competitor = ctx.Process(target=_busy, args=(other, stop), daemon=True)
                competitor.start()
                time.sleep(0.02)  # let it start spinning
                beside[other].append(min(_timed_loop_us() for _ in range(3)))
                stop.set()
                competitor.join()
    finally:
        os.sched_setaffinity(0, allowed)
    base = statistics.median(alone)
    slowdown = {other: round(statistics.median(times) / base, 3) for other, times in beside.items()}
    return {"cpu": cpu, "loop_us_alone": round(base, 1), "slowdown_beside": {str(k): v for k, v in slowdown.items()},
            "typical_slowdown": round(statistics.median(slowdown.values()), 3) if slowdown else 1.0,
            "likely_siblings": likely_siblings(slowdown)}


def likely_siblings(slowdown: dict[int, float], margin: float = SIBLING_MARGIN) -> list[int]:
    """The CPUs whose busy loop slowed the timed one by ``margin`` more than the typical (median) CPU did."""
    if not slowdown:
        return []
    typical = statistics.median(slowdown.values())
    return sorted(cpu for cpu, ratio in slowdown.items() if ratio > typical * margin)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", type=int, default=0, help="the CPU the timed loop runs on")
    parser.add_argument("--out", help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.cpu not in os.sched_getaffinity(0):
        parser.error(f"--cpu {args.cpu}: not one of this process's CPUs {sorted(os.sched_getaffinity(0))}")
    print_and_write_json(measure(args.cpu), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
