"""Checked runs in child processes: a crash is a finding, and independent runs share the cores.

`isolated_runs(jobs, parallel=N)` runs each `IsolatedJob` (a `runnercheck.stress.run.harness.checked_run`) in its
own child process, at most ``N`` at a time; the parent multiplexes their pipes from one thread.
A child streams, as its run goes, each tick's operations, each step it enqueues and each step that
agreed with the oracle, then its `Findings`.  When a child dies instead -- a segfault in an
interpreted kernel reading past a buffer, an abort, a kill -- the parent still holds the trace up to
the crashing tick and the last completed step, and returns a `Findings` whose first divergence is of
kind ``crash`` (``killed by signal SIGSEGV``); its repro replays into the same crash.

A job with ``timeout_s`` that runs longer is killed with its process group and reported the same
way, its crash ``timed out after N s``.  The child machinery (fork on cpu/sim, spawn on cuda, own
process group, exit descriptions, interrupts left to the parent) is `runnercheck.checks.child`: the
parent kills and reaps every running child before an interrupt leaves `isolated_runs`.  Each child
runs torch single-threaded: interpreted kernels on tiny tensors gain nothing from intra-op threads,
and parallel runs would only contend for the cores.
"""
from __future__ import annotations

import logging
import multiprocessing.connection
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from runnercheck.checks.child import ChildProcess, describe_exit, describe_timeout, start_child
from runnercheck.checks.compare import Divergence
from runnercheck.stress.run.driver import RunResult
from runnercheck.stress.run.harness import ChurnOps, Findings, TraceOps, checked_run
from runnercheck.stress.run.config import RunConfig, RunSetupError

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IsolatedJob:
    config: RunConfig
    source: ChurnOps | TraceOps
    name: str = ""
    lifetime_mode: str = "count"
    stop_on_sync: bool = False
    timeout_s: float | None = None  # wall-clock limit of the run (None: none); past it the run is a crash finding


def default_parallel() -> int:
    """Runs side by side: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _child(conn: Any, job: IsolatedJob) -> None:
    """The isolated run: streams ("tick", t, ops), ("enqueue", id), ("step", id); ends with ("done", findings)."""
    try:
        if job.config.device != "cuda":
            import torch

            torch.set_num_threads(1)
        findings = checked_run(job.config, job.source, name=job.name, lifetime_mode=job.lifetime_mode,
                               stop_on_sync=job.stop_on_sync, on_tick_ops=lambda t, o: conn.send(("tick", t, o)),
                               on_delivered=lambda s: conn.send(("step", s)),
                               on_enqueue=lambda s: conn.send(("enqueue", s)))
        conn.send(("done", findings))
    except RunSetupError as e:
        conn.send(("setup", str(e)))
    except BaseException as e:  # a harness bug: reported in the parent with the child's traceback
        conn.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))
    finally:
        conn.close()


@dataclass
class _Running:
    index: int
    job: IsolatedJob
    child: ChildProcess
    started: float = field(default_factory=time.perf_counter)
    timed_out: bool = False
    trace: list = field(default_factory=list)
    last_step: int | None = None
    last_enqueued: int | None = None
    outcome: tuple | None = None

    def handle(self, msg: tuple, on_tick: Callable[[int, int], None] | None) -> None:
        if msg[0] == "tick":
            self.trace.append(msg[2])
            if on_tick is not None:
                on_tick(self.index, msg[1])
        elif msg[0] == "step":
            self.last_step = msg[1]
        elif msg[0] == "enqueue":
            self.last_enqueued = msg[1]
        else:
            self.outcome = msg

    def findings(self) -> Findings:
        if self.outcome is not None and self.outcome[0] == "done":
            return self.outcome[1]
        if self.outcome is not None and self.outcome[0] == "setup":
            raise RunSetupError(self.outcome[1])
        if self.outcome is not None:
            raise RuntimeError(f"the isolated run failed in the harness: {self.outcome[1]}\n{self.outcome[2]}")
        crash = describe_timeout(self.job.timeout_s or 0.0) if self.timed_out else describe_exit(self.child.proc.exitcode)
        after = f"step {self.last_step}" if self.last_step is not None else "no completed step"
        _log.warning("run %s crashed: %s after %s", self.job.name, crash, after)
        elapsed = time.perf_counter() - self.started
        result = RunResult(ticks=len(self.trace), elapsed_s=elapsed)
        step = self.last_enqueued if self.last_enqueued is not None else 0
        result.divergences = [Divergence(step, None, None, "crash", after, crash,
                                         f"the last step enqueued; the trace up to tick {len(self.trace) - 1} is in the repro")]
        return Findings(name=self.job.name, config=self.job.config, result=result, trace=self.trace, crash=crash,
                        last_completed_step=self.last_step, elapsed_s=elapsed)


def _start(index: int, job: IsolatedJob) -> _Running:
    return _Running(index, job, start_child(_child, (job,), spawn=job.config.device == "cuda"))


def _deadline(run: _Running) -> float | None:
    return None if run.job.timeout_s is None else run.started + run.job.timeout_s


def isolated_runs(jobs: Sequence[IsolatedJob], *, parallel: int = 1,
                  on_start: Callable[[int], None] | None = None,
                  on_tick: Callable[[int, int], None] | None = None,
                  on_done: Callable[[int, Findings], None] | None = None) -> list[Findings]:
    """Each job in a child process, ``parallel`` at a time; findings in job order (module docstring).

    ``on_start(i)``, ``on_tick(i, tick)`` and ``on_done(i, findings)`` run in this process.
    A `RunSetupError` in any child is raised here once the running children are done.
    """
    pending = list(enumerate(jobs))
    running: dict[Any, _Running] = {}
    results: dict[int, Findings] = {}
    setup_error: RunSetupError | None = None
    try:
        while pending or running:
            while pending and len(running) < max(1, parallel) and setup_error is None:
                index, job = pending.pop(0)
                if on_start is not None:
                    on_start(index)
                run = _start(index, job)
                running[run.child.conn] = run
            if not running:
                break
            deadlines = [d for d in map(_deadline, running.values()) if d is not None]
            wait_s = max(0.0, min(deadlines) - time.perf_counter()) if deadlines else None
            ready = set(multiprocessing.connection.wait(list(running), timeout=wait_s))
            now = time.perf_counter()
            for conn, run in list(running.items()):
                deadline = _deadline(run)
                if conn in ready:
                    try:
                        while run.outcome is None and conn.poll():
                            run.handle(conn.recv(), on_tick)
                        finished = run.outcome is not None
                    except EOFError:
                        finished = True
                    if finished:
                        run.child.finish()
                elif deadline is not None and now >= deadline:
                    _log.warning("run %s: %s", job_name(run), describe_timeout(run.job.timeout_s or 0.0))
                    run.timed_out = finished = True
                    run.child.kill()
                else:
                    finished = False
                if not finished:
                    continue
                del running[conn]
                try:
                    results[run.index] = run.findings()
                except RunSetupError as e:
                    setup_error = setup_error or e
                    continue
                if on_done is not None:
                    on_done(run.index, results[run.index])
    finally:
        for run in running.values():  # an interrupt: stop the children, the caller reports it
            run.child.kill()
    if setup_error is not None:
        raise setup_error
    return [results[i] for i in range(len(jobs))]


def isolated_run(config: RunConfig, source: ChurnOps | TraceOps, *, name: str = "", lifetime_mode: str = "count",
                 stop_on_sync: bool = False, on_tick: Callable[[int], None] | None = None,
                 timeout_s: float | None = None) -> Findings:
    """One checked run in a child process (``timeout_s``: its wall-clock limit, None for none)."""
    tick = (lambda _i, t: on_tick(t)) if on_tick is not None else None
    return isolated_runs([IsolatedJob(config, source, name, lifetime_mode, stop_on_sync, timeout_s)], on_tick=tick)[0]


def job_name(run: _Running) -> str:
    return run.job.name or f"#{run.index}"


__all__ = ["IsolatedJob", "isolated_runs", "isolated_run", "default_parallel"]
