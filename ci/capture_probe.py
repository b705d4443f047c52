"""Which configuration fails to capture the 64-request Qwen3-0.6B runner's graphs (run 13's spec_draft failure).

    python ci/capture_probe.py [--logprobs-shape 2048x4]

Builds the `spec_draft` bench's no-speculation runner (64 requests, 256-token prompts, graphs on) in a fresh
process and prints whether its capture passed; ``--logprobs-shape CHUNKxWARPS`` overrides the GPU default
of the logprobs pass, so two processes side by side tell whether the logprobs launch shape is involved.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
import traceback
from types import SimpleNamespace


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logprobs-shape", default="")
    args = parser.parse_args()
    import torch

    import impl.sample.sampler as sampler_module
    from bench.case_spec import _limits, _model
    from impl.device import Device
    from impl.model.weights import random_weights
    from impl.runner import ModelRunner

    if args.logprobs_shape:
        chunk, warps = (int(v) for v in args.logprobs_shape.split("x"))
        default = sampler_module.default_selection_config

        def shaped(device, candidate_capacity=None):
            return dataclasses.replace(default(device, candidate_capacity), logprobs_chunk=chunk, logprobs_warps=warps)

        sampler_module.default_selection_config = shaped
    ctx = SimpleNamespace(quick=False, seed=0)
    name, config, dtype = _model(ctx)
    weights = random_weights(config, seed=0)
    limits = _limits(ctx, config, 64, 256, 128)
    start = time.perf_counter()
    try:
        ModelRunner(weights, limits, Device("cuda"), base_seed=0, dtype=dtype)
    except Exception:
        traceback.print_exc()
        print(f"CAPTURE FAILED shape={args.logprobs_shape or 'default'} after {time.perf_counter() - start:.1f} s")
        return 1
    torch.cuda.synchronize()
    print(f"CAPTURE OK shape={args.logprobs_shape or 'default'} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
