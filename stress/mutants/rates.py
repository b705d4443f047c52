"""Kill rates over seeds: `runnercheck mutants --seeds N` runs the catalogue once per seed and
reports, per mutant, how many of the seeds killed it as designed and which checks fired how often.

On CUDA a race mutant is killed only when a delay opens its window, so one run says little; a rate
over seeds is the claim that survives a re-run on another machine.  A campaign passes when every
mutant that ran was killed as designed in every seed it ran in and every control stayed clean in
every seed.

Files (next to one ``seed-<k>/`` folder per seed holding that seed's `runnercheck.stress.mutants.report`
files): ``rates.json`` (`KillRates.to_dict`) and ``rates.md`` (a table, one row per mutant).

Ownership: a `KillRates` is plain host data built once by `kill_rates` from the per-seed reports;
`write_rates` writes the two files and nothing else.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from runnercheck.stress.mutants.registry import known_checks
from runnercheck.stress.mutants.report import MutantsReport, MutantsReportError, read_report

RATES_VERSION = 1


@dataclass
class KillRate:
    """One mutant over the seeds it ran in (seeds where it was skipped do not count)."""

    name: str
    cls: str
    designed: list[str]
    seeds_run: list[int]
    seeds_killed_as_designed: list[int]
    fired: dict[str, int]  # check -> seeds in which it fired
    skip_reason: str | None = None
    seconds: float = 0.0  # wall time over the seeds it ran in

    @property
    def rate(self) -> float | None:
        """Kills as designed / seeds run; None when it never ran (skipped everywhere)."""
        return len(self.seeds_killed_as_designed) / len(self.seeds_run) if self.seeds_run else None

    @property
    def survived_in(self) -> list[int]:
        return [s for s in self.seeds_run if s not in self.seeds_killed_as_designed]


@dataclass
class ControlRate:
    """One control (a workload or a chi-square probe) over the seeds; ``fired_in`` lists dirty seeds."""

    kind: str
    name: str
    seeds_run: list[int]
    fired_in: list[int]
    fired: dict[str, str] = field(default_factory=dict)  # the first dirty seed's evidence
    seconds: float = 0.0  # wall time over the seeds

    @property
    def clean(self) -> bool:
        return not self.fired_in


@dataclass
class KillRates:
    device: str
    quick: bool
    seeds: list[int]
    command: str
    mutants: list[KillRate]
    controls: list[ControlRate]
    elapsed_s: float
    provenance: dict = field(default_factory=dict)
    version: int = RATES_VERSION

    status: str = "complete"  # "incomplete": a seed's run was interrupted (its report holds what finished)

    @property
    def passed(self) -> bool:
        ran = [m for m in self.mutants if m.seeds_run]
        return self.status == "complete" and all(m.rate == 1.0 for m in ran) and all(c.clean for c in self.controls)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mutants"] = [dict(asdict(m), rate=m.rate, survived_in=m.survived_in) for m in self.mutants]
        d["controls"] = [dict(asdict(c), clean=c.clean) for c in self.controls]
        d["passed"] = self.passed
        return d


def _provenance_now(recorded: dict) -> dict:
    """The seeds' provenance (the code and libraries that ran them), dated and named by this command."""
    from runnercheck.checks.provenance import command_line, utc_now

    return dict(recorded, date=utc_now(), command_line=command_line()) if recorded else {}


def kill_rates(reports: Sequence[MutantsReport], *, command: str = "") -> KillRates:
    """Aggregate one `MutantsReport` per seed (same device and catalogue selection) into `KillRates`."""
    if not reports:
        raise ValueError("kill rates need at least one seed's report")
    mutants: dict[str, KillRate] = {}
    controls: dict[tuple[str, str], ControlRate] = {}
    for report in reports:
        for m in report.mutants:
            rate = mutants.setdefault(m.name, KillRate(m.name, m.cls, list(m.designed), [], [], {c: 0 for c in known_checks()}))
            if m.status == "skipped":
                rate.skip_reason = m.skip_reason
                continue
            rate.seeds_run.append(report.seed)
            rate.seconds += m.seconds
            if m.as_designed:
                rate.seeds_killed_as_designed.append(report.seed)
            for check in m.killed_by:
                rate.fired[check] += 1
        for c in report.controls:
            control = controls.setdefault((c.kind, c.name), ControlRate(c.kind, c.name, [], []))
            control.seeds_run.append(report.seed)
            control.seconds += c.seconds
            if not c.clean:
                control.fired_in.append(report.seed)
                control.fired = control.fired or dict(c.fired)
    return KillRates(device=reports[0].device, quick=reports[0].quick, seeds=[r.seed for r in reports], command=command,
                     mutants=list(mutants.values()), controls=list(controls.values()),
                     elapsed_s=round(sum(r.elapsed_s for r in reports), 1), provenance=_provenance_now(reports[0].provenance),
                     status="complete" if all(r.status == "complete" for r in reports) else "incomplete")


def markdown(rates: KillRates) -> str:
    """rates.md: an incomplete campaign's banner first, the rates table, the provenance last."""
    from runnercheck.checks.interrupts import incomplete_banner
    from runnercheck.checks.provenance import markdown_lines

    banner = incomplete_banner("a seed's run was interrupted: these rates count only what finished") \
        if rates.status != "complete" else ""
    provenance = ("\n## Provenance\n\n" + "\n".join(markdown_lines(rates.provenance)) + "\n") if rates.provenance else ""
    return banner + _rates_markdown(rates) + provenance


def _rates_markdown(rates: KillRates) -> str:
    n = len(rates.seeds)
    checks = known_checks()
    lines = [
        f"# runnercheck mutants: kill rates over {n} seed(s): {'PASS' if rates.passed else 'FAIL'}",
        "",
        f"device `{rates.device}`{', quick' if rates.quick else ''}, seeds {', '.join(map(str, rates.seeds))}; "
        f"{rates.elapsed_s:.0f} s. `{rates.command}`",
        "",
        "| mutant | class | built for | killed as designed | " + " | ".join(checks) + " | survived in seeds |",
        "|---|---|---|---|" + "---|" * len(checks) + "---|",
    ]
    for m in rates.mutants:
        if not m.seeds_run:
            lines.append(f"| {m.name} | {m.cls} | {', '.join(m.designed)} | skipped: {m.skip_reason} |"
                         + " |" * len(checks) + " |")
            continue
        killed = f"{len(m.seeds_killed_as_designed)}/{len(m.seeds_run)}"
        lines.append(f"| {m.name} | {m.cls} | {', '.join(m.designed)} | {killed if m.rate == 1.0 else '**' + killed + '**'} | "
                     + " | ".join(str(m.fired.get(c, 0)) for c in checks)
                     + f" | {', '.join(map(str, m.survived_in)) or '-'} |")
    lines += ["", "| control | seeds clean | fired in seeds |", "|---|---|---|"]
    for c in rates.controls:
        lines.append(f"| {c.kind} {c.name} | {len(c.seeds_run) - len(c.fired_in)}/{len(c.seeds_run)} | "
                     f"{', '.join(map(str, c.fired_in)) or '-'} |")
    return "\n".join(lines) + "\n"


class RatesMergeError(ValueError):
    """Shard folders that do not make one campaign (unreadable, none, different devices, a seed twice)."""


def merge_shards(folders: Sequence[str | Path], *, command: str = "") -> KillRates:
    """The kill rates of one campaign from the ``--seeds --shard`` folders of its jobs (each holding
    ``seed-<k>/mutants.json``): every seed once, one device and budget."""
    reports, where = [], {}
    for folder in folders:
        paths = sorted(Path(folder).glob("seed-*/mutants.json"))
        if not paths:
            raise RatesMergeError(f"{folder}: no seed-<k>/mutants.json (a `mutants --seeds N` report folder?)")
        for path in paths:
            try:
                report = read_report(path)
            except MutantsReportError as e:
                raise RatesMergeError(str(e)) from None
            if report.status != "complete":
                raise RatesMergeError(f"{path}: seed {report.seed} was interrupted (an incomplete report); "
                                      f"rerun its shard before merging")
            if report.seed in where:
                raise RatesMergeError(f"seed {report.seed} is in both {where[report.seed]} and {path}: shards overlap")
            where[report.seed] = path
            reports.append(report)
    kinds = {(r.device, r.quick) for r in reports}
    if len(kinds) > 1:
        raise RatesMergeError(f"the folders mix devices/budgets {sorted(kinds)}: not one campaign")
    return kill_rates(sorted(reports, key=lambda r: r.seed), command=command)


def write_rates(rates: KillRates, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``out_dir``/rates.json and ``out_dir``/rates.md; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "rates.json", out / "rates.md"
    json_path.write_text(json.dumps(rates.to_dict(), indent=2) + "\n")
    md_path.write_text(markdown(rates))
    return json_path, md_path


__all__ = ["ControlRate", "KillRate", "KillRates", "RatesMergeError", "kill_rates", "markdown", "merge_shards", "write_rates"]
