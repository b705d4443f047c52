"""A kernel's out-of-bounds access is a finding, not a dead run: the memory detector
(`runnercheck.checks.detectors.memory`) counts interpreted `KernelMemoryError`s, the driver records the
runner error as a ``kernel-memory`` divergence with a repro, and ``runnercheck mutants`` credits it to
the memory detector.  The planted bug is ``reuse_staging_early`` under the held lag that used to kill
the run with SIGSEGV (stale staging bytes read as row indices)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from runnercheck.checks.compare import Divergence
from runnercheck.checks.detectors.base import ArmContext, DetectorResult
from runnercheck.checks.detectors.memory import MemoryDetector, memory_fault
from runnercheck.impl.device import triton_interpreted
from runnercheck.impl.kernels.interpreted_memory import MEMORY_FAULT_HOOKS, KernelMemoryError, check_access
from runnercheck.stress.run.driver import RunResult, runner_error
from runnercheck.stress.run.harness import ChurnOps, Findings
from runnercheck.stress.run.isolation import isolated_run  # bound to the real checked_run before any test patches it

interpreted = pytest.mark.skipif(not triton_interpreted(), reason="kernels run on a GPU, not in the interpreter")
ROOT = Path(__file__).resolve().parents[2]


def _fault() -> KernelMemoryError:
    return KernelMemoryError("k", "load", 0x1000, 4, 1, 8, "argument 'x' (int32[2] at 0x10)", "k.py:3")


def test_memory_faults_are_told_from_other_runner_errors() -> None:
    assert memory_fault(_fault()) == "KernelMemoryError"
    try:
        try:
            raise _fault()
        except KernelMemoryError as e:
            raise RuntimeError("the step failed") from e  # a runner that wraps it: still a memory fault
    except RuntimeError as wrapped:
        assert memory_fault(wrapped) == "KernelMemoryError"
    assert memory_fault(RuntimeError("CUDA error: an illegal memory access was encountered")) == "CUDA illegal memory access"
    assert memory_fault(RuntimeError("CUDA error: device-side assert triggered")) == "CUDA device-side assert"
    assert memory_fault(RuntimeError("CUDA error: out of memory")) is None and memory_fault(ValueError("x")) is None
    first = runner_error(3, _fault(), "an output")
    assert (first.kind, first.step, first.got) == ("kernel-memory", 3, "KernelMemoryError")
    assert first.line().startswith("step 3: kernel memory fault (KernelMemoryError): kernel k at k.py:3: load of 4 byte(s)")
    assert runner_error(3, ValueError("x"), "an output").kind == "runner-error"


@interpreted
def test_the_detector_counts_faults_while_armed_even_swallowed_ones() -> None:
    import numpy as np

    from runnercheck.impl.kernels import interpreted_memory

    armed = MemoryDetector().arm(SimpleNamespace(), ArmContext())
    launch = interpreted_memory._Launch("planted_kernel")
    launch.set_extents([interpreted_memory.Extent(0x100, 0x140, "argument 'x'")])
    interpreted_memory._stack().append(launch)
    try:
        check_access(np.array([0x100, 0x13C], dtype=np.uint64), None, 4, "load")  # in bounds: nothing
        assert armed.fired() is None
        for _ in range(2):
            with pytest.raises(KernelMemoryError):
                check_access(np.array([0x100, 0x140], dtype=np.uint64), None, 4, "store")
        armed.disarm()
        with pytest.raises(KernelMemoryError):  # after disarm: still raised, no longer counted
            check_access(np.array([0x200], dtype=np.uint64), np.array([True]), 4, "load")
    finally:
        interpreted_memory._stack().pop()
        armed.disarm()
    result = armed.result()
    assert armed._record not in MEMORY_FAULT_HOOKS
    assert (result.checked, result.violations) == (True, 2) and "kernel planted_kernel" in result.lines[0]
    assert "store of 4 byte(s) at 0x140" in armed.fired() and "at byte offset 64 of its 64" in result.lines[0]
    assert MemoryDetector().failure(result).startswith("2 kernel memory fault(s): kernel planted_kernel")


def test_mutants_credit_a_kernel_memory_divergence_to_the_memory_detector(monkeypatch: pytest.MonkeyPatch) -> None:
    from runnercheck.stress.cli.mutants_cmd import checked_differential
    from runnercheck.stress.run import harness

    fault = runner_error(2, _fault(), "an output")
    findings = Findings("m", None, RunResult(ticks=3, divergences=[fault]), [],
                        detectors={"memory": DetectorResult(True, 0)})  # raised while draining: after the disarm
    monkeypatch.setattr(harness, "checked_run", lambda *a, **k: findings)
    outcome = checked_differential(None, ChurnOps(), "m", isolate=False)
    assert outcome.fired == {"memory": fault.line()}  # the differential did not kill it
    findings.result.divergences = [runner_error(2, ValueError("boom"), "an output")]
    assert set(checked_differential(None, ChurnOps(), "m", isolate=False).fired) == {"differential"}


def _held_mutant_run() -> Findings:
    """``reuse_staging_early`` held at the staging slots under policy seed 3 (the quick sim plan's traffic), in the
    stress harness's child process and in count mode (as verify runs): stale bytes index past the interpreted
    kernels' tensors at step 1.  Before the bounds checks this child died of SIGSEGV."""
    from runnercheck.stress.cli.verify import plan_runs

    planned = plan_runs("sim", 0, "runnercheck.impl.runner:make_runner", quick=True)[0]
    lag = {"name": "hold-at-target", "targets": ["staging-slot"], "seed": 3, "p": 0.5, "max_hold": 2}
    config = replace(planned.config, steps=4, mutant="reuse_staging_early", lag_policy=lag,
                     scheduler=replace(planned.config.scheduler, max_inflight_steps=2))
    # the draws this run was measured with (verify's churn gained top-k tie draws after it)
    return isolated_run(config, ChurnOps(replace(planned.churn, tie_top_k_prob=0.0)), name="held mutant")


@interpreted
def test_stale_staging_indices_that_used_to_kill_the_run_are_a_memory_finding() -> None:
    """The run finishes (no ``crash``) and its first divergence is the fault, counted by the memory detector (the
    lifetime checksum may not get to compare the slot: the run stops at the fault)."""
    findings = _held_mutant_run()
    first = findings.result.first_divergence
    assert findings.crash is None and first is not None and first.kind == "kernel-memory", findings.first_divergence_line()
    assert first.got == "KernelMemoryError" and "outside every tensor argument" in first.detail
    assert findings.violations("memory") >= 1 and not findings.passed


@pytest.mark.slow
@interpreted
def test_the_memory_finding_has_a_repro_that_replays_to_the_findings_exit_code(tmp_path: Path, capsys) -> None:
    from runnercheck.stress.cli.main import main

    findings = _held_mutant_run()
    assert findings.result.first_divergence.kind == "kernel-memory"
    repro = tmp_path / "repro.json"
    findings.repro().save(repro)
    assert main(["replay", str(repro), "--no-progress"]) == 1  # the findings exit code (replay: lifetime in error mode)
    assert "DIVERGENCE" in capsys.readouterr().out


_CUDA_CHILD = textwrap.dedent("""
    import torch, triton, triton.language as tl
    from types import SimpleNamespace
    from runnercheck.checks.detectors.base import ArmContext
    from runnercheck.checks.detectors.memory import MemoryDetector, memory_fault
    from runnercheck.stress.run.driver import runner_error

    @triton.jit
    def gather(src, idx, dst, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(dst + offsets, tl.load(src + tl.load(idx + offsets)))

    armed = MemoryDetector().arm(SimpleNamespace(device=SimpleNamespace(kind="cuda")), ArmContext())
    idx = torch.tensor([0, 1, 1 << 40, 2], device="cuda")
    try:
        gather[(1,)](torch.arange(4.0, device="cuda"), idx, torch.zeros(4, device="cuda"), BLOCK=4)
        torch.cuda.synchronize()
    except RuntimeError as e:
        print("divergence", runner_error(0, e, "an output").kind, flush=True)
    armed.disarm()
    result = armed.result()
    print("detector", result.violations, result.lines[0] if result.lines else "", flush=True)
""")


@pytest.mark.gpu
def test_on_cuda_an_illegal_address_is_a_memory_divergence_and_the_detector_reads_the_sticky_fault(tmp_path: Path) -> None:
    """In a child process: the fault poisons the CUDA context for the rest of the process."""
    script = tmp_path / "wild_cuda.py"
    script.write_text(_CUDA_CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    assert "divergence kernel-memory" in lines, (done.stdout, done.stderr[-2000:])
    detector = next(line for line in lines if line.startswith("detector "))
    assert detector.startswith("detector 1 CUDA "), detector
