"""The hidden-sibling probe: its verdict from the slowdowns, and one real (small) run on this machine."""
from __future__ import annotations

import os

import pytest

from runnercheck.bench.lab import host_siblings


def test_a_cpu_that_slows_the_loop_well_past_the_rest_is_named():
    slowdown = {1: 1.01, 2: 0.97, 3: 1.42, 4: 1.05, 5: 0.99}  # CPU 3 shares the timed loop's core
    assert host_siblings.likely_siblings(slowdown) == [3]


def test_drift_within_the_margin_names_no_cpu():
    assert host_siblings.likely_siblings({1: 0.93, 2: 1.08, 3: 1.04}) == []
    assert host_siblings.likely_siblings({}) == []


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_probe_runs_and_reports_every_other_cpu(monkeypatch):
    monkeypatch.setattr(host_siblings, "ROUNDS", 1)
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    result = host_siblings.measure(cpu)
    assert os.sched_getaffinity(0) == before  # unpinned again
    assert result["cpu"] == cpu and result["loop_us_alone"] > 0
    assert sorted(map(int, result["slowdown_beside"])) == sorted(before - {cpu})
