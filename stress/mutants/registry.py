"""The mutant registry: `Mutant`, `AppliedMutant` (the record of what a mutant patched, undone on
exit) and the ``CATALOGUE`` that the ``_mutant`` decorator fills.

`runnercheck.stress.mutants.catalogue` (the core catalogue), `runnercheck.stress.mutants.graphs`, `runnercheck.stress.mutants.prefix` and
`runnercheck.stress.mutants.streams` register into it; `runnercheck.stress.mutants.catalogue` imports the other three, so importing it gives the whole catalogue.  This
module imports none of them (no import cycle).

Ownership: ``CATALOGUE`` is written only at import, by the ``_mutant`` decorator; an
`AppliedMutant` owns its undo list.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from runnercheck.stress.mutants.workloads import WORKLOADS

CLASSES = ("race", "sync", "state", "sampler")
# The checks that are not detectors of a live runner: runner vs oracle, the sampler statistics, and
# the batch-invariance check (`runnercheck.stress.invariance`: a request alone vs in batches).
RUN_CHECKS = ("differential", "chisq", "invariance")


def known_checks() -> tuple[str, ...]:
    """Every check a mutant may name: the detector registry's names (read now: a detector registered
    later is known), then `RUN_CHECKS`.  The order of the kill matrix's columns."""
    from runnercheck.checks.detectors.registry import names

    return names() + RUN_CHECKS


class UnknownMutantError(LookupError):
    """A mutant name that is not in the catalogue."""


# --------------------------------------------------------------------------- patching


class AppliedMutant:
    """An installed mutant; ``undo()`` (or leaving a ``with`` block) restores every patched attribute."""

    def __init__(self, mutant: "Mutant"):
        self.mutant = mutant
        self._undo: list[Callable[[], None]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        """Replace ``owner.name`` (an instance attribute shadowing a method, or a module global)."""
        if isinstance(owner, ModuleType) or name in vars(owner):
            old = getattr(owner, name)
            self._undo.append(lambda: setattr(owner, name, old))
        else:
            self._undo.append(lambda: delattr(owner, name))
        setattr(owner, name, value)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> "AppliedMutant":
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


# --------------------------------------------------------------------------- the catalogue


@dataclass(frozen=True)
class Mutant:
    """One deliberate bug.  ``install(target, applied)`` patches ``target`` through ``applied.set``."""

    name: str
    cls: str
    description: str
    checks: tuple[str, ...]
    workload: str
    install: Callable[[Any, AppliedMutant], None]
    requires: tuple[str, ...]
    needs_gpu: bool = False
    chisq_case: str | None = None
    target: str = "runner"  # what ``install`` patches: "runner" (or a sampler probe), "scheduler", or "device"
    # ("device": the `runnercheck.impl.device.Device`, installed before the runner is built; `runnercheck.stress.mutants.streams`)

    def __post_init__(self) -> None:
        unknown = [c for c in self.checks if c not in known_checks()]
        if unknown or not self.checks:
            raise ValueError(f"mutant {self.name!r}: it must name the checks that kill it, from {', '.join(known_checks())}; "
                             f"unknown: {', '.join(unknown) or '(none named)'}")
        if self.cls not in CLASSES or self.workload not in WORKLOADS or self.target not in ("runner", "scheduler", "device"):
            raise ValueError(f"mutant {self.name!r}: bad class, workload or target")


CATALOGUE: dict[str, Mutant] = {}


def _mutant(name: str, cls: str, checks: tuple[str, ...], workload: str, requires: tuple[str, ...], description: str,
            **extra: Any) -> Callable:
    def register(install: Callable[[Any, AppliedMutant], None]) -> Callable:
        CATALOGUE[name] = Mutant(name, cls, description, checks, workload, install, requires, **extra)
        return install

    return register


__all__ = ["CATALOGUE", "CLASSES", "RUN_CHECKS", "known_checks", "AppliedMutant", "Mutant", "UnknownMutantError"]
