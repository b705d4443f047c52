"""Chi-square run reports: ``chisq.json`` (machine-readable), ``chisq.md`` (a table), ``report.html``
(the same plus plots, PNGs embedded as base64 so the file travels alone), and the one-screen
terminal summary.  Reads a `runnercheck.checks.chisq.stats.RunSummary`; computes nothing statistical itself.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from runnercheck.checks.chisq.stats import RunSummary, TestResult

# Version of chisq.json's layout; raised when a key changes meaning or disappears.
CHISQ_FORMAT_VERSION = 1
MAX_BIN_PLOTS = 6
# Result kinds of a case whose isolated sampler process died in it (`runnercheck.checks.chisq.isolated`).
SAMPLER_DIED = ("crash", "timeout")
MAX_BINS_PER_PLOT = 40
MAX_RESIDUAL_PLOTS = 6
QUICK_BLIND_NOTE = ("Quick mode cannot detect probabilities rounded to fp16 or 16-bit uniforms in inverse-CDF sampling "
                    "(too few draws; docs/CHISQ.md, what each mode can detect): run full mode on CUDA for those.")


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    return value


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "-"
    return "0" if p == 0 else f"{p:.3g}"


def write_json(path: Path, summary: RunSummary, prov: dict | None = None) -> None:
    """``chisq.json``: the summary plus its format version and provenance (`runnercheck.checks.provenance`)."""
    doc = {"format_version": CHISQ_FORMAT_VERSION, "provenance": prov or run_provenance(summary), **summary.to_dict()}
    path.write_text(json.dumps(_json_safe(doc), indent=1, allow_nan=False) + "\n")


def run_provenance(summary: RunSummary) -> dict:
    """The provenance block (`runnercheck.checks.provenance`) for the run ``summary`` reports, written now."""
    from runnercheck.checks.provenance import device_name, provenance

    return provenance(device_name(summary.device.split(":")[0]))


def markdown(summary: RunSummary, prov: dict | None = None) -> str:
    """``chisq.md``: an incomplete run's banner, the tables, then the provenance (``prov``: default written now)."""
    from runnercheck.checks.interrupts import incomplete_banner
    from runnercheck.checks.provenance import markdown_lines

    verdict = "PASS" if summary.passed else "FAIL"
    banner = incomplete_banner(summary.interrupted) if summary.interrupted else ""
    provenance_lines = markdown_lines(prov or run_provenance(summary))
    return banner + _markdown_body(summary, verdict) + "\n## Provenance\n\n" + "\n".join(provenance_lines) + "\n"


def _markdown_body(summary: RunSummary, verdict: str) -> str:
    lines = [
        f"# Sampler chi-square report: {verdict}",
        "",
        f"sampler `{summary.sampler}` on `{summary.device}`, {'quick' if summary.quick else 'full'} matrix, seed {summary.seed}, "
        f"convention `{summary.convention}`, {len(summary.tests)} tests of the sampler, {summary.correction} correction at "
        f"alpha {summary.alpha:g}, {summary.elapsed_s:.1f} s",
        "",
        *([QUICK_BLIND_NOTE, ""] if summary.quick else []),
        *([f"**{summary.not_run}**", ""] if summary.not_run else []),
        "| test | kind | n | statistic | dof | p | adjusted p | passed | notes |",
        "|---|---|---:|---:|---:|---:|---:|:---:|---|",
    ]
    for t in summary.tests:
        stat = "inf" if not math.isfinite(t.statistic) else f"{t.statistic:.4g}"
        lines.append(f"| {t.name} | {t.kind} | {t.n_samples} | {stat} | {t.dof} | {_fmt_p(t.p_value)} | "
                     f"{_fmt_p(t.adjusted_p_value)} | {'yes' if t.passed else '**NO**'} | {t.notes} |")
    from runnercheck.checks.chisq.diagnosis_report import markdown_lines as diagnosis_lines

    lines += diagnosis_lines(summary)
    if summary.builtin_tests:
        lines += ["", "## Built-in speculative verifier (not the sampler under test)", "",
                  "These cases run on runnercheck's own verifier (checks/chisq/spec.py); they are not counted as the "
                  "sampler's result. A failure here is a bug of runnercheck and still fails the run.", "",
                  "| test | kind | n | p | adjusted p | passed | notes |", "|---|---|---:|---:|---:|:---:|---|"]
        lines += [f"| {t.name} | {t.kind} | {t.n_samples} | {_fmt_p(t.p_value)} | {_fmt_p(t.adjusted_p_value)} | "
                  f"{'yes' if t.passed else '**NO**'} | {t.notes} |" for t in summary.builtin_tests]
    if summary.skipped:
        lines += ["", "Skipped cases:", ""] + [f"* {s['case']}: {s['reason']}" for s in summary.skipped]
    c = summary.calibration
    if c is not None:
        lines += ["", "## Calibration", "",
                  f"{c.runs} runs of `{c.config_name}` with `{c.sampler}`: {c.rejections} rejections at alpha {c.alpha:g} "
                  f"(rate {c.rejection_rate:.3f}); {c.coverage:.1%} binomial band [{c.band[0]}, {c.band[1]}]: "
                  f"{'in band' if c.passed else '**OUT OF BAND**'}. KS p-value of the p-values vs U(0,1): {c.ks_p_value:.3g}."]
    if summary.power:
        lines += ["", "## Power self-test (built-in sampler with planted biases, not the sampler under test)", "",
                  "Each planted bias is runnercheck's own sampler with one deliberate error: this says what the tests "
                  "can catch, not how the sampler under test did.", "", "| bias | case | repeats | rejected | power | required | passed |",
                  "|---|---|---:|---:|---:|---:|:---:|"]
        for p in summary.power:
            lines.append(f"| {p.bias} | {p.config_name} | {p.repeats} | {p.rejections} | {p.power:.2f} | "
                         f"{p.required_power:.2f} | {'yes' if p.passed else '**NO**'} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- plots


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _bins_figure(tests: list[TestResult]):
    import matplotlib.pyplot as plt

    cols = min(3, len(tests))
    rows = math.ceil(len(tests) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    for ax, t in zip(axes.ravel(), tests):
        bins = t.bins[:MAX_BINS_PER_PLOT]
        x = np.arange(len(bins))
        ax.bar(x, [b.expected for b in bins], color="#c8d6e5", label="expected")
        ax.plot(x, [b.observed for b in bins], "o", color="#c0392b", ms=3, label="observed")
        ax.set_yscale("symlog", linthresh=5)
        ax.set_title(f"{t.name}\np={_fmt_p(t.p_value)} adj={_fmt_p(t.adjusted_p_value)}", fontsize=8)
        ax.set_xlabel("bin (largest expected first)", fontsize=7)
        ax.tick_params(labelsize=6)
    for ax in axes.ravel()[len(tests):]:
        ax.axis("off")
    axes.ravel()[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def _pvalue_figures(summary: RunSummary):
    import matplotlib.pyplot as plt

    matrix_p = np.array([t.p_value for t in summary.tests], dtype=np.float64)
    calib_p = np.array(summary.calibration.p_values if summary.calibration else [], dtype=np.float64)
    hist, ax = plt.subplots(figsize=(5, 3.2))
    ax.hist([matrix_p, calib_p] if calib_p.size else [matrix_p], bins=20, range=(0, 1), stacked=True,
            label=["matrix", "calibration"][: 2 if calib_p.size else 1], color=["#2e86de", "#10ac84"][: 2 if calib_p.size else 1])
    ax.set_xlabel("p-value")
    ax.set_ylabel("tests")
    ax.set_title("p-value histogram (uniform if the sampler is right)", fontsize=9)
    ax.legend(fontsize=7)
    qq, ax2 = plt.subplots(figsize=(5, 3.2))
    for values, label, color in ((matrix_p, "matrix", "#2e86de"), (calib_p, "calibration", "#10ac84")):
        if values.size == 0:
            continue
        observed = np.sort(np.clip(values, 1e-300, 1.0))
        uniform = (np.arange(1, values.size + 1) - 0.5) / values.size
        ax2.plot(-np.log10(uniform), -np.log10(observed), "o", ms=3, color=color, label=label)
    top = max(1.0, float(-np.log10(0.5 / max(matrix_p.size, calib_p.size, 1))))
    ax2.plot([0, top], [0, top], "k--", lw=0.8)
    ax2.set_xlabel("-log10 expected p (uniform quantiles)")
    ax2.set_ylabel("-log10 observed p")
    ax2.set_title("QQ plot of p-values", fontsize=9)
    ax2.legend(fontsize=7)
    return hist, qq


def _power_figure(summary: RunSummary):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 0.35 * len(summary.power) + 1))
    names = [p.bias for p in summary.power]
    ax.barh(names, [p.power for p in summary.power], color=["#10ac84" if p.passed else "#c0392b" for p in summary.power])
    ax.set_xlim(0, 1)
    ax.set_xlabel("power (rejection rate over repeats)")
    ax.tick_params(labelsize=7)
    return fig


def html_report(summary: RunSummary, prov: dict | None = None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    worst = sorted(summary.tests, key=lambda t: (1.0 if t.adjusted_p_value is None else t.adjusted_p_value, t.p_value))
    images = []
    if worst:
        images.append(("observed vs expected, lowest adjusted p first", _png(_bins_figure(worst[:MAX_BIN_PLOTS]))))
        hist, qq = _pvalue_figures(summary)
        images += [("p-value histogram", _png(hist)), ("QQ plot", _png(qq))]
    from runnercheck.checks.chisq.diagnosis_report import diagnosed, residual_figure

    failed = diagnosed(summary)[:MAX_RESIDUAL_PLOTS]
    if failed:
        images.append(("residuals of the kept tokens (linear scale), failed cases", _png(residual_figure(failed))))
    if summary.power:
        images.append(("power of the planted biases (built-in sampler self-test)", _png(_power_figure(summary))))
    body = "\n".join(f'<h3>{html.escape(title)}</h3><img alt="{html.escape(title)}" src="data:image/png;base64,{data}">'
                     for title, data in images)
    md = html.escape(markdown(summary, prov))
    verdict = "PASS" if summary.passed else "FAIL"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>chisq {verdict}</title>"
            "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}pre{white-space:pre-wrap;font-size:12px}</style>"
            f"</head><body><h1>Sampler chi-square report: {verdict}</h1>{body}<h2>Tables</h2><pre>{md}</pre></body></html>\n")


def write_report(out_dir: str | Path, summary: RunSummary) -> dict[str, Path]:
    """Write chisq.json, chisq.md and report.html into ``out_dir`` (created); returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "chisq.json", "markdown": out / "chisq.md", "html": out / "report.html"}
    prov = run_provenance(summary)  # one block for the three files
    write_json(paths["json"], summary, prov)
    paths["markdown"].write_text(markdown(summary, prov))
    paths["html"].write_text(html_report(summary, prov))
    return paths


def junit_cases(summary: RunSummary) -> list:
    """One JUnit case per statistical test (rejection as the failure), per skipped case (with the
    reason), for the calibration and per planted bias; the case's seed and position offset as properties.
    Each case's time is its measured wall time (a test's share of its case's draws)."""
    from runnercheck.checks.junit import JUnitCase

    cases = []
    for t in [*summary.tests, *summary.builtin_tests]:
        failure = None
        if not t.passed:
            failure = (f"{t.name}: sampler contract violated: {t.notes}" if t.kind == "contract" else
                       f"{t.name}: returned logprobs do not match: {t.notes}" if t.kind == "logprobs" else
                       f"{t.name}: {t.notes}" if t.kind in SAMPLER_DIED else
                       f"{t.name} rejected ({t.kind}): adjusted p = {_fmt_p(t.adjusted_p_value)} < alpha {summary.alpha:g} "
                       f"(p = {_fmt_p(t.p_value)}, {t.n_samples} draws){'; ' + t.notes if t.notes else ''}")
        where = "builtin." if any(t is b for b in summary.builtin_tests) else ""
        cases.append(JUnitCase(t.name, f"runnercheck.chisq.{where}{t.config.get('group', t.kind)}", time_s=t.elapsed_s, failure=failure,
                               properties={"run_seed": summary.seed, "case_seed": t.config.get("seed"), "position_offset": t.config.get("position_offset"),
                                           "kind": t.kind, "p_value": t.p_value, "adjusted_p_value": t.adjusted_p_value}))
    for s in summary.skipped:
        cases.append(JUnitCase(s["case"], "runnercheck.chisq.skipped", skipped=s["reason"], properties={"run_seed": summary.seed}))
    if summary.not_run is not None:
        cases.append(JUnitCase("matrix", "runnercheck.chisq.matrix", failure=summary.not_run, properties={"run_seed": summary.seed}))
    c = summary.calibration
    if c is not None:
        failure = None if c.passed else (f"calibration out of band: {c.rejections}/{c.runs} rejections at {c.alpha:g}, "
                                         f"band [{c.band[0]}, {c.band[1]}]")
        cases.append(JUnitCase(f"calibration/{c.config_name}", "runnercheck.chisq.calibration", time_s=c.elapsed_s, failure=failure,
                               properties={"run_seed": summary.seed, "runs": c.runs, "rejections": c.rejections}))
    if summary.csan is not None:
        races = summary.csan.get("races", 0)
        cases.append(JUnitCase("csan", "runnercheck.chisq.csan",
                               failure=f"{races} csan race(s): {summary.csan['lines'][0]}" if races else None,
                               failure_details="\n".join(summary.csan.get("reports", [])), properties={"races": races}))
    for p in summary.power:
        failure = None if p.passed else (f"planted bias {p.bias} not caught: power {p.power:.2f} < required "
                                         f"{p.required_power:.2f} on {p.config_name}")
        cases.append(JUnitCase(f"power/{p.bias}", "runnercheck.chisq.power", time_s=p.elapsed_s, failure=failure,
                               properties={"run_seed": summary.seed, "case": p.config_name, "repeats": p.repeats}))
    return cases


def write_chisq_junit(path: str | Path, summary: RunSummary) -> Path:
    """``--junit FILE``: the run as one JUnit suite (`junit_cases`), sampler and device as suite properties."""
    from runnercheck.checks.junit import suite_name, write_junit

    return write_junit(path, suite_name("chisq"), junit_cases(summary), elapsed_s=summary.elapsed_s,
                       properties={"sampler": summary.sampler, "device": summary.device, "seed": summary.seed,
                                   "alpha": summary.alpha, "correction": summary.correction})


def print_summary(summary: RunSummary, out_dir: str | Path | None = None, junit: str | Path | None = None) -> None:
    """The one-screen summary: counts, failing tests, calibration, power, verdict."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    failed = summary.failed_tests
    console.print(f"[bold]chisq[/bold] sampler={summary.sampler} device={summary.device} "
                  f"{'quick' if summary.quick else 'full'} seed={summary.seed}: {len(summary.tests)} tests, "
                  f"{len(failed)} failed ({summary.correction}, alpha {summary.alpha:g}), {summary.elapsed_s:.1f} s")
    if failed:
        table = Table("failed test", "p", "adjusted p", "notes", title="failures (first 15)")
        for t in failed[:15]:
            table.add_row(t.name, _fmt_p(t.p_value), _fmt_p(t.adjusted_p_value), t.notes)
        console.print(table)
    from runnercheck.checks.chisq.diagnosis_report import terminal_lines

    for line in terminal_lines(summary):
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    builtin_failed = [t for t in summary.builtin_tests if not t.passed]
    if summary.builtin_tests:
        console.print(f"built-in speculative verifier (not the sampler under test): {len(summary.builtin_tests)} tests, "
                      f"{len(builtin_failed)} failed" + (": " + ", ".join(t.name for t in builtin_failed) if builtin_failed else ""))
    if summary.quick:
        console.print(QUICK_BLIND_NOTE, highlight=False, soft_wrap=True)
    for t in failed:
        if t.kind == "contract":
            console.print(f"[red]sampler contract[/red] {t.name}: {t.notes}")
        elif t.kind == "logprobs":
            console.print(f"[red]sampler logprobs[/red] {t.name}: {t.notes}", highlight=False, soft_wrap=True)
        elif t.kind in SAMPLER_DIED:
            console.print(f"[red]sampler {t.kind}[/red] {t.name}: {t.notes}", highlight=False, soft_wrap=True)
    for s in summary.skipped:
        console.print(f"skipped {s['case']}: {s['reason']}")
    if summary.not_run is not None:
        console.print(f"[red]{summary.not_run}[/red]", highlight=False, soft_wrap=True)
    if summary.csan is not None:
        console.print(f"csan: {summary.csan['races']} race(s)", highlight=False)
        for line in summary.csan["lines"][:3]:
            console.print(f"[red]csan race[/red] {line}", highlight=False)
    c = summary.calibration
    if c is not None:
        console.print(f"calibration: {c.rejections}/{c.runs} rejected at {c.alpha:g}, band [{c.band[0]}, {c.band[1]}] "
                      f"-> {'ok' if c.passed else 'OUT OF BAND'}")
    if summary.power:
        weak = [p for p in summary.power if not p.passed]
        console.print(f"power self-test (built-in sampler, not the sampler under test): "
                      f"{len(summary.power) - len(weak)}/{len(summary.power)} planted biases rejected as required"
                      + (": weak " + ", ".join(f"{p.bias} ({p.power:.2f})" for p in weak) if weak else ""))
    if out_dir is not None:
        console.print(f"report: {Path(out_dir) / 'report.html'}")
    if junit is not None:
        console.print(f"junit: {junit}")
    console.print("[bold green]PASS[/bold green]" if summary.passed else "[bold red]FAIL[/bold red]")
