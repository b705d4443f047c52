"""The benchmark lab's host tools (`runnercheck.bench.lab`): cProfile and per-statement timing of
``execute_model``, the launch probe, instruction counts and cache sweeps, on tiny CPU runs."""
from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest
import torch


def test_host_profile_reports_execute_model_time_and_the_runner_functions(capsys) -> None:
    from runnercheck.bench.lab.host_profile import main as host_profile_main

    assert host_profile_main(["--device", "cpu", "--reqs", "2", "--steps", "2", "--top", "15"]) == 0
    text = capsys.readouterr().out
    assert "median execute_model host time" in text
    assert "tottime" in text


def test_host_profile_can_time_the_bookkeeping_alone(capsys) -> None:
    from runnercheck.bench.lab.host_profile import main as host_profile_main

    assert host_profile_main(["--device", "cpu", "--reqs", "4", "--steps", "3", "--top", "5", "--drop-device-work"]) == 0
    assert "device work dropped" in capsys.readouterr().out


def test_host_primitives_writes_its_figures(tmp_path) -> None:
    from runnercheck.bench.lab.host_primitives import main as primitives_main

    out = tmp_path / "primitives.json"
    assert primitives_main(["--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["unit"] == "us (median)" and figures["host"]["python call"] >= 0
    assert ("cuda" in figures) == torch.cuda.is_available()


def test_host_profile_times_the_pieces_of_a_step(capsys) -> None:
    from runnercheck.bench.lab.host_profile import main as host_profile_main

    assert host_profile_main(["--device", "cpu", "--reqs", "4", "--steps", "3", "--churn", "0", "--drop-device-work", "--phases"]) == 0
    text = capsys.readouterr().out
    assert "execute_model  (3 calls)" in text and "runner._check" in text and "state.advance" in text


def test_host_profile_times_each_statement_of_one_method(capsys) -> None:
    from runnercheck.bench.lab.host_profile import main as host_profile_main

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
    from runnercheck.bench.lab.host_profile import main as host_profile_main

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
    from runnercheck.bench.lab.host_profile import main as host_profile_main

    assert host_profile_main(["--device", "cpu", "--reqs", "4", "--steps", "4", "--churn", "0", "--drop-device-work",
                              "--lines", "runnercheck.impl.runner:ModelRunner._check", "--lines", "runnercheck.impl.step_reader:read_steady_step"]) == 0
    text = capsys.readouterr().out
    assert "ModelRunner._check ran 4 times" in text and "read_steady_step ran 4 times" in text
    import runnercheck.impl.runner as runner_module
    import runnercheck.impl.step_reader as step_reader
    assert runner_module.read_steady_step is step_reader.read_steady_step  # put back
    assert "__rc_marks" not in step_reader.read_steady_step.__code__.co_names


def test_host_profile_refuses_what_it_cannot_recompile(capsys) -> None:
    from runnercheck.bench.lab.host_profile import main as host_profile_main

    for target, why in (("runnercheck.impl.runner:ModelRunner.nope", "no attribute"), ("runnercheck.impl.runner", "MODULE:QUALNAME"),
                        ("runnercheck.impl.buffers:StagingLifetimeError.__init__", "closure cells")):
        with pytest.raises(SystemExit):
            host_profile_main(["--device", "cpu", "--reqs", "2", "--steps", "1", "--lines", target])
        assert why in capsys.readouterr().err, target


def test_host_instructions_refuses_bad_arguments(capsys) -> None:
    from runnercheck.bench.lab.host_instructions import main as instructions_main

    for argv in (["--reqs", "0"], ["--steps", "0"], ["--churn", "2"]):
        with pytest.raises(SystemExit):
            instructions_main(argv)
        assert "must be" in capsys.readouterr().err, argv


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_host_instructions_counts_the_same_steps_the_same() -> None:
    """The count is a measure that does not move: two runs of the same steps agree to well under 1%."""
    from runnercheck.bench.lab.host_instructions import count

    first, second = count(4, 0.01, 3), count(4, 0.01, 3)
    assert first > 10 and abs(first - second) < 0.01 * first, (first, second)


def test_host_profile_sets_wall_time_against_cpu_time(capsys, monkeypatch) -> None:
    """``--cpu-time``: a step that sleeps half of its wall time reads so (its wall far above its CPU time), where the
    plain steps' wall and CPU time are close."""
    from runnercheck.bench.lab import host_profile
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
    from runnercheck.bench.lab.host_profile import sweep

    words = np.zeros(1024, np.uint64)
    sweep(words)
    sweep(words)
    assert (words == 2).all()


def test_host_profile_reports_each_sweep_size_from_interleaved_steps(capsys) -> None:
    from runnercheck.bench.lab import host_profile

    assert host_profile.main(["--device", "cpu", "--reqs", "4", "--steps", "6", "--churn", "0", "--drop-device-work",
                              "--cpu-time", "--sweep-kib", "0", "64"]) == 0
    out = capsys.readouterr().out
    assert "after 0 KiB swept before each step:\n  other steps (3)" in out
    assert "after 64 KiB swept before each step:\n  other steps (3)" in out


@pytest.mark.parametrize("argv", [["--sweep-kib", "64"], ["--cpu-time", "--sweep-kib", "-1"]])
def test_host_profile_refuses_a_sweep_it_cannot_take(argv) -> None:
    from runnercheck.bench.lab import host_profile

    with pytest.raises(SystemExit):
        host_profile.main(["--device", "cpu", "--reqs", "4", "--steps", "2", *argv])
