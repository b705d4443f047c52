"""Output-slot checksums (`runnercheck.checks.detectors.output_slots`): the bytes a step decodes from its pinned output slot
must be the bytes its D2H copied; a slot overwritten before its holder read it is named with the
steps that overwrote it, and a correct runner under lag is clean without any host wait in a step."""
from __future__ import annotations

import numpy as np
import torch

from runnercheck.checks.detectors.checksums import device_checksum as _device_checksum, weighted_checksum_host
from runnercheck.stress.run.harness import ChurnOps, checked_run


def test_host_and_device_checksums_agree_and_see_one_changed_byte() -> None:
    data = np.random.default_rng(0).integers(0, 256, 70000, dtype=np.uint8)
    assert weighted_checksum_host(data) == int(_device_checksum(torch.from_numpy(data)))
    changed = data.copy()
    changed[69999] ^= 1
    assert weighted_checksum_host(changed) != weighted_checksum_host(data)


def test_a_correct_runner_under_output_slot_lag_is_clean_and_never_waits_in_a_step(held_sim_run) -> None:
    config, churn = held_sim_run("output-slot")
    findings = checked_run(config, ChurnOps(churn), name="clean")
    assert findings.passed and findings.violations("sync") == 0 and findings.violations("lifetime") == 0
    assert findings.coverage["targeted delay: output-slot"] > 0


def test_a_slot_overwritten_before_its_holder_read_it_names_the_slot_and_the_overwriting_steps(held_sim_run) -> None:
    config, churn = held_sim_run("output-slot", "output_slot_overwritten_early")
    findings = checked_run(config, ChurnOps(churn), name="mutant")
    assert findings.violations("lifetime") >= 1
    first = next(e for e in findings.detectors["lifetime"].lines if e.startswith("output slot"))
    assert "decoded bytes its D2H did not copy" in first and "overwritten by the copy of step" in first
