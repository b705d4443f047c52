"""xdist workers pinned one per visible GPU (`runnercheck.stress.gpu_workers`), and each worker's device in the log."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runnercheck.stress.gpu_workers import pin_worker_gpu, worker_devices

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("worker", "visible", "pinned"), [
    ("gw0", "0,1", "0"), ("gw1", "0,1", "1"), ("gw2", "0,1", "0"), ("gw3", "4, 6, 7", "4"),
    ("gw0", "0", None), ("gw1", "", None), ("gw1", None, None), (None, "0,1", None), ("master", "0,1", None),
])
def test_each_worker_keeps_one_device_of_the_list_in_turn(worker, visible, pinned) -> None:
    assert worker_devices(worker, visible) == pinned


def test_pinning_rewrites_only_a_workers_list() -> None:
    env = {"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert pin_worker_gpu(env) == "3" and env["CUDA_VISIBLE_DEVICES"] == "3"
    env = {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert pin_worker_gpu(env) is None and env == {"CUDA_VISIBLE_DEVICES": "2,3"}


def test_two_workers_run_on_two_devices_and_the_summary_names_them(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(
        "import os\n\n"
        "def test_a():\n    print(os.environ['CUDA_VISIBLE_DEVICES'])\n\n"
        "def test_b():\n    print(os.environ['CUDA_VISIBLE_DEVICES'])\n")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="3,5", PYTHONPATH=str(ROOT))
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "runnercheck.stress.gpu_workers", "-p", "no:cacheprovider",
                           "-n", "2", "-q", "test_probe.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "devices of the xdist workers" in done.stdout
    assert "gw0: CUDA_VISIBLE_DEVICES=3" in done.stdout and "gw1: CUDA_VISIBLE_DEVICES=5" in done.stdout
