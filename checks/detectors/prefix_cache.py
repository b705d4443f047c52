"""Prefix caching in a checked run: the KV provenance check armed on the runner, and what the run
reports about the scheduler's prefix cache (hit rate, evictions) and about provenance -- the
registered detector ``provenance`` (`ProvenanceDetector`).

The scheduler reaches it through the arm context (`runnercheck.checks.detectors.base.ArmContext`:
``checks`` never imports the simulator in ``stress``); any object with ``stats`` (hit_rate,
prefill_tokens, cached_tokens, prefix_hits, evictions) and ``config.prefix_caching`` will do::

    prefix = arm_prefix_checks(runner, scheduler)
    ...  # between ticks: prefix.fired() once a violation was recorded
    findings = prefix.findings()  # after the run (drains the device); findings.passed, .to_dict(), .line()

Runners without the built-in runner's parts (an input batch and a block table, e.g. the simple
runner or the oracle behind the seam) get no provenance check; the hit rate is reported anyway.

Ownership: `PrefixChecks` owns its `runnercheck.checks.detectors.kv_provenance.KVProvenanceChecker` (see there for the
tensors); it reads the scheduler's stats and writes nothing of the scheduler.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from runnercheck.checks.detectors.base import ArmContext, BaseDetector, DetectorResult
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


class _ArmedProvenance:
    def __init__(self, checks: PrefixChecks):
        self.checks = checks

    def disarm(self) -> None:
        pass  # the shadow is read back by `result`, after the device drained the run's work

    def fired(self) -> str | None:
        return self.checks.checker.summary() if self.checks.fired() else None

    def result(self) -> DetectorResult:
        findings = self.checks.findings()
        cache = {f.name: getattr(findings, f.name) for f in fields(findings)
                 if not f.name.startswith("provenance_")}
        return DetectorResult(checked=findings.provenance_checked, violations=findings.provenance_violations,
                              lines=list(findings.provenance_lines), extra=cache)


def _cache_findings(result: DetectorResult) -> PrefixCacheFindings:
    return PrefixCacheFindings(**result.extra, provenance_checked=result.checked,
                               provenance_violations=result.violations, provenance_lines=tuple(result.lines))


class ProvenanceDetector(BaseDetector):
    """KV-cache slots read with contents another (token, position, prefix) wrote; reports the
    prefix cache's hit rate alongside (``extra``), checked or not."""

    name = "provenance"
    label = "KV provenance"
    noun = "kv provenance violation(s)"
    tag = "KV PROVENANCE"
    column = "kv prov"

    def arm(self, runner: Any, context: ArmContext) -> _ArmedProvenance | None:
        return _ArmedProvenance(arm_prefix_checks(runner, context.scheduler)) if context.scheduler is not None else None

    def describe(self, result: DetectorResult) -> str:
        return _cache_findings(result).line()

    def total(self, results: list[DetectorResult]) -> str:
        text = super().total(results)
        rates = [r.extra["hit_rate"] for r in results if r.extra.get("prefix_caching")]
        if rates:
            text += f"; prefix cache hit rate {min(rates):.0%}..{max(rates):.0%} of prefill tokens over {len(rates)} run(s)"
        return text


__all__ = ["PrefixCacheFindings", "PrefixChecks", "ProvenanceDetector", "arm_prefix_checks"]
