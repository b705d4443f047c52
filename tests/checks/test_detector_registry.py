"""The detector registry (`runnercheck.checks.detectors.registry`): a detector registered in-process
-- here a toy that flags steps with more requests than a planted limit -- is armed by the run
owner, fails the run, stops a stop-on-sync run, and shows up in summary.json/md, the terminal,
JUnit, the pytest plugin and the mutant catalogue without a change to any of them (the
walkthrough in docs/EXTENDING.md, "Adding a detector")."""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from runnercheck.checks.detectors import registry
from runnercheck.checks.detectors.base import (
    ArmContext,
    BaseDetector,
    Detector,
    DetectorResult,
    DetectorResultError,
)
from runnercheck.impl.model.weights import preset
from runnercheck.stress.run.config import RunConfig, default_limits
from runnercheck.stress.run.harness import ChurnOps, checked_run
from runnercheck.stress.sim.scheduler import SchedulerConfig

STEPS = 4


class _ArmedBatchLimit:
    def __init__(self, runner: Any, limit: int):
        self.limit, self.steps = limit, []
        self.runner, self.original = runner, runner.execute_model

        def execute_model(sched: Any) -> Any:
            if len(sched.num_scheduled_tokens) > self.limit:
                self.steps.append(f"step {sched.step_id}: {len(sched.num_scheduled_tokens)} requests > {self.limit}")
            return self.original(sched)

        runner.execute_model = execute_model

    def disarm(self) -> None:
        self.runner.execute_model = self.original

    def fired(self) -> str | None:
        return self.steps[0] if self.steps else None

    def result(self) -> DetectorResult:
        return DetectorResult(checked=True, violations=len(self.steps), lines=self.steps[:5], extra={"limit": self.limit})


class BatchLimitDetector(BaseDetector):
    """The toy: a step that schedules more than ``limit`` requests is a finding (limit 0: every step with work)."""

    name = "batch_limit"
    label = "batch size limit"
    noun = "over-full batch(es)"
    tag = "BATCH LIMIT"
    column = "batch"

    def __init__(self, limit: int):
        self.limit = limit

    def arm(self, runner: Any, context: ArmContext) -> _ArmedBatchLimit:
        return _ArmedBatchLimit(runner, self.limit)


def _config() -> RunConfig:
    model = preset("micro")
    return RunConfig(0, STEPS, "sim", "micro", model, default_limits(model), SchedulerConfig(1, 0.0),
                     {"name": "run-immediately"}, None, None, "runnercheck.stress.run.runners:simple_runner")


def _register(monkeypatch: pytest.MonkeyPatch, limit: int) -> BatchLimitDetector:
    toy = BatchLimitDetector(limit)
    monkeypatch.setattr(registry, "DETECTORS", registry.DETECTORS + (toy,))
    return toy


@pytest.fixture(scope="module")
def planted_findings() -> Any:
    """One run with the toy registered at limit 0 (the planted condition: every step with work is over-full)."""
    with pytest.MonkeyPatch.context() as mp:
        _register(mp, 0)
        return checked_run(_config(), ChurnOps(), name="planted")


def test_the_protocol_and_the_registry_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert all(isinstance(d, Detector) for d in registry.registered())
    assert registry.names() == ("sync", "lifetime", "provenance", "csan", "memory")
    with pytest.raises(registry.DetectorRegistryError, match="registered: sync, lifetime"):
        registry.find("nope")
    monkeypatch.setattr(registry, "DETECTORS", registry.DETECTORS + (BatchLimitDetector(0), BatchLimitDetector(1)))
    with pytest.raises(registry.DetectorRegistryError, match="unique"):
        registry.registered()


@pytest.mark.parametrize("bad", [dict(checked=1), dict(checked=True, violations=-1), dict(checked=True, lines="x"),
                                 dict(checked=True, extra=[])])
def test_a_malformed_result_is_a_typed_error(bad: dict) -> None:
    with pytest.raises(DetectorResultError):
        DetectorResult(**bad)
    with pytest.raises(DetectorResultError):
        DetectorResult.from_dict({"checked": True})


def test_a_clean_toy_is_armed_and_reported_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    _register(monkeypatch, 10**6)
    findings = checked_run(_config(), ChurnOps(), name="clean")
    assert findings.passed and findings.detectors["batch_limit"] == DetectorResult(True, 0, [], {"limit": 10**6})


def test_without_the_registry_line_the_planted_condition_goes_unseen() -> None:
    findings = checked_run(_config(), ChurnOps(), name="unregistered")
    assert findings.passed and "batch_limit" not in findings.detectors


def test_the_planted_condition_fails_the_run(planted_findings: Any) -> None:
    toy = planted_findings.detectors["batch_limit"]
    assert not planted_findings.passed and planted_findings.result.ok  # the toy alone failed it
    assert toy.violations > 0 and toy.lines[0].startswith("step ") and planted_findings.violations("batch_limit") == toy.violations
    assert list(planted_findings.detectors)[-1] == "batch_limit"  # registry order


def test_a_firing_toy_stops_a_stop_on_sync_run(monkeypatch: pytest.MonkeyPatch) -> None:
    _register(monkeypatch, 0)
    findings = checked_run(dataclasses.replace(_config(), steps=50), ChurnOps(), name="stop", stop_on_sync=True)
    assert findings.stopped_on_sync and findings.result.ticks < 50


def test_it_reaches_summary_json_and_md_without_touching_them(planted_findings: Any, monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path) -> None:
    from runnercheck.stress.report.summary import RunRecord, build_summary, load_summary, render_markdown, write_report

    _register(monkeypatch, 0)  # rendering looks the label up by name
    doc = build_summary([RunRecord.from_findings(planted_findings)], {"status": "skipped", "passed": None}, device="sim",
                        seed=0, runner="r:f", model="micro", quick=True, elapsed_s=1.0)
    write_report(tmp_path, doc)
    doc = load_summary(tmp_path / "summary.json")
    toy = planted_findings.detectors["batch_limit"]
    assert doc["passed"] is False and doc["detectors"]["batch_limit"] == {"violations": toy.violations, "runs_checked": 1, "runs": 1}
    assert doc["runs"][0]["detectors"]["batch_limit"]["lines"] == toy.lines
    md = render_markdown(doc)
    assert f"| batch size limit | {toy.violations} over-full batch(es) |" in md and "| batch |" in md
    assert f"- batch limit: `{toy.lines[0]}`" in md


def test_it_reaches_junit_the_terminal_and_the_plugin(planted_findings: Any, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    from runnercheck.stress import pytest_plugin
    from runnercheck.stress.report import render
    from runnercheck.stress.report.junit_cases import verify_cases
    from runnercheck.stress.report.summary import RunRecord, build_summary
    from runnercheck.stress.run import isolation

    _register(monkeypatch, 0)
    toy = planted_findings.detectors["batch_limit"]
    record = RunRecord.from_findings(planted_findings)
    doc = build_summary([record], {"status": "skipped", "passed": None}, device="sim", seed=0, runner="r:f",
                        model="micro", quick=True, elapsed_s=1.0)
    case = verify_cases(doc)[0]
    assert case.failure == f"{toy.violations} over-full batch(es): {toy.lines[0]}"
    assert f"over-full batch(es): {toy.lines[0]}" in render.run_line(record)
    render.print_divergence(planted_findings)
    render.print_verify_summary(doc, [])
    printed = capsys.readouterr().out
    assert f"BATCH LIMIT {toy.lines[0]}" in printed and f"BATCH LIMIT planted: {toy.lines[0]}" in printed
    assert f"batch size limit: {toy.violations} over-full batch(es)" in printed

    monkeypatch.setattr(isolation, "isolated_run", lambda *a, **k: planted_findings)  # the plugin's run, already done
    _, lines = pytest_plugin.checked_differential_run("runnercheck.stress.run.runners:simple_runner", kind="sim", seed=0,
                                                      steps=STEPS, model="micro", repro_dir=None)
    assert lines == [f"batch size limit: {toy.violations} over-full batch(es): {toy.lines[0]}"]


def test_mutants_name_it_and_its_kill_is_recorded(planted_findings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from runnercheck.stress.cli.mutants_cmd import checked_differential
    from runnercheck.stress.mutants.registry import Mutant, known_checks
    from runnercheck.stress.run import harness

    def mutant() -> Mutant:
        return Mutant("toy", "state", "a planted over-full batch", ("batch_limit",), "steady", lambda r, m: None, ())

    with pytest.raises(ValueError, match="unknown: batch_limit"):  # not registered: the catalogue refuses the name
        mutant()
    _register(monkeypatch, 0)
    assert mutant().checks == ("batch_limit",) and "batch_limit" in known_checks()
    monkeypatch.setattr(harness, "checked_run", lambda *a, **k: planted_findings)
    outcome = checked_differential(_config(), ChurnOps(), "toy", isolate=False)
    assert "batch_limit" in outcome.ran and outcome.fired == {
        "batch_limit": f"{planted_findings.detectors['batch_limit'].violations} over-full batch(es): "
                       f"{planted_findings.detectors['batch_limit'].lines[0]}"}
