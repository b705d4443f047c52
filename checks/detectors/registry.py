"""The ordered registry of detectors (`DETECTORS`) and the set of them armed on one runner.

Every reader -- the run owner, summary.json/md, the terminal, JUnit, the pytest plugin, the
mutant catalogue -- iterates `registered()`, never a hard-wired list: adding a detector is its
module (a `runnercheck.checks.detectors.base.Detector`), one line in `DETECTORS`, and its mutant.
The order is the order of report rows and columns.

Readers look the registry up at call time (`registered`, `find`), so a test can register a toy
detector by patching ``DETECTORS`` for its duration.

Ownership: this module owns the list; `ArmedDetectors` owns the handles armed on one runner until
``disarm()``.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable

from runnercheck.checks.detectors.base import ArmContext, Armed, BaseDetector, Detector, DetectorResult
from runnercheck.checks.detectors.csan import CsanDetector
from runnercheck.checks.detectors.memory import MemoryDetector
from runnercheck.checks.detectors.prefix_cache import ProvenanceDetector
from runnercheck.checks.detectors.slot_lifetime import SlotLifetimeDetector
from runnercheck.checks.detectors.sync import SyncDetector

_log = logging.getLogger(__name__)

DETECTORS: tuple[Detector, ...] = (
    SyncDetector(),
    SlotLifetimeDetector(),
    ProvenanceDetector(),
    CsanDetector(),
    MemoryDetector(),
)


class DetectorRegistryError(ValueError):
    """A registry with a nameless or duplicated detector, or a name that is not registered."""


def registered() -> tuple[Detector, ...]:
    """The detectors in report order, checked (unique, non-empty names)."""
    names = [d.name for d in DETECTORS]
    if any(not isinstance(n, str) or not n for n in names) or len(set(names)) != len(names):
        raise DetectorRegistryError(f"detector names must be unique non-empty strings, got {names}")
    return DETECTORS


def names() -> tuple[str, ...]:
    return tuple(d.name for d in registered())


def find(name: str) -> Detector:
    """The registered detector ``name``; `DetectorRegistryError` (naming the registered ones) otherwise."""
    for d in registered():
        if d.name == name:
            return d
    raise DetectorRegistryError(f"no detector named {name!r}; registered: {', '.join(names())}")


class _Unregistered(BaseDetector):
    """How a report renders a result of a detector this installation does not register (a document
    written by another version, or with a plugin's detector): by its name, with the default texts."""

    def __init__(self, name: str):
        self.name = self.label = self.column = name
        self.tag = name.upper()


def for_rendering(name: str) -> Detector:
    """The registered detector ``name``, or a plain stand-in that renders its result by name."""
    try:
        return find(name)
    except DetectorRegistryError:
        return _Unregistered(name)


def in_report_order(result_names: Iterable[str]) -> list[Detector]:
    """The detectors (for rendering) of ``result_names``: registered ones in registry order, then the others."""
    present = set(result_names)
    ordered = [d for d in registered() if d.name in present]
    ordered += [for_rendering(n) for n in sorted(present - {d.name for d in ordered})]
    return ordered


class ArmedDetectors:
    """Every registered detector armed on one runner (those whose ``arm`` returned None are off)."""

    def __init__(self, runner: Any, context: ArmContext):
        self.armed: dict[str, Armed] = {}
        try:
            for detector in registered():
                handle = detector.arm(runner, context)
                if handle is not None:
                    self.armed[detector.name] = handle
        except BaseException:
            self.disarm()  # arming failed half way: leave the runner as it was
            raise

    def fired(self) -> str | None:
        """The first armed detector that fired, as ``"name: what"``; None while all are clean."""
        for name, handle in self.armed.items():
            message = handle.fired()
            if message:
                return f"{name}: {message}"
        return None

    def disarm(self) -> None:
        for handle in self.armed.values():
            handle.disarm()

    def results(self) -> tuple[dict[str, DetectorResult], dict[str, BaseException]]:
        """Each armed detector's result, and the detectors whose result could not be read (the
        device died: a sticky CUDA error makes every read-back fail) with what was raised."""
        results: dict[str, DetectorResult] = {}
        failures: dict[str, BaseException] = {}
        for name, handle in self.armed.items():
            try:
                results[name] = handle.result()
            except Exception as e:
                _log.info("detector %s: result not read back: %s: %s", name, type(e).__name__, e)
                failures[name] = e
        return results, failures


__all__ = ["DETECTORS", "ArmedDetectors", "DetectorRegistryError", "find", "for_rendering", "in_report_order", "names",
           "registered"]
