"""The batch-invariance check: the same requests alone and in batches must give the same bits.

`check_invariance` builds the model weights once, then for every scenario of
`runnercheck.stress.invariance.scenarios.plan_scenarios` a fresh runner from the factory (the
``--runner`` contract of `runnercheck.stress.run.runners`; ``batch_invariant=True`` and
``cuda_graphs`` are passed to factories that take them), runs it (`runnercheck.stress.invariance.execute`),
and compares every probe's tokens and logprobs with its alone run
(`runnercheck.stress.invariance.compare`).  ``prepare(runner)`` is called on each runner right after it
is built (the mutants of `runnercheck.stress.mutants.batch` are installed that way).

No oracle is involved: the alone run is the reference.  A runner can be wrong and still pass (it
is then wrong the same way in every batch); the differential check is for that.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from runnercheck.checks.loader import accepts_keyword
from runnercheck.impl.interface import RunnerLimits
from runnercheck.impl.model.weights import ModelConfig
from runnercheck.stress.invariance.compare import Difference, first_difference
from runnercheck.stress.invariance.execute import ScenarioTrace, run_scenario
from runnercheck.stress.invariance.scenarios import SCENARIO_KINDS, ScenarioPlan, make_probes, plan_scenarios


@dataclass(frozen=True)
class InvarianceConfig:
    """Everything a check depends on (recorded in the report)."""

    device: str
    seed: int
    model: ModelConfig
    limits: RunnerLimits
    num_probes: int = 3
    max_tokens: int = 6
    batch_sizes: tuple[int, ...] | None = None  # None: 2..max_num_reqs
    kinds: tuple[str, ...] = SCENARIO_KINDS
    tolerance: float = 0.0  # absolute logprob tolerance; 0: bitwise
    cuda_graphs: bool = True
    lag_policy: str = "random-drain"  # sim only

    def to_dict(self) -> dict:
        return {"device": self.device, "seed": self.seed, "model": self.model.to_dict(), "limits": self.limits.__dict__,
                "num_probes": self.num_probes, "max_tokens": self.max_tokens,
                "batch_sizes": None if self.batch_sizes is None else list(self.batch_sizes), "kinds": list(self.kinds),
                "tolerance": self.tolerance, "cuda_graphs": self.cuda_graphs, "lag_policy": self.lag_policy}


@dataclass
class ScenarioOutcome:
    name: str
    kind: str
    change: str
    steps: int
    probes: tuple[str, ...]
    cached_tokens: int
    differences: list[Difference]
    error: str | None
    seconds: float

    @property
    def passed(self) -> bool:
        return not self.differences and self.error is None

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "change": self.change, "steps": self.steps,
                "probes": list(self.probes), "cached_tokens": self.cached_tokens, "passed": self.passed,
                "error": self.error, "seconds": round(self.seconds, 3),
                "differences": [d.to_dict() for d in self.differences]}


@dataclass
class InvarianceResult:
    config: InvarianceConfig
    runner: str
    runner_kwargs: dict
    probes: list[str]
    scenarios: list[ScenarioOutcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(s.passed for s in self.scenarios)

    @property
    def differences(self) -> list[Difference]:
        return [d for s in self.scenarios for d in s.differences]

    @property
    def first_difference(self) -> Difference | None:
        diffs = self.differences
        return diffs[0] if diffs else None

    def failure_lines(self) -> list[str]:
        lines = [f"scenario {s.name!r} crashed: {s.error}" for s in self.scenarios if s.error]
        return lines + [d.line() for d in self.differences]


class InvarianceSetupError(RuntimeError):
    """The runner could not be built at all (before any scenario ran)."""


def runner_kwargs(factory: Callable, cuda_graphs: bool) -> dict:
    """The keywords the check passes: batch_invariant=True and cuda_graphs, to factories that take them."""
    kwargs: dict = {}
    if accepts_keyword(factory, "batch_invariant"):
        kwargs["batch_invariant"] = True
    if accepts_keyword(factory, "cuda_graphs"):
        kwargs["cuda_graphs"] = cuda_graphs
    return kwargs


def check_invariance(factory: Callable, config: InvarianceConfig, *, runner_name: str = "",
                     prepare: Callable[[Any], Any] | None = None,
                     on_scenario: Callable[[ScenarioOutcome, int, int], None] | None = None,
                     partial: list[InvarianceResult] | None = None,
                     on_start: Callable[[InvarianceResult], None] | None = None) -> InvarianceResult:
    """Run every scenario of ``config`` through runners from ``factory``; see the module docstring.

    ``partial``: the result is appended to it before the first scenario runs and filled in as they
    finish, so a caller interrupted mid-check still holds the scenarios that finished; ``on_start``
    gets the (empty) result as soon as the probes are known."""
    from runnercheck.impl.device import Device
    from runnercheck.impl.model.weights import random_weights

    started = time.perf_counter()
    weights = random_weights(config.model, seed=config.seed)
    kwargs = runner_kwargs(factory, config.cuda_graphs)
    device = Device(config.device, seed=config.seed, lag_policy=config.lag_policy)
    keep: list[Any] = []  # what `prepare` returned (installed mutants) lives as long as the check

    def build() -> Any:
        runner = factory(weights, config.limits, device, config.seed, **kwargs)
        if prepare is not None:
            keep.append(prepare(runner))
        return runner

    probes = make_probes(config.limits, seed=config.seed, num_probes=config.num_probes, max_tokens=config.max_tokens)
    plan: ScenarioPlan = plan_scenarios(probes, config.limits, seed=config.seed, batch_sizes=config.batch_sizes,
                                        kinds=config.kinds, max_tokens=config.max_tokens)
    result = InvarianceResult(config, runner_name, kwargs, [p.describe() for p in probes])
    if partial is not None:
        partial.append(result)
    if on_start is not None:
        on_start(result)
    total = len(plan.alone) + len(plan.batched)
    alone: dict[str, Any] = {}
    for i, scenario in enumerate(plan.alone + plan.batched):
        t0 = time.perf_counter()
        trace: ScenarioTrace = run_scenario(build, config.limits, scenario, seed=config.seed)
        if i == 0 and trace.error is not None and trace.steps == 0:
            raise InvarianceSetupError(f"the runner failed alone, before any step: {trace.error}")
        diffs: list[Difference] = []
        if scenario.kind == "alone":
            alone.update(trace.probes)
        else:
            for arrival in scenario.probes:
                ref = alone.get(arrival.req_id)
                if ref is None:
                    continue  # its alone run crashed: reported there
                d = first_difference(scenario.name, scenario.change, arrival.req_id, arrival.request.describe(),
                                     arrival.request.params.temperature == 0, ref, trace.probes[arrival.req_id],
                                     config.tolerance)
                if d is not None and (trace.error is None or d.kind != "length"):
                    diffs.append(d)
        outcome = ScenarioOutcome(scenario.name, scenario.kind, scenario.change, trace.steps,
                                  tuple(a.req_id for a in scenario.probes), trace.cached_tokens, diffs, trace.error,
                                  time.perf_counter() - t0)
        result.scenarios.append(outcome)
        if on_scenario is not None:
            on_scenario(outcome, i + 1, total)
    result.seconds = time.perf_counter() - started
    return result


def mutant_config(device: str, seed: int) -> InvarianceConfig:
    """The small check `runnercheck mutants` runs against a mutant built for the ``invariance`` check:
    the micro model, two probes (greedy and sampled), one batch of all probes and one of three rows."""
    from runnercheck.impl.model.weights import preset
    from runnercheck.stress.run.config import default_limits

    model = preset("micro")
    return InvarianceConfig(device, seed, model, default_limits(model, max_num_reqs=4, num_kv_blocks=32), num_probes=2,
                            max_tokens=6, batch_sizes=(3,), kinds=("batch", "size"))


def run_mutant_check(mutant: str, device: str, seed: int, runner_spec: str = "runnercheck.impl.runner:make_runner",
                     ) -> tuple[InvarianceResult, str | None]:
    """`mutant_config`'s check with ``mutant`` installed into every runner: the result and the first
    difference's line (None: the mutant survived)."""
    from runnercheck.stress.run.harness import apply_mutant, load_runner_factory

    factory = load_runner_factory(runner_spec)
    result = check_invariance(factory, mutant_config(device, seed), runner_name=runner_spec,
                              prepare=lambda runner: apply_mutant(mutant, runner))
    lines = result.failure_lines()
    return result, (lines[0] if lines else None)


__all__ = ["InvarianceConfig", "mutant_config", "run_mutant_check", "InvarianceResult", "ScenarioOutcome", "InvarianceSetupError", "check_invariance",
           "runner_kwargs"]
