"""Instructions per ``execute_model`` call, counted by valgrind's callgrind: a host-cost measure that does not move.

    python -m runnercheck.bench.lab.host_instructions [--reqs 64] [--churn 0.01] [--steps 50]

The dev box's timings drift by up to 2x within a minute (a shared VM), so two trees timed one after
the other cannot be told apart by a 5-10% change; the instruction count of the same steps can (it is
the same on every run of the same tree).  The runner is set up as the `host_cost` benchmark sets it
up (device work dropped: cpu only), the steps are built first, and only ``execute_model`` is
counted: the steps run inside ``functools.reduce`` (callgrind collects inside it alone,
``--toggle-collect``), and each step's output of the step before is read inside
``itertools.starmap`` (collection toggled off again).  Instructions are not time -- a cache miss
costs nothing here -- so read it next to the benchmark, not instead of it.  Needs ``valgrind`` on
the PATH; under it a run of 50 steps takes a minute or two.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile

_CHILD = "RUNNERCHECK_INSTRUCTIONS_CHILD"


def _run_steps(num_reqs: int, churn: float, steps: int) -> None:
    """The counted part (inside valgrind): ``steps`` steps of the host-cost workload."""
    from runnercheck.bench import case_runner
    from runnercheck.bench.common import BenchContext
    from runnercheck.impl.device import Device

    device = Device("cpu", seed=0)
    case_runner.drop_device_work(device)
    runner, work, _ = case_runner.host_cost_setup(BenchContext(device, quick=False), num_reqs, churn)
    case_runner._drive(runner, work, 30)
    schedules = [work.next_step() for _ in range(steps)]
    print(f"admitting steps: {sum(1 for s in schedules if s.new_requests)} of {steps}")

    def step(pending, sched):
        output = runner.execute_model(sched)
        if pending is not None:
            list(itertools.starmap(type(pending).get, [(pending,)]))  # not counted: starmap_next toggles it off
        return output

    functools.reduce(step, schedules, None).get()


def count(num_reqs: int, churn: float, steps: int) -> float:
    """Instructions per ``execute_model`` call (thousands), under callgrind."""
    if shutil.which("valgrind") is None:
        raise RuntimeError("valgrind is not on the PATH")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=functools_reduce",
               "--toggle-collect=starmap_next", f"--callgrind-out-file={out}", sys.executable, "-m", "runnercheck.bench.lab.host_instructions",
               "--reqs", str(num_reqs), "--churn", str(churn), "--steps", str(steps)]
        env = dict(os.environ, **{_CHILD: "1", "CUDA_VISIBLE_DEVICES": ""})
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode or not found:
            raise RuntimeError(f"callgrind run failed (rc {done.returncode}):\n{done.stderr[-2000:]}")
        return int(found.group(1)) / steps / 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reqs", type=int, default=64)
    parser.add_argument("--churn", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args(argv)
    if args.reqs < 1 or args.steps < 1 or not 0 <= args.churn <= 1:
        parser.error("--reqs and --steps must be >= 1, --churn in [0, 1]")
    if os.environ.get(_CHILD):
        _run_steps(args.reqs, args.churn, args.steps)
        return 0
    try:
        per_step = count(args.reqs, args.churn, args.steps)
    except RuntimeError as err:
        parser.error(str(err))
    print(f"{args.reqs} decode requests, churn {args.churn}, {args.steps} steps: {per_step:.1f} k instructions "
          f"per execute_model (callgrind, device work dropped)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
