"""`write_command_report` and `run_exit_status` (`runnercheck.checks.report_folder`): the report folder and exit status
every command shares -- its value back, the moved-aside line, the one stderr line and status 1 or 130 when the folder
was not replaced (and the earlier report left in place), the incomplete-report line and 130 after an interrupt."""
from __future__ import annotations

import pytest

from runnercheck.checks.interrupts import EXIT_INTERRUPTED
from runnercheck.checks.report_folder import run_exit_status, write_command_report


def test_a_written_report_returns_the_fills_value_and_says_where_the_earlier_one_went(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    lines: list[str] = []
    first = write_command_report("verify", out, lambda tmp: (tmp / "a.txt").write_text("1") and "first", echo=lines.append)
    assert (first.value, first.exit_status, lines) == ("first", None, [])
    second = write_command_report("verify", out, lambda tmp: (tmp / "b.txt").write_text("2") and "second", echo=lines.append)
    assert (second.value, second.exit_status) == ("second", None)
    assert (out / "b.txt").exists() and not (out / "a.txt").exists()
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("out.prev-")]
    assert (aside / "a.txt").read_text() == "1" and lines == [f"the earlier contents of {out} were moved to {aside} (nothing was deleted)"]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("error, status", [(RuntimeError("boom"), 1), (KeyboardInterrupt(), EXIT_INTERRUPTED)])
def test_a_fill_that_raises_leaves_the_earlier_report_and_prints_one_line(tmp_path, capsys, error, status) -> None:
    out = tmp_path / "out"
    write_command_report("chisq", out, lambda tmp: (tmp / "kept.txt").write_text("kept"))
    capsys.readouterr()

    def fail(tmp):
        (tmp / "half.txt").write_text("x")
        raise error

    written = write_command_report("chisq", out, fail)
    assert (written.value, written.exit_status) == (None, status)
    assert sorted(p.name for p in out.iterdir()) == ["kept.txt", "manifest.json"]
    err = capsys.readouterr().err
    assert err.startswith(f"runnercheck chisq: {out}: the run stopped before its report was complete") and err.count("\n") == 1


def test_exit_statuses_and_the_incomplete_line(capsys) -> None:
    assert run_exit_status("stress", "DIR", True) == 0
    assert run_exit_status("stress", "DIR", False) == 1
    assert capsys.readouterr().err == ""
    assert run_exit_status("mutants", "DIR", True, "interrupted (SIGINT)") == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "runnercheck mutants: interrupted (SIGINT); incomplete report in DIR\n"
    assert run_exit_status("invariance", "DIR", True, "interrupted", say_incomplete=False) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == ""
