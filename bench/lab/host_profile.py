"""Where the host time of a decode step goes: cProfile of ``execute_model`` (forward stubbed).

    python -m runnercheck.bench.lab.host_profile [--device cuda] [--reqs 64] [--steps 100] [--top 40] [--churn 0]
                                 [--phases | --trace | --cpu-time [--sweep-kib KIB ...] | --lines MODULE:QUALNAME [--lines ...]
                                  [--depth N]]

The same workload and runner set-up as the `host_cost` benchmark (`runnercheck.bench.case_runner`), with the
profiler enabled only inside ``execute_model``; prints the median host time per step with and
without the profiler, then the functions with the most own time.  On CPU the Triton interpreter
runs the kernels inline, so there the profile is dominated by kernel bodies, unless
``--drop-device-work`` makes ``Device.enqueue`` a no-op: what remains is the runner's Python
bookkeeping alone (outputs are garbage then; a measuring aid, never a correctness run).
``--phases`` times the pieces of ``execute_model`` (`PHASES`) with wrappers instead of the profiler;
``--trace`` runs torch.profiler instead (host self time per operator and CUDA runtime call, device time).
``--cpu-time`` sets each step's wall time against the CPU time its thread spent in it (and the launch thread's);
``--sweep-kib 0 8192`` writes that much other memory before each step, sizes in turn: what cold caches cost it.
``--lines runnercheck.impl.runner:ModelRunner._execute`` times each statement of one function or method instead: its
source, compiled again with a clock read before every statement (``--depth``: also inside that many levels of
if/for/with bodies), replaces it for the run; each read costs ~0.1 us on the dev box, counted in the statement
after it; several ``--lines`` time several functions over the same steps.  With churn, each statement's median is
also given over the steps that admitted a request and over the others, and their difference: where an admission's
cost lands.  A function that uses a closure cell (``super()``, a nested function's free names) is refused.
"""
from __future__ import annotations

import argparse
import ast
import bisect
import cProfile
import importlib
import inspect
import io
import pstats
import statistics
import sys
import textwrap
import time
from typing import Sequence

import numpy as np

from runnercheck.bench import case_runner
from runnercheck.bench.common import BenchContext
from runnercheck.impl.device import Device
from runnercheck.impl.kernels.launch import launch_stats


def profile_host(device: Device, num_reqs: int, steps: int, top: int, drop_device_work: bool = False,
                 churn: float = case_runner.HOST_COST_CHURN) -> str:
    from runnercheck.impl.graphs import format_graph_stats

    if drop_device_work:
        case_runner.drop_device_work(device)
    runner, work, _ = case_runner.host_cost_setup(BenchContext(device, quick=False), num_reqs, churn)
    before = runner.cuda_graph_stats()
    enqueued = device.num_enqueued
    plain = case_runner._drive(runner, work, steps)
    steady = runner.last_step_stats.steady
    enqueues = (device.num_enqueued - enqueued) / steps  # copies, launches and graph replays the host issued
    counter = case_runner.TorchCallCounter()  # tensor ops the host issues (outside dropped device work only)
    case_runner._drive(runner, work, 10, around=lambda: counter)
    profiler = cProfile.Profile()  # a context manager: enabled only around each execute_model call
    profiled = case_runner._drive(runner, work, steps, around=lambda: profiler)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    after = runner.cuda_graph_stats()
    bucketed = after["replays"] + after["padded_eager"] - before["replays"] - before["padded_eager"]
    dropped = ", device work dropped" if drop_device_work else ""
    stats = launch_stats()
    launch_line = f"Triton launches since start: {stats['fast']} through the cached launcher, {stats['slow']} through kernel[grid]\n"
    return (f"{device.kind}{dropped}, {num_reqs} decode requests, churn {churn}, {steps} steps: median execute_model host time "
            f"{statistics.median(plain):.0f} us ({statistics.median(profiled):.0f} us under cProfile); "
            f"{enqueues:.1f} host enqueues and {counter.count / 10:.1f} torch calls per step; bucketed steps "
            f"{bucketed}/{2 * steps + 10} ({format_graph_stats(after)}); last step read as steady: {steady}\n"
            f"{launch_line}{text.getvalue()}")


# A step's pieces, as (owner attribute of the runner or "" for the runner itself, method name): the general
# step's, then those only the fused steady step (`ModelRunner._execute_steady`) calls by name.
PHASES = (("", "_check"), ("", "_update_rows"), ("input_batch", "stage"), ("graphs", "select"), ("staged_writes", "flush"),
          ("", "_enqueue_applies"), ("", "_enqueue_device_step"), ("", "_enqueue_output"), ("state", "mark_used"),
          ("state", "advance"), ("", "_record_stats"), ("", "_execute_steady"), ("", "_pack_for_graph"),
          ("state", "apply_cached"), ("block_table", "append_many"), ("state", "plan_rows"), ("staging", "submit"),
          ("outputs", "enqueue_copy_out"), ("graphs", "run"), ("staging", "seek_free"), ("outputs", "seek_free"),
          ("lanes", "fits"), ("staging", "submit_enqueued"),
          # the eager step's device work, by owner (closures call them when the stream runs them: at once on cuda)
          ("input_batch", "enqueue_prepare"), ("sampler", "sample"),
          ("sampling_state", "flush"), ("sampling_state", "enqueue_post_update"), ("staging", "acquire"),
          ("outputs", "acquire"))


def time_phases(device: Device, num_reqs: int, steps: int, drop_device_work: bool = False,
                churn: float = case_runner.HOST_COST_CHURN) -> str:
    """Median host microseconds of each piece of ``execute_model`` (`PHASES`), timed by wrappers on this
    runner's own objects (~0.3 us each on the dev box, so the pieces sum to a little more than the step)."""
    if drop_device_work:
        case_runner.drop_device_work(device)
    runner, work, _ = case_runner.host_cost_setup(BenchContext(device, quick=False), num_reqs, churn)
    samples: dict[str, list[float]] = {}

    def timed(fn, name: str):
        samples[name] = []

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                samples[name].append((time.perf_counter() - start) * 1e6)
        return wrapper

    for owner_name, method in PHASES:
        owner = getattr(runner, owner_name) if owner_name else runner
        setattr(owner, method, timed(getattr(owner, method), f"{owner_name or 'runner'}.{method}"))
    samples["execute_model"] = case_runner._drive(runner, work, steps)
    lines = [f"{device.kind}{', device work dropped' if drop_device_work else ''}, {num_reqs} decode requests, churn {churn}, "
             f"{steps} steps: median host us per piece of execute_model (steps where it ran)"]
    for name, values in sorted(samples.items(), key=lambda kv: -statistics.median(kv[1] or [0.0])):
        if values:
            lines.append(f"  {statistics.median(values):8.1f}  {name}  ({len(values)} calls)")
    return "\n".join(lines)


def time_cpu(device: Device, num_reqs: int, steps: int, drop_device_work: bool = False,
             churn: float = case_runner.HOST_COST_CHURN, sweep_kib: Sequence[int] = (0,)) -> str:
    """Each step's wall time against the CPU time its thread spent in it (and the device's launch thread, when it has
    one), medians over the admitting steps and the others: whether ``execute_model`` computes for all of its wall
    time, or waits or is descheduled for part of it.  The clocks sit inside the timed region (~1 us a step).

    ``sweep_kib``: before step i (outside its clocks), write ``sweep_kib[i % len(sweep_kib)]`` KiB of other memory,
    evicting that much of what the step last left in the caches; the figures come per size, from steps interleaved
    under one set of host conditions.  How a step's time grows with the sweep says how much of it is cache misses."""
    if drop_device_work:
        case_runner.drop_device_work(device)
    runner, work, _ = case_runner.host_cost_setup(BenchContext(device, quick=False), num_reqs, churn)
    launcher = getattr(device, "launcher", None)
    samples: list[tuple[float, float, float]] = []  # per step: wall, this thread's CPU, the launch thread's CPU (us)
    sweeps = [np.zeros(kib * 128, np.uint64) for kib in sweep_kib]  # 128 eight-byte words a KiB

    class Clocks:
        def __enter__(self) -> None:
            sweep(sweeps[len(samples) % len(sweeps)])
            self.start = (time.perf_counter(), time.thread_time(), launcher.cpu_seconds() if launcher else 0.0)

        def __exit__(self, *exc: object) -> None:
            now = (time.perf_counter(), time.thread_time(), launcher.cpu_seconds() if launcher else 0.0)
            samples.append(tuple(1e6 * (b - a) for a, b in zip(self.start, now)))

    clocks = Clocks()
    runner_steps = case_runner._RunnerSteps(runner, work, around=lambda: clocks)
    for _ in range(steps):
        runner_steps.step()
    runner_steps.finish()
    admitting = runner_steps.admitting[-steps:]
    lines = [f"{device.kind}{', device work dropped' if drop_device_work else ''}, {num_reqs} decode requests, churn {churn}, "
             f"{steps} steps: median us a step, wall against CPU time (thread_time; the launch thread's: "
             f"{'cpu_seconds' if launcher else 'none here'})"]
    for k, kib in enumerate(sweep_kib):
        if len(sweep_kib) > 1 or kib:
            lines.append(f" after {kib} KiB swept before each step:")
        for name, wanted in (("admitting steps", True), ("other steps", False)):
            chosen = [sample for i, (sample, admits) in enumerate(zip(samples, admitting))
                      if admits == wanted and i % len(sweep_kib) == k]
            if chosen:
                wall, cpu, worker = (statistics.median(values) for values in zip(*chosen))
                gap = statistics.median(w - c for w, c, _ in chosen)
                lines.append(f"  {name} ({len(chosen)}): wall {wall:.1f}, CPU {cpu:.1f}, wall - CPU {gap:.1f}, "
                             f"launch thread CPU {worker:.1f}")
    return "\n".join(lines)


def sweep(words: np.ndarray) -> None:
    """Write every word of ``words`` (each of its cache lines becomes this core's, what it held there evicted)."""
    np.add(words, 1, out=words)


def trace_steps(device: Device, num_reqs: int, steps: int, top: int, churn: float = case_runner.HOST_COST_CHURN) -> str:
    """torch.profiler over ``steps`` steps: where the host time goes by operator and CUDA runtime call (self
    time, the profiler's own cost included), and the device time the same steps queued.  Says whether the
    host's time is Python or the CUDA API, and whether the GPU keeps up with the host."""
    from torch.profiler import ProfilerActivity, profile

    runner, work, _ = case_runner.host_cost_setup(BenchContext(device, quick=False), num_reqs, churn)
    plain = case_runner._drive(runner, work, steps)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.is_cuda else [])
    with profile(activities=activities) as prof:
        profiled = case_runner._drive(runner, work, steps)
    after = case_runner._drive(runner, work, steps)  # whether a profiler session leaves a cost behind it
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA") / steps
    table = events.table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=60)
    return (f"{device.kind}, {num_reqs} decode requests, churn {churn}, {steps} steps: median execute_model host time "
            f"{statistics.median(plain):.0f} us ({statistics.median(profiled):.0f} us under torch.profiler, "
            f"{statistics.median(after):.0f} us after it); "
            f"device time queued per step {device_us:.0f} us; last step read as steady: {runner.last_step_stats.steady}\n"
            f"{table}")


def _instrumented(fn, depth: int) -> tuple[object, list[tuple[int, str]], list[tuple[int, float]]]:
    """``fn`` compiled again with a clock read before each statement (to ``depth`` levels of nested bodies) and
    after its last: (the new function, (line, source) of each statement, the (statement, time) list it appends to)."""
    if fn.__code__.co_freevars:
        raise ValueError(f"{fn.__qualname__} uses closure cells {fn.__code__.co_freevars}: it cannot be recompiled alone")
    lines, first = inspect.getsourcelines(fn)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    ast.increment_lineno(tree, first - 1)
    func = tree.body[0]
    func.decorator_list = []
    labels: list[tuple[int, str]] = []

    def marked(body: list[ast.stmt], level: int) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for statement in body:
            labels.append((statement.lineno, ast.unparse(statement).splitlines()[0]))
            mark = ast.parse(f"__rc_marks.append(({len(labels) - 1}, __rc_clock()))").body[0]
            if level < depth and isinstance(statement, (ast.If, ast.For, ast.While, ast.With)):
                statement.body = marked(statement.body, level + 1)
                if getattr(statement, "orelse", None):
                    statement.orelse = marked(statement.orelse, level + 1)
            out += [mark, statement]
        return out

    end = ast.parse("__rc_marks.append((-1, __rc_clock()))").body[0]
    func.body = [ast.Try(body=marked(func.body, 0), handlers=[], orelse=[], finalbody=[end])]
    ast.fix_missing_locations(tree)
    marks: list[tuple[int, float]] = []
    namespace = dict(fn.__globals__, __rc_marks=marks, __rc_clock=time.perf_counter)
    exec(compile(tree, inspect.getsourcefile(fn), "exec"), namespace)
    return namespace[func.name], labels, marks


def _resolve(target: str) -> tuple[object, str, object]:
    """(owner, attribute name, function) of ``target`` ("module:Qualname")."""
    module_name, _, qualname = target.partition(":")
    if not qualname:
        raise ValueError(f"--lines {target!r}: expected MODULE:QUALNAME, e.g. impl.runner:ModelRunner._execute")
    owner = importlib.import_module(module_name)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name, getattr(owner, name)


def time_lines(device: Device, num_reqs: int, steps: int, targets: list[str], depth: int = 0,
               drop_device_work: bool = False, churn: float = case_runner.HOST_COST_CHURN) -> str:
    """Median host microseconds of each statement of each of ``targets`` ("module:Qualname") over ``steps`` steps
    of one runner (one set-up for all of them; a timed function that calls another timed one counts the inner
    one's clock reads in the calling statement)."""
    resolved = [_resolve(target) for target in targets]
    timed = [(owner, name, original, *_instrumented(inspect.unwrap(original), depth))
             for owner, name, original in resolved]
    if drop_device_work:
        case_runner.drop_device_work(device)
    runner, work, _ = case_runner.host_cost_setup(BenchContext(device, quick=False), num_reqs, churn)
    # A module function may have been imported by name elsewhere: every module holding it gets the timed one
    # (looked for after the set-up, which imports the runner's modules).
    swaps = []
    for owner, name, original, new, _, _ in timed:
        holders = [owner] + ([m for m in list(sys.modules.values()) if m is not owner and getattr(m, name, None) is original]
                             if inspect.ismodule(owner) else [])
        swaps += [(holder, name, original, new) for holder in holders]
    for holder, name, original, new in swaps:
        setattr(holder, name, new)
        for timed_fn in (entry[3] for entry in timed):  # their globals are copies: a timed caller finds the timed callee
            if timed_fn.__globals__.get(name) is original:
                timed_fn.__globals__[name] = new
    step_starts: list[tuple[int, ...]] = []  # per step: where it begins in each timed function's marks

    class StepStart:
        def __enter__(self) -> None:
            step_starts.append(tuple(len(entry[5]) for entry in timed))

        def __exit__(self, *exc: object) -> None:
            pass

    start = StepStart()
    runner_steps = case_runner._RunnerSteps(runner, work, around=lambda: start)
    try:
        for _ in range(steps):
            runner_steps.step()
        runner_steps.finish()
    finally:
        for holder, name, original, _ in swaps:
            setattr(holder, name, original)
    out = []
    for k, (target, (_, _, _, _, labels, marks)) in enumerate(zip(targets, timed)):
        starts = [positions[k] for positions in step_starts]
        # Each mark's step: whether it admitted (the step whose start is the last at or before the mark).
        admitting = [runner_steps.admitting[bisect.bisect_right(starts, i) - 1] for i in range(len(marks))]
        out += _statement_table(device, num_reqs, churn, steps, target, drop_device_work, labels, marks, admitting)
    return "\n".join(out)


def _statement_table(device: Device, num_reqs: int, churn: float, steps: int, target: str, drop_device_work: bool,
                     labels: list[tuple[int, str]], marks: list[tuple[int, float]], admitting: list[bool]) -> list[str]:
    """The statements' medians (and times run) over all steps, then, when both kinds ran them, over the admitting
    steps and the others, and the difference: admitting - other."""
    samples: dict[int, tuple[list[float], list[float]]] = {}  # statement -> (admitting steps' times, the others')
    for (index, start), (_, stop), admits in zip(marks, marks[1:], admitting):
        if index >= 0:
            samples.setdefault(index, ([], []))[0 if admits else 1].append((stop - start) * 1e6)
    calls = sum(1 for index, _ in marks if index == -1)
    split = any(adm and other for adm, other in samples.values())
    out = [f"{device.kind}{', device work dropped' if drop_device_work else ''}, {num_reqs} decode requests, churn {churn}, "
           f"{steps} steps: {target} ran {calls} times; median host us per statement (times it ran), a clock read each"
           + ("; then over admitting steps / the others, and the difference" if split else "")]
    for index in sorted(samples):
        line, text = labels[index]
        adm, other = samples[index]
        row = f"  {statistics.median(adm + other):8.2f}  ({len(adm) + len(other):5d})"
        if split:
            by_kind = [f"{statistics.median(v):7.2f}" if v else "      -" for v in (adm, other)]
            delta = f"{statistics.median(adm) - statistics.median(other):+7.2f}" if adm and other else "      -"
            row += f"  {by_kind[0]} / {by_kind[1]}  {delta}"
        out.append(f"{row}  {line:5d}  {text[:100]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu", "sim"])
    parser.add_argument("--reqs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--churn", type=float, default=case_runner.HOST_COST_CHURN,
                        help="share of the batch replaced per step (0: uniform decode steps, which replay a graph)")
    parser.add_argument("--phases", action="store_true",
                        help="time each piece of execute_model (wrappers, no profiler) instead of the cProfile listing")
    parser.add_argument("--drop-device-work", action="store_true",
                        help="make Device.enqueue a no-op: time the Python bookkeeping alone (cpu/sim only)")
    parser.add_argument("--trace", action="store_true",
                        help="torch.profiler instead: host self time by operator and CUDA runtime call, device time per step")
    parser.add_argument("--lines", metavar="MODULE:QUALNAME", action="append",
                        help="time each statement of one function or method instead (e.g. impl.runner:ModelRunner._execute); "
                             "repeat it to time several in one run")
    parser.add_argument("--depth", type=int, default=0, help="with --lines: also time statements nested this deep")
    parser.add_argument("--cpu-time", action="store_true",
                        help="each step's wall time against its thread's CPU time (and the launch thread's) instead")
    parser.add_argument("--sweep-kib", type=int, nargs="+", default=[0], metavar="KIB",
                        help="with --cpu-time: write this much other memory before each step, the sizes taken in turn "
                             "(e.g. 0 1024 8192): what cold caches cost a step")
    args = parser.parse_args(argv)
    if args.reqs < 1 or args.steps < 1 or args.top < 1 or args.depth < 0:
        parser.error("--reqs, --steps and --top must be >= 1, --depth >= 0")
    if sum(map(bool, (args.phases, args.trace, args.lines, args.cpu_time))) > 1:
        parser.error("--phases, --trace, --lines and --cpu-time are one choice each")
    if not 0 <= args.churn <= 1:
        parser.error("--churn must be in [0, 1]")
    if min(args.sweep_kib) < 0 or (args.sweep_kib != [0] and not args.cpu_time):
        parser.error("--sweep-kib takes sizes >= 0, with --cpu-time")
    device = Device(args.device, seed=0)
    if args.drop_device_work and device.is_cuda:
        parser.error("--drop-device-work is for cpu/sim: on cuda the launches are part of the host cost")
    if args.lines:
        try:
            print(time_lines(device, args.reqs, args.steps, args.lines, args.depth, args.drop_device_work, args.churn))
        except (ValueError, ImportError, AttributeError, TypeError, OSError) as err:
            parser.error(f"--lines {' '.join(args.lines)}: {err}")
    elif args.trace:
        print(trace_steps(device, args.reqs, args.steps, args.top, args.churn))
    elif args.cpu_time:
        print(time_cpu(device, args.reqs, args.steps, args.drop_device_work, args.churn, args.sweep_kib))
    elif args.phases:
        print(time_phases(device, args.reqs, args.steps, args.drop_device_work, args.churn))
    else:
        print(profile_host(device, args.reqs, args.steps, args.top, args.drop_device_work, args.churn))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
