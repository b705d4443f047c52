"""What the sampler twins (`runnercheck.impl.graph_step.SAMPLER_TWINS`, issue 58) cost at capture: graphs, seconds, memory.

    python -m runnercheck.bench.lab.twin_capture [--preset qwen3-0.6b] [--reqs 64] [--tokens 512] [--dtype bfloat16]

Builds a graphed runner (init and its first capture, every mode: cold, kernels compile; timed together), then
captures its graph manager again in the same process with one, two and three of the launch sets (the split passes
alone, the capture before issue 58; with the greedy twins; with the unfiltered twins too), then with one again;
prints the graph counts (plain and fused), the seconds and the CUDA memory reserved and allocated after each, as
one JSON line.  The warm captures are the fair comparison.  cpu works too (recording closures: milliseconds).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from runnercheck.impl.device import Device
from runnercheck.impl.graph_step import SAMPLER_TWINS
from runnercheck.impl.interface import RunnerLimits
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import ModelRunner


def _capture(runner: ModelRunner, device: Device, twins: int, seconds: float | None = None) -> dict:
    """Capture again with the first ``twins`` launch sets of `SAMPLER_TWINS` (``seconds``: the runner's own first
    capture, all of them, already done, timed by the caller)."""
    graphs = runner.graphs
    if seconds is None:
        keys = type(graphs)._keys_to_capture.__get__(graphs)
        kept = SAMPLER_TWINS[:twins]
        graphs._keys_to_capture = lambda: [k for k in keys() if (k.mode.greedy, k.mode.unfiltered) in kept]
        if device.is_cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        graphs.recapture()
        seconds = time.perf_counter() - started
    out = {"twins": twins, "graphs": len(graphs.graphs), "fused": len(graphs.fused_graphs),
           "seconds": round(seconds, 3)}
    if device.is_cuda:
        out["reserved_mib"] = round(torch.cuda.memory_reserved() / 2**20, 1)
        out["allocated_mib"] = round(torch.cuda.memory_allocated() / 2**20, 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="qwen3-0.6b")
    parser.add_argument("--reqs", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    config = preset(args.preset)
    dtype = getattr(torch, args.dtype)
    device = Device(args.device)
    limits = RunnerLimits(vocab_size=config.vocab_size, max_num_reqs=args.reqs, max_model_len=min(config.max_model_len, 1024),
                          max_num_batched_tokens=args.tokens, num_kv_blocks=args.reqs * 8 + 16, block_size=16)
    weights = random_weights(config, seed=0, dtype=dtype)
    started = time.perf_counter()
    runner = ModelRunner(weights, limits, device, dtype=dtype)  # init, then the first capture (cold: kernels compile)
    first = time.perf_counter() - started
    rows = [_capture(runner, device, len(SAMPLER_TWINS), seconds=first)]
    rows += [_capture(runner, device, twins) for twins in (1, 2, 3, 1)]
    print(json.dumps({"device": torch.cuda.get_device_name() if device.is_cuda else "cpu", "preset": args.preset,
                      "max_num_reqs": args.reqs, "max_num_batched_tokens": args.tokens,
                      "capture_sizes": list(runner.graphs.capture_sizes), "mixed_sizes": list(runner.graphs.mixed_sizes),
                      "captures": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
