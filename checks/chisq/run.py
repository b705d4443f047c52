"""`runnercheck chisq`: chi-square tests of a sampler against the exact float64 distributions.

A *case* (`SamplingCase`) is one logit template (one row, or a target row plus draft rows of one
request), one `SamplingParams`, a token history, and a number of draws.  Each case's draws and their
tests (`runnercheck.checks.chisq.draws`: every draw an independent ``(seed, position)`` key; per-row chi-square,
tail-mass and joint independence tests) form, with every other case's, one family (Holm by default).
What a run draws -- its options, the catalogue's cases after ``--cases`` and ``--shard`` -- is
`runnercheck.checks.chisq.plan`; running the units (matrix cases, the calibration and power self-tests of the
tests, optionally isolated in a child process) is `runnercheck.checks.chisq.execute`.  This module is the
command: its arguments, `run_all` (the phases assembled into the `RunSummary` the report is written from)
and the report folder.  The case catalogue (`build_cases`, `deep_tail_cases`, `power_cases`, ...) is
`runnercheck.checks.chisq.cases`; the numbers behind their sizes are in docs/CHISQ.md.
With the matrix run the speculative-verification cases and their planted biases (`runnercheck.checks.chisq.spec`:
the first two tokens under speculation against the target's joint, the emitted-length law), in
their own correction family; ``--no-spec`` leaves them out.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from runnercheck.checks.chisq import stats
from runnercheck.checks.chisq.cases import power_cases
from runnercheck.checks.chisq.execute import collect, run_power, run_units, single_threaded_on_cpu
from runnercheck.checks.chisq.isolated import CALIBRATION, Isolation
from runnercheck.checks.chisq.plan import DEFAULT_ALPHA, RunOptions, in_shard, matching_cases, zero_cases_reason
from runnercheck.checks.chisq.sampler_contract import SamplerLimitError, rows_per_call_bound
from runnercheck.checks.chisq.samplers import (
    SamplerSpecError, SamplerUnavailableError, is_builtin_sampler, load_sampler, sampler_name,
)
from runnercheck.checks.chisq.spec import SPEC_BIASES, default_spec_verifier, run_spec_cases, run_spec_power
from runnercheck.checks.child import DEFAULT_TIMEOUT_S


def resolve_device(kind: str) -> torch.device:
    """The shared device rule (`runnercheck.impl.device.resolve_device_kind`: auto is cuda when present, else sim);
    chisq has no host/device races to simulate, so ``sim`` and ``cpu`` both sample on CPU tensors."""
    from runnercheck.impl.device import DeviceError, resolve_device_kind

    try:
        kind = resolve_device_kind(kind)
    except DeviceError as e:
        raise SamplerUnavailableError(f"--device {kind}: {e}") from None
    return torch.device("cuda" if kind == "cuda" else "cpu")


def default_sampler_spec(device: torch.device) -> str:
    """The runner's sampler on a GPU; on CPU the PyTorch baseline (the interpreted kernel samples
    ~50 rows/s, far too slow for ~1e6 draws; ask for it with ``--sampler impl --samples N``)."""
    if device.type == "cuda":
        from runnercheck.checks.chisq.impl_sampler import impl_sampler_available

        if impl_sampler_available():
            return "impl"
    return "gumbel"




def _named(biases: tuple[str, ...] | None, known) -> tuple[str, ...] | None:
    """The asked-for biases that belong to ``known`` (None: each runner's own plan)."""
    return None if biases is None else tuple(b for b in biases if b in known)


def run_all(sampler: Callable, opts: RunOptions, *, show_progress: bool = True,
            keep_partial: bool = False) -> stats.RunSummary:
    """Matrix, then calibration and power as asked; returns the summary the report is written from.

    ``keep_partial``: an interrupt (`KeyboardInterrupt`) ends the run with the phases that finished,
    in a summary marked incomplete, instead of propagating."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from runnercheck.checks.interrupts import CatchInterrupt

    device = resolve_device(opts.device)
    started = time.perf_counter()
    # Each phase's results are bound once it finished: an interrupt keeps exactly the finished ones.
    results, skipped, calibration, power, not_run, builtin = [], [], None, [], None, []
    stopped = CatchInterrupt(enabled=keep_partial)
    with stopped, single_threaded_on_cpu(device), Progress(TextColumn("{task.description:<40}"), BarColumn(), TextColumn("{task.fields[done]:.3g} token-draws"),
                  TimeElapsedColumn(), disable=not show_progress, transient=True) as bar:
        task = bar.add_task("chisq", total=None, done=0.0)

        def tick(label: str, work: int) -> None:
            bar.update(task, description=label, done=bar.tasks[0].fields["done"] + work)

        first_shard = opts.shard[0] == 0
        matched = matching_cases(opts) if opts.matrix else []
        cases = in_shard(matched, opts.shard)
        # The sampler's units in one go (with isolation: one child for all of them, unless one crashes).
        outcomes = run_units(sampler, [*cases, *([CALIBRATION] if opts.calibration and first_shard else [])],
                             opts, device, tick)
        results, skipped = collect(outcomes[:len(cases)], opts)
        if opts.matrix and opts.spec and first_shard:
            tick("speculative verification", 0)
            builtin = run_spec_cases(default_spec_verifier(device.type), quick=opts.quick, seed=opts.seed,
                                      alpha=opts.alpha, correction=opts.correction, samples=opts.samples,
                                      case_filter=opts.case_filter)
        not_run = zero_cases_reason(len(matched), len(cases), skipped, opts) if opts.matrix and not (results or builtin) else None
        calibration = None
        for unit in outcomes[len(cases):]:
            calibration = unit.calibration
            results += unit.failures
            skipped += [{"case": unit.case, "reason": unit.skipped}] if unit.skipped is not None else []
        power = run_power(opts, device, tick, biases=_named(opts.biases, power_cases())) if opts.power else []
        if opts.power and opts.spec and first_shard:
            power += run_spec_power(quick=opts.quick, seed=opts.seed, alpha=opts.alpha,
                                    repeats=opts.power_repeats or (1 if opts.quick else 5),
                                    biases=_named(opts.biases, SPEC_BIASES))
    # A power-only run draws from the planted samplers alone: do not name a sampler it never ran.
    used = sampler_name(sampler) if opts.matrix or opts.calibration else "none (planted biases only)"
    return stats.RunSummary(
        sampler=used, device=str(device), quick=opts.quick, seed=opts.seed, alpha=opts.alpha,
        correction=opts.correction, tests=results, skipped=skipped, calibration=calibration, power=power,
        elapsed_s=time.perf_counter() - started, shard=None if opts.shard[1] == 1 else "{}/{}".format(*opts.shard),
        interrupted=stopped.note() and f"{stopped.note()}; only the parts that finished are reported",
        not_run=not_run, convention=opts.convention, builtin_tests=builtin,
    )


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small vocabularies and sample counts (CPU CI)")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu", "sim"],
                        help="where to sample (sim samples on CPU: chisq has no host/device races)")
    parser.add_argument("--samples", type=int, default=None, help="draws per case (default: each case's own)")
    parser.add_argument("--sampler", default=None,
                        help="gumbel | torch | impl | bias-<name> (ours) | package.module:function | path/to/file.py:function "
                             "(default: impl on a GPU, else gumbel). A module is looked up on sys.path, then in the working "
                             "folder (appended: an installed module of the same name wins); a file is loaded as it is named. "
                             "A sampler not of ours runs in a child process: a crash or a timeout fails its case with a "
                             "repro command, and the report is still written")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"fail a case (or the calibration) of an isolated sampler that runs longer, killing its "
                             f"process group (default {DEFAULT_TIMEOUT_S:g}; 0: no limit)")
    parser.add_argument("--no-isolation", action="store_true",
                        help="run a third-party sampler in this process (for a debugger): a crash then ends the run "
                             "with no report, and --timeout does not apply")
    from runnercheck.checks.chisq.conventions import CONVENTIONS

    parser.add_argument("--convention", default="contract", choices=list(CONVENTIONS), metavar="NAME",
                        help="the sampling convention the expected distributions follow: " + ", ".join(CONVENTIONS)
                             + " (default contract: docs/SAMPLING.md; docs/CHISQ.md cites each engine's source)")
    parser.add_argument("--seed", type=int, default=0, help="base seed of the draws (each case derives its own from it)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="family-wise level after correction")
    parser.add_argument("--correction", default="holm", choices=list(stats.CORRECTIONS),
                        help="multiple-testing correction over the run's tests")
    parser.add_argument("--no-calibration", action="store_true",
                        help="skip the calibration self-test (the sampler on fresh seeds must reject at the stated rate)")
    parser.add_argument("--no-power", action="store_true", help="skip the power self-test (planted biased samplers must fail)")
    parser.add_argument("--deep-tail", action="store_true", help="add the 2^17-token 25/30-logit tail cases (GPU-sized)")
    parser.add_argument("--cases", default=None,
                        help="only cases whose name contains this (default: every case; matching no case at all is a usage error, status 2; "
                             "a run whose matching cases were all skipped fails, status 1)")
    parser.add_argument("--no-matrix", action="store_true", help="skip the configuration matrix (calibration/power only)")
    parser.add_argument("--no-spec", action="store_true",
                        help="skip the speculative-verification cases and their planted biases (checks/chisq/spec.py)")
    parser.add_argument("--biases", nargs="+", default=None, metavar="BIAS",
                        help="planted biases for the power report (default: those this mode and device can afford)")
    parser.add_argument("--power-repeats", type=int, default=None, help="repeats per planted bias (default 5; quick 1)")
    parser.add_argument("--max-rows-per-call", type=int, default=None, metavar="N",
                        help="hand the sampler at most N logit rows per call (default: the sampler's max_rows_per_call, else unbounded)")
    parser.add_argument("--junit", type=Path, default=None, metavar="FILE",
                        help="also write JUnit XML: one test case per statistical test, calibration and planted bias "
                             "(default: not written)")
    parser.add_argument("--out", required=True, type=Path, help="report folder")


def unmatched_cases(args: argparse.Namespace) -> str | None:
    """A usage error when ``--cases`` matches no case at all (matrix, deep tail or speculative), else None."""
    if args.cases is None or args.no_matrix:
        return None
    opts = RunOptions(quick=args.quick, deep_tail=args.deep_tail, case_filter=args.cases)
    if matching_cases(opts):
        return None
    if not args.no_spec:
        from runnercheck.checks.chisq.spec import build_spec_cases

        if any(args.cases in c.name for c in build_spec_cases(args.quick)):
            return None
    return f"--cases {args.cases!r} matches no case of the {'quick' if args.quick else 'full'} catalogue " \
           "(`runnercheck chisq --help`; docs/CHISQ.md lists them)"


def isolation_for(spec: str, timeout_s: float, in_process: bool) -> Isolation | None:
    """A third-party sampler runs in a child process (`runnercheck.checks.chisq.isolated`); ours in this one.

    Ours (`is_builtin_sampler`) are tested by this project and a spawn on cuda would cost the
    runner's sampler a second CUDA context and its Triton compile; a user's code is what crashes
    or hangs without warning, and its run must still end in a report."""
    if in_process or is_builtin_sampler(spec):
        return None
    from runnercheck.checks.loader import canonical_spec

    return Isolation(canonical_spec(spec, "sampler"), timeout_s or None)


def run(args: argparse.Namespace) -> int:
    from runnercheck.checks.chisq.report import print_summary, write_report
    from runnercheck.checks.report_folder import run_exit_status, write_command_report

    if args.samples is not None and args.samples < 1:
        print("runnercheck chisq: --samples must be >= 1", file=sys.stderr)
        return 2
    if args.power_repeats is not None and args.power_repeats < 1:
        print("runnercheck chisq: --power-repeats must be >= 1", file=sys.stderr)
        return 2
    unknown = sorted(set(args.biases or ()) - set(power_cases()) - set(SPEC_BIASES))
    if unknown:
        print(f"runnercheck chisq: unknown --biases {', '.join(unknown)} (known: {', '.join([*power_cases(), *SPEC_BIASES])})", file=sys.stderr)
        return 2
    if not 0.0 < args.alpha < 1.0:
        print("runnercheck chisq: --alpha must lie in (0, 1)", file=sys.stderr)
        return 2
    if args.junit is not None and args.junit.is_dir():
        print(f"runnercheck chisq: --junit {args.junit} is a directory; name the XML file to write", file=sys.stderr)
        return 2
    if args.max_rows_per_call is not None and args.max_rows_per_call < 1:
        print("runnercheck chisq: --max-rows-per-call must be >= 1", file=sys.stderr)
        return 2
    if args.timeout < 0 or not math.isfinite(args.timeout):
        print("runnercheck chisq: --timeout must be a number of seconds >= 0 (0: no limit)", file=sys.stderr)
        return 2
    no_case = unmatched_cases(args)
    if no_case:
        print(f"runnercheck chisq: {no_case}", file=sys.stderr)
        return 2
    monitor = None
    if getattr(args, "csan", False):  # armed before the sampler allocates: CSAN must see its init writes
        from runnercheck.checks.detectors.csan import CsanMonitor, CsanUnavailableError

        try:
            monitor = CsanMonitor().arm()
        except CsanUnavailableError as e:
            print(f"runnercheck chisq: {e}", file=sys.stderr)
            return 2
    try:
        spec = args.sampler or default_sampler_spec(resolve_device(args.device))
        sampler = load_sampler(spec)
        rows_per_call_bound(sampler, args.max_rows_per_call)
    except (SamplerSpecError, SamplerUnavailableError, SamplerLimitError) as e:
        if monitor is not None:
            monitor.disarm()
        print(f"runnercheck chisq: {e}", file=sys.stderr)
        return 2
    opts = RunOptions(quick=args.quick, device=args.device, samples=args.samples, seed=args.seed, alpha=args.alpha,
                      correction=args.correction, calibration=not args.no_calibration, power=not args.no_power,
                      deep_tail=args.deep_tail, case_filter=args.cases, matrix=not args.no_matrix, spec=not args.no_spec,
                      biases=tuple(args.biases) if args.biases else None, power_repeats=args.power_repeats,
                      max_rows_per_call=args.max_rows_per_call,
                      shard=(args.shard.index, args.shard.count) if getattr(args, "shard", None) else (0, 1),
                      isolation=isolation_for(spec, args.timeout, args.no_isolation), convention=args.convention)
    try:
        summary = run_all(sampler, opts, keep_partial=True)
    finally:
        if monitor is not None:
            monitor.disarm()
    if monitor is not None:
        summary.csan = {"races": monitor.count, "lines": monitor.lines(), "reports": [r.text for r in monitor.races[:3]]}
    written = write_command_report("chisq", args.out, lambda tmp: write_report(tmp, summary),
                                   force=getattr(args, "force", False))
    if written.exit_status is not None:
        return written.exit_status
    if args.junit is not None:
        from runnercheck.checks.chisq.report import write_chisq_junit

        write_chisq_junit(args.junit, summary)
    print_summary(summary, args.out, junit=args.junit)
    return run_exit_status("chisq", args.out, summary.passed, summary.interrupted)


def run_quick(out_dir: str | Path, sampler: Callable | str | None = None, *, seed: int = 0) -> dict[str, Any]:
    """The quick matrix + calibration + power, report written to ``out_dir``; the JSON summary dict."""
    from runnercheck.checks.chisq.report import write_report

    if sampler is None or isinstance(sampler, str):
        sampler = load_sampler(sampler or default_sampler_spec(resolve_device("auto")))
    summary = run_all(sampler, RunOptions(quick=True, seed=seed), show_progress=False)
    write_report(Path(out_dir), summary)
    return summary.to_dict(include_bins=False)
