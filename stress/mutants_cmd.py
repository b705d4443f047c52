"""`runnercheck mutants`: run the suite's checks against every mutant of `stress.mutants`; a kill matrix.

    runnercheck mutants [--quick] [--device auto|sim|cuda] [--only NAME ...] [--seed S]
                        [--chisq | --no-chisq] [--list] --out DIR

For each mutant: build a runner, the oracle and a scheduler for the mutant's `Workload`, install the
mutant, arm the host-sync detector (`checks.sync.arm_runner`) and the staging-lifetime checker
(`checks.lifetime.LifetimeChecker`), and run `stress.driver.DifferentialRun` until the first check
fires or the workload's tick budget is spent (``--quick``: the short budgets).  Sampler mutants
with a chi-square probe also get the chi-square / tail-mass tests of `checks.chisq` on the
runner's own sampler kernel (`RunnerSamplerProbe`).  A check *kills* a mutant when it fires; a
mutant is killed *as designed* when one of the checks it was built for fired.

Controls: every workload used is also run without a mutant (quick: as many ticks as its slowest
kill took, the counterfactual of every kill; full: its whole budget), and every chi-square probe
on the unmutated sampler.  Any check firing in a control fails the whole run: a kill is then no
evidence.  Mutants marked ``needs_gpu`` are skipped unless the device is cuda.  Chi-square runs by
default only on cuda (the interpreted CPU sampler draws ~30 rows a second).

Writes DIR/mutants.json and the Markdown matrix DIR/mutants.md (`stress.mutants_report`).  Exit 0
only when every mutant run was killed as designed and every control stayed silent; 1 otherwise; 2 on
bad arguments.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch

from stress import mutants as catalogue
from stress.mutants import CATALOGUE, CHECKS, WORKLOADS, Mutant, Workload
from stress.mutants_report import ControlResult, MutantResult, MutantsReport, markdown, write_report

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


class _StopRun(Exception):
    """Raised from ``before_tick`` once the sync detector fired: the run stops at the first kill."""


def _churn(workload: Workload, limits: Any, seed: int) -> Callable:
    from stress.churn import Churn

    class WorkloadChurn(Churn):
        def _params(self, max_tokens: int):  # noqa: ANN202 - Churn's hook
            if workload.params is None:
                return super()._params(max_tokens)
            return workload.params(self.rng, max_tokens)

    return WorkloadChurn(limits, seed=seed, config=workload.churn)


_HOST_TICK_US: list[float] = []  # measured once per process: the host's tick on this machine


def _cuda_delay(config: Any) -> dict:
    """A ``random-delay`` policy that keeps the GPU about two host ticks behind (`stress.races`)."""
    from stress.races import calibrate_cuda_delay, measure_host_tick_us

    if not _HOST_TICK_US:
        _HOST_TICK_US.append(measure_host_tick_us(config))
    return calibrate_cuda_delay(config.seed, _HOST_TICK_US[0])


def run_differential(workload: Workload, device_kind: str, seed: int, ticks: int, *, mutant: str | None = None) -> CheckRun:
    """Runner (with ``mutant`` installed) vs oracle under ``workload``, sync and lifetime detectors armed.

    The lifetime checker raises (``error`` mode) from the host transition that exposes a violation,
    before the bytes it guards are consumed: a corrupted staging slot read by an interpreted kernel
    can take the process down.  The sync detector counts (a host read can happen inside device work
    on ``sim``, where raising would abandon half a step) and fires on host syncs beyond the runner's
    own counted back-pressure waits (`stress.machine.unaccounted_syncs_message`); the run stops at
    the end of the tick in which it fired.  The differential stops at its first divergence.
    """
    from checks.lifetime import LifetimeChecker
    from checks.sync import arm_runner
    from impl.device import make_lag_policy
    from impl.model.weights import preset
    from stress.driver import DifferentialRun
    from stress.machine import unaccounted_syncs_message
    from stress.runners import DEFAULT_RUNNER_SPEC
    from stress.scheduler import SchedulerConfig
    from stress.stress_cmd import RandomDelay, StressConfig, build_session, default_limits

    model_config = preset(MODEL_PRESET)
    limits = default_limits(model_config, max_num_reqs=workload.max_num_reqs, block_size=workload.block_size,
                            num_kv_blocks=workload.num_kv_blocks, max_num_batched_tokens=workload.max_batched_tokens)
    lag = make_lag_policy(workload.lag_policy, seed).describe() if device_kind == "sim" else None
    config = StressConfig(seed, ticks, device_kind, MODEL_PRESET, model_config, limits,
                          SchedulerConfig(workload.max_inflight, 0.0), lag, None, None, DEFAULT_RUNNER_SPEC)
    delay = _cuda_delay(config) if device_kind == "cuda" and workload.cuda_lag else None
    started = time.perf_counter()
    session = build_session(config)
    applied = catalogue.apply(mutant, runner=session.runner) if mutant else None
    sync_report = arm_runner(session.runner, "count")
    lifetime = LifetimeChecker("error").attach(session.runner.staging)
    churn = _churn(workload, limits, seed)
    outcome = CheckRun(ran=["sync", "lifetime", "differential"])

    def before_tick(tick: int, scheduler: Any) -> None:
        if unaccounted_syncs_message(sync_report, session.runner):
            raise _StopRun
        outcome.ticks = tick + 1
        churn(tick, scheduler)

    def count(report: Any) -> None:
        outcome.tokens += report.comparison.tokens_compared

    driver = DifferentialRun(session.runner, session.oracle, session.scheduler, on_step=count, before_tick=before_tick,
                             before_enqueue=RandomDelay.from_dict(delay).hook(session.device) if delay else None)
    result = None
    try:
        result = driver.run(ticks)
    except _StopRun:
        pass
    except Exception as e:  # a mutated runner's output broke the comparison itself
        if mutant is None:
            raise
        outcome.fired["differential"] = f"the comparison could not read the runner's output: {type(e).__name__}: {e}"
    finally:
        if applied is not None:
            applied.undo()
        if session.device.is_cuda:
            try:
                session.device.synchronize()
            except Exception:  # the run is over; a mutant's device fault was already reported or is moot
                pass
    sync_problem = unaccounted_syncs_message(sync_report, session.runner)
    if sync_problem:
        outcome.fired["sync"] = sync_problem
    if lifetime.violations:
        outcome.fired["lifetime"] = f"{lifetime.violations} violation(s); first: {lifetime.errors[0]}"
    first = result.first_divergence if result is not None else None
    if first is not None and not (first.kind == "runner-error" and lifetime.violations and first.got == "StagingLifetimeError"):
        outcome.fired["differential"] = first.line()
    outcome.seconds = time.perf_counter() - started
    return outcome


class RunnerSamplerProbe:
    """The runner's own sampler (`impl.sample.Sampler` over a `SamplingState`) behind the
    `checks.samplers` contract ``probe(logits, params, seeds, positions, history=...) -> tokens``.

    Owns a `Sampler`, a `SamplingState` (one state row per distinct (params, seed, history) of a
    call) and a two-slot `StagingPool`, all on ``device`` for the probe's lifetime and written only
    by `__call__`.  Mutants patch ``probe.sampler`` exactly as they patch ``runner.sampler``.
    """

    name = "runner-sampler"

    def __init__(self, device: Any, vocab_size: int, *, max_rows: int = 4096, max_groups: int = 8):
        from impl.buffers import StagingPool
        from impl.sample import Sampler, SamplingState

        self.device = device
        self.max_rows = max_rows
        self.max_groups = max_groups
        self.sampler = Sampler(device, vocab_size, 0, max_num_rows=max_rows)
        self.sampling_state = SamplingState(device, max_groups, vocab_size)
        self.pool = StagingPool(device, 2, 1 << 20)
        self._step = 0

    def __call__(self, logits: torch.Tensor, params: Sequence[Any], seeds: torch.Tensor, positions: torch.Tensor, *,
                 history: Sequence[Any] | None = None) -> torch.Tensor:
        from checks.samplers import SamplerUnsupportedError, TokenHistory
        from impl.buffers import StagingWriter

        n = logits.shape[0]
        groups: dict[tuple, int] = {}
        state_rows = [groups.setdefault((params[i], seed, history[i] if history is not None else TokenHistory()), len(groups))
                      for i, seed in enumerate(seeds.tolist())]
        if len(groups) > self.max_groups:
            raise SamplerUnsupportedError(f"{len(groups)} distinct (params, seed, history) > {self.max_groups} state rows")
        self._step += 1
        writer = StagingWriter(self.pool, self._step)
        for (p, seed, h), row in groups.items():
            self.sampling_state.add_request(row, p, seed, h.prompt_ids, h.output_ids)
        self.sampling_state.flush(writer)
        writer.submit()
        self.sampling_state.enqueue_apply()
        where = self.device.torch_device
        logits = logits.to(where, torch.float32).contiguous()
        rows = torch.tensor(state_rows, dtype=torch.int32, device=where)
        positions = positions.to(where, torch.int64)
        if self.device.is_cuda:  # inputs were made on the caller's stream; the sampler runs on the runner's
            self.device.stream.wait_stream(torch.cuda.current_stream(where))
        tokens = torch.empty(n, dtype=torch.int64)
        for start in range(0, n, self.max_rows):
            stop, out = min(n, start + self.max_rows), {}

            def launch(start: int = start, stop: int = stop, out: dict = out) -> None:
                out["tokens"] = self.sampler.sample(logits[start:stop], self.sampling_state, rows[start:stop],
                                                    positions[start:stop], num_rows=stop - start).tokens

            self.device.enqueue(launch, "chi-square probe")
            self.device.synchronize()
            tokens[start:stop] = out["tokens"].cpu()
        return tokens


def run_chisq(case_key: str, device_kind: str, seed: int, *, mutant: str | None = None, samples: int | None = None) -> CheckRun:
    """The chi-square / tail-mass tests of `checks.chisq`'s probe case ``case_key`` on the runner's sampler."""
    from checks import chisq, stats
    from checks.chisq_cases import power_cases
    from impl.device import Device

    started = time.perf_counter()
    case, _ = power_cases()[case_key]
    if samples is not None:
        case = replace(case, n_samples=samples)
    device = Device("cuda" if device_kind == "cuda" else "cpu")
    probe = RunnerSamplerProbe(device, case.vocab_size)
    applied = catalogue.apply(mutant, target=probe) if mutant else None
    try:
        case_seed, offset = chisq.case_seed(seed, case.name)
        tokens = chisq.draw(probe, case, seed=case_seed, position_offset=offset, device=device.torch_device)
    finally:
        if applied is not None:
            applied.undo()
    results = stats.apply_correction(chisq.evaluate(case, tokens, chisq.expected_rows(case), CHISQ_ALPHA), "holm", CHISQ_ALPHA)
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

    @property
    def runs_chisq(self) -> bool:
        return self.device == "cuda" if self.chisq is None else self.chisq


def _ticks(workload: Workload, quick: bool) -> int:
    return workload.ticks if quick else workload.full_ticks


def run_mutant(mutant: Mutant, opts: MutantsOptions) -> MutantResult:
    """All checks that apply to ``mutant`` on ``opts.device`` (chi-square first: it is the cheap one on cuda)."""
    base = dict(name=mutant.name, cls=mutant.cls, description=mutant.description, needs_gpu=mutant.needs_gpu,
                designed=list(mutant.checks), workload=mutant.workload)
    if mutant.needs_gpu and opts.device != "cuda":
        return MutantResult(**base, status="skipped", killed=False, killed_by=[], as_designed=False, checks_run=[],
                            evidence={}, ticks=0, seconds=0.0, skip_reason="needs a GPU to manifest")
    runs: list[CheckRun] = []
    if mutant.chisq_case and opts.runs_chisq:
        runs.append(run_chisq(mutant.chisq_case, opts.device, opts.seed, mutant=mutant.name, samples=opts.chisq_samples))
    if not (opts.quick and runs and runs[0].fired):
        workload = WORKLOADS[mutant.workload]
        runs.append(run_differential(workload, opts.device, opts.seed, _ticks(workload, opts.quick), mutant=mutant.name))
    fired: dict[str, str] = {}
    for r in runs:
        fired.update({check: " ".join(text.split()) for check, text in r.fired.items()})  # one line each
    killed_by = [c for c in CHECKS if c in fired]
    return MutantResult(
        **base, status="killed" if killed_by else "survived", killed=bool(killed_by), killed_by=killed_by,
        as_designed=bool(set(killed_by) & set(mutant.checks)), checks_run=[c for c in CHECKS if any(c in r.ran for r in runs)],
        evidence=fired, ticks=sum(r.ticks for r in runs), seconds=sum(r.seconds for r in runs),
    )


def run_controls(results: Sequence[MutantResult], opts: MutantsOptions) -> list[ControlResult]:
    """The unmutated runner on every workload used, and every chi-square probe used on the unmutated sampler.

    A quick run gives each workload's control as many ticks as its slowest kill took (the same seed
    and traffic without the bug: the counterfactual of every kill); a full run the whole budget.
    """
    controls: list[ControlResult] = []
    ticks: dict[str, int] = {}
    for r in results:
        if "differential" in r.checks_run:
            budget = max(r.ticks, 1) if opts.quick else _ticks(WORKLOADS[r.workload], quick=False)
            ticks[r.workload] = max(ticks.get(r.workload, 0), budget)
    for name, budget in ticks.items():
        run = run_differential(WORKLOADS[name], opts.device, opts.seed, budget)
        controls.append(ControlResult("workload", name, run.fired, run.ticks, run.seconds))
    if opts.runs_chisq:
        for case_key in dict.fromkeys(CATALOGUE[r.name].chisq_case for r in results if "chisq" in r.checks_run):
            run = run_chisq(case_key, opts.device, opts.seed, samples=opts.chisq_samples)
            controls.append(ControlResult("chisq", case_key, run.fired, 0, run.seconds))
    return controls


def run_catalogue(opts: MutantsOptions, *, command: str = "", on_result: Callable[[Any], None] | None = None) -> MutantsReport:
    started = time.perf_counter()
    selected = [CATALOGUE[n] for n in opts.only] if opts.only else list(CATALOGUE.values())
    results = []
    for mutant in selected:
        results.append(run_mutant(mutant, opts))
        if on_result is not None:
            on_result(results[-1])
    controls = run_controls(results, opts)
    for c in controls:
        if on_result is not None:
            on_result(c)
    return MutantsReport(
        device=opts.device, quick=opts.quick, seed=opts.seed, chisq=opts.runs_chisq, command=command,
        date=_dt.datetime.now().isoformat(timespec="seconds"), mutants=results, controls=controls,
        elapsed_s=time.perf_counter() - started,
    )


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="short tick budgets (every run stops at its first kill)")
    parser.add_argument("--device", default="auto", choices=["auto", "sim", "cuda"])
    parser.add_argument("--only", nargs="+", default=(), metavar="NAME", help="run only these mutants")
    parser.add_argument("--seed", type=int, default=0)
    chisq = parser.add_mutually_exclusive_group()
    chisq.add_argument("--chisq", dest="chisq", action="store_true", default=None,
                       help="run the chi-square probes on any device (slow when interpreted)")
    chisq.add_argument("--no-chisq", dest="chisq", action="store_false")
    parser.add_argument("--chisq-samples", type=int, default=None, help="draws per chi-square probe (default: the case's own)")
    parser.add_argument("--list", action="store_true", help="print the catalogue and exit")
    parser.add_argument("--out", default=None, help="report folder (mutants.json, mutants.md)")


def _print_catalogue() -> None:
    for m in CATALOGUE.values():
        gpu = ", needs a GPU" if m.needs_gpu else ""
        print(f"{m.name:<32} {m.cls:<8} killed by {'/'.join(m.checks)}; workload {m.workload}{gpu}\n    {m.description}")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    if args.list:
        _print_catalogue()
        return 0
    unknown = [n for n in args.only if n not in CATALOGUE]
    problems = [f"unknown mutant(s) {', '.join(unknown)}; see --list"] if unknown else []
    if args.out is None:
        problems.append("--out DIR is required")
    if args.chisq_samples is not None and args.chisq_samples < 1:
        problems.append("--chisq-samples must be >= 1")
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "sim"
    elif device == "cuda" and not torch.cuda.is_available():
        problems.append("--device cuda, but torch sees no CUDA device")
    if problems:
        print("runnercheck mutants: " + "; ".join(problems), file=sys.stderr)
        return 2
    if device != "cuda":
        # Interpreted kernels on tiny tensors: intra-op threads only contend (measured ~1.5x slower).
        torch.set_num_threads(1)
    opts = MutantsOptions(device=device, quick=args.quick, seed=args.seed, only=tuple(dict.fromkeys(args.only)),
                          chisq=args.chisq, chisq_samples=args.chisq_samples)
    console = Console()
    command = " ".join(["runnercheck mutants", *(["--quick"] if args.quick else []), f"--device {device}",
                        *([f"--only {' '.join(opts.only)}"] if opts.only else []),
                        *({True: ["--chisq"], False: ["--no-chisq"]}.get(args.chisq, [])),
                        *([f"--chisq-samples {args.chisq_samples}"] if args.chisq_samples else []),
                        f"--seed {args.seed}", f"--out {args.out}"])

    def show(item: Any) -> None:
        if isinstance(item, MutantResult):
            by = f"by {', '.join(item.killed_by)}" if item.killed else (item.skip_reason or "no check fired")
            mark = "killed " if item.as_designed else ("SKIPPED" if item.status == "skipped" else "ALIVE  ")
            console.print(f"  {mark} {item.name:<30} {by}  ({item.ticks} ticks, {item.seconds:.1f} s)", highlight=False)
        else:
            mark = "clean  " if item.clean else "FIRED  "
            console.print(f"  {mark} control {item.kind} {item.name:<20} {', '.join(item.fired) or ''} "
                          f"({item.ticks} ticks, {item.seconds:.1f} s)", highlight=False)

    report = run_catalogue(opts, command=command, on_result=show)
    json_path, md_path = write_report(report, args.out)
    table = Table(title=f"runnercheck mutants: {'PASS' if report.passed else 'FAIL'}", show_header=False)
    run_mutants = [m for m in report.mutants if m.status != "skipped"]
    table.add_row("device, seed", f"{device}, {args.seed}{' (quick)' if args.quick else ''}")
    table.add_row("killed as designed", f"{sum(m.as_designed for m in run_mutants)} / {len(run_mutants)}")
    table.add_row("skipped", ", ".join(m.name for m in report.mutants if m.status == "skipped") or "none")
    table.add_row("survivors", ", ".join(m.name for m in run_mutants if not m.as_designed) or "none")
    table.add_row("controls", "clean" if all(c.clean for c in report.controls) else
                  "FIRED: " + ", ".join(c.name for c in report.controls if not c.clean))
    table.add_row("elapsed", f"{report.elapsed_s:.0f} s")
    table.add_row("report", f"{md_path}  {json_path}")
    console.print(table)
    return 0 if report.passed else 1


__all__ = ["CheckRun", "ControlResult", "MutantResult", "MutantsOptions", "MutantsReport", "RunnerSamplerProbe",
           "add_arguments", "markdown", "run", "run_catalogue", "run_chisq", "run_differential", "run_mutant",
           "write_report"]
