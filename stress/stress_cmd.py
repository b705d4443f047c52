"""`runnercheck stress`: long random churn on one seed, runner vs oracle; a repro file on divergence.

    runnercheck stress --device {auto,sim,cuda,cpu} --seed S --steps N [--mutant NAME]
                       [--lag-policy P] [--runner pkg.mod:factory] [--model micro|tiny] --out DIR

Builds, from the seed S: random weights for the preset, a `Device` (on sim with a lag policy,
by default random-drain seeded by S), the runner through its factory (`stress.runners`), the
oracle (`reference.runner.ReferenceRunner`), a `SchedulerSim` and the churn, and runs
`stress.driver.DifferentialRun` for N scheduler ticks.  Exit 0 with a one-screen summary when
runner and oracle agree; exit 1 on a divergence (the first divergent step is printed and
DIR/repro.json written, see `stress.repro`); exit 2 on bad arguments.

`StressConfig` and `run_config` are shared with `runnercheck replay`.
"""
from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from impl.interface import RunnerLimits
from impl.model.weights import PRESETS, ModelConfig, WeightsError, preset, random_weights
from stress.driver import DifferentialRun, RunResult, StepReport, summarize_ties
from stress.runners import DEFAULT_RUNNER_SPEC, RunnerSpecError, resolve_runner_factory
from stress.scheduler import SchedulerConfig, SchedulerSim


class StressSetupError(RuntimeError):
    """A configuration that cannot be built (unknown mutant, bad lag policy, runner spec...)."""


@dataclass(frozen=True)
class StressConfig:
    """Everything that determines a stress run, apart from the operation source."""

    seed: int
    steps: int
    device: str  # resolved kind: cuda, cpu or sim
    model_preset: str | None
    model_config: ModelConfig
    limits: RunnerLimits
    scheduler: SchedulerConfig
    lag_policy: dict | None
    delay_policy: dict | None
    mutant: str | None
    runner: str


def default_limits(config: ModelConfig, *, max_num_reqs: int = 4, block_size: int = 8, num_kv_blocks: int = 16,
                   max_num_batched_tokens: int = 32) -> RunnerLimits:
    """Small limits that make the scheduler chunk prefills and run out of KV blocks under churn."""
    return RunnerLimits(
        vocab_size=config.vocab_size,
        max_num_reqs=max_num_reqs,
        max_model_len=config.max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        num_kv_blocks=num_kv_blocks,
        block_size=block_size,
    )


class RandomDelay:
    """Injected device delays (cuda): before a step, with probability ``p``, up to ``max_us`` µs."""

    def __init__(self, seed: int, max_us: float, p: float = 0.5):
        self.seed, self.max_us, self.p = seed, max_us, p
        self.rng = random.Random(seed)

    @classmethod
    def from_dict(cls, d: dict) -> "RandomDelay":
        if d.get("name") != "random-delay":
            raise StressSetupError(f"unknown delay policy {d!r}")
        return cls(int(d["seed"]), float(d["max_us"]), float(d.get("p", 0.5)))

    def describe(self) -> dict:
        return {"name": "random-delay", "seed": self.seed, "max_us": self.max_us, "p": self.p}

    def hook(self, device) -> Callable:
        def before_enqueue(_sched) -> None:
            if self.rng.random() < self.p:
                device.inject_delay(self.rng.uniform(0.0, self.max_us))

        return before_enqueue


@dataclass
class Session:
    device: object
    runner: object
    oracle: object
    scheduler: SchedulerSim


def build_session(config: StressConfig) -> Session:
    """Weights, device, runner (+ mutant), oracle and scheduler for ``config``."""
    from impl.device import Device, DeviceError

    try:
        device = Device(config.device, seed=config.seed, lag_policy=config.lag_policy or "random-drain")
    except DeviceError as e:
        raise StressSetupError(str(e)) from None
    weights = random_weights(config.model_config, seed=config.seed)
    try:
        factory = resolve_runner_factory(config.runner)
    except RunnerSpecError as e:
        raise StressSetupError(str(e)) from None
    try:
        runner = factory(weights, config.limits, device, config.seed)
    except Exception as e:  # a runner that cannot be built for this config is a setup problem
        raise StressSetupError(f"runner factory {config.runner!r} failed: {type(e).__name__}: {e}") from None
    if config.mutant is not None:
        apply_mutant(config.mutant, runner, device)
    from reference.runner import ReferenceRunner, ReferenceRunnerError

    try:
        oracle = ReferenceRunner(weights, config.limits, base_seed=config.seed)
    except ReferenceRunnerError as e:
        raise StressSetupError(f"oracle: {e}") from None
    scheduler = SchedulerSim(
        config.limits,
        seed=config.seed,
        max_inflight_steps=config.scheduler.max_inflight_steps,
        draft_prob=config.scheduler.draft_prob,
        prefix_caching=config.scheduler.prefix_caching,
    )
    return Session(device, runner, oracle, scheduler)


def arm_lifetime_checks(runner: object) -> None:
    """Staging-lifetime assertions in error mode on the runner's staging pool, when it has one.

    A violation raises inside ``execute_model``; the driver records it as the run's first
    divergence (kind ``runner-error``), so it lands in the repro and replays like any other.
    """
    pool = getattr(runner, "staging", None)
    if pool is None or not hasattr(pool, "observers"):
        return
    from checks.lifetime import LifetimeChecker

    LifetimeChecker("error").attach(pool)


def apply_mutant(name: str, runner: object, device: object) -> None:
    try:
        from stress import mutants
    except ImportError as e:
        raise StressSetupError(f"--mutant {name!r}: the mutant catalogue (stress.mutants) is not available: {e}") from None
    try:
        mutants.apply(name, runner=runner, device=device)
    except (KeyError, LookupError, ValueError) as e:
        raise StressSetupError(f"--mutant {name!r}: {e}") from None


def run_config(config: StressConfig, before_tick: Callable, *, show_progress: bool = True,
               on_step: Callable[[StepReport], None] | None = None) -> tuple[Session, RunResult]:
    """Build the session and run it; ``before_tick`` is the churn or a trace replay."""
    session = build_session(config)
    arm_lifetime_checks(session.runner)  # verify and mutants attach their own checkers, in count mode
    before_enqueue = None
    if config.delay_policy is not None:
        before_enqueue = RandomDelay.from_dict(config.delay_policy).hook(session.device)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"), console=console, transient=True,
        disable=not (show_progress and console.is_terminal),
    )
    counts = {"ties": 0, "tokens": 0}

    def count(report: StepReport) -> None:
        counts["ties"] += len(report.comparison.ties)
        counts["tokens"] += report.comparison.tokens_compared
        if on_step is not None:
            on_step(report)

    with progress:
        task = progress.add_task(f"stress {config.device} seed {config.seed}", total=config.steps, status="")

        def ticking(tick: int, scheduler: SchedulerSim) -> None:
            before_tick(tick, scheduler)
            progress.update(task, completed=tick, status=f"{counts['tokens']} tokens, {counts['ties']} ties")

        driver = DifferentialRun(session.runner, session.oracle, session.scheduler, on_step=count,
                                 before_tick=ticking, before_enqueue=before_enqueue)
        result = driver.run(config.steps)
        progress.update(task, completed=config.steps)
    return session, result


def describe_policy(policy: dict) -> str:
    return " ".join([policy["name"]] + [f"{k}={v}" for k, v in policy.items() if k != "name"])


def print_summary(config: StressConfig, result: RunResult, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    stats = result.scheduler_stats
    table = Table(title=title, show_header=False)
    rows = [
        ("device", config.device + (f" (lag {describe_policy(config.lag_policy)})" if config.lag_policy else "")
         + (f" (delays {describe_policy(config.delay_policy)})" if config.delay_policy else "")),
        ("runner", config.runner + (f"  mutant={config.mutant}" if config.mutant else "")),
        ("model", f"{config.model_preset or 'custom'} (vocab {config.model_config.vocab_size}, {config.model_config.num_layers} layers)"),
        ("seed, ticks, steps compared", f"{config.seed}, {result.ticks}, {result.steps}"),
        ("requests added / finished", f"{result.requests} / {result.finished}"),
        ("tokens / logprobs compared", f"{result.tokens_compared} / {result.logprobs_compared}"),
        ("ties adopted", str(len(result.ties))),
    ]
    if stats is not None:
        rows += [
            ("preempted blocks/forced, resumed", f"{stats.preempted_for_blocks} / {stats.preempted_forced}, {stats.resumed}"),
            ("aborted, late dropped, drafts", f"{stats.aborted}, {stats.dropped_tokens}, {stats.draft_steps}"),
            ("prefix cache hit rate", f"{stats.hit_rate:.0%} of {stats.prefill_tokens} prefill tokens "
                                      f"({stats.prefix_hits} hits, {stats.evictions} evictions)"),
        ]
    rows.append(("elapsed", f"{result.elapsed_s:.1f} s"))
    for k, v in rows:
        table.add_row(k, v)
    console = Console()
    console.print(table)
    for line in summarize_ties(result.ties):
        console.print(f"  {line}", markup=False, highlight=False)


def print_divergence(result: RunResult) -> None:
    print(f"DIVERGENCE {result.first_divergence_line()}")
    for d in result.divergences[1:6]:
        print(f"  also: {d.line()}")
    if result.runner_traceback:
        print(result.runner_traceback.rstrip(), file=sys.stderr)


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", choices=["auto", "sim", "cuda", "cpu"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=200, help="scheduler ticks (at most one step each)")
    parser.add_argument("--mutant", default=None, help="apply a deliberate bug from stress.mutants")
    parser.add_argument("--lag-policy", default=None, help="sim only: run-immediately, lag-K-steps, random-drain (default, seeded by --seed; with --mutant, the lag of the mutant's workload)")
    parser.add_argument("--delay-us", type=_delay_arg, default=0.0,
                        help="cuda only: random injected device delays up to this many µs, or 'auto': "
                             "calibrated on the measured host tick so the GPU trails the host by about two ticks")
    parser.add_argument("--runner", default=DEFAULT_RUNNER_SPEC, help="runner factory 'package.module:factory'")
    parser.add_argument("--model", default="micro", choices=sorted(PRESETS))
    parser.add_argument("--max-num-reqs", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--num-kv-blocks", type=int, default=16)
    parser.add_argument("--max-batched-tokens", type=int, default=32)
    parser.add_argument("--max-inflight", type=int, default=1, help="steps scheduled ahead of their outputs")
    parser.add_argument("--draft-prob", type=float, default=0.0, help="probability a decode carries draft tokens")
    parser.add_argument("--out", default="out/stress", help="folder for repro.json")
    parser.add_argument("--no-progress", action="store_true")


def _delay_arg(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of µs or 'auto', got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"--delay-us must be >= 0, got {text}")
    return value


def _calibrated_delay(config: StressConfig) -> dict:
    """A delay policy from the host's measured tick (a short undelayed, unmutated warm-up run)."""
    from stress.races import calibrate_cuda_delay, measure_host_tick_us

    return calibrate_cuda_delay(config.seed, measure_host_tick_us(replace(config, mutant=None)))


def _default_lag_policy(mutant: str | None) -> str:
    """random-drain, or for a mutant the lag of the workload it was designed to show under."""
    if mutant is None:
        return "random-drain"
    try:
        from stress import mutants

        return mutants.WORKLOADS[mutants.get(mutant).workload].lag_policy
    except (ImportError, LookupError):
        return "random-drain"  # an unknown mutant is reported when it is applied


def config_from_args(args: argparse.Namespace) -> StressConfig:
    from impl.device import Device, DeviceError, make_lag_policy

    if args.steps < 0:
        raise StressSetupError(f"--steps {args.steps} must be >= 0")
    for flag in ("max_num_reqs", "block_size", "num_kv_blocks", "max_batched_tokens"):
        if getattr(args, flag) < 1:
            raise StressSetupError(f"--{flag.replace('_', '-')} {getattr(args, flag)} must be >= 1")
    try:
        kind = Device(args.device, seed=args.seed).kind if args.device == "auto" else args.device
        model_config = preset(args.model)
    except (DeviceError, WeightsError) as e:
        raise StressSetupError(str(e)) from None
    lag = None
    if kind == "sim":
        try:
            lag = make_lag_policy(args.lag_policy or _default_lag_policy(args.mutant), args.seed).describe()
        except DeviceError as e:
            raise StressSetupError(str(e)) from None
    elif args.lag_policy is not None:
        raise StressSetupError(f"--lag-policy applies to the sim device, not {kind!r}")
    if args.delay_us == "auto" and kind != "cuda":
        raise StressSetupError(f"--delay-us auto calibrates delays on a real GPU (cuda), not {kind!r}")
    delay = RandomDelay(args.seed, args.delay_us).describe() if args.delay_us not in ("auto", 0.0) else None
    try:
        limits = default_limits(model_config, max_num_reqs=args.max_num_reqs, block_size=args.block_size,
                                num_kv_blocks=args.num_kv_blocks, max_num_batched_tokens=args.max_batched_tokens)
        sched = SchedulerConfig(args.max_inflight, args.draft_prob)
    except Exception as e:
        raise StressSetupError(str(e)) from None
    config = StressConfig(args.seed, args.steps, kind, args.model, model_config, limits, sched, lag, delay,
                          args.mutant, args.runner)
    return replace(config, delay_policy=_calibrated_delay(config)) if args.delay_us == "auto" else config


def repro_from_run(config: StressConfig, trace: list, result: RunResult):
    from dataclasses import asdict

    from stress.repro import Repro

    return Repro(
        seed=config.seed,
        model={"preset": config.model_preset, "config": config.model_config.to_dict()},
        limits=asdict(config.limits),
        scheduler=config.scheduler.to_dict(),
        device=config.device,
        lag_policy=config.lag_policy,
        delay_policy=config.delay_policy,
        mutant=config.mutant,
        runner=config.runner,
        steps=result.ticks,
        trace=[list(ops) for ops in trace[: result.ticks]],
        first_divergence=result.first_divergence_line(),
    )


def run(args: argparse.Namespace) -> int:
    from stress.churn import Churn

    try:
        config = config_from_args(args)
        churn = Churn(config.limits, seed=config.seed)
        session, result = run_config(config, churn, show_progress=not args.no_progress)
    except StressSetupError as e:
        print(f"runnercheck stress: {e}", file=sys.stderr)
        return 2
    if result.ok:
        print_summary(config, result, "runnercheck stress: runner and oracle agree")
        return 0
    print_divergence(result)
    path = repro_from_run(config, churn.trace, result).save(Path(args.out) / "repro.json")
    print(f"repro written to {path}  (runnercheck replay {path})")
    return 1


__all__ = ["StressConfig", "StressSetupError", "build_session", "run_config", "default_limits", "config_from_args",
           "repro_from_run", "print_summary", "print_divergence", "RandomDelay", "add_arguments", "run"]
