"""Sweep the launch shape of the top-n logprobs kernels (`runnercheck.impl.sample.logprobs.SelectionConfig`).

    python -m runnercheck.bench.lab.tune_selection --device cuda --out DIR     (job ``tune_logprobs`` of ci/h200.sh)

For every shape in `SHAPES` (``logprobs_chunk``, ``logprobs_warps``, ``logprobs_sub``, ``logprobs_candidates``,
``logprobs_maxnreg`` over the GPU default): device time of top-20 logprobs on the benchmark's
[rows, 151936] fp32 logits (rows 1, 8, 256; graph-replayed, as `runnercheck bench` times them), the
same at 256 rows without a top-n (``us_256_no_top``: the pass and the log-sum-exp alone, so the
top-n's share shows), how many rows the row finish decided (the rest took the per-row fallback),
and whether its outputs equal the default configuration's (rank and top ids exactly, logprob and
top logprobs to fp32 rounding): a shape that changes a result is reported as wrong, never as fast.
Writes ``DIR/tune_logprobs.json`` (one record per shape) and prints the table, fastest at 256 rows
first.  A tool for choosing `default_selection_config`, not a benchmark of record: `runnercheck
bench` times the chosen shape.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path

import torch

from runnercheck.bench.case_sampler import LOGPROBS_TOP, _graph_time_us
from runnercheck.bench.common import BenchContext
from runnercheck.impl.device import Device
from runnercheck.impl.sample.logprobs import LogprobsComputer, default_selection_config

VOCAB = 151936
ROWS = (1, 8, 256)
# overrides of the default: chunk x warps at its sub-block, candidates and register cap, then one
# change at a time (no cap; 512-token sub-blocks: fewer, wider re-reads; a smaller finish)
SHAPES: tuple[dict, ...] = tuple({"logprobs_chunk": chunk, "logprobs_warps": warps} for chunk in (1024, 2048, 4096)
                                 for warps in (4, 8)) + (
    {"logprobs_maxnreg": 0},
    {"logprobs_sub": 512},
    {"logprobs_chunk": 4096, "logprobs_sub": 512},
    {"logprobs_candidates": 64},
)

FIELDS = ("logprobs_chunk", "logprobs_warps", "logprobs_sub", "logprobs_candidates", "logprobs_maxnreg")

log = logging.getLogger("runnercheck.tune")


def _outputs(computer: LogprobsComputer, logits: torch.Tensor, targets: torch.Tensor, rows: int) -> list[torch.Tensor]:
    out = computer.launch(logits[:rows], targets, rows, LOGPROBS_TOP)
    return [t.clone() for t in (out.logprob, out.rank, out.top_ids, out.top_logprobs)]


def _same(got: list[torch.Tensor], expected: list[torch.Tensor]) -> bool:
    """Ranks and top ids exactly; logprobs to fp32 rounding (another chunking sums the log-sum-exp
    in another order, which moves the last bits)."""
    (lp, rank, ids, top_lp), (elp, erank, eids, etop_lp) = got, expected
    return (torch.equal(rank, erank) and torch.equal(ids, eids) and torch.allclose(lp, elp, atol=1e-5, rtol=1e-6)
            and torch.allclose(top_lp, etop_lp, atol=1e-5, rtol=1e-6))


def sweep(ctx: BenchContext) -> list[dict]:
    dev = ctx.device
    gen = torch.Generator(device=dev.torch_device).manual_seed(0)
    logits = torch.randn(max(ROWS), VOCAB, generator=gen, device=dev.torch_device, dtype=torch.float32) * 3.0
    targets = torch.randint(0, VOCAB, (max(ROWS),), generator=gen, device=dev.torch_device)
    base = default_selection_config(dev)
    reference = LogprobsComputer(dev, VOCAB, LOGPROBS_TOP, max(ROWS), base)
    expected = {rows: _outputs(reference, logits, targets, rows) for rows in ROWS}
    records = []
    for overrides in SHAPES:
        config = dataclasses.replace(base, **overrides)
        record: dict = {field: getattr(config, field) for field in FIELDS}
        record["default"] = config == base
        try:
            computer = LogprobsComputer(dev, VOCAB, LOGPROBS_TOP, max(ROWS), config)
            for rows in ROWS:
                got = _outputs(computer, logits, targets, rows)
                same = _same(got, expected[rows])
                record[f"equal_{rows}"] = same
                record[f"us_{rows}"] = _graph_time_us(lambda c=computer, r=rows: c.launch(logits[:r], targets, r, LOGPROBS_TOP))
                record[f"finished_rows_{rows}"] = int((computer.mode[:rows] == 0).sum())  # decided without the fallback
            top = max(ROWS)
            record[f"us_{top}_no_top"] = _graph_time_us(lambda c=computer: c.launch(logits[:top], targets, top, 0))
        except Exception as exc:  # a shape the kernels cannot take (registers, shared memory): reported, not fatal
            record["error"] = f"{type(exc).__name__}: {exc}"[:300]
        log.info("%s", record)
        records.append(record)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    records = sweep(BenchContext(Device(args.device, seed=0), quick=False))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tune_logprobs.json").write_text(json.dumps(records, indent=1))
    ok = [r for r in records if "error" not in r and all(r[f"equal_{n}"] for n in ROWS)]
    for r in sorted(ok, key=lambda r: r["us_256"]):
        print(" ".join(f"{f.removeprefix('logprobs_')} {r[f]}" for f in FIELDS) + ": "
              + "  ".join(f"{n} rows {r[f'us_{n}']:7.1f} us" for n in ROWS)
              + f"  (256 rows without top-n {r['us_256_no_top']:.1f} us)" + ("  (default)" if r["default"] else ""))
    for r in records:
        if r not in ok:
            print("not usable:", r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
