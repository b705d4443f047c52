"""The differential driver: ordering, tie adoption, stopping at divergences, and real runner pairs."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

import runnercheck.stress.run.runners as runners_mod
from runnercheck.impl.device import Device
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.stress.sim.churn import Churn, ChurnConfig
from runnercheck.stress.run.driver import DifferentialRun
from runnercheck.stress.run.harness import load_runner_factory
from runnercheck.stress.run.config import RunSetupError
from runnercheck.stress.run.runners import SimpleRunner, reference_runner, simple_runner
from runnercheck.stress.sim.scheduler import SchedulerSim
from runnercheck.stress.run.config import default_limits

TOL = 1e-3


@pytest.fixture(scope="module")
def micro():
    config = preset("micro")
    return random_weights(config, seed=3), default_limits(config)


@dataclass(frozen=True)
class Res:
    token: int
    gap: float
    fragile: bool = False
    nan_flag: bool = False


class SimpleOracle:
    """A second `SimpleRunner` behind the oracle protocol; reports ties where told to."""

    def __init__(self, weights, limits, base_seed: int, ties_at: set[int] = frozenset()):
        self.runner = SimpleRunner(weights, limits, base_seed)
        self.ties_at = ties_at
        self.last_results: dict = {}
        self.log: list[str] = []

    def execute_model(self, sched):
        self.log.append(f"oracle {sched.step_id}")
        out = self.runner.execute_model(sched).get()
        gap = 1e-5 if sched.step_id in self.ties_at else math.inf
        self.last_results = {r: [Res(t, gap) for t in toks] for r, toks in zip(out.req_ids, out.sampled_token_ids) if toks}
        return out

    def replace_output_token(self, req_id: str, index_from_end: int, token: int) -> None:
        self.log.append(f"adopt {req_id}")
        self.runner.requests[req_id].tokens[-1 - index_from_end] = token


class FlipRunner(SimpleRunner):
    """Changes the first sampled token of step ``flip_step`` (in its own state too) and logs calls."""

    def __init__(self, weights, limits, base_seed: int, flip_step: int = -1, log: list | None = None):
        super().__init__(weights, limits, base_seed)
        self.flip_step = flip_step
        self.flipped: tuple[str, int] | None = None
        self.log = log if log is not None else []

    def execute_model(self, sched):
        self.log.append(f"enqueue {sched.step_id}")
        done = super().execute_model(sched)
        out = done.get()
        if sched.step_id == self.flip_step:
            i = next(i for i, toks in enumerate(out.sampled_token_ids) if len(toks) == 1)
            rid, tok = out.req_ids[i], out.sampled_token_ids[i][0]
            new = (tok + 1) % self.limits.vocab_size
            self.requests[rid].tokens[-1] = new
            sampled = list(out.sampled_token_ids)
            sampled[i] = (new,)
            out = type(out)(out.step_id, out.req_ids, tuple(sampled), out.logprobs, out.prompt_logprobs, out.nan_flags, out.seeds)
            self.flipped = (rid, sched.step_id)
        log = self.log

        class Later:
            def get(self_inner):
                log.append(f"get {sched.step_id}")
                return out

        return Later()


def churn(limits, seed: int = 0) -> Churn:
    # Greedy-free, logprob-free churn keeps tokens seed-dependent and the steps cheap.
    return Churn(limits, seed, ChurnConfig(greedy_prob=0.0, logprobs_prob=0.0, prompt_logprobs_prob=0.0, abort_prob=0.0, preempt_prob=0.0))


def test_one_step_ahead_order_and_agreement(micro) -> None:
    weights, limits = micro
    log: list[str] = []
    oracle = SimpleOracle(weights, limits, 0)
    oracle.log = log
    runner = FlipRunner(weights, limits, 0, log=log)
    result = DifferentialRun(runner, oracle, SchedulerSim(limits, seed=0), before_tick=churn(limits), tie_tolerance=TOL).run(12)
    assert result.ok and result.steps > 5 and result.tokens_compared > 5
    # step N+1 is enqueued before step N's output is read, and the oracle runs step N after that read
    assert log.index("enqueue 1") < log.index("get 0") < log.index("oracle 0") < log.index("get 1")


def test_planted_flip_is_a_divergence_and_the_run_stops(micro) -> None:
    weights, limits = micro
    runner = FlipRunner(weights, limits, 0, flip_step=6)
    result = DifferentialRun(runner, SimpleOracle(weights, limits, 0), SchedulerSim(limits, seed=0), before_tick=churn(limits), tie_tolerance=TOL).run(30)
    rid, step = runner.flipped
    first = result.first_divergence
    assert first is not None and (first.kind, first.req_id, first.step) == ("token", rid, step)
    assert result.steps == step + 1  # stopped at the divergent step
    assert result.first_divergence_line().startswith(f"step {step}: request {rid!r} position ")


def test_tie_is_adopted_by_the_oracle_before_its_next_step(micro) -> None:
    weights, limits = micro
    runner = FlipRunner(weights, limits, 0, flip_step=6)
    oracle = SimpleOracle(weights, limits, 0, ties_at={6})
    result = DifferentialRun(runner, oracle, SchedulerSim(limits, seed=0), before_tick=churn(limits), tie_tolerance=TOL).run(30)
    rid, step = runner.flipped
    assert result.ok, result.first_divergence_line()
    assert [(t.req_id, t.step) for t in result.ties] == [(rid, step)]
    assert f"adopt {rid}" in oracle.log
    assert result.steps > step + 5  # later steps, built on the adopted token, agree


def test_runner_exception_is_recorded_as_a_divergence(micro) -> None:
    weights, limits = micro

    class Crashing(SimpleRunner):
        def execute_model(self, sched):
            if sched.step_id == 3:
                raise RuntimeError("kernel launch failed")
            return super().execute_model(sched)

    result = DifferentialRun(Crashing(weights, limits, 0), SimpleOracle(weights, limits, 0), SchedulerSim(limits, seed=0),
                             before_tick=churn(limits), tie_tolerance=TOL).run(10)
    first = result.first_divergence
    assert (first.kind, first.step, first.got) == ("runner-error", 3, "RuntimeError")
    assert "kernel launch failed" in result.runner_traceback


def test_a_memory_fault_of_an_earlier_run_is_not_this_runs(micro, monkeypatch) -> None:
    """A fault left unclaimed by an earlier run in the process (a test that planted one without a run) must not
    turn this run's plain runner error into a kernel-memory divergence."""
    import runnercheck.impl.kernels.interpreted_memory as memory

    stale = memory.KernelMemoryError("earlier_kernel", "load", 0, 4, 1, 1, None)
    monkeypatch.setattr(memory, "_UNCLAIMED", [stale])
    test_runner_exception_is_recorded_as_a_divergence(micro)
    assert memory.claim_fault() is None


def test_runner_spec_resolution() -> None:
    assert load_runner_factory("runnercheck.stress.run.runners:simple_runner") is simple_runner
    for bad in ("runnercheck.stress.run.runners", "no_such_mod:f", "runnercheck.stress.run.runners:nope", ":x"):
        with pytest.raises(RunSetupError):
            load_runner_factory(bad)


# --------------------------------------------------------------------------- against the oracle


def oracle_for(weights, limits, seed: int):
    return pytest.importorskip("runnercheck.reference.runner").ReferenceRunner(weights, limits, base_seed=seed)


def full_churn(limits, seed: int) -> Churn:
    return Churn(limits, seed, ChurnConfig(logprobs_prob=0.5, prompt_logprobs_prob=0.3, preempt_prob=0.15, abort_prob=0.08))


def test_reference_as_runner_matches_the_oracle_exactly(micro) -> None:
    weights, limits = micro
    runner = reference_runner(weights, limits, Device("cpu"), 5)
    sim = SchedulerSim(limits, seed=5, max_inflight_steps=1, draft_prob=0.3)
    result = DifferentialRun(runner, oracle_for(weights, limits, 5), sim, before_tick=full_churn(limits, 5)).run(40)
    assert result.ok and not result.ties, result.first_divergence_line()
    assert result.tokens_compared > 40 and result.logprobs_compared > 10


@pytest.mark.parametrize("seed,draft_prob,ahead", [(1, 0.0, 1), (2, 0.4, 1), (3, 0.2, 0)])
def test_simple_fp32_runner_passes_the_differential_run(micro, seed: int, draft_prob: float, ahead: int) -> None:
    weights, limits = micro
    runner = simple_runner(weights, limits, Device("cpu"), seed)
    sim = SchedulerSim(limits, seed=seed, max_inflight_steps=ahead, draft_prob=draft_prob)
    result = DifferentialRun(runner, oracle_for(weights, limits, seed), sim, before_tick=full_churn(limits, seed)).run(60)
    assert result.ok, result.first_divergence_line()
    assert result.tokens_compared > 60 and result.logprobs_compared > 20
    assert sim.stats.resumed > 0 and sim.stats.finished > 5


def test_planted_noise_position_bug_is_caught_against_the_oracle(micro, monkeypatch) -> None:
    weights, limits = micro
    real = runners_mod.sample_row

    def off_by_one(raw, params, seed, position, prompt, outputs):
        return real(raw, params, seed, position + 1, prompt, outputs)

    monkeypatch.setattr(runners_mod, "sample_row", off_by_one)
    runner = simple_runner(weights, limits, Device("cpu"), 4)
    sim = SchedulerSim(limits, seed=4)
    result = DifferentialRun(runner, oracle_for(weights, limits, 4), sim, before_tick=churn(limits, 4)).run(40)
    assert result.first_divergence is not None and result.first_divergence.kind == "token"
    assert result.steps < 40
