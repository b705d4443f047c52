"""Kill rates over seeds (`runnercheck mutants --seeds N`, `runnercheck.stress.mutants.rates`): the aggregation
names every seed a mutant survived in and every seed a control fired in, and fails the campaign
for either; the CLI writes one report per seed and the rates next to them."""
from __future__ import annotations

import json

import pytest

from runnercheck.stress.cli import main as cli
from runnercheck.stress.report.junit_cases import rates_cases
from runnercheck.stress.mutants.rates import kill_rates, markdown
from runnercheck.stress.mutants.report import ControlResult, MutantResult, MutantsReport


def _mutant(name: str, *, killed: bool, skipped: bool = False) -> MutantResult:
    return MutantResult(name=name, cls="race", description="", needs_gpu=False, designed=["differential"],
                        workload="racing", status="skipped" if skipped else ("killed" if killed else "survived"),
                        killed=killed, killed_by=["differential"] if killed else [], as_designed=killed,
                        checks_run=[] if skipped else ["differential"], evidence={}, ticks=3, seconds=0.1,
                        skip_reason="needs a GPU" if skipped else None)


def _report(seed: int, *, b_killed: bool, control_fired: bool) -> MutantsReport:
    mutants = [_mutant("always", killed=True), _mutant("sometimes", killed=b_killed),
               _mutant("gpu_only", killed=False, skipped=True)]
    controls = [ControlResult("workload", "racing", {"differential": "step 3: token"} if control_fired else {}, 5, 0.2)]
    return MutantsReport(device="sim", quick=True, seed=seed, chisq=False, command="", date="", mutants=mutants,
                         controls=controls, elapsed_s=1.0)


def test_a_mutant_that_survives_one_seed_fails_the_campaign_and_names_the_seed():
    rates = kill_rates([_report(0, b_killed=True, control_fired=False), _report(1, b_killed=False, control_fired=False),
                        _report(2, b_killed=True, control_fired=False)])
    by_name = {m.name: m for m in rates.mutants}
    assert by_name["always"].rate == 1.0 and by_name["always"].fired["differential"] == 3
    assert by_name["sometimes"].rate == 2 / 3 and by_name["sometimes"].survived_in == [1]
    assert by_name["gpu_only"].rate is None and by_name["gpu_only"].skip_reason == "needs a GPU"
    assert not rates.passed and rates.seeds == [0, 1, 2]
    assert "**2/3**" in markdown(rates)
    doc = rates.to_dict()
    assert doc["passed"] is False and doc["mutants"][1]["survived_in"] == [1]
    failures = {c.name: c.failure for c in rates_cases(rates)}
    assert failures["always"] is None and "2 of 3 seeds" in failures["sometimes"]


def test_a_control_that_fires_in_one_seed_fails_the_campaign():
    rates = kill_rates([_report(0, b_killed=True, control_fired=False), _report(1, b_killed=True, control_fired=True)])
    assert [m.rate for m in rates.mutants if m.seeds_run] == [1.0, 1.0]
    assert rates.controls[0].fired_in == [1] and not rates.passed
    assert "fired without a mutant in seeds [1]" in {c.name: c.failure for c in rates_cases(rates)}["control workload racing"]


def test_every_seed_killed_and_clean_passes():
    assert kill_rates([_report(s, b_killed=True, control_fired=False) for s in range(4)]).passed


def test_cli_writes_a_report_per_seed_and_the_rates(tmp_path, capsys):
    out = tmp_path / "rates"
    rc = cli.main(["mutants", "--quick", "--device", "sim", "--only", "item_in_step", "--seeds", "2", "--seed", "5",
                   "--no-chisq", "--no-progress", "--out", str(out), "--junit", str(tmp_path / "j.xml")])
    assert rc == 0, capsys.readouterr().out
    doc = json.loads((out / "rates.json").read_text())
    assert doc["seeds"] == [5, 6] and doc["passed"] is True
    assert [(m["name"], m["rate"]) for m in doc["mutants"]] == [("item_in_step", 1.0)]
    assert (out / "seed-5" / "mutants.json").exists() and (out / "seed-6" / "mutants.md").exists()
    assert "kill_rate" in (tmp_path / "j.xml").read_text()


def test_cli_rejects_a_seed_range_past_the_limit(tmp_path, capsys):
    assert cli.main(["mutants", "--device", "sim", "--seed", str(2**63 - 1), "--seeds", "2", "--out", str(tmp_path / "x")]) == 2
    assert "--seeds 2" in capsys.readouterr().err
    assert cli.main(["mutants", "--device", "sim", "--seeds", "0", "--out", str(tmp_path / "y")]) == 2


def test_a_shard_takes_its_share_of_the_seeds(tmp_path, capsys):
    out = tmp_path / "shard"
    rc = cli.main(["mutants", "--quick", "--device", "sim", "--only", "item_in_step", "--seeds", "3", "--seed", "5",
                   "--shard", "1/2", "--no-chisq", "--no-progress", "--out", str(out)])
    assert rc == 0, capsys.readouterr().out
    assert json.loads((out / "rates.json").read_text())["seeds"] == [6]
    assert not (out / "seed-5").exists() and (out / "seed-6").exists()


def test_a_shard_needs_at_least_as_many_seeds_as_shards(tmp_path, capsys):
    assert cli.main(["mutants", "--device", "sim", "--shard", "0/2", "--out", str(tmp_path / "x")]) == 2
    assert "--seeds 2 or more" in capsys.readouterr().err


def test_the_shards_of_a_campaign_merge_into_its_rates_and_overlaps_are_refused(tmp_path, capsys):
    common = ["mutants", "--quick", "--device", "sim", "--only", "item_in_step", "--seeds", "3", "--seed", "5",
              "--no-chisq", "--no-progress"]
    for shard in ("0/2", "1/2"):
        assert cli.main([*common, "--shard", shard, "--out", str(tmp_path / shard.replace("/", "of"))]) == 0
    capsys.readouterr()
    merged = tmp_path / "merged"
    rc = cli.main(["mutants", "--merge", str(tmp_path / "0of2"), str(tmp_path / "1of2"), "--out", str(merged),
                   "--junit", str(tmp_path / "m.xml")])
    assert rc == 0, capsys.readouterr()
    doc = json.loads((merged / "rates.json").read_text())
    assert doc["seeds"] == [5, 6, 7] and doc["passed"] and doc["mutants"][0]["rate"] == 1.0
    assert "kill_rate" in (tmp_path / "m.xml").read_text()
    # A folder given twice repeats its seeds; an empty folder is no report: both are usage errors, nothing written.
    assert cli.main(["mutants", "--merge", str(tmp_path / "0of2"), str(tmp_path / "0of2"), "--out", str(tmp_path / "x")]) == 2
    assert "shards overlap" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["mutants", "--merge", str(tmp_path / "empty"), "--out", str(tmp_path / "y")]) == 2
    assert "no seed-<k>/mutants.json" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_a_report_round_trips_through_its_json(tmp_path):
    from runnercheck.stress.mutants.report import MutantsReportError, read_report, write_report

    report = _report(3, b_killed=False, control_fired=True)
    write_report(report, tmp_path)
    assert read_report(tmp_path / "mutants.json").to_dict() == report.to_dict()
    (tmp_path / "bad.json").write_text('{"version": 1}')
    with pytest.raises(MutantsReportError, match="bad.json"):
        read_report(tmp_path / "bad.json")
