"""`runnercheck bench [--quick] [--only NAME...] [--device ...] --out DIR`.

Each case runs its comparison in one process and returns result rows; the command writes
``DIR/bench.json`` and ``DIR/bench.md`` as a report folder (`runnercheck.checks.report_folder`).
Interrupted (Ctrl-C, SIGTERM -- e.g. ``timeout``), it writes the cases that finished in a report
marked incomplete and exits 130.  Absolute times mean something only on a GPU (CUDA events
via ``triton.testing.do_bench``); on CPU (``--quick`` in CI) the run is a smoke test.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Callable

from runnercheck.bench.common import BenchContext, Row


def _cases() -> dict[str, Callable[[BenchContext], list[Row]]]:
    from runnercheck.bench import case_runner, case_sampler, case_spec

    return {
        "host_cost": case_runner.bench_host_cost,
        "staged_writes": case_runner.bench_staged_writes,
        "sampler": case_sampler.bench_sampler,
        "logprobs": case_sampler.bench_logprobs,
        "e2e": case_runner.bench_end_to_end,
        "spec_ngram": case_spec.bench_ngram,
        "spec_draft": case_spec.bench_draft,
    }


CASE_NAMES = ("host_cost", "staged_writes", "sampler", "logprobs", "e2e", "spec_ngram", "spec_draft")
# Version of bench.json's layout; raised when a key changes meaning or disappears.
BENCH_FORMAT_VERSION = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (CPU smoke test)")
    parser.add_argument("--only", nargs="+", choices=CASE_NAMES, metavar="NAME", help=f"cases to run: {', '.join(CASE_NAMES)} (default: every case)")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu", "sim"],
                        help="auto: cuda when torch sees a GPU, else sim (the same rule in every command)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the benchmarks' requests and weights")
    parser.add_argument("--out", default="out/bench", help="output folder (bench.json, bench.md)")


def _markdown(meta: dict, rows: list[Row], prov: dict) -> str:
    from runnercheck.checks.interrupts import incomplete_banner
    from runnercheck.checks.provenance import markdown_lines

    lines = [
        f"# runnercheck bench — {meta['date']}",
        "",
        f"`{meta['command']}` on {meta['device_name']} (torch {meta['torch']}, triton {meta['triton']}, "
        f"device kind `{meta['device']}`{', quick' if meta['quick'] else ''})",
        "",
        "| case | measurement | value | unit | target | met | note |",
        "|---|---|---:|---|---|---|---|",
    ]
    for r in rows:
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        lines.append(f"| {r.case} | {r.name} | {r.value:.4g} | {r.unit} | {r.target or ''} | {met} | {r.note} |")
    lines += ["", "## Provenance", ""] + markdown_lines(prov)
    banner = incomplete_banner(meta["interrupted"]) if meta.get("interrupted") else ""
    return banner + "\n".join(lines) + "\n"


def _write(out: Path, meta: dict, rows: list, failures: dict, prov: dict, *, cases_done: list[str],
           interrupted: str | None = None) -> None:
    """``bench.json`` (rows, failures, which cases ran, whether the run completed) and ``bench.md``.

    ``interrupted``: where an interrupted run stopped; its report is marked incomplete."""
    complete = interrupted is None and len(cases_done) == len(meta["cases"])
    meta = dict(meta, cases_done=list(cases_done), complete=complete, interrupted=interrupted)
    doc = {"format_version": BENCH_FORMAT_VERSION, "status": "complete" if complete else "incomplete",
           "provenance": prov, "meta": meta, "rows": [r.to_dict() for r in rows], "failures": failures}
    (out / "bench.json").write_text(json.dumps(doc, indent=2))
    (out / "bench.md").write_text(_markdown(meta, rows, prov))


def run(args: argparse.Namespace) -> int:
    import torch
    import triton

    from runnercheck.checks.interrupts import EXIT_INTERRUPTED, signal_name
    from runnercheck.checks.provenance import provenance
    from runnercheck.checks.report_folder import FolderNotReplaced, atomic_report_folder
    from runnercheck.impl.device import Device

    dev = Device(args.device, seed=args.seed, lag_policy="run-immediately")
    ctx = BenchContext(device=dev, quick=args.quick, seed=args.seed)
    cases = _cases()
    names = args.only or list(CASE_NAMES)
    rows: list[Row] = []
    failures: dict[str, str] = {}
    device_name = torch.cuda.get_device_name(0) if dev.is_cuda else platform.processor() or "CPU"
    prov = provenance(device_name if dev.is_cuda else dev.kind)
    meta = {
        "date": prov["date"],
        "command": prov["command_line"],
        "device": dev.kind,
        "device_name": device_name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "quick": args.quick,
        "python": platform.python_version(),
        "cases": list(names),
    }
    out = Path(args.out)
    done: list[str] = []
    interrupted = None
    folder = atomic_report_folder(out, force=getattr(args, "force", False))
    try:
        with folder as tmp:
            try:
                for name in names:
                    t0 = time.perf_counter()
                    print(f"bench {name} ...", flush=True)
                    try:
                        got = cases[name](ctx)
                    except Exception as e:  # a broken case is reported, the others still run
                        failures[name] = f"{type(e).__name__}: {e}"
                        print(f"  FAILED: {failures[name]}", file=sys.stderr)
                        got = []
                    rows.extend(got)
                    done.append(name)
                    for r in got:
                        print(f"  {r.name:<55} {r.value:>12.4g} {r.unit}")
                    print(f"  ({time.perf_counter() - t0:.1f} s)")
                    # Written after every case: killed outright, the temporary folder keeps the finished cases.
                    _write(tmp, meta, rows, failures, prov, cases_done=done)
            except KeyboardInterrupt as e:  # keep the cases that finished, in a report marked incomplete
                interrupted = (f"interrupted ({signal_name(e)}) after {len(done)} of {len(names)} case(s); "
                               f"only those are reported")
            _write(tmp, meta, rows, failures, prov, cases_done=done, interrupted=interrupted)
    except FolderNotReplaced as e:
        print(f"runnercheck bench: {e}", file=sys.stderr)
        return e.exit_status
    if folder.moved_aside_line():
        print(folder.moved_aside_line())
    print(f"wrote {out / 'bench.json'} and {out / 'bench.md'}")
    if interrupted:
        print(f"runnercheck bench: {interrupted}; incomplete report in {out}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 1 if failures else 0
