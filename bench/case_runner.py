"""Runner benchmarks: host cost per step vs the V1-style baseline, staged-write bytes, end to end."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from runnercheck.bench.common import BenchContext, Row
from runnercheck.bench.host_cpu import StepCpu, host_cpu_rows
from runnercheck.bench.v1_baseline import V1HostBatch
from runnercheck.bench.workload import DecodeWorkload
from runnercheck.impl import native
from runnercheck.impl.device import Device
from runnercheck.impl.interface import RunnerLimits, SamplingParams
from runnercheck.impl.launcher import idle_settings, lead_margin, spin_percent
from runnercheck.impl.model.weights import ModelConfig, preset, random_weights

PARAMS = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, max_tokens=1 << 20)


def _host_config(ctx: BenchContext) -> ModelConfig:
    # The host cost does not depend on the model size (the forward is stubbed where it matters).
    base = preset("micro") if ctx.quick else preset("tiny")
    return replace(base, max_model_len=1024)


def _limits(config: ModelConfig, num_reqs: int, budget: int, block_size: int, num_blocks: int) -> RunnerLimits:
    return RunnerLimits(vocab_size=config.vocab_size, max_num_reqs=num_reqs, max_model_len=config.max_model_len,
                        max_num_batched_tokens=budget, num_kv_blocks=num_blocks, block_size=block_size)


def _make_runner(ctx: BenchContext, config: ModelConfig, limits: RunnerLimits, dtype=None):
    from runnercheck.impl.runner import ModelRunner

    weights = random_weights(config, seed=ctx.seed)
    return ModelRunner(weights, limits, ctx.device, base_seed=ctx.seed, dtype=dtype)


def _stub_forward(runner) -> None:
    """Replace the model forward by persistent buffers: what remains is the runner's own cost."""
    rows = runner.input_batch.max_sampling_rows + runner.input_batch.max_prompt_rows
    hidden = runner.device.zeros((rows, runner.weights.config.hidden_size), runner.dtype)
    logits = runner.device.zeros((rows, runner.limits.vocab_size), torch.float32)
    logits.normal_()

    def forward(*args, **kwargs):
        n = args[6].shape[0] if len(args) > 6 else kwargs["logits_indices"].shape[0]
        return hidden[:n]

    runner.model.forward = forward
    runner.model.compute_logits = lambda h: logits[: h.shape[0]]
    runner.graphs.recapture()  # the graphs captured at construction replay the real forward's launches


class _RunnerSteps:
    """The runner's steps one at a time.  Async mode: a step's output is read after the next one is issued;
    otherwise at once.  ``around``: a context-manager factory entered around each execute_model call."""

    def __init__(self, runner, work: DecodeWorkload, *, async_mode: bool = True, around=None, cpu: StepCpu | None = None):
        self.runner, self.work, self.async_mode, self.around, self.pending = runner, work, async_mode, around, None
        self.cpu = cpu  # per-step CPU time of this thread and the launch thread (`runnercheck.bench.host_cpu`)
        self.admitting: list[bool] = []  # per step issued: whether it admitted a request
        self.steady: list[bool] = []  # per step issued: whether the runner read it as steady (`_execute_steady`)

    def step(self) -> float:
        """Issue the next step; its host microseconds inside execute_model."""
        sched = self.work.next_step()
        self.admitting.append(bool(sched.new_requests))
        cpu0 = self.cpu.begin() if self.cpu is not None else 0.0
        t0 = time.perf_counter()
        if self.around is None:
            out = self.runner.execute_model(sched)
        else:
            with self.around():
                out = self.runner.execute_model(sched)
        elapsed = (time.perf_counter() - t0) * 1e6
        if self.cpu is not None:
            self.cpu.end(cpu0)
        stats = self.runner.last_step_stats  # read after the clock: not part of the step
        self.steady.append(stats is not None and stats.steady)
        if not self.async_mode:
            out.get()
            return elapsed
        if self.pending is not None:
            self.pending.get()
        self.pending = out
        return elapsed

    def finish(self) -> None:
        if self.cpu is not None:
            self.cpu.finish()
        if self.pending is not None:
            self.pending.get()
            self.pending = None


def _drive(runner, work: DecodeWorkload, steps: int, *, async_mode: bool = True, around=None) -> list[float]:
    """Run ``steps`` scheduler steps; returns host microseconds inside execute_model per step.

    ``around``: a context-manager factory entered around each execute_model call (the detector).
    """
    runner_steps = _RunnerSteps(runner, work, async_mode=async_mode, around=around)
    host_us = [runner_steps.step() for _ in range(steps)]
    runner_steps.finish()
    return host_us


PAIRED_BLOCK_STEPS = 10


@dataclass
class _PairedSteps:
    """Runner and baseline host microseconds per step, and which of each side's steps admitted a request."""
    runner_us: list[float]
    baseline_us: list[float]
    runner_admitting: list[bool]
    baseline_admitting: list[bool]
    runner_steady: list[bool]
    runner_cpu: StepCpu  # the runner's steps: CPU time of the caller's thread and the launch thread's
    baseline_cpu: list[float]  # the baseline's steps: CPU seconds of the caller's thread


def _drive_paired(runner, work: DecodeWorkload, batch: V1HostBatch, bwork: DecodeWorkload, steps: int) -> _PairedSteps:
    """Runner and baseline timed in alternating blocks of `PAIRED_BLOCK_STEPS` steps.

    Both sides see the same host conditions: a lent machine's host speed drifts by up to 2x within a
    minute, which two back-to-back timing loops would read as a ratio.  Blocks, not single steps,
    so that each side mostly runs with its own data in the caches (the first step of a block, the
    one that finds the other side's, is a tenth of the samples and does not move the median).
    """
    _warm_baseline(batch, bwork)
    runner_steps = _RunnerSteps(runner, work, cpu=StepCpu(getattr(runner.device, "launcher", None)))
    runner_us: list[float] = []
    baseline_us: list[float] = []
    baseline_cpu: list[float] = []
    baseline_admitting: list[bool] = []
    while len(runner_us) < steps:
        n = min(PAIRED_BLOCK_STEPS, steps - len(runner_us))
        runner_us += [runner_steps.step() for _ in range(n)]
        for _ in range(n):
            sched = bwork.next_step()
            baseline_admitting.append(bool(sched.new_requests))
            baseline_us.append(_baseline_step(batch, sched, baseline_cpu))
    runner_steps.finish()
    return _PairedSteps(runner_us, baseline_us, runner_steps.admitting, baseline_admitting, runner_steps.steady,
                        runner_steps.cpu, baseline_cpu)


def _warm_to_decode(runner, work: DecodeWorkload) -> None:
    while not work.all_decoding:
        runner.execute_model(work.next_step()).get()
    for _ in range(3):
        runner.execute_model(work.next_step()).get()


HOST_COST_PROMPT_LEN = 32


HOST_COST_CHURN = 0.01


def host_cost_setup(ctx: BenchContext, num_reqs: int, churn: float = HOST_COST_CHURN):
    """(runner with its forward stubbed, decode workload with ``churn``, limits), warmed up to all-decode.

    At 1% churn and 256 requests every step admits one request (its prompt next to the decodes: a
    mixed graph's replay, `runnercheck.impl.graphs`); at churn 0 every step is a uniform decode step, which
    replays a CUDA graph (after the first, its bucket's fused graph).
    """
    config = _host_config(ctx)
    block_size = 16
    num_blocks = num_reqs * (config.max_model_len // block_size)
    limits = _limits(config, num_reqs, max(256, num_reqs * 2), block_size, num_blocks)
    runner = _make_runner(ctx, config, limits)
    _stub_forward(runner)
    work = DecodeWorkload(num_reqs=num_reqs, prompt_len=HOST_COST_PROMPT_LEN, vocab_size=config.vocab_size,
                          block_size=block_size, num_blocks=num_blocks, token_budget=limits.max_num_batched_tokens,
                          churn=churn, params=PARAMS, seed=ctx.seed)
    _warm_to_decode(runner, work)
    return runner, work, limits


def drop_device_work(device: Device) -> None:
    """Make ``device.enqueue`` count and drop its work: what remains is the runner's host bookkeeping
    (outputs are garbage; a measuring aid for cpu/sim, where kernels would otherwise run inline)."""
    if device.is_cuda:
        raise ValueError("device work is part of the host cost on cuda (launches); it is dropped only on cpu/sim")

    def count_only(fn, label: str = "") -> None:
        device.num_enqueued += 1

    device.enqueue = count_only


def bench_host_cost(ctx: BenchContext) -> list[Row]:
    """Runner host us per decode step vs the V1-style baseline, at 64 and 256 requests, 1% and 0% churn.

    On cuda the runner's launches are part of its host cost.  On cpu/sim the runner runs on a
    device of its own whose work is dropped (interpreted kernels would swamp the bookkeeping), so
    the figure is Python bookkeeping alone on both sides.
    """
    config = _host_config(ctx)
    out: list[Row] = []
    sizes = (4,) if ctx.quick else (64, 256)
    steps = 3 if ctx.quick else 200
    device = ctx.device
    if not device.is_cuda:
        device = Device(ctx.device.kind, seed=ctx.seed, lag_policy="run-immediately")
        drop_device_work(device)
    hctx = BenchContext(device, quick=ctx.quick, seed=ctx.seed)
    what = "forward stubbed" if device.is_cuda else "device work dropped"
    # Every configuration is timed before any is counted: the counting passes (torch.profiler for the
    # device operations, the sync detector, a TorchFunctionMode) then cannot tax a timing row that follows
    # them.  Whether a torch.profiler session slows the process after it is not settled on the lent H200
    # (`host_profile --trace` times the steps before and after one; its host drifts ~2x on its own).
    timed = [_time_host_cost(ctx, hctx, config, num_reqs, churn, steps)
             for num_reqs in sizes for churn in (HOST_COST_CHURN, 0.0)]
    for run in timed:
        out += _count_host_cost(ctx, run, what)
    return out


@dataclass
class _HostCostRun:
    """One configuration's timed steps (runner and baseline interleaved, then the runner alone), kept
    with its runner and workload for the counting passes that follow every configuration's timing."""
    num_reqs: int
    churn: float
    steps: int
    runner: Any
    work: DecodeWorkload
    host_us: list[float]
    base_us: list[float]
    alone_us: list[float]
    host_admitting: list[bool]  # per timed step: whether it admitted a request (runner's, then baseline's)
    base_admitting: list[bool]
    host_steady: list[bool]  # per timed runner step: whether it was read as steady (`ModelRunner._execute_steady`)
    baseline_h2d_bytes: int
    bucketed: int
    steady: bool
    waits: int
    row_waits: int  # admissions that waited for a freed row's last step (`RequestStateTable.num_quarantine_waits`)
    # the alone steps, per step: launch-thread CPU and wall seconds, wakes, and `LaunchThread.phases` (seconds in the
    # driver's calls, polling, the caller's waits for issues; jobs)
    thread_cpu: tuple[float, float, float, tuple[float, float, float, float]] | None
    paired_cpu: StepCpu  # the interleaved runner steps' CPU time (caller + launch thread)
    baseline_cpu: list[float]  # the interleaved baseline steps' CPU seconds
    alone_cpu: StepCpu  # the alone steps' CPU time


def _time_host_cost(ctx: BenchContext, hctx: BenchContext, config: ModelConfig, num_reqs: int, churn: float,
                    steps: int) -> _HostCostRun:
    """Runner vs baseline at one batch size and churn (1%: every step at 256 admits a request, a mixed
    step; 0: uniform decode steps, graph replays), both on the same scheduler traffic."""
    runner, work, limits = host_cost_setup(hctx, num_reqs, churn)
    block_size, prompt_len, num_blocks = limits.block_size, HOST_COST_PROMPT_LEN, limits.num_kv_blocks
    baseline = V1HostBatch(num_reqs, config.max_model_len, limits.max_model_len // block_size, block_size,
                           limits.max_num_batched_tokens, ctx.device.torch_device)
    bwork = DecodeWorkload(num_reqs=num_reqs, prompt_len=prompt_len, vocab_size=config.vocab_size, block_size=block_size,
                           num_blocks=num_blocks, token_budget=limits.max_num_batched_tokens, churn=churn, params=PARAMS, seed=ctx.seed)
    graphs_before = runner.cuda_graph_stats()
    waits_before = runner.staging.num_backpressure_waits + runner.outputs.num_backpressure_waits
    row_waits_before = runner.state.num_quarantine_waits
    # The runner and the baseline interleaved, so the ratio is taken under one set of host conditions.
    paired = _drive_paired(runner, work, baseline, bwork, steps)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    waits = runner.staging.num_backpressure_waits + runner.outputs.num_backpressure_waits - waits_before
    row_waits = runner.state.num_quarantine_waits - row_waits_before
    # The runner's steps again, alone: what the interleaving costs it (its caches shared with the baseline's work),
    # and what the device's launch thread (`runnercheck.impl.launcher`) spends on them in CPU time, its polling included.
    launcher = getattr(runner.device, "launcher", None)
    cpu_before, wall_before = (launcher.cpu_seconds() if launcher else 0.0), time.perf_counter()
    signals_before = launcher.signals() if launcher else 0
    phases_before = launcher.phases() if launcher else None
    alone_steps = _RunnerSteps(runner, work, cpu=StepCpu(launcher))
    alone_us = [alone_steps.step() for _ in range(steps // 2)]
    alone_steps.finish()
    thread_cpu = ((launcher.cpu_seconds() - cpu_before) / (steps // 2), (time.perf_counter() - wall_before) / (steps // 2),
                  (launcher.signals() - signals_before) / (steps // 2),
                  _phases_per_step(phases_before, launcher.phases(), steps // 2)) if launcher else None
    graphs_after = runner.cuda_graph_stats()
    bucketed = (graphs_after["replays"] + graphs_after["padded_eager"]) - (graphs_before["replays"] + graphs_before["padded_eager"])
    return _HostCostRun(num_reqs, churn, steps, runner, work, paired.runner_us, paired.baseline_us, alone_us,
                        paired.runner_admitting, paired.baseline_admitting, paired.runner_steady, baseline.h2d_bytes_last_step,
                        bucketed, runner.last_step_stats.steady, waits, row_waits, thread_cpu, paired.runner_cpu,
                        paired.baseline_cpu, alone_steps.cpu)


def _phases_per_step(before: tuple, after: tuple, steps: int) -> tuple[float, float, float, float]:
    """`LaunchThread.phases` over ``steps`` steps, per step: (seconds in the driver's calls, seconds polling, seconds
    the caller spun waiting for issues, jobs)."""
    in_calls, polling, caller_waits, jobs = (b - a for a, b in zip(before, after))
    return 1e-9 * in_calls / steps, 1e-9 * polling / steps, 1e-9 * caller_waits / steps, jobs / steps


def _count_host_cost(ctx: BenchContext, run: _HostCostRun, what: str) -> list[Row]:
    """A timed configuration's rows, with what its runner's steps issue, counted now: device operations
    (torch.profiler), host enqueues, torch calls and host syncs."""
    from runnercheck.checks.detectors.sync import SyncReport, forbid_host_sync

    runner, work, steps, num_reqs, churn = run.runner, run.work, run.steps, run.num_reqs, run.churn
    device = runner.device
    median = statistics.median(run.host_us)
    launches = _count_launches(ctx, lambda: _drive(runner, work, 5)) if device.is_cuda else None
    enqueued_before = device.num_enqueued  # host-side device work items: copies, launches, graph replays
    _drive(runner, work, 5)
    enqueues = (device.num_enqueued - enqueued_before) / 5
    torch_calls = TorchCallCounter()
    _drive(runner, work, 5, around=lambda: torch_calls)
    report = SyncReport("count")
    counted_us = _drive(runner, work, 5, around=lambda: forbid_host_sync(device.kind, mode="count", report=report))

    base_median = statistics.median(run.base_us)
    ratio = median / base_median if base_median else float("nan")
    tag = f"{num_reqs} decode reqs, {churn:.0%} churn"
    graphed = churn == 0.0 and device.is_cuda and num_reqs == 256
    out = [
        Row("host_cost", f"runner execute_model host time, {tag} ({what})", median, "us",
            target="<= 150 us at 256, graphed (0% churn)" if churn == 0.0 else None, met=(median <= 150) if graphed else None,
            note=f"p90 {np.percentile(run.host_us, 90):.0f} us over {steps} steps, {device.kind}; "
                 f"bucketed (graph) steps {run.bucketed}/{steps}; last step steady: {run.steady}; "
                 f"slot back-pressure waits {run.waits}; row quarantine waits {run.row_waits}; "
                 f"step reading (impl/native/steady.c, general.c, boundary.c): {native.describe()}, "
                 f"{native.describe('general')}, {native.describe('boundary')}; "
                 f"diff packing (impl/native/staging.c): {native.describe('staging')}; "
                 f"admission seeds (impl/native/seeds.c): {native.describe('seeds')}; "
                 f"launch thread (impl/launcher.py): {'on' if getattr(device, 'launcher', None) else 'off'}"),
        Row("host_cost", f"runner execute_model host time alone, {tag} ({what})", statistics.median(run.alone_us), "us",
            note=f"{steps // 2} more steps right after, not interleaved with the baseline (compare with the row above)"),
        Row("host_cost", f"V1-style baseline prepare+upload, {tag}", base_median, "us",
            note=f"persistent numpy batch, full block table upload ({run.baseline_h2d_bytes} B/step); "
                 f"timed in blocks of {PAIRED_BLOCK_STEPS} steps alternating with the runner's"),
        Row("host_cost", f"runner / baseline host time, {tag}", ratio, "x", target="<= 0.333 (issue 14)",
            met=(ratio <= 1 / 3) if (device.is_cuda and not ctx.quick) else None,
            note=f"{'H200 target' if device.is_cuda else 'runner device work dropped: bookkeeping vs bookkeeping'}"),
        *host_cpu_rows(tag, churn, run.paired_cpu, run.baseline_cpu, run.alone_cpu,
                       targeted=device.is_cuda and not ctx.quick),
        Row("host_cost", f"host syncs per step, {tag}", report.count / max(1, len(counted_us)), "syncs",
            target="0", met=report.count == 0, note=f"detector in count mode over {len(counted_us)} steps"),
    ]
    if churn > 0:
        out += _by_step_kind(run, tag)
    if run.thread_cpu is not None:
        cpu, wall, signals, (in_calls, polling, caller_waits, jobs) = run.thread_cpu
        spin, nap, nap_for = idle_settings()
        median_gap, window = runner.device.launcher.idle_window()
        least_lead, last_lead_wait, lead_waits = runner.device.launcher.lead()
        margin = lead_margin()
        lead = (f"after a step's wake a lead wait ({lead_waits} so far, the last {last_lead_wait / 1e3:.0f} us: {margin} us "
                f"before the shortest recent wake-to-push interval, {least_lead / 1e3:.0f} us), then {spin} us"
                if margin >= 0 else f"after a step's wake {spin} us, no lead wait")
        out.append(Row("host_cost", f"launch thread CPU time per step, {tag}", 1e6 * cpu, "us",
                       note=f"impl.launcher's worker over the alone steps, its polling (after a burst {window / 1e3:.0f} us: "
                            f"{spin_percent()}% of the {median_gap / 1e3:.0f} us median burst interval, at most {spin} us; "
                            f"{lead}) and naps ({nap} us each for {nap_for} us) included, "
                            f"{runner.device.launcher.sleeps()} sleeps so far: {cpu / wall:.0%} of a core while steps run back to back "
                            f"({1e6 * wall:.0f} us a step, the workload's and output reads' time included); "
                            f"wakes of the sleeping worker (a system call in the step) per step: {signals:.2f}; "
                            f"wall time a step: {1e6 * in_calls:.0f} us in the driver's calls ({jobs:.2f} jobs), "
                            f"{1e6 * polling:.0f} us polling, and the caller {1e6 * caller_waits:.0f} us spinning in "
                            "its waits for the worker's issues (CPU the step spends on the worker's behalf)"))
    out.append(Row("host_cost", f"host enqueues per step, {tag}", enqueues, "enqueues",
                   target="1 at 0% churn (the fused graph replay, H2D and D2H inside: impl.lanes)" if churn == 0.0 else None,
                   met=(enqueues <= 1) if churn == 0.0 and runner.graphs.enabled else None,
                   note="Device.enqueue calls: each a copy, a Triton/torch launch, or one graph replay; fused steady "
                        f"replays so far {runner.cuda_graph_stats().get('fused_replays', 0)}"))
    out.append(Row("host_cost", f"torch calls per step, {tag}", torch_calls.count / 5, "calls",
                   note="tensor ops the host issues inside execute_model (each costs ~5-25 us of host time on the H200 box; "
                        "a graph replay, event record/query are not torch functions)"
                        + ("" if device.is_cuda else "; device work dropped: only those outside enqueued work")))
    if launches is not None:
        out.append(Row("host_cost", f"device operations per step, {tag} (forward stubbed)", launches / 5, "ops",
                       note="CUDA profiler events: kernels (those inside a graph replay too) and copies"))
    return out


def _by_step_kind(run: _HostCostRun, tag: str) -> list[Row]:
    """The ratio over the steps that admitted a request alone, with both kinds' medians in the note: a churn row's
    median is one kind's or the other's (at 64 requests, 1% churn, about two steps in three admit).  Then the runner's
    general steps that admitted nobody (the step after an admission, whose batch changed) against the baseline's
    steps without an admission: what an admitting step would cost were its admission free."""
    def describe(us: list[float]) -> str:
        return f"{statistics.median(us):.0f} us ({len(us)})" if us else "none"

    def ratio(runner_us: list[float], base_us: list[float]) -> float:
        return statistics.median(runner_us) / statistics.median(base_us) if runner_us and base_us else float("nan")

    steps = list(zip(run.host_us, run.host_admitting, run.host_steady))
    runner_adm = [t for t, admitted, _ in steps if admitted]
    runner_general = [t for t, admitted, steady in steps if not admitted and not steady]
    runner_steady = [t for t, admitted, steady in steps if not admitted and steady]
    base_adm = [t for t, a in zip(run.base_us, run.base_admitting) if a]
    base_other = [t for t, a in zip(run.base_us, run.base_admitting) if not a]
    rows = [
        Row("host_cost", f"runner / baseline host time, admitting steps, {tag}", ratio(runner_adm, base_adm), "x",
            note=f"medians (steps): admitting runner {describe(runner_adm)}, baseline {describe(base_adm)}; "
                 f"other steps runner {describe(runner_general + runner_steady)} (general {describe(runner_general)}, "
                 f"steady {describe(runner_steady)}), baseline {describe(base_other)}"),
    ]
    if runner_general and base_other:  # at 256 requests, 1% churn, every step admits: no such row
        rows.append(Row("host_cost", f"runner / baseline host time, general steps without an admission, {tag}",
            ratio(runner_general, base_other), "x",
            note=f"medians (steps): runner {describe(runner_general)}, baseline's steps without an admission "
                 f"{describe(base_other)}: the floor of the admitting steps' ratio were an admission free"))
    return rows


class TorchCallCounter(TorchFunctionMode):
    """Counts the torch functions and tensor methods called while it is active (a measuring aid)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _baseline_step(batch: V1HostBatch, sched, cpu: list[float] | None = None) -> float:
    """One step through the V1-style host batch (bookkeeping + prepare + upload); its host microseconds (and its
    thread's CPU seconds appended to ``cpu``)."""
    cpu0 = time.thread_time()
    t0 = time.perf_counter()
    for rid in sched.finished_req_ids:
        batch.remove(rid)
    for req in sched.new_requests:
        batch.add(req.req_id, req.prompt_token_ids, req.block_ids)
    batch.update_cached(sched.cached_requests)
    batch.prepare_inputs(sched.num_scheduled_tokens)
    for rid, n in sched.num_scheduled_tokens.items():
        row = batch.row_of[rid]
        if batch.num_computed[row] >= batch.num_tokens[row]:
            batch.append_token(rid, 1)  # the sampled token a real step would append
    elapsed = (time.perf_counter() - t0) * 1e6
    if cpu is not None:
        cpu.append(time.thread_time() - cpu0)
    return elapsed


def _warm_baseline(batch: V1HostBatch, work: DecodeWorkload) -> None:
    """Steps until every request decodes (the prefills are not timed, as for the runner)."""
    while True:
        _baseline_step(batch, work.next_step())
        if work.all_decoding:
            return


def _count_launches(ctx: BenchContext, fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def bench_staged_writes(ctx: BenchContext) -> list[Row]:
    from runnercheck.bench.timing import device_time_us
    from runnercheck.impl.buffers import StagingPool, StagingWriter
    from runnercheck.impl.staged_writes import StagedWriteTensor

    dev = ctx.device
    num_reqs = 64 if ctx.quick else 1024
    max_blocks = 64 if ctx.quick else 256
    out: list[Row] = []
    full_bytes = num_reqs * max_blocks * 4
    rng = np.random.default_rng(ctx.seed)
    for churn in (0.0, 0.01, 0.10):
        table = StagedWriteTensor(dev, (num_reqs, max_blocks), torch.int32, "block_table")
        pool = StagingPool(dev, num_slots=4, capacity_bytes=max(1 << 16, 2 * full_bytes))
        steps, total = 20, 0
        for step in range(steps):
            # Every running request appends a block every block_size (16) steps; churned rows get a new table.
            for row in range(num_reqs):
                if rng.random() < churn:
                    table.stage(row, 0, rng.integers(0, 1 << 20, size=8).tolist())
                elif rng.random() < 1 / 16:
                    table.stage(row, int(rng.integers(0, max_blocks)), [int(rng.integers(0, 1 << 20))])
            writer = StagingWriter(pool, step)
            table.flush(writer)
            writer.submit()
            table.enqueue_apply()
            total += writer.bytes
        dev.synchronize()
        per_step = total / steps
        out.append(Row("staged_writes", f"H2D bytes per step, {churn:.0%} churn", per_step, "B",
                       target="< 5% of full table at 1%" if churn == 0.01 else None,
                       met=(per_step < 0.05 * full_bytes) if churn == 0.01 else None,
                       note=f"{per_step / full_bytes:.2%} of the full table ({full_bytes} B)"))
    # Apply-kernel time for a 1%-churn step's diffs.
    table = StagedWriteTensor(dev, (num_reqs, max_blocks), torch.int32, "block_table")
    pool = StagingPool(dev, num_slots=4, capacity_bytes=1 << 20)
    step_ids = iter(range(1 << 62))  # each call is a step of its own: a slot is never reused within its step

    def one_apply() -> None:
        for row in range(0, num_reqs, 100):
            table.stage(row, 0, list(range(8)))
        writer = StagingWriter(pool, next(step_ids))
        table.flush(writer)
        writer.submit()
        table.enqueue_apply()

    us = device_time_us(one_apply, cuda=dev.is_cuda)
    out.append(Row("staged_writes", "stage + flush + apply (1% churn diffs), device+host time", us, "us"))
    return out


def bench_end_to_end(ctx: BenchContext) -> list[Row]:
    """Qwen3-0.6B-shaped random weights, bf16: decode throughput, host vs GPU time, async vs sync, graphs vs eager.

    Every case runs four runners on the same weights and workload: CUDA graphs on and off
    (``cuda_graphs=False``: the same bucketed launches, enqueued eagerly), each async (output read
    one step late) and sync.  The batch size is fixed (no churn), so the graph runners capture
    that one size (two graphs: with and without logprobs).
    """
    from runnercheck.impl.graphs import format_graph_stats
    from runnercheck.impl.runner import ModelRunner

    if ctx.quick:
        config = replace(preset("micro"), max_model_len=256)
        cases = [(2, 8, 5)]  # four runners: keep the CPU smoke test short
        dtype = torch.float32
    else:
        config = preset("qwen3-0.6b")
        cases = [(64, 128, 128), (256, 512, 128)]
        dtype = torch.bfloat16
    weights = random_weights(config, seed=ctx.seed)
    out: list[Row] = []
    profiled_steps = 8
    for num_reqs, ctx_len, new_tokens in cases:
        block_size = 16
        budget = 64 if ctx.quick else 8192
        # Past its context a request decodes one token per prefill step of the later requests, then
        # 3 warm-up + (new_tokens - 4) timed + profiled_steps tokens.
        prefill_steps = -(-num_reqs * ctx_len // budget)
        per_request = ctx_len + prefill_steps + new_tokens + profiled_steps + 8
        num_blocks = num_reqs * (-(-per_request // block_size)) + 16
        limits = _limits(config, num_reqs, budget, block_size, num_blocks)
        tok_s: dict[tuple[str, str], float] = {}
        for graphs in ("graphs", "eager"):
            wall_by_mode = {}
            for mode in ("async", "sync"):
                runner = ModelRunner(weights, limits, ctx.device, base_seed=ctx.seed, dtype=dtype,
                                     cuda_graphs=graphs == "graphs", capture_sizes=(num_reqs,))
                work = DecodeWorkload(num_reqs=num_reqs, prompt_len=ctx_len, vocab_size=config.vocab_size, block_size=block_size,
                                      num_blocks=num_blocks, token_budget=limits.max_num_batched_tokens, churn=0.0, params=PARAMS, seed=ctx.seed)
                _warm_to_decode(runner, work)
                steps = new_tokens - 4
                replays_before = runner.cuda_graph_stats()["replays"]
                if ctx.device.is_cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                host_us = _drive(runner, work, steps, async_mode=(mode == "async"))
                wall = time.perf_counter() - t0
                stats = runner.cuda_graph_stats()
                gpu_us = _gpu_kernel_us_per_step(runner, work, profiled_steps, mode == "async") if ctx.device.is_cuda else None
                wall_by_mode[mode] = wall
                tok_s[(graphs, mode)] = num_reqs * steps / wall
                tag = f"{num_reqs} reqs x {ctx_len} ctx, {graphs}, {mode}"
                out += [
                    Row("e2e", f"decode tokens/s, {tag}", tok_s[(graphs, mode)], "tok/s",
                        note=f"graph replays in the timed steps: {stats['replays'] - replays_before}/{steps}; "
                             f"over the run: {format_graph_stats(stats)}"),
                    Row("e2e", f"host us per step (execute_model), {tag}", statistics.median(host_us), "us"),
                    Row("e2e", f"wall us per step, {tag}", wall / steps * 1e6, "us"),
                ]
                if gpu_us is not None:
                    busy = gpu_us / (wall / steps * 1e6)
                    wants_busy = graphs == "graphs" and mode == "async"
                    out += [
                        Row("e2e", f"GPU kernel us per step, {tag}", gpu_us, "us"),
                        Row("e2e", f"GPU-busy fraction, {tag}", busy, "fraction",
                            target=">= 0.9" if wants_busy else None, met=(busy >= 0.9) if wants_busy else None),
                    ]
                del runner
            ratio = wall_by_mode["async"] / wall_by_mode["sync"]
            wants_overlap = graphs == "graphs" and num_reqs == 64 and ctx.device.is_cuda
            out.append(Row("e2e", f"async / sync wall time, {num_reqs} reqs, {graphs}", ratio, "x",
                           target="<= 0.77 at 64 reqs" if graphs == "graphs" else "<= 1 (async never slower)",
                           met=(ratio <= 0.77 if wants_overlap else ratio <= 1.02) if ctx.device.is_cuda else None))
        out.append(Row("e2e", f"graphs / eager decode tokens/s (async), {num_reqs} reqs",
                       tok_s[("graphs", "async")] / tok_s[("eager", "async")], "x"))
    return out


def _gpu_kernel_us_per_step(runner, work: DecodeWorkload, steps: int, async_mode: bool) -> float:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _drive(runner, work, steps, async_mode=async_mode)
        torch.cuda.synchronize()
    total = sum(e.device_time for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return total / steps
