"""Run one invariance scenario through a fresh runner and record what each probe produced.

Each scenario gets its own runner from the factory (so no state of an earlier scenario -- rows,
KV blocks, graphs -- is shared) and its own `runnercheck.stress.sim.scheduler.SchedulerSim`, driven one step
at a time (schedule, execute, read the output, update): the outputs of a request then depend only
on what shared its steps, which is what the check is about.  Host-side only; the runner owns every
device tensor.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from runnercheck.impl.interface import RunnerLimits, TokenLogprobs
from runnercheck.stress.invariance.scenarios import Scenario
from runnercheck.stress.sim.scheduler import SchedulerSim


@dataclass(frozen=True)
class StepBatch:
    """What a step held: its id, request ids in scheduled order, and its token count."""

    step_id: int
    req_ids: tuple[str, ...]
    num_tokens: int

    def describe(self) -> str:
        return f"step {self.step_id}: {len(self.req_ids)} requests, {self.num_tokens} tokens ({' '.join(self.req_ids)})"


@dataclass
class ProbeTrace:
    """One probe's outputs in one scenario: sampled tokens (with their logprobs and the step that
    sampled each) and its prompt logprobs, in order."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    steps: list[StepBatch] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_steps: list[StepBatch] = field(default_factory=list)


@dataclass
class ScenarioTrace:
    scenario: Scenario
    probes: dict[str, ProbeTrace]
    steps: int = 0
    cached_tokens: int = 0  # prefill tokens served from the prefix cache
    error: str | None = None  # the runner or scheduler raised: the run stopped there


class ScenarioStalled(RuntimeError):
    """The scenario did not finish within its step limit."""


def run_scenario(build_runner: Callable[[], Any], limits: RunnerLimits, scenario: Scenario, *, seed: int,
                 max_steps: int = 500) -> ScenarioTrace:
    """Run ``scenario`` through ``build_runner()`` and return each probe's trace.

    An exception from the runner or the scheduler ends the run and is recorded in ``error`` (a
    runner that crashes only in some batches is a finding too)."""
    trace = ScenarioTrace(scenario, {a.req_id: ProbeTrace() for a in scenario.probes})
    sched_limits = limits if scenario.step_budget is None else replace(limits, max_num_batched_tokens=scenario.step_budget)
    try:
        runner = build_runner()
        scheduler = SchedulerSim(sched_limits, seed=seed, prefix_caching=scenario.prefix_caching)
        pending = sorted(scenario.arrivals, key=lambda a: a.tick)
        tick = 0
        while pending or scheduler.has_work:
            while pending and pending[0].tick <= tick:
                a = pending.pop(0)
                scheduler.add_request(a.req_id, a.request.prompt, a.request.params)
            tick += 1
            if not scheduler.can_schedule:
                if scheduler.has_work and not pending:
                    raise ScenarioStalled(f"the scheduler has work but cannot schedule at tick {tick}")
                continue
            if trace.steps >= max_steps:
                raise ScenarioStalled(f"not finished after {max_steps} steps")
            sched = scheduler.schedule()
            out = runner.execute_model(sched).get()
            trace.steps += 1
            batch = StepBatch(sched.step_id, tuple(sched.num_scheduled_tokens), sum(sched.num_scheduled_tokens.values()))
            _record(trace, out, batch)
            scheduler.update(out)
        trace.cached_tokens = scheduler.stats.cached_tokens
    except Exception as e:  # noqa: BLE001 - a crash in one batch shape is what the report must show
        trace.error = f"{type(e).__name__}: {e}"
    return trace


def _record(trace: ScenarioTrace, out: Any, batch: StepBatch) -> None:
    for i, rid in enumerate(out.req_ids):
        probe = trace.probes.get(rid)
        if probe is None:
            continue
        toks = out.sampled_token_ids[i]
        lps = out.logprobs[i] if i < len(out.logprobs) and out.logprobs[i] is not None else (None,) * len(toks)
        probe.tokens.extend(toks)
        probe.logprobs.extend(lps)
        probe.steps.extend([batch] * len(toks))
    for rid, rows in out.prompt_logprobs.items():
        probe = trace.probes.get(rid)
        if probe is not None:
            probe.prompt_logprobs.extend(rows)
            probe.prompt_steps.extend([batch] * len(rows))


__all__ = ["StepBatch", "ProbeTrace", "ScenarioTrace", "ScenarioStalled", "run_scenario"]
