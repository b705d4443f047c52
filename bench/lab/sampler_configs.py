"""The product sampler under launch-shape overrides, side by side in one process: which default to take.

    python -m runnercheck.bench.lab.sampler_configs [--rows 1 8 64 256] [--field block_maxnreg]
        [--values 0 64 80 96 112] [--configs temperature all+penalties]

For each value of one `SelectionConfig` field, `Sampler.sample` over bench_sampler's sampling configurations
(`runnercheck.bench.case_sampler.SAMPLER_CONFIGS`, with the runner's launch set for each: ``greedy`` runs the
all-greedy launch, a configuration without a filter skips the filter launches) at each row count,
timed graph-replayed as bench_sampler times it, every value's tokens compared with the first value's.
Values alternate within each (configuration, rows) cell, so a drift of the machine touches every value alike.
Prints one JSON line per measurement (device microseconds).  Not a product feature: the lab.
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import torch


def main(argv: list[str] | None = None) -> int:
    from runnercheck.bench.case_sampler import (SAMPLER_CONFIGS, _graph_time_us, _prepared_state, _random_logits,
                                                _runner_flags)
    from runnercheck.bench.common import BenchContext
    from runnercheck.impl.device import Device
    from runnercheck.impl.sample.logprobs import default_selection_config
    from runnercheck.impl.sample.sampler import Sampler

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--field", default="block_maxnreg")
    parser.add_argument("--values", type=int, nargs="+", default=[0, 64, 80, 96, 112])
    parser.add_argument("--configs", nargs="+", default=list(SAMPLER_CONFIGS))
    parser.add_argument("--repeats", type=int, default=2, help="timings of each value per cell, interleaved")
    args = parser.parse_args(argv)
    dev = Device("cuda")
    ctx = BenchContext(device=dev, quick=False)
    max_rows = max(args.rows)
    logits = _random_logits(ctx, max_rows, args.vocab)
    rows_map = dev.to_device(torch.arange(max_rows, dtype=torch.int32))
    positions = dev.to_device(torch.arange(max_rows, dtype=torch.int64) + 100)
    base = default_selection_config(dev)
    samplers = {v: Sampler(dev, args.vocab, max_num_rows=max_rows,
                           config=dataclasses.replace(base, **{args.field: v})) for v in args.values}
    for name in args.configs:
        params = SAMPLER_CONFIGS[name]
        state = _prepared_state(ctx, max_rows, args.vocab, params)
        flags = _runner_flags(params, name == "greedy")
        for rows in args.rows:
            tokens = {}
            for v, sampler in samplers.items():
                sampler.sample(logits, state, rows_map, positions, num_rows=rows, **flags)
                torch.cuda.synchronize()
                tokens[v] = sampler.tokens[:rows].clone()
            same = {v: bool(torch.equal(t, tokens[args.values[0]])) for v, t in tokens.items()}
            for _ in range(args.repeats):
                for v, sampler in samplers.items():
                    us = _graph_time_us(lambda s=sampler, r=rows: s.sample(logits, state, rows_map, positions,
                                                                             num_rows=r, **flags))
                    print(json.dumps({"config": name, "rows": rows, args.field: v, "us": round(us, 2),
                                      "same_tokens": same[v]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
