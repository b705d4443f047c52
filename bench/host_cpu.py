"""Host CPU per step, every thread of it: the `host_cost` benchmark's CPU-time accounting (issue 61).

A step's wall time inside ``execute_model`` leaves out the device's launch thread (`runnercheck.impl.launcher`),
which polls on a core of its own between steps.  Here each runner step is charged the CPU time of the thread that
called ``execute_model`` (``time.thread_time``, a per-thread CPU clock, around the call) plus the launch thread's
CPU time over the step's period (its per-thread CPU clock, `LaunchThread.cpu_seconds`, read at each step's start:
its polling after the step and its wake-up for the next are the step's).  The V1-style baseline has no other
thread: its caller's CPU time is its total.
"""
from __future__ import annotations

import statistics
import time

from runnercheck.bench.common import Row

HOST_CPU_TARGET = 0.5  # issue 61: total host CPU per step <= 1/2 of the baseline's (1% churn, 64 and 256 requests)


class StepCpu:
    """CPU seconds per step of the calling thread, and of the launch thread (``launcher``; None: there is none) over
    each step's period.  `begin` / `end` around each step, `finish` once after the last."""

    def __init__(self, launcher=None):
        self.launcher = launcher
        self.caller: list[float] = []
        self._marks: list[float] = []  # the launch thread's CPU clock at each step's start, then at finish

    def begin(self) -> float:
        if self.launcher is not None:
            self._marks.append(self.launcher.cpu_seconds())
        return time.thread_time()

    def end(self, began: float) -> None:
        self.caller.append(time.thread_time() - began)

    def finish(self) -> None:
        if self.launcher is not None and len(self._marks) == len(self.caller):
            self._marks.append(self.launcher.cpu_seconds())

    def worker(self) -> list[float]:
        """The launch thread's CPU seconds per step period (zeros without one)."""
        if self.launcher is None:
            return [0.0] * len(self.caller)
        return [b - a for a, b in zip(self._marks, self._marks[1:])]

    def totals(self) -> list[float]:
        return [c + w for c, w in zip(self.caller, self.worker())]


def _us(seconds: list[float]) -> float:
    return 1e6 * statistics.median(seconds) if seconds else float("nan")


def host_cpu_rows(tag: str, churn: float, paired: StepCpu, baseline_cpu: list[float], alone: StepCpu, *,
                  targeted: bool) -> list[Row]:
    """The rows: the runner's total host CPU per step (caller + launch thread), the baseline's, and their ratio with
    issue 61's target at 1% churn (``targeted``: the run counts, i.e. cuda and not quick)."""
    total, base = _us(paired.totals()), _us(baseline_cpu)
    ratio = total / base if base else float("nan")
    has_thread = paired.launcher is not None
    return [
        Row("host_cost", f"runner host CPU per step, caller + launch thread, {tag}", total, "us",
            note=f"medians over the interleaved steps: caller thread {_us(paired.caller):.0f} us, launch thread "
                 f"{_us(paired.worker()):.0f} us ({'on' if has_thread else 'off'}); the steps alone, right after: "
                 f"{_us(alone.totals()):.0f} us (caller {_us(alone.caller):.0f}, launch thread {_us(alone.worker()):.0f}); "
                 "per-thread CPU clocks"),
        Row("host_cost", f"V1-style baseline host CPU per step, {tag}", base, "us",
            note="the caller thread's CPU time in prepare+upload (it has no other thread)"),
        Row("host_cost", f"runner / baseline host CPU per step, all threads, {tag}", ratio, "x",
            target=f"<= {HOST_CPU_TARGET} (issue 61)" if churn > 0 else None,
            met=(ratio <= HOST_CPU_TARGET) if (targeted and churn > 0) else None,
            note="compare with the execute_model host time ratio (target <= 0.333): this one counts the launch "
                 "thread's polling too"),
    ]


__all__ = ["HOST_CPU_TARGET", "StepCpu", "host_cpu_rows"]
