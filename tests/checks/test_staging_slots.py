"""Staging-slot checksums (`runnercheck.checks.detectors.staging_slots`): the bytes a step's kernels read from a staging slot
must be the bytes its host staged; a slot the host rewrote before its H2D ran is named with the step
that took it, a device buffer written by anything but its own copy is named too, and a correct
runner under staging lag is clean."""
from __future__ import annotations

from dataclasses import replace

import pytest

from runnercheck.stress.run.harness import ChurnOps, checked_run
from runnercheck.stress.cli.verify import plan_runs


def test_a_correct_runner_under_staging_lag_is_clean(held_sim_run) -> None:
    config, churn = held_sim_run("staging-slot")
    findings = checked_run(config, ChurnOps(churn), name="clean")
    assert findings.passed and findings.violations("sync") == 0 and findings.violations("lifetime") == 0
    assert findings.coverage["targeted delay: staging-slot"] > 0


def test_a_slot_rewritten_before_its_copy_ran_names_the_step_that_took_it(held_sim_run) -> None:
    config, churn = held_sim_run("staging-slot", "reuse_staging_early")
    findings = checked_run(config, ChurnOps(churn), name="mutant")
    staging = [e for e in findings.detectors["lifetime"].lines if "host did not stage" in e]
    assert staging, findings.detectors["lifetime"].lines
    assert "read bytes its host did not stage" in staging[0] and "was taken by step(s)" in staging[0]


def test_a_device_write_into_a_staging_buffer_is_caught_without_any_race(monkeypatch, held_sim_run) -> None:
    from runnercheck.impl.buffers import StagingPool

    submit, submit_enqueued = StagingPool.submit, StagingPool.submit_enqueued
    submits = []

    def scribble(pool, slot, target) -> None:  # planted: device work that writes where a slot's bytes landed
        submits.append(slot.step)
        if len(submits) == 5 and slot.used_bytes:
            last = target[slot.used_bytes - 1 : slot.used_bytes]
            pool.device.enqueue(lambda: last.bitwise_xor_(1), "scribble")

    def submit_then_scribble(pool, slot):
        target = slot.device if slot.copy_to is None else slot.copy_to  # where the copy lands (a graph's step buffer)
        submit(pool, slot)
        scribble(pool, slot, target)

    def submit_enqueued_then_scribble(pool, slot, event, nbytes, landed_in):  # a fused step: after its replay
        submit_enqueued(pool, slot, event, nbytes, landed_in)
        scribble(pool, slot, landed_in)

    monkeypatch.setattr(StagingPool, "submit", submit_then_scribble)
    monkeypatch.setattr(StagingPool, "submit_enqueued", submit_enqueued_then_scribble)
    config, churn = held_sim_run("staging-slot", steps=12)
    findings = checked_run(replace(config, lag_policy=None), ChurnOps(churn), name="scribbled")
    staging = [e for e in findings.detectors["lifetime"].lines if "host did not stage" in e]
    assert len(staging) == 1 and "written by something else" in staging[0], findings.detectors["lifetime"].lines


@pytest.mark.gpu
def test_on_cuda_a_slot_rewritten_before_its_copy_ran_is_caught_by_the_device_checksum() -> None:
    from runnercheck.stress.run.isolation import isolated_run
    from runnercheck.stress.sim.races import calibrate_cuda_delay, measure_host_tick_us

    planned = plan_runs("cuda", 0, "runnercheck.impl.runner:make_runner", quick=True)[0]
    tick_us = measure_host_tick_us(replace(planned.config, steps=12))
    config = replace(planned.config, steps=60, mutant="reuse_staging_early",
                     delay_policy=calibrate_cuda_delay(0, tick_us, targets=("staging-slot",)),
                     scheduler=replace(planned.config.scheduler, max_inflight_steps=3))
    # Each run in a child process: the corrupted rows can trip a device-side assert, which is sticky
    # and would fail every later cuda test of this process.  A run whose device died before the
    # checksum's event completed has no device checksum to compare, so the next seed is tried; a run
    # that lived must name the slot.  Count mode: the run goes on past the host's finding.
    device_deaths = []
    for seed in range(3):
        findings = isolated_run(replace(config, seed=seed), ChurnOps(planned.churn), name="mutant")
        caught = any("read bytes its host did not stage" in e for e in findings.detectors["lifetime"].lines)
        died = [d.line() for d in findings.result.divergences if d.kind in ("runner-error", "kernel-memory", "crash")]
        if caught or not died:
            break
        device_deaths.append(died[0])
    assert caught, (device_deaths, findings.detectors["lifetime"].lines)
