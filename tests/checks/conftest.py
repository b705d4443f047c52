"""Shared set-up of the slot-checksum tests: a quick sim run held at one delay target."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import pytest

from runnercheck.stress.cli.verify import plan_runs


def held_at(target: str, mutant: str | None = None, steps: int = 30):
    """(config, churn) of the quick sim plan's first run, its reader of ``target`` held (seeded), two steps in flight."""
    planned = plan_runs("sim", 0, "runnercheck.impl.runner:make_runner", quick=True)[0]
    # Policy seed 2: under seed 3 the quick plan's traffic (with full prompt-logprob chunks) makes the held
    # reuse_staging_early run read stale bytes as indices past the interpreted kernels' tensors at step 1: the
    # memory detector's finding (tests/stress/test_kernel_memory.py) stops the run before the slot checksum is compared.
    lag = {"name": "hold-at-target", "targets": [target], "seed": 2, "p": 0.5, "max_hold": 2}
    config = replace(planned.config, steps=steps, mutant=mutant, lag_policy=lag,
                     scheduler=replace(planned.config.scheduler, max_inflight_steps=2))
    # the draws these tests were measured with (verify's churn gained top-k tie draws after them)
    return config, replace(planned.churn, tie_top_k_prob=0.0)


@pytest.fixture
def held_sim_run() -> Callable:
    return held_at
