"""JUnit rendering and provenance blocks."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from runnercheck.checks.junit import JUnitCase, JUnitError, write_junit
import runnercheck.checks.provenance as provenance_module
from runnercheck.checks.provenance import provenance, provenance_differences


def test_junit_counts_failures_skips_and_properties(tmp_path):
    cases = [
        JUnitCase("run-0", "verify", 1.5, properties={"seed": 3}),
        JUnitCase("run-1", "verify", 2.0, failure="divergence at step 7\nmore", failure_details="repro: r.json",
                  properties={"seed": 4, "repro": "r.json"}),
        JUnitCase("min-p", "chisq", skipped="sampler does not support min_p"),
    ]
    path = write_junit(tmp_path / "sub" / "junit.xml", "runnercheck verify", cases, {"device": "sim"})
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    failed = suite.findall("testcase")[1]
    failure = failed.find("failure")
    assert failure.get("message") == "divergence at step 7"
    assert "repro: r.json" in failure.text
    assert {p.get("name"): p.get("value") for p in failed.iter("property")} == {"seed": "4", "repro": "r.json"}
    assert suite.findall("testcase")[2].find("skipped").get("message").startswith("sampler does not")
    assert not list(tmp_path.glob("sub/*.tmp"))


def test_junit_rejects_a_case_both_failed_and_skipped():
    with pytest.raises(JUnitError):
        JUnitCase("x", "c", failure="f", skipped="s")
    with pytest.raises(JUnitError):
        JUnitCase("", "c")


def test_provenance_names_versions_and_reports_differences():
    here = provenance("sim")
    for key in ("runnercheck", "git_commit", "source_digest", "python", "torch", "triton", "numpy", "device_name"):
        assert key in here
    assert here["device_name"] == "sim"
    assert provenance_differences(here, dict(here)) == []
    other = dict(here, torch="0.0.1", device_name="NVIDIA H200")
    diffs = provenance_differences(other, here)
    assert any(d.startswith("torch:") for d in diffs) and any(d.startswith("device_name:") for d in diffs)
    assert provenance_differences(None, here) == ["the recording has no provenance (written by an older runnercheck)"]


def test_the_source_digest_names_the_code_and_changes_with_any_of_it(monkeypatch, tmp_path):
    """Each package's sources count, by name and bytes; files that are no source (a build, a note) do not; a
    package that cannot be found gives no digest rather than a partial one."""
    assert len(provenance_module.source_digest()) == 16
    folders = {name: tmp_path / name for name in ("runnercheck", "runnercheck.impl")}
    for folder in folders.values():
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    (folders["runnercheck.impl"] / "rows.c").write_text("int x;\n")
    monkeypatch.setattr(provenance_module, "SOURCE_PACKAGES", tuple(folders))
    monkeypatch.setattr(provenance_module, "_package_folder", folders.get)

    def digest() -> str | None:
        provenance_module.source_digest.cache_clear()
        return provenance_module.source_digest()

    first = digest()
    (folders["runnercheck.impl"] / "_rows.so").write_bytes(b"\0")
    (folders["runnercheck"] / "NOTES.txt").write_text("not code")
    assert digest() == first
    (folders["runnercheck.impl"] / "rows.c").write_text("int y;\n")
    changed = digest()
    assert changed != first
    (folders["runnercheck.impl"] / "rows.c").rename(folders["runnercheck"] / "rows.c")  # the same bytes elsewhere
    assert digest() not in (first, changed)
    monkeypatch.setattr(provenance_module, "SOURCE_PACKAGES", (*folders, "runnercheck.gone"))
    assert digest() is None
    provenance_module.source_digest.cache_clear()
