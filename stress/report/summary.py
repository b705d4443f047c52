"""The report folder of `runnercheck verify` and `runnercheck stress`: ``summary.json`` (checked
schema) and ``summary.md``, titled by the command that ran (``command``).

``summary.json`` (version 3; `runnercheck stress` writes the same document for its one run).
Version 3 replaced version 2's per-detector fields (``host_syncs``, ``counted_waits``,
``lifetime_*``, ``provenance_violations``, ``csan_*``, a run's ``prefix_cache``) by one
``detectors`` mapping, keyed by the names of the detector registry
(`runnercheck.checks.detectors.registry`), so a new detector appears without a schema change::

    {
      "version": 3,
      "command": "verify" | "stress",
      "status": "complete" | "incomplete",   # incomplete: interrupted; holds the runs that finished
                                             # (possibly none) and never passes
      "provenance": {...checks.provenance.provenance()...},
      "passed": true,                  # every run agreed, no detector found a violation, and the
                                       # sampler statistics (if they ran) passed
      "device": "sim", "seed": 0, "runner": "runnercheck.impl.runner:make_runner", "quick": true,
      "model": "micro",
      "divergences": 0,                # runs that stopped at a divergent step (each stops at its first)
      "detectors": {                   # totals per detector over the runs that armed it
        "sync": {"violations": 0, "runs_checked": 3, "runs": 3},   # host syncs beyond counted waits
        "lifetime": {...}, "provenance": {...}, "csan": {...}},    # (csan: --csan runs only)
      "steps": 90, "requests": 41, "ties": 0, "tokens_compared": 212,
      "chisq": {"status": "ran" | "not available" | "error" | "skipped", "passed": bool | null,
                "summary": "...",      # one clause per sampler, naming it
                "samplers": [          # one entry per sampler the statistics ran on (or tried)
                  {"sampler": "impl", "role": "the runner's sampler (impl.sample)",
                   "scope": "2 cases x 160 draws, interpreted", "status": "ran", "passed": true,
                   "summary": "0 of 2 tests failed", "folder": ".../chisq-runner", "result": {...}},
                  ...],
                "elapsed_s": 41.2, ...},       # the statistics' wall time (verify)
      "runs": [{...one `RunRecord`...,       # its "detectors": {name: {"checked": bool, "violations": n,
                                             #   "lines": [first findings], "extra": {...}}}
                ...}, ...],
      "coverage": {"feature": count, ...},   # totals over the runs (stress.coverage)
      "coverage_zero": ["feature", ...],      # features no run exercised (verify fails on them)
      "coverage_gated": bool,                 # whether the coverage gate applied (verify, whole campaign)
      "elapsed_s": 97.3,
      "notes": ["..."]
    }

`validate_summary` is the schema check (`SummaryError` names the field); `write_report` checks
before it writes.

Ownership: a `RunRecord` is plain host data built once per run from its `runnercheck.stress.run.harness.Findings`
(`RunRecord.from_findings`); this module only reads it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from runnercheck.checks.detectors.base import DetectorResult, DetectorResultError
from runnercheck.checks.detectors.registry import in_report_order
from runnercheck.checks.interrupts import STATUS_COMPLETE, STATUS_INCOMPLETE, STATUSES, incomplete_banner
from runnercheck.checks.provenance import markdown_lines
from runnercheck.stress.run.config import describe_policy

if TYPE_CHECKING:
    from runnercheck.stress.run.coverage import CoverageTally

SUMMARY_VERSION = 3
CHISQ_STATUSES = ("ran", "not available", "error", "skipped")


class SummaryError(ValueError):
    """A summary document that does not follow the schema above."""


@dataclass
class RunRecord:
    """One differential stress run of the verify plan, with its detector totals."""

    name: str
    seed: int
    lag_policy: dict | None
    delay_policy: dict | None
    scheduler: dict
    ticks: int
    steps: int
    requests: int
    finished: int
    tokens_compared: int
    logprobs_compared: int
    ties: int
    tie_lines: list[str] = field(default_factory=list)
    first_divergence: str | None = None
    divergence_lines: list[str] = field(default_factory=list)
    detectors: dict[str, DetectorResult] = field(default_factory=dict)  # `runnercheck.stress.run.harness.Findings.detectors`
    cuda_graphs: dict | None = None  # the runner's `cuda_graph_stats()`
    speculative: dict | None = None  # n-gram drafts asked for / accepted (`runnercheck.stress.sim.spec_scheduler.SpecStats`)
    repro: str | None = None
    crash: str | None = None
    last_completed_step: int | None = None
    coverage: dict = field(default_factory=dict)
    elapsed_s: float = 0.0

    @classmethod
    def from_findings(cls, f: Any, repro: str | None = None) -> "RunRecord":
        """The record of one `runnercheck.stress.run.harness.Findings` (``repro``: where its repro file was written)."""
        from runnercheck.stress.run.driver import summarize_ties

        r, config = f.result, f.config
        lines = [d.line() for d in r.divergences[:6]]
        if r.runner_traceback:
            lines.append(r.runner_traceback.rstrip().splitlines()[-1])
        return cls(
            name=f.name, seed=config.seed, lag_policy=config.lag_policy, delay_policy=config.delay_policy,
            scheduler=config.scheduler.to_dict(), ticks=r.ticks, steps=r.steps, requests=r.requests, finished=r.finished,
            tokens_compared=r.tokens_compared, logprobs_compared=r.logprobs_compared, ties=len(r.ties),
            tie_lines=summarize_ties(r.ties, limit=10), first_divergence=r.first_divergence_line(), divergence_lines=lines,
            detectors=dict(f.detectors), cuda_graphs=f.cuda_graphs, speculative=r.spec_stats, repro=repro, crash=f.crash,
            last_completed_step=f.last_completed_step, coverage=dict(f.coverage), elapsed_s=round(f.elapsed_s, 2),
        )

    @property
    def passed(self) -> bool:
        return self.first_divergence is None and all(r.clean for r in self.detectors.values())

    def violations(self, detector: str) -> int:
        found = self.detectors.get(detector)
        return found.violations if found is not None else 0

    def to_dict(self) -> dict:
        return dict(asdict(self), detectors={name: r.to_dict() for name, r in self.detectors.items()}, passed=self.passed)


def unchecked_notes(runs: Sequence[RunRecord]) -> list[str]:
    """The report's note of each detector that declares one and that some run armed but could not check."""
    unchecked = {name for r in runs for name, result in r.detectors.items() if not result.checked}
    return [d.unchecked_note for d in in_report_order(unchecked) if d.unchecked_note]


def chisq_passed(chisq: dict) -> bool:
    """Statistics that ran must have passed; ones that are not available or skipped do not fail the job."""
    return chisq.get("status") in ("not available", "skipped") or (chisq.get("status") == "ran" and chisq.get("passed") is True)


def build_summary(runs: Sequence[RunRecord], chisq: dict, *, device: str, seed: int, runner: str, model: str,
                  quick: bool, elapsed_s: float, notes: Sequence[str] = (), command: str = "verify",
                  provenance: dict | None = None, require_coverage: bool = False,
                  status: str = STATUS_COMPLETE) -> dict:
    """The ``summary.json`` document for ``runs`` and the statistics section ``chisq``.

    ``require_coverage``: a feature of `runnercheck.stress.run.coverage.FEATURES` that no run exercised fails the job.
    ``status``: ``incomplete`` for a job that was interrupted (``runs``: those that finished; its
    ``notes`` should say where it stopped); it never passes and its coverage is not gated.
    """
    complete = status == STATUS_COMPLETE
    require_coverage = require_coverage and complete
    from runnercheck.stress.run.coverage import merge, zero_features

    coverage = merge(r.coverage for r in runs)
    zero = zero_features(coverage) if require_coverage else []
    divergences = sum(r.first_divergence is not None for r in runs)
    run_dicts = [r.to_dict() for r in runs]
    detectors = detector_totals(run_dicts)
    doc = {
        "version": SUMMARY_VERSION,
        "command": command,
        "status": status,
        "provenance": provenance if provenance is not None else {},
        "passed": complete and bool(runs) and divergences == 0 and all(t["violations"] == 0 for t in detectors.values())
        and chisq_passed(chisq) and not zero,
        "device": device,
        "seed": seed,
        "runner": runner,
        "model": model,
        "quick": quick,
        "divergences": divergences,
        "detectors": detectors,
        "steps": sum(r.steps for r in runs),
        "requests": sum(r.requests for r in runs),
        "ties": sum(r.ties for r in runs),
        "tokens_compared": sum(r.tokens_compared for r in runs),
        "chisq": chisq,
        "runs": run_dicts,
        "coverage": coverage,
        "coverage_zero": zero,
        "coverage_gated": require_coverage,
        "elapsed_s": round(elapsed_s, 2),
        "notes": list(notes),
    }
    validate_summary(doc)
    return doc


_INT_KEYS = ("divergences", "steps", "requests", "ties", "tokens_compared", "seed")
_RUN_INT_KEYS = ("seed", "ticks", "steps", "requests", "finished", "tokens_compared", "logprobs_compared", "ties")


def detector_totals(runs: Sequence[dict]) -> dict[str, dict[str, int]]:
    """``{name: {"violations", "runs_checked", "runs"}}`` over the runs' ``detectors`` (registry order):
    ``runs`` counts the runs that armed the detector, ``runs_checked`` those it could watch."""
    totals: dict[str, dict[str, int]] = {}
    for d in in_report_order({name for r in runs for name in r["detectors"]}):
        results = [r["detectors"][d.name] for r in runs if d.name in r["detectors"]]
        totals[d.name] = {"violations": sum(x["violations"] for x in results),
                          "runs_checked": sum(bool(x["checked"]) for x in results), "runs": len(results)}
    return totals


def detector_results(runs: Sequence[dict], name: str) -> list[DetectorResult]:
    """Detector ``name``'s results over the runs of a summary document that armed it."""
    return [DetectorResult.from_dict(r["detectors"][name]) for r in runs if name in r["detectors"]]


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def validate_summary(doc: Any) -> None:
    """Raise `SummaryError` unless ``doc`` follows the ``summary.json`` schema (and its totals add up)."""
    if not isinstance(doc, dict):
        raise SummaryError(f"a summary is a JSON object, got {type(doc).__name__}")
    if doc.get("version") != SUMMARY_VERSION:
        raise SummaryError(f"unknown summary version {doc.get('version')!r}")
    for key in _INT_KEYS:
        if not _is_count(doc.get(key)):
            raise SummaryError(f"field {key!r} must be an int >= 0, got {doc.get(key)!r}")
    for key in ("passed", "quick"):
        if not isinstance(doc.get(key), bool):
            raise SummaryError(f"field {key!r} must be a bool, got {doc.get(key)!r}")
    if doc.get("device") not in ("cuda", "cpu", "sim"):
        raise SummaryError(f"field 'device' must be one of cuda, cpu, sim, got {doc.get('device')!r}")
    chisq = doc.get("chisq")
    if not isinstance(chisq, dict) or chisq.get("status") not in CHISQ_STATUSES:
        raise SummaryError(f"field 'chisq' must be an object whose status is one of {CHISQ_STATUSES}")
    if chisq["status"] == "ran" and not isinstance(chisq.get("passed"), bool):
        raise SummaryError("chisq.passed must be a bool when the statistics ran")
    _validate_chisq_samplers(chisq)
    status = doc.get("status", STATUS_COMPLETE)  # summaries written before the field were complete
    if status not in STATUSES:
        raise SummaryError(f"field 'status' must be one of {STATUSES}, got {status!r}")
    runs = doc.get("runs")
    if not isinstance(runs, list) or (not runs and status == STATUS_COMPLETE):
        raise SummaryError("field 'runs' must be a list, non-empty unless the status is incomplete")
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            raise SummaryError(f"runs[{i}] must be an object")
        for key in _RUN_INT_KEYS:
            if not _is_count(run.get(key)):
                raise SummaryError(f"runs[{i}].{key} must be an int >= 0, got {run.get(key)!r}")
        if not isinstance(run.get("passed"), bool) or not isinstance(run.get("name"), str):
            raise SummaryError(f"runs[{i}] needs a string 'name' and a bool 'passed'")
        _validate_run_detectors(i, run)
    totals = {
        "divergences": sum(r.get("first_divergence") is not None for r in runs),
        "steps": sum(r["steps"] for r in runs),
        "ties": sum(r["ties"] for r in runs),
    }
    for key, total in totals.items():
        if doc.get(key, 0) != total:
            raise SummaryError(f"field {key!r} is {doc[key]} but the runs add up to {total}")
    if doc.get("detectors") != detector_totals(runs):
        raise SummaryError(f"field 'detectors' is {doc.get('detectors')!r} but the runs add up to {detector_totals(runs)!r}")
    if not isinstance(doc.get("provenance"), dict) or not isinstance(doc.get("command"), str):
        raise SummaryError("fields 'provenance' (an object) and 'command' (a string) are required")
    if not isinstance(doc.get("coverage_gated", False), bool):
        raise SummaryError("field 'coverage_gated' must be true or false")
    coverage, zero = doc.get("coverage"), doc.get("coverage_zero")
    if not isinstance(coverage, dict) or not all(_is_count(v) for v in coverage.values()) or not isinstance(zero, list) \
            or any(coverage.get(f) != 0 for f in zero):
        raise SummaryError("field 'coverage' must map features to counts and 'coverage_zero' list features counted 0")
    expected = status == STATUS_COMPLETE and all(r["passed"] for r in runs) and chisq_passed(chisq) and not zero
    if doc["passed"] != expected:
        raise SummaryError(f"field 'passed' is {doc['passed']} but the runs and statistics say {expected}")


def _validate_run_detectors(i: int, run: dict) -> None:
    """A run's ``detectors`` maps names to results, and its verdict follows them and its divergence."""
    detectors = run.get("detectors")
    if not isinstance(detectors, dict):
        raise SummaryError(f"runs[{i}].detectors must be an object mapping detector names to results")
    for name, result in detectors.items():
        try:
            DetectorResult.from_dict(result)
        except DetectorResultError as e:
            raise SummaryError(f"runs[{i}].detectors.{name}: {e}") from None
    expected = run.get("first_divergence") is None and all(r["violations"] == 0 for r in detectors.values())
    if run["passed"] != expected:
        raise SummaryError(f"runs[{i}].passed is {run['passed']} but its divergence and detectors say {expected}")


def _validate_chisq_samplers(chisq: dict) -> None:
    """Statistics that ran name every sampler they ran on, and their verdict follows those samplers'."""
    samplers = chisq.get("samplers")
    if chisq["status"] not in ("ran", "error"):
        if samplers is not None and not isinstance(samplers, list):
            raise SummaryError("chisq.samplers must be a list")
        return
    if not isinstance(samplers, list) or not samplers:
        raise SummaryError("chisq.samplers must name the sampler(s) the statistics ran on")
    for i, entry in enumerate(samplers):
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) and entry[k] for k in ("sampler", "role", "scope")):
            raise SummaryError(f"chisq.samplers[{i}] needs non-empty strings 'sampler', 'role' and 'scope'")
        if entry.get("status") not in ("ran", "not available", "error"):
            raise SummaryError(f"chisq.samplers[{i}].status must be ran, not available or error")
        if entry["status"] == "ran" and not isinstance(entry.get("passed"), bool):
            raise SummaryError(f"chisq.samplers[{i}].passed must be a bool when it ran")
    ran = [e for e in samplers if e["status"] in ("ran", "error")]
    expected = bool(ran) and all(e.get("passed") is True for e in ran)
    if chisq.get("passed") is not expected:
        raise SummaryError(f"chisq.passed is {chisq.get('passed')} but its samplers say {expected}")


def render_markdown(doc: dict) -> str:
    """``summary.md``: the verdict, the totals, one table row per run, findings, the statistics."""
    verdict = "PASSED" if doc["passed"] else "FAILED"
    lines = [
        f"# runnercheck {doc['command']}: {verdict}",
        "",
        f"device `{doc['device']}`, seed {doc['seed']}, runner `{doc['runner']}`, model `{doc['model']}`"
        f"{', quick' if doc['quick'] else ''}; {doc['elapsed_s']:.1f} s",
        "",
        "| check | result |",
        "|---|---|",
        f"| runner vs oracle | {doc['divergences']} divergent run(s); {doc['steps']} steps, {doc['tokens_compared']} tokens compared, {doc['ties']} tie(s) adopted |",
    ]
    detectors = in_report_order(doc["detectors"])
    lines += [f"| {d.label} | {d.total(detector_results(doc['runs'], d.name))} |" for d in detectors]
    lines += [
        f"| sampler statistics | {chisq_line(doc['chisq'])} |",
        f"| coverage | {coverage_tally(doc).headline()}"
        f"{'; NOT exercised: ' + ', '.join(doc['coverage_zero']) if doc['coverage_zero'] else ''} |",
        "",
        "## Runs",
        "",
        "| run | seed | lag / delay | ticks | steps | requests | tokens | ties | " + "".join(f"{d.column} | " for d in detectors)
        + "result |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(detectors) + "---|",
    ]
    for r in doc["runs"]:
        policy = _policy(r.get("lag_policy")) or _policy(r.get("delay_policy")) or "-"
        cells = "".join(f"{d.cell(DetectorResult.from_dict(r['detectors'][d.name])) if d.name in r['detectors'] else '-'} | "
                        for d in detectors)
        lines.append(
            f"| {r['name']} | {r['seed']} | {policy} | {r['ticks']} | {r['steps']} | {r['requests']} | {r['tokens_compared']} "
            f"| {r['ties']} | {cells}{'ok' if r['passed'] else '**FAIL**'} |"
        )
    findings = [r for r in doc["runs"] if not r["passed"]]
    if findings:
        lines += ["", "## Findings", ""]
        for r in findings:
            lines.append(f"### {r['name']} (seed {r['seed']})")
            lines.append("")
            if r.get("crash"):
                lines.append(f"- crash: {r['crash']} (last completed step {r.get('last_completed_step')})")
            if r.get("first_divergence"):
                lines.append(f"- divergence: `{r['first_divergence']}`")
                lines += [f"  - also: `{d}`" for d in r.get("divergence_lines", [])[1:]]
            if r.get("repro"):
                lines.append(f"- repro: `{r['repro']}` (`runnercheck replay {r['repro']}`)")
            for d in in_report_order(r["detectors"]):
                result = r["detectors"][d.name]
                if result["violations"]:
                    lines += [f"- {d.tag.lower()}: `{line}`" for line in result["lines"]]
            lines.append("")
    ties = [t for r in doc["runs"] for t in r.get("tie_lines", [])]
    if ties:
        lines += ["", "## Ties adopted", ""] + [f"- {t}" for t in ties[:20]]
        if len(ties) > 20:
            lines.append(f"- ... and {len(ties) - 20} more")
    lines += ["", "## Coverage", "", "| feature | count |", "|---|---:|"]
    lines += [f"| {name} | {'**0**' if n == 0 else n} |" for name, n in doc["coverage"].items()]
    if doc.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    if doc.get("provenance"):
        lines += ["", "## Provenance", ""] + markdown_lines(doc["provenance"])
    text = "\n".join(lines).rstrip() + "\n"
    if doc.get("status") == STATUS_INCOMPLETE:
        text = incomplete_banner("the run was interrupted; this report holds only what finished before it stopped "
                                 "(see Notes)") + text
    return text


def coverage_tally(doc: dict) -> "CoverageTally":
    """The coverage headline's numbers of a summary document; whether the gate was on is its ``coverage_gated``
    (a summary written before that field: on exactly when ``coverage_zero`` lists a failure)."""
    from runnercheck.stress.run.coverage import tally

    return tally(doc["coverage"], gated=bool(doc.get("coverage_gated", doc["coverage_zero"])))


def _policy(p: dict | None) -> str:
    return describe_policy(p) if p else ""


def chisq_line(chisq: dict) -> str:
    """One line: the verdict, then each sampler the statistics ran on, by name, role and scope."""
    status = chisq.get("status")
    if status == "ran":
        return ("passed" if chisq.get("passed") else "**FAILED**") + (f" ({chisq['summary']})" if chisq.get("summary") else "")
    if status == "error":
        return f"**error**: {chisq.get('note', '')}"
    return f"{status}: {chisq.get('note', '')} -- the sampler's distribution was NOT checked"


def write_report(out_dir: str | Path, doc: dict) -> tuple[Path, Path]:
    """Validate ``doc`` and write ``summary.json`` and ``summary.md`` into ``out_dir``.

    Commands call it inside `runnercheck.checks.report_folder.atomic_report_folder`, on the temporary folder.
    """
    validate_summary(doc)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "summary.json", out / "summary.md"
    json_path.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str, allow_nan=False) + "\n")
    md_path.write_text(render_markdown(doc))
    return json_path, md_path


def load_summary(path: str | Path) -> dict:
    """Read and validate a ``summary.json``."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SummaryError(f"{path}: cannot read a summary ({e})") from None
    validate_summary(doc)
    return doc


__all__ = ["RunRecord", "SummaryError", "SUMMARY_VERSION", "build_summary", "detector_results", "detector_totals", "unchecked_notes", "validate_summary", "render_markdown",
           "write_report", "load_summary", "chisq_passed", "chisq_line", "coverage_tally"]
