"""The binding table: which filters bind in each chi-square case (`runnercheck.checks.chisq.binding`), printed.

    python -m runnercheck.checks.chisq.binding_cmd [--full] [--markdown]

Its own module because it reads the case catalogue (`runnercheck.checks.chisq.cases`), which builds on
`runnercheck.checks.chisq.binding`: kept there, the command closed an import cycle.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from runnercheck.checks.chisq.binding import SHORT_NAMES, binding_report, case_problems
from runnercheck.checks.chisq.case import SamplingCase
from runnercheck.checks.chisq.cases import build_cases, power_cases


def main(argv: Sequence[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    parser = argparse.ArgumentParser(prog="python -m runnercheck.checks.chisq.binding_cmd", description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full (GPU-sized) matrix instead of the quick one")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table (as in docs/CHISQ.md)")
    args = parser.parse_args(argv)
    cases = build_cases(quick=not args.full) + [c for c, _ in power_cases().values()]
    table = Table(title="which filters bind (every move detectable at the case's draws)")
    for col in ("case", "T", "n", "declared", "binds", "does not bind"):
        table.add_column(col)
    failed = 0
    rows = []
    unique: dict[str, SamplingCase] = {}
    for c in cases:
        unique.setdefault(c.name, c)  # a power case may reuse a matrix case with more draws: show the matrix's
    for case in unique.values():
        report = binding_report(case)
        problems = case_problems(case, report)
        failed += bool(problems)
        rows.append(([case.name, f"{case.params.temperature:g}", str(case.n_samples), _short(case.binds),
                      _short([n for n, b in report.items() if b.binds]), _short([n for n, b in report.items() if not b.binds])],
                     bool(problems)))
    if args.markdown:
        print("| case | T | n | declared | binds | on, does not bind |\n|---|---:|---:|---|---|---|")
        for cells, _ in rows:
            print("| " + " | ".join(cells) + " |")
    else:
        for cells, bad in rows:
            table.add_row(*cells, style="red" if bad else None)
        Console(width=160).print(table)
    return 1 if failed else 0


def _short(names: Sequence[str]) -> str:
    return " ".join(SHORT_NAMES[n] for n in names) or "-"


if __name__ == "__main__":
    sys.exit(main())
