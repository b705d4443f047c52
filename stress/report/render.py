"""Terminal renderers of `runnercheck.stress.run.harness.Findings` (for `stress` and `replay`).

Tables wrap (``overflow="fold"``) instead of cutting cells, so a CI log narrower than the table
still shows every value, and the verdict is never truncated.
"""
from __future__ import annotations

import sys
from typing import Any

from runnercheck.checks.detectors.base import DetectorResult
from runnercheck.checks.detectors.registry import in_report_order
from runnercheck.stress.run.driver import summarize_ties
from runnercheck.stress.run.config import describe_policy


def console() -> Any:
    from rich.console import Console

    return Console()


def spec_line(spec: dict) -> str:
    """One line of `runnercheck.stress.sim.spec_scheduler.SpecStats.to_dict()`: drafts asked for, accepted, the rate."""
    return (f"{spec['accepted_tokens']} of {spec['draft_tokens']} accepted ({spec['acceptance_rate']:.0%}) over "
            f"{spec['draft_steps']} request-steps; all accepted {spec['all_accepted_steps']}, none {spec['none_accepted_steps']}")


def print_findings(findings: Any, title: str) -> None:
    from rich.table import Table

    config, result = findings.config, findings.result
    stats = result.scheduler_stats
    table = Table(title=title, show_header=False)
    table.add_column("what", overflow="fold")
    table.add_column("value", overflow="fold")
    rows = [
        ("device", config.device + (f" (lag {describe_policy(config.lag_policy)})" if config.lag_policy else "")
         + (f" (delays {describe_policy(config.delay_policy)})" if config.delay_policy else "")
         + ("" if config.cuda_graphs else " eager")),
        ("runner", config.runner + (f"  mutant={config.mutant}" if config.mutant else "")),
        ("model", f"{config.model_preset or 'custom'} (vocab {config.model_config.vocab_size}, {config.model_config.num_layers} layers)"),
        ("seed, ticks, steps compared", f"{config.seed}, {result.ticks}, {result.steps}"),
        ("requests added / finished", f"{result.requests} / {result.finished}"),
        ("tokens / logprobs compared", f"{result.tokens_compared} / {result.logprobs_compared}"),
        ("ties adopted", str(len(result.ties))),
    ]
    rows += [(d.label, d.describe(findings.detectors[d.name])) for d in in_report_order(findings.detectors)]
    if stats is not None:
        rows += [
            ("preempted blocks/forced, resumed", f"{stats.preempted_for_blocks} / {stats.preempted_forced}, {stats.resumed}"),
            ("aborted, late dropped, drafts", f"{stats.aborted}, {stats.dropped_tokens}, {stats.draft_steps}"),
        ]
    if result.spec_stats:
        draft = config.scheduler.draft_model
        rows.append((f"draft-model ({draft}) drafts" if draft else "n-gram drafts", spec_line(result.spec_stats)))
    if findings.cuda_graphs is not None:
        from runnercheck.impl.graphs import format_graph_stats

        rows.append(("cuda graphs", format_graph_stats(findings.cuda_graphs)))
    if findings.coverage:
        from runnercheck.stress.run.coverage import merge, tally

        rows.append(("coverage (not gated)", tally(merge([findings.coverage]), gated=False).headline()))
    if findings.crash:
        rows.append(("crash", f"{findings.crash} after step {findings.last_completed_step}"))
    rows.append(("elapsed", f"{findings.elapsed_s:.1f} s"))
    for k, v in rows:
        table.add_row(k, v)
    out = console()
    out.print(table)
    for line in summarize_ties(result.ties):
        out.print(f"  {line}", markup=False, highlight=False)


def print_divergence(findings: Any) -> None:
    result = findings.result
    if result.divergences:
        print(f"DIVERGENCE {result.first_divergence_line()}")
        for d in result.divergences[1:6]:
            print(f"  also: {d.line()}")
    for d in in_report_order(findings.detectors):
        found = findings.detectors[d.name]
        for line in found.lines[:3] if found.violations else []:
            print(f"{d.tag} {line}")
    if result.runner_traceback:
        print(result.runner_traceback.rstrip(), file=sys.stderr)


def run_line(r: Any) -> str:
    """One plain line for a finished verify run (a `runnercheck.stress.report.summary.RunRecord`)."""
    verdict = "ok  " if r.passed else "FAIL"
    extra = f"  {r.first_divergence}" if r.first_divergence else ""
    for d in in_report_order(r.detectors):
        failure = d.failure(r.detectors[d.name])
        if failure:
            extra += f"  {failure}"
    return f"{verdict} {r.name} (seed {r.seed}): {r.steps} steps, {r.tokens_compared} tokens, {r.ties} ties, {r.elapsed_s:.1f} s{extra}"


def print_verify_summary(doc: dict, files: list) -> None:
    """A summary document's one-screen summary (titled by its command): runs, coverage, statistics,
    findings, every report file."""
    from rich.table import Table

    from runnercheck.stress.report.summary import chisq_line, coverage_tally, detector_results

    out = console()
    verdict = "[bold green]PASSED[/]" if doc["passed"] else "[bold red]FAILED[/]"
    table = Table(title=f"runnercheck {doc['command']}: {verdict}", show_header=True)
    detectors = in_report_order(doc["detectors"])
    for col in ("run", "seed", "steps", "tokens", "ties", *(d.column for d in detectors), "result"):
        table.add_column(col, justify="left" if col in ("run", "result") else "right",
                         overflow="fold", no_wrap=col == "result", min_width=6 if col == "result" else None)
    for r in doc["runs"]:
        result = "ok" if r["passed"] else ("[red]CRASH[/]" if r.get("crash") else "[red]FAIL[/]")
        cells = [d.cell(DetectorResult.from_dict(r["detectors"][d.name])) if d.name in r["detectors"] else "-" for d in detectors]
        table.add_row(r["name"], str(r["seed"]), str(r["steps"]), str(r["tokens_compared"]), str(r["ties"]), *cells, result)
    out.print(table)
    print_coverage(doc["coverage"], out)
    say = lambda text: out.print(text, highlight=False, markup=False, soft_wrap=True)  # noqa: E731
    say(f"coverage: {coverage_tally(doc).headline()}")
    say(f"device {doc['device']}, runner {doc['runner']}, {doc['elapsed_s']:.1f} s")
    say(f"divergences {doc['divergences']}, ties {doc['ties']}")
    for d in detectors:
        say(f"{d.label}: {d.total(detector_results(doc['runs'], d.name))}")
    for r in doc["runs"]:
        if r.get("speculative"):
            draft = (r.get("scheduler") or {}).get("draft_model")
            say(f"{f'draft-model ({draft})' if draft else 'n-gram'} drafts in {r['name']}: {spec_line(r['speculative'])}")
    graphs = [r["cuda_graphs"] for r in doc["runs"] if r.get("cuda_graphs")]
    if graphs:
        from runnercheck.impl.graphs import format_graph_stats

        say(f"cuda graphs (first run): {format_graph_stats(graphs[0])}")
    say(f"sampler statistics: {chisq_line(doc['chisq'])}")
    if doc["coverage_zero"]:
        say(f"COVERAGE: not exercised: {', '.join(doc['coverage_zero'])}")
    for r in doc["runs"]:
        if r.get("crash"):
            say(f"CRASH {r['name']}: {r['crash']} after step {r.get('last_completed_step')}")
        if r["first_divergence"]:
            say(f"DIVERGENCE {r['name']}: {r['first_divergence']}")
            say(f"  repro: {r['repro']}  (runnercheck replay {r['repro']})")
        for d in in_report_order(r["detectors"]):
            found = r["detectors"][d.name]
            for line in found["lines"][:3] if found["violations"] else []:
                say(f"{d.tag} {r['name']}: {line}")
    for note in doc["notes"]:
        say(f"note: {note}")
    say("report files:")
    for f in files:
        say(f"  {f}")


def print_coverage(coverage: dict, out: Any = None) -> None:
    """The coverage table: every feature with its count, zeros marked."""
    from rich.table import Table

    table = Table(title="coverage (features exercised over all runs)", show_header=True)
    for _ in range(2):  # two feature/count column pairs: the table stays about one screen high
        table.add_column("feature", overflow="fold")
        table.add_column("count", justify="right", no_wrap=True)
    cells = [(name, str(n) if n else "[bold red]0[/]") for name, n in coverage.items()]
    half = (len(cells) + 1) // 2
    for left, right in zip(cells[:half], cells[half:] + [("", "")]):
        table.add_row(*left, *right)
    (out or console()).print(table)


__all__ = ["print_findings", "print_divergence", "run_line", "print_verify_summary", "print_coverage"]
