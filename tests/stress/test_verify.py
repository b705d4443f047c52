"""`runnercheck verify`: the quick job passes on sim, planted bugs fail it with a report, the
statistics degrade gracefully, the report schema holds, and the CUDA delay driver is calibrated."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from runnercheck.checks.detectors.base import DetectorResult
from runnercheck.impl.lag_policies import DELAY_TARGETS
from runnercheck.impl.runner import make_runner
from runnercheck.stress.cli import verify
from runnercheck.stress.sim.races import calibrate_cuda_delay
from runnercheck.stress.report.summary import RunRecord, SummaryError, build_summary, load_summary, render_markdown, validate_summary
from runnercheck.stress.run.repro import Repro

PLANTED_MODULE = "runnercheck_planted_runners"


def run_verify(tmp_path: Path, *argv: str) -> tuple[int, Path]:
    from runnercheck.stress.cli.main import main

    out = tmp_path / "verify"
    return main(["verify", "--out", str(out), "--no-progress", *argv]), out


# --------------------------------------------------------------------------- the quick job


def test_quick_job_on_sim_passes_and_writes_a_valid_report(tmp_path: Path, capsys) -> None:
    rc, out = run_verify(tmp_path, "--device", "sim", "--quick", "--steps", "8", "--no-coverage-gate")
    doc = load_summary(out / "summary.json")  # schema-checked
    assert rc == 0 and doc["passed"] is True, (out / "summary.md").read_text()
    assert doc["device"] == "sim" and doc["seed"] == 0 and doc["divergences"] == 0
    assert doc["detectors"]["sync"]["violations"] == 0 and doc["detectors"]["lifetime"]["violations"] == 0
    assert [r["seed"] for r in doc["runs"]] == [0, 1, 2, 3, 4]
    ngram = doc["runs"][3]  # the n-gram proposer's run: device drafts asked for, the rate reported
    assert ngram["scheduler"]["ngram_spec_tokens"] == 3 and ngram["speculative"]["draft_tokens"] > 0
    printed = capsys.readouterr().out
    assert "n-gram drafts in ngram" in printed and "PASSED" in printed
    assert {r["lag_policy"]["name"] for r in doc["runs"]} == {"random-drain", "lag-k-steps"}
    assert doc["steps"] >= 15 and doc["tokens_compared"] > 0
    assert doc["chisq"]["status"] == "ran"
    # On CPU the statistics ran on both samplers, and the summary names each.
    named = {e["sampler"]: e for e in doc["chisq"]["samplers"]}
    assert set(named) == {"gumbel", "impl"} and all(e["status"] == "ran" and e["passed"] for e in named.values())
    assert "runner's sampler" in named["impl"]["role"] and "not the runner's kernel" in named["gumbel"]["role"]
    assert "impl (the runner's sampler" in (out / "summary.md").read_text()
    assert "runnercheck verify: PASSED" in (out / "summary.md").read_text()
    assert not (out / "repros").exists()


def test_the_plan_covers_lag_policies_in_flight_depths_and_drafts() -> None:
    sim = verify.plan_runs("sim", 5, "runnercheck.impl.runner:make_runner", quick=False)
    assert [p.config.seed for p in sim] == list(range(5, 5 + len(sim)))
    assert {p.config.lag_policy["name"] for p in sim} == {"run-immediately", "lag-k-steps", "random-drain", "hold-at-target"}
    assert {p.config.scheduler.max_inflight_steps for p in sim} == {1, 2, 3}
    assert any(p.config.scheduler.draft_prob > 0 for p in sim)
    for kind in ("sim", "cuda"):  # every plan runs the n-gram proposer on repetitive prompts
        for quick in (True, False):
            plan = verify.plan_runs(kind, 0, "runnercheck.impl.runner:make_runner", quick=quick)
            ngram = [p for p in plan if p.config.scheduler.ngram_spec_tokens > 0 and not p.config.scheduler.draft_model]
            assert ngram and all(p.churn.repetitive_prompt_prob > 0 for p in ngram), (kind, quick)
            # every plan runs the draft-model proposer, without prefix caching (the quick sim plan one short run)
            drafted = [p.config.scheduler for p in plan if p.config.scheduler.draft_model]
            assert drafted, (kind, quick)
            if kind == "sim" and quick:
                assert [p.config.steps for p in plan if p.config.scheduler.draft_model] == [verify.DRAFT_QUICK_TICKS]
            assert all(not s.prefix_caching and s.draft_prob == 0 for s in drafted)
    assert {p.config.scheduler.draft_model for p in verify.plan_runs("cuda", 0, "runnercheck.impl.runner:make_runner", quick=True)} \
        >= {"micro", "micro-draft"}  # the target drafting for itself (accepted) and a smaller model (rejected)
    cuda = verify.plan_runs("cuda", 0, "runnercheck.impl.runner:make_runner", quick=True, cuda_delay=lambda s, targets=None: calibrate_cuda_delay(s, 1000.0, targets=targets))
    assert all(p.config.lag_policy is None for p in cuda)
    assert {p.config.delay_policy["name"] for p in cuda} == {"random-delay", "targeted-delay"}
    assert max(p.config.scheduler.max_inflight_steps for p in cuda) >= 3  # the GPU may trail by several steps
    full = verify.plan_runs("cuda", 0, "runnercheck.impl.runner:make_runner", quick=False,
                            cuda_delay=lambda s, targets=None: calibrate_cuda_delay(s, 1000.0, targets=targets))
    single = [tuple(p.config.delay_policy["targets"]) for p in full if p.config.delay_policy["name"] == "targeted-delay"]
    assert {t for t in single if len(t) == 1} == {(t,) for t in DELAY_TARGETS}  # the full campaign cycles the targets


# --------------------------------------------------------------------------- planted bugs


class _Output:
    def __init__(self, get):
        self.get = get


def wrong_token_runner(weights, limits, device, base_seed):
    """The real runner, except that the first token it reports from step 3 on is off by one."""
    runner = make_runner(weights, limits, device, base_seed)
    original, flipped = runner.execute_model, []

    def execute_model(sched):
        inner = original(sched)
        if sched.step_id < 3 or flipped:
            return inner

        def get():
            out = inner.get()
            for i, toks in enumerate(out.sampled_token_ids):
                if toks and not flipped:
                    flipped.append(out.req_ids[i])
                    sampled = list(out.sampled_token_ids)
                    sampled[i] = ((toks[0] + 1) % limits.vocab_size, *toks[1:])
                    return dataclasses.replace(out, sampled_token_ids=tuple(sampled))
            return out

        return _Output(get)

    runner.execute_model = execute_model
    return runner


def host_read_runner(weights, limits, device, base_seed):
    """The real runner, plus a host read of a device count in every step."""
    runner = make_runner(weights, limits, device, base_seed)
    original = runner.execute_model

    def execute_model(sched):
        int(runner.state.base[0, 0])
        return original(sched)

    runner.execute_model = execute_model
    return runner


def stale_staging_runner(weights, limits, device, base_seed):
    """The real runner, plus a host write into staging slots that are still in flight."""
    from runnercheck.impl.buffers import SlotState

    runner = make_runner(weights, limits, device, base_seed)
    original = runner.execute_model

    def execute_model(sched):
        out = original(sched)
        for slot in runner.staging.slots:
            if slot.state is SlotState.IN_FLIGHT and slot.used_bytes:
                slot.host[0] = (int(slot.host[0]) + 1) % 256
        return out

    runner.execute_model = execute_model
    return runner


@pytest.fixture
def planted(monkeypatch):
    module = types.ModuleType(PLANTED_MODULE)
    for factory in (wrong_token_runner, host_read_runner, stale_staging_runner):
        setattr(module, factory.__name__, factory)
    monkeypatch.setitem(sys.modules, PLANTED_MODULE, module)
    return PLANTED_MODULE


def test_planted_wrong_token_fails_the_job_with_a_replayable_repro(tmp_path: Path, planted: str, capsys) -> None:
    spec = f"{planted}:wrong_token_runner"
    rc, out = run_verify(tmp_path, "--device", "sim", "--quick", "--steps", "10", "--runs", "1", "--skip-chisq", "--runner", spec)
    doc = load_summary(out / "summary.json")
    assert rc == 1 and doc["passed"] is False and doc["divergences"] == 1
    run = doc["runs"][0]
    assert run["first_divergence"].startswith("step ") and "expected token" in run["first_divergence"]
    repro = Repro.load(run["repro"])
    assert (repro.config.runner, repro.config.seed, repro.first_divergence) == (spec, 0, run["first_divergence"])
    assert repro.config.lag_policy == doc["runs"][0]["lag_policy"]
    assert "DIVERGENCE" in capsys.readouterr().out and "## Findings" in (out / "summary.md").read_text()

    from runnercheck.stress.cli import replay

    parser = argparse.ArgumentParser()
    replay.add_arguments(parser)
    assert replay.run(parser.parse_args([run["repro"], "--no-progress"])) == 1
    assert "the recorded divergence" in capsys.readouterr().out


@pytest.mark.parametrize(
    "factory, key, evidence",
    [("host_read_runner", "sync", "int() on device memory"),
     ("stale_staging_runner", "lifetime", "changed while it was in flight")],
)
def test_planted_detector_findings_fail_the_job(tmp_path: Path, planted: str, factory: str, key: str, evidence: str) -> None:
    rc, out = run_verify(tmp_path, "--device", "sim", "--quick", "--steps", "4", "--runs", "1", "--skip-chisq",
                         "--runner", f"{planted}:{factory}")
    doc = load_summary(out / "summary.json")
    assert rc == 1 and doc["passed"] is False and doc["detectors"][key]["violations"] > 0 and doc["divergences"] == 0
    sites = doc["runs"][0]["detectors"][key]["lines"]
    assert any(evidence in s for s in sites), sites


@pytest.mark.parametrize(
    "argv",
    [("--runner", "no_such_module:factory"), ("--runner", "not-a-spec"), ("--steps", "0"), ("--seed", "-1")],
    ids=["unknown-module", "bad-spec", "zero-steps", "negative-seed"],
)
def test_bad_arguments_exit_2_without_a_report(tmp_path: Path, argv, capsys) -> None:
    rc, out = run_verify(tmp_path, "--device", "sim", *argv)
    assert rc == 2 and not out.exists()
    assert "runnercheck verify:" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_a_gpu_exits_2(tmp_path: Path) -> None:
    assert run_verify(tmp_path, "--device", "cuda")[0] == 2


# --------------------------------------------------------------------------- statistics section


def test_statistics_not_importable_is_a_note_not_a_failure(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "runnercheck.checks.chisq.run", None)  # import raises ImportError
    section = verify.run_chisq(tmp_path)
    assert section["status"] == "not available" and section["passed"] is None
    doc = build_summary([_record()], section, device="sim", seed=0, runner="r:f", model="micro", quick=True, elapsed_s=1.0)
    assert doc["passed"] is True and "NOT checked" in render_markdown(doc)


@pytest.mark.parametrize(
    "run_quick, status, passed",
    [(lambda out, sampler=None: {"passed": False, "num_tests": 3, "num_failed": 1}, "ran", False),
     (lambda out, sampler=None: {"passed": True, "p": float("nan")}, "ran", True),
     (lambda out, sampler=None: {"no": "verdict"}, "error", False),
     (lambda out, sampler=None: 1 / 0, "error", False)],
    ids=["failed", "passed-with-nan", "no-verdict", "raises"],
)
def test_statistics_verdict_decides(tmp_path: Path, monkeypatch, run_quick, status: str, passed: bool) -> None:
    fake = types.ModuleType("runnercheck.checks.chisq.run")
    fake.run_quick = run_quick
    monkeypatch.setitem(sys.modules, "runnercheck.checks.chisq.run", fake)
    # Nor do the runner cases' pieces import (on cpu): the verdict is the fake `run_quick`'s alone.
    monkeypatch.setitem(sys.modules, "runnercheck.checks.chisq.draws", None)
    section = verify.run_chisq(tmp_path)
    assert (section["status"], section["passed"]) == (status, passed)
    doc = build_summary([_record()], section, device="sim", seed=0, runner="r:f", model="micro", quick=True, elapsed_s=1.0)
    assert doc["passed"] is passed
    json.dumps(doc, allow_nan=False)  # NaN from the statistics is made JSON-safe


def _stub_run_quick(calls: list):
    def run_quick(out, sampler=None, seed=0):
        calls.append(sampler)
        return {"passed": True, "num_tests": 3, "num_failed": 0}

    return run_quick


def test_statistics_on_cpu_run_the_runner_cases_too_and_a_planted_bias_there_fails_the_job(tmp_path: Path, monkeypatch) -> None:
    """The runner cases reject a min-p/temperature error even when the baseline's matrix passes."""
    from runnercheck.checks.chisq import run as chisq
    from runnercheck.checks.chisq import samplers

    calls: list = []
    monkeypatch.setattr(chisq, "run_quick", _stub_run_quick(calls))
    section = verify.run_chisq(tmp_path, device="cpu", runner_sampler=samplers.planted_sampler("min-p-before-temperature"))
    assert calls == ["gumbel"] and section["status"] == "ran" and section["passed"] is False
    baseline, runner = section["samplers"]
    assert (baseline["sampler"], baseline["passed"]) == ("gumbel", True)
    assert (runner["sampler"], runner["passed"]) == ("bias-min-p-before-temperature", False)
    assert (tmp_path / "chisq-runner" / "chisq.json").exists()
    doc = build_summary([_record()], section, device="sim", seed=0, runner="r:f", model="micro", quick=True, elapsed_s=1.0)
    assert doc["passed"] is False and "bias-min-p-before-temperature" in render_markdown(doc)
    control = verify.run_chisq(tmp_path / "control", device="cpu", runner_sampler=samplers.GumbelSampler())
    assert control["passed"] is True, control["summary"]


def test_statistics_on_cuda_run_on_the_runners_sampler(tmp_path: Path, monkeypatch) -> None:
    from runnercheck.checks.chisq import run as chisq

    calls: list = []
    monkeypatch.setattr(chisq, "run_quick", _stub_run_quick(calls))
    section = verify.run_chisq(tmp_path, device="cuda")
    assert calls == ["impl"] and [e["sampler"] for e in section["samplers"]] == ["impl"]
    assert "impl (the runner's sampler" in section["summary"]


# --------------------------------------------------------------------------- report schema


def _record(**changes) -> RunRecord:
    base = RunRecord(name="r", seed=0, lag_policy={"name": "lag-k-steps", "k": 1}, delay_policy=None,
                     scheduler={"max_inflight_steps": 1, "draft_prob": 0.0}, ticks=5, steps=4, requests=3, finished=1,
                     tokens_compared=6, logprobs_compared=2, ties=0,
                     detectors={"sync": DetectorResult(True, 0, [], {"counted_waits": 0}), "lifetime": DetectorResult(True)})
    return dataclasses.replace(base, **changes)


def test_summary_totals_and_verdict_follow_the_runs(tmp_path: Path) -> None:
    runs = [_record(), _record(name="bad", seed=1, first_divergence="step 2: request 'r0' position 5: expected token 1, got 2"),
            _record(name="sync", seed=2, detectors={"sync": DetectorResult(True, 2, ["2 x .item() at x.py:1"], {"counted_waits": 0})})]
    doc = build_summary(runs, {"status": "skipped", "passed": None}, device="sim", seed=0, runner="r:f", model="micro",
                        quick=True, elapsed_s=1.0)
    assert (doc["passed"], doc["divergences"], doc["detectors"]["sync"]["violations"], doc["steps"]) == (False, 1, 2, 12)
    md = render_markdown(doc)
    assert "FAILED" in md and "expected token 1, got 2" in md and ".item() at x.py:1" in md


@pytest.mark.parametrize(
    "corrupt, message",
    [(lambda d: d.update(steps=d["steps"] + 1), "runs add up"),
     (lambda d: d.update(passed=False), "'passed'"),
     (lambda d: d.pop("divergences"), "'divergences'"),
     (lambda d: d["detectors"]["sync"].update(violations=1), "'detectors'"),
     (lambda d: d["runs"][0]["detectors"]["sync"].update(violations="0"), "runs\\[0\\].detectors.sync"),
     (lambda d: d.update(chisq={"status": "ran"}), "chisq.passed"),
     (lambda d: d.update(runs=[]), "non-empty"),
     (lambda d: d.update(device="tpu"), "'device'"),
     (lambda d: d.update(chisq={"status": "ran", "passed": True}), "name the sampler"),
     (lambda d: d.update(chisq={"status": "ran", "passed": True, "samplers": [
         {"sampler": "impl", "role": "runner", "scope": "2 cases", "status": "ran", "passed": False}]}), "its samplers say")],
    ids=["steps-total", "verdict", "missing-key", "detector-total", "detector-result", "chisq-verdict", "no-runs", "device", "chisq-no-sampler", "chisq-sampler-verdict"],
)
def test_summary_schema_rejects_inconsistent_documents(corrupt, message: str) -> None:
    doc = build_summary([_record()], {"status": "skipped", "passed": None}, device="sim", seed=0, runner="r:f",
                        model="micro", quick=True, elapsed_s=1.0)
    validate_summary(doc)
    corrupt(doc)
    with pytest.raises(SummaryError, match=message):
        validate_summary(doc)


# --------------------------------------------------------------------------- the CUDA delay driver


def test_cuda_delay_calibration_makes_the_mean_delay_exceed_the_host_tick() -> None:
    from runnercheck.stress.sim.races import DEFAULT_DELAY_PROB, DEFAULT_LAG_FACTOR
    from runnercheck.stress.run.config import RandomDelay

    policy = calibrate_cuda_delay(7, host_tick_us=2000.0)
    delay = RandomDelay.from_dict(policy)  # the repro format `runnercheck replay` reads
    assert delay.describe() == policy and policy["seed"] == 7 and policy["p"] == DEFAULT_DELAY_PROB
    mean_us = delay.p * delay.max_us / 2
    assert mean_us == pytest.approx(DEFAULT_LAG_FACTOR * 2000.0, rel=1e-3) and mean_us > 2000.0
    for bad in ({"host_tick_us": 0.0}, {"host_tick_us": 10.0, "p": 0.0}, {"host_tick_us": 10.0, "lag_factor": -1.0}):
        with pytest.raises(ValueError):
            calibrate_cuda_delay(0, **bad)


def test_the_cuda_plan_runs_end_to_end_off_cuda(tmp_path: Path) -> None:
    """Calibration, the race churn, the CUDA limits and the delay hook, on cpu (where delays are no-ops)."""
    from runnercheck.stress.sim.races import measure_host_tick_us

    warmup = dataclasses.replace(verify.plan_runs("cuda", 3, "runnercheck.impl.runner:make_runner", quick=True)[0].config, device="cpu")
    tick_us = measure_host_tick_us(warmup, ticks=3)
    assert tick_us > 0
    planned = verify.plan_runs("cuda", 3, "runnercheck.impl.runner:make_runner", quick=True, ticks=4,
                               cuda_delay=lambda seed, targets=None: calibrate_cuda_delay(seed, tick_us, targets=targets))[1]
    planned = dataclasses.replace(planned, config=dataclasses.replace(planned.config, device="cpu"))
    record = verify.execute_run(planned, tmp_path)
    assert record.passed and record.steps >= 3 and record.delay_policy["name"] == "random-delay"


@pytest.mark.gpu
def test_delays_make_the_gpu_trail_the_host_and_the_job_passes(tmp_path: Path) -> None:
    from runnercheck.stress.run.driver import DifferentialRun
    from runnercheck.stress.sim.races import measure_host_tick_us
    from runnercheck.stress.run.harness import build_session
    from runnercheck.stress.run.config import RandomDelay

    plan = verify.plan_runs("cuda", 0, "runnercheck.impl.runner:make_runner", quick=True, ticks=60)
    tick_us = measure_host_tick_us(plan[0].config)
    config = dataclasses.replace(plan[1].config, delay_policy=calibrate_cuda_delay(1, tick_us))
    session = build_session(config)
    behind: list[int] = []
    pending: list = []
    original = session.runner.execute_model

    def execute_model(sched):
        behind.append(sum(not o.ready() for o in pending if hasattr(o, "ready")))
        out = original(sched)
        pending.append(out)
        return out

    session.runner.execute_model = execute_model
    from runnercheck.stress.sim.churn import Churn
    from runnercheck.stress.sim.races import RACE_CHURN

    result = DifferentialRun(session.runner, session.oracle, session.scheduler, before_tick=Churn(config.limits, 1, RACE_CHURN),
                             before_enqueue=RandomDelay.from_dict(config.delay_policy).hook(session.device)).run(60)
    assert result.ok, result.first_divergence_line()
    assert max(behind) >= 2, behind  # at some enqueue at least two earlier steps had not finished on the GPU
    # 40 ticks per run test the delays and the checks, not the campaign's breadth: the coverage gate
    # belongs to the 120-tick job (it failed here on "drafts: some accepted" in two H200 runs).
    rc, out = run_verify(tmp_path, "--device", "cuda", "--quick", "--steps", "40", "--skip-chisq", "--no-coverage-gate")
    assert rc == 0, (out / "summary.md").read_text()


@pytest.mark.parametrize("kind,quick", [("sim", True), ("sim", False), ("cuda", True), ("cuda", False)])
def test_every_plan_has_a_run_that_chunks_prefills_into_three(kind, quick):
    """The coverage gate asks for first, middle and final prefill chunks: some run's token budget must
    split the campaign's longer prompts in three (the cuda quick plan and the full sim plan lacked one;
    measured on sim over their traffic: 4 and 18 middle chunks)."""
    from runnercheck.stress.cli.verify import plan_runs

    runs = plan_runs(kind, 0, "runnercheck.impl.runner:make_runner", quick=quick)
    longest = lambda churn: 2 * churn.max_prompt_len + churn.system_prompt_len  # noqa: E731 -- a conversation's prompt
    assert any(2 * r.config.limits.max_num_batched_tokens < longest(r.churn) for r in runs)


def test_a_shard_runs_its_share_of_the_campaign_and_leaves_the_statistics_to_shard_0(tmp_path: Path) -> None:
    rc, out = run_verify(tmp_path, "--device", "sim", "--quick", "--steps", "4", "--shard", "1/3", "--in-process")
    doc = json.loads((out / "summary.json").read_text())
    assert rc == 0, doc
    assert [r["name"] for r in doc["runs"]] == ["lag-1 drafts", "draft-model lag-1"]  # the quick sim plan's 2nd and 5th
    assert doc["chisq"]["status"] == "skipped" and any("shard 1/3" in n for n in doc["notes"])


def test_a_shard_without_runs_is_a_usage_error(tmp_path: Path, capsys) -> None:
    rc, _ = run_verify(tmp_path, "--device", "sim", "--quick", "--runs", "1", "--shard", "1/2")
    assert rc == 2 and "none for this shard" in capsys.readouterr().err


def test_a_runner_factory_without_a_proposer_skips_the_proposer_runs_and_says_so() -> None:
    """A factory without the optional ``speculative`` keyword (the runner contract allows that) cannot run the
    n-gram or draft-model runs: verify leaves them out with a note instead of failing setup."""
    from runnercheck.stress.run.runners import simple_runner

    for kind in ("sim", "cuda"):
        plan = verify.plan_runs(kind, 0, "runnercheck.stress.run.runners:simple_runner", quick=True)
        proposer = [p.name for p in plan if p.config.scheduler.ngram_spec_tokens]
        assert proposer, kind  # the campaign has proposer runs to skip
        kept, note = verify.without_proposer_runs(plan, simple_runner, "runnercheck.stress.run.runners:simple_runner")
        assert [p.name for p in kept] == [p.name for p in plan if p.name not in proposer]
        assert note is not None and all(name in note for name in proposer) and "'speculative'" in note
    full = verify.plan_runs("sim", 0, "runnercheck.impl.runner:make_runner", quick=True)
    assert verify.without_proposer_runs(full, make_runner, "runnercheck.impl.runner:make_runner") == (full, None)
