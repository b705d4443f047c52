"""Lag policies of the sim device (`runnercheck.impl.lag_policies`), the targeted one in particular: only the last
device reader of a targeted resource is held, with the work behind it, for whole steps."""
from __future__ import annotations

import pytest
import torch

from runnercheck.impl.device import Device
from runnercheck.impl.lag_policies import DELAY_TARGETS, HoldAtTarget, LagPolicyError, delay_target_of, make_lag_policy


def test_every_target_names_the_labels_of_its_last_reader():
    assert delay_target_of("h2d slot3 step7", DELAY_TARGETS) == "staging-slot"
    assert delay_target_of("d2h output slot1 step2", DELAY_TARGETS) == "output-slot"
    assert delay_target_of("input prep", DELAY_TARGETS) == "input-prep"
    assert delay_target_of("pad step inputs", DELAY_TARGETS) == "input-prep"
    assert delay_target_of("forward", DELAY_TARGETS) is None
    assert delay_target_of("h2d slot0 step0", ("output-slot",)) is None


def test_a_held_reader_and_the_work_behind_it_wait_whole_steps_while_other_work_runs_at_once():
    dev = Device("sim", lag_policy=HoldAtTarget(("staging-slot",), p=1.0, max_hold=1))
    x = dev.zeros(3, torch.int64)
    dev.enqueue(lambda: x[0].fill_(1), "input prep")  # not targeted: runs now
    assert x.tolist() == [1, 0, 0]
    dev.enqueue(lambda: x[1].fill_(1), "h2d slot0 step0")  # targeted: held
    dev.enqueue(lambda: x[2].fill_(1), "forward")  # behind it in stream order: held too
    event = dev.record_event()
    assert x.tolist() == [1, 0, 0] and not event.query()
    dev.begin_step()  # one step boundary: released
    assert x.tolist() == [1, 1, 1] and event.query()
    assert dev.policy.holds == {"staging-slot": 1}


def test_a_host_wait_runs_through_held_work():
    dev = Device("sim", lag_policy=HoldAtTarget(("output-slot",), p=1.0, max_hold=3))
    x = dev.zeros(1, torch.int64)
    dev.enqueue(lambda: x.fill_(5), "d2h output slot0 step0")
    event = dev.record_event()
    assert x.item() == 0
    event.synchronize()
    assert x.item() == 5


def test_the_hold_is_seeded_and_its_description_rebuilds_it():
    def run(policy) -> list[int]:
        dev, order = Device("sim", lag_policy=policy), []
        for step in range(30):
            dev.begin_step()
            dev.enqueue(lambda s=step: order.append(s), f"h2d slot0 step{step}")
        dev.synchronize()
        return order, dev.policy.holds["staging-slot"]

    policy = HoldAtTarget(seed=7, p=0.5, max_hold=3)
    first = run(policy)
    assert first == run(make_lag_policy(HoldAtTarget(seed=7, p=0.5, max_hold=3).describe()))
    assert first[0] == list(range(30)) and 5 < first[1] < 25  # stream order kept; about half held
    assert make_lag_policy("hold-at-output-slot").targets == ("output-slot",)


@pytest.mark.parametrize("spec", ["hold-at-nothing", {"name": "hold-at-target", "targets": ["gpu"]},
                                  {"name": "hold-at-target", "p": 0.0}, {"name": "hold-at-target", "max_hold": 0},
                                  {"name": "hold-at-target", "targets": []}, {"name": "hold-at-target", "p": "often"}])
def test_bad_targeted_policies_are_a_typed_error(spec):
    with pytest.raises(LagPolicyError):
        make_lag_policy(spec)
