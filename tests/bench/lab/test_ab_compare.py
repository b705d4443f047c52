"""`runnercheck.bench.lab.ab_compare`: pass pairs of two trees' host_cost ratios, their medians and a paired test that can tell
a change that held in every pair from one that did not."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from runnercheck.bench.lab.ab_compare import RATIO_PREFIX, compare, main, pairs

ROW = "64 decode reqs, 1% churn"


def _pass(folder: Path, ratio: float) -> None:
    folder.mkdir(parents=True)
    rows = [{"case": "host_cost", "name": RATIO_PREFIX + ROW, "value": ratio, "unit": "x"},
            {"case": "host_cost", "name": "runner execute_model host time, " + ROW, "value": 100.0, "unit": "us"}]
    (folder / "bench.json").write_text(json.dumps({"rows": rows}))


def _runs(tmp_path: Path, base: list[float], new: list[float]) -> list[Path]:
    """Two hosts' folders, the pairs split between them."""
    dirs = [tmp_path / "run_a", tmp_path / "run_b"]
    for k, (b, n) in enumerate(zip(base, new)):
        root = dirs[k % 2]
        _pass(root / f"base_{k // 2 + 1}", b)
        _pass(root / f"new_{k // 2 + 1}", n)
    return dirs


def test_a_change_that_held_in_every_pair_is_told_from_one_that_did_not(tmp_path):
    drifting = [0.70, 0.60, 0.74, 0.62, 0.67, 0.64]  # a host's drift, pass to pass
    better = compare(pairs(_runs(tmp_path / "better", drifting, [b - 0.05 for b in drifting])))[ROW]
    assert better["pairs"] == 6 and better["pairs_down"] == 6 and better["wilcoxon_p"] == pytest.approx(1 / 32)
    assert better["new_median"] == pytest.approx(better["base_median"] - 0.05)
    mixed = compare(pairs(_runs(tmp_path / "mixed", drifting, [0.60, 0.65, 0.65, 0.64, 0.64, 0.61])))[ROW]
    assert mixed["pairs_down"] == 4 and mixed["wilcoxon_p"] > 0.2


def test_a_pass_without_its_pair_is_refused(tmp_path, capsys):
    _pass(tmp_path / "base_1", 0.5)
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "new_1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path / "empty")])


def test_the_comparison_is_printed_and_written(tmp_path, capsys):
    dirs = _runs(tmp_path, [0.5, 0.6], [0.4, 0.5])
    assert main([str(d) for d in dirs] + ["--out", str(tmp_path / "ab.json")]) == 0
    assert ROW in capsys.readouterr().out
    assert json.loads((tmp_path / "ab.json").read_text())[ROW]["pairs_down"] == 2
