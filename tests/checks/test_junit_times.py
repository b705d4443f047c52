"""JUnit cases carry their own measured wall time: chi-square tests, the calibration, planted biases,
verify's runs and statistics, mutants over seeds; a suite's time is its command's when given."""
from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from pathlib import Path

from runnercheck.checks.chisq import draws as chisq_draws
from runnercheck.checks.chisq import execute as chisq_execute
from runnercheck.checks.chisq import plan as chisq_plan
from runnercheck.checks.chisq import run as chisq
from runnercheck.checks.junit import JUnitCase, write_junit
from runnercheck.checks.chisq.report import junit_cases, write_chisq_junit
from runnercheck.checks.chisq.samplers import load_sampler

SLOW_CASE, SLOW_S = "temperature-2-v97", 0.2


def _times(path: Path) -> dict[str, float]:
    return {c.get("name"): float(c.get("time")) for c in ET.parse(path).getroot().iter("testcase")}


def test_chisq_cases_carry_their_own_wall_time(tmp_path: Path, monkeypatch) -> None:
    real_draw = chisq_draws.draw

    def slow_for_one_case(sampler, case, **kwargs):  # a sampler that is slow on one case only
        if case.name == SLOW_CASE:
            time.sleep(SLOW_S)
        return real_draw(sampler, case, **kwargs)

    monkeypatch.setattr(chisq_execute, "draw", slow_for_one_case)  # where the run looks it up
    opts = chisq_plan.RunOptions(quick=True, device="cpu", samples=300, case_filter="temperature-", calibration_runs=2,
                            power_repeats=1, biases=("temperature-twice",), spec=False)
    summary = chisq.run_all(load_sampler("torch"), opts, show_progress=False)
    times = _times(write_chisq_junit(tmp_path / "chisq.xml", summary))
    assert len(times) == len(summary.tests) + 2  # every test, the calibration, the planted bias
    assert all(t > 0 for t in times.values()), times
    slow = sum(t for name, t in times.items() if name.startswith(SLOW_CASE))
    fast = [t for name, t in times.items() if name.startswith("temperature-") and not name.startswith(SLOW_CASE)]
    assert slow >= SLOW_S > max(fast)
    assert abs(times[f"calibration/{summary.calibration.config_name}"] - summary.calibration.elapsed_s) < 1e-3
    suite = ET.parse(tmp_path / "chisq.xml").getroot().find("testsuite")
    assert suite.get("name") == "runnercheck chisq" and abs(float(suite.get("time")) - summary.elapsed_s) < 1e-3
    assert [c.time_s for c in junit_cases(summary)][: len(summary.tests)] == [t.elapsed_s for t in summary.tests]


def test_a_suite_takes_its_commands_wall_time_when_given(tmp_path: Path) -> None:
    cases = [JUnitCase("a", "c", 2.0), JUnitCase("b", "c", 3.0)]  # two runs side by side
    summed = ET.parse(write_junit(tmp_path / "s.xml", "runnercheck verify", cases)).getroot()
    wall = ET.parse(write_junit(tmp_path / "w.xml", "runnercheck verify", cases, elapsed_s=3.2)).getroot()
    assert summed.get("time") == "5.000" and wall.get("time") == wall.find("testsuite").get("time") == "3.200"


def test_verify_cases_time_the_runs_and_the_statistics() -> None:
    from runnercheck.stress.report.junit_cases import verify_cases
    from runnercheck.stress.report.summary import RunRecord, build_summary

    record = RunRecord(name="r", seed=0, lag_policy=None, delay_policy=None, scheduler={}, ticks=3, steps=3, requests=1,
                       finished=0, tokens_compared=3, logprobs_compared=0, ties=0, elapsed_s=2.5)
    chisq_section = {"status": "ran", "passed": True, "elapsed_s": 7.25,
                     "samplers": [{"sampler": "gumbel", "role": "reference", "scope": "2 cases", "status": "ran", "passed": True}]}
    doc = build_summary([record], chisq_section, device="sim", seed=0, runner="r:f", model="micro", quick=True,
                        elapsed_s=10.0)
    times = {c.name: c.time_s for c in verify_cases(doc)}
    assert times == {"r (seed 0)": 2.5, "coverage": 0.0, "sampler statistics": 7.25}


def test_kill_rates_sum_each_mutants_time_over_the_seeds() -> None:
    from runnercheck.stress.report.junit_cases import rates_cases
    from runnercheck.stress.mutants.rates import kill_rates
    from runnercheck.stress.mutants.report import ControlResult, MutantResult, MutantsReport

    def report(seed: int, seconds: float) -> MutantsReport:
        mutant = MutantResult(name="m", cls="race", description="", needs_gpu=False, designed=["differential"], workload="w",
                              status="killed", killed=True, killed_by=["differential"], as_designed=True,
                              checks_run=["differential"], evidence={}, ticks=4, seconds=seconds)
        control = ControlResult(kind="workload", name="w", fired={}, ticks=4, seconds=seconds / 2)
        return MutantsReport(device="sim", quick=True, seed=seed, chisq=False, command="", date="", mutants=[mutant],
                             controls=[control], elapsed_s=seconds)

    times = {c.name: c.time_s for c in rates_cases(kill_rates([report(0, 1.5), report(1, 2.5)]))}
    assert times == {"m": 4.0, "control workload w": 2.0}


def test_speculative_cases_and_biases_carry_their_own_wall_time(monkeypatch) -> None:
    from runnercheck.checks.chisq import spec as chisq_spec

    real_draw = chisq_spec.draw_spec

    def slow(case, verifier, **kwargs):
        time.sleep(SLOW_S)
        return real_draw(case, verifier, **kwargs)

    monkeypatch.setattr(chisq_spec, "draw_spec", slow)
    case = chisq_spec.build_spec_cases(True)[0]
    results = chisq_spec.run_spec_cases(chisq_spec.default_spec_verifier("cpu"), quick=True, seed=0, alpha=0.01,
                                        correction="holm", samples=500, case_filter=case.name)
    assert len(results) > 1 and sum(r.elapsed_s for r in results) >= SLOW_S  # the case's time, shared by its tests
    assert len({r.elapsed_s for r in results}) == 1
    bias = next(iter(chisq_spec.SPEC_BIASES))
    [power] = chisq_spec.run_spec_power(quick=True, seed=0, alpha=0.01, repeats=1, biases=(bias,))
    assert power.elapsed_s >= SLOW_S
