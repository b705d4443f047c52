"""The run owner's edges: a user runner's broken output is a divergence with a repro, a crashing
run (a planted segfault) is a finding with a repro that replays into the same crash, an
interrupted command leaves the previous report folder intact, coverage at zero fails a campaign,
JUnit parses, and replay warns about provenance."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
import types
import xml.etree.ElementTree as ET

import pytest

from runnercheck.stress.cli.main import main
from runnercheck.stress.run.repro import Repro
from runnercheck.stress.run.runners import simple_runner

PLANTED = "runnercheck_harness_plants"


class _Ready:
    def __init__(self, out):
        self.out = out

    def get(self):
        return self.out


def _wrap(fn):
    """A factory: the simple runner, with ``fn(out, sched, limits)`` applied to each output from step 2 on."""

    def factory(weights, limits, device, base_seed):
        runner = simple_runner(weights, limits, device, base_seed)
        original = runner.execute_model

        def execute_model(sched):
            out = original(sched).get()
            return _Ready(fn(out, sched, limits) if sched.step_id >= 2 and out.req_ids else out)

        runner.execute_model = execute_model
        return runner

    return factory


def _fewer_rows(out, sched, limits):
    return dataclasses.replace(out, sampled_token_ids=out.sampled_token_ids[:-1])


def _out_of_range(out, sched, limits):
    return dataclasses.replace(out, sampled_token_ids=tuple((limits.vocab_size + 5,) if t else t for t in out.sampled_token_ids))


def _float_ids(out, sched, limits):
    return dataclasses.replace(out, sampled_token_ids=tuple(tuple(float(x) for x in t) for t in out.sampled_token_ids))


def _none(out, sched, limits):
    return None


def _wrong_step(out, sched, limits):
    return dataclasses.replace(out, step_id=out.step_id + 1)


def _segfault_at_step_4(weights, limits, device, base_seed):
    runner = simple_runner(weights, limits, device, base_seed)
    original = runner.execute_model

    def execute_model(sched):
        if sched.step_id == 4:
            os.kill(os.getpid(), signal.SIGSEGV)  # what a kernel reading past a buffer does to the process
        return original(sched)

    runner.execute_model = execute_model
    return runner


def _hang_at_step_4(weights, limits, device, base_seed):
    runner = simple_runner(weights, limits, device, base_seed)
    original = runner.execute_model

    def execute_model(sched):
        if sched.step_id == 4:
            time.sleep(3600)  # a deadlocked kernel or a wait on an event nobody records
        return original(sched)

    runner.execute_model = execute_model
    return runner


@pytest.fixture
def plants(monkeypatch):
    module = types.ModuleType(PLANTED)
    for name, fn in (("fewer_rows", _fewer_rows), ("out_of_range", _out_of_range), ("float_ids", _float_ids),
                     ("none_output", _none), ("wrong_step", _wrong_step)):
        setattr(module, name, _wrap(fn))
    module.segfault = _segfault_at_step_4
    module.hang = _hang_at_step_4
    monkeypatch.setitem(sys.modules, PLANTED, module)
    return PLANTED


def stress(out, runner: str, *extra: str) -> int:
    return main(["stress", "--device", "sim", "--seed", "3", "--steps", "12", "--runner", runner, "--out", str(out),
                 "--no-progress", *extra])


@pytest.mark.parametrize("plant, evidence", [
    ("fewer_rows", "token rows for"), ("out_of_range", "not token ids"), ("float_ids", "not token ids"),
    ("none_output", "expected a ModelRunnerOutput"), ("wrong_step", "output is for step"),
])
def test_a_broken_runner_output_is_a_divergence_with_a_repro(tmp_path, capsys, plants, plant: str, evidence: str) -> None:
    out = tmp_path / "out"
    assert stress(out, f"{plants}:{plant}") == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    line = next(x for x in captured.out.splitlines() if x.startswith("DIVERGENCE "))
    assert "output contract" in line and evidence in line
    repro = Repro.load(out / "repro.json")
    assert repro.first_divergence == line[len("DIVERGENCE "):]
    assert main(["replay", str(out / "repro.json"), "--no-progress"]) == 1
    assert "the recorded divergence" in capsys.readouterr().out


def test_a_crash_is_a_finding_with_a_repro_that_replays_into_the_same_crash(tmp_path, capsys, plants) -> None:
    out = tmp_path / "out"
    assert stress(out, f"{plants}:segfault") == 1
    captured = capsys.readouterr()
    line = next(x for x in captured.out.splitlines() if x.startswith("DIVERGENCE "))[len("DIVERGENCE "):]
    assert line.startswith("step 4: the run crashed (killed by signal SIGSEGV); last completed: step ")
    summary = json.loads((out / "summary.json").read_text())
    run = summary["runs"][0]
    assert run["crash"] == "killed by signal SIGSEGV" and run["last_completed_step"] in (2, 3)
    repro = Repro.load(out / "repro.json")
    assert repro.first_divergence == line and 0 < repro.config.steps == len(repro.trace)
    assert main(["replay", str(out / "repro.json"), "--no-progress"]) == 1
    assert "the recorded divergence" in capsys.readouterr().out


def test_a_hanging_runner_is_stopped_by_the_timeout_and_reported_as_a_crash(tmp_path, capsys, plants) -> None:
    out = tmp_path / "out"
    started = time.monotonic()
    assert stress(out, f"{plants}:hang", "--timeout", "3") == 1
    assert time.monotonic() - started < 120
    run = json.loads((out / "summary.json").read_text())["runs"][0]
    assert run["crash"] == "timed out after 3 s (process group killed)"
    v = tmp_path / "v"
    assert main(["verify", "--device", "sim", "--quick", "--steps", "8", "--runs", "1", "--skip-chisq", "--no-progress",
                 "--runner", f"{plants}:hang", "--timeout", "3", "--out", str(v)]) == 1
    assert json.loads((v / "summary.json").read_text())["runs"][0]["crash"] == run["crash"]
    capsys.readouterr()


def test_verify_reports_a_crashing_run_and_keeps_going(tmp_path, capsys, plants) -> None:
    out = tmp_path / "v"
    rc = main(["verify", "--device", "sim", "--quick", "--steps", "8", "--runs", "2", "--skip-chisq", "--no-progress",
               "--runner", f"{plants}:segfault", "--out", str(out), "--junit", str(tmp_path / "junit.xml")])
    assert rc == 1
    doc = json.loads((out / "summary.json").read_text())
    assert [r["crash"] for r in doc["runs"]] == ["killed by signal SIGSEGV"] * 2
    assert all(Repro.load(r["repro"]).first_divergence == r["first_divergence"] for r in doc["runs"])
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == 4  # two runs, coverage, statistics
    first = cases[0]
    assert first.find("failure").get("message").startswith("crash: killed by signal SIGSEGV")
    props = {p.get("name"): p.get("value") for p in first.find("properties")}
    assert props["seed"] == "0" and props["repro"] == doc["runs"][0]["repro"]
    assert "CRASH" in capsys.readouterr().out


def test_an_interrupted_verify_keeps_its_finished_runs_and_the_previous_report(tmp_path, capsys, monkeypatch) -> None:
    from runnercheck.checks.report_folder import atomic_report_folder
    from runnercheck.stress.cli import verify

    out = tmp_path / "v"
    with atomic_report_folder(out) as tmp:
        (tmp / "summary.json").write_text("the previous report")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(verify, "run_chisq", interrupted)
    rc = main(["verify", "--device", "sim", "--quick", "--steps", "3", "--runs", "1", "--no-progress",
               "--runner", "runnercheck.stress.run.runners:simple_runner", "--out", str(out)])
    assert rc == 130
    captured = capsys.readouterr()
    assert "interrupted (SIGINT) during the sampler statistics" in captured.err and "Traceback" not in captured.err
    doc = json.loads((out / "summary.json").read_text())
    assert doc["status"] == "incomplete" and doc["passed"] is False and len(doc["runs"]) == 1
    assert (out / "summary.md").read_text().startswith("> **INCOMPLETE REPORT**")
    (aside,) = tmp_path.glob("v.prev-*")
    assert (aside / "summary.json").read_text() == "the previous report"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["v", aside.name])
    assert f"moved to {aside}" in captured.out


def test_replay_warns_when_provenance_differs(tmp_path, capsys, plants) -> None:
    out = tmp_path / "out"
    assert stress(out, f"{plants}:fewer_rows") == 1
    capsys.readouterr()
    repro = Repro.load(out / "repro.json")
    dataclasses.replace(repro, provenance=dict(repro.provenance, torch="0.0-elsewhere")).save(out / "moved.json")
    assert main(["replay", str(out / "moved.json"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "WARNING provenance differs" in err and "torch" in err and "0.0-elsewhere" in err


def test_replay_refuses_another_format_version(tmp_path, capsys, plants) -> None:
    from runnercheck.stress.run.repro import checksum

    out = tmp_path / "out"
    assert stress(out, f"{plants}:fewer_rows") == 1
    doc = json.loads((out / "repro.json").read_text())
    doc.pop("checksum")
    doc["version"] = 3
    doc["checksum"] = checksum(doc)
    (out / "v3.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["replay", str(out / "v3.json")]) == 2
    assert "unknown repro version 3" in capsys.readouterr().err


# --------------------------------------------------------------------------- coverage


def test_coverage_at_zero_fails_the_campaign() -> None:
    from runnercheck.stress.run.coverage import FEATURES
    from runnercheck.stress.report.summary import RunRecord, build_summary, render_markdown

    full = {f: 1 for f in FEATURES}
    record = RunRecord(name="r", seed=0, lag_policy=None, delay_policy=None, scheduler={}, ticks=1, steps=1,
                       requests=1, finished=0, tokens_compared=1, logprobs_compared=0, ties=0, coverage=full)
    skipped = {"status": "skipped", "passed": None}
    common = dict(device="sim", seed=0, runner="r:f", model="micro", quick=True, elapsed_s=1.0, require_coverage=True)
    assert build_summary([record], skipped, **common)["passed"] is True
    missing = dataclasses.replace(record, coverage=dict(full, **{"drafts: some accepted": 0}))
    doc = build_summary([missing], skipped, **common)
    assert doc["passed"] is False and doc["coverage_zero"] == ["drafts: some accepted"]
    assert "NOT exercised: drafts: some accepted" in render_markdown(doc)


def test_the_coverage_counter_counts_what_a_run_does() -> None:
    from runnercheck.checks.compare import StepComparison
    from runnercheck.impl.interface import CachedRequest, CachedRequests, ModelRunnerOutput, NewRequest, RunnerLimits, SamplingParams, SchedulerOutput
    from runnercheck.stress.run.coverage import CoverageCounter
    from runnercheck.stress.run.driver import StepReport

    limits = RunnerLimits(vocab_size=16, max_num_reqs=2, max_model_len=64, max_num_batched_tokens=8, num_kv_blocks=8,
                          block_size=4)
    c = CoverageCounter(limits)
    params = SamplingParams(temperature=0.0, top_k=3, repetition_penalty=1.2)
    s0 = SchedulerOutput(0, (NewRequest("a", tuple(range(6)), params, (0, 1)),), CachedRequests(), {"a": 4})
    c.observe(StepReport(0, s0, ModelRunnerOutput(0, ("a",), ((),)), None, StepComparison(0)))
    s1 = SchedulerOutput(1, (), CachedRequests.of((CachedRequest("a", (), 4),)), {"a": 2})
    c.observe(StepReport(1, s1, ModelRunnerOutput(1, ("a",), ((5,),)), None, StepComparison(1)))
    s2 = SchedulerOutput(2, (), CachedRequests.of((CachedRequest("a", (), 6),)), {"a": 3}, draft_token_ids={"a": (1, 2)})
    c.observe(StepReport(2, s2, ModelRunnerOutput(2, ("a",), ((1, 7),)), None, StepComparison(2)))
    totals = c.totals()
    assert totals["params: greedy"] == 1 and totals["combo: top-k + repetition penalty"] == 1
    assert totals["combo: greedy + penalties"] == 1
    assert totals["prefill chunk: first"] == 1 and totals["prefill chunk: final"] == 1
    assert totals["chunk ends on a block boundary"] == 1
    assert totals["penalty over prompt tokens"] == 1 and totals["penalty over output tokens"] == 1
    assert totals["drafts: some accepted"] == 1 and totals["drafts: all accepted"] == 0


# --------------------------------------------------------------------------- logits faults and drafts


def _sim_config(runner: str, ticks: int, **changes):
    from runnercheck.stress.cli.verify import plan_runs

    config = plan_runs("sim", 1, runner, quick=True, ticks=ticks)[1].config
    return dataclasses.replace(config, **changes)


def test_faults_planted_in_both_agree_and_are_counted() -> None:
    from runnercheck.stress.run.harness import ChurnOps, checked_run
    from runnercheck.stress.cli.verify import VERIFY_CHURN

    config = _sim_config("runnercheck.impl.runner:make_runner", 14, scheduler=dataclasses.replace(
        _sim_config("runnercheck.impl.runner:make_runner", 1).scheduler, draft_prob=0.0),
        logits_fault={"name": "nan-inf-rows", "min_position": 4, "modulus": 3, "nan_residue": 0, "inf_residue": 1})
    findings = checked_run(config, ChurnOps(dataclasses.replace(VERIFY_CHURN, max_prompt_len=4)))
    assert findings.result.ok, findings.first_divergence_line()
    assert findings.coverage["logits: NaN row sampled"] > 0 and findings.coverage["logits: +Inf row sampled"] > 0


def test_the_fault_hook_is_in_place_when_the_graphs_are_captured_again() -> None:
    """A CUDA graph replays what ran at capture: installing the hook must capture the runner's steps
    again with the hooked sampler (on the H200 both delayed verify runs diverged on nan_flag without it)."""
    from runnercheck.impl.device import Device
    from runnercheck.impl.model.weights import preset, random_weights
    from runnercheck.impl.runner import make_runner
    from runnercheck.reference.runner import ReferenceRunner
    from runnercheck.stress.sim.faults import LogitsFault
    from runnercheck.stress.run.config import default_limits

    config = preset("micro")
    limits = default_limits(config, max_num_reqs=4)
    weights = random_weights(config, seed=0)
    runner = make_runner(weights, limits, Device("cpu"))
    graphs = runner.graphs
    assert graphs.captured and graphs.graphs
    build, seen = graphs._build_step, []

    def spy(inputs, key):
        seen.append(runner.sampler.sample)
        return build(inputs, key)

    graphs._build_step = spy
    assert LogitsFault(min_position=4).install(runner, ReferenceRunner(weights, limits, base_seed=0))
    hooked = runner.sampler.sample
    assert graphs.captured and seen and all(s is hooked for s in seen)
    assert len(seen) == len(graphs.graphs) + len(graphs.fused_graphs)  # the fused steady steps are captured again too


def test_only_prompts_within_max_prompt_len_ask_for_prompt_logprobs() -> None:
    """A conversation or system-prompt prefix makes prompts longer than max_prompt_len; those ask for no
    prompt logprobs, so a logits fault past max_prompt_len never feeds them (on the H200 a 30-token
    conversation prompt got an oracle-only +Inf into its prompt logprobs)."""
    from runnercheck.impl.device import Device
    from runnercheck.impl.model.weights import preset, random_weights
    from runnercheck.reference.runner import ReferenceRunner
    from runnercheck.stress.sim.churn import Churn
    from runnercheck.stress.run.driver import DifferentialRun
    from runnercheck.stress.run.config import default_limits
    from runnercheck.stress.sim.scheduler import SchedulerSim
    from runnercheck.stress.cli.verify import VERIFY_CHURN

    limits = default_limits(preset("micro"), max_num_reqs=4, num_kv_blocks=32)
    weights = random_weights(preset("micro"), seed=0)
    churn = Churn(limits, 0, dataclasses.replace(VERIFY_CHURN, max_prompt_len=6, conversation_prob=0.9, system_prompt_prob=0.2,
                                                 prompt_logprobs_prob=0.9, max_new_tokens=4, param_plan=False))
    DifferentialRun(simple_runner(weights, limits, Device("cpu"), 0), ReferenceRunner(weights, limits, base_seed=0),
                    SchedulerSim(limits, seed=0), before_tick=churn).run(40)
    adds = [op for ops in churn.trace for op in ops if op["op"] == "add"]
    long = [op for op in adds if len(op["prompt"]) > 6]
    assert long and all(op["params"]["prompt_logprobs"] is None for op in long)
    assert any(op["params"]["prompt_logprobs"] is not None for op in adds)


def test_a_fault_the_oracle_does_not_apply_is_caught(monkeypatch) -> None:
    """The hook is effective: planted in the runner alone, the differential sees the NaN rule fire."""
    from runnercheck.stress.sim import faults
    from runnercheck.stress.run.harness import ChurnOps, checked_run
    from runnercheck.stress.cli.verify import VERIFY_CHURN

    original = faults.LogitsFault.install

    def runner_only(self, runner, oracle):
        class _NoModel:
            pass

        shadow = _NoModel()
        shadow.model = types.SimpleNamespace(logits=lambda ids: None)
        return original(self, runner, shadow)

    monkeypatch.setattr(faults.LogitsFault, "install", runner_only)
    config = _sim_config("runnercheck.impl.runner:make_runner", 14,
                         logits_fault={"name": "nan-inf-rows", "min_position": 4, "modulus": 3, "nan_residue": 0,
                                       "inf_residue": 1})
    findings = checked_run(config, ChurnOps(dataclasses.replace(VERIFY_CHURN, max_prompt_len=4)))
    assert not findings.result.ok
    assert findings.result.first_divergence.kind in ("nan_flag", "token")


def test_oracle_drafts_get_accepted_all_some_and_none() -> None:
    from runnercheck.stress.run.harness import ChurnOps, checked_run
    from runnercheck.stress.sim.scheduler import SchedulerConfig
    from runnercheck.stress.cli.verify import VERIFY_CHURN

    config = _sim_config("runnercheck.stress.run.runners:simple_runner", 30, scheduler=SchedulerConfig(1, 1.0), draft_source="oracle",
                         logits_fault=None)
    findings = checked_run(config, ChurnOps(dataclasses.replace(VERIFY_CHURN, max_new_tokens=10, max_prompt_len=6)))
    assert findings.result.ok, findings.first_divergence_line()
    cov = findings.coverage
    assert cov["drafts: all accepted"] > 0 and cov["drafts: some accepted"] > 0 and cov["drafts: none accepted"] > 0


def test_staged_write_patterns_of_the_runner_are_observed_through_its_shared_group() -> None:
    """The runner flushes one shared group, not its tensors: the observer must still see every diff
    (it counted nothing on the H200 until it wrapped the group's flush)."""
    from runnercheck.stress.run.harness import ChurnOps, checked_run
    from runnercheck.stress.cli.verify import VERIFY_CHURN

    config = _sim_config("runnercheck.impl.runner:make_runner", 12, logits_fault=None)
    findings = checked_run(config, ChurnOps(VERIFY_CHURN))
    assert findings.result.ok, findings.first_divergence_line()
    cov = findings.coverage
    assert cov["staged write: single cell"] > 0 and cov["staged write: run of cells"] > 0
    assert cov["staged write: several rows in one flush"] > 0


def test_staged_write_patterns_are_classified() -> None:
    from runnercheck.stress.run.staged_writes import StagedWriteObserver

    obs = StagedWriteObserver(object())
    assert not obs.active
    obs.classify([(0, 0, [1]), (1, 2, [4, 5, 6]), (1, 4, [9])])
    totals = obs.totals()
    assert totals["staged write: single cell"] == 2 and totals["staged write: run of cells"] == 1
    assert totals["staged write: several rows in one flush"] == 1
    assert totals["staged write: several diffs to one row"] == 1
    assert totals["staged write: one cell written twice in a step"] == 1  # column 4 of row 1


def test_mutants_junit_has_one_case_per_mutant_and_control(tmp_path) -> None:
    from runnercheck.stress.report.junit_cases import mutants_cases, write_cases
    from runnercheck.stress.mutants.report import ControlResult, MutantResult, MutantsReport

    def mutant(name, killed_by, designed=("differential",), status=None):
        return MutantResult(name=name, cls="state", description="d", needs_gpu=False, designed=list(designed),
                            workload="steady", status=status or ("killed" if killed_by else "survived"),
                            killed=bool(killed_by), killed_by=list(killed_by),
                            as_designed=bool(set(killed_by) & set(designed)), checks_run=["differential"],
                            evidence={k: "step 3: expected token 1, got 2" for k in killed_by}, ticks=3, seconds=1.0,
                            skip_reason="needs a GPU to manifest" if status == "skipped" else None)

    report = MutantsReport(device="sim", quick=True, seed=4, chisq=False, command="c", date="d",
                           mutants=[mutant("a", ["differential"]), mutant("b", []), mutant("c", [], status="skipped")],
                           controls=[ControlResult("workload", "steady", {}, 3, 1.0),
                                     ControlResult("workload", "decode", {"sync": "1 host sync"}, 3, 1.0)],
                           elapsed_s=5.0)
    path = write_cases(tmp_path / "m.xml", "runnercheck mutants", mutants_cases(report), {"seed": 4})
    suite = ET.parse(path).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("5", "2", "1")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["a"].find("failure") is None
    assert cases["b"].find("failure").get("message").startswith("survived")
    assert cases["c"].find("skipped") is not None
    assert "a check fired without a mutant" in cases["control workload decode"].find("failure").get("message")


def test_a_runner_without_a_row_table_is_not_counted_for_row_reuse() -> None:
    """``row taken over by another request`` is read from ``state.req_to_row``: a runner without one (the runner
    contract does not ask for it) leaves the feature out, so the verify gate cannot fail on what it cannot see."""
    from runnercheck.stress.run.coverage import ROW_FEATURE
    from runnercheck.stress.run.harness import ChurnOps, checked_run
    from runnercheck.stress.cli.verify import VERIFY_CHURN

    simple = checked_run(_sim_config("runnercheck.stress.run.runners:simple_runner", 12), ChurnOps(VERIFY_CHURN))
    assert simple.result.ok and ROW_FEATURE not in simple.coverage and simple.coverage["decode step"] > 0
    ours = checked_run(_sim_config("runnercheck.impl.runner:make_runner", 12), ChurnOps(VERIFY_CHURN))
    assert ours.result.ok and ROW_FEATURE in ours.coverage
    from runnercheck.stress.run.coverage import FEATURES, merge, zero_features

    assert ROW_FEATURE not in zero_features(merge([simple.coverage, simple.coverage]))  # the campaign's gate
    assert ROW_FEATURE in merge([simple.coverage, ours.coverage]) and set(FEATURES) <= set(merge([]))
