"""`runnercheck mutants --campaign verify`: a mutant run through verify's own plan, in order, until a run
kills it; the control runs the same plan unmutated for the ticks the kill took."""
from __future__ import annotations

from runnercheck.stress.mutants.catalogue import CATALOGUE
from runnercheck.stress.cli.mutants_cmd import MutantsOptions, run_controls, run_mutant
from runnercheck.stress.mutants.verify_campaign import plan_ticks, verify_plan


def test_the_campaign_is_verifys_own_plan() -> None:
    quick = verify_plan("sim", 5, True, True)
    assert [p.config.seed for p in quick] == list(range(5, 5 + len(quick))) and all(p.config.mutant is None for p in quick)
    assert plan_ticks("sim", 5) == sum(p.config.steps for p in verify_plan("sim", 5, False, True))


def test_a_race_mutant_is_killed_by_the_verify_plan_and_its_control_is_clean() -> None:
    opts = MutantsOptions(device="sim", quick=True, seed=0, only=("pageable_nonblocking_copy",), isolate=False,
                          campaign="verify")
    result = run_mutant(CATALOGUE["pageable_nonblocking_copy"], opts)
    assert result.as_designed and result.workload == "verify --quick"
    assert result.evidence["sync"].startswith("[random-drain]")  # the plan's first run killed it
    controls = run_controls([result], opts)
    assert [c.name for c in controls] == ["verify --quick"] and controls[0].clean and controls[0].ticks == result.ticks


def test_an_unknown_campaign_is_a_usage_error(capsys) -> None:
    from runnercheck.stress.cli.main import main

    assert main(["mutants", "--campaign", "nightly", "--out", "/tmp/never"]) == 2
    assert "--campaign" in capsys.readouterr().err
