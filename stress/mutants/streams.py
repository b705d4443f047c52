"""Stream-ordering mutants (registered in the `runnercheck.stress.mutants.catalogue` catalogue): bugs between CUDA streams.

``runner_stream_reads_default_stream_write`` models the bug fixed in commit 5b3d1b7: init-time
fills and copies (`runnercheck.impl.device.Device.to_device`, ``zeros``, ``full``) run on the caller's current
stream -- the default stream -- while every kernel of a step runs on the runner's own stream.
Without ``self.stream.wait_stream(current)`` after them, the runner's first kernels may read weights,
tables and buffers before the default stream has written them.  On the H200 the chi-square
adapter (`runnercheck.checks.chisq.impl_sampler.ImplSampler`) read stale logits and positions that way and rejected
every case.  Timing rarely shows it in a differential run (the copies usually land first); CUDA's
stream sanitizer (`runnercheck.checks.detectors.csan`) sees the missing ordering on every run, so the check built for it
is ``csan``.

It patches the `Device`, not the runner: the ordering is lost at allocation time, so the harness
installs device mutants (``target="device"``) before the runner factory allocates anything
(`runnercheck.stress.run.harness.build_session`).  cuda only (``needs_gpu``): cpu and sim have no streams.
"""
from __future__ import annotations

from typing import Any

from runnercheck.stress.mutants.registry import AppliedMutant, _mutant


@_mutant("runner_stream_reads_default_stream_write", "race", ("csan",), "first-steps", ("_stream_waits_for_current",),
         "init-time copies/fills on the default stream are not ordered before the runner stream's kernels "
         "(Device.to_device/zeros/full without wait_stream; the bug of commit 5b3d1b7)",
         needs_gpu=True, target="device")
def _runner_stream_reads_default_stream_write(device: Any, m: AppliedMutant) -> None:
    m.set(device, "_stream_waits_for_current", lambda: None)
