"""Detectors, assertions and statistics that judge the runner in `impl` (never imported by it).

* `runnercheck.checks.detectors.sync` -- a thread-local scope in which a host read of device data or a host wait raises
  `HostSyncError` naming the line (or is counted); `arm_runner` arms a runner's ``execute_model``
  with ``AsyncOutput.get`` as the one allowed wait (``RUNNERCHECK_SYNC_CHECK=error|count|off``);
  `runnercheck.checks.detectors.sync_ops` is its catalogue of watched torch ops and of what counts as device data.
* `runnercheck.checks.lint` -- ``runnercheck lint``: a static scan of ``@hot_path`` functions for host reads.
* `runnercheck.checks.detectors.lifetime` -- `LifetimeChecker`: staging slots cycle FREE -> WRITING -> IN_FLIGHT -> FREE,
  with checksums that catch writes through stale references and slots freed before their event.
* `runnercheck.checks.compare` -- runner vs oracle output comparison (exact, with reported near-ties).
* `runnercheck.checks.chisq.stats` and friends -- chi-square tests of sampler output against exact distributions.
"""
