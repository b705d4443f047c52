"""JUnit renderings of `verify` and `mutants` results (`runnercheck.checks.junit` writes the XML).

A suite is named after the command that ran (`runnercheck.checks.junit.suite_name`), and so are
its cases' class names.

verify: one case per run (failure: its crash, first divergence, or else the first finding of the
detector registry in its order -- `runnercheck.checks.detectors.registry`, so a new detector fails
the case without a change here; properties: seed and repro path), plus one for the coverage gate (skipped when the run did not gate
coverage and left gated features at zero) and one for the statistics.  A case's time is its own
measured wall time (a run's, the statistics'; the gate does no work).
mutants: one case per mutant (failure: it survived, or was killed by other checks than it was
built for; skipped: needs a GPU) and one per control (failure: a check fired on the unmutated
runner).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from runnercheck.checks.detectors.base import DetectorResult
from runnercheck.checks.detectors.registry import in_report_order
from runnercheck.checks.junit import JUnitCase, write_junit
from runnercheck.stress.report.summary import coverage_tally
from runnercheck.stress.run.config import RunSetupError


def check_junit_path(path: str | os.PathLike) -> Path:
    """``--junit FILE`` must be writable (its folder creatable) and not a folder; checked before any work."""
    p = Path(path)
    if p.is_dir():
        raise RunSetupError(f"--junit {p}: is a folder, expected a file name")
    if p.exists() and not os.access(p, os.W_OK):
        raise RunSetupError(f"--junit {p}: file is not writable")
    ancestor = p.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise RunSetupError(f"--junit {p}: cannot create it under {ancestor}")
    return p


def _run_failure(run: dict) -> str | None:
    if run.get("crash"):
        return f"crash: {run['crash']} after step {run.get('last_completed_step')}"
    if run.get("first_divergence"):
        return f"divergence: {run['first_divergence']}"
    for d in in_report_order(run["detectors"]):  # the first detector that found something, in registry order
        failure = d.failure(DetectorResult.from_dict(run["detectors"][d.name]))
        if failure:
            return failure
    return None


def _run_failure_details(run: dict) -> str:
    """The divergences, then each detector's long text (e.g. CSAN's stacks)."""
    details = list(run.get("divergence_lines", []))
    for d in in_report_order(run["detectors"]):
        details += d.details(DetectorResult.from_dict(run["detectors"][d.name]))
    return "\n".join(details)


def verify_cases(doc: dict) -> list[JUnitCase]:
    cases = []
    for run in doc["runs"]:
        props = {"seed": run["seed"], "steps": run["steps"], "tokens_compared": run["tokens_compared"]}
        if run.get("repro"):
            props["repro"] = run["repro"]
        cases.append(JUnitCase(name=f"{run['name']} (seed {run['seed']})", classname=f"runnercheck.{doc['command']}.{doc['device']}",
                               time_s=float(run.get("elapsed_s", 0.0)), failure=_run_failure(run),
                               failure_details=_run_failure_details(run),
                               properties=props))
    zero = doc.get("coverage_zero", [])
    coverage = coverage_tally(doc)
    cases.append(JUnitCase(name="coverage", classname=f"runnercheck.{doc['command']}.{doc['device']}",
                           failure=f"features not exercised: {', '.join(zero)}" if zero else None,
                           # features at zero that this run did not gate (stress, a shard, --no-coverage-gate)
                           skipped=f"not gated: {coverage.headline()}" if coverage.unreached_gated and not zero else None,
                           properties={"features": coverage.total, "exercised": coverage.exercised}))
    chisq = doc["chisq"]
    status = chisq.get("status")
    cases.append(JUnitCase(
        name="sampler statistics", classname=f"runnercheck.{doc['command']}.{doc['device']}",
        time_s=float(chisq.get("elapsed_s", 0.0)),
        failure=None if status in ("not available", "skipped") or chisq.get("passed") else f"{status}: {chisq.get('summary') or chisq.get('note', '')}",
        skipped=f"{status}: {chisq.get('note', '')}" if status in ("not available", "skipped") else None))
    return cases


def mutants_cases(report: Any) -> list[JUnitCase]:
    cases = []
    for m in report.mutants:
        skipped = m.skip_reason if m.status == "skipped" else None
        failure = None
        if skipped is None and not m.as_designed:
            failure = (f"survived: no check fired ({', '.join(m.checks_run)} ran)" if not m.killed
                       else f"killed by {', '.join(m.killed_by)}, not by the checks it was built for ({', '.join(m.designed)})")
        cases.append(JUnitCase(name=m.name, classname=f"runnercheck.mutants.{m.cls}", time_s=m.seconds, failure=failure,
                               failure_details="\n".join(f"{k}: {v}" for k, v in m.evidence.items()), skipped=skipped,
                               properties={"seed": report.seed, "workload": m.workload, "killed_by": ",".join(m.killed_by)}))
    for c in report.controls:
        cases.append(JUnitCase(name=f"control {c.kind} {c.name}", classname="runnercheck.mutants.controls", time_s=c.seconds,
                               failure=None if c.clean else f"a check fired without a mutant: {', '.join(c.fired)}",
                               failure_details="\n".join(f"{k}: {v}" for k, v in c.fired.items()),
                               properties={"seed": report.seed}))
    return cases


def rates_cases(rates: Any) -> list[JUnitCase]:
    """``mutants --seeds N``: one case per mutant (fails below a kill rate of 1.0) and per control."""
    cases = []
    for m in rates.mutants:
        failure = None
        if m.seeds_run and m.rate != 1.0:
            failure = (f"killed as designed in {len(m.seeds_killed_as_designed)} of {len(m.seeds_run)} seeds; "
                       f"survived in {m.survived_in}")
        cases.append(JUnitCase(name=m.name, classname=f"runnercheck.mutants.{m.cls}", time_s=m.seconds, failure=failure,
                               skipped=None if m.seeds_run else (m.skip_reason or "skipped"),
                               properties={"seeds_run": len(m.seeds_run), "kill_rate": m.rate if m.rate is not None else ""}))
    for c in rates.controls:
        cases.append(JUnitCase(name=f"control {c.kind} {c.name}", classname="runnercheck.mutants.controls", time_s=c.seconds,
                               failure=None if c.clean else f"a check fired without a mutant in seeds {c.fired_in}",
                               failure_details="\n".join(f"{k}: {v}" for k, v in c.fired.items()),
                               properties={"seeds_run": len(c.seeds_run)}))
    return cases


def write_cases(path: str | os.PathLike, suite: str, cases: Sequence[JUnitCase], properties: dict | None = None,
                elapsed_s: float | None = None) -> Path:
    return Path(write_junit(path, suite, cases, properties, elapsed_s))


__all__ = ["check_junit_path", "verify_cases", "mutants_cases", "rates_cases", "write_cases"]
