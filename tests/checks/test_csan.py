"""CUDA's stream sanitizer as a run mode (`runnercheck.checks.detectors.csan`, ``--csan``): the plumbing, on CPU.

CSAN itself needs CUDA; what is tested here is everything around it: the one ``--csan`` rule and its
usage error off cuda (before any work), the monitor's recording hook on CSAN's own race logic
(`torch.cuda._sanitizer.EventHandler`, which is plain Python), and a CSAN report injected into a
real sim run becoming a ``csan`` finding in `Findings`, summary.json, JUnit and the mutants matrix.
The real thing (the mutant killed by CSAN on an H200, the control clean) is the gpu test at the end.
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest
import torch
from torch.cuda import _sanitizer as torch_csan

from runnercheck.checks.detectors.csan import CsanMonitor, CsanUnavailableError, race_from_error
from runnercheck.impl.model.weights import preset
from runnercheck.stress.cli import main as cli
from runnercheck.stress.cli.options import CsanDeviceError, resolve_csan
from runnercheck.stress.run.config import RunConfig, RunSetupError, default_limits
from runnercheck.stress.sim.scheduler import SchedulerConfig

MUTANT = "runner_stream_reads_default_stream_write"
MM = torch.ops.aten.mm.default._schema
COPY = torch.ops.aten.copy_.default._schema


def _config(device: str = "sim", steps: int = 6, **kw) -> RunConfig:
    model = preset("micro")
    lag = {"name": "run-immediately"} if device == "sim" else None
    return RunConfig(0, steps, device, "micro", model, default_limits(model), SchedulerConfig(1, 0.0), lag, None, None,
                     "runnercheck.impl.runner:make_runner", **kw)


# --------------------------------------------------------------------------- the option and its one rule


def test_csan_is_a_shared_option_of_stress_verify_and_chisq_only():
    import importlib

    for name in ("stress", "verify", "chisq", "mutants", "bench"):
        parser = cli.command_parser(name, importlib.import_module(cli.COMMANDS[name].module))
        has = any("--csan" in a.option_strings for a in parser._actions)
        assert has == (name in ("stress", "verify", "chisq")), name


@pytest.mark.parametrize("argv", [["verify", "--device", "cpu", "--csan"], ["stress", "--device", "sim", "--csan"],
                                  ["chisq", "--device", "cpu", "--csan", "--out", "OUT"], ["stress", "--csan"]])
def test_csan_off_cuda_is_a_usage_error_before_any_work(argv, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [str(out) if a == "OUT" else a for a in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"runnercheck {argv[0]}: --csan needs --device cuda"), err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_resolve_csan_is_the_one_rule():
    assert resolve_csan(True, "cuda") is True
    assert resolve_csan(False, "sim") is False
    for kind in ("sim", "cpu"):
        with pytest.raises(CsanDeviceError, match="--csan needs --device cuda"):
            resolve_csan(True, kind)


def test_a_csan_run_config_off_cuda_is_refused_and_the_repro_field_is_optional():
    with pytest.raises(RunSetupError, match="--csan needs --device cuda"):
        _config("sim", csan=True)
    plain, sanitized = _config("cuda"), _config("cuda", csan=True)
    assert "csan" not in plain.to_body()  # repros recorded before --csan keep their fields and checksum
    assert sanitized.to_body()["csan"] is True
    assert RunConfig.from_body(sanitized.to_body()).csan and not RunConfig.from_body(plain.to_body()).csan


def test_the_monitor_cannot_arm_without_cuda():
    monitor = CsanMonitor()
    with pytest.raises(CsanUnavailableError, match="--csan needs --device cuda"):
        monitor.arm()
    assert not monitor.armed and not torch_csan.cuda_sanitizer.enabled


# --------------------------------------------------------------------------- the report path


def _launch(handler, stream: int, *, reads=(), writes=(), op=MM):
    ptrs = set(reads) | set(writes)
    return handler._handle_kernel_launch(stream, set(reads) - set(writes), set(writes), set(), op,
                                         {p: ["self"] for p in ptrs})


def _handler_with_streams():
    handler = torch_csan.EventHandler()  # CSAN's own bookkeeping: pure Python, no CUDA needed
    for stream in (1, 2):
        handler._handle_stream_creation(stream)
    handler._handle_memory_allocation(0x1000)
    return handler


def test_the_monitor_records_what_csan_would_raise_and_the_op_returns():
    handler = _handler_with_streams()
    monitor = CsanMonitor()
    monitor._attach(handler)
    assert _launch(handler, 1, writes=[0x1000], op=COPY) == []  # the default stream writes the weights
    assert _launch(handler, 2, reads=[0x1000]) == []  # the runner stream reads them with no wait: CSAN's race, recorded
    assert monitor.count == 1 and len(monitor.races) == 1
    race = monitor.races[0]
    assert (race.data_ptr, race.stream, race.previous_stream) == (0x1000, 2, 1)
    assert (race.operator, race.previous_operator) == ("aten::mm", "aten::copy_")
    assert (race.access, race.previous_access) == ("reading from", "writing to")
    assert "test_csan.py" in race.site and "_launch" in race.site  # the innermost frame outside torch
    assert "0x1000" in race.line() and "CSAN detected a possible data race" in race.text
    monitor.disarm()
    assert len(_launch(handler, 2, reads=[0x1000])) == 1  # disarmed: CSAN's own handler (which raises) is back


def test_an_ordering_wait_is_clean_for_csan():
    """What ``Device._stream_waits_for_current`` does (stream.wait_stream: record an event, wait on it)."""
    handler = _handler_with_streams()
    monitor = CsanMonitor()
    monitor._attach(handler)
    _launch(handler, 1, writes=[0x1000], op=COPY)
    handler._handle_event_creation(7)
    handler._handle_event_record(7, 1)
    handler._handle_event_wait(7, 2)
    _launch(handler, 2, reads=[0x1000])
    monitor.disarm()
    assert monitor.count == 0 and monitor.summary() is None


def test_races_beyond_the_limit_are_counted_not_kept():
    handler = _handler_with_streams()
    monitor = CsanMonitor(limit=2)
    monitor._attach(handler)
    _launch(handler, 1, writes=[0x1000], op=COPY)
    for _ in range(5):
        _launch(handler, 2, reads=[0x1000])
        _launch(handler, 1, writes=[0x1000], op=COPY)
    monitor.disarm()
    assert monitor.count >= 5 and len(monitor.races) == 2


def _race_error(ptr: int = 0xBEEF):
    """An `UnsynchronizedAccessError` as CSAN builds it (the report injected into a run)."""
    import traceback

    stack = traceback.StackSummary.extract(traceback.walk_stack(None), lookup_lines=False)
    stack.reverse()
    now = torch_csan.Access(torch_csan.AccessType.READ, 9, 2, MM, ["self"], False, stack)
    before = torch_csan.Access(torch_csan.AccessType.WRITE, 3, 1, COPY, ["self"], True, stack)
    return torch_csan.UnsynchronizedAccessError(ptr, stack, now, before)


def _inject_on(monkeypatch) -> list:
    """Sim runs whose sessions carry a monitor (unarmed: no CUDA) for the test to hand CSAN reports to."""
    import runnercheck.stress.run.harness as harness

    monitors: list[CsanMonitor] = []
    build = harness.build_session

    def build_with_monitor(config):
        session = build(config)
        session.csan = CsanMonitor()
        monitors.append(session.csan)
        return session

    monkeypatch.setattr(harness, "build_session", build_with_monitor)
    return monitors


def test_an_injected_csan_report_is_a_csan_finding_in_findings_summary_and_junit(monkeypatch, tmp_path):
    from runnercheck.stress.run.harness import ChurnOps, checked_run
    from runnercheck.stress.report.junit_cases import verify_cases, write_cases
    from runnercheck.stress.report.summary import RunRecord, build_summary, validate_summary

    monitors = _inject_on(monkeypatch)

    def on_tick(tick: int) -> None:
        if tick == 2:
            monitors[0].record([_race_error()])

    findings = checked_run(_config(), ChurnOps(), name="injected", on_tick=on_tick, stop_on_sync=True)
    csan = findings.detectors["csan"]
    assert csan.checked and csan.violations == 1 and not findings.passed
    assert findings.result.ok  # the run itself was fine: only the csan check fired, and it stopped the run there
    assert findings.stopped_on_sync and findings.result.ticks <= 4
    assert "0xbeef" in csan.lines[0] and "aten::mm" in csan.lines[0]
    assert "CSAN detected a possible data race" in csan.extra["reports"][0]
    record = RunRecord.from_findings(findings)
    doc = build_summary([record], {"status": "skipped"}, device="sim", seed=0, runner="r", model="micro", quick=True,
                        elapsed_s=1.0)
    validate_summary(doc)
    assert doc["detectors"]["csan"]["violations"] == 1 and not doc["passed"] and doc["runs"][0]["detectors"]["csan"]["lines"] == csan.lines
    json.dumps(doc)
    path = write_cases(tmp_path / "v.xml", "runnercheck verify", verify_cases(doc))
    case = next(ET.parse(path).getroot().iter("testcase"))
    failure = case.find("failure")
    assert failure is not None and failure.get("message").startswith("1 csan race(s): tensor 0xbeef")
    assert "CSAN detected a possible data race" in (failure.text or "")


def test_an_injected_csan_report_kills_as_csan_in_the_mutants_matrix(monkeypatch):
    from runnercheck.stress.mutants.catalogue import WORKLOADS
    from runnercheck.stress.cli.mutants_cmd import run_differential

    monitors = _inject_on(monkeypatch)
    import runnercheck.stress.run.harness as harness

    checked = harness.checked_run

    def checked_with_report(config, source, **kw):
        def on_tick(tick: int) -> None:
            if tick == 1:
                monitors[-1].record([_race_error(0x42)])

        return checked(config, source, on_tick=on_tick, **{k: v for k, v in kw.items() if k != "on_tick"})

    monkeypatch.setattr(harness, "checked_run", checked_with_report)
    outcome = run_differential(WORKLOADS["first-steps"], "sim", 0, 3, isolate=False)
    assert set(outcome.fired) == {"csan"} and "tensor 0x42" in outcome.fired["csan"]


def test_race_from_error_survives_a_report_without_an_allocation_stack():
    error = _race_error()
    error.allocation_stack_trace = None
    race = race_from_error(error)
    assert race.allocated_at.startswith("unknown")


# --------------------------------------------------------------------------- the mutant


def test_the_stream_mutant_is_a_device_mutant_skipped_off_cuda():
    from runnercheck.impl.device import Device
    from runnercheck.stress.mutants import catalogue as mutants
    from runnercheck.stress.cli.mutants_cmd import MutantsOptions, run_mutant

    mutant = mutants.get(MUTANT)
    assert (mutant.checks, mutant.needs_gpu, mutant.target) == (("csan",), True, "device")
    device = Device("sim")
    with mutants.apply(MUTANT, device=device):
        assert "_stream_waits_for_current" in vars(device)
    assert "_stream_waits_for_current" not in vars(device)
    result = run_mutant(mutant, MutantsOptions(device="sim"))
    assert result.status == "skipped" and result.skip_reason == "needs a GPU to manifest"


def test_the_harness_installs_a_device_mutant_before_the_runner_is_built(monkeypatch):
    """The ordering is lost at allocation time: the mutant must be in place when the runner allocates."""
    import runnercheck.impl.device as device_module
    from runnercheck.stress.run.harness import build_session

    seen: list[bool] = []
    to_device = device_module.Device.to_device

    def watching(self, t):
        seen.append("_stream_waits_for_current" in vars(self))
        return to_device(self, t)

    monkeypatch.setattr(device_module.Device, "to_device", watching)
    build_session(replace(_config(), mutant=MUTANT))
    assert seen and all(seen)


# --------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_csan_kills_the_stream_mutant_and_the_control_is_clean_under_csan():
    from runnercheck.stress.mutants.catalogue import WORKLOADS
    from runnercheck.stress.cli.mutants_cmd import MutantsOptions, run_catalogue, run_differential

    report = run_catalogue(MutantsOptions(device="cuda", quick=True, only=(MUTANT,), chisq=False))
    (result,) = report.mutants
    assert result.killed_by == ["csan"] and result.as_designed, result.evidence
    assert "csan" in result.checks_run and "tensor 0x" in result.evidence["csan"]
    assert report.controls and all(c.clean for c in report.controls), report.controls
    control = run_differential(WORKLOADS["first-steps"], "cuda", 0, WORKLOADS["first-steps"].full_ticks, csan=True)
    assert "csan" in control.ran and not control.fired, control.fired


@pytest.mark.gpu
def test_stress_with_csan_on_cuda_is_clean(tmp_path):
    assert cli.main(["stress", "--device", "cuda", "--csan", "--seed", "1", "--steps", "24", "--no-progress",
                     "--out", str(tmp_path / "out")]) == 0


def test_a_csan_race_in_a_chisq_run_fails_it_in_json_and_junit():
    from runnercheck.checks.chisq.report import junit_cases
    from runnercheck.checks.chisq.stats_results import RunSummary

    monitor = CsanMonitor()
    monitor.record([_race_error(0x77)])
    summary = RunSummary("impl", "cuda", True, 0, 0.01, "holm", tests=[], power=[])
    summary.csan = {"races": monitor.count, "lines": monitor.lines(), "reports": [r.text for r in monitor.races]}
    assert summary.to_dict()["csan"]["races"] == 1
    (case,) = [c for c in junit_cases(summary) if c.name == "csan"]
    assert case.failure.startswith("1 csan race(s): tensor 0x77")
