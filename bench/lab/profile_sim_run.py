"""Where a quick sim run's time goes: cProfile of one `verify --quick` run, grouped by component.

    TRITON_INTERPRET=1 python bench/lab/profile_sim_run.py [--run 1] [--ticks 60]

Groups (cumulative own time of the functions in each): the Triton interpreter (interpreted
kernels), the oracle (``reference/``), the runner's host bookkeeping (``impl/``), the harness
(``stress/``, ``checks/``), torch ops, and the rest.  The figures behind the README's durations.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections import defaultdict

GROUPS = (
    ("triton interpreter (interpreted kernels)", ("triton/",)),
    ("oracle (reference/, float64)", ("/reference/",)),
    ("runner host code (impl/)", ("/impl/",)),
    ("harness and detectors (stress/, checks/)", ("/stress/", "/checks/")),
    ("numpy", ("numpy/",)),
    ("torch", ("torch/", "<built-in method torch", "<method '")),
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", type=int, default=1, help="which run of the quick sim plan (0-based)")
    parser.add_argument("--ticks", type=int, default=None)
    args = parser.parse_args()
    from runnercheck.stress.run.harness import ChurnOps, checked_run
    from runnercheck.stress.cli.verify import plan_runs

    planned = plan_runs("sim", 0, "runnercheck.impl.runner:make_runner", quick=True, ticks=args.ticks)[args.run]
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    findings = checked_run(planned.config, ChurnOps(planned.churn), name=planned.name)
    profile.disable()
    wall = time.perf_counter() - started
    stats = pstats.Stats(profile)
    own: dict[str, float] = defaultdict(float)
    for (filename, _line, func), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        where = f"{filename}:{func}"
        group = next((name for name, keys in GROUPS if any(k in where for k in keys)), "other")
        own[group] += tottime
    print(f"run {planned.name!r}: {findings.result.ticks} ticks, {findings.result.steps} steps, "
          f"{findings.result.tokens_compared} tokens, ok={findings.passed}, {wall:.1f} s wall (profiled)")
    total = sum(own.values())
    for name, t in sorted(own.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<45} {t:7.1f} s  {100 * t / total:5.1f} %")
    stats.sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
