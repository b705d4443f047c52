"""`runnercheck.checks.detectors.prefix_cache` (what a checked run reports about the prefix cache and KV provenance) and
the prefix-caching mutants of `runnercheck.stress.mutants.prefix`."""
from __future__ import annotations

import pytest

from runnercheck.impl.device import Device
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import make_runner
from runnercheck.stress.mutants import catalogue
from runnercheck.stress.sim.churn import Churn
from runnercheck.stress.run.driver import DifferentialRun
from runnercheck.stress.cli.mutants_cmd import MutantsOptions, run_catalogue
from runnercheck.stress.mutants.prefix import PREFIX_MUTANTS, PREFIX_WORKLOAD
from runnercheck.checks.detectors.prefix_cache import arm_prefix_checks
from runnercheck.stress.run.runners import simple_runner
from runnercheck.stress.sim.scheduler import SchedulerSim
from runnercheck.stress.run.config import default_limits


def _limits():
    w = PREFIX_WORKLOAD
    return default_limits(preset("micro"), max_num_reqs=w.max_num_reqs, block_size=w.block_size,
                          num_kv_blocks=w.num_kv_blocks, max_num_batched_tokens=w.max_batched_tokens)


def _run(runner, mutant: str | None = None, ticks: int = 8):
    from runnercheck.reference.runner import ReferenceRunner

    limits = _limits()
    weights = random_weights(preset("micro"), seed=0)
    scheduler = SchedulerSim(limits, seed=0, max_inflight_steps=1)
    if mutant:
        catalogue.apply(mutant, runner=runner, scheduler=scheduler)
    prefix = arm_prefix_checks(runner, scheduler)
    churn = Churn(limits, 0, PREFIX_WORKLOAD.churn)
    result = DifferentialRun(runner, ReferenceRunner(weights, limits, base_seed=0), scheduler, before_tick=churn).run(ticks)
    return result, prefix.findings()


def test_findings_of_a_clean_run_report_the_hit_rate_and_a_clean_provenance() -> None:
    runner = make_runner(random_weights(preset("micro"), seed=0), _limits(), Device("sim", seed=0), 0)
    result, findings = _run(runner)
    assert result.ok and findings.passed and findings.provenance_checked
    assert findings.prefix_caching and findings.prefix_hits > 0 and 0 < findings.hit_rate < 1
    assert findings.cached_tokens <= findings.prefill_tokens
    assert "kv provenance: clean" in findings.line() and "prefill tokens from the cache" in findings.line()
    assert findings.to_dict()["passed"] is True


def test_a_planted_prefix_bug_fails_the_findings_with_the_violation_named() -> None:
    runner = make_runner(random_weights(preset("micro"), seed=0), _limits(), Device("sim", seed=0), 0)
    _, findings = _run(runner, mutant="prefix_hit_recomputes_cached_block")
    assert not findings.passed and findings.provenance_violations > 0
    assert "write-position" in findings.provenance_lines[0] and "violation(s), first:" in findings.line()


def test_a_runner_without_an_input_batch_gets_no_provenance_check_but_a_hit_rate() -> None:
    limits = _limits()
    runner = simple_runner(random_weights(preset("micro"), seed=0), limits, None, 0)
    result, findings = _run(runner, ticks=6)
    assert result.ok and not findings.provenance_checked and findings.passed
    assert "not checked" in findings.line()


def test_scheduler_mutants_patch_the_scheduler_and_undo_restores_it() -> None:
    for name in PREFIX_MUTANTS:
        mutant = catalogue.get(name)
        assert set(mutant.checks) == {"provenance", "differential"} and mutant.workload == "prefix"
        if mutant.target != "scheduler":
            continue
        sim = SchedulerSim(_limits())
        before = (dict(vars(sim)), dict(vars(sim.blocks)))
        with catalogue.apply(name, scheduler=sim):
            assert (dict(vars(sim)), dict(vars(sim.blocks))) != before
        assert (dict(vars(sim)), dict(vars(sim.blocks))) == before
    with pytest.raises(catalogue.MutantTargetError):  # a scheduler mutant given only a runner
        catalogue.apply("evicted_block_still_referenced", runner=object())


@pytest.mark.slow
def test_every_prefix_mutant_is_killed_by_the_provenance_check_on_sim() -> None:
    report = run_catalogue(MutantsOptions(device="sim", quick=True, seed=0, only=tuple(PREFIX_MUTANTS)))
    for m in report.mutants:
        assert m.as_designed and "provenance" in m.killed_by, (m.name, m.killed_by)
    assert all(c.clean for c in report.controls) and report.controls


def test_the_prefix_churn_shares_prompts_across_requests() -> None:
    limits = _limits()
    sim = SchedulerSim(limits, seed=0)
    churn = Churn(limits, 0, PREFIX_WORKLOAD.churn)
    for tick in range(6):
        churn(tick, sim)
    prompts = [op["prompt"] for ops in churn.trace for op in ops if op["op"] == "add"]
    system = churn.system_prompts
    assert sum(any(p[: len(s)] == s for s in system) for p in prompts) >= len(prompts) // 2
