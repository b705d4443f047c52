"""Conventions as data (`runnercheck.checks.chisq.conventions`) and the diagnosis of a failure against them.

The done-when of issue 57: for each shipped convention, a sampler written the way that engine's source does it
(tests/checks/convention_samplers.py) passes under ``--convention`` of that name and fails under the contract with
a diagnosis that names the convention.  Only the quick cases that separate the conventions are drawn.
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from runnercheck.checks.chisq import draws as chisq_draws
from runnercheck.checks.chisq import execute as chisq_execute
from runnercheck.checks.chisq import plan as chisq_plan
from runnercheck.checks.chisq import samplers as chisq_samplers
from runnercheck.checks.chisq.binding import case_problems
from runnercheck.checks.chisq.cases import build_cases, top_p_ties_case
from runnercheck.checks.chisq.conventions import (
    CONTRACT, CONVENTIONS, Convention, ConventionError, convention_distribution, get_convention,
)
from runnercheck.checks.chisq.stats import RunSummary

sys.path.insert(0, str(Path(__file__).parent))
from convention_samplers import SAMPLERS  # noqa: E402

# The quick cases that tell each convention from the contract (none for flashinfer-top-k-first: its
# distribution is the contract's, so it must pass under both).
SEPARATING = {
    "vllm-v1": ("top-p-ties-v16",),
    "vllm-mrv2": ("top-p-ties-v16",),
    "transformers": ("bind-p-slack-minp-t0.6-v32", "top-p-ties-v16"),
    "sglang-torch": ("bind-p-slack-k-t0.6-v32", "top-p-ties-v16"),
    "sglang-flashinfer": ("bind-p-slack-k-t0.6-v32", "bind-p-slack-minp-t0.6-v32"),
    "flashinfer-joint": ("bind-p-slack-k-t0.6-v32",),
    "flashinfer-top-k-first": ("bind-p-slack-k-t0.6-v32", "bind-p-slack-minp-t0.6-v32"),
}
SAME_AS_CONTRACT = {"flashinfer-top-k-first"}


def _cases(names):
    by_name = {c.name: c for c in build_cases(quick=True)}
    return [by_name[n] for n in names]


def _run(sampler, names, convention):
    opts = chisq_plan.RunOptions(quick=True, seed=5, convention=convention)
    with chisq_execute.single_threaded_on_cpu(torch.device("cpu")):
        results, skipped = chisq_execute.run_cases(sampler, _cases(names), opts, torch.device("cpu"))
    assert not skipped
    return results


def test_every_shipped_convention_has_a_sampler_and_separating_cases() -> None:
    assert set(SEPARATING) == set(SAMPLERS) == set(CONVENTIONS) - {"contract"}
    assert all(c.citation for c in CONVENTIONS.values())


def test_contract_is_the_reference_oracle_on_the_whole_quick_catalogue() -> None:
    for case in build_cases(quick=True):
        expected = chisq_draws.expected_rows(case)
        for j in range(case.rows):
            got = convention_distribution(case.logits[j], case.params, CONTRACT, case.history.prompt_ids,
                                          case.history.output_ids)
            np.testing.assert_allclose(got, expected[j], atol=1e-12, rtol=0, err_msg=case.name)


@pytest.mark.parametrize("name", sorted(SEPARATING))
def test_sampler_passes_its_convention_and_fails_the_contract_naming_it(name: str) -> None:
    sampler = SAMPLERS[name]
    own = _run(sampler, SEPARATING[name], name)
    assert own and all(t.passed for t in own), [(t.name, t.p_value) for t in own if not t.passed]
    under_contract = _run(sampler, SEPARATING[name], "contract")
    failed = [t for t in under_contract if not t.passed]
    if name in SAME_AS_CONTRACT:
        assert not failed
        return
    assert failed
    for t in failed:
        d = t.diagnosis
        assert d is not None and d["convention"] == "contract"
        assert name in [f["convention"] for f in d["fits"] if f["fits"]], d["fits"]
        assert name in d["verdict"] and "contract" not in [f["convention"] for f in d["fits"] if f["fits"]]


def test_transformers_failure_says_top_p_is_measured_before_min_p(tmp_path) -> None:
    from runnercheck.checks.chisq.report import markdown, write_report

    results = _run(SAMPLERS["transformers"], ("bind-p-slack-minp-t0.6-v32",), "contract")
    summary = RunSummary(sampler="transformers-style", device="cpu", quick=True, seed=5, alpha=0.01, correction="holm",
                         tests=results)
    md = markdown(summary)
    assert "## Diagnosis of failed cases" in md and "top-p measured before min-p" in md
    assert "impossible tokens drawn" in md and "## Filter-pair grid" in md and "fail**" in md
    # Every impossible id is listed, none cut short; the HTML gets the linear residual plot.
    [failed] = [t for t in results if not t.passed]
    for e in failed.diagnosis["impossible"]:
        assert f"{e['token']} (rank {e['rank']}): {e['count']}" in md
    paths = write_report(tmp_path, summary)
    assert "residuals of the kept tokens" in paths["html"].read_text()
    assert json.loads(paths["json"].read_text())["tests"][0]["diagnosis"]["verdict"]


def test_a_correct_sampler_failing_nowhere_gets_no_diagnosis() -> None:
    results = _run(chisq_samplers.load_sampler("gumbel"), ("top-p-ties-v16", "bind-p-slack-k-t0.6-v32"), "contract")
    assert all(t.passed and t.diagnosis is None for t in results)


def test_a_sampler_no_convention_explains_is_said_to_fit_none() -> None:
    from runnercheck.checks.chisq.samplers import planted_sampler

    results = _run(planted_sampler("top-p-extra-token"), ("top-p-v97",), "contract")
    [failed] = [t for t in results if not t.passed]
    assert "fit no shipped convention" in failed.diagnosis["verdict"]


def test_tie_case_must_put_the_tie_at_the_boundary() -> None:
    case = top_p_ties_case(20_000)
    assert case_problems(case) == []
    # top-p reached before the tied tokens: every tie rule keeps the same set, the case would test nothing.
    moved = replace(case, params=replace(case.params, top_p=0.1))
    assert any("not detectable" in p for p in case_problems(moved))


def test_conventions_are_checked_data() -> None:
    with pytest.raises(ConventionError, match="each filter"):
        Convention("bad", "bad", CONTRACT.order[:-1])
    with pytest.raises(ConventionError, match="allowed"):
        replace(CONTRACT, top_p_mass="sideways")
    with pytest.raises(ConventionError, match="known: contract, vllm-v1"):
        get_convention("vllm")


def test_cli_rejects_an_unknown_convention_at_parse_time(tmp_path, capsys) -> None:
    from runnercheck.stress.cli.main import main

    rc = main(["chisq", "--quick", "--convention", "vllm", "--out", str(tmp_path / "r")])
    assert rc == 2 and "sglang-torch" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_cli_convention_reaches_the_report(tmp_path) -> None:
    from runnercheck.stress.cli.main import main

    rc = main(["chisq", "--quick", "--convention", "transformers", "--cases", "bind-p-slack-minp-t0.6",
               "--sampler", "gumbel", "--no-calibration", "--no-power", "--no-spec", "--device", "cpu",
               "--out", str(tmp_path / "r")])
    report = json.loads((tmp_path / "r" / "chisq.json").read_text())
    # The contract's sampler fails under transformers' convention, and the diagnosis says the draws fit the contract.
    assert rc == 1 and report["convention"] == "transformers"
    assert any("draws fit contract" in (t["diagnosis"] or {}).get("verdict", "") for t in report["tests"])
