"""`runnercheck invariance`: the same requests alone and in batches must give the same tokens and logprobs.

    runnercheck invariance --device {auto,sim,cuda,cpu} --seed S [--runner SPEC] [--model micro|tiny]
                           [--probes N] [--max-tokens N] [--batch-sizes N ...] [--scenarios KIND ...]
                           [--tolerance X] [--mutant NAME] [--eager] [--timeout S] [--in-process] --out DIR

A front-end over `runnercheck.stress.invariance.checker.check_invariance` (docs/INVARIANCE.md): each
probe request runs alone, then in batches of other sizes and compositions, and its tokens and
logprobs must match bit for bit.  ``batch_invariant=True`` goes to runner factories that take it.
The report folder DIR is written atomically: ``summary.json`` and ``summary.md``
(`runnercheck.stress.invariance.report`).  Exit 0 when every scenario matches, 1 on a difference or a
crash, 2 on bad arguments, 130 when interrupted (the scenarios that finished are reported, marked
incomplete).  The check runs in a child process (`runnercheck.stress.invariance.isolated`): a runner
that crashes, or runs past ``--timeout``, fails the check with the scenarios that finished reported.
"""
from __future__ import annotations

import argparse
import sys

from runnercheck.impl.model.weights import PRESETS
from runnercheck.checks.child import DEFAULT_RUN_TIMEOUT_S
from runnercheck.stress.cli.options import RUNNER_HELP, add_runner_option, add_timeout_option, float_type, int_type, timeout_seconds
from runnercheck.stress.invariance.scenarios import SCENARIO_KINDS
from runnercheck.stress.run.runners import DEFAULT_RUNNER_SPEC


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(out="out/invariance")
    add_runner_option(parser, DEFAULT_RUNNER_SPEC, RUNNER_HELP)
    parser.add_argument("--model", default="micro", choices=sorted(PRESETS), help="model preset (random weights from --seed)")
    parser.add_argument("--max-num-reqs", type=int_type(1), default=4, help="requests the runner holds at once (its rows)")
    parser.add_argument("--block-size", type=int_type(1), default=8, help="tokens per KV-cache block")
    parser.add_argument("--num-kv-blocks", type=int_type(1), default=64, help="KV-cache blocks")
    parser.add_argument("--max-batched-tokens", type=int_type(2), default=32, help="token budget of one step")
    parser.add_argument("--probes", type=int_type(1, 16), default=3, help="checked requests (each also runs alone)")
    parser.add_argument("--max-tokens", type=int_type(1), default=6, help="tokens each probe generates")
    parser.add_argument("--batch-sizes", type=int_type(2), nargs="+", default=None, metavar="N",
                        help="batch sizes of the size-N scenarios (default: every size from 2 to --max-num-reqs)")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIO_KINDS, default=list(SCENARIO_KINDS), metavar="KIND",
                        help=f"scenario kinds to run ({', '.join(SCENARIO_KINDS)})")
    parser.add_argument("--tolerance", type=float_type(0.0), default=0.0,
                        help="absolute logprob difference allowed (default 0: bitwise equality)")
    parser.add_argument("--mutant", default=None,
                        help="install a deliberate bug from the catalogue into every runner (e.g. a batch-dependence "
                             "mutant of runnercheck.stress.mutants.batch; default: none)")
    parser.add_argument("--in-process", action="store_true", help="run in this process (no crash isolation; for debugging)")
    add_timeout_option(parser, DEFAULT_RUN_TIMEOUT_S, "the check (it runs in its own process)")


def run(args: argparse.Namespace) -> int:
    from runnercheck.checks.interrupts import STATUS_COMPLETE, STATUS_INCOMPLETE, signal_name
    from runnercheck.checks.provenance import device_name, provenance
    from runnercheck.checks.report_folder import run_exit_status, write_command_report
    from runnercheck.impl.model.weights import preset
    from runnercheck.stress.invariance.checker import InvarianceConfig, InvarianceSetupError, check_invariance
    from runnercheck.stress.invariance.isolated import isolated_invariance
    from runnercheck.stress.invariance.report import build_summary, print_result, scenario_line, write_report
    from runnercheck.stress.run.config import RunSetupError, check_model_size, default_limits
    from runnercheck.stress.run.harness import apply_mutant, load_runner_factory

    model = preset(args.model)
    limits = default_limits(model, max_num_reqs=args.max_num_reqs, block_size=args.block_size,
                            num_kv_blocks=args.num_kv_blocks, max_num_batched_tokens=args.max_batched_tokens)
    sizes = tuple(args.batch_sizes) if args.batch_sizes else None
    if sizes and max(sizes) > args.max_num_reqs:
        print(f"runnercheck invariance: --batch-sizes {max(sizes)} > --max-num-reqs {args.max_num_reqs}", file=sys.stderr)
        return 2
    config = InvarianceConfig(args.device, args.seed, model, limits, num_probes=args.probes, max_tokens=args.max_tokens,
                              batch_sizes=sizes, kinds=tuple(k for k in SCENARIO_KINDS if k in args.scenarios),
                              tolerance=args.tolerance, cuda_graphs=not args.eager)
    try:
        check_model_size(model, limits)
        factory = load_runner_factory(args.runner)
        prepare = None
        if args.mutant is not None:
            from runnercheck.stress.mutants import catalogue as mutants

            try:
                mutants.get(args.mutant)
            except LookupError as e:
                raise RunSetupError(f"--mutant {args.mutant!r}: {e}") from None

            def prepare(runner):  # noqa: ANN001, ANN202
                return apply_mutant(args.mutant, runner)
    except RunSetupError as e:
        print(f"runnercheck invariance: {e}", file=sys.stderr)
        return 2

    def progress(outcome, index: int, total: int) -> None:  # noqa: ANN001
        if not args.no_progress:
            print(scenario_line(outcome, index, total), flush=True)

    partial: list = []
    interrupt: KeyboardInterrupt | None = None
    try:
        if args.in_process:
            result = check_invariance(factory, config, runner_name=args.runner, prepare=prepare, on_scenario=progress,
                                      partial=partial)
        else:
            result = isolated_invariance(args.runner, config, mutant=args.mutant, timeout_s=timeout_seconds(args.timeout),
                                         on_scenario=progress, partial=partial)
    except (InvarianceSetupError, RunSetupError) as e:
        print(f"runnercheck invariance: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        interrupt = e
        if not partial:
            raise
        result = partial[0]
    notes = []
    if interrupt is not None:
        notes.append(f"interrupted ({signal_name(interrupt)}) after {len(result.scenarios)} scenarios: "
                     "the scenarios that did not run are not reported")
    doc = build_summary(result, status=STATUS_COMPLETE if interrupt is None else STATUS_INCOMPLETE, mutant=args.mutant,
                        provenance=provenance(device_name(args.device)), notes=notes)
    written = write_command_report("invariance", args.out, lambda tmp: write_report(tmp, doc), force=args.force)
    if written.exit_status is not None:
        return written.exit_status
    print_result(result, doc, args.out)
    # The report's own notes say it was interrupted: no second line.
    return run_exit_status("invariance", args.out, doc["passed"], None if interrupt is None else notes[0],
                           say_incomplete=False)


__all__ = ["add_arguments", "run"]
