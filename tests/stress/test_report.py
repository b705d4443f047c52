"""Summaries say what ran: the coverage headline counts features a run exercised (count > 0) and
words which unreached ones are gated, and every title and JUnit suite names the command that ran."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from runnercheck.checks.junit import suite_name
from runnercheck.stress.run.coverage import FEATURES, merge, tally
from runnercheck.stress.report.junit_cases import verify_cases, write_cases
from runnercheck.stress.report.summary import RunRecord, build_summary, render_markdown
from runnercheck.stress.run.staged_writes import STAGED_FEATURES, UNGATED_STAGED_FEATURES

GATED_STAGED = tuple(f for f in STAGED_FEATURES if f not in UNGATED_STAGED_FEATURES)


def _record(coverage: dict) -> RunRecord:
    return RunRecord(name="r", seed=0, lag_policy=None, delay_policy=None, scheduler={}, ticks=3, steps=3, requests=1,
                     finished=0, tokens_compared=3, logprobs_compared=0, ties=0, coverage=coverage)


def _summary(coverage: dict, *, command: str = "verify", gate: bool = False) -> dict:
    return build_summary([_record(coverage)], {"status": "skipped", "passed": None}, device="sim", seed=0, runner="r:f",
                         model="micro", quick=True, elapsed_s=1.0, command=command, require_coverage=gate)


def _coverage(reached: int) -> dict:
    """Every feature (and the staged-write patterns) at zero but the first ``reached`` of `FEATURES`."""
    counts = {f: 0 for f in FEATURES + STAGED_FEATURES}
    counts.update({f: 2 for f in FEATURES[:reached]})
    return counts


def _coverage_row(md: str) -> str:
    return next(line for line in md.splitlines() if line.startswith("| coverage |"))


def test_the_headline_counts_features_with_a_count_not_every_feature() -> None:
    counts = _coverage(22)
    total = len(counts)
    row = _coverage_row(render_markdown(_summary(counts)))
    assert f"22 of {total} features exercised" in row
    assert f"{total - 22} never reached" in row and f"{total} of {total}" not in row


def test_a_run_of_nothing_says_it_exercised_nothing() -> None:
    total = len(merge([{}]))
    assert tally(merge([{}]), gated=False).headline().startswith(f"0 of {total} features exercised")


def test_the_headline_tells_gated_from_shown_only_features() -> None:
    counts = _coverage(len(FEATURES) - 1)  # one gated feature and every staged-write pattern at zero
    unreached_gated = 1 + len(GATED_STAGED)
    gated = _coverage_row(render_markdown(_summary(counts, gate=True)))
    assert f"{unreached_gated} gated, failing the run" in gated
    assert f"{len(UNGATED_STAGED_FEATURES)} shown only" in gated
    ungated = _coverage_row(render_markdown(_summary(counts, gate=False)))
    assert "not gated in this run" in ungated and "failing" not in ungated
    assert f"{unreached_gated} the coverage gate checks; {len(UNGATED_STAGED_FEATURES)} shown only" in ungated


def test_a_gated_run_that_passed_names_its_shown_only_features_not_an_ungated_run() -> None:
    """A verify whose gate passed with only shown-only patterns at zero (an H100 run said "not gated in this run")."""
    counts = {f: 1 for f in FEATURES + STAGED_FEATURES} | {f: 0 for f in UNGATED_STAGED_FEATURES}
    row = _coverage_row(render_markdown(_summary(counts, gate=True)))
    assert f"never reached: {len(UNGATED_STAGED_FEATURES)} shown only" in row and "not gated" not in row


def test_a_fully_covered_run_says_so_without_a_remainder() -> None:
    counts = {f: 1 for f in FEATURES + STAGED_FEATURES}
    assert tally(counts, gated=True).headline() == f"{len(counts)} of {len(counts)} features exercised"


@pytest.mark.parametrize("command", ["verify", "stress"])
def test_summary_md_is_titled_by_the_command_that_ran(command: str) -> None:
    md = render_markdown(_summary(_coverage(len(FEATURES)), command=command))
    assert md.splitlines()[0] == f"# runnercheck {command}: PASSED"


def test_the_terminal_summary_is_titled_by_the_command_that_ran(capsys) -> None:
    from runnercheck.stress.report.render import print_verify_summary

    print_verify_summary(_summary(_coverage(3), command="stress"), [])
    out = capsys.readouterr().out
    assert "runnercheck stress: PASSED" in out and "runnercheck verify" not in out
    assert "coverage: 3 of" in out


def test_junit_suite_and_classes_name_the_command(tmp_path: Path) -> None:
    doc = _summary(_coverage(len(FEATURES)), command="stress")
    root = ET.parse(write_cases(tmp_path / "j.xml", suite_name(doc["command"]), verify_cases(doc))).getroot()
    assert root.get("name") == "runnercheck stress" and root.find("testsuite").get("name") == "runnercheck stress"
    assert {c.get("classname") for c in root.iter("testcase")} == {"runnercheck.stress.sim"}


def test_the_junit_coverage_case_is_skipped_not_passed_when_coverage_was_not_gated() -> None:
    counts = _coverage(5)
    ungated = next(c for c in verify_cases(_summary(counts, gate=False)) if c.name == "coverage")
    assert ungated.failure is None and ungated.skipped is not None and "not gated" in ungated.skipped
    gated = next(c for c in verify_cases(_summary(counts, gate=True)) if c.name == "coverage")
    assert gated.failure is not None and gated.skipped is None
    assert gated.properties == {"features": len(counts), "exercised": 5}
