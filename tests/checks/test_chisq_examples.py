"""The example adapters of docs/examples/ under the chi-square: the transformers warper pipeline (only where the
optional extra is installed) and the plain PyTorch sampler.  Only the quick cases that separate the conventions."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
SEPARATING = "bind-p-slack-minp-t0.6"  # min-p on but slack, top-p binds: generate() measures top-p before min-p


def _chisq(tmp_path: Path, sampler: str, convention: str, cases: str) -> tuple[int, dict, str]:
    from runnercheck.stress.cli.main import main

    out = tmp_path / convention
    rc = main(["chisq", "--quick", "--sampler", sampler, "--convention", convention, "--cases", cases, "--no-calibration",
               "--no-power", "--no-spec", "--no-isolation", "--device", "cpu", "--seed", "2", "--out", str(out)])
    return rc, json.loads((out / "chisq.json").read_text()), (out / "chisq.md").read_text()


def test_transformers_warpers_pass_their_convention_and_fail_the_contract_saying_why(tmp_path) -> None:
    pytest.importorskip("transformers")
    sampler = f"{EXAMPLES / 'transformers_sampler.py'}:sample"
    rc, report, _ = _chisq(tmp_path, sampler, "transformers", SEPARATING)
    assert rc == 0 and report["tests"] and all(t["passed"] for t in report["tests"])
    rc, report, md = _chisq(tmp_path, sampler, "contract", SEPARATING)
    assert rc == 1 and not report["tests"][0]["passed"]
    assert "## Diagnosis of failed cases" in md and "draws fit transformers: top-p measured before min-p" in md


def test_plain_torch_sampler_passes_the_contract_where_the_engines_differ(tmp_path) -> None:
    rc, report, md = _chisq(tmp_path, f"{EXAMPLES / 'good_sampler.py'}:sample", "contract", "p-slack")
    assert rc == 0 and len(report["tests"]) >= 4 and "Diagnosis" not in md
    rc, report, md = _chisq(tmp_path, f"{EXAMPLES / 'good_sampler.py'}:sample", "sglang-torch", "bind-p-slack-k-t0.6")
    assert rc == 1 and "draws fit contract" in md
