"""A user's sampler in a child process: a segfault, an abort or a hang is a failed case, not a dead run.

`run_units_isolated` runs a chi-square run's units (its matrix cases and the calibration, the
parts that call the sampler) in one child process (`runnercheck.checks.child`: forked on cpu,
spawned on cuda), which streams back each unit's start, its progress and its `CaseOutcome`.  When
the child dies without reporting (a signal) or a unit runs past ``Isolation.timeout_s`` (its
process group is killed), the unit in progress becomes one failed result of kind ``crash`` or
``timeout`` naming the signal or the timeout and a command line that reruns just that unit, and
a fresh child goes on with the units after it.

One child per run rather than per case: a spawn on cuda costs seconds (a new interpreter, torch
and a CUDA context), and streaming the unit in progress gives the same per-case repro.  Only
third-party samplers are isolated (`runnercheck chisq` decides, `runnercheck.checks.chisq.samplers.is_builtin_sampler`):
our own samplers run in the process, as the planted-bias samplers of the power report always do.
"""
from __future__ import annotations

import math
import shlex
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch

from runnercheck.checks.chisq.case import SamplingCase
from runnercheck.checks.chisq.cases import calibration_case
from runnercheck.checks.child import DEFAULT_TIMEOUT_S, ChildGone, ChildTimeout, describe_timeout, start_child
from runnercheck.checks.chisq.sampler_contract import rows_per_call_bound
from runnercheck.checks.chisq.stats import CalibrationResult, TestResult


# The calibration as a unit of a run, beside the matrix cases.
CALIBRATION = "calibration"
# ``run_unit(sampler, unit, opts, device, tick, max_rows) -> CaseOutcome``: `runnercheck.checks.chisq.execute.run_unit`.
UnitRunner = Callable[..., "CaseOutcome"]


@dataclass
class CaseOutcome:
    """What one unit of a run (a matrix case, or the calibration) came to, before correction: its
    statistical tests, its failures outside the family (a contract violation, a crash, a timeout),
    or why it was skipped.  It crosses the pipe from the child."""

    case: str
    results: list[TestResult] = field(default_factory=list)
    failures: list[TestResult] = field(default_factory=list)
    skipped: str | None = None
    calibration: CalibrationResult | None = None


class RunOptions(Protocol):
    """The options of `runnercheck.checks.chisq.plan.RunOptions` an isolated run reads (a protocol: that module
    imports this one for `Isolation`, and `runnercheck.checks.chisq.execute` hands in its `run_unit`, so this one
    imports neither back)."""

    quick: bool
    seed: int
    samples: int | None
    deep_tail: bool
    max_rows_per_call: int | None
    isolation: Isolation | None


@dataclass(frozen=True)
class Isolation:
    """How a third-party sampler runs: ``spec`` loads it again in a child (and names it in a repro
    command), ``timeout_s`` bounds each unit (a case, or the calibration); None: no bound."""

    spec: str
    timeout_s: float | None = DEFAULT_TIMEOUT_S


def _unit_name(unit: SamplingCase | str) -> str:
    return calibration_case().name if unit == CALIBRATION else unit.name  # type: ignore[union-attr]


def repro_command(opts: RunOptions, unit: SamplingCase | str, device: torch.device) -> str:
    """The `runnercheck chisq` command line that reruns just ``unit`` of this run."""
    assert opts.isolation is not None
    words = ["runnercheck", "chisq", "--sampler", opts.isolation.spec]
    words += ["--no-matrix"] if unit == CALIBRATION else ["--cases", _unit_name(unit), "--no-calibration", "--no-spec"]
    words += ["--no-power", "--seed", str(opts.seed), "--device", device.type]
    if opts.quick:
        words.append("--quick")
    if opts.deep_tail:
        words.append("--deep-tail")
    if opts.samples is not None:
        words += ["--samples", str(opts.samples)]
    if opts.max_rows_per_call is not None:
        words += ["--max-rows-per-call", str(opts.max_rows_per_call)]
    if opts.isolation.timeout_s is not None:
        words += ["--timeout", f"{opts.isolation.timeout_s:g}"]
    words += ["--out", "chisq-repro"]
    return shlex.join(words)


def died(opts: RunOptions, unit: SamplingCase | str, kind: str, how: str, device: torch.device) -> CaseOutcome:
    """``unit``'s outcome when the child ended in it: one failed ``kind`` result (crash / timeout),
    outside the correction family like a contract violation."""
    name = _unit_name(unit)
    command = repro_command(opts, unit, device)
    config = {"seed": opts.seed, "repro": command}
    if unit != CALIBRATION:
        config = {**unit.describe(), **config}  # type: ignore[union-attr]
    failure = TestResult(name=f"{name}/{kind}", kind=kind, config=config, statistic=math.nan, dof=0, p_value=0.0,
                         n_samples=0, adjusted_p_value=0.0, passed=False,
                         notes=f"sampler {how} in {name}; repro: {command}")
    return CaseOutcome(name, failures=[failure])


def _child(conn: Any, run_unit: UnitRunner, sampler: Callable | str, units: Sequence[SamplingCase | str], opts: RunOptions,
           device_type: str) -> None:
    """The units, in order: ("start", i), ("tick", label, work)..., ("outcome", CaseOutcome); then ("done",)."""
    try:
        if isinstance(sampler, str):  # spawned: load it again by its spec
            from runnercheck.checks.chisq.samplers import load_sampler

            sampler = load_sampler(sampler)
        device = torch.device(device_type)
        if device.type == "cpu":
            torch.set_num_threads(1)  # small [rows, V] ops on a shared box (`runnercheck.checks.chisq.execute.single_threaded_on_cpu`)
        max_rows = rows_per_call_bound(sampler, opts.max_rows_per_call)

        def tick(label: str, work: int) -> None:
            conn.send(("tick", label, work))

        for i, unit in enumerate(units):
            conn.send(("start", i))
            conn.send(("outcome", run_unit(sampler, unit, opts, device, tick, max_rows)))
        conn.send(("done",))
    except BaseException as e:  # a harness bug: reported in the parent with the child's traceback
        conn.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))
    finally:
        conn.close()


def run_units_isolated(run_unit: UnitRunner, sampler: Callable, units: Sequence[SamplingCase | str], opts: RunOptions,
                       device: torch.device, tick: Callable[[str, int], None]) -> list[CaseOutcome]:
    """Each unit through ``run_unit`` in child processes (module docstring); outcomes in unit order."""
    isolation = opts.isolation
    assert isolation is not None
    spawn = device.type == "cuda"  # CUDA cannot cross a fork; a spawned child loads the sampler by its spec
    outcomes: list[CaseOutcome] = []
    while len(outcomes) < len(units):
        first = len(outcomes)
        child = start_child(_child, (run_unit, isolation.spec if spawn else sampler, list(units[first:]), opts, device.type),
                            spawn=spawn)
        started = time.perf_counter()
        try:
            while True:
                deadline = None if isolation.timeout_s is None else started + isolation.timeout_s
                try:
                    msg = child.receive(deadline)
                except ChildTimeout:
                    child.kill()
                    outcomes.append(died(opts, units[len(outcomes)], "timeout", describe_timeout(isolation.timeout_s or 0.0), device))
                    break
                except ChildGone:
                    outcomes.append(died(opts, units[len(outcomes)], "crash", child.finish(), device))
                    break
                if msg[0] == "start":
                    started = time.perf_counter()  # each unit has the whole timeout
                elif msg[0] == "tick":
                    tick(msg[1], msg[2])
                elif msg[0] == "outcome":
                    outcomes.append(msg[1])
                elif msg[0] == "done":
                    child.finish()
                    break
                else:
                    child.finish()
                    raise RuntimeError(f"the isolated sampler run failed in the harness: {msg[1]}\n{msg[2]}")
        except BaseException:  # an interrupt, or the harness error above: no child outlives the run
            child.kill()
            raise
        if len(outcomes) == first:
            raise RuntimeError("the isolated sampler run ended without running a unit")
    return outcomes


__all__ = ["CALIBRATION", "CaseOutcome", "Isolation", "run_units_isolated", "repro_command", "died"]
