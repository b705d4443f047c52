"""The batch-invariance check: our runner passes it (batch_invariant=True), each batch-dependence
mutant is caught, and a difference is classified from the two runs' logprobs."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from runnercheck.impl.interface import TokenLogprobs
from runnercheck.stress.cli import main as cli
from runnercheck.stress.invariance.checker import check_invariance, mutant_config, run_mutant_check, runner_kwargs
from runnercheck.stress.invariance.compare import first_difference, logprobs_equal
from runnercheck.stress.invariance.execute import ProbeTrace, StepBatch
from runnercheck.stress.mutants.batch import BATCH_MUTANTS, norm_blocks, split_rms_norm


def _trace(tokens, tables):
    step = StepBatch(0, ("p",), 1)
    lps = [TokenLogprobs(t, dict(tab)[t], 1, tuple(i for i, _ in tab), tuple(v for _, v in tab)) for t, tab in zip(tokens, tables)]
    return ProbeTrace(list(tokens), lps, [step] * len(tokens))


def test_classification_of_a_first_difference():
    a = _trace([1, 2], [[(1, -0.5), (2, -1.0)], [(2, -0.1), (3, -3.0)]])
    assert first_difference("s", "c", "p", "p", True, a, a) is None
    drift = _trace([1, 2], [[(1, -0.5), (2, -1.0)], [(2, -0.1000001), (3, -3.0)]])
    d = first_difference("s", "c", "p", "p", True, a, drift)
    assert (d.kind, d.index) == ("logprob-drift", 1)
    assert first_difference("s", "c", "p", "p", True, a, drift, tolerance=1e-3) is None
    same_logits_other_token = _trace([2, 2], [[(1, -0.5), (2, -1.0)], [(2, -0.1), (3, -3.0)]])
    d = first_difference("s", "c", "p", "p", False, a, same_logits_other_token)
    assert (d.kind, d.index, d.alone_token, d.batched_token, d.margin) == ("sampler-path", 0, 1, 2, 0.5)
    near_tie = _trace([1], [[(1, -0.70000), (2, -0.70001)]])
    flipped = _trace([2], [[(1, -0.70002), (2, -0.70000)]])
    assert first_difference("s", "c", "p", "p", True, near_tie, flipped).kind == "tie-flip"
    far = _trace([2, 2], [[(1, -0.5000001), (2, -1.0)], [(2, -0.1), (3, -3.0)]])  # drift 1e-7, margin 0.5
    assert first_difference("s", "c", "p", "p", True, a, far).kind == "corruption"
    assert first_difference("s", "c", "p", "p", True, a, _trace([1], [[(1, -0.5), (2, -1.0)]])).kind == "length"


def test_equality_is_bitwise():
    x = TokenLogprobs(1, 0.0, 1, (1,), (0.0,))
    assert logprobs_equal(x, x)
    assert not logprobs_equal(x, TokenLogprobs(1, -0.0, 1, (1,), (0.0,)))


def test_norm_mutant_rounds_differently_by_split():
    """Mutant (c) is observable on CPU: the same rows normed with another block count differ in bits."""
    import torch

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 32, generator=g), torch.ones(32)
    assert norm_blocks(1, 32) == 1 and norm_blocks(3, 32) == 2 and norm_blocks(9, 32) == 4
    assert not torch.equal(split_rms_norm(x, w, 1e-6, 1), split_rms_norm(x, w, 1e-6, 4))


def test_runner_kwargs_ask_for_batch_invariance_where_taken():
    from runnercheck.impl.runner import make_runner
    from runnercheck.stress.run.runners import simple_runner

    assert runner_kwargs(make_runner, False) == {"batch_invariant": True, "cuda_graphs": False}
    assert runner_kwargs(simple_runner, True) == {}


@pytest.mark.slow  # the default suite kills them through `runnercheck mutants --quick` (tests/stress/test_mutants.py)
@pytest.mark.parametrize("mutant", BATCH_MUTANTS)
def test_each_batch_mutant_is_killed_on_sim(mutant):
    result, first = run_mutant_check(mutant, "sim", 0)
    assert first is not None, f"{mutant} survived"
    d = result.first_difference
    assert d.scenario in ("batch", "size-3") and d.batched_step is not None and len(d.batched_step.req_ids) > 1
    assert d.alone_step is not None and d.alone_step.req_ids == (d.probe,)


def test_the_builtin_runner_passes_on_sim():
    from runnercheck.impl.runner import make_runner

    config = replace(mutant_config("sim", 3), kinds=("permuted", "size", "chunked", "prefix-hit"), num_probes=3,
                     max_tokens=3)
    result = check_invariance(make_runner, config, runner_name="make_runner")
    assert result.passed, result.failure_lines()
    assert {s.kind for s in result.scenarios} == {"alone", "permuted", "size", "chunked", "prefix-hit"}
    assert any(s.cached_tokens > 0 for s in result.scenarios if s.kind == "prefix-hit")
    assert result.runner_kwargs["batch_invariant"] is True


def test_cli_passes_and_reports_a_mutant(tmp_path, capsys):
    args = ["invariance", "--device", "sim", "--probes", "2", "--max-tokens", "4", "--scenarios", "batch",
            "--no-progress"]
    assert cli.main(args + ["--out", str(tmp_path / "ok")]) == 0
    doc = json.loads((tmp_path / "ok" / "summary.json").read_text())
    assert doc["command"] == "invariance" and doc["passed"] and doc["first_difference"] is None
    assert (tmp_path / "ok" / "summary.md").read_text().startswith("# runnercheck invariance: PASSED")
    assert cli.main(args + ["--mutant", "noise_keyed_by_batch_slot", "--out", str(tmp_path / "bad")]) == 1
    doc = json.loads((tmp_path / "bad" / "summary.json").read_text())
    assert not doc["passed"] and doc["mutant"] == "noise_keyed_by_batch_slot"
    assert "sampler-path" in doc["first_difference"] and "batch" in doc["first_difference"]
    assert "FAILED" in capsys.readouterr().out
    assert cli.main(args + ["--mutant", "no_such_bug", "--out", str(tmp_path / "x")]) == 2


@pytest.mark.gpu
def test_the_builtin_runner_passes_on_cuda_with_every_scenario():
    from runnercheck.impl.runner import make_runner

    config = replace(mutant_config("cuda", 0), kinds=("batch", "permuted", "mixed", "staggered", "size", "chunked",
                                                      "prefix-hit"), num_probes=3, batch_sizes=None)
    result = check_invariance(make_runner, config, runner_name="make_runner")
    assert result.passed, result.failure_lines()


@pytest.mark.gpu
@pytest.mark.parametrize("mutant", BATCH_MUTANTS)
def test_each_batch_mutant_is_killed_on_cuda(mutant):
    _, first = run_mutant_check(mutant, "cuda", 0)
    assert first is not None, f"{mutant} survived on cuda"


def test_fixture_arguments_that_name_nothing_are_refused_before_any_run():
    from runnercheck.stress.invariance.fixture import FixtureArgumentError, invariance_for_test

    def never_built(*args, **kwargs):
        raise AssertionError("no runner may be built for a bad argument")

    common = dict(kind="sim", seed=0, probes=1, max_tokens=1, batch_sizes=None, tolerance=0.0, report_dir=None)
    with pytest.raises(FixtureArgumentError, match="unknown scenario kinds"):
        invariance_for_test(never_built, "x", model="micro", scenarios=["sideways"], **common)
    with pytest.raises(FixtureArgumentError, match="preset"):
        invariance_for_test(never_built, "x", model="huge", scenarios=None, **common)


def test_a_runner_that_dies_in_a_batch_is_a_failed_check_with_the_scenarios_before_it(tmp_path, capsys):
    """The check runs in a child: a runner killed by a signal in its batched run ends the child, and the
    command reports the alone runs that finished plus the crash."""
    plugin = tmp_path / "dying_runner.py"
    plugin.write_text(
        "import os, signal\n"
        "from runnercheck.impl.runner import make_runner\n"
        "def factory(weights, limits, device, base_seed, *, cuda_graphs=True, batch_invariant=False):\n"
        "    runner = make_runner(weights, limits, device, base_seed, cuda_graphs=cuda_graphs, batch_invariant=batch_invariant)\n"
        "    execute = runner.execute_model\n"
        "    def execute_model(sched):\n"
        "        if len(sched.num_scheduled_tokens) > 1:\n"
        "            os.kill(os.getpid(), signal.SIGKILL)\n"
        "        return execute(sched)\n"
        "    runner.execute_model = execute_model\n"
        "    return runner\n")
    rc = cli.main(["invariance", "--device", "sim", "--probes", "2", "--max-tokens", "2", "--scenarios", "batch",
                   "--runner", f"{plugin}:factory", "--no-progress", "--out", str(tmp_path / "out")])
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert rc == 1 and not doc["passed"]
    names = [s["name"] for s in doc["scenarios"]]
    assert names == ["alone p0", "alone p1", "(check process)"]
    assert "SIGKILL" in doc["scenarios"][-1]["error"]
