"""`runnercheck mutants`: run the suite's checks against every mutant of `runnercheck.stress.mutants.catalogue`; a kill matrix.

    runnercheck mutants [--quick] [--device auto|sim|cuda] [--only NAME ...] [--seed S]
                        [--chisq | --no-chisq] [--list] --out DIR

For each mutant: build a runner, the oracle and a scheduler for the mutant's `Workload`, install the
mutant, arm the host-sync detector (`runnercheck.checks.detectors.sync.arm_runner`) and the staging-lifetime checker
(`runnercheck.checks.detectors.lifetime.LifetimeChecker`), and run `runnercheck.stress.run.driver.DifferentialRun` until the first check
fires or the workload's tick budget is spent (``--quick``: the short budgets).  Sampler mutants
with a chi-square probe also get the chi-square / tail-mass tests of `runnercheck.checks.chisq.draws` on the
runner's own sampler kernel (`runnercheck.checks.chisq.impl_sampler.ImplSampler` on the run's device).  A check *kills* a mutant when it fires; a
mutant is killed *as designed* when one of the checks it was built for fired.

Controls: every workload used is also run without a mutant (quick: as many ticks as its slowest
kill took, the counterfactual of every kill; full: its whole budget), and every chi-square probe
on the unmutated sampler.  Any check firing in a control fails the whole run: a kill is then no
evidence.  Mutants marked ``needs_gpu`` are skipped unless the device is cuda.  Chi-square runs by
default only on cuda (the interpreted CPU sampler draws ~30 rows a second).

Writes DIR/mutants.json and the Markdown matrix DIR/mutants.md (`runnercheck.stress.mutants.report`).  Exit 0
only when every mutant run was killed as designed and every control stayed silent; 1 otherwise; 2 on
bad arguments; 130 when interrupted (Ctrl-C, SIGTERM): the report, marked incomplete, holds the
mutants that finished.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from runnercheck.stress.mutants import catalogue
from runnercheck.stress.cli.options import add_shard_option, int_type
from runnercheck.stress.mutants.catalogue import CATALOGUE, WORKLOADS, Mutant, Workload, known_checks
from runnercheck.stress.mutants.report import ControlResult, MutantResult, MutantsReport, markdown, write_report

MODEL_PRESET = "micro"
CHISQ_ALPHA = 0.01


# --------------------------------------------------------------------------- results


@dataclass
class CheckRun:
    """What the checks saw on one runner (mutated or not): ``fired`` maps a check to its first evidence."""

    fired: dict[str, str] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    ticks: int = 0
    tokens: int = 0
    seconds: float = 0.0


# --------------------------------------------------------------------------- the checks


_HOST_TICK_US: list[float] = []  # measured once per process: the host's tick on this machine


def _cuda_delay(config: Any) -> dict:
    """A ``random-delay`` policy that keeps the GPU about two host ticks behind (`runnercheck.stress.sim.races`)."""
    from runnercheck.stress.sim.races import calibrate_cuda_delay, measure_host_tick_us

    if not _HOST_TICK_US:
        _HOST_TICK_US.append(measure_host_tick_us(config))
    return calibrate_cuda_delay(config.seed, _HOST_TICK_US[0])


def run_differential(workload: Workload, device_kind: str, seed: int, ticks: int, *, mutant: str | None = None,
                     isolate: bool = True, cuda_graphs: bool = True, csan: bool = False) -> CheckRun:
    """Runner (with ``mutant`` installed) vs oracle under ``workload``, through `runnercheck.stress.run.harness.checked_run`.

    The lifetime checker raises (``error`` mode) from the host transition that exposes a violation,
    before the bytes it guards are consumed: a corrupted staging slot read by an interpreted kernel
    can take the process down.  The sync detector counts (a host read can happen inside device work
    on ``sim``, where raising would abandon half a step) and fires on host syncs beyond the runner's
    own counted back-pressure waits; the run stops at the end of the tick in which it fired.  The
    differential stops at its first divergence.  The run executes in a child process: a crash is
    evidence for the differential check (the run found the bug and died of it).  ``csan`` (cuda):
    the run is under CUDA's stream sanitizer too (`runnercheck.checks.detectors.csan`); a race it reports stops the run.
    """
    from runnercheck.impl.lag_policies import make_lag_policy
    from runnercheck.impl.model.weights import preset
    from runnercheck.stress.run.harness import ChurnOps
    from runnercheck.stress.run.config import RunConfig, default_limits
    from runnercheck.stress.run.runners import DEFAULT_RUNNER_SPEC
    from runnercheck.stress.sim.scheduler import SchedulerConfig

    model_config = preset(MODEL_PRESET)
    limits = default_limits(model_config, max_num_reqs=workload.max_num_reqs, block_size=workload.block_size,
                            num_kv_blocks=workload.num_kv_blocks, max_num_batched_tokens=workload.max_batched_tokens)
    lag = make_lag_policy(workload.lag_policy, seed).describe() if device_kind == "sim" else None
    if lag is not None and workload.p_hold:
        lag["p_hold"] = workload.p_hold
    config = RunConfig(seed, ticks, device_kind, MODEL_PRESET, model_config, limits,
                       SchedulerConfig(workload.max_inflight, 0.0, prefix_caching=not workload.draft_model,
                                       ngram_spec_tokens=workload.ngram_spec_tokens, draft_model=workload.draft_model),
                       lag, None, None, DEFAULT_RUNNER_SPEC, cuda_graphs)
    if device_kind == "cuda" and workload.cuda_lag:
        config = replace(config, delay_policy=_cuda_delay(config))
    config = replace(config, mutant=mutant, csan=csan, logits_fault=workload.logits_fault)
    return checked_differential(config, ChurnOps(workload.churn, workload.name), mutant or f"control {workload.name}",
                                isolate=isolate)


def checked_differential(config: Any, ops: Any, name: str, *, isolate: bool = True) -> CheckRun:
    """One differential run of ``config`` (its mutant installed) fed by ``ops``: which checks fired, with
    evidence -- every detector of the registry that reported a finding, and the differential."""
    from runnercheck.checks.detectors.registry import in_report_order, registered
    from runnercheck.stress.run.harness import checked_run
    from runnercheck.stress.run.isolation import isolated_run

    findings = (isolated_run if isolate else checked_run)(config, ops, name=name, lifetime_mode="error", stop_on_sync=True)
    outcome = CheckRun(ran=[*findings.detectors, "differential"], ticks=findings.result.ticks,
                       tokens=findings.result.tokens_compared, seconds=findings.elapsed_s)
    raised_by_detector: set[str] = set()  # exception names a fired detector raises from the runner in error mode
    for d in in_report_order(findings.detectors):
        failure = d.failure(findings.detectors[d.name])
        if failure:
            outcome.fired[d.name] = failure
            raised_by_detector.update(d.raises)
    first = findings.result.first_divergence
    owners = {kind: d.name for d in registered() for kind in getattr(d, "divergence_kinds", ())}
    if first is not None and first.kind in owners:  # a detector's own kind of divergence (kernel-memory): its kill
        outcome.fired.setdefault(owners[first.kind], first.line())
    # A runner error that is a fired detector raising (lifetime_mode="error") is that detector's kill, not the differential's.
    elif first is not None and not (first.kind == "runner-error" and first.got in raised_by_detector):
        outcome.fired["differential"] = first.line()
    return outcome


def run_invariance(mutant: str, device_kind: str, seed: int) -> CheckRun:
    """The batch-invariance check (`runnercheck.stress.invariance.checker.mutant_config`) with ``mutant`` installed."""
    from runnercheck.stress.invariance.checker import run_mutant_check

    started = time.perf_counter()
    result, first = run_mutant_check(mutant, device_kind, seed)
    outcome = CheckRun(ran=["invariance"], ticks=sum(s.steps for s in result.scenarios),
                       seconds=time.perf_counter() - started)
    if first is not None:
        outcome.fired["invariance"] = first
    return outcome


def run_chisq(case_key: str, device_kind: str, seed: int, *, mutant: str | None = None, samples: int | None = None) -> CheckRun:
    """The chi-square / tail-mass tests (`runnercheck.checks.chisq.draws`) of the probe case ``case_key`` on the runner's sampler."""
    from runnercheck.checks.chisq import stats
    from runnercheck.checks.chisq.cases import case_seed as seed_of, power_cases
    from runnercheck.checks.chisq.draws import draw, evaluate, expected_rows
    from runnercheck.checks.chisq.impl_sampler import ImplSampler
    from runnercheck.impl.device import Device

    started = time.perf_counter()
    case, _ = power_cases()[case_key]
    if samples is not None:
        case = replace(case, n_samples=samples)
    device = Device("cuda" if device_kind == "cuda" else "cpu")
    probe = ImplSampler(device, case.vocab_size, rows_per_launch=4096, max_requests=8)
    applied = catalogue.apply(mutant, target=probe) if mutant else None
    try:
        case_seed, offset = seed_of(seed, case.name)
        tokens = draw(probe, case, seed=case_seed, position_offset=offset, device=device.torch_device)
    finally:
        if applied is not None:
            applied.undo()
    results = stats.apply_correction(evaluate(case, tokens, expected_rows(case), CHISQ_ALPHA), "holm", CHISQ_ALPHA)
    outcome = CheckRun(ran=["chisq"], seconds=time.perf_counter() - started)
    failed = [r for r in results if not r.passed]
    if failed:
        worst = min(failed, key=lambda r: r.adjusted_p_value)
        outcome.fired["chisq"] = (f"{case.name}: {len(failed)} of {len(results)} tests rejected over {case.n_samples} draws; "
                                  f"{worst.name} ({worst.kind}) adjusted p = {worst.adjusted_p_value:.3g}")
    return outcome


# --------------------------------------------------------------------------- the catalogue run


@dataclass(frozen=True)
class MutantsOptions:
    device: str  # sim | cuda
    quick: bool = True
    seed: int = 0
    only: tuple[str, ...] = ()
    chisq: bool | None = None  # None: only on cuda
    chisq_samples: int | None = None
    isolate: bool = True  # each differential run in a child process (a crash is evidence, not the end)
    cuda_graphs: bool = True
    campaign: str = "workloads"  # the traffic of the differential part: each mutant's workload, or verify's plan

    @property
    def runs_chisq(self) -> bool:
        return self.device == "cuda" if self.chisq is None else self.chisq


def _ticks(workload: Workload, quick: bool) -> int:
    return workload.ticks if quick else workload.full_ticks


def _csan(mutant: Mutant, opts: MutantsOptions) -> bool:
    """CSAN slows every op: only runs of mutants built for it (cuda) go under it."""
    return "csan" in mutant.checks and opts.device == "cuda"


def run_mutant(mutant: Mutant, opts: MutantsOptions) -> MutantResult:
    """All checks that apply to ``mutant`` on ``opts.device`` (chi-square first: it is the cheap one on cuda)."""
    from runnercheck.stress.mutants.verify_campaign import campaign_name, run_verify_campaign

    verify = opts.campaign == "verify"
    base = dict(name=mutant.name, cls=mutant.cls, description=mutant.description, needs_gpu=mutant.needs_gpu,
                designed=list(mutant.checks), workload=campaign_name(opts.quick) if verify else mutant.workload)
    if mutant.needs_gpu and opts.device != "cuda":
        return MutantResult(**base, status="skipped", killed=False, killed_by=[], as_designed=False, checks_run=[],
                            evidence={}, ticks=0, seconds=0.0, skip_reason="needs a GPU to manifest")
    runs: list[CheckRun] = []
    if mutant.chisq_case and opts.runs_chisq:
        runs.append(run_chisq(mutant.chisq_case, opts.device, opts.seed, mutant=mutant.name, samples=opts.chisq_samples))
    if mutant.checks == ("invariance",):  # a batch-dependence mutant: only the invariance check looks for it
        runs.append(run_invariance(mutant.name, opts.device, opts.seed))
    elif verify and not (opts.quick and runs and runs[0].fired):
        runs.append(run_verify_campaign(opts.device, opts.seed, opts.quick, checked_differential, CheckRun(), mutant=mutant.name, isolate=opts.isolate,
                                        cuda_graphs=opts.cuda_graphs, csan=_csan(mutant, opts)))
    elif not (opts.quick and runs and runs[0].fired):
        workload = WORKLOADS[mutant.workload]
        runs.append(run_differential(workload, opts.device, opts.seed, _ticks(workload, opts.quick), mutant=mutant.name,
                                     isolate=opts.isolate, cuda_graphs=opts.cuda_graphs, csan=_csan(mutant, opts)))
    fired: dict[str, str] = {}
    for r in runs:
        fired.update({check: " ".join(text.split()) for check, text in r.fired.items()})  # one line each
    killed_by = [c for c in known_checks() if c in fired]
    return MutantResult(
        **base, status="killed" if killed_by else "survived", killed=bool(killed_by), killed_by=killed_by,
        as_designed=bool(set(killed_by) & set(mutant.checks)), checks_run=[c for c in known_checks() if any(c in r.ran for r in runs)],
        evidence=fired, ticks=sum(r.ticks for r in runs), seconds=sum(r.seconds for r in runs),
    )


def run_controls(results: Sequence[MutantResult], opts: MutantsOptions) -> list[ControlResult]:
    """The unmutated runner on every workload used, and every chi-square probe used on the unmutated sampler.

    A quick run gives each workload's control as many ticks as its slowest kill took (the same seed
    and traffic without the bug: the counterfactual of every kill); a full run the whole budget.
    """
    controls: list[ControlResult] = []
    ticks: dict[str, int] = {}
    csan_workloads = {r.workload for r in results if "csan" in r.checks_run}  # the control runs under CSAN too
    from runnercheck.stress.mutants.verify_campaign import plan_ticks, run_verify_campaign

    verify = opts.campaign == "verify"
    for r in results:
        if "differential" in r.checks_run:
            if opts.quick:
                budget = max(r.ticks, 1)
            else:
                budget = plan_ticks(opts.device, opts.seed) if verify else _ticks(WORKLOADS[r.workload], quick=False)
            ticks[r.workload] = max(ticks.get(r.workload, 0), budget)
    for name, budget in ticks.items():
        if verify:
            run = run_verify_campaign(opts.device, opts.seed, opts.quick, checked_differential, CheckRun(), budget=budget, isolate=opts.isolate,
                                      cuda_graphs=opts.cuda_graphs, csan=name in csan_workloads)
        else:
            run = run_differential(WORKLOADS[name], opts.device, opts.seed, budget, isolate=opts.isolate,
                                   cuda_graphs=opts.cuda_graphs, csan=name in csan_workloads)
        controls.append(ControlResult("workload", name, run.fired, run.ticks, run.seconds))
    if opts.runs_chisq:
        for case_key in dict.fromkeys(CATALOGUE[r.name].chisq_case for r in results if "chisq" in r.checks_run):
            run = run_chisq(case_key, opts.device, opts.seed, samples=opts.chisq_samples)
            controls.append(ControlResult("chisq", case_key, run.fired, 0, run.seconds))
    return controls


def run_catalogue(opts: MutantsOptions, *, command: str = "", on_result: Callable[[Any], None] | None = None,
                  keep_partial: bool = False) -> MutantsReport:
    """Every selected mutant, then the controls.  ``keep_partial``: an interrupt ends the run with the
    mutants that finished (controls only if they finished) in a report marked incomplete."""
    from runnercheck.checks.interrupts import CatchInterrupt
    from runnercheck.checks.provenance import device_name, provenance

    started = time.perf_counter()
    selected = [CATALOGUE[n] for n in opts.only] if opts.only else list(CATALOGUE.values())
    results: list[MutantResult] = []
    controls: list[ControlResult] = []
    stopped = CatchInterrupt(enabled=keep_partial)
    with stopped:
        for mutant in selected:
            results.append(run_mutant(mutant, opts))
            if on_result is not None:
                on_result(results[-1])
        controls = run_controls(results, opts)
        for c in controls:
            if on_result is not None:
                on_result(c)
    interrupted = None
    if stopped.interrupt is not None:
        interrupted = (f"{stopped.note()} after {len(results)} of {len(selected)} mutant(s)"
                       f"{'' if controls else ', before the controls'}; only what finished is reported")
    prov = provenance(device_name(opts.device))
    return MutantsReport(
        device=opts.device, quick=opts.quick, seed=opts.seed, chisq=opts.runs_chisq, command=command,
        date=prov["date"], mutants=results, controls=controls,
        elapsed_s=time.perf_counter() - started, provenance=prov,
        status="complete" if interrupted is None else "incomplete", interrupted=interrupted,
    )


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="short tick budgets (every run stops at its first kill)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="report folder (written atomically; checked before any work); required, except with --list")
    parser.add_argument("--only", nargs="+", default=(), metavar="NAME", help="run only these mutants (default: every mutant)")
    parser.add_argument("--campaign", choices=("workloads", "verify"), default="workloads",
                        help="the traffic each mutant runs under: its own workload (default), or the runs of "
                             "'runnercheck verify' on the device (--quick: its quick plan), in order, until one kills it")
    chisq = parser.add_mutually_exclusive_group()
    chisq.add_argument("--chisq", dest="chisq", action="store_true", default=None,
                       help="run the chi-square probes on any device (slow when interpreted)")
    chisq.add_argument("--no-chisq", dest="chisq", action="store_false",
                       help="never run the chi-square probes (without either flag they run on cuda only)")
    parser.add_argument("--chisq-samples", type=int_type(1), default=None,
                        help="draws per chi-square probe (default: the case's own)")
    parser.add_argument("--seeds", type=int_type(1), default=1, metavar="N",
                        help="run the catalogue for N seeds from --seed and report kill rates (rates.json, rates.md)")
    add_shard_option(parser, "seeds of --seeds")
    parser.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                        help="run nothing: the kill rates of one campaign from the report folders of its "
                             "--seeds --shard jobs (every seed once), written to --out (default: run the catalogue)")
    parser.add_argument("--list", action="store_true", help="print the catalogue and exit")
    parser.add_argument("--junit", default=None, metavar="FILE",
                        help="also write JUnit XML (one case per mutant and control; default: not written)")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)


def _print_catalogue() -> None:
    for m in CATALOGUE.values():
        gpu = ", needs a GPU" if m.needs_gpu else ""
        print(f"{m.name:<32} {m.cls:<8} killed by {'/'.join(m.checks)}; workload {m.workload}{gpu}\n    {m.description}")


def _merge(args: argparse.Namespace) -> int:
    """``--merge DIR...``: one campaign's kill rates from the folders its ``--seeds --shard`` jobs wrote."""
    from rich.console import Console

    from runnercheck.checks.report_folder import write_command_report
    from runnercheck.stress.report.junit_cases import check_junit_path
    from runnercheck.stress.mutants.rates import RatesMergeError, merge_shards, write_rates
    from runnercheck.stress.run.config import RunSetupError

    command = f"runnercheck mutants --merge {' '.join(map(str, args.merge))} --out {args.out}"
    try:
        if args.out is None:
            raise RatesMergeError("--out DIR is required")
        if args.junit:
            check_junit_path(args.junit)
        rates = merge_shards(args.merge, command=command)
    except (RatesMergeError, RunSetupError) as e:
        print(f"runnercheck mutants: {e}", file=sys.stderr)
        return 2
    written = write_command_report("mutants", args.out, lambda tmp: write_rates(rates, tmp), force=args.force)
    if written.exit_status is not None:
        return written.exit_status
    return _report_rates(args, rates, Console(), f" (merged from {len(args.merge)} folder(s))")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    if args.list:
        _print_catalogue()
        return 0
    if args.merge:
        return _merge(args)
    from runnercheck.checks.report_folder import run_exit_status, write_command_report
    from runnercheck.checks.junit import suite_name
    from runnercheck.stress.report.junit_cases import check_junit_path, mutants_cases, write_cases
    from runnercheck.stress.run.config import RunSetupError, seed_problem

    unknown = [n for n in args.only if n not in CATALOGUE]
    problems = [f"unknown mutant(s) {', '.join(unknown)}; see --list"] if unknown else []
    if args.out is None:
        problems.append("--out DIR is required")
    device = args.device
    if device == "cpu":
        problems.append("--device cpu: mutants run on sim (races) or cuda")
    if args.seeds > 1 and seed_problem(args.seed + args.seeds - 1):
        problems.append(f"--seed {args.seed} --seeds {args.seeds}: the last seed must be below 2^63")
    if args.seeds < args.shard.count:
        problems.append(f"--shard {args.shard.describe()} needs --seeds {args.shard.count} or more (it splits the seeds)")
    if args.junit:
        try:
            check_junit_path(args.junit)
        except RunSetupError as e:
            problems.append(str(e))
    if problems:
        print("runnercheck mutants: " + "; ".join(problems), file=sys.stderr)
        return 2
    if device != "cuda":
        # Interpreted kernels on tiny tensors: intra-op threads only contend (measured ~1.5x slower).
        torch.set_num_threads(1)
    opts = MutantsOptions(device=device, quick=args.quick, seed=args.seed, only=tuple(dict.fromkeys(args.only)),
                          chisq=args.chisq, chisq_samples=args.chisq_samples, isolate=not args.in_process,
                          cuda_graphs=not args.eager, campaign=args.campaign)
    console = Console()
    command = " ".join(["runnercheck mutants", *(["--quick"] if args.quick else []), f"--device {device}",
                        *([f"--campaign {args.campaign}"] if args.campaign != "workloads" else []),
                        *([f"--only {' '.join(opts.only)}"] if opts.only else []),
                        *({True: ["--chisq"], False: ["--no-chisq"]}.get(args.chisq, [])),
                        *([f"--chisq-samples {args.chisq_samples}"] if args.chisq_samples else []),
                        f"--seed {args.seed}", *([f"--seeds {args.seeds}"] if args.seeds > 1 else []),
                        *([f"--shard {args.shard.describe()}"] if not args.shard.whole else []),
                        f"--out {args.out}"])

    def show(item: Any) -> None:
        if isinstance(item, MutantResult):
            by = f"by {', '.join(item.killed_by)}" if item.killed else (item.skip_reason or "no check fired")
            mark = "killed " if item.as_designed else ("SKIPPED" if item.status == "skipped" else "ALIVE  ")
            console.print(f"  {mark} {item.name:<30} {by}  ({item.ticks} ticks, {item.seconds:.1f} s)", highlight=False)
        else:
            mark = "clean  " if item.clean else "FIRED  "
            console.print(f"  {mark} control {item.kind} {item.name:<20} {', '.join(item.fired) or ''} "
                          f"({item.ticks} ticks, {item.seconds:.1f} s)", highlight=False)

    if args.seeds > 1:  # (a shard needs --seeds >= its count: checked above)
        return _run_seeds(args, opts, command, show, console)
    def run_and_write(tmp: Path) -> MutantsReport:
        report = run_catalogue(opts, command=command, on_result=show, keep_partial=True)
        write_report(report, tmp)
        return report

    written = write_command_report("mutants", args.out, run_and_write, force=args.force, echo=_plain(console))
    if written.exit_status is not None:
        return written.exit_status
    report = written.value
    json_path, md_path = Path(args.out) / "mutants.json", Path(args.out) / "mutants.md"
    files = [md_path, json_path, Path(args.out) / "manifest.json"]
    if args.junit:
        files.append(write_cases(args.junit, suite_name("mutants"), mutants_cases(report), {"seed": args.seed},
                                 elapsed_s=report.elapsed_s))
    table = Table(title=f"runnercheck mutants: {'PASS' if report.passed else 'FAIL'}", show_header=False)
    run_mutants = [m for m in report.mutants if m.status != "skipped"]
    table.add_row("device, seed", f"{device}, {args.seed}{' (quick)' if args.quick else ''}")
    table.add_row("killed as designed", f"{sum(m.as_designed for m in run_mutants)} / {len(run_mutants)}")
    table.add_row("skipped", ", ".join(m.name for m in report.mutants if m.status == "skipped") or "none")
    table.add_row("survivors", ", ".join(m.name for m in run_mutants if not m.as_designed) or "none")
    table.add_row("controls", "clean" if all(c.clean for c in report.controls) else
                  "FIRED: " + ", ".join(c.name for c in report.controls if not c.clean))
    table.add_row("elapsed", f"{report.elapsed_s:.0f} s")
    console.print(table)
    console.print("report files:\n" + "\n".join(f"  {f}" for f in files), highlight=False, markup=False)
    return run_exit_status("mutants", args.out, report.passed, report.interrupted)


def _run_seeds(args: argparse.Namespace, opts: MutantsOptions, command: str, show: Callable[[Any], None],
               console: Any) -> int:
    """``--seeds N``: the catalogue once per seed of this job's shard (each seed's report in ``seed-<k>/``),
    then the kill rates over those seeds."""
    from runnercheck.checks.report_folder import run_exit_status, write_command_report
    from runnercheck.stress.mutants.rates import kill_rates, write_rates

    reports = []

    def run_seeds(tmp: Path) -> Any:
        seeds = args.shard.select(range(args.seed, args.seed + args.seeds))
        for k, seed in enumerate(seeds):
            seed_opts = replace(opts, seed=seed)
            console.print(f"seed {seed} ({k + 1}/{len(seeds)}, shard {args.shard.describe()})", highlight=False)
            reports.append(run_catalogue(seed_opts, command=command, on_result=show, keep_partial=True))
            write_report(reports[-1], tmp / f"seed-{seed_opts.seed}")
            if reports[-1].interrupted:  # the seeds after it never ran
                break
        rates = kill_rates(reports, command=command)
        write_rates(rates, tmp)
        return rates

    written = write_command_report("mutants", args.out, run_seeds, force=args.force, echo=_plain(console))
    if written.exit_status is not None:
        return written.exit_status
    shard = "" if args.shard.whole else f" (shard {args.shard.describe()})"
    status = _report_rates(args, written.value, console, shard)
    last = reports[-1]
    return run_exit_status("mutants", args.out, status == 0, last.interrupted and f"seed {last.seed} {last.interrupted}")


def _plain(console: Any) -> Callable[[str], None]:
    """A line to the console as it is (no markup, no highlighting)."""
    return lambda line: console.print(line, highlight=False, markup=False)


def _report_rates(args: argparse.Namespace, rates: Any, console: Any, note: str = "") -> int:
    """JUnit (``--junit``), the terminal table and the file list of a kill-rates folder; the exit status."""
    from rich.table import Table

    from runnercheck.checks.junit import suite_name
    from runnercheck.stress.report.junit_cases import rates_cases, write_cases

    out = Path(args.out)
    files = [out / "rates.md", out / "rates.json", out / "manifest.json"]
    if args.junit:
        files.append(write_cases(args.junit, suite_name("mutants"), rates_cases(rates),
                                 {"seed": args.seed, "seeds": len(rates.seeds)}))
    table = Table(title=f"runnercheck mutants over {len(rates.seeds)} seeds: {'PASS' if rates.passed else 'FAIL'}",
                  show_header=False)
    ran = [m for m in rates.mutants if m.seeds_run]
    table.add_row("device, seeds", f"{rates.device}, {', '.join(map(str, rates.seeds))}{' (quick)' if rates.quick else ''}"
                  + note)
    table.add_row("killed as designed in every seed", f"{sum(m.rate == 1.0 for m in ran)} / {len(ran)}")
    table.add_row("below 1.0", ", ".join(f"{m.name} {len(m.seeds_killed_as_designed)}/{len(m.seeds_run)}"
                                         for m in ran if m.rate != 1.0) or "none")
    table.add_row("controls", "clean in every seed" if all(c.clean for c in rates.controls) else
                  "FIRED: " + ", ".join(f"{c.name} (seeds {c.fired_in})" for c in rates.controls if not c.clean))
    table.add_row("elapsed", f"{rates.elapsed_s:.0f} s")
    console.print(table)
    console.print("report files:\n" + "\n".join(f"  {f}" for f in files), highlight=False, markup=False)
    return 0 if rates.passed else 1


__all__ = ["CheckRun", "ControlResult", "MutantResult", "MutantsOptions", "MutantsReport",
           "add_arguments", "markdown", "run", "run_catalogue", "run_chisq", "run_differential", "run_mutant",
           "write_report"]
