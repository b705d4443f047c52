"""The third-party sampler seam (`runnercheck.checks.chisq.sampler_contract`): declined parameters are skipped with a
reason, the batch is bounded, and every bad return is a failed check of its case with the report
written -- never a traceback.  Each bad return is planted in a user sampler module."""
from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

from runnercheck.checks.chisq import cases as chisq_cases
from runnercheck.checks.chisq.sampler_contract import (
    SamplerContractError, SamplerLimitError, check_sampler_output, declared_unsupported, rows_per_call_bound,
)
from runnercheck.checks.chisq.samplers import GumbelSampler, SamplerUnsupportedError
from runnercheck.impl.interface import SamplingParams

CPU = torch.device("cpu")


# --------------------------------------------------------------------------- the output check


@pytest.mark.parametrize("result, message", [
    (None, "returned None"),
    ([1, 2, 3], "returned list"),
    (torch.zeros(2, dtype=torch.int64), "shape [2] for 3"),
    (torch.zeros(3, 2, dtype=torch.int64), "shape [3, 2]"),
    (torch.tensor([1.0, 2.0, 3.0]), "dtype torch.float32"),  # integral floats too: truncation would hide 2.7
    (torch.tensor([1.0, float("nan"), 3.0]), "1 non-finite"),
    (np.array([0.5, 1.0, 2.0]), "dtype float64"),
    (torch.tensor([True, False, True]), "dtype torch.bool"),
    (torch.tensor([0, 7, 8]), "1 ids outside [0, 8) (first: 8 at row 2)"),
    (torch.tensor([-1, 0, 1]), "first: -1 at row 0"),
])
def test_each_bad_return_is_a_typed_contract_error(result, message: str) -> None:
    with pytest.raises(SamplerContractError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        check_sampler_output(result, 3, 8)


def test_good_returns_of_any_integer_dtype_pass() -> None:
    for result in (torch.tensor([0, 7, 3], dtype=torch.int32), torch.tensor([[0], [7], [3]]), np.array([0, 7, 3], dtype=np.uint8)):
        assert check_sampler_output(result, 3, 8).tolist() == [0, 7, 3]


def test_declared_support_and_rows_bound() -> None:
    class Partial:
        supported_params = {"temperature", "top_k"}
        max_rows_per_call = 64

    assert declared_unsupported(Partial(), SamplingParams(top_k=5)) is None
    assert "min_p, top_p" in declared_unsupported(Partial(), SamplingParams(top_p=0.9, min_p=0.1))
    assert rows_per_call_bound(Partial(), None) == 64 and rows_per_call_bound(Partial(), 16) == 16
    with pytest.raises(SamplerLimitError):
        rows_per_call_bound(Partial(), 0)


# --------------------------------------------------------------------------- runs with user samplers

USER_SAMPLERS = textwrap.dedent('''
    import torch
    from runnercheck.checks.chisq.samplers import GumbelSampler, SamplerUnsupportedError

    _good = GumbelSampler()

    def no_min_p(logits, params, seeds, positions):
        if any(p.min_p > 0 for p in params):
            raise SamplerUnsupportedError("min-p is not implemented")
        return _good(logits, params, seeds, positions)

    class Declared:
        supported_params = {"temperature"}
        def __call__(self, logits, params, seeds, positions):
            return _good(logits, params, seeds, positions)

    declared = Declared()

    def returns_none(logits, params, seeds, positions):
        return None

    def wrong_shape(logits, params, seeds, positions):
        return _good(logits, params, seeds, positions)[:-1]

    def float_ids(logits, params, seeds, positions):
        return _good(logits, params, seeds, positions).to(torch.float32)

    def nan_ids(logits, params, seeds, positions):
        out = _good(logits, params, seeds, positions).to(torch.float32)
        out[0] = float("nan")
        return out

    def out_of_range(logits, params, seeds, positions):
        return _good(logits, params, seeds, positions) + logits.shape[1]

    def crashes(logits, params, seeds, positions):
        return torch.zeros(3)[logits.shape[0]]

    calls = []

    def counting(logits, params, seeds, positions):
        calls.append(logits.shape[0])
        return _good(logits, params, seeds, positions)
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "user_samplers_mod.py").write_text(USER_SAMPLERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    import sys

    sys.modules.pop("user_samplers_mod", None)
    return importlib.import_module("user_samplers_mod")


def _chisq(tmp_path, sampler: str, *extra: str) -> tuple[int, dict]:
    from runnercheck.stress.cli.main import main

    out = tmp_path / f"out-{sampler.split(':')[-1]}"
    rc = main(["chisq", "--quick", "--device", "cpu", "--sampler", sampler, "--no-power", "--no-calibration",
               "--samples", "400", "--out", str(out), *extra])
    return rc, json.loads((out / "chisq.json").read_text())


@pytest.mark.parametrize("fn, message", [
    ("returns_none", "returned None"),
    ("wrong_shape", "shape [399] for 400"),
    ("float_ids", "dtype torch.float32: token ids must be integers"),
    ("nan_ids", "1 non-finite"),
    ("out_of_range", "outside [0, 97)"),
    ("crashes", "sampler raised IndexError: index 400 is out of bounds for dimension 0 with size 3 (at user_samplers_mod.py:"),
])
def test_a_bad_return_fails_the_case_with_a_report(user_module, tmp_path, capsys, fn: str, message: str) -> None:
    rc, report = _chisq(tmp_path, f"user_samplers_mod:{fn}", "--cases", "top-k-10")
    assert rc == 1 and not report["passed"]
    [test] = report["tests"]
    assert test["kind"] == "contract" and test["name"] == "top-k-10-v97/contract"
    assert "case top-k-10-v97" in test["notes"] and message in test["notes"]
    assert test["config"]["seed"] is not None
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err and "sampler contract" in out.out
    assert (tmp_path / f"out-{fn}" / "report.html").exists()


def test_unsupported_parameters_are_skipped_with_the_reason(user_module, tmp_path) -> None:
    rc, report = _chisq(tmp_path, "user_samplers_mod:no_min_p", "--cases=-v97")
    skipped = {s["case"]: s["reason"] for s in report["skipped"]}
    assert "min-p is not implemented" in skipped["min-p-0.05-v97"]
    assert "min-p is not implemented" in skipped["combo-t0.7-k30-p-minp-v97"]
    assert rc == 0 and report["tests"] and all(t["passed"] for t in report["tests"])


def test_declared_parameters_skip_before_any_call(user_module, tmp_path) -> None:
    rc, report = _chisq(tmp_path, "user_samplers_mod:declared", "--cases=-v97")
    reasons = {s["case"]: s["reason"] for s in report["skipped"]}
    assert "declares no support for top_k" in reasons["top-k-10-v97"]
    assert {t["config"]["case"] for t in report["tests"]} == {f"temperature-{t}-v97" for t in ("0.05", "0.5", "1", "2", "10")} | {
        "greedy-v97"}
    assert rc == 0


def test_max_rows_per_call_bounds_every_call(user_module, tmp_path) -> None:
    # In this process (--no-isolation), where the sampler's call log can be read.
    rc, report = _chisq(tmp_path, "user_samplers_mod:counting", "--cases", "drafts-2rows", "--max-rows-per-call", "50",
                        "--no-isolation")
    assert rc == 0 and user_module.calls and max(user_module.calls) <= 50 and sum(user_module.calls) == 800
    user_module.calls.clear()
    rc, report = _chisq(tmp_path, "user_samplers_mod:counting", "--cases", "drafts-2rows", "--max-rows-per-call", "1",
                        "--no-isolation")
    assert report["skipped"][0]["reason"].startswith("one request of this case has 2 rows > 1")
    assert not user_module.calls


def test_contract_failure_in_calibration_is_a_failed_check(user_module, tmp_path) -> None:
    from runnercheck.stress.cli.main import main

    out = tmp_path / "calib"
    rc = main(["chisq", "--quick", "--device", "cpu", "--sampler", "user_samplers_mod:float_ids", "--no-matrix", "--no-power",
               "--out", str(out)])
    report = json.loads((out / "chisq.json").read_text())
    assert rc == 1 and report["tests"][0]["name"] == "calibration-v32/contract" and report["calibration"] is None


def test_bad_max_rows_is_rejected_up_front(tmp_path, capsys) -> None:
    from runnercheck.stress.cli.main import main

    assert main(["chisq", "--quick", "--max-rows-per-call", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--max-rows-per-call must be >= 1" in capsys.readouterr().err
    assert main(["chisq", "--quick", "--junit", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# --------------------------------------------------------------------------- JUnit and provenance


def test_junit_has_one_case_per_test_with_rejections_and_seeds(tmp_path) -> None:
    from runnercheck.stress.cli.main import main

    junit = tmp_path / "chisq.xml"
    rc = main(["chisq", "--quick", "--device", "cpu", "--sampler", "bias-top-k-off-by-one", "--cases", "top-",
               "--no-power", "--no-calibration", "--out", str(tmp_path / "out"), "--junit", str(junit)])
    report = json.loads((tmp_path / "out" / "chisq.json").read_text())
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert rc == 1 and set(cases) == {t["name"] for t in report["tests"]}
    failure = cases["top-k-10-v97"].find("failure")
    assert failure is not None and "top-k-10-v97 rejected (chisq): adjusted p = 0" in failure.get("message")
    assert cases["top-p-v97"].find("failure") is None
    props = {p.get("name"): p.get("value") for p in cases["top-k-10-v97"].iter("property")}
    assert props["case_seed"] == str(chisq_cases.case_seed(0, "top-k-10-v97")[0]) and props["run_seed"] == "0"
    assert int(suite.get("failures")) == sum(not t["passed"] for t in report["tests"]) >= 1


def test_junit_marks_skipped_cases_and_json_has_provenance(user_module, tmp_path) -> None:
    junit = tmp_path / "skip.xml"
    rc, report = _chisq(tmp_path, "user_samplers_mod:no_min_p", "--cases", "min-p", "--junit", str(junit))
    skipped, matrix = ET.parse(junit).getroot().iter("testcase")
    assert skipped.find("skipped").get("message").endswith("min-p is not implemented")
    # Every matching case skipped: the run tested nothing, which fails with the reason.
    assert rc == 1 and matrix.get("name") == "matrix" and matrix.find("failure").get("message").startswith("0 cases ran: 1 skipped")
    assert report["format_version"] == 1
    assert {"runnercheck", "torch", "triton", "numpy", "device_name"} <= set(report["provenance"])
    assert report["provenance"]["device_name"] == "cpu"
