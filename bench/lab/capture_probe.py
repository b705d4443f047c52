"""Which configuration fails to capture the 64-request Qwen3-0.6B runner's graphs (run 13's spec_draft failure).

    python bench/lab/capture_probe.py [--logprobs-shape 2048x4] [--after-arm off|draft|self]

Builds the `spec_draft` bench's no-speculation runner (64 requests, 256-token prompts, graphs on) in a fresh
process and prints whether its capture passed; ``--logprobs-shape CHUNKxWARPS`` overrides the GPU default
of the logprobs pass, so two processes side by side tell whether the logprobs launch shape is involved.
``--after-arm ARM`` first runs that one 8-request arm of the bench in the same process (``off``: no
speculation, ``draft``: the ``-draft`` preset, ``self``: the target drafting for itself), so processes
side by side tell which earlier runner leaves the state the failing capture trips on.
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
    parser.add_argument("--after-arm", choices=["", "off", "draft", "self"], default="")
    args = parser.parse_args()
    import torch

    import runnercheck.impl.sample.sampler as sampler_module
    from runnercheck.bench.case_spec import NUM_SPEC_TOKENS, _limits, _model, _run_arm
    from runnercheck.bench.common import BenchContext
    from runnercheck.impl.device import Device
    from runnercheck.impl.model.weights import random_weights
    from runnercheck.impl.runner import ModelRunner

    if args.logprobs_shape:
        chunk, warps = (int(v) for v in args.logprobs_shape.split("x"))
        default = sampler_module.default_selection_config

        def shaped(device, candidate_capacity=None):
            return dataclasses.replace(default(device, candidate_capacity), logprobs_chunk=chunk, logprobs_warps=warps)

        sampler_module.default_selection_config = shaped
    ctx = SimpleNamespace(quick=False, seed=0)
    name, config, dtype = _model(ctx)
    weights = random_weights(config, seed=0)
    if args.after_arm:
        import random

        bench_ctx = BenchContext(Device("cuda"), quick=False, seed=0)
        small = _limits(bench_ctx, config, 8, 256, 128)
        rng = random.Random(0)
        prompts = [[rng.randrange(config.vocab_size) for _ in range(256)] for _ in range(8)]
        k, draft = {"off": (0, ""), "draft": (NUM_SPEC_TOKENS, f"{name}-draft"), "self": (NUM_SPEC_TOKENS, name)}[args.after_arm]
        seconds, produced, _, steps, _ = _run_arm(bench_ctx, weights, small, dtype, prompts, 128, k, draft, 1.0)
        torch.cuda.synchronize()
        print(f"8-request arm {args.after_arm!r}: {produced} tokens in {steps} steps, {seconds:.1f} s")
    limits = _limits(ctx, config, 64, 256, 128)
    start = time.perf_counter()
    try:
        ModelRunner(weights, limits, Device("cuda"), base_seed=0, dtype=dtype)
    except Exception:
        traceback.print_exc()
        print(f"CAPTURE FAILED shape={args.logprobs_shape or 'default'} after_arm={args.after_arm or '-'} after {time.perf_counter() - start:.1f} s")
        return 1
    torch.cuda.synchronize()
    print(f"CAPTURE OK shape={args.logprobs_shape or 'default'} after_arm={args.after_arm or '-'} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
