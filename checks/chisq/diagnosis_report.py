"""How the chi-square reports show a failure's diagnosis (`runnercheck.checks.chisq.diagnosis`): the per-case
lines (terminal and Markdown), the linear-scale residual plot of the kept tokens (HTML), and the filter-pair
grid of the summary (which binding filter failed next to which other filter).  Reads results; computes no
statistics."""
from __future__ import annotations

from typing import Any

from runnercheck.checks.chisq.stats import RunSummary, TestResult
from runnercheck.impl.interface import SAMPLING_FIELDS

# Rows/columns of the grid: the interface table's filters and penalties, in its order.
GRID_FIELDS = tuple(f.name for f in SAMPLING_FIELDS if f.stage in ("filter", "penalty"))
SHORT = {f.name: f.short for f in SAMPLING_FIELDS}


def diagnosed(summary: RunSummary) -> list[TestResult]:
    return [t for t in summary.failed_tests if t.diagnosis]


def _ids(entries: list[dict[str, Any]], value: str) -> str:
    if value == "count":
        return ", ".join(f"{e['token']} (rank {e['rank']}): {e['count']}" for e in entries)
    return ", ".join(f"{e['token']} (rank {e['rank']}): {e['expected']:.1f} expected" for e in entries)


def case_lines(t: TestResult) -> list[str]:
    """The diagnosis of one failed test as plain lines (no truncation: every impossible and missing id)."""
    d = t.diagnosis or {}
    lines = [d.get("verdict", ""),
             f"binding filter(s): {', '.join(d.get('binding_filters') or ['none declared'])}; kept set: "
             f"{d.get('kept_expected')} expected under {d.get('convention')}, {d.get('kept_observed')} drawn"]
    if d.get("impossible"):
        lines.append(f"impossible tokens drawn (id (rank): draws): {_ids(d['impossible'], 'count')}")
    if d.get("missing"):
        lines.append(f"allowed tokens never drawn (id (rank): expected draws): {_ids(d['missing'], 'expected')}")
    lines.append("fit per convention: " + ", ".join(f"{f['convention']} p={f['p_value']:.3g}" for f in d.get("fits", [])))
    return lines


def markdown_lines(summary: RunSummary) -> list[str]:
    """``## Diagnosis of failed cases`` and the filter-pair grid (empty when nothing failed)."""
    failed = diagnosed(summary)
    if not failed:
        return []
    out = ["", "## Diagnosis of failed cases", "",
           f"Expected distributions follow the convention `{summary.convention}`; each failed case's draws are also "
           "tested against every shipped convention (docs/CHISQ.md, Conventions).", ""]
    for t in failed:
        out += [f"### {t.name}", ""] + [f"* {line}" for line in case_lines(t)] + [""]
    out += pair_grid_markdown(summary)
    return out


def pair_grid(summary: RunSummary) -> dict[tuple[str, str], list[bool]]:
    """(binding filter, other filter on in the case) -> the pass/fail of each such test; (f, f): f alone."""
    grid: dict[tuple[str, str], list[bool]] = {}
    for t in summary.tests:
        binds = t.config.get("binds") or []
        on = [f for f in GRID_FIELDS if f in (t.config.get("params") or {})]
        for b in binds:
            others = [a for a in on if a != b] or [b]
            for a in others:
                grid.setdefault((b, a), []).append(t.passed)
    return grid


def pair_grid_markdown(summary: RunSummary) -> list[str]:
    grid = pair_grid(summary)
    if not grid:
        return []
    cols = [f for f in GRID_FIELDS if any(a == f for _, a in grid)]
    rows = [f for f in GRID_FIELDS if any(b == f for b, _ in grid)]
    out = ["## Filter-pair grid", "",
           "Row: the filter a case exists to test (it binds); column: another filter on in that case (the diagonal: "
           "alone). A cell counts the tests that failed of those run.", "",
           "| binds \\ with | " + " | ".join(SHORT[c] for c in cols) + " |", "|---|" + "---:|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = grid.get((r, c))
            cells.append("" if v is None else (f"**{v.count(False)}/{len(v)} fail**" if False in v else f"0/{len(v)}"))
        out.append(f"| {SHORT[r]} | " + " | ".join(cells) + " |")
    return out + [""]


def residual_figure(tests: list[TestResult]):
    """Observed minus expected draws of each kept (or drawn) token, linear scale, ranks on x: a 5-10% shortfall
    on kept tokens shows here where the log-scale bin plot hides it."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(tests), 1, figsize=(8, 2.6 * len(tests)), squeeze=False)
    for ax, t in zip(axes.ravel(), tests):
        res = t.diagnosis["residuals"]
        impossible = {e["token"] for e in t.diagnosis["impossible"]}
        x = list(range(len(res)))
        ax.bar(x, [r["observed"] - r["expected"] for r in res],
               color=["#c0392b" if r["token"] in impossible else "#2e86de" for r in res])
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks(x, [f"{r['token']}\nr{r['rank']}" for r in res], fontsize=6)
        ax.set_ylabel("observed - expected", fontsize=7)
        ax.set_title(f"{t.name} (red: impossible under {t.diagnosis['convention']})", fontsize=8)
    fig.tight_layout()
    return fig


def terminal_lines(summary: RunSummary) -> list[str]:
    out = []
    for t in diagnosed(summary):
        out.append(f"diagnosis {t.name}:")
        out += [f"  {line}" for line in case_lines(t)]
    return out


__all__ = ["case_lines", "diagnosed", "markdown_lines", "pair_grid", "residual_figure", "terminal_lines"]
