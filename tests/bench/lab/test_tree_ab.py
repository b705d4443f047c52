"""`runnercheck.bench.lab.tree_ab`: two trees' host steps interleaved on the dev box, over fresh worker pairs.  A tree whose every
step is planted 400 us slower is seen slower in every pair; bad trees and counts are refused with typed errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from runnercheck.bench.lab.tree_ab import MAX_STEPS, TreeAbError, compare_trees, main

HERE = Path(__file__).resolve().parents[3]  # this checkout: both sides of the comparison


def test_a_planted_slowdown_is_seen_in_every_pair() -> None:
    got = compare_trees(HERE, HERE, num_reqs=8, pairs=2, blocks=4, block_steps=3,
                        new_env={"RUNNERCHECK_TREE_AB_DELAY_US": "400"})
    assert got["pairs_faster"] == 0
    assert got["new_over_base_all"] > 1.5, got
    for run in got["runs"]:
        assert run["new"]["all_us"] - run["base"]["all_us"] > 300, run
        assert run["base"]["admitting_steps"] + run["base"]["other_steps"] == 12


def test_the_same_tree_against_itself_runs_the_same_steps() -> None:
    run = compare_trees(HERE, HERE, num_reqs=8, pairs=1, blocks=2, block_steps=3)["runs"][0]
    for side in ("base", "new"):  # one seeded workload: the same admitting steps on both sides
        assert run[side]["admitting_steps"] == run["base"]["admitting_steps"]
        assert run[side]["all_us"] > 0


def test_what_it_refuses(tmp_path: Path) -> None:
    with pytest.raises(TreeAbError, match="not a runnercheck tree"):
        compare_trees(tmp_path, HERE, num_reqs=8, blocks=1, block_steps=1)
    with pytest.raises(ValueError, match="a workload allows"):
        compare_trees(HERE, HERE, num_reqs=8, blocks=MAX_STEPS, block_steps=1)
    with pytest.raises(ValueError, match=">= 1"):
        compare_trees(HERE, HERE, num_reqs=8, blocks=0)
    with pytest.raises(ValueError, match=">= 1"):
        compare_trees(HERE, HERE, num_reqs=8, pairs=0)
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--reqs", "8", "--blocks", "1", "--block-steps", "1"])
    with pytest.raises(SystemExit):
        main([str(HERE), "--churn", "2"])


def test_the_cli_writes_its_figures(tmp_path: Path, capsys) -> None:
    out = tmp_path / "ab.json"
    assert main([str(HERE), "--reqs", "8", "--pairs", "1", "--blocks", "2", "--block-steps", "2", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert [c["num_reqs"] for c in written["configurations"]] == [8]
    assert json.loads(capsys.readouterr().out) == written


def test_a_cuda_worker_is_not_pinned_to_one_core() -> None:
    from runnercheck.bench.lab.tree_ab import _placement
    cpu, cuda = _placement("cpu"), _placement("cuda")
    if not cpu:
        pytest.skip("no setarch/taskset here")
    assert "taskset" in cpu and "taskset" not in cuda and "-R" in cuda


def test_an_unknown_device_is_refused() -> None:
    with pytest.raises(ValueError, match="one of"):
        compare_trees(HERE, HERE, num_reqs=8, blocks=1, block_steps=1, device="tpu")
    with pytest.raises(SystemExit):
        main([str(HERE), "--device", "tpu"])


def test_the_cli_plants_new_env_in_the_new_workers_only(tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    assert main([str(HERE), "--reqs", "8", "--pairs", "1", "--blocks", "2", "--block-steps", "2",
                 "--new-env", "RUNNERCHECK_TREE_AB_DELAY_US=400", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["new_env"] == {"RUNNERCHECK_TREE_AB_DELAY_US": "400"}
    run = written["configurations"][0]["runs"][0]
    assert run["new"]["all_us"] - run["base"]["all_us"] > 300, run
    with pytest.raises(SystemExit):
        main([str(HERE), "--new-env", "NO_EQUALS_SIGN"])


def test_pinned_workers_run_where_asked_and_bad_lists_are_refused() -> None:
    from runnercheck.bench.lab.tree_ab import _placement
    if not _placement("cpu"):
        pytest.skip("no setarch/taskset here")
    assert _placement("cuda", "0")[-2:] == ["-c", "0"]
    run = compare_trees(HERE, HERE, num_reqs=8, pairs=1, blocks=1, block_steps=2, pin="0")
    assert run["pin"] == "0" and run["runs"][0]["new"]["all_us"] > 0
    for bad in ("", "x", "0-", "99999", "1,,2"):
        with pytest.raises(ValueError, match="CPUs"):
            compare_trees(HERE, HERE, num_reqs=8, blocks=1, block_steps=1, pin=bad)
