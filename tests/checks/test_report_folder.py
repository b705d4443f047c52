"""Atomic report folders: a manifest naming every file, no stale files from an older run, and an
interrupted run leaves the previous folder exactly as it was."""
from __future__ import annotations

import json
import signal
import os

import pytest

from runnercheck.checks.report_folder import (
    FolderNotReplaced,
    OutDirError,
    atomic_report_folder,
    check_out_dir,
    read_manifest,
)


def files_under(root) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*") if p.is_file()}


def test_a_run_replaces_the_folder_and_names_every_file(tmp_path) -> None:
    out = tmp_path / "report"
    with atomic_report_folder(out) as tmp:
        (tmp / "summary.json").write_text("{}")
        (tmp / "repros").mkdir()
        (tmp / "repros" / "a.json").write_text("a")
        assert not out.exists()  # nothing visible until the run completes
    assert sorted(read_manifest(out)) == ["repros/a.json", "summary.json"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert all(len(entry["sha256"]) == 64 for entry in manifest["files"])
    assert [p.name for p in tmp_path.iterdir()] == ["report"]  # no temporary sibling left


def test_a_passing_run_leaves_no_file_of_an_older_failing_run(tmp_path) -> None:
    out = tmp_path / "report"
    with atomic_report_folder(out) as tmp:
        (tmp / "summary.json").write_text("failed")
        (tmp / "repro.json").write_text("old repro")
    with atomic_report_folder(out) as tmp:
        (tmp / "summary.json").write_text("passed")
    assert files_under(out).keys() == {"summary.json", "manifest.json"}
    assert (out / "summary.json").read_text() == "passed"


@pytest.mark.parametrize("interrupt", [RuntimeError("boom"), KeyboardInterrupt()], ids=["exception", "ctrl-c"])
def test_an_interrupted_run_leaves_the_previous_folder_intact_and_says_so(tmp_path, interrupt) -> None:
    out = tmp_path / "report"
    with atomic_report_folder(out) as tmp:
        (tmp / "summary.json").write_text("previous")
    before = files_under(out)
    with pytest.raises(FolderNotReplaced, match="previous report there is left intact") as info:
        with atomic_report_folder(out) as tmp:
            (tmp / "summary.json").write_text("half-written")
            raise interrupt
    assert info.value.__cause__ is interrupt
    assert files_under(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["report"]


def test_a_signal_mid_run_leaves_the_previous_folder_intact(tmp_path) -> None:
    out = tmp_path / "report"
    with atomic_report_folder(out) as tmp:
        (tmp / "summary.json").write_text("previous")
    before = files_under(out)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(FolderNotReplaced):
            with atomic_report_folder(out) as tmp:
                (tmp / "summary.json").write_text("new")
                os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, old)
    assert files_under(out) == before


def test_out_checks(tmp_path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(OutDirError, match="not a folder"):
        check_out_dir(tmp_path / "file")
    with pytest.raises(OutDirError, match="cannot be created"):
        check_out_dir(tmp_path / "file" / "below")
    assert check_out_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    with pytest.raises(OutDirError):
        check_out_dir("")
