"""`runnercheck stress`: long random churn on one seed, runner vs oracle; a repro file on divergence.

    runnercheck stress --device {auto,sim,cuda,cpu} --seed S --steps N [--mutant NAME]
                       [--lag-policy P] [--delay-us N|auto [--delay-target T...]]
                       [--runner pkg.mod:factory] [--model micro|tiny] [--eager] --out DIR

A front-end over `runnercheck.stress.run.harness.checked_run`: the `RunConfig` comes from the flags (on sim a
lag policy, by default random-drain seeded by S), the operations from the seeded churn, and the
run executes in a child process (a crash is a finding too).  The report folder DIR is written
atomically: ``summary.json``/``summary.md`` (`runnercheck.stress.report.summary`) and, when the run found something,
``repro.json`` (`runnercheck.stress.run.repro`; ``runnercheck replay DIR/repro.json`` re-runs it).  Exit 0 when
runner and oracle agree and the detectors stayed silent, 1 on a finding, 2 on bad arguments,
130 when interrupted (Ctrl-C, SIGTERM): the child is stopped and the report, marked incomplete,
says at which tick (an unfinished run's findings are not reported).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from runnercheck.impl.lag_policies import DELAY_TARGETS
from runnercheck.impl.model.weights import PRESETS, WeightsError, preset
from runnercheck.checks.child import DEFAULT_RUN_TIMEOUT_S
from runnercheck.stress.cli.options import RUNNER_HELP, add_runner_option, add_timeout_option, float_type, int_type, timeout_seconds
from runnercheck.stress.run.config import RandomDelay, RunConfig, RunSetupError, TargetedDelay, default_limits
from runnercheck.stress.run.runners import DEFAULT_RUNNER_SPEC
from runnercheck.stress.sim.scheduler import SchedulerConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(out="out/stress")
    parser.add_argument("--steps", type=int_type(1), default=200, help="scheduler ticks (at most one step each)")
    parser.add_argument("--mutant", default=None,
                        help="apply a deliberate bug from the catalogue (runnercheck mutants --list; default: none)")
    parser.add_argument("--lag-policy", default=None, help="sim only: run-immediately, lag-K-steps, random-drain (default, seeded by --seed; with --mutant, the lag of the mutant's workload), hold-at-target or hold-at-<target> (targeted lag: see --delay-target)")
    parser.add_argument("--delay-us", type=_delay_arg, default=0.0,
                        help="cuda only: random injected device delays up to this many µs, or 'auto': "
                             "calibrated on the measured host tick so the GPU trails the host by about two ticks")
    parser.add_argument("--delay-target", nargs="+", choices=sorted(DELAY_TARGETS), default=None, metavar="TARGET",
                        help="cuda only, with --delay-us: delay only right before the last device reader of these "
                             f"resources ({', '.join(sorted(DELAY_TARGETS))}) instead of before whole steps "
                             "(the default; on sim: --lag-policy hold-at-<target>)")
    add_runner_option(parser, DEFAULT_RUNNER_SPEC, RUNNER_HELP)
    parser.add_argument("--model", default="micro", choices=sorted(PRESETS), help="model preset of the runner and the oracle")
    parser.add_argument("--max-num-reqs", type=int_type(1), default=4, help="requests the runner holds at once (its rows)")
    parser.add_argument("--block-size", type=int_type(1), default=8, help="tokens per KV-cache block")
    parser.add_argument("--num-kv-blocks", type=int_type(1), default=16,
                        help="KV-cache blocks (few blocks force preemptions)")
    parser.add_argument("--max-batched-tokens", type=int_type(1), default=32, help="token budget of one step")
    parser.add_argument("--max-inflight", type=int_type(0), default=1, help="steps scheduled ahead of their outputs")
    parser.add_argument("--draft-prob", type=float_type(0.0, 1.0), default=0.0, help="probability a decode carries draft tokens")
    parser.add_argument("--proposer", choices=("none", "ngram", "draft"), default="none",
                        help="ngram: the runner proposes drafts on the device (n-gram prompt lookup); draft: a draft model "
                             "does, verified by rejection sampling; decodes ask for them by count")
    parser.add_argument("--num-spec-tokens", type=int_type(1), default=3, help="with --proposer: drafts per decode at most")
    parser.add_argument("--draft-model", default=None, choices=sorted(PRESETS),
                        help="with --proposer draft: the draft preset (default: MODEL-draft; MODEL itself drafts with the target's weights)")
    parser.add_argument("--in-process", action="store_true", help="run in this process (no crash isolation; for debugging)")
    add_timeout_option(parser, DEFAULT_RUN_TIMEOUT_S, "the run (it runs in its own process)")


def _delay_arg(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of µs or 'auto', got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _calibrated_delay(config: RunConfig, targets: list[str] | None = None) -> dict:
    """A delay policy from the host's measured tick (a short undelayed, unmutated warm-up run)."""
    from runnercheck.stress.sim.races import calibrate_cuda_delay, measure_host_tick_us

    return calibrate_cuda_delay(config.seed, measure_host_tick_us(replace(config, mutant=None)), targets=targets)


def _default_lag_policy(mutant: str | None) -> str:
    """random-drain, or for a mutant the lag of the workload it was designed to show under."""
    if mutant is None:
        return "random-drain"
    from runnercheck.stress.mutants import catalogue as mutants

    try:
        return mutants.WORKLOADS[mutants.get(mutant).workload].lag_policy
    except LookupError:
        return "random-drain"  # an unknown mutant is reported when it is applied


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run configuration the flags describe (``args.device`` is already resolved); `RunSetupError`."""
    from runnercheck.impl.lag_policies import LagPolicyError, make_lag_policy

    kind = args.device
    try:
        model_config = preset(args.model)
    except WeightsError as e:
        raise RunSetupError(str(e)) from None
    lag = None
    if kind == "sim":
        try:
            lag = make_lag_policy(args.lag_policy or _default_lag_policy(args.mutant), args.seed).describe()
            if args.lag_policy is None and args.mutant is None:  # the default mix reads some outputs before their events
                from runnercheck.stress.sim.lag_mix import DEFAULT_P_HOLD

                lag["p_hold"] = DEFAULT_P_HOLD
        except LagPolicyError as e:
            raise RunSetupError(str(e)) from None
    elif args.lag_policy is not None:
        raise RunSetupError(f"--lag-policy applies to the sim device, not {kind!r}")
    if args.delay_us == "auto" and kind != "cuda":
        raise RunSetupError(f"--delay-us auto calibrates delays on a real GPU (cuda), not {kind!r}")
    targets = args.delay_target
    if targets is not None and (kind != "cuda" or args.delay_us == 0.0):
        raise RunSetupError("--delay-target aims injected GPU delays: it needs --device cuda and --delay-us "
                            f"(device {kind!r}, --delay-us {args.delay_us}); on sim use --lag-policy hold-at-<target>")
    delay = None
    if args.delay_us not in ("auto", 0.0):
        delay = (TargetedDelay(args.seed, args.delay_us, targets=targets) if targets else RandomDelay(args.seed, args.delay_us)).describe()
    limits = default_limits(model_config, max_num_reqs=args.max_num_reqs, block_size=args.block_size,
                            num_kv_blocks=args.num_kv_blocks, max_num_batched_tokens=args.max_batched_tokens)
    config = RunConfig(args.seed, args.steps, kind, args.model, model_config, limits,
                       _scheduler_config(args), lag, delay, args.mutant, args.runner,
                       cuda_graphs=not args.eager, csan=getattr(args, "csan", False))
    if args.mutant is not None:
        from runnercheck.stress.mutants import catalogue as mutants

        try:
            mutants.get(args.mutant)
        except LookupError as e:
            raise RunSetupError(f"--mutant {args.mutant!r}: {e}") from None
    return replace(config, delay_policy=_calibrated_delay(config, targets)) if args.delay_us == "auto" else config


def _scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    """The scheduler knobs of the arguments; ``--proposer draft`` turns explicit drafts and prefix caching off."""
    if args.proposer == "draft":
        if args.draft_prob:
            raise RunSetupError("--proposer draft takes no --draft-prob (a draft-model runner refuses explicit drafts)")
        draft = args.draft_model or f"{args.model}-draft"
        if draft not in PRESETS:
            raise RunSetupError(f"--proposer draft: no preset {draft!r}; pass --draft-model (one of {sorted(PRESETS)})")
        if preset(draft).vocab_size != preset(args.model).vocab_size:
            raise RunSetupError(f"--draft-model {draft!r} has vocabulary {preset(draft).vocab_size}, "
                                f"--model {args.model!r} {preset(args.model).vocab_size}")
        return SchedulerConfig(args.max_inflight, 0.0, prefix_caching=False, ngram_spec_tokens=args.num_spec_tokens,
                               draft_model=draft)
    return SchedulerConfig(args.max_inflight, args.draft_prob,
                           ngram_spec_tokens=args.num_spec_tokens if args.proposer == "ngram" else 0)


def run(args: argparse.Namespace) -> int:
    from runnercheck.checks.interrupts import STATUS_COMPLETE, STATUS_INCOMPLETE, signal_name
    from runnercheck.checks.provenance import device_name, provenance
    from runnercheck.checks.report_folder import run_exit_status, write_command_report
    from runnercheck.stress.sim.churn import ChurnConfig
    from runnercheck.stress.run.harness import ChurnOps, checked_run, load_runner_factory
    from runnercheck.stress.run.isolation import isolated_run
    from runnercheck.stress.report.progress import Progress
    from runnercheck.stress.report.render import print_divergence, print_findings
    from runnercheck.stress.report.summary import RunRecord, build_summary, write_report

    started = time.perf_counter()
    name = f"stress {args.device} seed {args.seed}"
    findings = None
    interrupt: KeyboardInterrupt | None = None
    reached = [0]  # the last tick the run reported
    try:
        config = config_from_args(args)
        load_runner_factory(config.runner)
        with Progress(name, config.steps, enabled=not args.no_progress) as progress:
            progress.start(name)

            def ticked(tick: int) -> None:
                reached[0] = tick
                progress.advance(tick)

            run = checked_run if args.in_process else isolated_run
            churn = ChurnOps(ChurnConfig(repetitive_prompt_prob=0.35)) if config.scheduler.ngram_spec_tokens else ChurnOps()
            try:
                isolation = {} if args.in_process else {"timeout_s": timeout_seconds(args.timeout)}
                findings = run(config, churn, name=name, lifetime_mode="error", on_tick=ticked, **isolation)
            except KeyboardInterrupt as e:  # the child is already stopped (isolation); keep a report
                interrupt = e
            if findings is not None:
                progress.end(f"{'ok  ' if findings.passed else 'FAIL'} {name}: {findings.result.steps} steps, "
                             f"{findings.result.tokens_compared} tokens, {findings.elapsed_s:.1f} s")
    except RunSetupError as e:
        print(f"runnercheck stress: {e}", file=sys.stderr)
        return 2
    out = args.out
    notes = []
    if interrupt is not None:
        stopped = f"interrupted ({signal_name(interrupt)}) at tick {reached[0]} of {config.steps}"
        notes.append(f"{stopped}: the run did not finish, so nothing about it is reported")
    def fill(tmp: Path) -> str | None:
        """The report's files; the repro's path when the run diverged."""
        records, repro = [], None
        if findings is not None:
            if findings.diverged:
                findings.repro().save(tmp / "repro.json")
                repro = f"{out}/repro.json"
            records.append(RunRecord.from_findings(findings, repro))
        doc = build_summary(records, {"status": "skipped", "passed": None, "note": "stress runs no statistics"},
                            device=config.device, seed=config.seed, runner=config.runner,
                            model=config.model_preset or "custom", quick=False,
                            elapsed_s=time.perf_counter() - started, command="stress", notes=notes,
                            provenance=provenance(device_name(config.device)),
                            status=STATUS_COMPLETE if interrupt is None else STATUS_INCOMPLETE)
        write_report(tmp, doc)
        return repro

    written = write_command_report("stress", out, fill, force=args.force)
    if written.exit_status is not None:
        return written.exit_status
    repro_path = written.value
    files = [f"{out}/summary.json", f"{out}/summary.md"] + ([repro_path] if repro_path else [])
    if findings is None:
        print(f"report (incomplete): {'  '.join(files)}")
        return run_exit_status("stress", out, False, stopped)
    if findings.passed:
        print_findings(findings, "runnercheck stress: runner and oracle agree")
    else:
        print_findings(findings, "runnercheck stress: FINDINGS")
        print_divergence(findings)
    if repro_path:
        print(f"repro written to {repro_path}  (runnercheck replay {repro_path})")
    print(f"report: {'  '.join(files)}")
    return run_exit_status("stress", out, findings.passed)


__all__ = ["add_arguments", "config_from_args", "run"]
