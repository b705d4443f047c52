"""The report of a `runnercheck mutants` run: per-mutant and control results, DIR/mutants.json and
the Markdown kill matrix DIR/mutants.md (`runnercheck.stress.cli.mutants_cmd` runs the catalogue and fills them in).

Ownership: a `MutantsReport` owns its result lists (host, built once by ``run_catalogue``, read
here); `write_report` writes the two files and nothing else.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runnercheck.stress.mutants.registry import known_checks


# --------------------------------------------------------------------------- results


MUTANTS_VERSION = 2  # mutants.json format: 2 adds "version" and "provenance"


@dataclass
class MutantResult:
    name: str
    cls: str
    description: str
    needs_gpu: bool
    designed: list[str]
    workload: str
    status: str  # killed | survived | skipped
    killed: bool
    killed_by: list[str]
    as_designed: bool
    checks_run: list[str]
    evidence: dict[str, str]
    ticks: int
    seconds: float
    skip_reason: str | None = None


@dataclass
class ControlResult:
    """An unmutated control run: a workload's differential run or a chi-square probe."""

    kind: str  # "workload" | "chisq"
    name: str
    fired: dict[str, str]
    ticks: int
    seconds: float

    @property
    def clean(self) -> bool:
        return not self.fired


@dataclass
class MutantsReport:
    device: str
    quick: bool
    seed: int
    chisq: bool
    command: str
    date: str
    mutants: list[MutantResult]
    controls: list[ControlResult]
    elapsed_s: float
    provenance: dict = field(default_factory=dict)
    version: int = MUTANTS_VERSION
    status: str = "complete"  # "incomplete": interrupted; holds the mutants (and controls) that finished
    interrupted: str | None = None  # where an incomplete run stopped

    @property
    def passed(self) -> bool:
        run = [m for m in self.mutants if m.status != "skipped"]
        return self.status == "complete" and all(m.as_designed for m in run) and all(c.clean for c in self.controls)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["controls"] = [dict(asdict(c), clean=c.clean) for c in self.controls]
        d["passed"] = self.passed
        d["mutants"] = [dict(asdict(m), **{"class": m.cls}) for m in self.mutants]
        for m in d["mutants"]:
            del m["cls"]
        return d


class MutantsReportError(ValueError):
    """A mutants.json that is not a report this version can read (named by its path)."""


def read_report(path: str | Path) -> MutantsReport:
    """The `MutantsReport` a ``mutants.json`` holds; `MutantsReportError` naming the file otherwise."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
        if d.get("version") != MUTANTS_VERSION:
            raise ValueError(f"format version {d.get('version')!r}, this runnercheck reads {MUTANTS_VERSION}")
        mutants = [MutantResult(**{("cls" if k == "class" else k): v for k, v in m.items()}) for m in d["mutants"]]
        controls = [ControlResult(**{k: v for k, v in c.items() if k != "clean"}) for c in d["controls"]]
        return MutantsReport(device=d["device"], quick=d["quick"], seed=d["seed"], chisq=d["chisq"], command=d["command"],
                             date=d["date"], mutants=mutants, controls=controls, elapsed_s=d["elapsed_s"],
                             provenance=d.get("provenance", {}), version=d["version"],
                             status=d.get("status", "complete"), interrupted=d.get("interrupted"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise MutantsReportError(f"{path}: not a readable mutants report ({type(e).__name__}: {e})") from None


# --------------------------------------------------------------------------- Markdown and JSON


def _cell(result: MutantResult, check: str) -> str:
    if check in result.evidence:
        text = "KILL"
    elif check in result.checks_run:
        text = "-"
    else:
        text = ""
    return f"**{text or 'not run'}**" if check in result.designed else text


def markdown(report: MutantsReport) -> str:
    """The kill matrix, the controls and each mutant's evidence, as the text of DIR/mutants.md
    (an incomplete run's banner first, the provenance last)."""
    from runnercheck.checks.interrupts import incomplete_banner
    from runnercheck.checks.provenance import markdown_lines

    banner = incomplete_banner(report.interrupted or "interrupted") if report.status != "complete" else ""
    provenance = ("\n## Provenance\n\n" + "\n".join(markdown_lines(report.provenance)) + "\n") if report.provenance else ""
    return banner + _matrix_markdown(report) + provenance


def _matrix_markdown(report: MutantsReport) -> str:
    checks = known_checks()
    run = [m for m in report.mutants if m.status != "skipped"]
    killed = sum(m.as_designed for m in run)
    lines = [
        "# Mutant kill matrix", "",
        f"`{report.command}` on {report.date}: device {report.device}, seed {report.seed}, "
        f"{'quick' if report.quick else 'full'} run, chi-square {'on' if report.chisq else 'off'}, {report.elapsed_s:.0f} s.", "",
        f"**{killed} of {len(run)} mutants killed as designed**"
        f"{f', {len(report.mutants) - len(run)} skipped' if len(run) < len(report.mutants) else ''}; "
        f"controls {'clean' if all(c.clean for c in report.controls) else 'NOT CLEAN'}.", "",
        "KILL: the check fired; -: armed and silent until the run stopped (at the first kill or the tick budget); "
        "blank: not run; bold: a check the mutant is designed to be killed by.", "",
        "| mutant | class | " + " | ".join(checks) + " | status | ticks | seconds |",
        "|---|---|" + "---|" * len(checks) + "---|---:|---:|",
    ]
    for m in report.mutants:
        status = m.status if m.status != "killed" or m.as_designed else "killed (not as designed)"
        if m.skip_reason:
            status += f" ({m.skip_reason})"
        lines.append(f"| `{m.name}` | {m.cls} | " + " | ".join(_cell(m, c) for c in checks)
                     + f" | {status} | {m.ticks} | {m.seconds:.1f} |")
    lines += ["", "## Controls (no mutant: every check must stay silent)", "",
              "| control | ticks | fired | seconds |", "|---|---:|---|---:|"]
    for c in report.controls:
        lines.append(f"| {c.kind} `{c.name}` | {c.ticks} | {', '.join(c.fired) or 'none'} | {c.seconds:.1f} |")
    lines += ["", "## Mutants and evidence", ""]
    for m in report.mutants:
        lines.append(f"* `{m.name}` ({m.cls}, workload `{m.workload}`): {m.description}.")
        for check, text in m.evidence.items():
            lines.append(f"  * {check}: {text}")
    return "\n".join(lines) + "\n"


def write_report(report: MutantsReport, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``out_dir``/mutants.json and ``out_dir``/mutants.md (creating the folder); returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "mutants.json", out / "mutants.md"
    json_path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    md_path.write_text(markdown(report))
    return json_path, md_path


__all__ = ["ControlResult", "MutantResult", "MutantsReport", "markdown", "write_report"]
