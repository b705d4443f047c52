"""The detector contract every reader of a run's findings relies on.

A `Detector` is armed on one live runner (`Detector.arm`) and returns an `Armed` handle: the run
owner polls ``fired()`` between ticks (what stops a stop-on-sync run), calls ``disarm()`` when the
run ends, and, once the device work is drained, ``result()`` -- a `DetectorResult`, plain host
data (it crosses the isolated run's process boundary and is written into ``summary.json``).

Renderers never know which detectors exist: they read a detector's label, noun and the
`DetectorResult` through the methods below, so a new detector shows up in every report without a
change to them.  `BaseDetector` carries the default renderings; a detector overrides one only
where its data says more (the sync detector's counted waits, the prefix cache's hit rate).

Ownership: an `Armed` handle owns whatever it patched on the runner until ``disarm()``; a
`DetectorResult` owns nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

LIFETIME_MODES = ("count", "error")


class DetectorResultError(ValueError):
    """A detector result (or its JSON form) that does not follow `DetectorResult`'s shape."""


@dataclass
class DetectorResult:
    """What one detector found in one run.

    ``checked``: the detector could watch this runner (a runner without a staging pool has no slot
    lifetimes to check).  ``violations``: how many findings (0: clean).  ``lines``: the first
    findings, one line each.  ``extra``: detector-specific JSON-able data (counted waits, a hit rate).
    """

    checked: bool
    violations: int = 0
    lines: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.checked, bool):
            raise DetectorResultError(f"'checked' must be a bool, got {self.checked!r}")
        if not isinstance(self.violations, int) or isinstance(self.violations, bool) or self.violations < 0:
            raise DetectorResultError(f"'violations' must be an int >= 0, got {self.violations!r}")
        if not isinstance(self.lines, list) or not all(isinstance(line, str) for line in self.lines):
            raise DetectorResultError("'lines' must be a list of strings")
        if not isinstance(self.extra, dict):
            raise DetectorResultError(f"'extra' must be an object, got {type(self.extra).__name__}")

    @property
    def clean(self) -> bool:
        return self.violations == 0

    def to_dict(self) -> dict:
        return {"checked": self.checked, "violations": self.violations, "lines": list(self.lines), "extra": dict(self.extra)}

    @classmethod
    def from_dict(cls, data: Any) -> "DetectorResult":
        """The result ``to_dict`` wrote; `DetectorResultError` names what is wrong with ``data``."""
        if not isinstance(data, dict) or set(data) != {"checked", "violations", "lines", "extra"}:
            raise DetectorResultError("a detector result is an object with exactly 'checked', 'violations', 'lines', 'extra'")
        return cls(data["checked"], data["violations"], data["lines"], data["extra"])


@dataclass(frozen=True)
class ArmContext:
    """What a detector may need besides the runner; the run owner fills what it has.

    ``lifetime_mode``: ``"count"`` records violations, ``"error"`` raises from the host transition
    that exposes one (a detector without modes ignores it).  ``scheduler``: the scheduler whose
    prefix cache feeds the runner (``stats``, ``config.prefix_caching``); None when there is none.
    ``csan``: the `runnercheck.checks.detectors.csan.CsanMonitor` the run owner armed *before* the
    runner was built (CSAN must see init-time writes); None when the run is not under CSAN.
    """

    lifetime_mode: str = "count"
    scheduler: Any = None
    csan: Any = None

    def __post_init__(self) -> None:
        if self.lifetime_mode not in LIFETIME_MODES:
            raise ValueError(f"lifetime_mode must be one of {LIFETIME_MODES}, got {self.lifetime_mode!r}")


@runtime_checkable
class Armed(Protocol):
    """A detector armed on one runner."""

    def disarm(self) -> None:
        """Undo what arming patched; results stay readable."""

    def fired(self) -> str | None:
        """None while clean; else one line saying what fired (a stop-on-sync run stops at the next tick)."""

    def result(self) -> DetectorResult:
        """The run's findings, read once the device is drained (may read device memory back: may raise)."""


@runtime_checkable
class Detector(Protocol):
    """One check of a live runner, as the registry (`runnercheck.checks.detectors.registry`) lists it."""

    name: str  # the key in `Findings.detectors` and summary.json, the check a mutant names
    label: str  # the row label of summaries (terminal, summary.md)
    noun: str  # "host sync(s)": a failure reads "{violations} {noun}: {first line}"
    tag: str  # "HOST SYNC": the prefix of its finding lines on the terminal
    column: str  # the short header of its per-run column
    raises: tuple[str, ...]  # exception type names its error mode raises from inside the runner
    unchecked_note: str | None  # the report's note when some run could not be checked (None: no note)

    def arm(self, runner: Any, context: ArmContext) -> Armed | None:
        """Arm on ``runner``; None when this run does not use the detector at all (no result is reported)."""

    def describe(self, result: DetectorResult) -> str:
        """One line for a run's summary row."""

    def cell(self, result: DetectorResult) -> str:
        """The run's cell in a per-run table."""

    def failure(self, result: DetectorResult) -> str | None:
        """None when clean, else the one-line failure message (JUnit, pytest, mutants evidence)."""

    def details(self, result: DetectorResult) -> list[str]:
        """Long text behind a failure (JUnit failure details), e.g. a sanitizer's stacks."""

    def total(self, results: list[DetectorResult]) -> str:
        """One line over several runs' results (summary.md's check table, the terminal footer)."""


class BaseDetector:
    """Default renderings of a `Detector` from its ``noun``; subclasses set the attributes and `arm`."""

    name: str = ""
    label: str = ""
    noun: str = "violation(s)"
    tag: str = ""
    column: str = ""
    raises: tuple[str, ...] = ()
    # Kinds of run divergence that are this detector's finding (the memory detector's ``kernel-memory``):
    # ``runnercheck mutants`` credits such a divergence to it, not to the differential.  Optional: read with getattr.
    divergence_kinds: tuple[str, ...] = ()
    unchecked_note: str | None = None

    def arm(self, runner: Any, context: ArmContext) -> Armed | None:
        raise NotImplementedError(f"detector {type(self).__name__} does not implement arm()")

    def describe(self, result: DetectorResult) -> str:
        return f"{result.violations} {self.noun}" if result.checked else "not checked"

    def cell(self, result: DetectorResult) -> str:
        return str(result.violations) if result.checked else "n/a"

    def failure(self, result: DetectorResult) -> str | None:
        if result.clean:
            return None
        return f"{result.violations} {self.noun}: {result.lines[0] if result.lines else '?'}"

    def details(self, result: DetectorResult) -> list[str]:
        return []

    def total(self, results: list[DetectorResult]) -> str:
        checked = [r for r in results if r.checked]
        text = f"{sum(r.violations for r in checked)} {self.noun}"
        if len(checked) < len(results):
            text += f" ({len(results) - len(checked)} run(s) not checked)"
        return text


__all__ = ["Armed", "ArmContext", "BaseDetector", "Detector", "DetectorResult", "DetectorResultError", "LIFETIME_MODES"]
