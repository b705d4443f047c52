"""Issue 7's acceptance path: a mutant's race is caught, recorded and replayed from the repro."""
from __future__ import annotations

import pytest

from runnercheck.stress.cli.main import main


def _first_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("DIVERGENCE"))


def test_reuse_staging_early_is_caught_recorded_and_replayed(tmp_path, capsys):
    out = tmp_path / "d"
    rc = main(["stress", "--device", "sim", "--mutant", "reuse_staging_early", "--seed", "1", "--steps", "10",
               "--no-progress", "--out", str(out)])
    first = _first_line(capsys.readouterr().out)
    assert rc == 1
    assert (out / "repro.json").is_file()
    assert "StagingLifetimeError" in first
    rc = main(["replay", str(out / "repro.json")])
    assert rc == 1
    assert _first_line(capsys.readouterr().out) == first


def test_same_command_without_the_mutant_passes(tmp_path):
    rc = main(["stress", "--device", "sim", "--seed", "1", "--steps", "10", "--no-progress", "--out", str(tmp_path / "d")])
    assert rc == 0
    assert not (tmp_path / "d" / "repro.json").exists()


@pytest.mark.gpu
def test_cuda_with_calibrated_delays_catches_reuse_staging_early(tmp_path, capsys):
    """On a real GPU the race shows only while the GPU trails the host: delays calibrated on the host tick."""
    out = tmp_path / "d"
    rc = main(["stress", "--device", "cuda", "--mutant", "reuse_staging_early", "--seed", "1", "--steps", "120",
               "--delay-us", "auto", "--max-inflight", "3", "--no-progress", "--out", str(out)])
    first = _first_line(capsys.readouterr().out)
    assert rc == 1, "the mutant survived"
    assert (out / "repro.json").is_file()
    assert "StagingLifetimeError" in first
