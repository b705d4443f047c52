"""A user's sampler as `runnercheck chisq` meets it: named by a file or a module found from the
working folder, run in a child process where a segfault, an abort or a hang is a failed case with
a repro command (the report is still written), and a run that tests no case fails with the reason.

Every run is one or two quick cases with a few hundred draws, calibration, power and speculative
cases off.
"""
from __future__ import annotations

import json
import shlex
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from runnercheck.checks.chisq import plan as chisq_plan
from runnercheck.checks.chisq import run as chisq
from runnercheck.checks import loader
from runnercheck.checks.chisq import samplers
from runnercheck.stress.cli.main import main

PLANTS = textwrap.dedent('''
    import ctypes
    import os
    import time

    from runnercheck.checks.chisq.samplers import GumbelSampler

    _gumbel = GumbelSampler()


    def good(logits, params, seeds, positions):
        return _gumbel(logits, params, seeds, positions)


    def temperature_only(logits, params, seeds, positions):
        return _gumbel(logits, params, seeds, positions)


    temperature_only.supported_params = {"temperature"}


    def segfault_at_half(logits, params, seeds, positions):
        if params[0].temperature == 0.5:
            ctypes.string_at(0)  # a read of address 0: SIGSEGV
        return _gumbel(logits, params, seeds, positions)


    def aborts(logits, params, seeds, positions):
        os.abort()


    def hangs(logits, params, seeds, positions):
        while True:
            time.sleep(1)
''')
SMALL = ["--quick", "--samples", "300", "--no-calibration", "--no-power", "--no-spec", "--device", "cpu"]


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's folder, the working folder of the test, with the plants in ``plants.py``, ``sub/dir/deep.py``
    and (under a module name unique to the test) ``mine_<n>.py``; ``sys.path`` restored afterwards."""
    (tmp_path / "plants.py").write_text(PLANTS)
    (tmp_path / "sub" / "dir").mkdir(parents=True)
    (tmp_path / "sub" / "dir" / "deep.py").write_text(PLANTS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    return tmp_path


def _report(out: Path) -> dict:
    return json.loads((out / "chisq.json").read_text())


# --------------------------------------------------------------------------- specs


def test_file_specs_relative_nested_and_absolute_load_under_a_private_name(user_dir: Path) -> None:
    here = samplers.load_sampler("./plants.py:good")
    assert here.__module__.startswith(loader.USER_PACKAGE + ".plants_")
    assert samplers.load_sampler(str(user_dir / "plants.py") + ":good") is here  # one file, one module
    deep = samplers.load_sampler("sub/dir/deep.py:good")
    assert deep.__module__.startswith(loader.USER_PACKAGE + ".deep_") and "deep" not in sys.modules
    assert loader.spec_of(deep) == f"{user_dir / 'sub' / 'dir' / 'deep.py'}:good"
    assert loader.canonical_spec("sub/dir/deep.py:good") == f"{user_dir / 'sub' / 'dir' / 'deep.py'}:good"


def test_a_module_spec_finds_the_working_folder_appended_so_installed_modules_win(user_dir: Path) -> None:
    (user_dir / "mine_cwd.py").write_text(PLANTS)
    (user_dir / "json.py").write_text("def dumps(*a, **k):\n    return 'shadowed'\n")
    fn = samplers.load_sampler("mine_cwd:good")
    assert fn.__module__ == "mine_cwd" and sys.path[-1] == str(user_dir)
    assert loader.load_callable("json:dumps")({}) == "{}"  # the standard library's, not ./json.py


@pytest.mark.parametrize("spec, error, words", [
    ("./plants:good", samplers.SamplerSpecError, "not a dotted module name (a file spec names a .py file)"),
    ("./missing.py:good", samplers.SamplerNotFoundError, "no file"),
    ("./plants.py:nothing", samplers.SamplerNotFoundError, "has no attribute 'nothing'"),
    ("no_such_module_xyz:f", samplers.SamplerNotFoundError, "not found on sys.path or in the working folder"),
    ("./broken.py:f", samplers.SamplerSpecError, "raised ZeroDivisionError"),
])
def test_bad_specs_are_typed_one_line_errors(user_dir: Path, spec: str, error: type, words: str) -> None:
    (user_dir / "broken.py").write_text("1 / 0\n")
    with pytest.raises(error, match=None) as caught:
        samplers.load_sampler(spec)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_cli_bad_file_spec_is_status_2_without_a_traceback(user_dir: Path, capsys) -> None:
    assert main(["chisq", *SMALL, "--sampler", "./plants:good", "--out", str(user_dir / "o")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "a file spec names a .py file" in err
    assert not (user_dir / "o").exists()


def test_only_third_party_samplers_are_isolated() -> None:
    assert chisq.isolation_for("gumbel", 5, False) is None and chisq.isolation_for("bias-u32-uniform", 5, False) is None
    assert chisq.isolation_for("pkg.mod:fn", 5, True) is None  # --no-isolation
    assert chisq.isolation_for("x.py:fn", 0, False).timeout_s is None  # --timeout 0: no limit


# --------------------------------------------------------------------------- zero cases


def test_cases_matching_nothing_is_a_usage_error(user_dir: Path, capsys) -> None:
    assert main(["chisq", *SMALL, "--cases", "zzz", "--sampler", "./plants.py:good", "--out", str(user_dir / "o")]) == 2
    assert "--cases 'zzz' matches no case" in capsys.readouterr().err


def test_a_run_whose_cases_were_all_skipped_fails_with_the_reason(user_dir: Path, capsys) -> None:
    out, junit = user_dir / "o", user_dir / "junit.xml"
    assert main(["chisq", *SMALL, "--cases", "top-k-10", "--sampler", "./plants.py:temperature_only", "--out", str(out),
                 "--junit", str(junit)]) == 1
    reason = "0 cases ran: 1 skipped because sampler declares no support for top_k (supported_params)"
    assert reason in capsys.readouterr().out.replace("\n", " ")
    report = _report(out)
    assert not report["passed"] and report["not_run"] == reason
    failures = [c.find("failure") for c in ET.parse(junit).getroot().iter("testcase") if c.get("name") == "matrix"]
    assert failures and failures[0].get("message") == reason


# --------------------------------------------------------------------------- crashes and hangs


@pytest.mark.parametrize("plant, how", [("segfault_at_half", "killed by signal SIGSEGV"), ("aborts", "killed by signal SIGABRT")])
def test_a_crashing_sampler_fails_its_case_with_a_repro_and_the_report_is_written(user_dir: Path, capsys, plant: str,
                                                                                  how: str) -> None:
    out = user_dir / "o"
    assert main(["chisq", *SMALL, "--cases", "temperature-0.5-v97", "--sampler", f"./plants.py:{plant}", "--out", str(out)]) == 1
    [test] = _report(out)["tests"]
    assert test["kind"] == "crash" and test["name"] == "temperature-0.5-v97/crash" and not test["passed"]
    assert f"sampler {how} in temperature-0.5-v97" in test["notes"]
    repro = test["config"]["repro"]
    assert repro.startswith(f"runnercheck chisq --sampler {user_dir / 'plants.py'}:{plant} --cases temperature-0.5-v97 ")
    assert "--seed 0" in repro and "--samples 300" in repro and f"repro: {repro}" in test["notes"]
    assert (out / "report.html").exists() and "crash" in (out / "chisq.md").read_text()
    assert f"sampler crash temperature-0.5-v97/crash: sampler {how}" in capsys.readouterr().out.replace("\n", " ")
    # The repro command reproduces the crash.
    assert main(shlex.split(repro)[1:-2] + ["--out", str(user_dir / "again")]) == 1
    assert _report(user_dir / "again")["tests"][0]["notes"].startswith(f"sampler {how}")


def test_the_cases_after_a_crash_still_run(user_dir: Path) -> None:
    out = user_dir / "o"
    assert main(["chisq", *SMALL, "--cases", "temperature-", "--sampler", "./plants.py:segfault_at_half", "--out", str(out)]) == 1
    tests = _report(out)["tests"]
    crashed = [t["name"] for t in tests if t["kind"] == "crash"]
    ran = [t["name"] for t in tests if t["kind"] != "crash"]
    assert crashed == ["temperature-0.5-v97/crash"]
    assert ran and all(t["passed"] for t in tests if t["kind"] != "crash"), ran
    names = [c.name for c in chisq_plan.matching_cases(chisq_plan.RunOptions(quick=True, case_filter="temperature-"))]
    assert names.index("temperature-0.5-v97") < len(names) - 1  # a case after the crash was tested


def test_a_hanging_sampler_times_out_with_its_process_group_killed(user_dir: Path) -> None:
    out = user_dir / "o"
    assert main(["chisq", *SMALL, "--cases", "temperature-0.5-v97", "--sampler", "./plants.py:hangs", "--timeout", "1",
                 "--out", str(out)]) == 1
    [test] = _report(out)["tests"]
    assert test["kind"] == "timeout" and "sampler timed out after 1 s (process group killed)" in test["notes"]
    assert "--timeout 1 " in test["config"]["repro"]


def test_a_good_file_sampler_passes_isolated(user_dir: Path) -> None:
    out = user_dir / "o"
    assert main(["chisq", *SMALL, "--cases", "top-k-10", "--sampler", "./plants.py:good", "--out", str(out)]) == 0
    report = _report(out)
    assert report["sampler"] == f"{user_dir / 'plants.py'}:good" and report["tests"][0]["passed"]
