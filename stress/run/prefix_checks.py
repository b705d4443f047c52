"""Prefix caching in a checked run: the KV provenance check armed on the runner, and what the run
reports about the scheduler's prefix cache (hit rate, evictions) and about provenance.

The one call a run owner makes (after installing any mutant, next to the sync and lifetime
detectors)::

    prefix = arm_prefix_checks(session.runner, session.scheduler)
    ...  # in before_tick: stop the run once prefix.fired() (like the sync detector)
    findings = prefix.findings()  # after the run (drains the device); findings.passed, .to_dict(), .line()

Runners without the built-in runner's parts (an input batch and a block table, e.g. the simple
runner or the oracle behind the seam) get no provenance check; the hit rate is reported anyway.

Ownership: `PrefixChecks` owns its `runnercheck.checks.detectors.kv_provenance.KVProvenanceChecker` (see there for the
tensors); it reads the scheduler's stats and writes nothing of the scheduler.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from runnercheck.checks.detectors.kv_provenance import KVProvenanceChecker, arm_kv_provenance


@dataclass(frozen=True)
class PrefixCacheFindings:
    """The prefix-cache and KV-provenance part of one run's findings."""

    prefix_caching: bool
    hit_rate: float  # fraction of prefill tokens served from the cache
    prefill_tokens: int
    cached_tokens: int
    prefix_hits: int
    evictions: int
    provenance_checked: bool
    provenance_violations: int
    provenance_lines: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.provenance_violations == 0

    def to_dict(self) -> dict:
        return dict(asdict(self), provenance_lines=list(self.provenance_lines), passed=self.passed)

    def line(self) -> str:
        cache = (f"prefix cache: {self.hit_rate:.0%} of {self.prefill_tokens} prefill tokens from the cache "
                 f"({self.prefix_hits} hits, {self.evictions} evictions)") if self.prefix_caching else "prefix cache: off"
        if not self.provenance_checked:
            return f"{cache}; kv provenance: not checked (runner without an input batch)"
        if self.passed:
            return f"{cache}; kv provenance: clean"
        return f"{cache}; kv provenance: {self.provenance_violations} violation(s), first: {self.provenance_lines[0]}"


class PrefixChecks:
    """The armed provenance check (or None) and the scheduler whose cache the findings describe."""

    def __init__(self, checker: KVProvenanceChecker | None, scheduler: Any):
        self.checker = checker
        self.scheduler = scheduler

    def fired(self) -> bool:
        """True once a violation was recorded (cpu/sim: as the device work runs; cuda: only after `findings`)."""
        return self.checker is not None and self.checker.num_violations > 0

    def findings(self) -> PrefixCacheFindings:
        stats = self.scheduler.stats
        checker = self.checker
        violations = checker.finish() if checker is not None else []
        return PrefixCacheFindings(
            prefix_caching=self.scheduler.config.prefix_caching, hit_rate=round(stats.hit_rate, 4),
            prefill_tokens=stats.prefill_tokens, cached_tokens=stats.cached_tokens, prefix_hits=stats.prefix_hits,
            evictions=stats.evictions, provenance_checked=checker is not None,
            provenance_violations=checker.num_violations if checker is not None else 0,
            provenance_lines=tuple(v.line() for v in violations[:10]),
        )


def arm_prefix_checks(runner: Any, scheduler: Any, *, sample_every: int | None = None) -> PrefixChecks:
    """Arm KV provenance on ``runner`` when it has an input batch and block table; see the module docstring."""
    supported = all(hasattr(runner, part) for part in ("input_batch", "block_table", "device", "limits"))
    checker = arm_kv_provenance(runner, sample_every=sample_every) if supported else None
    return PrefixChecks(checker, scheduler)


__all__ = ["PrefixCacheFindings", "PrefixChecks", "arm_prefix_checks"]
