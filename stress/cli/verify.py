"""`runnercheck verify`: the main job -- runner vs oracle under stress with every detector armed,
then the sampler statistics, then a report folder.

    runnercheck verify [--device auto|cuda|sim|cpu] [--quick] [--seed S] [--out DIR] [--runner pkg.mod:factory]
                       [--eager] [--csan] [--junit FILE]

1. Differential stress runs, each a `runnercheck.stress.run.harness.checked_run` in its own child process (a
   crash is a finding with a repro), side by side on the usable cores: the host-sync detector and
   the staging-lifetime checker in count mode, random churn (`runnercheck.stress.sim.churn`) whose requests cycle
   through every pair of sampling knobs.  On ``sim`` the runs cover the lag policies
   (run-immediately, lag-k-steps, random-drain, and in the full plan hold-at-target) with one or
   more steps in flight and draft tokens; on ``cuda`` the GPU is made to lag the host by injected
   delays under heavy churn (`runnercheck.stress.sim.races`), before whole steps or right before the last device
   reader of a staging slot, an output slot or the input prep (targeted runs; each target must be
   reached: a coverage feature).  Both plans end with runs whose runner holds the n-gram proposer
   (`runnercheck.impl.ngram_proposer`; the scheduler asks for device drafts by count, some prompts repeat a
   pattern so drafts get accepted); every plan adds runs whose runner holds
   the draft-model proposer (the quick sim plan one short run) (`runnercheck.impl.draft_proposer`, rejection-sampled); the summary reports their
   acceptance rates.  Run ``i`` uses
   seed ``S + i``.
2. The coverage table (`runnercheck.stress.run.coverage`): a count per feature over all runs; a feature at zero
   fails the job.
3. The sampler statistics (`run_chisq`, `runnercheck.stress.cli.verify_chisq`), each named by the sampler it ran
   on: on cuda the quick chi-square matrix on the runner's sampler; on CPU the quick matrix on the
   PyTorch baseline plus a few fixed cases on the runner's sampler, interpreted (``DIR/chisq``,
   ``DIR/chisq-runner``).
4. ``DIR/summary.json`` and ``DIR/summary.md`` (`runnercheck.stress.report.summary`), and ``DIR/repros/*.json`` for
   every divergent run (`runnercheck.stress.run.repro`; `runnercheck replay FILE` re-runs one), written
   atomically with ``DIR/manifest.json`` (`runnercheck.checks.report_folder`); ``--junit FILE``: JUnit XML,
   one case per run.

Interrupted (Ctrl-C, SIGTERM), the job stops its runs' child processes and still writes the report
folder, marked ``incomplete``: the runs that finished (and the statistics if they finished); exit 130.

A run passes when runner and oracle agree on every compared step and no detector of the registry
(`runnercheck.checks.detectors.registry`) found anything: every host read/wait inside
``execute_model`` is one of the runner's own counted back-pressure waits
(`runnercheck.checks.detectors.sync.counted_waits`), the slot-lifetime checks saw no violation, KV
provenance is clean, and (``--csan``, cuda) CUDA's stream sanitizer reported no race
(`runnercheck.checks.detectors.csan`).  Exit 0 only when
every run, the coverage and the statistics pass; 1 otherwise; 2 for arguments or a runner that
cannot be built.

``--quick`` on sim: measured about 2 minutes on an idle 2-core CPU with Triton interpreted (see
the README for the numbers).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from runnercheck.checks.loader import accepts_keyword
from runnercheck.impl.lag_policies import DELAY_TARGETS
from runnercheck.impl.model.weights import PRESETS, preset
from runnercheck.stress.sim.churn import ChurnConfig
from runnercheck.checks.child import DEFAULT_RUN_TIMEOUT_S
from runnercheck.stress.cli.options import RUNNER_HELP, add_runner_option, add_shard_option, add_timeout_option, int_type, timeout_seconds
from runnercheck.stress.report.summary import RunRecord, build_summary, unchecked_notes, write_report
from runnercheck.stress.run.config import RunConfig, RunSetupError, default_limits
from runnercheck.stress.run.runners import DEFAULT_RUNNER_SPEC
from runnercheck.stress.sim.scheduler import SchedulerConfig

# Half the requests ask for prompt logprobs, half of those with a prompt of one or two token budgets
# (`ChurnConfig.full_chunk_prob`): some step's prompt-logprob rows then fill the budget (a coverage feature).
# Half the requests with top-k on get k in 1..3 (`ChurnConfig.tie_top_k_prob`): an exact-tie row of the logits
# faults then ties at the k-th value.
VERIFY_CHURN = ChurnConfig(max_unfinished=8, max_prompt_len=16, max_new_tokens=10, abort_prob=0.06, preempt_prob=0.1,
                           param_plan=True, prompt_logprobs_prob=0.5, full_chunk_prob=0.5, tie_top_k_prob=0.5)
# The whole-row logits faults of every verify run (`runnercheck.stress.sim.faults`); residues chosen so the
# positions 16..30 (where verify traffic samples) keep single-entry NaN (17, 24) and +Inf (19, 26) rows too.
ROW_FAULTS = {"row_modulus": 11, "all_nan_residue": 1, "neg_residue": 3, "inf_mix_residue": 7, "tie_residue": 10}
QUICK_LIMITS = {"max_num_reqs": 3, "block_size": 4, "num_kv_blocks": 12, "max_num_batched_tokens": 16}
# A token budget of 8 splits 16-token prompts into three chunks when requests share a step.
QUICK_CHUNKING_LIMITS = dict(QUICK_LIMITS, max_num_batched_tokens=8)
FULL_LIMITS = {"max_num_reqs": 4, "block_size": 8, "num_kv_blocks": 16, "max_num_batched_tokens": 32}
CUDA_LIMITS = {"max_num_reqs": 4, "block_size": 8, "num_kv_blocks": 24, "max_num_batched_tokens": 48}


@dataclass(frozen=True)
class PlannedRun:
    """One stress run of the plan: its name, the full `RunConfig` and the churn that feeds it."""

    name: str
    config: RunConfig
    churn: ChurnConfig


# (name, lag policy, max_inflight_steps, draft_prob); the seed of run i is S + i.
_SIM_QUICK = [
    ("random-drain", {"name": "random-drain", "p_stall": 0.5}, 1, 0.0),
    ("lag-1 drafts", {"name": "lag-k-steps", "k": 1}, 1, 0.5),
    ("lag-3 two-ahead", {"name": "lag-k-steps", "k": 3}, 2, 0.0),
]
_QUICK_RUN_LIMITS = {"random-drain": QUICK_CHUNKING_LIMITS, "lag-3 two-ahead": QUICK_CHUNKING_LIMITS}
_SIM_FULL = [
    ("run-immediately", {"name": "run-immediately"}, 1, 0.0),
    ("lag-1 drafts", {"name": "lag-k-steps", "k": 1}, 1, 0.3),
    ("lag-2 two-ahead", {"name": "lag-k-steps", "k": 2}, 2, 0.0),
    ("lag-3 three-ahead drafts", {"name": "lag-k-steps", "k": 3}, 3, 0.2),
    ("random-drain drafts", {"name": "random-drain", "p_stall": 0.5}, 1, 0.3),
    ("random-drain stalling two-ahead", {"name": "random-drain", "p_stall": 0.8}, 2, 0.0),
    # Targeted lag (`runnercheck.impl.lag_policies.HoldAtTarget`): each resource's last reader held; every target must be reached.
    ("hold-at-target two-ahead drafts", {"name": "hold-at-target", "p": 0.5, "max_hold": 2}, 2, 0.2),
]
# A token budget of 8 splits prefills into first, middle and final chunks (the coverage gate asks for each).
_FULL_RUN_LIMITS = {name: dict(FULL_LIMITS, max_num_batched_tokens=8)
                    for name in ("run-immediately", "random-drain stalling two-ahead")}
# (name, max_inflight_steps, draft_prob, delay targets); delays are calibrated per machine (stress.races):
# before whole steps (targets None), or right before the last device reader of each targeted resource.
_CUDA_QUICK = [("delays two-ahead", 2, 0.0, None), ("delays three-ahead drafts", 3, 0.2, None),
               ("targeted delays two-ahead", 2, 0.0, tuple(DELAY_TARGETS))]
_CUDA_FULL = _CUDA_QUICK + [("delays one-ahead drafts", 1, 0.3, None), ("delays three-ahead", 3, 0.0, None)] + [
    (f"targeted delays at {target} three-ahead", 3, 0.1, (target,)) for target in DELAY_TARGETS]
# Runs with the runner's n-gram proposer on (`runnercheck.stress.sim.spec_scheduler`): every decode asks for up to
# NGRAM_SPEC_TOKENS device drafts; a third of the prompts repeat a short pattern, so drafts match.
# (name, lag policy on sim, max_inflight_steps); on cuda the lag is the calibrated delays.
NGRAM_SPEC_TOKENS = 3
NGRAM_CHURN = replace(VERIFY_CHURN, repetitive_prompt_prob=0.35)
_SIM_NGRAM = [("ngram lag-1 two-ahead", {"name": "lag-k-steps", "k": 1}, 2)]
_SIM_NGRAM_FULL = _SIM_NGRAM + [("ngram random-drain", {"name": "random-drain", "p_stall": 0.5}, 1)]
_CUDA_NGRAM = [("delays two-ahead ngram", 2)]
# Runs with the runner's draft-model proposer (`runnercheck.impl.draft_proposer`, rejection-sampled): no prefix
# caching, no explicit drafts.  (name, draft preset, lag policy on sim, max_inflight_steps).  The
# target's own preset as its draft (the run's weights: near-full acceptance, bonus tokens) and the
# smaller "-draft" preset (unrelated weights: mostly rejected, residual resamples).  The quick sim
# plan holds one short run of the latter (`_SIM_DRAFT_QUICK`); the full sim plan and both cuda plans all.
_SIM_DRAFT_FULL = [("draft-model lag-1 two-ahead", "", {"name": "lag-k-steps", "k": 1}, 2),
                   ("self-draft random-drain", "self", {"name": "random-drain", "p_stall": 0.5}, 1)]
# The quick sim plan's one draft-model run: the "-draft" preset (mostly rejected: residual resamples),
# short, so ``verify --quick`` reaches the draft-model proposer's code at a bounded cost.
_SIM_DRAFT_QUICK = [("draft-model lag-1", "", {"name": "lag-k-steps", "k": 1}, 1)]
DRAFT_QUICK_TICKS = 24
_CUDA_DRAFT = [("delays two-ahead draft-model", "", None, 2), ("delays two-ahead self-draft", "self", None, 2)]
# The cuda plan's chunking run: a token budget of 8 chunks prefills on cuda too (the coverage gate asks for middle
# and final chunks), and its first request fills one budget with prompt-logprob rows (`ChurnConfig.full_chunk_first`).
_CUDA_CHUNKING_RUN = "delays two-ahead"
_CUDA_RUN_LIMITS = {_CUDA_CHUNKING_RUN: dict(CUDA_LIMITS, max_num_batched_tokens=8)}
_CPU = [("one-ahead", 1, 0.0), ("one-ahead drafts", 1, 0.3), ("two-ahead", 2, 0.0)]


def _config(seed: int, ticks: int, kind: str, model: str, limits: dict, inflight: int, draft_prob: float,
            lag: dict | None, delay: dict | None, runner: str, cuda_graphs: bool, csan: bool = False) -> RunConfig:
    model_config = preset(model)
    if lag is not None and lag["name"] == "random-drain":
        lag = dict(lag, seed=seed)
    from runnercheck.stress.sim.faults import LogitsFault

    # NaN/+Inf rows only past every prompt that asks for prompt logprobs (VERIFY_CHURN and RACE_CHURN:
    # at most 16 tokens; longer conversation prompts ask for none).
    # Whole rows too (all-NaN, NaN/-Inf, +Inf/-Inf, exact ties) at other positions than the single entries.
    fault = LogitsFault(min_position=max(VERIFY_CHURN.max_prompt_len, 16), **ROW_FAULTS).describe()
    return RunConfig(seed, ticks, kind, model, model_config, default_limits(model_config, **limits),
                     SchedulerConfig(inflight, draft_prob), lag, delay, None, runner, cuda_graphs, fault,
                     draft_source="oracle" if draft_prob > 0 else "random", csan=csan)


def _with_ngram(config: RunConfig) -> RunConfig:
    return replace(config, scheduler=replace(config.scheduler, ngram_spec_tokens=NGRAM_SPEC_TOKENS))


def _with_draft_model(config: RunConfig, draft: str) -> RunConfig:
    """``draft``: "" the model's "-draft" preset, "self" the model itself (drafting with the target's weights)."""
    preset_name = config.model_preset if draft == "self" else f"{config.model_preset}-draft"
    return replace(config, scheduler=replace(config.scheduler, draft_prob=0.0, prefix_caching=False,
                                             ngram_spec_tokens=NGRAM_SPEC_TOKENS, draft_model=preset_name))


def plan_runs(kind: str, seed: int, runner: str, *, quick: bool, ticks: int | None = None, max_runs: int | None = None,
              model: str = "micro", cuda_delay: Callable[[int, tuple[str, ...] | None], dict] | None = None,
              cuda_graphs: bool = True, csan: bool = False) -> list[PlannedRun]:
    """The runs of one verify job.  ``cuda_delay(seed, targets)`` gives a run's delay policy on cuda
    (``targets``: the resources a targeted run delays the readers of; None: delays before steps);
    ``csan``: every cuda run under the CUDA stream sanitizer (`runnercheck.checks.detectors.csan`)."""
    from runnercheck.stress.sim.races import RACE_CHURN

    runs: list[PlannedRun] = []
    if kind == "sim":
        ticks = ticks or (60 if quick else 300)
        for i, (name, lag, inflight, drafts) in enumerate(_SIM_QUICK if quick else _SIM_FULL):
            limits = _QUICK_RUN_LIMITS.get(name, QUICK_LIMITS) if quick else _FULL_RUN_LIMITS.get(name, FULL_LIMITS)
            cfg = _config(seed + i, ticks, kind, model, limits, inflight, drafts, lag, None, runner, cuda_graphs)
            runs.append(PlannedRun(name, cfg, VERIFY_CHURN))
        for name, lag, inflight in _SIM_NGRAM if quick else _SIM_NGRAM_FULL:
            cfg = _config(seed + len(runs), ticks, kind, model, QUICK_LIMITS if quick else FULL_LIMITS, inflight, 0.0, lag,
                          None, runner, cuda_graphs)
            runs.append(PlannedRun(name, _with_ngram(cfg), NGRAM_CHURN))
        for name, draft, lag, inflight in _SIM_DRAFT_QUICK if quick else _SIM_DRAFT_FULL:
            draft_ticks, limits = (min(ticks, DRAFT_QUICK_TICKS), QUICK_LIMITS) if quick else (ticks, FULL_LIMITS)
            cfg = _config(seed + len(runs), draft_ticks, kind, model, limits, inflight, 0.0, lag, None, runner, cuda_graphs)
            runs.append(PlannedRun(name, _with_draft_model(cfg, draft), VERIFY_CHURN))
    elif kind == "cuda":
        ticks = ticks or (120 if quick else 500)
        for i, (name, inflight, drafts, targets) in enumerate(_CUDA_QUICK if quick else _CUDA_FULL):
            delay = cuda_delay(seed + i, targets) if cuda_delay is not None else None
            limits = _CUDA_RUN_LIMITS.get(name, CUDA_LIMITS)
            cfg = _config(seed + i, ticks, kind, model, limits, inflight, drafts, None, delay, runner, cuda_graphs, csan)
            # The chunking run opens with a prompt-logprob prompt of one budget, admitted alone: the coverage gate's
            # full chunk, which the race traffic (no full-chunk draws) reached only by the timing's luck.
            churn = replace(RACE_CHURN, full_chunk_first=True) if name == _CUDA_CHUNKING_RUN else RACE_CHURN
            runs.append(PlannedRun(name, cfg, churn))
        for name, inflight in _CUDA_NGRAM:
            delay = cuda_delay(seed + len(runs), None) if cuda_delay is not None else None
            cfg = _config(seed + len(runs), ticks, kind, model, CUDA_LIMITS, inflight, 0.0, None, delay, runner, cuda_graphs, csan)
            runs.append(PlannedRun(name, _with_ngram(cfg), replace(RACE_CHURN, repetitive_prompt_prob=0.35)))
        for name, draft, _, inflight in _CUDA_DRAFT:
            delay = cuda_delay(seed + len(runs), None) if cuda_delay is not None else None
            cfg = _config(seed + len(runs), ticks, kind, model, CUDA_LIMITS, inflight, 0.0, None, delay, runner, cuda_graphs, csan)
            runs.append(PlannedRun(name, _with_draft_model(cfg, draft), RACE_CHURN))
    elif kind == "cpu":
        ticks = ticks or (30 if quick else 200)
        for i, (name, inflight, drafts) in enumerate(_CPU[:2] if quick else _CPU):
            cfg = _config(seed + i, ticks, kind, model, QUICK_LIMITS if quick else FULL_LIMITS, inflight, drafts, None,
                          None, runner, cuda_graphs)
            runs.append(PlannedRun(name, cfg, VERIFY_CHURN))
    else:
        raise RunSetupError(f"unknown device kind {kind!r}")
    return runs[:max_runs] if max_runs else runs


def without_proposer_runs(plan: list[PlannedRun], factory: Callable, spec: str) -> tuple[list[PlannedRun], str | None]:
    """The plan less its proposer runs when ``factory`` cannot build a runner with a proposer (it takes no
    ``speculative`` keyword: `runnercheck.stress.run.runners`' contract makes it optional), and the note that says so."""
    if accepts_keyword(factory, "speculative"):
        return plan, None
    kept = [p for p in plan if not p.config.scheduler.ngram_spec_tokens]
    skipped = [p.name for p in plan if p.config.scheduler.ngram_spec_tokens]
    if not skipped:
        return plan, None
    return kept, (f"{len(skipped)} proposer run(s) not run ({', '.join(skipped)}): runner factory {spec!r} takes no "
                  f"'speculative' keyword, so it cannot run the n-gram or draft-model proposer")


# --------------------------------------------------------------------------- one run


def execute_run(planned: PlannedRun, repro_dir: Path, on_tick: Callable[[int], None] = lambda tick: None, *,
                isolate: bool = True, repro_name_dir: Path | None = None) -> RunRecord:
    """One planned run through the harness (detectors in count mode); a repro on divergence."""
    from runnercheck.stress.run.harness import ChurnOps, checked_run
    from runnercheck.stress.run.isolation import isolated_run

    findings = (isolated_run if isolate else checked_run)(planned.config, ChurnOps(planned.churn), name=planned.name,
                                                          lifetime_mode="count", on_tick=on_tick)
    return record_run(planned, findings, repro_dir, repro_name_dir)


def record_run(planned: PlannedRun, findings: Any, repro_dir: Path, repro_name_dir: Path | None = None) -> RunRecord:
    """The run's record; its repro written to ``repro_dir`` on divergence and named under ``repro_name_dir``
    (the folder it will have once the report folder is in place; default ``repro_dir``)."""
    repro = None
    if findings.diverged:
        slug = "".join(c if c.isalnum() else "-" for c in planned.name)
        filename = f"seed{planned.config.seed}-{slug}.json"
        findings.repro().save(repro_dir / filename)
        repro = str((repro_name_dir or repro_dir) / filename)
    return RunRecord.from_findings(findings, repro)


# --------------------------------------------------------------------------- statistics


def run_chisq(out_dir: Path, skip: bool = False, seed: int = 0, *, device: str | None = None,
              runner_sampler: Callable | str = "impl") -> dict:
    """The sampler statistics section, one entry per sampler it ran on: `runnercheck.stress.cli.verify_chisq.run_statistics`."""
    from runnercheck.stress.cli.verify_chisq import run_statistics

    return run_statistics(out_dir, skip, seed, device=device, runner_sampler=runner_sampler)



# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(out="out/verify")
    parser.add_argument("--quick", action="store_true", help="a short job (2 to 3 minutes on an idle 2-core CPU)")
    add_runner_option(parser, DEFAULT_RUNNER_SPEC, RUNNER_HELP)
    parser.add_argument("--model", default="micro", choices=sorted(PRESETS), help="model preset of the runner and the oracle")
    parser.add_argument("--junit", default=None, metavar="FILE",
                        help="also write JUnit XML (one case per run; default: not written)")
    # Sizing knobs for tests and experiments, not part of the job's contract.
    parser.add_argument("--steps", type=int_type(1), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int_type(1), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--skip-chisq", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-coverage-gate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=int_type(1), default=None,
                        help="runs side by side, each in its own process (default: the usable cores)")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    add_timeout_option(parser, DEFAULT_RUN_TIMEOUT_S, "a run (each runs in its own process)")
    add_shard_option(parser, "campaign's runs")


def run(args: argparse.Namespace) -> int:
    from runnercheck.checks.interrupts import STATUS_COMPLETE, STATUS_INCOMPLETE
    from runnercheck.checks.provenance import device_name, provenance
    from runnercheck.checks.report_folder import run_exit_status, write_command_report
    from runnercheck.stress.run.harness import load_runner_factory
    from runnercheck.checks.junit import suite_name
    from runnercheck.stress.report.junit_cases import check_junit_path, verify_cases, write_cases
    from runnercheck.stress.report.render import print_verify_summary

    started = time.perf_counter()
    out = Path(args.out)
    kind = args.device
    try:
        if args.junit:
            check_junit_path(args.junit)
        factory = load_runner_factory(args.runner)
        notes: list[str] = []
        cuda_delay = None
        if kind == "cuda":
            cuda_delay, note = _calibrate_cuda(args)
            notes.append(note)
        plan = plan_runs(kind, args.seed, args.runner, quick=args.quick, ticks=args.steps, max_runs=args.runs,
                         model=args.model, cuda_delay=cuda_delay, cuda_graphs=not args.eager,
                         csan=getattr(args, "csan", False))
        plan, skipped_note = without_proposer_runs(plan, factory, args.runner)
        if skipped_note:
            notes.append(skipped_note)
        if getattr(args, "csan", False):
            notes.append("differential runs under CUDA's stream sanitizer (--csan): a race it reports fails the run; "
                         "the sampler statistics run without it (runnercheck chisq --csan)")
        shard = args.shard
        if not shard.whole:
            whole, plan = plan, shard.select(plan)
            if not plan:
                raise RunSetupError(f"--shard {shard.describe()}: the campaign has {len(whole)} run(s), none for this shard")
            notes.append(f"shard {shard.describe()} of a {len(whole)}-run campaign: {', '.join(p.name for p in plan)}; "
                         f"the sampler statistics run in shard 0/{shard.count} only; coverage is shown, not gated "
                         f"(a shard sees part of the campaign)")
    except RunSetupError as e:
        print(f"runnercheck verify: {e}", file=sys.stderr)
        return 2
    def run_and_write(tmp: Path) -> tuple[dict, str | None]:
        """The plan's runs, then the report: (its summary, why the campaign stopped early or None)."""
        records, chisq, stopped = _execute_plan(plan, out, tmp, args)
        if stopped:
            notes.insert(0, stopped)
        from runnercheck.stress.run.staged_writes import UNGATED_STAGED_FEATURES

        unused = [f for f in UNGATED_STAGED_FEATURES if any(f in r.coverage for r in records)
                  and not sum(r.coverage.get(f, 0) for r in records)]
        if unused:
            notes.append(f"not produced by this runner (counted, not gated): {', '.join(unused)}")
        notes.extend(unchecked_notes(records))
        doc = build_summary(records, chisq, device=kind, seed=args.seed, runner=args.runner, model=args.model,
                            quick=args.quick, elapsed_s=time.perf_counter() - started, notes=notes,
                            provenance=provenance(device_name(kind)),
                            require_coverage=not args.no_coverage_gate and args.shard.whole,
                            status=STATUS_INCOMPLETE if stopped else STATUS_COMPLETE)
        write_report(tmp, doc)
        return doc, stopped

    written = write_command_report("verify", out, run_and_write, force=args.force)
    if written.exit_status is not None:
        return written.exit_status
    doc, stopped = written.value
    files = [out / "summary.json", out / "summary.md", out / "manifest.json"]
    files += [Path(r["repro"]) for r in doc["runs"] if r.get("repro")]
    for folder in sorted({e["folder"] for e in doc["chisq"].get("samplers", []) if e.get("folder")}):
        files += sorted(p for p in Path(folder).glob("*") if p.is_file())
    if args.junit:
        files.append(write_cases(args.junit, suite_name(doc["command"]), verify_cases(doc), elapsed_s=doc["elapsed_s"]))
    print_verify_summary(doc, files)
    return run_exit_status("verify", out, doc["passed"], stopped)


def _calibrate_cuda(args: argparse.Namespace) -> tuple[Callable[[int], dict], str]:
    from runnercheck.stress.sim.races import DEFAULT_LAG_FACTOR, calibrate_cuda_delay, measure_host_tick_us

    warmup = plan_runs("cuda", args.seed, args.runner, quick=True, ticks=12, max_runs=1, model=args.model,
                       cuda_graphs=not args.eager)[0].config
    tick_us = measure_host_tick_us(warmup)
    note = (f"cuda delays calibrated on a {tick_us:.0f} us host tick: mean delay {DEFAULT_LAG_FACTOR:g} ticks per step, "
            f"so the GPU trails the host by up to max_inflight_steps steps")
    return (lambda seed, targets=None: calibrate_cuda_delay(seed, tick_us, targets=targets)), note


def _execute_plan(plan: list[PlannedRun], out: Path, tmp: Path,
                  args: argparse.Namespace) -> tuple[list[RunRecord], dict, str | None]:
    """The runs' records, the statistics section, and None -- or, when interrupted, the records of
    the runs that finished, the statistics if they finished, and a note saying where it stopped."""
    from runnercheck.checks.interrupts import signal_name
    from runnercheck.stress.run.harness import ChurnOps
    from runnercheck.stress.run.isolation import IsolatedJob, default_parallel, isolated_runs
    from runnercheck.stress.report.progress import Progress
    from runnercheck.stress.report.render import run_line

    by_index: dict[int, RunRecord] = {}
    ticks = [0] * len(plan)
    with Progress("verify", sum(p.config.steps for p in plan), enabled=not args.no_progress) as progress:
        def started(i: int) -> None:
            p = plan[i]
            progress.start(f"run {i + 1}/{len(plan)} {p.name} (seed {p.config.seed}, {p.config.steps} ticks)")

        def ticked(i: int, tick: int) -> None:
            ticks[i] = tick
            progress.advance(sum(ticks))

        def done(i: int, findings: Any) -> None:
            ticks[i] = plan[i].config.steps
            by_index[i] = record_run(plan[i], findings, tmp / "repros", out / "repros")
            progress.end(run_line(by_index[i]))

        try:
            if args.in_process:
                from runnercheck.stress.run.harness import checked_run

                for i, planned in enumerate(plan):
                    started(i)
                    done(i, checked_run(planned.config, ChurnOps(planned.churn), name=planned.name, lifetime_mode="count",
                                        on_tick=lambda t, i=i: ticked(i, t)))
            else:
                jobs = [IsolatedJob(p.config, ChurnOps(p.churn), p.name, "count", timeout_s=timeout_seconds(args.timeout))
                        for p in plan]
                # On cuda one run at a time: the delays are calibrated for a GPU that runs one step stream.
                parallel = args.jobs or (1 if args.device == "cuda" else default_parallel())
                isolated_runs(jobs, parallel=parallel, on_start=started, on_tick=ticked, on_done=done)
        except KeyboardInterrupt as e:  # the running children are stopped (isolation): keep what finished
            records = [by_index[i] for i in sorted(by_index)]
            return records, _not_run("interrupted before the sampler statistics"), (
                f"interrupted ({signal_name(e)}) after {len(records)} of {len(plan)} run(s) finished "
                f"({', '.join(r.name for r in records) or 'none'}); the statistics did not run")
        progress.start("sampler statistics (chisq)")
        records = [by_index[i] for i in range(len(plan))]
        skip = args.skip_chisq or args.shard.index != 0  # one campaign's statistics, in its first shard
        chisq_started = time.perf_counter()
        try:
            chisq = _retarget(run_chisq(tmp, skip=skip, seed=args.seed, device=args.device), str(tmp), str(out))
        except KeyboardInterrupt as e:
            return records, _not_run("interrupted during the sampler statistics"), (
                f"interrupted ({signal_name(e)}) during the sampler statistics, after all {len(plan)} run(s) finished")
        chisq["elapsed_s"] = round(time.perf_counter() - chisq_started, 2)
        progress.end(f"sampler statistics: {chisq.get('status')}")
    return records, chisq, None


def _not_run(note: str) -> dict:
    """The statistics section of a job that stopped before (or during) them."""
    return {"status": "skipped", "passed": None, "note": note}


def _retarget(value: Any, tmp: str, out: str) -> Any:
    """``value`` with paths under the temporary report folder named as they will be once it is in place."""
    if isinstance(value, dict):
        return {k: _retarget(v, tmp, out) for k, v in value.items()}
    if isinstance(value, list):
        return [_retarget(v, tmp, out) for v in value]
    if isinstance(value, str) and value.startswith(tmp):
        return out + value[len(tmp):]
    return value


__all__ = ["PlannedRun", "plan_runs", "execute_run", "run_chisq", "add_arguments", "run", "VERIFY_CHURN"]
