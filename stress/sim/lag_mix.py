"""The default stress lag mix: random-drain that, in a seeded fraction of steps, holds the step's work.

`runnercheck.impl.lag_policies.RandomDrain` drains a random number of the oldest queued items at
every enqueue, query and step boundary, so with one step in flight the previous step's work has
almost always run by the time the host reads its output: an output is never read before its event,
and a runner that reads its pinned output slot without waiting on the step's event passes.  The mix
keeps random-drain's draws and adds holds: at each step boundary a second seeded generator decides
(``p_hold``) whether the coming step is held -- its enqueues and boundary run nothing -- so the
step's work is still queued when the host reads that step's output, and only the runner's own wait
on the output event runs it.  Queries still drain (a wait must always complete).

The policy is part of the run configuration: a ``lag_policy`` dict ``{"name": "random-drain",
"seed": S, "p_stall": P, "p_hold": H}`` (``p_hold`` present: this mix; absent: plain random-drain,
so repros written before it replay unchanged).  `runnercheck.stress.run.harness.build_session`
builds it.

Ownership: the policy owns its two seeded generators and ``steps_held``, host, one run.
"""
from __future__ import annotations

import random
from typing import Any

from runnercheck.impl.lag_policies import LagPolicyError, RandomDrain, SimQueue

DEFAULT_P_HOLD = 0.25


class HoldingDrain(RandomDrain):
    """Random-drain with whole steps held in a seeded fraction ``p_hold`` (module docstring)."""

    def __init__(self, seed: int = 0, p_stall: float = 0.5, p_hold: float = DEFAULT_P_HOLD):
        if not 0.0 <= p_hold <= 1.0 or not 0.0 <= p_stall <= 1.0:
            raise LagPolicyError(f"random-drain: p_stall {p_stall} and p_hold {p_hold} must lie in [0, 1]")
        super().__init__(seed, p_stall)
        self.p_hold = p_hold
        self.hold_rng = random.Random(seed * 7919 + 1)  # its own stream: random-drain's draws stay the same
        self.holding = False
        self.steps_held = 0

    def _drain_unless_held(self, dev: SimQueue) -> None:
        if self.holding:
            self.rng.random()  # keep the drain draws aligned with an unheld run's
            return
        self._drain_some(dev)

    def on_enqueue(self, dev: SimQueue) -> None:
        self._drain_unless_held(dev)

    def on_step_boundary(self, dev: SimQueue) -> None:
        self._drain_unless_held(dev)
        self.holding = self.hold_rng.random() < self.p_hold
        self.steps_held += self.holding

    def describe(self) -> dict:
        return super().describe() | {"p_hold": self.p_hold}


def lag_policy_for(spec: Any, seed: int) -> Any:
    """The policy a run's ``lag_policy`` names: this mix for a random-drain dict with ``p_hold``, else ``spec``
    unchanged (`runnercheck.impl.device.Device` builds the rest)."""
    if isinstance(spec, dict) and spec.get("name") == "random-drain" and "p_hold" in spec:
        try:
            return HoldingDrain(int(spec.get("seed", seed)), float(spec.get("p_stall", 0.5)), float(spec["p_hold"]))
        except (TypeError, ValueError) as e:
            if isinstance(e, LagPolicyError):
                raise
            raise LagPolicyError(f"lag policy {spec!r}: {e}") from None
    return spec


__all__ = ["HoldingDrain", "DEFAULT_P_HOLD", "lag_policy_for"]
