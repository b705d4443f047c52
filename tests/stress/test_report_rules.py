"""The report-folder rules every command with ``--out`` follows (docs/REPORTS.md): places no report
may replace, user folders refused unless ``--force`` (then moved aside, never deleted), an earlier
report kept aside, one permission rule, provenance in every report, and Ctrl-C / SIGTERM leaving an
incomplete report with what finished, exit 130, no traceback and no child process left running."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runnercheck.stress.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ["verify", "stress", "mutants", "chisq", "bench"]
STRESS = ["stress", "--device", "sim", "--steps", "5", "--no-progress"]
CHISQ = ["chisq", "--quick", "--cases", "greedy", "--no-calibration", "--no-power", "--no-spec", "--device", "cpu"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def files_under(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*") if p.is_file()}


def user_repo(path: Path) -> Path:
    (path / ".git").mkdir(parents=True)
    (path / ".git" / "HEAD").write_text("ref: refs/heads/main")
    (path / "keep.txt").write_text("a")
    return path


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("where", [".", "..", "cwd"])
def test_out_naming_the_current_folder_or_above_is_refused_before_any_work(tmp_path, monkeypatch, capsys, command,
                                                                           where) -> None:
    repo = user_repo(tmp_path / "s")
    monkeypatch.chdir(repo)
    before = files_under(tmp_path)
    out = str(repo) if where == "cwd" else where
    assert main([command, "--device", "sim", "--force", "--out", out]) == 2
    assert "refused, it is" in one_line(capsys)
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("command", COMMANDS)
def test_a_non_empty_user_folder_is_refused_naming_force(tmp_path, capsys, command) -> None:
    repo = user_repo(tmp_path / "s")
    assert main([command, "--device", "sim", "--out", str(repo)]) == 2
    line = one_line(capsys)
    assert "holds no runnercheck report" in line and "--force" in line
    assert files_under(tmp_path) == {"s/.git/HEAD": "ref: refs/heads/main", "s/keep.txt": "a"}


def test_force_moves_the_user_folder_aside_and_an_earlier_report_is_kept(tmp_path, capsys) -> None:
    repo = user_repo(tmp_path / "s")
    assert main([*STRESS, "--force", "--out", str(repo)]) == 0
    (mine,) = tmp_path.glob("s.prev-*")
    assert files_under(mine) == {".git/HEAD": "ref: refs/heads/main", "keep.txt": "a"}
    assert f"moved to {mine}" in capsys.readouterr().out
    first = (repo / "summary.json").read_text()
    assert main([*STRESS, "--seed", "1", "--out", str(repo)]) == 0  # an earlier report: no --force needed
    earlier = [p for p in tmp_path.glob("s.prev-*") if p != mine]
    assert len(earlier) == 1 and (earlier[0] / "summary.json").read_text() == first
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_every_report_has_the_same_permissions_and_carries_its_provenance(tmp_path, capsys, monkeypatch) -> None:
    from runnercheck.bench import cli as bench_cli
    from runnercheck.bench.common import Row

    monkeypatch.setattr(bench_cli, "_cases", lambda: {"staged_writes": lambda ctx: [Row("staged_writes", "x", 1.0, "us")]})
    old = os.umask(0o027)
    try:
        assert main([*STRESS, "--out", str(tmp_path / "stress")]) == 0
        assert main([*CHISQ, "--out", str(tmp_path / "chisq")]) == 0
        assert main(["bench", "--device", "sim", "--only", "staged_writes", "--out", str(tmp_path / "bench")]) == 0
    finally:
        os.umask(old)
    for name, md, doc in (("stress", "summary.md", "summary.json"), ("chisq", "chisq.md", "chisq.json"),
                          ("bench", "bench.md", "bench.json")):
        folder = tmp_path / name
        assert folder.stat().st_mode & 0o777 == 0o750, name
        prov = json.loads((folder / doc).read_text())["provenance"]
        assert prov["date"].endswith("Z") and prov["command_line"].startswith(f"runnercheck {name} "), prov
        assert {"runnercheck", "git_commit", "torch", "triton", "numpy", "python"} <= prov.keys()
        text = (folder / md).read_text()
        assert f"- date: {prov['date']}" in text and f"`{prov['command_line']}`" in text, name
        assert f"torch {prov['torch']}" in text


def _children(pid: int) -> set[int]:
    try:
        return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


def _sigint_at_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_stress_writes_an_incomplete_report_and_stops_the_child(tmp_path, sig) -> None:
    out = tmp_path / "stress"
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
    proc = subprocess.Popen([sys.executable, "-m", "runnercheck.stress.cli.main", "stress", "--device", "sim",
                             "--steps", "100000", "--no-progress", "--out", str(out)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # as from a terminal, whatever started pytest: a job started in the background of a
                            # script has SIGINT ignored, which the command then keeps (and the signal is lost)
                            preexec_fn=_sigint_at_default)
    deadline = time.monotonic() + 120
    children: set[int] = set()
    while not children and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        children = _children(proc.pid)
    assert children, "the isolated run never started"
    time.sleep(2.0)  # some ticks
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    name = "SIGTERM" if sig == signal.SIGTERM else "SIGINT"
    assert [line for line in err.splitlines() if line.strip()][-1].startswith(f"runnercheck stress: interrupted ({name})")
    doc = json.loads((out / "summary.json").read_text())
    assert doc["status"] == "incomplete" and doc["passed"] is False and doc["runs"] == []
    assert doc["notes"][0].startswith(f"interrupted ({name}) at tick ")
    assert (out / "summary.md").read_text().startswith("> **INCOMPLETE REPORT**")
    assert all(not Path(f"/proc/{c}").exists() for c in children), "a child process was left running"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stress"]


def test_an_interrupted_chisq_keeps_the_finished_matrix(tmp_path, capsys, monkeypatch) -> None:
    from runnercheck.checks.chisq import run as chisq

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(chisq, "run_power", interrupted)
    out = tmp_path / "chisq"
    argv = ["chisq", "--quick", "--cases", "greedy", "--no-calibration", "--no-spec", "--device", "cpu"]  # power runs
    assert main([*argv, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "runnercheck chisq: interrupted (SIGINT)" in err and "Traceback" not in err
    doc = json.loads((out / "chisq.json").read_text())
    assert doc["status"] == "incomplete" and doc["passed"] is False and doc["num_tests"] >= 1
    assert (out / "chisq.md").read_text().startswith("> **INCOMPLETE REPORT**")


def test_an_interrupted_mutants_run_keeps_the_mutants_that_finished(tmp_path, capsys, monkeypatch) -> None:
    from runnercheck.stress.cli import mutants_cmd
    from runnercheck.stress.mutants.report import MutantResult

    calls = []

    def one_then_interrupt(mutant, opts):
        calls.append(mutant.name)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return MutantResult(mutant.name, mutant.cls, mutant.description, mutant.needs_gpu, list(mutant.checks),
                            mutant.workload, "killed", True, list(mutant.checks[:1]), True, list(mutant.checks),
                            {mutant.checks[0]: "planted"}, 3, 0.1)

    monkeypatch.setattr(mutants_cmd, "run_mutant", one_then_interrupt)
    out = tmp_path / "mutants"
    assert main(["mutants", "--device", "sim", "--quick", "--no-chisq", "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "interrupted (SIGINT) after 1 of" in err and "Traceback" not in err
    doc = json.loads((out / "mutants.json").read_text())
    assert doc["status"] == "incomplete" and doc["passed"] is False
    assert [m["name"] for m in doc["mutants"]] == calls[:1] and doc["controls"] == []
    assert (out / "mutants.md").read_text().startswith("> **INCOMPLETE REPORT**")


def test_the_commit_is_reported_only_from_a_runnercheck_checkout(tmp_path, monkeypatch) -> None:
    from runnercheck.checks import provenance

    user = tmp_path / "user-repo"
    user.mkdir()
    subprocess.run(["git", "init", "-q", str(user)], check=True)
    (user / "pyproject.toml").write_text('[project]\nname = "their-app"\n')
    subprocess.run(["git", "-C", str(user), "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    monkeypatch.setattr(provenance, "_REPO_ROOT", user)
    assert provenance.git_commit.__wrapped__() is None  # a wheel installed inside the user's repository
    (user / "pyproject.toml").write_text('[project]\nname = "runnercheck"\n')
    assert provenance.git_commit.__wrapped__() is not None
