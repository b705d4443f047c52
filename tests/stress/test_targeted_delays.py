"""Targeted delays (issue 21): the last device reader of a staging slot, an output slot or the input
prep is held (sim: ``hold-at-target``) or delayed (cuda: ``targeted-delay``), each target is reached,
and each race mutant is caught under its own target's delay."""
from __future__ import annotations

from dataclasses import replace

import pytest

from runnercheck.impl.lag_policies import DELAY_TARGETS
from runnercheck.stress.cli.main import main
from runnercheck.stress.run.harness import ChurnOps, checked_run
from runnercheck.stress.run.config import RunSetupError, TargetedDelay, delay_policy_from_dict
from runnercheck.stress.cli.verify import plan_runs


def _first_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("DIVERGENCE"))


def test_a_targeted_sim_run_passes_and_reaches_every_target() -> None:
    planned = plan_runs("sim", 0, "runnercheck.impl.runner:make_runner", quick=True)[2]
    # 60 ticks: at 40, two of three policy seeds (5, 2) missed a target once RNG v2 changed the sampled tokens.
    config = replace(planned.config, steps=60, lag_policy={"name": "hold-at-target", "seed": 1, "p": 0.5, "max_hold": 2})
    findings = checked_run(config, ChurnOps(planned.churn), name="targeted")
    assert findings.passed, findings.first_divergence_line()
    hits = {t: findings.coverage[f"targeted delay: {t}"] for t in DELAY_TARGETS}
    assert all(n > 0 for n in hits.values()), hits


@pytest.mark.parametrize(("mutant", "target", "check"), [
    ("reuse_staging_early", "staging-slot", "StagingLifetimeError"),
    # Step 0's output decoded from the later steps' bytes: a wrong token, or (their layouts differ) a raise.
    ("output_slot_overwritten_early", "output-slot", "DIVERGENCE step 0"),
])
def test_each_race_mutant_is_caught_under_its_targets_hold_and_replays(tmp_path, capsys, mutant, target, check) -> None:
    out = tmp_path / "d"
    rc = main(["stress", "--device", "sim", "--seed", "1", "--steps", "40", "--mutant", mutant, "--lag-policy",
               f"hold-at-{target}", "--max-inflight", "2", "--no-progress", "--out", str(out)])
    first = _first_line(capsys.readouterr().out)
    assert rc == 1 and check in first
    assert main(["replay", str(out / "repro.json")]) == 1
    assert _first_line(capsys.readouterr().out) == first  # sim holds are seeded: the repro replays bit for bit


class _RecordingDevice:
    """The two methods a delay policy uses, recording what was enqueued and delayed."""

    kind = "cuda"

    def __init__(self) -> None:
        self.log: list[str] = []

    def enqueue(self, fn, label: str = "") -> None:
        self.log.append(label)

    def inject_delay(self, microseconds: float) -> None:
        self.log.append(f"delay {microseconds:.0f}")


def test_the_cuda_policy_delays_right_before_the_targeted_readers_only() -> None:
    device = _RecordingDevice()
    policy = TargetedDelay(seed=0, max_us=100.0, p=1.0, targets=["output-slot"])
    per_step = policy.hook(device)
    per_step(None)
    for label in ("h2d slot0 step0", "input prep", "forward", "d2h output slot0 step0"):
        device.enqueue(lambda: None, label)
    assert [entry.split()[0] for entry in device.log] == ["h2d", "input", "forward", "delay", "d2h"]
    assert policy.delays == {"output-slot": 1}
    assert delay_policy_from_dict(policy.describe()).describe() == policy.describe()


def test_bad_targeted_delays_are_setup_errors(tmp_path, capsys) -> None:
    with pytest.raises(RunSetupError, match="delay targets"):
        TargetedDelay(seed=0, max_us=10.0, targets=["gpu"])
    with pytest.raises(RunSetupError):
        delay_policy_from_dict({"name": "targeted-delay", "seed": 0})
    rc = main(["stress", "--device", "sim", "--delay-target", "output-slot", "--no-progress", "--out", str(tmp_path / "d")])
    assert rc == 2 and "hold-at-<target>" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
