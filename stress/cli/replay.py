"""`runnercheck replay FILE`: re-run a recorded repro file (`runnercheck.stress.run.repro`).

Rebuilds the recorded `RunConfig` (seed, model, limits, scheduler, device kind, lag/delay policy,
mutant, runner, CUDA graphs) and applies the recorded operation trace tick by tick instead of the
random churn, through `runnercheck.stress.run.harness.checked_run` in a child process.  The file is checked
before anything is built: its format version (another version is refused), its checksum, ``steps``
against the recorded trace, model and KV sizes against the stated maxima (`runnercheck.stress.run.config`).
When the recording's provenance (runnercheck version, commit, torch/triton/numpy, device) differs
from this machine's, a warning names each difference: a replay elsewhere may not be bit-for-bit.

Exit 1 when the run still diverges (printing its first divergence and whether it is the recorded
one -- on ``sim`` it is, bit for bit), 0 when it no longer diverges, 2 when the file cannot be used
(a message, never a traceback).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from runnercheck.stress.cli.options import add_runner_option
from runnercheck.stress.run.repro import Repro, ReproError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a repro.json written by `runnercheck stress` or `verify`")
    add_runner_option(parser, None, "replay against another runner factory, 'package.module:factory' or "
                                    "'path/file.py:factory' (default: the recorded one)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--in-process", action="store_true", help="run in this process (no crash isolation; for debugging)")


def provenance_warnings(repro: Repro) -> list[str]:
    from runnercheck.checks.provenance import device_name, provenance, provenance_differences

    return provenance_differences(repro.provenance, provenance(device_name(repro.config.device)))


def run(args: argparse.Namespace) -> int:
    from runnercheck.stress.run.harness import TraceOps, checked_run, load_runner_factory
    from runnercheck.stress.run.isolation import isolated_run
    from runnercheck.stress.report.progress import Progress
    from runnercheck.stress.report.render import print_divergence, print_findings
    from runnercheck.stress.run.config import RunSetupError

    try:
        repro = Repro.load(args.file)
        config = replace(repro.config, runner=args.runner) if args.runner else repro.config
        load_runner_factory(config.runner)
        for difference in provenance_warnings(repro):
            print(f"runnercheck replay: WARNING provenance differs from the recording: {difference}", file=sys.stderr)
        name = f"replay {args.file}"
        with Progress(name, config.steps, enabled=not args.no_progress) as progress:
            progress.start(name)
            run = checked_run if args.in_process else isolated_run
            findings = run(config, TraceOps(repro.trace), name=name, lifetime_mode="error", on_tick=progress.advance)
            progress.end(f"{'ok  ' if findings.passed else 'FAIL'} {name}: {findings.result.steps} steps")
    except (ReproError, RunSetupError) as e:
        print(f"runnercheck replay: {e}", file=sys.stderr)
        return 2
    if findings.passed:
        print_findings(findings, "runnercheck replay: no divergence any more")
        print(f"recorded: {repro.first_divergence}")
        return 0
    print_divergence(findings)
    line = findings.first_divergence_line()
    same = "the recorded divergence" if line == repro.first_divergence else f"differs from the recorded: {repro.first_divergence}"
    print(f"replay: {same}")
    return 1
