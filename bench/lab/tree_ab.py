"""Two trees' runner host steps on this machine, interleaved: what a host-side change moved (cpu or a GPU).

    python -m runnercheck.bench.lab.tree_ab BASE_DIR [--new DIR] [--device cpu|cuda] [--pin CPUS] [--new-env NAME=VALUE]
                            [--reqs 64 256] [--pairs 5] [--blocks 30] [--block-steps 10] [--out FILE]

A pair is one worker process per tree -- this checkout (or ``--new``) and BASE_DIR, an earlier commit (`git archive
COMMIT | tar x -C BASE_DIR`) -- each building the host_cost runner and the same seeded workload: on cpu with its
device work dropped (`runnercheck.bench.case_runner`: the Python bookkeeping alone), or with ``--device cuda`` as `runnercheck
bench --only host_cost` times it on a GPU (forward stubbed, launches and the launch thread included).  The driver asks
the two for blocks of steps in turn, alternating which goes first, so the machine's drift within the pair reaches
both trees alike (the lent H200 hosts change speed by up to ~2x between whole benchmark passes).

A process brings a speed of its own, too: two workers of one tree differed by up to ~18% on this 2-core box, and a
test over one pair's blocks called such a difference significant.  So the workers run with address-space
randomisation off (`setarch -R`, where present) and, on cpu, on one pinned core (`taskset`; a cuda worker is not
pinned unless ``--pin`` names CPUs for both sides: its launch thread needs a core of its own), which cut that to ~4%
here, and the verdict is taken over ``--pairs`` fresh pairs, not over blocks.  Per configuration it reports each
pair's new / base ratio of median host us (the admitting steps, the others, all), their medians, how many pairs the
new tree ran faster, and the Wilcoxon signed-rank p of the pairs' log ratios (`scipy.stats.wilcoxon`; five pairs
cannot go below 1/16).

On the lent H200 hosts a worker process brings a speed of its own as well, pinned or not: same-tree pairs there read
0.69-1.33, half of them within 5% (22 pairs, H200 runs 111-114, 2026-12-03, in git history of docs/BENCHMARKS.md).  At that spread a 3% change needs
120-200 pairs to be seen, a 10% one 12-20.  A fixed piece of Python timed in each worker did not track that speed
(r = 0.4; dividing by it widened the spread) and was dropped.

Run the base against itself (``--new BASE_DIR``) to see this machine's noise, and add ``--new-env NAME=VALUE`` to time
one switch of a tree against its default in the same way (``RUNNERCHECK_NATIVE=0``: the C twins against their Python
references).  The workload's requests grow toward max_model_len, so a pair runs at most ~800 steps a tree.  On cpu
the figures are the dev box's; the H200's say what counts for issue 14 (`ci/h200.sh` jobs ``bench_tree_ab``,
``bench_tree_native`` and ``bench_host_ab``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from scipy import stats

from runnercheck.bench.common import print_and_write_json

MAX_STEPS = 800  # a tree's steps per configuration, warm-up included, before the workload's requests reach max length
WARM_UP_STEPS = 20

# The worker, run by each tree's own interpreter path: its imports are that tree's.
_WORKER = r'''
import json, os, sys, time
device_kind = os.environ.get("RUNNERCHECK_TREE_AB_DEVICE", "cpu")
if device_kind == "cpu":
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
if os.path.isfile(os.path.join("runnercheck", "__init__.py")):
    from runnercheck.bench import case_runner
    from runnercheck.bench.common import BenchContext
    from runnercheck.impl.device import Device
else:  # a tree from before the runnercheck.* namespace
    from bench import case_runner
    from bench.common import BenchContext
    from impl.device import Device
if not os.path.realpath(case_runner.__file__).startswith(os.path.realpath(os.getcwd()) + os.sep):
    sys.exit(f"tree_ab: {case_runner.__file__} is not this tree's (an installed runnercheck shadows it)")

delay = float(os.environ.get("RUNNERCHECK_TREE_AB_DELAY_US", "0")) / 1e6
steps = None
for line in sys.stdin:
    command, *args = line.split()
    if command == "setup":
        num_reqs, churn, seed = int(args[0]), float(args[1]), int(args[2])
        device = Device(device_kind, seed=seed, lag_policy="run-immediately")  # as `runnercheck bench` builds it
        if device_kind == "cpu":
            case_runner.drop_device_work(device)
        runner, work, _ = case_runner.host_cost_setup(BenchContext(device, quick=False, seed=seed), num_reqs, churn)
        if delay:  # a planted slowdown (the tool's own test): each step busy-waits this long first
            execute = runner.execute_model
            def slowed(sched, execute=execute):
                end = time.perf_counter() + delay
                while time.perf_counter() < end:
                    pass
                return execute(sched)
            runner.execute_model = slowed
        steps = case_runner._RunnerSteps(runner, work)
        print("ready", flush=True)
    elif command == "steps":
        first = len(steps.admitting)
        host_us = [steps.step() for _ in range(int(args[0]))]
        print(json.dumps([host_us, steps.admitting[first:]]), flush=True)
    elif command == "quit":
        if steps is not None:  # a cuda step's output is read before the process goes
            steps.finish()
        break
'''




DEVICES = ("cpu", "cuda")


def _placement(device: str, pin: str | None = None) -> list[str]:
    """The command prefix that runs a worker with address-space randomisation off and on the CPUs ``pin`` names (a
    `taskset -c` list), else, on cpu, on this machine's last core (both trees' workers alike; they never run at once)
    and, on cuda, wherever the system puts it; nothing where `setarch` or `taskset` is missing."""
    if sys.platform != "linux" or not shutil.which("setarch") or not shutil.which("taskset"):
        return []
    no_aslr = ["setarch", platform.machine(), "-R"]
    if pin is not None:
        return [*no_aslr, "taskset", "-c", pin]
    if device != "cpu":  # the launch thread (`runnercheck.impl.launcher`) polls on a core beside the step's
        return no_aslr
    return [*no_aslr, "taskset", "-c", str(sorted(os.sched_getaffinity(0))[-1])]


class TreeAbError(RuntimeError):
    """A worker could not be started or stopped answering (its stderr is quoted)."""


class _Worker:
    """One tree's worker process, asked one line at a time."""

    def __init__(self, tree: Path, device: str, extra_env: dict[str, str] | None = None, pin: str | None = None):
        if not (tree / "impl" / "runner.py").is_file() or not (tree / "bench" / "case_runner.py").is_file():
            raise TreeAbError(f"{tree}: not a runnercheck tree (no impl/runner.py or bench/case_runner.py)")
        self.tree = tree
        self._stderr = tempfile.TemporaryFile(mode="w+")
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0", "RUNNERCHECK_TREE_AB_DEVICE": device,
               **(extra_env or {})}
        self._proc = subprocess.Popen([*_placement(device, pin), sys.executable, "-c", _WORKER], cwd=tree, env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._stderr, text=True)

    def ask(self, line: str) -> str:
        try:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
            answer = self._proc.stdout.readline()
        except BrokenPipeError:
            answer = ""
        if not answer:
            self._stderr.seek(0)
            raise TreeAbError(f"the worker of {self.tree} stopped at {line!r}:\n{self._stderr.read()[-2000:]}")
        return answer

    def steps(self, n: int) -> tuple[list[float], list[bool]]:
        host_us, admitting = json.loads(self.ask(f"steps {n}"))
        return host_us, admitting

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write("quit\n")
                self._proc.stdin.flush()
            except BrokenPipeError:
                pass
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._stderr.close()


def _medians(host_us: list[float], admitting: list[bool]) -> dict[str, float | None]:
    adm = [t for t, a in zip(host_us, admitting) if a]
    other = [t for t, a in zip(host_us, admitting) if not a]
    return {"admitting_us": statistics.median(adm) if adm else None, "other_us": statistics.median(other) if other else None,
            "all_us": statistics.median(host_us), "admitting_steps": len(adm), "other_steps": len(other)}


def _ratio(new: float | None, base: float | None) -> float | None:
    return None if new is None or not base else new / base


def _run_pair(base_tree: Path, new_tree: Path, num_reqs: int, churn: float, blocks: int, block_steps: int, seed: int,
              base_first: bool, new_env: dict[str, str] | None, device: str, pin: str | None) -> dict:
    """One pair of fresh workers: each tree's medians over its timed steps and the new / base ratios."""
    workers = {"base": _Worker(base_tree, device, pin=pin), "new": _Worker(new_tree, device, new_env, pin)}
    timed: dict[str, tuple[list[float], list[bool]]] = {"base": ([], []), "new": ([], [])}
    try:
        for worker in workers.values():
            worker.ask(f"setup {num_reqs} {churn} {seed}")
            worker.steps(WARM_UP_STEPS)
        for b in range(blocks):
            for side in (("base", "new") if (b % 2 == 0) == base_first else ("new", "base")):
                host_us, admitting = workers[side].steps(block_steps)
                timed[side][0].extend(host_us)
                timed[side][1].extend(admitting)
    finally:
        for worker in workers.values():
            worker.close()
    base, new = _medians(*timed["base"]), _medians(*timed["new"])
    return {"base": base, "new": new, **{f"new_over_base_{kind}": _ratio(new[f"{kind}_us"], base[f"{kind}_us"])
                                         for kind in ("admitting", "other", "all")}}


def _valid_cpu_list(pin: str) -> bool:
    """Whether ``pin`` is a `taskset -c` list (``6,7``, ``4-7``) of CPUs this process may run on."""
    cpus: set[int] = set()
    for part in pin.split(","):
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            return False
        cpus.update(range(int(low), int(high if sep else low) + 1))
    return bool(cpus) and cpus <= os.sched_getaffinity(0)


def compare_trees(base_tree: Path, new_tree: Path, num_reqs: int, churn: float = 0.01, pairs: int = 5, blocks: int = 30,
                  block_steps: int = 10, seed: int = 0, new_env: dict[str, str] | None = None, device: str = "cpu",
                  pin: str | None = None) -> dict:
    """One configuration of the two trees over ``pairs`` pairs of workers (see the module docstring).  ``new_env``:
    extra environment of the new tree's workers (the tool's test plants a slowdown there)."""
    if pairs < 1 or blocks < 1 or block_steps < 1:
        raise ValueError("pairs, blocks and block_steps must be >= 1")
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: one of {DEVICES}")
    if WARM_UP_STEPS + blocks * block_steps > MAX_STEPS:
        raise ValueError(f"{blocks} blocks of {block_steps} steps: more than the {MAX_STEPS - WARM_UP_STEPS} a workload allows")
    if pin is not None and not _valid_cpu_list(pin):
        raise ValueError(f"pin {pin!r}: a list of this machine's CPUs such as 6,7 or 4-7")
    runs = [_run_pair(base_tree, new_tree, num_reqs, churn, blocks, block_steps, seed, k % 2 == 0, new_env, device, pin)
            for k in range(pairs)]
    result: dict = {"device": device, "pin": pin, "num_reqs": num_reqs, "churn": churn, "pairs": pairs, "blocks": blocks, "block_steps": block_steps,
                    "runs": runs}
    for kind in ("admitting", "other", "all"):
        ratios = [r[f"new_over_base_{kind}"] for r in runs if r[f"new_over_base_{kind}"] is not None]
        result[f"new_over_base_{kind}"] = statistics.median(ratios) if ratios else None
        if kind == "all":
            logs = [math.log(x) for x in ratios]
            result["pairs_faster"] = sum(x < 0 for x in logs)
            result["wilcoxon_p"] = float(stats.wilcoxon(logs).pvalue) if len(logs) > 1 and any(logs) else 1.0
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="the earlier tree (an exported commit)")
    parser.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[2],
                        help="the tree to compare (default: this checkout)")
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="cpu: device work dropped (the dev box); cuda: the GPU benchmark's steps")
    parser.add_argument("--pin", metavar="CPUS", help="run both trees' workers on these CPUs (`taskset -c`, e.g. 6,7); "
                                                      "default: cpu on the last core, cuda unpinned")
    parser.add_argument("--reqs", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--churn", type=float, default=0.01)
    parser.add_argument("--pairs", type=int, default=5, help="fresh worker pairs per configuration")
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--block-steps", type=int, default=10)
    parser.add_argument("--new-env", action="append", default=[], metavar="NAME=VALUE",
                        help="set this in the new side's workers only (repeatable); with BASE_DIR the same tree as --new, "
                             "it times one switch against its default, e.g. RUNNERCHECK_NATIVE=0")
    parser.add_argument("--out", help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    new_env = {}
    for item in args.new_env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--new-env {item!r}: NAME=VALUE")
        new_env[name] = value
    if not 0 <= args.churn <= 1:
        parser.error("--churn must be in [0, 1]")
    if any(n < 1 for n in args.reqs):
        parser.error("--reqs must be >= 1")
    try:
        result = {"base": str(args.base), "new": str(args.new), "new_env": new_env, "pin": args.pin,
                  "configurations": [compare_trees(args.base.resolve(), args.new.resolve(), n, args.churn, args.pairs,
                                                   args.blocks, args.block_steps, new_env=new_env or None,
                                                   device=args.device, pin=args.pin)
                                     for n in args.reqs]}
    except (TreeAbError, ValueError) as err:
        parser.error(str(err))
    print_and_write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
