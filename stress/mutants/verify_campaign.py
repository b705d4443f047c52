"""`runnercheck mutants --campaign verify`: a mutant run through the runs of `runnercheck verify` itself.

The catalogue's default campaign runs each mutant under its own `runnercheck.stress.mutants.catalogue.Workload`, traffic
built to expose it.  A user's question is a different one: does the job I run in CI, `verify`,
catch this bug?  Under ``--campaign verify`` a mutant's differential part runs the plan of
``verify --device D`` (`runnercheck.stress.cli.verify.plan_runs`; ``--quick``: the quick plan) in order, each run
with the mutant installed and the mutant runs' own strict settings (lifetime errors raise, the run
stops at its first host sync), until one of them kills it.  On cuda the delays are calibrated on
the measured host tick, as verify does.  ``--seeds N`` then gives the kill rate of the verify
campaign per mutant: the issue's "the default verify campaign kills each race mutant in every run".

The cuda full plan begins with the quick plan's runs (the same names, seeds and traffic, longer), so
a quick-plan kill is also a full-plan kill up to GPU timing.

Control: the plan without a mutant, in the same order, for as many ticks in total as the slowest
kill took (quick) or the whole plan (full).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

CAMPAIGNS = ("workloads", "verify")


def campaign_name(quick: bool) -> str:
    """The workload name a verify-campaign result carries (reports group controls by it)."""
    return "verify --quick" if quick else "verify"


def verify_plan(device_kind: str, seed: int, quick: bool, cuda_graphs: bool) -> list[Any]:
    from runnercheck.stress.run.runners import DEFAULT_RUNNER_SPEC
    from runnercheck.stress.cli.verify import plan_runs

    cuda_delay = None
    if device_kind == "cuda":
        from runnercheck.stress.sim.races import calibrate_cuda_delay, measure_host_tick_us

        warmup = plan_runs("cuda", seed, DEFAULT_RUNNER_SPEC, quick=True, ticks=12, max_runs=1, cuda_graphs=cuda_graphs)[0]
        tick_us = measure_host_tick_us(warmup.config)

        def cuda_delay(run_seed: int, targets: Any = None) -> dict:
            return calibrate_cuda_delay(run_seed, tick_us, targets=targets)

    return plan_runs(device_kind, seed, DEFAULT_RUNNER_SPEC, quick=quick, cuda_delay=cuda_delay, cuda_graphs=cuda_graphs)


def plan_ticks(device_kind: str, seed: int) -> int:
    """Ticks of the whole full plan (a full control's budget; the delays do not change it)."""
    from runnercheck.stress.run.runners import DEFAULT_RUNNER_SPEC
    from runnercheck.stress.cli.verify import plan_runs

    return sum(p.config.steps for p in plan_runs(device_kind, seed, DEFAULT_RUNNER_SPEC, quick=False))


def run_verify_campaign(device_kind: str, seed: int, quick: bool, check: Callable[..., Any], total: Any, *,
                        mutant: str | None = None, budget: int | None = None, isolate: bool = True,
                        cuda_graphs: bool = True, csan: bool = False) -> Any:
    """The plan's runs in order with ``mutant`` installed until one kills it (None: a control of ``budget``
    ticks in total, default the whole plan), each through ``check(config, ops, name, isolate=)`` (the
    catalogue's `runnercheck.stress.cli.mutants_cmd.checked_differential`), summed into ``total`` (an empty `CheckRun`)."""
    from runnercheck.stress.run.harness import ChurnOps

    remaining = budget
    for planned in verify_plan(device_kind, seed, quick, cuda_graphs):
        if remaining is not None and remaining <= 0:
            break
        steps = planned.config.steps if remaining is None else min(planned.config.steps, remaining)
        config = replace(planned.config, steps=steps, mutant=mutant, csan=csan)
        name = f"{mutant or 'control'} in verify run {planned.name!r}"
        run = check(config, ChurnOps(planned.churn), name, isolate=isolate)
        total.ran = list(dict.fromkeys(total.ran + run.ran))
        total.ticks += run.ticks
        total.tokens += run.tokens
        total.seconds += run.seconds
        if remaining is not None:
            remaining -= run.ticks
        if run.fired:
            total.fired = {check: f"[{planned.name}] {text}" for check, text in run.fired.items()}
            break
    return total


__all__ = ["CAMPAIGNS", "campaign_name", "plan_ticks", "run_verify_campaign", "verify_plan"]
