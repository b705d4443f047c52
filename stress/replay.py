"""`runnercheck replay FILE`: re-run a recorded repro file (`stress.repro`).

Rebuilds the recorded configuration (seed, model, limits, scheduler, device kind, lag/delay
policy, mutant, runner) and applies the recorded operation trace tick by tick instead of the
random churn.  Exit 1 when the run still diverges (printing its first divergence and whether it
is the recorded one -- on ``sim`` it is, bit for bit), 0 when it no longer diverges, 2 when the
file cannot be used (a message, never a traceback).
"""
from __future__ import annotations

import argparse
import sys

from stress.repro import Repro, ReproError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a repro.json written by `runnercheck stress`")
    parser.add_argument("--runner", default=None, help="replay against another runner factory (default: the recorded one)")
    parser.add_argument("--no-progress", action="store_true")


def config_from_repro(repro: Repro, runner: str | None = None):
    from stress.scheduler import SchedulerConfig
    from stress.stress_cmd import StressConfig

    return StressConfig(
        seed=repro.seed,
        steps=repro.steps,
        device=repro.device,
        model_preset=repro.model["preset"],
        model_config=repro.model_config(),
        limits=repro.runner_limits(),
        scheduler=SchedulerConfig.from_dict(repro.scheduler),  # prefix caching as recorded (off in older repros)
        lag_policy=repro.lag_policy,
        delay_policy=repro.delay_policy,
        mutant=repro.mutant,
        runner=runner or repro.runner,
    )


def run(args: argparse.Namespace) -> int:
    from stress.churn import TraceError, TraceReplay
    from stress.stress_cmd import StressSetupError, print_divergence, print_summary, run_config

    try:
        repro = Repro.load(args.file)
        config = config_from_repro(repro, args.runner)
        replay = TraceReplay(repro.trace)
        _, result = run_config(config, replay, show_progress=not args.no_progress)
    except (ReproError, StressSetupError, TraceError) as e:
        print(f"runnercheck replay: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a recorded config this build cannot rebuild (e.g. cuda on a CPU box)
        print(f"runnercheck replay: cannot replay {args.file}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if result.ok:
        print_summary(config, result, "runnercheck replay: no divergence any more")
        print(f"recorded: {repro.first_divergence}")
        return 0
    print_divergence(result)
    line = result.first_divergence_line()
    same = "the recorded divergence" if line == repro.first_divergence else f"differs from the recorded: {repro.first_divergence}"
    print(f"replay: {same}")
    return 1
