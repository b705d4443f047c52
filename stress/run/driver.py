"""The differential driver: a runner and the oracle fed the same scheduler stream, one step ahead.

Order within one tick (async scheduling, as a serving engine runs):

1. ``before_tick(tick, scheduler)`` applies outside operations (churn: add / abort / preempt);
2. if the scheduler has anything to do, step N+1 is scheduled, checked against the runner-side
   boundary mirror, and enqueued on the runner -- *before* step N's output is read;
3. the oldest in-flight step N is delivered once more than ``max_inflight_steps`` steps are out
   (or whenever the scheduler is blocked waiting for outputs): the runner's output N is read, the
   oracle computes step N (it lags the runner, so a tie adopted with
   ``oracle.replace_output_token`` lands before the oracle computes step N+1), the two are
   compared (`runnercheck.checks.compare`), ties are adopted, and the runner's output goes to the scheduler.

The run stops at the first step with a divergence (outputs still in flight are drained, not
compared).  An exception raised by the runner is recorded as a divergence of kind
``runner-error`` (``kernel-memory`` when it is a kernel's out-of-bounds access: `runner_error`), and an output that breaks the runner-output contract
(`runnercheck.checks.compare.check_output_contract`: ids, row counts, token ranges) as one of kind
``output-contract``, so that stress runs write a repro for those too; exceptions from the
scheduler, the mirror or the oracle are harness bugs and propagate.
"""
from __future__ import annotations

import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from runnercheck.checks.compare import (
    DEFAULT_LOGPROB_ATOL,
    Divergence,
    StepComparison,
    Tie,
    check_output_contract,
    compare_step,
    first_output_positions,
)
from runnercheck.checks.detectors.memory import DIVERGENCE_KIND as MEMORY_DIVERGENCE
from runnercheck.checks.detectors.memory import memory_fault
from runnercheck.impl.kernels.interpreted_memory import claim_fault
from runnercheck.impl.interface import AsyncOutput, ModelRunnerOutput, Runner, SchedulerOutput
from runnercheck.stress.run.runners import RunnerBoundaryMirror
from runnercheck.stress.sim.scheduler import SchedulerSim, SchedulerSimError, SchedulerStats


class Oracle(Protocol):
    """What the driver needs from `runnercheck.reference.runner.ReferenceRunner`."""

    last_results: dict

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput: ...

    def replace_output_token(self, req_id: str, index_from_end: int, token: int) -> None: ...


@dataclass(frozen=True)
class StepReport:
    """One delivered step, for ``on_step`` observers (progress bars, logs)."""

    tick: int
    sched: SchedulerOutput
    got: ModelRunnerOutput | None
    expected: ModelRunnerOutput | None
    comparison: StepComparison


@dataclass
class RunResult:
    ticks: int = 0
    steps: int = 0  # steps compared
    requests: int = 0  # requests added to the scheduler
    finished: int = 0
    tokens_compared: int = 0
    logprobs_compared: int = 0
    ties: list[Tie] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    scheduler_stats: SchedulerStats | None = None
    spec_stats: dict | None = None  # `runnercheck.stress.sim.spec_scheduler.SpecStats.to_dict()` when the n-gram proposer ran
    runner_traceback: str | None = None
    outputs_read_early: int = 0  # outputs read while their step's device work was still queued (sim)
    invariant_checks: int = 0  # `SchedulerSim.check_invariants` calls that passed or failed (one or two per tick)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.divergences

    @property
    def first_divergence(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def first_divergence_line(self) -> str | None:
        return self.divergences[0].line() if self.divergences else None


@dataclass
class _InFlight:
    tick: int
    sched: SchedulerOutput
    output: AsyncOutput | None
    error: BaseException | None = None
    error_trace: str | None = None
    pending: Callable[[], bool] | None = None  # whether the step's device work is still queued (``output_probe``)


class DifferentialRun:
    """Drive ``runner`` and ``oracle`` with ``scheduler``'s steps; see the module docstring.

    Owns the in-flight step queue and the runner-side boundary mirror (host state, one run).
    """

    def __init__(
        self,
        runner: Runner,
        oracle: Oracle,
        scheduler: SchedulerSim,
        *,
        on_step: Callable[[StepReport], None] | None = None,
        before_tick: Callable[[int, SchedulerSim], None] | None = None,
        before_enqueue: Callable[[SchedulerOutput], None] | None = None,
        rewrite: Callable[[SchedulerOutput], SchedulerOutput] | None = None,
        tie_tolerance: float | None = None,
        logprob_atol: float = DEFAULT_LOGPROB_ATOL,
        output_probe: Callable[[], Callable[[], bool]] | None = None,
    ):
        self.runner = runner
        self.oracle = oracle
        self.scheduler = scheduler
        self.on_step = on_step
        self.before_tick = before_tick
        self.before_enqueue = before_enqueue
        self.rewrite = rewrite  # e.g. `runnercheck.stress.sim.drafts.OracleDrafts`: same shape, other draft values
        self.tie_tolerance = tie_tolerance
        self.logprob_atol = logprob_atol
        # Called right after a step is enqueued; what it returns says, when the output is read, whether the
        # step's device work had still not run: an output read before its event (a coverage feature).
        self.output_probe = output_probe
        self.mirror = RunnerBoundaryMirror(scheduler.limits)
        self.inflight: deque[_InFlight] = deque()

    def run(self, ticks: int) -> RunResult:
        """Run ``ticks`` scheduler ticks (at most one step each), then deliver what is in flight."""
        result = RunResult()
        started = time.perf_counter()
        claim_fault()  # a memory fault raised before this run (an earlier run in this process) is not this run's
        sched_sim = self.scheduler
        stopped = False
        for tick in range(ticks):
            result.ticks = tick + 1
            if self.before_tick is not None:
                self.before_tick(tick, sched_sim)
            if sched_sim.can_schedule:
                self.enqueue(tick, sched_sim.schedule())
            if not self.check_scheduler(result, "after scheduling"):
                stopped = True
                break
            while self.inflight and (
                len(self.inflight) > sched_sim.config.max_inflight_steps or not sched_sim.can_schedule
            ):
                if not self.deliver(result):
                    stopped = True
                    break
            if stopped:
                break
        while self.inflight and not stopped:
            stopped = not self.deliver(result)
        self.drain_uncompared()
        result.requests = len(sched_sim.request_ids)
        result.finished = len(sched_sim.finished)
        result.scheduler_stats = sched_sim.stats
        if getattr(sched_sim.config, "ngram_spec_tokens", 0):
            result.spec_stats = sched_sim.spec_stats.to_dict()
        result.elapsed_s = time.perf_counter() - started
        return result

    # ---------------------------------------------------------------- steps (also driven rule by rule by stress/run/machine.py)
    def enqueue(self, tick: int, sched: SchedulerOutput) -> None:
        """Check ``sched`` at the runner's boundary and submit it; the step joins ``inflight``."""
        if self.rewrite is not None:
            sched = self.rewrite(sched)
        self.mirror.check(sched)
        item = _InFlight(tick, sched, None)
        try:
            if self.before_enqueue is not None:
                self.before_enqueue(sched)
            item.output = self.runner.execute_model(sched)
            if self.output_probe is not None:
                item.pending = self.output_probe()
        except Exception as e:  # the runner under test crashed: a finding, not a harness failure
            item.error, item.error_trace = e, traceback.format_exc()
        self.inflight.append(item)

    def deliver(self, result: RunResult) -> bool:
        """Compare the oldest in-flight step; False when the run must stop."""
        item = self.inflight.popleft()
        sched = item.sched
        got = None
        if item.error is None:
            if item.pending is not None and item.pending():
                result.outputs_read_early += 1
            try:
                got = item.output.get()
            except Exception as e:
                item.error, item.error_trace = e, traceback.format_exc()
        if item.error is not None:
            cmp = StepComparison(step=sched.step_id)
            cmp.divergences.append(runner_error(sched.step_id, item.error, "an output"))
            result.divergences = cmp.divergences
            result.runner_traceback = item.error_trace
            self._notify(item, None, None, cmp)
            return False
        contract = check_output_contract(got, sched, self.scheduler.limits.vocab_size)
        if contract:
            return self._stop(result, item, got, None, contract)
        expected = self.oracle.execute_model(sched)
        try:
            cmp = compare_step(
                got,
                expected,
                self.oracle.last_results,
                positions=first_output_positions(sched),
                tie_tolerance=self.tie_tolerance,
                logprob_atol=self.logprob_atol,
            )
        except Exception as e:  # a malformed entry the contract check does not look into (e.g. a logprob's fields)
            detail = f"comparing it raised {type(e).__name__}: {e}"
            return self._stop(result, item, got, expected, [
                Divergence(sched.step_id, None, None, "output-contract", "a well-formed output", type(e).__name__, detail)])
        result.steps += 1
        result.tokens_compared += cmp.tokens_compared
        result.logprobs_compared += cmp.logprobs_compared
        result.ties.extend(cmp.ties)
        if cmp.divergences:
            result.divergences = cmp.divergences
            self._notify(item, got, expected, cmp)
            return False
        for tie in cmp.ties:
            self.oracle.replace_output_token(tie.req_id, 0, tie.got)
        self.mirror.observe(got)
        self.scheduler.update(got)
        self._notify(item, got, expected, cmp)
        return self.check_scheduler(result, f"after step {sched.step_id}'s output")

    def check_scheduler(self, result: RunResult, when: str) -> bool:
        """`SchedulerSim.check_invariants` (block pool, request records) at every step; False when it fails.

        A broken invariant is a divergence of kind ``scheduler-invariant``, so the run writes a repro:
        block-pool corruption is caught where it happens, not only through its effect on the KV cache."""
        result.invariant_checks += 1
        try:
            self.scheduler.check_invariants()
        except SchedulerSimError as e:
            result.divergences = [Divergence(result.steps, None, None, "scheduler-invariant", "consistent scheduler state",
                                             "broken", f"{when}: {e}")]
            return False
        return True

    def _stop(self, result: RunResult, item: _InFlight, got, expected, divergences: list[Divergence]) -> bool:
        cmp = StepComparison(step=item.sched.step_id, divergences=divergences)
        result.divergences = divergences
        self._notify(item, got, expected, cmp)
        return False

    def _notify(self, item: _InFlight, got, expected, cmp: StepComparison) -> None:
        if self.on_step is not None:
            self.on_step(StepReport(item.tick, item.sched, got, expected, cmp))

    def drain_uncompared(self) -> None:
        """Wait for steps left in flight after a stop, so the device is idle when the run returns."""
        while self.inflight:
            item = self.inflight.popleft()
            if item.error is None:
                try:
                    item.output.get()
                except Exception:
                    pass  # the run already stopped on an earlier finding


def runner_error(step: int, error: BaseException, expected: object, when: str = "") -> Divergence:
    """The divergence of an exception from the runner: kind ``kernel-memory`` when it is a kernel's out-of-bounds
    access (`runnercheck.checks.detectors.memory.memory_fault`: interpreted, or a sticky CUDA fault), or follows one
    raised in the runner since the last claim (`claim_fault`: the error is its consequence), else ``runner-error``."""
    fault = memory_fault(error)
    detail = f"{when}: {error}" if when else str(error)
    raised = claim_fault()
    if fault is None and raised is not None:  # the runner failed on a faulted launch's consequence (or caught it)
        fault = type(raised).__name__
        detail = f"{raised} (the runner then raised {type(error).__name__}: {detail})"
    if fault is not None:
        return Divergence(step, None, None, MEMORY_DIVERGENCE, "in-bounds kernel memory accesses", fault, detail)
    return Divergence(step, None, None, "runner-error", expected, type(error).__name__, detail)


def summarize_ties(ties: Sequence[Tie], limit: int = 5) -> list[str]:
    """The first ``limit`` tie lines, plus a count of the rest."""
    lines = [t.line() for t in ties[:limit]]
    if len(ties) > limit:
        lines.append(f"... and {len(ties) - limit} more ties")
    return lines
