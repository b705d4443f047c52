"""`runnercheck bench --only host_cost`'s host CPU per step (`runnercheck.bench.host_cpu`): each runner step is charged
its caller thread's CPU time and the launch thread's over its period; the rows exist and their CPU figures are
positive in a small CPU run.  No speed is asserted: the target is the H200's (docs/BENCHMARKS.md)."""
from __future__ import annotations

import time

import pytest

from runnercheck.bench.host_cpu import HOST_CPU_TARGET, StepCpu, host_cpu_rows


class FakeLauncher:
    """A launch thread whose CPU clock reads the given values in turn."""

    def __init__(self, readings: list[float]):
        self._readings = iter(readings)

    def cpu_seconds(self) -> float:
        return next(self._readings)


def _spin(seconds: float) -> None:
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_a_step_is_charged_its_callers_cpu_and_the_launch_threads_over_its_period():
    cpu = StepCpu(FakeLauncher([1.0, 1.25, 2.0]))  # the worker's clock at each step's start, then at finish
    for _ in range(2):
        began = cpu.begin()
        _spin(0.002)
        cpu.end(began)
    cpu.finish()
    assert cpu.worker() == [0.25, 0.75]
    assert all(c >= 0.002 for c in cpu.caller)
    assert cpu.totals() == [c + w for c, w in zip(cpu.caller, [0.25, 0.75])]
    alone = StepCpu()  # no launch thread: the caller's time alone
    alone.end(alone.begin())
    alone.finish()
    assert alone.worker() == [0.0] and alone.totals() == alone.caller


@pytest.mark.parametrize("churn, targeted", [(0.01, True), (0.01, False), (0.0, True)])
def test_the_ratio_row_carries_issue_61s_target_at_1_percent_churn(churn, targeted):
    paired = StepCpu()
    paired.caller = [100e-6, 120e-6, 110e-6]
    rows = host_cpu_rows("64 decode reqs", churn, paired, [400e-6, 500e-6, 450e-6], paired, targeted=targeted)
    total, base, ratio = rows
    assert total.value == pytest.approx(110) and base.value == pytest.approx(450)
    assert ratio.value == pytest.approx(110 / 450)
    assert (ratio.target is not None) == (churn > 0)
    assert ratio.met == ((ratio.value <= HOST_CPU_TARGET) if (targeted and churn > 0) else None)


def test_host_cost_on_cpu_reports_positive_host_cpu_per_step_for_runner_and_baseline():
    from runnercheck.bench.case_runner import bench_host_cost
    from runnercheck.bench.common import BenchContext
    from runnercheck.impl.device import Device

    rows = bench_host_cost(BenchContext(Device("cpu", seed=0), quick=True))
    by_name = {r.name: r for r in rows}
    for churn in ("1%", "0%"):
        tag = f"4 decode reqs, {churn} churn"
        total = by_name[f"runner host CPU per step, caller + launch thread, {tag}"]
        base = by_name[f"V1-style baseline host CPU per step, {tag}"]
        ratio = by_name[f"runner / baseline host CPU per step, all threads, {tag}"]
        assert total.value > 0 and base.value > 0 and ratio.value > 0
        assert total.unit == base.unit == "us"
        assert f"runner execute_model host time, {tag} (device work dropped)" in by_name  # beside the wall time
        assert ratio.met is None  # a quick CPU run claims nothing
    assert by_name["runner / baseline host CPU per step, all threads, 4 decode reqs, 1% churn"].target == "<= 0.5 (issue 61)"
