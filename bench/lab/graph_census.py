"""The host_cost runner's CUDA graph replays: what each costs the host inside a step, and alone.

    python -m runnercheck.bench.lab.graph_census [--reqs 64 256] [--churn 0.01 0] [--steps 200] [--out FILE.json]

Under `host_profile --lines` on the H200 the churn step's mixed-graph replay cost the host 2-3x the steady
step's fused replay (runs 66 and 76: 28-35 us against 11-14, clock reads included), while a graph of 50
small kernels replays in ~5 us (`runnercheck.bench.lab.host_primitives`).  This drives the `host_cost` workload (1% churn: admitting, general and steady
steps; churn 0: steady steps), notes which graphs the runner replayed and how often, then for each of them alone:

* host us of ``CudaGraphManager.run`` as the runner called it in those steps, and of the replay call inside it
  (``in_step_replay_host_us``);
* host us of ``CUDAGraph.replay()`` of the same key's plain graph alone (the step buffer's header zeroed: it
  names no request), with the GPU idle (synchronized before each), back to back, right
  after the most replayed graph, through ``Device.enqueue``, and after conditions a step may leave behind (the
  GPU idle for 100-300 us, the CPU caches swept by 1-32 MiB of numpy work);
* device us per replay (events around a run of replays).

Replays here re-run a step's launches outside the runner's own order, so the runner is thrown away after.
cuda only.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time
from typing import Any

import numpy as np
import torch

from runnercheck.bench import case_runner
from runnercheck.bench.common import BenchContext, print_and_write_json
from runnercheck.impl.device import Device


def _timed(fn, samples: list[float], key=None):
    """``fn`` wrapped: the host us of each call appended to ``samples`` (to ``samples[key(*args, **kwargs)]``
    with ``key``)."""
    def call(*args, **kwargs):
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        (samples if key is None else samples[key(*args, **kwargs)]).append((time.perf_counter() - t0) * 1e6)
        return result
    return call


def _replayed_graphs(runner) -> dict[tuple, list[float]]:
    """Wrap the runner's `CudaGraphManager.run`: host us of each call, by (key, fused)."""
    seen: dict[tuple, list[float]] = collections.defaultdict(list)
    runner.graphs.run = _timed(runner.graphs.run, seen, key=lambda key, fused=False: (key, fused))
    return seen


def _host_us(call, times: int, sync_every: int, before=None) -> float:
    """Median host us of ``call``, the GPU synchronized before every ``sync_every``-th call (1: it finds the GPU
    idle each time; more: a short queue), ``before`` called (untimed) before each."""
    samples = []
    for i in range(times):
        if i % sync_every == 0:
            torch.cuda.synchronize()
        if before is not None:
            before()
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return round(statistics.median(samples[times // 10:]), 2)


def _device_us(call, times: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(times):
        call()
    end.record()
    end.synchronize()
    return round(start.elapsed_time(end) * 1000 / times, 2)


def _timed_replays(runner) -> tuple[dict[str, list[float]], list]:
    """Wrap each graph's replay: host us of each call as the runner makes it inside its steps, by graph."""
    timings: dict[str, list[float]] = collections.defaultdict(list)
    wrapped = []
    for fused, graphs in ((False, runner.graphs.graphs), (True, runner.graphs.fused_graphs)):
        for key, graph in graphs.items():
            # A wrapped replay is a plain callable: the step replays it itself, not through a launch thread.
            wrapped.append((graph, graph.work))
            graph.work = _timed(graph.work, timings[f"{key.describe()}{' fused' if fused else ''}"])
    return timings, wrapped


def _conditions(replay) -> dict[str, float]:
    """One graph's replay after each condition a step may leave behind: the GPU idle for a while (host spin),
    the CPU caches swept by a working set of N MiB, both."""
    out: dict[str, float] = {}

    def spin(us: float):
        def wait():
            torch.cuda.synchronize()
            end = time.perf_counter() + us * 1e-6
            while time.perf_counter() < end:
                pass
        return wait

    def sweep(mib: int):
        buf = np.zeros(mib << 17, dtype=np.int64)

        def touch():
            torch.cuda.synchronize()
            np.add(buf, 1, out=buf)
        return touch

    for name, before in (("GPU idle 0 us", spin(0)), ("GPU idle 100 us", spin(100)), ("GPU idle 300 us", spin(300)),
                         ("GPU idle, 1 MiB swept", sweep(1)), ("GPU idle, 8 MiB swept", sweep(8)),
                         ("GPU idle, 32 MiB swept", sweep(32))):
        out[name] = _host_us(replay, 120, sync_every=120, before=before)  # each condition synchronizes itself
    return out


def census(num_reqs: int, churn: float, steps: int) -> dict[str, Any]:
    device = Device("cuda", seed=0)
    runner, work, _ = case_runner.host_cost_setup(BenchContext(device, quick=False), num_reqs, churn)
    # The runner's own steps first: the isolated replays below run its graphs out of its order (and leave its
    # lanes' device counter ahead of the host's), so nothing is driven after them.
    seen = _replayed_graphs(runner)
    timings, wrapped = _timed_replays(runner)
    case_runner._drive(runner, work, steps)
    torch.cuda.synchronize()
    for graph, work in wrapped:
        graph.work = work
    out: dict[str, Any] = {"num_reqs": num_reqs, "churn": churn, "steps": steps, "graphs": []}
    out["in_step_replay_host_us"] = {
        name: {"median": round(statistics.median(v), 2), "p10": round(float(np.percentile(v, 10)), 2),
               "p90": round(float(np.percentile(v, 90)), 2), "n": len(v)} for name, v in timings.items() if v}
    # Alone, each key's plain graph (a fused one's copy-in would bring a step's header back) on a header that
    # names no request, diff or reset, as at capture: hundreds of replays then change no row.
    runner.graphs.inputs.header.zero_()
    first = None
    for (key, fused), run_us in sorted(seen.items(), key=lambda item: -len(item[1])):
        graph = runner.graphs.graphs[key]
        replay = graph.cuda_graph.replay
        row = {"graph": key.describe(), "fused": fused, "replays_in_run": len(run_us),
               "in_step_graphs_run_us": round(statistics.median(run_us), 2),
               "host_us_gpu_idle": _host_us(replay, 200, sync_every=1),
               "host_us_back_to_back": _host_us(replay, 200, sync_every=8),
               "device_us": _device_us(replay, 50),
               "host_us_via_device_enqueue_gpu_idle": _host_us(lambda: device.enqueue(replay, graph.label), 200,
                                                               sync_every=1)}
        row["after_conditions"] = _conditions(replay)
        if first is None:
            first = graph
        else:  # a step of this graph right after one of the most replayed graph's (a churn run's order)
            row["host_us_after_the_most_replayed"] = _host_us(replay, 200, sync_every=4, before=first.cuda_graph.replay)
        out["graphs"].append(row)
    torch.cuda.synchronize()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reqs", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--churn", type=float, nargs="+", default=[case_runner.HOST_COST_CHURN, 0.0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("graph_census needs a GPU (the graphs are CUDA graphs)")
    result = {"unit": "us (median)", "runs": [census(n, c, args.steps) for n in args.reqs for c in args.churn]}
    print_and_write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
