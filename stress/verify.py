"""`runnercheck verify`: the main job -- runner vs oracle under stress with every detector armed,
then the sampler statistics, then a report folder.

    runnercheck verify [--device auto|cuda|sim|cpu] [--quick] [--seed S] [--out DIR] [--runner pkg.mod:factory]

1. Differential stress runs (`stress.driver.DifferentialRun`, random churn from `stress.churn`),
   each with the host-sync detector armed around ``execute_model`` in count mode
   (`checks.sync.arm_runner`) and a `checks.lifetime.LifetimeChecker` in count mode on the
   runner's staging pool.  On ``sim`` the runs cover the lag policies (run-immediately,
   lag-k-steps, random-drain) with one or more steps in flight and draft tokens; on ``cuda`` the
   GPU is made to lag the host by injected delays under heavy churn (`stress.races`).  Run ``i``
   uses seed ``S + i``.
2. The sampler statistics (`run_chisq`, `stress.verify_chisq`), each named by the sampler it ran
   on: on cuda the quick chi-square matrix on the runner's sampler; on CPU the quick matrix on the
   PyTorch baseline plus a few fixed cases on the runner's sampler, interpreted (``DIR/chisq``,
   ``DIR/chisq-runner``).
3. ``DIR/summary.json`` and ``DIR/summary.md`` (`stress.report`), and ``DIR/repros/*.json`` for
   every divergent run (`stress.repro`; `runnercheck replay FILE` re-runs one).

A run passes when runner and oracle agree on every compared step, every host read/wait inside
``execute_model`` is one of the runner's own counted back-pressure waits
(`stress.machine.counted_waits`), and the staging checker saw no violation.  Exit 0 only when
every run and the statistics pass; 1 otherwise; 2 for arguments or a runner that cannot be built.

``--quick`` is sized to finish in about two minutes on a 2-core CPU with Triton interpreted.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from impl.model.weights import PRESETS, preset
from stress.churn import Churn, ChurnConfig
from stress.report import RunRecord, build_summary, chisq_passed, write_report
from stress.runners import DEFAULT_RUNNER_SPEC
from stress.scheduler import SchedulerConfig
from stress.stress_cmd import StressConfig, StressSetupError, default_limits

VERIFY_CHURN = ChurnConfig(max_unfinished=8, max_prompt_len=16, max_new_tokens=10, abort_prob=0.06, preempt_prob=0.1)
QUICK_LIMITS = {"max_num_reqs": 3, "block_size": 4, "num_kv_blocks": 12, "max_num_batched_tokens": 16}
FULL_LIMITS = {"max_num_reqs": 4, "block_size": 8, "num_kv_blocks": 16, "max_num_batched_tokens": 32}
CUDA_LIMITS = {"max_num_reqs": 4, "block_size": 8, "num_kv_blocks": 24, "max_num_batched_tokens": 48}


@dataclass(frozen=True)
class PlannedRun:
    """One stress run of the plan: its name, the full `StressConfig` and the churn that feeds it."""

    name: str
    config: StressConfig
    churn: ChurnConfig


# (name, lag policy, max_inflight_steps, draft_prob); the seed of run i is S + i.
_SIM_QUICK = [
    ("random-drain", {"name": "random-drain", "p_stall": 0.5}, 1, 0.0),
    ("lag-1 drafts", {"name": "lag-k-steps", "k": 1}, 1, 0.3),
    ("lag-3 two-ahead", {"name": "lag-k-steps", "k": 3}, 2, 0.0),
]
_SIM_FULL = [
    ("run-immediately", {"name": "run-immediately"}, 1, 0.0),
    ("lag-1 drafts", {"name": "lag-k-steps", "k": 1}, 1, 0.3),
    ("lag-2 two-ahead", {"name": "lag-k-steps", "k": 2}, 2, 0.0),
    ("lag-3 three-ahead drafts", {"name": "lag-k-steps", "k": 3}, 3, 0.2),
    ("random-drain drafts", {"name": "random-drain", "p_stall": 0.5}, 1, 0.3),
    ("random-drain stalling two-ahead", {"name": "random-drain", "p_stall": 0.8}, 2, 0.0),
]
# (name, max_inflight_steps, draft_prob); delays are calibrated per machine (stress.races).
_CUDA_QUICK = [("delays two-ahead", 2, 0.0), ("delays three-ahead drafts", 3, 0.2)]
_CUDA_FULL = _CUDA_QUICK + [("delays one-ahead drafts", 1, 0.3), ("delays three-ahead", 3, 0.0)]
_CPU = [("one-ahead", 1, 0.0), ("one-ahead drafts", 1, 0.3), ("two-ahead", 2, 0.0)]


def _config(seed: int, ticks: int, kind: str, model: str, limits: dict, inflight: int, draft_prob: float,
            lag: dict | None, delay: dict | None, runner: str) -> StressConfig:
    model_config = preset(model)
    if lag is not None and lag["name"] == "random-drain":
        lag = dict(lag, seed=seed)
    return StressConfig(seed, ticks, kind, model, model_config, default_limits(model_config, **limits),
                        SchedulerConfig(inflight, draft_prob), lag, delay, None, runner)


def plan_runs(kind: str, seed: int, runner: str, *, quick: bool, ticks: int | None = None, max_runs: int | None = None,
              model: str = "micro", cuda_delay: Callable[[int], dict] | None = None) -> list[PlannedRun]:
    """The runs of one verify job.  ``cuda_delay(seed)`` gives a run's delay policy on cuda."""
    from stress.races import RACE_CHURN

    runs: list[PlannedRun] = []
    if kind == "sim":
        ticks = ticks or (60 if quick else 300)
        for i, (name, lag, inflight, drafts) in enumerate(_SIM_QUICK if quick else _SIM_FULL):
            cfg = _config(seed + i, ticks, kind, model, QUICK_LIMITS if quick else FULL_LIMITS, inflight, drafts, lag, None, runner)
            runs.append(PlannedRun(name, cfg, VERIFY_CHURN))
    elif kind == "cuda":
        ticks = ticks or (120 if quick else 500)
        for i, (name, inflight, drafts) in enumerate(_CUDA_QUICK if quick else _CUDA_FULL):
            delay = cuda_delay(seed + i) if cuda_delay is not None else None
            cfg = _config(seed + i, ticks, kind, model, CUDA_LIMITS, inflight, drafts, None, delay, runner)
            runs.append(PlannedRun(name, cfg, RACE_CHURN))
    elif kind == "cpu":
        ticks = ticks or (30 if quick else 200)
        for i, (name, inflight, drafts) in enumerate(_CPU[:2] if quick else _CPU):
            cfg = _config(seed + i, ticks, kind, model, QUICK_LIMITS if quick else FULL_LIMITS, inflight, drafts, None, None, runner)
            runs.append(PlannedRun(name, cfg, VERIFY_CHURN))
    else:
        raise StressSetupError(f"unknown device kind {kind!r}")
    return runs[:max_runs] if max_runs else runs


# --------------------------------------------------------------------------- one run


def execute_run(planned: PlannedRun, repro_dir: Path, on_tick: Callable[[int], None] = lambda tick: None) -> RunRecord:
    """Build the run's session, arm the detectors (count mode), run it, and write a repro on divergence."""
    from checks.lifetime import LifetimeChecker
    from checks.sync import arm_runner
    from stress.driver import DifferentialRun, summarize_ties
    from stress.machine import counted_waits
    from stress.stress_cmd import RandomDelay, build_session, repro_from_run

    config = planned.config
    session = build_session(config)
    sync_report = arm_runner(session.runner, "count")
    staging = getattr(session.runner, "staging", None)
    lifetime = LifetimeChecker("count").attach(staging) if staging is not None else None
    churn = Churn(config.limits, config.seed, planned.churn)
    before_enqueue = RandomDelay.from_dict(config.delay_policy).hook(session.device) if config.delay_policy else None

    def before_tick(tick: int, scheduler) -> None:
        churn(tick, scheduler)
        on_tick(tick)

    driver = DifferentialRun(session.runner, session.oracle, session.scheduler, before_tick=before_tick,
                             before_enqueue=before_enqueue)
    try:
        result = driver.run(config.steps)
    finally:
        if lifetime is not None:
            lifetime.detach(staging)
    waits = counted_waits(session.runner)
    record = RunRecord(
        name=planned.name, seed=config.seed, lag_policy=config.lag_policy, delay_policy=config.delay_policy,
        scheduler=config.scheduler.to_dict(), ticks=result.ticks, steps=result.steps, requests=result.requests,
        finished=result.finished, tokens_compared=result.tokens_compared, logprobs_compared=result.logprobs_compared,
        ties=len(result.ties), tie_lines=summarize_ties(result.ties, limit=10),
        first_divergence=result.first_divergence_line(), divergence_lines=[d.line() for d in result.divergences[:6]],
        host_syncs=max(0, sync_report.count - waits), counted_waits=waits,
        host_sync_sites=_sync_sites(sync_report) if sync_report.count > waits else [],
        lifetime_checked=lifetime is not None,
        lifetime_violations=lifetime.violations if lifetime is not None else 0,
        lifetime_errors=[str(e) for e in lifetime.errors[:10]] if lifetime is not None else [],
        elapsed_s=round(result.elapsed_s, 2),
    )
    if not result.ok:
        if result.runner_traceback:
            record.divergence_lines.append(result.runner_traceback.rstrip().splitlines()[-1])
        slug = "".join(c if c.isalnum() else "-" for c in planned.name)
        path = repro_from_run(config, churn.trace, result).save(repro_dir / f"seed{config.seed}-{slug}.json")
        record.repro = str(path)
    return record


def _sync_sites(report: Any) -> list[str]:
    from collections import Counter

    return [f"{n} x {what} at {where}" for (what, where), n in Counter(report.events).most_common(10)]


# --------------------------------------------------------------------------- statistics


def run_chisq(out_dir: Path, skip: bool = False, seed: int = 0, *, device: str | None = None,
              runner_sampler: Callable | str = "impl") -> dict:
    """The sampler statistics section, one entry per sampler it ran on: `stress.verify_chisq.run_statistics`."""
    from stress.verify_chisq import run_statistics

    return run_statistics(out_dir, skip, seed, device=device, runner_sampler=runner_sampler)


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "sim", "cpu"],
                        help="auto: cuda when a GPU is present, else sim")
    parser.add_argument("--quick", action="store_true", help="a short job (about two minutes on a 2-core CPU)")
    parser.add_argument("--seed", type=int, default=0, help="run i uses seed S + i")
    parser.add_argument("--out", default="out/verify", help="report folder (summary.json, summary.md, repros/)")
    parser.add_argument("--runner", default=DEFAULT_RUNNER_SPEC, help="runner factory 'package.module:factory'")
    parser.add_argument("--model", default="micro", choices=sorted(PRESETS))
    parser.add_argument("--no-progress", action="store_true")
    # Sizing knobs for tests and experiments, not part of the job's contract.
    parser.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--skip-chisq", action="store_true", help=argparse.SUPPRESS)


def _resolve_kind(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "sim"
    if device == "cuda" and not torch.cuda.is_available():
        raise StressSetupError("--device cuda asked for, but torch sees no CUDA device")
    return device


def _check_args(args: argparse.Namespace) -> None:
    if args.seed < 0:
        raise StressSetupError(f"--seed {args.seed} must be >= 0")
    for flag in ("steps", "runs"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise StressSetupError(f"--{flag} {value} must be >= 1")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    started = time.perf_counter()
    out = Path(args.out)
    try:
        _check_args(args)
        kind = _resolve_kind(args.device)
        from stress.runners import RunnerSpecError, resolve_runner_factory

        try:
            resolve_runner_factory(args.runner)
        except RunnerSpecError as e:
            raise StressSetupError(str(e)) from None
        notes: list[str] = []
        cuda_delay = None
        if kind == "cuda":
            cuda_delay, note = _calibrate_cuda(args)
            notes.append(note)
        plan = plan_runs(kind, args.seed, args.runner, quick=args.quick, ticks=args.steps, max_runs=args.runs,
                         model=args.model, cuda_delay=cuda_delay)
        records, chisq = _execute_plan(plan, out, args, console)
    except StressSetupError as e:
        print(f"runnercheck verify: {e}", file=sys.stderr)
        return 2
    if any(not r.lifetime_checked for r in records):
        notes.append("the runner has no staging pool (runner.staging): staging lifetimes were not checked")
    doc = build_summary(records, chisq, device=kind, seed=args.seed, runner=args.runner, model=args.model,
                        quick=args.quick, elapsed_s=time.perf_counter() - started, notes=notes)
    json_path, md_path = write_report(out, doc)
    _print_summary(doc, json_path, md_path)
    return 0 if doc["passed"] else 1


def _calibrate_cuda(args: argparse.Namespace) -> tuple[Callable[[int], dict], str]:
    from stress.races import DEFAULT_LAG_FACTOR, calibrate_cuda_delay, measure_host_tick_us

    warmup = plan_runs("cuda", args.seed, args.runner, quick=True, ticks=12, max_runs=1, model=args.model)[0].config
    tick_us = measure_host_tick_us(warmup)
    note = (f"cuda delays calibrated on a {tick_us:.0f} us host tick: mean delay {DEFAULT_LAG_FACTOR:g} ticks per step, "
            f"so the GPU trails the host by up to max_inflight_steps steps")
    return (lambda seed: calibrate_cuda_delay(seed, tick_us)), note


def _execute_plan(plan: list[PlannedRun], out: Path, args: argparse.Namespace, console) -> tuple[list[RunRecord], dict]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"), console=console, transient=True,
        disable=args.no_progress or not console.is_terminal,
    )
    records: list[RunRecord] = []
    with progress:
        total = progress.add_task("verify", total=sum(p.config.steps for p in plan), status="")
        done = 0
        for i, planned in enumerate(plan):
            progress.update(total, description=f"run {i + 1}/{len(plan)} {planned.name} (seed {planned.config.seed})")

            def on_tick(tick: int, base: int = done) -> None:
                progress.update(total, completed=base + tick)

            record = execute_run(planned, out / "repros", on_tick)
            done += planned.config.steps
            records.append(record)
            progress.update(total, completed=done, status=_status(records))
            progress.console.print(_run_line(record), highlight=False)
        progress.update(total, description="sampler statistics (chisq)")
        chisq = run_chisq(out, skip=args.skip_chisq, seed=args.seed)
    return records, chisq


def _status(records: list[RunRecord]) -> str:
    failed = sum(not r.passed for r in records)
    return f"{sum(r.steps for r in records)} steps, {failed} failing run(s)"


def _run_line(r: RunRecord) -> str:
    verdict = "ok  " if r.passed else "FAIL"
    extra = f"  {r.first_divergence}" if r.first_divergence else ""
    if r.host_syncs:
        extra += f"  {r.host_syncs} host sync(s)"
    if r.lifetime_violations:
        extra += f"  {r.lifetime_violations} lifetime violation(s)"
    return f"{verdict} {r.name} (seed {r.seed}): {r.steps} steps, {r.tokens_compared} tokens, {r.ties} ties, {r.elapsed_s:.1f} s{extra}"


def _print_summary(doc: dict, json_path: Path, md_path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from stress.report import chisq_line

    verdict = "[bold green]PASSED[/]" if doc["passed"] else "[bold red]FAILED[/]"
    table = Table(title=f"runnercheck verify: {verdict}", show_header=True)
    for col in ("run", "seed", "steps", "tokens", "ties", "syncs", "waits", "lifetime", "result"):
        table.add_column(col, justify="left" if col in ("run", "result") else "right", no_wrap=col == "run")
    for r in doc["runs"]:
        lifetime = str(r["lifetime_violations"]) if r["lifetime_checked"] else "n/a"
        result = "ok" if r["passed"] else "[red]FAIL[/]"
        table.add_row(r["name"], str(r["seed"]), str(r["steps"]), str(r["tokens_compared"]), str(r["ties"]),
                      str(r["host_syncs"]), str(r["counted_waits"]), lifetime, result)
    console = Console()
    console.print(table)
    console.print(f"device {doc['device']}, runner {doc['runner']}, {doc['elapsed_s']:.1f} s", highlight=False)
    console.print(f"divergences {doc['divergences']}, host syncs {doc['host_syncs']}, lifetime violations "
                  f"{doc['lifetime_violations']}, ties {doc['ties']}", highlight=False)
    console.print(f"sampler statistics: {chisq_line(doc['chisq'])}", highlight=False, markup=False)
    for r in doc["runs"]:
        if r["first_divergence"]:
            console.print(f"DIVERGENCE {r['name']}: {r['first_divergence']}", highlight=False, markup=False)
            console.print(f"  repro: {r['repro']}  (runnercheck replay {r['repro']})", highlight=False, markup=False)
        for site in r["host_sync_sites"][:3]:
            console.print(f"HOST SYNC {r['name']}: {site}", highlight=False, markup=False)
        for err in r["lifetime_errors"][:3]:
            console.print(f"LIFETIME {r['name']}: {err}", highlight=False, markup=False)
    for note in doc["notes"]:
        console.print(f"note: {note}", highlight=False, markup=False)
    console.print(f"report: {json_path}  {md_path}", highlight=False, markup=False)


__all__ = ["PlannedRun", "plan_runs", "execute_run", "run_chisq", "add_arguments", "run", "VERIFY_CHURN"]
