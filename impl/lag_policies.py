"""Lag policies: when a ``sim`` device's queued work runs (`runnercheck.impl.device.Device`, kind ``sim``).

A policy is told of every enqueue, step boundary and event query and runs some prefix of the
queue (work always runs in stream order; an event the host waits on runs everything before it).
It stands in for a GPU that trails the host by a varying amount, so the races a real GPU would
expose happen on CPU, seeded and replayable:

``run-immediately``  the GPU keeps up;
``lag-k-steps``      work of step s runs when step s + k + 1 begins;
``random-drain``     a seeded random number of the oldest items run at each hook;
``hold-at-target``   targeted lag (`HoldAtTarget`): everything runs at once except the last device
                     reader of a targeted resource (`DELAY_TARGETS`), which is held, with the work
                     behind it, for one or more steps -- the host reaches the resource's next reuse
                     while that reader is still pending.  The cuda counterpart injects a spin
                     delay right before the same readers (`runnercheck.stress.run.config.TargetedDelay`).

Ownership: a policy owns only its own seeded generator and counters (host, its lifetime); it
reads the device's queue and runs work through ``Device._run_pending`` / ``_run_leading``, never anything else.
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Any, Callable, Iterable, Protocol, Sequence


class SimQueue(Protocol):
    """What a lag policy reads and drives of a ``sim`` `runnercheck.impl.device.Device` (a protocol, so this
    module, which the device imports, does not import it back)."""

    step_index: int
    _queue: Sequence[Any]  # the queued work, oldest first; each item has ``seq`` and ``step_index``
    _done_seq: int

    def _run_pending(self, n: int) -> None: ...

    def _run_leading(self, runnable: Callable[[Any], bool]) -> None: ...

LAG_POLICIES = ("run-immediately", "lag-k-steps", "random-drain", "hold-at-target")

# The resources a targeted delay aims at, by the ``Device.enqueue`` labels of their last device reader.
DELAY_TARGETS: dict[str, tuple[str, ...]] = {
    # A pinned staging slot is read by its H2D copy; the pool may hand it out again once that ran.
    "staging-slot": ("h2d slot",),
    # A pinned output slot is written by the step's D2H and read by the host at get(); the ring reuses it after.
    "output-slot": ("d2h output slot",),
    # A freed (quarantined) state row and the pinned prompt buffer are read by the step's input prep
    # (eager), or inside the graph replay that follows the bucket padding (graph steps).
    "input-prep": ("input prep", "pad step inputs"),
}


class LagPolicyError(ValueError):
    """An unknown lag policy or a bad parameter of one."""


def delay_target_of(label: str, targets: Iterable[str]) -> str | None:
    """The first of ``targets`` whose last-reader labels ``label`` starts with (None: not a target's reader)."""
    for target in targets:
        if label.startswith(DELAY_TARGETS[target]):
            return target
    return None


def check_delay_targets(targets: Iterable[str]) -> tuple[str, ...]:
    """``targets`` as a tuple, each a key of `DELAY_TARGETS`; `LagPolicyError` naming an unknown one."""
    targets = tuple(targets)
    unknown = [t for t in targets if t not in DELAY_TARGETS]
    if unknown or not targets:
        raise LagPolicyError(f"delay targets must be a non-empty subset of {sorted(DELAY_TARGETS)}, got {list(targets)}")
    return targets

class LagPolicy:
    """Decides when a sim device's queued work runs.  Subclasses override the ``on_*`` hooks."""

    name = "base"

    def on_enqueue(self, dev: SimQueue) -> None:
        pass

    def on_step_boundary(self, dev: SimQueue) -> None:
        pass

    def on_query(self, dev: SimQueue) -> None:
        pass

    def describe(self) -> dict:
        return {"name": self.name}


class RunImmediately(LagPolicy):
    """The GPU keeps up: queued work runs as soon as it is enqueued."""

    name = "run-immediately"

    def on_enqueue(self, dev: SimQueue) -> None:
        dev._run_pending(len(dev._queue))


class LagKSteps(LagPolicy):
    """The GPU lags by k steps: work enqueued in step s runs when step s + k + 1 begins.

    So while the host prepares steps s+1 .. s+k, step s's work is still pending (k = 0: the
    work runs as soon as it is enqueued)."""

    name = "lag-k-steps"

    def __init__(self, k: int = 2):
        if k < 0:
            raise LagPolicyError(f"lag-k-steps needs k >= 0, got {k}")
        self.k = k

    def on_enqueue(self, dev: SimQueue) -> None:
        if self.k == 0:
            dev._run_pending(len(dev._queue))

    def on_step_boundary(self, dev: SimQueue) -> None:
        cutoff = dev.step_index - self.k - 1
        dev._run_leading(lambda item: item.step_index <= cutoff)

    def describe(self) -> dict:
        return {"name": self.name, "k": self.k}


class RandomDrain(LagPolicy):
    """At every enqueue, query and step boundary, a seeded random number of the oldest items run."""

    name = "random-drain"

    def __init__(self, seed: int = 0, p_stall: float = 0.5):
        self.seed = seed
        self.p_stall = p_stall
        self.rng = random.Random(seed)

    def _drain_some(self, dev: SimQueue) -> None:
        pending = len(dev._queue)
        if pending == 0 or self.rng.random() < self.p_stall:
            return
        dev._run_pending(self.rng.randint(1, pending))

    on_enqueue = _drain_some
    on_query = _drain_some
    on_step_boundary = _drain_some

    def describe(self) -> dict:
        return {"name": self.name, "seed": self.seed, "p_stall": self.p_stall}


class HoldAtTarget(LagPolicy):
    """Targeted lag: work runs when enqueued, except a targeted resource's last reader.

    With probability ``p`` such a reader (see `DELAY_TARGETS`) is held for ``1..max_hold`` step
    boundaries (seeded), and the work queued behind it waits with it (stream order).  ``holds``
    counts the held readers per target: a campaign can show that each target was reached.
    """

    name = "hold-at-target"

    def __init__(self, targets: Iterable[str] = tuple(DELAY_TARGETS), seed: int = 0, p: float = 0.5, max_hold: int = 2):
        self.targets = check_delay_targets(targets)
        if not 0 < p <= 1:
            raise LagPolicyError(f"hold-at-target needs 0 < p <= 1, got {p}")
        if max_hold < 1:
            raise LagPolicyError(f"hold-at-target needs max_hold >= 1, got {max_hold}")
        self.seed, self.p, self.max_hold = seed, p, max_hold
        self.rng = random.Random(seed)
        self.holds: Counter[str] = Counter()
        self._release: dict[int, int] = {}  # seq of a held item -> the step index from which it may run

    def on_enqueue(self, dev: SimQueue) -> None:
        item = dev._queue[-1]
        target = delay_target_of(item.label, self.targets)
        if target is not None and self.rng.random() < self.p:
            self._release[item.seq] = dev.step_index + self.rng.randint(1, self.max_hold)
            self.holds[target] += 1
        self._drain(dev)

    def _drain(self, dev: SimQueue) -> None:
        dev._run_leading(lambda item: self._release.get(item.seq, -1) <= dev.step_index)
        for seq in [s for s in self._release if s <= dev._done_seq]:
            del self._release[seq]

    on_step_boundary = _drain
    on_query = _drain

    def describe(self) -> dict:
        return {"name": self.name, "targets": list(self.targets), "seed": self.seed, "p": self.p, "max_hold": self.max_hold}


def make_lag_policy(spec: str | LagPolicy | dict, seed: int = 0) -> LagPolicy:
    """``"run-immediately"``, ``"lag-k-steps"`` / ``"lag-3-steps"``, ``"random-drain"``, ``"hold-at-target"`` /
    ``"hold-at-<target>"`` (one of `DELAY_TARGETS`), or a describe() dict."""
    if isinstance(spec, LagPolicy):
        return spec
    if isinstance(spec, dict):
        name = spec.get("name")
        if name == "run-immediately":
            return RunImmediately()
        if name == "lag-k-steps":
            return LagKSteps(int(spec.get("k", 2)))
        if name == "random-drain":
            return RandomDrain(int(spec.get("seed", seed)), float(spec.get("p_stall", 0.5)))
        if name == "hold-at-target":
            try:
                return HoldAtTarget(spec.get("targets", tuple(DELAY_TARGETS)), int(spec.get("seed", seed)),
                                    float(spec.get("p", 0.5)), int(spec.get("max_hold", 2)))
            except (TypeError, ValueError) as e:
                if isinstance(e, LagPolicyError):
                    raise
                raise LagPolicyError(f"lag policy {spec!r}: {e}") from None
        raise LagPolicyError(f"unknown lag policy {spec!r}; known: {LAG_POLICIES}")
    if spec == "run-immediately":
        return RunImmediately()
    if spec == "random-drain":
        return RandomDrain(seed)
    if spec == "lag-k-steps":
        return LagKSteps(2)
    if spec == "hold-at-target":
        return HoldAtTarget(seed=seed)
    if isinstance(spec, str) and spec.startswith("hold-at-") and spec[len("hold-at-"):] in DELAY_TARGETS:
        return HoldAtTarget((spec[len("hold-at-"):],), seed=seed)
    if isinstance(spec, str) and spec.startswith("lag-") and spec.endswith("-steps"):
        try:
            return LagKSteps(int(spec[4:-6]))
        except ValueError:
            pass
    raise LagPolicyError(f"unknown lag policy {spec!r}; known: {LAG_POLICIES} "
                         f"(or lag-K-steps, hold-at-<target> for a target of {sorted(DELAY_TARGETS)})")

