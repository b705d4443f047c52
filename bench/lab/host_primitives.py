"""Host microseconds of the primitives one steady decode step is built from, on this machine.

    python -m runnercheck.bench.lab.host_primitives [--out FILE.json]

The runner's steady step (`runnercheck.impl.step_reader.read_steady_step`, one graph replay) is a few dozen
of these: small numpy operations over a 256-request batch, C-level passes over the scheduler's
tuples, and on a GPU the H2D copy, the graph replay, the output copy and the event record.  Their
costs differ from machine to machine (a lent H200 host runs Python ~2x slower than the 2-core dev
box), so this prints them side by side for one machine: which of the step's pieces can still be
cut, and what a CUDA call costs there.  Each figure is the median of 2000 calls after 50 warm-up
calls; compare figures of one run only.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from runnercheck.bench.common import print_and_write_json
from runnercheck.bench.timing import host_time_us
from runnercheck.impl.device import Device

NUM_REQS = 256


@dataclass(slots=True)
class _Three:
    a: int
    b: int
    c: int


def _median_us(fn: Callable[[], object], calls: int = 2000) -> float:
    host_time_us(fn, 50)  # warm-up
    return round(statistics.median(host_time_us(fn, calls)), 2)


def _host_primitives() -> dict[str, float]:
    rows = np.arange(NUM_REQS, dtype=np.int64)
    values = list(range(NUM_REQS))
    scheduled = {f"r{i}": 1 for i in range(NUM_REQS)}
    short = rows[:64]
    return {
        "python call": _median_us(lambda: None),
        "numpy gather [256]": _median_us(lambda: rows[rows]),
        "numpy add scalar [256]": _median_us(lambda: rows + 1),
        "numpy count_nonzero(compare) [256]": _median_us(lambda: np.count_nonzero(rows > 5)),
        "ndarray.tolist [256]": _median_us(lambda: rows.tolist()),
        "set(map(type, list)) [256] (the type check)": _median_us(lambda: set(map(type, values))),
        "tuple(dict) [256]": _median_us(lambda: tuple(scheduled)),
        "list(dict.values()) [256]": _median_us(lambda: list(scheduled.values())),
        # What one array object (a view too) and one small record cost against one Python call: a step's reading and
        # plan make several of each.
        "numpy empty [64] int32 (a new array)": _median_us(lambda: np.empty(64, np.int32)),
        "numpy slice [:65] (a new view)": _median_us(lambda: rows[:65]),
        "ndarray.astype int32 [64]": _median_us(lambda: short.astype(np.int32)),
        "slots dataclass, 3 fields": _median_us(lambda: _Three(1, 2, 3)),
    }


def _cuda_primitives() -> dict[str, float]:
    device = Device("cuda")
    stream = device.stream
    pinned = torch.empty(4096, dtype=torch.uint8, pin_memory=True)
    on_device = torch.empty(4096, dtype=torch.uint8, device=device.torch_device)
    out: dict[str, float] = {}
    out["H2D copy_ 4 KiB pinned, non_blocking"] = _median_us(lambda: on_device.copy_(pinned, non_blocking=True))
    out["D2H copy_ 4 KiB pinned, non_blocking"] = _median_us(lambda: pinned.copy_(on_device, non_blocking=True))
    out["torch.cuda.Event() + record() (current stream)"] = _median_us(lambda: torch.cuda.Event().record())
    out["torch.cuda.Event() + record(stream)"] = _median_us(lambda: torch.cuda.Event().record(stream))
    out["Device.record_event (base-class calls)"] = _median_us(device.record_event)
    # Against "torch.cuda.Event() + record(stream)" (created, recorded, destroyed when dropped): what reusing one saves.
    reused = torch.cuda.Event()
    out["torch.cuda.Event reused: record(stream) only"] = _median_us(lambda: reused.record(stream))
    event = device.record_event()
    out["DeviceEvent.query"] = _median_us(event.query)
    out["Device.enqueue(no-op), outside on_stream"] = _median_us(lambda: device.enqueue(lambda: None))
    with device.on_stream():
        out["Device.enqueue(no-op), inside on_stream"] = _median_us(lambda: device.enqueue(lambda: None))

    def stream_scope() -> None:
        with device.on_stream():
            pass

    out["Device.on_stream enter + exit"] = _median_us(stream_scope)
    x = torch.zeros(NUM_REQS, device=device.torch_device)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            x + 1  # warm-up off the default stream before capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        y = x
        for _ in range(50):
            y = y + 1
    out["CUDAGraph.replay, 50 small kernels"] = _median_us(graph.replay, 1000)
    torch.cuda.synchronize()
    out["one small torch op (x.add_(1))"] = _median_us(lambda: x.add_(1))
    torch.cuda.synchronize()
    out.update(_cuda_in_situ(on_device, pinned, graph))
    out.update(_launch_pieces(device))
    return out


def _launch_pieces(device: Device) -> dict[str, float]:
    """One Triton launch with the argument shape of the runner's eager kernels (16 tensors, 4 ints, a
    constexpr), whole and by piece: Triton's own ``kernel[grid]``, `runnercheck.impl.kernels.launch.launch` (a seen
    key), its gate, its key, and the compiled launcher alone."""
    from runnercheck.bench.lab.launch_probe import probe_kernel
    from runnercheck.impl.kernels import launch as fast

    tensors = [device.zeros(64, torch.int32) for _ in range(16)]
    ints = (3, 5, 7, 11)
    args = (*tensors, *ints)
    grid = (1,)
    out: dict[str, float] = {}
    out["launch: kernel[grid](16 tensors, 4 ints)"] = _median_us(lambda: probe_kernel[grid](*args, BLOCK=64), 1000)
    fast.launch(probe_kernel, grid, *args, BLOCK=64)  # the key seen once: later calls take the cached launcher
    out["launch: impl.kernels.launch, seen key"] = _median_us(lambda: fast.launch(probe_kernel, grid, *args, BLOCK=64), 1000)
    out["launch: its gate (_launch_gate_open)"] = _median_us(fast._launch_gate_open, 1000)
    plan = fast._plan_of(probe_kernel)
    ordered = [*args, 64]
    kwargs = {"BLOCK": 64}
    index = torch._C._cuda_getDevice()
    out["launch: its key (call_key)"] = _median_us(lambda: fast.call_key(plan, ordered, index, kwargs), 1000)
    compiled = plan.compiled[fast.call_key(plan, ordered, index, kwargs)]
    stream = torch._C._cuda_getCurrentRawStream(index)
    out["launch: the compiled launcher alone (compiled.run)"] = _median_us(
        lambda: compiled.run(1, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None, *ordered), 1000)
    torch.cuda.synchronize()
    return out


# ~200 us of GPU time at the H200's ~2 GHz: the queue a step finds when the GPU is behind the host.
_BUSY_CYCLES = 400_000


def _cuda_in_situ(on_device: torch.Tensor, pinned: torch.Tensor, graph: torch.cuda.CUDAGraph) -> dict[str, float]:
    """A step's three submissions (H2D copy, graph replay, D2H copy), each timed alone under the conditions a
    step meets: called back to back, after ~30 us of Python and numpy work (a step's own), with the GPU idle
    (synchronized before) or busy (a ~200 us kernel queued before).  A call that costs several times its
    back-to-back figure in a step is paying for the conditions, not for itself."""
    scratch = np.zeros(1 << 16, dtype=np.int64)  # 512 KiB: the step's working set, roughly
    values = list(range(NUM_REQS))

    def python_work() -> None:
        np.add(scratch, 1, out=scratch)
        set(map(type, values))
        sum(values)

    def busy() -> None:
        torch.cuda._sleep(_BUSY_CYCLES)

    conditions = {"back to back": (), "after Python work": (python_work,), "GPU idle": (torch.cuda.synchronize,),
                  "GPU busy": (busy,), "GPU busy, after Python work": (busy, python_work),
                  "GPU idle, after Python work": (torch.cuda.synchronize, python_work)}
    calls = {"H2D copy_ 4 KiB": lambda: on_device.copy_(pinned, non_blocking=True),
             "CUDAGraph.replay (50 kernels)": graph.replay,
             "D2H copy_ 4 KiB": lambda: pinned.copy_(on_device, non_blocking=True)}
    out: dict[str, float] = {}
    for call_name, call in calls.items():
        for condition, befores in conditions.items():
            samples = []
            for i in range(400):
                if i % 8 == 0:
                    torch.cuda.synchronize()  # keep the queue short: no launch waits for queue space
                for before in befores:
                    before()
                t0 = time.perf_counter()
                call()
                samples.append((time.perf_counter() - t0) * 1e6)
            out[f"in situ: {call_name}, {condition}"] = round(statistics.median(samples[40:]), 2)
    torch.cuda.synchronize()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    result = {"machine": "cuda" if torch.cuda.is_available() else "cpu", "unit": "us (median)",
              "host": _host_primitives()}
    if torch.cuda.is_available():
        result["cuda"] = _cuda_primitives()
    print_and_write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
