"""The kernel-memory detector: a kernel touched memory outside its tensors.

Interpreted (cpu, sim): every interpreted load, store and atomic is bounds-checked against the
launch's tensor arguments (`runnercheck.impl.kernels.interpreted_memory`); each `KernelMemoryError`
raised while the detector is armed is a finding, counted through ``MEMORY_FAULT_HOOKS`` -- so a runner
that swallows the exception still fails its run.  Arming installs the checks in a process that has
not (a caller of `runnercheck.stress.run.harness.checked_run` from its own script); where they cannot
be installed (``RUNNERCHECK_UNCHECKED_MEMORY=1``, an interpreter of another layout) the run is "not
checked" and a stray access may still kill the process (a ``crash`` finding of the isolated run).

cuda: the same bug is an illegal memory access (or a device-side assert, a misaligned address, an
unspecified launch failure), sticky in the CUDA context: every later CUDA call fails.  The result
synchronizes the device; a memory fault raised there is the finding (its message; CUDA names no
kernel or address).  The run stopped at the runner error that surfaced first.

The run's divergence: the driver records a runner error that is a memory fault (`memory_fault`) as
kind ``kernel-memory`` (`runnercheck.stress.run.driver`), so the run writes a repro; ``runnercheck
mutants`` credits a ``kernel-memory`` divergence to this detector (``divergence_kinds``), not to the
differential.

Ownership: an armed handle owns its hook in ``MEMORY_FAULT_HOOKS`` until ``disarm()`` and the faults
it recorded (host data).
"""
from __future__ import annotations

import logging
from typing import Any

from runnercheck.checks.detectors.base import ArmContext, BaseDetector, DetectorResult
from runnercheck.impl.device import triton_interpreted
from runnercheck.impl.kernels.interpreted_memory import (
    MEMORY_FAULT_HOOKS,
    KernelMemoryError,
    check_interpreted_memory,
)

_log = logging.getLogger(__name__)

DIVERGENCE_KIND = "kernel-memory"
# What CUDA (through torch or Triton's launcher) says when a kernel touched memory it must not have.
CUDA_MEMORY_FAULTS = ("illegal memory access", "illegal address", "misaligned address", "device-side assert",
                      "unspecified launch failure")
MAX_LINES = 10


def memory_fault(error: BaseException | None) -> str | None:
    """What makes ``error`` (or an exception it was raised from) a kernel memory fault: ``"KernelMemoryError"``,
    or the CUDA phrase in its message; None for any other error."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, KernelMemoryError):
            return type(error).__name__
        if isinstance(error, RuntimeError):
            text = str(error).lower()
            for phrase in CUDA_MEMORY_FAULTS:
                if phrase in text:
                    return f"CUDA {phrase}"
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


class _ArmedMemory:
    def __init__(self, interpreted: bool, cuda: bool):
        self.interpreted, self.cuda = interpreted, cuda
        self.faults: list[str] = []
        self.count = 0
        if interpreted:
            MEMORY_FAULT_HOOKS.append(self._record)

    def _record(self, error: KernelMemoryError) -> None:
        self.count += 1
        if len(self.faults) < MAX_LINES:
            self.faults.append(str(error))

    def disarm(self) -> None:
        if self._record in MEMORY_FAULT_HOOKS:
            MEMORY_FAULT_HOOKS.remove(self._record)

    def fired(self) -> str | None:
        return self.faults[0] if self.faults else None

    def result(self) -> DetectorResult:
        if self.cuda and not self.count:
            self._read_cuda_fault()
        return DetectorResult(checked=self.interpreted or self.cuda, violations=self.count, lines=list(self.faults))

    def _read_cuda_fault(self) -> None:
        """A memory fault is sticky in the CUDA context: a synchronize raises it (any other error propagates)."""
        import torch

        if not torch.cuda.is_initialized():
            return
        try:
            torch.cuda.synchronize()
        except RuntimeError as e:
            if memory_fault(e) is None:
                raise
            self.count, self.faults = 1, [f"{memory_fault(e)}: {str(e).strip().splitlines()[0]}"]


class MemoryDetector(BaseDetector):
    """Kernel loads and stores outside the launch's tensors (interpreted: bounds-checked; cuda: the sticky fault)."""

    name = "memory"
    label = "kernel memory (out-of-bounds loads/stores)"
    noun = "kernel memory fault(s)"
    tag = "MEMORY"
    column = "memory"
    raises = ("KernelMemoryError",)  # raised from inside the runner's kernels (every mode)
    divergence_kinds = (DIVERGENCE_KIND,)  # the run's divergence of a fault this detector reports
    unchecked_note = ("kernel memory accesses were not checked (interpreted without the bounds checks: "
                      "RUNNERCHECK_UNCHECKED_MEMORY=1 or an interpreter of another layout)")

    def arm(self, runner: Any, context: ArmContext) -> _ArmedMemory:
        if triton_interpreted():
            return _ArmedMemory(check_interpreted_memory(), False)
        device = getattr(runner, "device", None)
        return _ArmedMemory(False, getattr(device, "kind", None) == "cuda")


__all__ = ["CUDA_MEMORY_FAULTS", "DIVERGENCE_KIND", "MemoryDetector", "memory_fault"]
