"""The slot-lifetime detector: one finding count over the three checks that guard the runner's
pinned slots -- the staging-lifetime state machine (`runnercheck.checks.detectors.lifetime`), the
staging slots' device checksums (`runnercheck.checks.detectors.staging_slots`) and the output
slots' (`runnercheck.checks.detectors.output_slots`).  They are one detector because they answer
one question (was a slot's memory touched outside its lifetime?) and reports have always shown
them as one number.

A runner without a staging pool (``runner.staging`` with ``observers``) has no state machine to
attach to; its checksums still arm where the runner has the parts.  A run with none of the three
is reported "not checked".
"""
from __future__ import annotations

import logging
from typing import Any

from runnercheck.checks.detectors.base import ArmContext, BaseDetector, DetectorResult
from runnercheck.checks.detectors.lifetime import LifetimeChecker
from runnercheck.checks.detectors.output_slots import arm_output_checksums
from runnercheck.checks.detectors.staging_slots import arm_staging_checksums

_log = logging.getLogger(__name__)


class _ArmedSlotLifetime:
    def __init__(self, runner: Any, mode: str):
        pool = getattr(runner, "staging", None)
        self.pool = pool if pool is not None and hasattr(pool, "observers") else None
        self.lifetime = LifetimeChecker(mode).attach(self.pool) if self.pool is not None else None
        self.checksums = [c for c in (arm_staging_checksums(runner), arm_output_checksums(runner)) if c is not None]

    def disarm(self) -> None:
        if self.lifetime is not None:
            self.lifetime.detach(self.pool)
        for checksums in self.checksums:
            checksums.detach()

    def fired(self) -> str | None:
        """The state machine's violations as they happen (the checksums are compared only when read back)."""
        if self.lifetime is not None and self.lifetime.violations:
            return self.lifetime.summary()
        return None

    def result(self) -> DetectorResult:
        """Violations of all three, once the device is drained.  If the checksums cannot be read back
        (the device died) the result keeps what was read: the run's own finding stands."""
        checked, violations, lines = False, 0, []
        if self.lifetime is not None:
            checked, violations, lines = True, self.lifetime.violations, [str(e) for e in self.lifetime.errors[:10]]
        for checksums in self.checksums:
            try:
                checksums.finish()
            except Exception as e:
                _log.info("slot checksums not read back: %s: %s", type(e).__name__, e)
                break
            checked, violations = True, violations + checksums.violations
            lines += checksums.errors[:5]  # each checker's first findings, however many the others had
        return DetectorResult(checked=checked, violations=violations, lines=lines)


class SlotLifetimeDetector(BaseDetector):
    """Staging and output slots written or read outside their lifetime."""

    name = "lifetime"
    label = "slot lifetime (staging, output)"
    noun = "slot lifetime violation(s) (staging, output)"
    tag = "LIFETIME"
    column = "lifetime"
    raises = ("StagingLifetimeError",)  # what ``lifetime_mode="error"`` raises from the runner's host transition
    unchecked_note = "the runner has no staging pool (runner.staging): staging lifetimes were not checked"

    def arm(self, runner: Any, context: ArmContext) -> _ArmedSlotLifetime:
        return _ArmedSlotLifetime(runner, context.lifetime_mode)


__all__ = ["SlotLifetimeDetector"]
