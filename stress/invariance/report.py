"""The invariance check's report: terminal lines, ``summary.json`` and ``summary.md``.

``summary.json`` (``command: "invariance"``): ``version``, ``status`` (complete / incomplete),
``passed``, ``provenance``, ``device``, ``seed``, ``runner``, ``runner_kwargs`` (what the check
passed to the factory), ``mutant``, ``config``, ``probes``, ``scenarios`` (each: name, kind, the
batch change, steps, cached tokens, passed, error, differences), ``differences`` (count) and
``first_difference`` (its one-line description, or null).  Each difference names the scenario and
its batch change, the probe, the output index, both steps' batches, both tokens, the logit margin
and the drift, and its kind (`runnercheck.stress.invariance.compare`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runnercheck.stress.invariance.checker import InvarianceResult, ScenarioOutcome

SUMMARY_VERSION = 1


def scenario_line(outcome: ScenarioOutcome, index: int, total: int) -> str:
    status = "ok  " if outcome.passed else "FAIL"
    hit = f", {outcome.cached_tokens} cached tokens" if outcome.cached_tokens else ""
    extra = f" -- {outcome.error}" if outcome.error else (f" -- {len(outcome.differences)} probe(s) differ"
                                                          if outcome.differences else "")
    return f"[{index}/{total}] {status} {outcome.name}: {outcome.steps} steps{hit}, {outcome.seconds:.1f} s{extra}"


def build_summary(result: InvarianceResult, *, status: str = "complete", mutant: str | None = None,
                  provenance: dict | None = None, notes: list[str] | None = None) -> dict[str, Any]:
    first = result.first_difference
    return {
        "version": SUMMARY_VERSION,
        "command": "invariance",
        "status": status,
        "passed": status == "complete" and result.passed and bool(result.scenarios),
        "provenance": provenance or {},
        "device": result.config.device,
        "seed": result.config.seed,
        "runner": result.runner,
        "runner_kwargs": result.runner_kwargs,
        "mutant": mutant,
        "config": result.config.to_dict(),
        "probes": result.probes,
        "scenarios": [s.to_dict() for s in result.scenarios],
        "differences": len(result.differences),
        "crashed_scenarios": sum(s.error is not None for s in result.scenarios),
        "first_difference": None if first is None else first.line(),
        "elapsed_s": round(result.seconds, 3),
        "notes": list(notes or ()),
    }


def render_markdown(doc: dict[str, Any]) -> str:
    verdict = "PASSED" if doc["passed"] else ("INCOMPLETE" if doc["status"] != "complete" else "FAILED")
    lines = [f"# runnercheck invariance: {verdict}", "",
             f"- runner: `{doc['runner']}` (keywords passed: {doc['runner_kwargs'] or 'none'})",
             f"- device: {doc['device']}, seed {doc['seed']}, tolerance {doc['config']['tolerance'] or 'exact (bitwise)'}"]
    if doc["mutant"]:
        lines.append(f"- mutant: `{doc['mutant']}`")
    lines += ["", "## Probes", ""] + [f"- {p}" for p in doc["probes"]]
    lines += ["", "## Scenarios", "", "| scenario | batch change | steps | cached tokens | result |", "|---|---|---|---|---|"]
    for s in doc["scenarios"]:
        result = "ok" if s["passed"] else (f"crashed: {s['error']}" if s["error"] else f"{len(s['differences'])} differ")
        lines.append(f"| {s['name']} | {s['change']} | {s['steps']} | {s['cached_tokens']} | {result} |")
    diffs = [d for s in doc["scenarios"] for d in s["differences"]]
    if diffs:
        lines += ["", "## Differences (first per probe and scenario)", ""] + [f"- {d['line']}" for d in diffs]
    if doc["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    return "\n".join(lines) + "\n"


def write_report(folder: Path, doc: dict[str, Any]) -> None:
    (folder / "summary.json").write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    (folder / "summary.md").write_text(render_markdown(doc))


def print_result(result: InvarianceResult, doc: dict[str, Any], out: str | None) -> None:
    verdict = "PASSED" if doc["passed"] else ("INCOMPLETE" if doc["status"] != "complete" else "FAILED")
    print(f"runnercheck invariance {verdict}: {len(result.scenarios)} scenarios, {len(result.probes)} probes, "
          f"{doc['differences']} difference(s), {doc['crashed_scenarios']} crashed, {result.seconds:.1f} s "
          f"(device {doc['device']}, seed {doc['seed']})")
    for line in result.failure_lines()[:10]:
        print(f"  {line}")
    if out:
        print(f"report: {out}/summary.md")


__all__ = ["build_summary", "render_markdown", "write_report", "print_result", "scenario_line", "SUMMARY_VERSION"]
