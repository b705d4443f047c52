"""The run owner: build a session from a `RunConfig`, arm the detectors, drive the differential
run, and return one typed `Findings` -- the only loop behind `verify`, `stress`, `replay`,
`mutants` (and, rule by rule, the Hypothesis machine, which uses `build_session`'s parts and the
detector registry).

* `build_session`: weights, `Device` (with its lag policy), the runner through its factory
  (``cuda_graphs`` passed to factories that accept it), an optional mutant, the oracle and the
  scheduler simulator.  Every setup problem is a `RunSetupError`.  With ``config.csan`` (cuda) the
  session also holds a `runnercheck.checks.detectors.csan.CsanMonitor`, armed *before* the runner
  is built (CSAN must see the init-time writes the first steps read) and before a device mutant is
  installed.
* `arm_detectors`: every detector of the registry (`runnercheck.checks.detectors.registry`),
  armed on the runner after any mutant, with the session's scheduler and CSAN monitor in the arm
  context.  Each detector's result lands in `Findings.detectors` under its name; any violation
  fails the run, and a detector that fires stops a ``stop_on_sync`` run at the next tick.
* `checked_run(config, ops)`: the differential run with ``ops`` (`ChurnOps` or `TraceOps`) as
  the operation source, in this process; `runnercheck.stress.run.isolation.isolated_runs` runs it in child
  processes (a crash becomes a finding with a repro).

Ownership: a `Session` owns one run's device, runner, oracle and scheduler (and the CSAN monitor);
the `ArmedDetectors` own what they patched on the runner until disarmed; `Findings` is plain host
data (picklable: it crosses the process boundary).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from runnercheck.checks.detectors.base import ArmContext, DetectorResult
from runnercheck.checks.detectors.registry import ArmedDetectors
from runnercheck.checks.loader import LoaderError, accepts_keyword, load_callable
from runnercheck.impl.interface import runner_logprobs_modes
from runnercheck.stress.sim.churn import Churn, ChurnConfig, TraceReplay
from runnercheck.stress.run.coverage import CoverageCounter
from runnercheck.stress.run.driver import DifferentialRun, RunResult, StepReport
from runnercheck.stress.run.repro import Repro
from runnercheck.stress.run.config import RunConfig, RunSetupError, check_model_size, delay_policy_from_dict
from runnercheck.stress.sim.scheduler import SchedulerSim

_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- session


@dataclass
class Session:
    device: Any
    runner: Any
    oracle: Any
    scheduler: SchedulerSim
    fault: Any = None  # the installed `runnercheck.stress.sim.faults.LogitsFault`, if the config asks for one and the runner takes it
    csan: Any = None  # the armed `runnercheck.checks.detectors.csan.CsanMonitor` of a ``config.csan`` run (disarmed by `checked_run`)


def load_runner_factory(spec: str) -> Callable:
    """The ``package.module:factory`` runner factory; `RunSetupError` when it cannot be loaded."""
    try:
        return load_callable(spec, "runner")
    except LoaderError as e:
        raise RunSetupError(str(e)) from None


def build_session(config: RunConfig) -> Session:
    """Weights, device, runner (+ mutant), oracle and scheduler for ``config`` (and the CSAN monitor)."""
    from runnercheck.impl.device import Device, DeviceError

    check_model_size(config.model_config, config.limits)
    from runnercheck.impl.lag_policies import LagPolicyError
    from runnercheck.stress.sim.lag_mix import lag_policy_for

    try:
        device = Device(config.device, seed=config.seed,
                        lag_policy=lag_policy_for(config.lag_policy or "random-drain", config.seed))
    except (DeviceError, LagPolicyError) as e:
        raise RunSetupError(str(e)) from None
    monitor = arm_csan() if config.csan else None
    try:
        session = _build_on(device, config)
    except BaseException:
        if monitor is not None:
            monitor.disarm()
        raise
    session.csan = monitor
    return session


def arm_csan() -> Any:
    """An armed `runnercheck.checks.detectors.csan.CsanMonitor`; `RunSetupError` when this torch or machine has no CSAN."""
    from runnercheck.checks.detectors.csan import CsanMonitor, CsanUnavailableError

    try:
        return CsanMonitor().arm()
    except CsanUnavailableError as e:
        raise RunSetupError(str(e)) from None


def _build_on(device: Any, config: RunConfig) -> Session:
    from runnercheck.impl.model.weights import random_weights

    if config.mutant is not None and _mutant_target(config.mutant) == "device":
        apply_mutant(config.mutant, device=device)  # before the runner allocates through the device
    factory = load_runner_factory(config.runner)
    weights = random_weights(config.model_config, seed=config.seed)
    kwargs = {"cuda_graphs": config.cuda_graphs} if accepts_keyword(factory, "cuda_graphs") else {}
    try:
        proposer = ngram_config(config)
    except ValueError as e:  # a draft preset that does not exist or fit the model: a setup problem
        raise RunSetupError(f"proposer: {e}") from None
    if proposer is not None:
        if not accepts_keyword(factory, "speculative"):
            raise RunSetupError(f"runner factory {config.runner!r} takes no 'speculative' keyword: it cannot run a proposer")
        kwargs["speculative"] = proposer
    try:
        runner = factory(weights, config.limits, device, config.seed, **kwargs)
    except Exception as e:  # a runner that cannot be built for this config is a setup problem
        raise RunSetupError(f"runner factory {config.runner!r} failed: {type(e).__name__}: {e}") from None
    scheduler = SchedulerSim(config.limits, seed=config.seed, max_inflight_steps=config.scheduler.max_inflight_steps,
                             draft_prob=config.scheduler.draft_prob, prefix_caching=config.scheduler.prefix_caching,
                             ngram_spec_tokens=config.scheduler.ngram_spec_tokens, draft_model=config.scheduler.draft_model)
    if config.mutant is not None and _mutant_target(config.mutant) != "device":
        apply_mutant(config.mutant, runner, scheduler)
    from runnercheck.reference.runner import ReferenceRunner, ReferenceRunnerError

    try:
        oracle = ReferenceRunner(weights, config.limits, base_seed=config.seed, proposer=proposer)
    except ReferenceRunnerError as e:
        raise RunSetupError(f"oracle: {e}") from None
    fault = None
    if config.logits_fault is not None:
        from runnercheck.stress.sim.faults import FaultSpecError, LogitsFault

        try:
            fault = LogitsFault.from_dict(config.logits_fault)
        except FaultSpecError as e:
            raise RunSetupError(str(e)) from None
        if not fault.install(runner, oracle):
            _log.info("runner %s has no sampler to hook: logits faults not planted", config.runner)
            fault = None
    return Session(device, runner, oracle, scheduler, fault)


def ngram_config(config: RunConfig) -> Any:
    """The proposer config the runner and the oracle run with (None: the proposer is off).

    `runnercheck.impl.interface.NgramConfig`, or with ``scheduler.draft_model`` a `DraftModelConfig` of that
    preset whose weights come from the run's seed (the target's preset as its own draft drafts
    with the target's weights: near-full acceptance).  A preset that does not fit raises ValueError."""
    from runnercheck.impl.interface import DraftModelConfig, NgramConfig
    from runnercheck.impl.model.weights import preset

    k = config.scheduler.ngram_spec_tokens
    if k and config.scheduler.draft_model:
        draft = preset(config.scheduler.draft_model)
        if draft.vocab_size != config.model_config.vocab_size:
            raise ValueError(f"draft model {config.scheduler.draft_model!r} has vocabulary {draft.vocab_size}, "
                             f"the model {config.model_config.vocab_size}")
        return DraftModelConfig(config.scheduler.draft_model, k, weights_seed=config.seed)
    return NgramConfig(num_spec_tokens=k) if k else None


def _mutant_target(name: str) -> str:
    from runnercheck.stress.mutants import catalogue as mutants

    try:
        return mutants.get(name).target
    except LookupError as e:
        raise RunSetupError(f"mutant {name!r}: {e}") from None


def apply_mutant(name: str, runner: Any = None, scheduler: Any = None, *, device: Any = None) -> Any:
    """Install mutant ``name`` into ``runner`` (or, for a scheduler mutant, ``scheduler``; for a device
    mutant, ``device``; `runnercheck.stress.mutants.catalogue`); `RunSetupError` when it cannot be."""
    from runnercheck.stress.mutants import catalogue as mutants

    try:
        return mutants.apply(name, runner=runner, scheduler=scheduler, device=device)
    except (LookupError, ValueError) as e:
        raise RunSetupError(f"mutant {name!r}: {e}") from None


# --------------------------------------------------------------------------- detectors


def arm_detectors(session: Session, lifetime_mode: str = "count") -> ArmedDetectors:
    """Every registered detector (`runnercheck.checks.detectors.registry`) armed on ``session``'s
    runner, after any mutant: the scheduler (prefix cache) and the CSAN monitor travel in the context."""
    return ArmedDetectors(session.runner, ArmContext(lifetime_mode=lifetime_mode, scheduler=session.scheduler,
                                                     csan=session.csan))


# --------------------------------------------------------------------------- operation sources


@dataclass(frozen=True)
class ChurnOps:
    """Seeded random churn (`runnercheck.stress.sim.churn.Churn`); ``workload`` names a mutant workload's params."""

    churn: ChurnConfig = field(default_factory=ChurnConfig)
    workload: str | None = None


@dataclass(frozen=True)
class TraceOps:
    """A recorded operation trace (`runnercheck.stress.sim.churn.TraceReplay`)."""

    trace: list


def make_ops(source: ChurnOps | TraceOps, config: RunConfig, runner: Any = None) -> Any:
    """The ``before_tick`` callable for ``source``; its ``trace`` lists the operations applied per tick.  Random
    churn asks ``runner`` for processed logprobs only where it declares them
    (`runnercheck.impl.interface.runner_logprobs_modes`)."""
    if isinstance(source, TraceOps):
        return TraceReplay(source.trace)
    if runner is not None and "processed" not in runner_logprobs_modes(runner):
        source = replace(source, churn=replace(source.churn, processed_logprobs_prob=0.0))
    if source.workload is None:
        return Churn(config.limits, config.seed, source.churn)
    from runnercheck.stress.mutants.workloads import WORKLOADS

    params = WORKLOADS[source.workload].params

    class WorkloadChurn(Churn):
        def _params(self, max_tokens: int):  # noqa: ANN202 - Churn's hook
            return super()._params(max_tokens) if params is None else params(self.rng, max_tokens)

    return WorkloadChurn(config.limits, seed=config.seed, config=source.churn)


# --------------------------------------------------------------------------- findings


@dataclass
class Findings:
    """What one checked run found; renderers (terminal, JSON, Markdown, JUnit) read only this."""

    name: str
    config: RunConfig
    result: RunResult
    trace: list
    detectors: dict[str, DetectorResult] = field(default_factory=dict)  # by detector name, in registry order
    cuda_graphs: dict | None = None  # the runner's `cuda_graph_stats()` (replays, fallbacks by reason), if it has them
    coverage: dict[str, int] = field(default_factory=dict)
    crash: str | None = None  # "killed by signal SIGSEGV" when the isolated run died
    last_completed_step: int | None = None
    stopped_on_sync: bool = False
    elapsed_s: float = 0.0

    @property
    def diverged(self) -> bool:
        return not self.result.ok

    @property
    def passed(self) -> bool:
        return self.result.ok and all(r.clean for r in self.detectors.values())

    def violations(self, detector: str) -> int:
        """Findings of detector ``detector`` in this run (0 when it was not armed)."""
        found = self.detectors.get(detector)
        return found.violations if found is not None else 0

    def first_divergence_line(self) -> str | None:
        return self.result.first_divergence_line()

    def repro(self) -> Repro:
        """The repro file of this run: its configuration, the trace it applied, its first divergence."""
        from runnercheck.checks.provenance import device_name, provenance

        steps = min(self.result.ticks, len(self.trace))
        return Repro(replace(self.config, steps=steps), [list(ops) for ops in self.trace[:steps]], self.first_divergence_line(),
                     provenance(device_name(self.config.device)))


# --------------------------------------------------------------------------- the checked run


class _StopRun(Exception):
    """Raised from ``before_tick`` once the sync detector fired and the caller asked to stop there."""


def _device_fault(result: RunResult, error: Exception, when: str) -> Any:
    """The runner-error (or kernel-memory) divergence of device work that failed after the last compared step."""
    from runnercheck.stress.run.driver import runner_error

    return runner_error(result.steps, error, None, when)


def targeted_delay_hits(device: Any, delay_policy: Any) -> dict[str, int]:
    """``{"targeted delay: <target>": readers delayed}`` for each target of the run's targeted lag
    (sim ``hold-at-target``) or delay (cuda ``targeted-delay``) policy; empty for other runs.  As
    coverage features, a target never reached fails the campaign's coverage gate."""
    if device.kind == "sim":
        source = getattr(device, "policy", None)
        counts = getattr(source, "holds", None)
    else:
        source = delay_policy
        counts = getattr(source, "delays", None)
    if counts is None:
        return {}
    return {f"targeted delay: {t}": int(counts.get(t, 0)) for t in source.targets}


def _output_probe(device: Any) -> Callable[[], Callable[[], bool]] | None:
    """On sim: a mark taken after a step's enqueue, saying at the output read whether that step's last queued
    work has run (the sim device's sequence numbers; host bookkeeping, no device work)."""
    if device.kind != "sim":
        return None

    def mark() -> Callable[[], bool]:
        last = device._queue[-1].seq if device._queue else device._done_seq
        return lambda: device._done_seq < last

    return mark


def checked_run(config: RunConfig, source: ChurnOps | TraceOps, *, name: str = "", lifetime_mode: str = "count",
                stop_on_sync: bool = False, on_tick: Callable[[int], None] | None = None,
                on_step: Callable[[StepReport], None] | None = None,
                on_tick_ops: Callable[[int, list], None] | None = None,
                on_delivered: Callable[[int], None] | None = None,
                on_enqueue: Callable[[int], None] | None = None) -> Findings:
    """Run ``config`` fed by ``source`` in this process with every detector armed (module docstring).

    Observers: ``on_tick(tick)`` as each tick starts, ``on_step`` for each delivered step,
    ``on_tick_ops(tick, ops)`` after a tick's operations were applied, ``on_delivered(step_id)``
    after a step agreed, ``on_enqueue(step_id)`` before a step is enqueued (`runnercheck.stress.run.isolation`
    streams the last three to the parent process).
    """
    started = time.perf_counter()
    session = build_session(config)
    try:
        return _checked_session_run(session, config, source, name=name, lifetime_mode=lifetime_mode,
                                    stop_on_sync=stop_on_sync, on_tick=on_tick, on_step=on_step, on_tick_ops=on_tick_ops,
                                    on_delivered=on_delivered, on_enqueue=on_enqueue, started=started)
    finally:
        if session.csan is not None:
            session.csan.disarm()


def _checked_session_run(session: Session, config: RunConfig, source: ChurnOps | TraceOps, *, name: str,
                         lifetime_mode: str, stop_on_sync: bool, on_tick: Callable[[int], None] | None,
                         on_step: Callable[[StepReport], None] | None, on_tick_ops: Callable[[int, list], None] | None,
                         on_delivered: Callable[[int], None] | None, on_enqueue: Callable[[int], None] | None,
                         started: float) -> Findings:
    detectors = arm_detectors(session, lifetime_mode)
    ops = make_ops(source, config, session.runner)
    state = getattr(session.runner, "state", None)
    rows_observable = state is not None and isinstance(getattr(state, "req_to_row", None), dict)
    coverage = CoverageCounter(config.limits, session.fault, rows_observable=rows_observable)
    from runnercheck.stress.run.staged_writes import StagedWriteObserver

    staged = StagedWriteObserver(session.runner)
    delay_policy = delay_policy_from_dict(config.delay_policy) if config.delay_policy else None
    delay = delay_policy.hook(session.device) if delay_policy is not None else None

    def before_enqueue(sched: Any) -> None:
        if on_enqueue is not None:
            on_enqueue(sched.step_id)
        if delay is not None:
            delay(sched)

    stopped = False
    last_step: list[int] = []

    def before_tick(tick: int, scheduler: SchedulerSim) -> None:
        if stop_on_sync and detectors.fired():
            raise _StopRun
        if on_tick is not None:
            on_tick(tick)
        ops(tick, scheduler)
        if on_tick_ops is not None:
            on_tick_ops(tick, list(ops.trace[tick]) if tick < len(ops.trace) else [])

    def observe(report: StepReport) -> None:
        coverage.observe(report)
        if rows_observable:
            coverage.observe_rows(state.req_to_row)
        if report.comparison.ok and report.got is not None:
            last_step[:] = [report.sched.step_id]
            if on_delivered is not None:
                on_delivered(report.sched.step_id)
        if on_step is not None:
            on_step(report)

    rewrite = None
    if config.draft_source == "oracle":
        from runnercheck.stress.sim.drafts import OracleDrafts

        rewrite = OracleDrafts(session.oracle, config.seed, config.limits.vocab_size)
    driver = DifferentialRun(session.runner, session.oracle, session.scheduler, on_step=observe,
                             before_tick=before_tick, before_enqueue=before_enqueue, rewrite=rewrite,
                             output_probe=_output_probe(session.device))
    result = RunResult()
    try:
        result = driver.run(config.steps)
    except _StopRun:
        stopped = True
        driver.drain_uncompared()
        result.ticks = len(ops.trace)
    finally:
        detectors.disarm()
        try:  # drain what the run left queued (sim runs it now) before the provenance record is read
            session.device.synchronize()
        except Exception as e:
            if result.ok and not stopped:  # device work failed after the last compared step: a runner error
                result.divergences.append(_device_fault(result, e, "draining the device work queued by the run"))
            # else the run already failed; its device fault is reported or moot
    results, unread = detectors.results()  # reads device memory back (cuda: a sync)
    if unread and result.ok and not stopped:
        # The device died (a CUDA device-side assert is sticky): a record cannot be read back.  A run
        # that already failed keeps its finding; otherwise this is the finding.
        unread_name, error = next(iter(unread.items()))
        result.divergences.append(_device_fault(result, error, f"reading the {unread_name} detector's record back"))
    stats = getattr(session.runner, "cuda_graph_stats", None)
    if staged.active:
        coverage.add(staged.totals())
    coverage.add(targeted_delay_hits(session.device, delay_policy))
    coverage.add({"scheduler invariants checked every step": result.invariant_checks})
    if config.scheduler.draft_model:  # the device drafts of this run are the draft model's
        coverage.add({"draft-model drafts verified": coverage.counts.get("device drafts (n-gram)", 0)})
    if session.device.kind == "sim":
        coverage.add({"output read before its event": result.outputs_read_early})
    return Findings(
        name=name, config=config, result=result, trace=[list(t) for t in ops.trace[: max(result.ticks, 0)]],
        detectors=results,
        cuda_graphs=stats() if callable(stats) else None, coverage=coverage.totals(), last_completed_step=last_step[0] if last_step else None,
        stopped_on_sync=stopped, elapsed_s=time.perf_counter() - started,
    )


__all__ = ["Session", "Findings", "ChurnOps", "TraceOps", "RunSetupError", "build_session", "checked_run",
           "make_ops",
           "apply_mutant", "arm_detectors", "load_runner_factory"]
