"""Atomic report folders: a manifest naming every file, no stale files from an older run, an
interrupted run leaves the previous folder exactly as it was, and nothing a report did not write is
ever deleted (an earlier report or, with force, the user's files are moved aside)."""
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
    is_report,
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


def test_a_passing_run_leaves_no_file_of_an_older_failing_run_and_keeps_that_run_aside(tmp_path) -> None:
    out = tmp_path / "report"
    with atomic_report_folder(out) as tmp:
        (tmp / "summary.json").write_text("failed")
        (tmp / "repro.json").write_text("old repro")
    folder = atomic_report_folder(out)
    with folder as tmp:
        (tmp / "summary.json").write_text("passed")
    assert files_under(out).keys() == {"summary.json", "manifest.json"}
    assert (out / "summary.json").read_text() == "passed"
    (aside,) = tmp_path.glob("report.prev-*")
    assert folder.moved_aside == aside and str(aside) in folder.moved_aside_line()
    assert (aside / "repro.json").read_text() == "old repro"  # the failing run's repro survives
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["report", aside.name])


def test_an_empty_folder_is_simply_replaced(tmp_path) -> None:
    out = tmp_path / "report"
    out.mkdir()
    folder = atomic_report_folder(out)
    with folder as tmp:
        (tmp / "a").write_text("a")
    assert folder.moved_aside is None and [p.name for p in tmp_path.iterdir()] == ["report"]


def test_a_user_folder_is_refused_and_left_untouched(tmp_path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutDirError, match="not empty and holds no runnercheck report.*--force"):
        atomic_report_folder(out)
    assert files_under(out) == {"notes.txt": "mine"} and [p.name for p in tmp_path.iterdir()] == ["mine"]


def test_force_moves_a_user_folder_aside_and_deletes_nothing(tmp_path) -> None:
    out = tmp_path / "mine"
    (out / ".git").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref")
    (out / "notes.txt").write_text("mine")
    folder = atomic_report_folder(out, force=True)
    with folder as tmp:
        (tmp / "summary.json").write_text("report")
    assert files_under(folder.moved_aside) == {".git/HEAD": "ref", "notes.txt": "mine"}
    assert is_report(out) and not is_report(folder.moved_aside)


def test_two_reports_in_the_same_second_keep_both_earlier_ones(tmp_path) -> None:
    out = tmp_path / "report"
    for text in ("first", "second", "third"):
        with atomic_report_folder(out) as tmp:
            (tmp / "summary.json").write_text(text)
    kept = sorted((p / "summary.json").read_text() for p in tmp_path.glob("report.prev-*"))
    assert kept == ["first", "second"] and (out / "summary.json").read_text() == "third"


@pytest.mark.parametrize("where", [".", "..", "cwd", "ancestor", "/", "home"])
def test_the_current_folder_its_ancestors_root_and_home_are_refused_even_with_force(tmp_path, monkeypatch,
                                                                                    where) -> None:
    work = tmp_path / "home" / "me" / "project"
    work.mkdir(parents=True)
    (work / "keep.txt").write_text("keep")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home" / "me"))
    path = {"cwd": str(work), "ancestor": str(tmp_path), "home": "~"}.get(where, where)
    path = str(tmp_path / "home" / "me") if where == "home" else path
    with pytest.raises(OutDirError, match="refused, it is"):
        check_out_dir(path, force=True)
    assert (work / "keep.txt").read_text() == "keep"


def test_report_folders_follow_the_umask(tmp_path) -> None:
    old = os.umask(0o027)
    try:
        with atomic_report_folder(tmp_path / "a") as tmp:
            (tmp / "sub").mkdir()
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o750
    assert (tmp_path / "a" / "sub").stat().st_mode & 0o777 == 0o750


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
