"""`runnercheck bench --quick` is a CPU smoke test: it runs every case and writes valid JSON."""
from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest
import torch

from runnercheck.stress.cli import main


def test_bench_quick_writes_valid_json(tmp_path):
    rc = main(["bench", "--quick", "--device", "sim", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "bench.json").read_text())
    assert rc == 0, data["failures"]
    cases = {row["case"] for row in data["rows"]}
    assert cases == {"host_cost", "staged_writes", "sampler", "logprobs", "e2e", "spec_ngram", "spec_draft"}
    spec = {r["name"].split(",")[0]: r for r in data["rows"] if r["case"] == "spec_ngram"}
    assert {"decode tokens/s", "acceptance rate", "speedup ngram / off"} <= set(spec)
    assert 0 <= spec["acceptance rate"]["value"] <= 1
    draft = {r["name"].split(",")[0]: r for r in data["rows"] if r["case"] == "spec_draft"}
    assert {"decode tokens/s", "acceptance rate", "speedup draft micro-draft / off", "speedup self-draft micro / off"} <= set(draft)
    # Every arm timed some decode tokens after its untimed warm-up steps.
    rates = [r for r in data["rows"] if r["case"] in ("spec_ngram", "spec_draft") and r["unit"] == "tok/s"]
    assert len(rates) == 5 and all(r["value"] > 0 for r in rates)
    assert all(isinstance(row["value"], (int, float)) for row in data["rows"])
    admitting = [r for r in data["rows"] if r["name"].startswith("runner / baseline host time, admitting steps, ")]
    assert admitting and all("admitting runner" in r["note"] and "other steps runner" in r["note"] for r in admitting)
    general = [r for r in data["rows"] if r["name"].startswith("runner / baseline host time, general steps without an ")]
    assert all("were an admission free" in r["note"] for r in general)  # quick sizes may admit every step
    syncs = [r for r in data["rows"] if r["name"].startswith("host syncs per step")]
    assert syncs and all(r["value"] == 0 for r in syncs)
    assert (tmp_path / "bench.md").read_text().startswith("# runnercheck bench")
    assert data["format_version"] == 1 and data["provenance"]["device_name"] == "sim"
    assert {"runnercheck", "git_commit", "torch", "triton", "numpy"} <= set(data["provenance"])
    assert data["meta"]["complete"] is True and data["meta"]["cases_done"] == list(cases_in_order())


def cases_in_order():
    from runnercheck.bench.cli import CASE_NAMES

    return CASE_NAMES


def test_bench_json_is_written_after_each_case(tmp_path, monkeypatch):
    """A run killed outright keeps what it finished in its temporary folder: bench.json after every case."""
    from runnercheck.bench import cli as bench_cli

    seen = []
    real = bench_cli._write

    def spy(out, meta, rows, failures, prov, *, cases_done, interrupted=None):
        real(out, meta, rows, failures, prov, cases_done=cases_done, interrupted=interrupted)
        seen.append(json.loads((out / "bench.json").read_text())["meta"])

    monkeypatch.setattr(bench_cli, "_write", spy)
    assert main(["bench", "--quick", "--device", "sim", "--only", "staged_writes", "sampler", "--out", str(tmp_path)]) == 0
    assert [(m["cases_done"], m["complete"]) for m in seen] == [(["staged_writes"], False), (["staged_writes", "sampler"], True),
                                                                (["staged_writes", "sampler"], True)]


def test_an_interrupted_bench_keeps_the_cases_that_finished(tmp_path, monkeypatch, capsys):
    """Ctrl-C (or SIGTERM from a time limit) in the second case: exit 130, a report marked incomplete with the first."""
    from runnercheck.bench import cli as bench_cli
    from runnercheck.bench.common import Row

    def interrupted(ctx):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_cli, "_cases", lambda: {"staged_writes": lambda ctx: [Row("staged_writes", "x", 1.0, "us")],
                                                      "sampler": interrupted})
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--device", "sim", "--only", "staged_writes", "sampler", "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "interrupted (SIGINT) after 1 of 2 case(s)" in err and "Traceback" not in err
    data = json.loads((out / "bench.json").read_text())
    assert data["status"] == "incomplete" and data["meta"]["cases_done"] == ["staged_writes"]
    assert [r["name"] for r in data["rows"]] == ["x"]
    assert (out / "bench.md").read_text().startswith("> **INCOMPLETE REPORT**")
    assert [p.name for p in tmp_path.iterdir()] == ["bench"]


def test_host_profile_reports_execute_model_time_and_the_runner_functions(capsys) -> None:
    from runnercheck.bench.host_profile import main as host_profile_main

    assert host_profile_main(["--device", "cpu", "--reqs", "2", "--steps", "2", "--top", "15"]) == 0
    text = capsys.readouterr().out
    assert "median execute_model host time" in text
    assert "tottime" in text


def test_host_profile_can_time_the_bookkeeping_alone(capsys) -> None:
    from runnercheck.bench.host_profile import main as host_profile_main

    assert host_profile_main(["--device", "cpu", "--reqs", "4", "--steps", "3", "--top", "5", "--drop-device-work"]) == 0
    assert "device work dropped" in capsys.readouterr().out


def test_host_primitives_writes_its_figures(tmp_path) -> None:
    from runnercheck.bench.host_primitives import main as primitives_main

    out = tmp_path / "primitives.json"
    assert primitives_main(["--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["unit"] == "us (median)" and figures["host"]["python call"] >= 0
    assert ("cuda" in figures) == torch.cuda.is_available()


def test_host_profile_times_the_pieces_of_a_step(capsys) -> None:
    from runnercheck.bench.host_profile import main as host_profile_main

    assert host_profile_main(["--device", "cpu", "--reqs", "4", "--steps", "3", "--churn", "0", "--drop-device-work", "--phases"]) == 0
    text = capsys.readouterr().out
    assert "execute_model  (3 calls)" in text and "runner._check" in text and "state.advance" in text


def test_host_profile_times_each_statement_of_one_method(capsys) -> None:
    from runnercheck.bench.host_profile import main as host_profile_main

    assert host_profile_main(["--device", "cpu", "--reqs", "4", "--steps", "4", "--churn", "0", "--drop-device-work",
                              "--lines", "runnercheck.impl.runner:ModelRunner._execute", "--depth", "1"]) == 0
    text = capsys.readouterr().out
    assert "ModelRunner._execute ran 4 times" in text
    assert "step = self._check(sched)" in text and "self._execute_steady(step" in text  # a nested statement too
    from runnercheck.impl.runner import ModelRunner
    assert not hasattr(ModelRunner._execute, "__code__") or "__rc_marks" not in ModelRunner._execute.__code__.co_names


def test_host_profile_splits_each_statement_by_step_kind(capsys) -> None:
    """With churn, a statement's times are split into the steps that admitted and the others: a release runs only in
    admitting steps (none in the others' column), a statement every step runs has both and their difference."""
    from runnercheck.bench.host_profile import main as host_profile_main

    assert host_profile_main(["--device", "cpu", "--reqs", "4", "--steps", "16", "--churn", "0.12", "--drop-device-work",
                              "--lines", "runnercheck.impl.runner:ModelRunner._update_rows", "--depth", "1"]) == 0
    text = capsys.readouterr().out
    assert "then over admitting steps / the others, and the difference" in text
    rows = {line.split("  ")[-1].strip(): line for line in text.splitlines()[1:]}
    release = rows["self.state.release(req_id)"]
    assert release.split("/")[1].split()[0] == "-" and release.split("/")[1].split()[1] == "-", release
    step = rows["step = self._step"]
    other, delta = step.split("/")[1].split()[:2]
    assert other != "-" and delta[0] in "+-" and delta != "-", step


def test_host_profile_times_several_functions_in_one_run(capsys) -> None:
    """A timed method that calls a timed module function (imported by name into the runner's module) reaches the
    timed one: both tables count their calls."""
    from runnercheck.bench.host_profile import main as host_profile_main

    assert host_profile_main(["--device", "cpu", "--reqs", "4", "--steps", "4", "--churn", "0", "--drop-device-work",
                              "--lines", "runnercheck.impl.runner:ModelRunner._check", "--lines", "runnercheck.impl.step_reader:read_steady_step"]) == 0
    text = capsys.readouterr().out
    assert "ModelRunner._check ran 4 times" in text and "read_steady_step ran 4 times" in text
    import runnercheck.impl.runner as runner_module
    import runnercheck.impl.step_reader as step_reader
    assert runner_module.read_steady_step is step_reader.read_steady_step  # put back
    assert "__rc_marks" not in step_reader.read_steady_step.__code__.co_names


def test_host_profile_refuses_what_it_cannot_recompile(capsys) -> None:
    from runnercheck.bench.host_profile import main as host_profile_main

    for target, why in (("runnercheck.impl.runner:ModelRunner.nope", "no attribute"), ("runnercheck.impl.runner", "MODULE:QUALNAME"),
                        ("runnercheck.impl.buffers:StagingLifetimeError.__init__", "closure cells")):
        with pytest.raises(SystemExit):
            host_profile_main(["--device", "cpu", "--reqs", "2", "--steps", "1", "--lines", target])
        assert why in capsys.readouterr().err, target


def test_host_instructions_refuses_bad_arguments(capsys) -> None:
    from runnercheck.bench.host_instructions import main as instructions_main

    for argv in (["--reqs", "0"], ["--steps", "0"], ["--churn", "2"]):
        with pytest.raises(SystemExit):
            instructions_main(argv)
        assert "must be" in capsys.readouterr().err, argv


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_host_instructions_counts_the_same_steps_the_same() -> None:
    """The count is a measure that does not move: two runs of the same steps agree to well under 1%."""
    from runnercheck.bench.host_instructions import count

    first, second = count(4, 0.01, 3), count(4, 0.01, 3)
    assert first > 10 and abs(first - second) < 0.01 * first, (first, second)


def test_host_profile_sets_wall_time_against_cpu_time(capsys, monkeypatch) -> None:
    """``--cpu-time``: a step that sleeps half of its wall time reads so (its wall far above its CPU time), where the
    plain steps' wall and CPU time are close."""
    from runnercheck.bench import host_profile
    from runnercheck.impl.runner import ModelRunner

    assert host_profile.main(["--device", "cpu", "--reqs", "4", "--steps", "6", "--churn", "0", "--drop-device-work",
                              "--cpu-time"]) == 0
    plain = capsys.readouterr().out
    assert "other steps (6): wall" in plain and "launch thread CPU 0.0" in plain
    execute = ModelRunner.execute_model

    def sleepy(self, sched):
        time.sleep(0.005)
        return execute(self, sched)

    monkeypatch.setattr(ModelRunner, "execute_model", sleepy)
    assert host_profile.main(["--device", "cpu", "--reqs", "4", "--steps", "6", "--churn", "0", "--drop-device-work",
                              "--cpu-time"]) == 0
    gap = float(capsys.readouterr().out.split("wall - CPU ")[1].split(",")[0])
    assert gap >= 4000, gap


def test_a_sweep_writes_every_word() -> None:
    from runnercheck.bench.host_profile import sweep

    words = np.zeros(1024, np.uint64)
    sweep(words)
    sweep(words)
    assert (words == 2).all()


def test_host_profile_reports_each_sweep_size_from_interleaved_steps(capsys) -> None:
    from runnercheck.bench import host_profile

    assert host_profile.main(["--device", "cpu", "--reqs", "4", "--steps", "6", "--churn", "0", "--drop-device-work",
                              "--cpu-time", "--sweep-kib", "0", "64"]) == 0
    out = capsys.readouterr().out
    assert "after 0 KiB swept before each step:\n  other steps (3)" in out
    assert "after 64 KiB swept before each step:\n  other steps (3)" in out


@pytest.mark.parametrize("argv", [["--sweep-kib", "64"], ["--cpu-time", "--sweep-kib", "-1"]])
def test_host_profile_refuses_a_sweep_it_cannot_take(argv) -> None:
    from runnercheck.bench import host_profile

    with pytest.raises(SystemExit):
        host_profile.main(["--device", "cpu", "--reqs", "4", "--steps", "2", *argv])


def test_step_kinds_split_the_runner_steps_by_what_the_runner_did():
    """Admitting steps against the baseline's admitting ones; the runner's general steps without an admission (not
    the steady ones) against the baseline's steps without one."""
    from types import SimpleNamespace

    from runnercheck.bench.case_runner import _by_step_kind

    run = SimpleNamespace(host_us=[100.0, 100.0, 60.0, 60.0, 20.0, 20.0],
                          host_admitting=[True, True, False, False, False, False],
                          host_steady=[False, False, False, False, True, True],
                          base_us=[200.0, 200.0, 150.0, 150.0], base_admitting=[True, True, False, False])
    admitting, general = _by_step_kind(run, "tag")
    assert admitting.value == 0.5 and "general 60 us (2), steady 20 us (2)" in admitting.note
    assert general.name.endswith("general steps without an admission, tag") and general.value == 0.4
    run.host_admitting = run.base_admitting = [True] * 6  # every step admits (256 requests, 1% churn): no floor row
    assert len(_by_step_kind(run, "tag")) == 1
