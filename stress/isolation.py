"""Checked runs in child processes: a crash is a finding, and independent runs share the cores.

`isolated_runs(jobs, parallel=N)` runs each `IsolatedJob` (a `runnercheck.stress.harness.checked_run`) in its
own child process, at most ``N`` at a time; the parent multiplexes their pipes from one thread.
A child streams, as its run goes, each tick's operations, each step it enqueues and each step that
agreed with the oracle, then its `Findings`.  When a child dies instead -- a segfault in an
interpreted kernel reading past a buffer, an abort, a kill -- the parent still holds the trace up to
the crashing tick and the last completed step, and returns a `Findings` whose first divergence is of
kind ``crash`` (``killed by signal SIGSEGV``); its repro replays into the same crash.

Children are forked on cpu/sim (fast, and in-process test plants survive) and spawned on cuda
(CUDA cannot cross a fork).  Interrupts belong to the parent: a child starts with SIGINT ignored
and SIGTERM at its default (so Ctrl-C in a terminal, which signals the whole process group, reaches
only the parent's `KeyboardInterrupt`), and the parent kills and reaps every running child before
the interrupt leaves `isolated_runs`.  Each child runs torch single-threaded: interpreted kernels on tiny
tensors gain nothing from intra-op threads, and parallel runs would only contend for the cores.
"""
from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from runnercheck.checks.compare import Divergence
from runnercheck.stress.driver import RunResult
from runnercheck.stress.harness import ChurnOps, Findings, TraceOps, checked_run
from runnercheck.stress.run_config import RunConfig, RunSetupError

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IsolatedJob:
    config: RunConfig
    source: ChurnOps | TraceOps
    name: str = ""
    lifetime_mode: str = "count"
    stop_on_sync: bool = False


def default_parallel() -> int:
    """Runs side by side: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _child(conn: Any, job: IsolatedJob) -> None:
    """The isolated run: streams ("tick", t, ops), ("enqueue", id), ("step", id); ends with ("done", findings)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles interrupts and stops its children
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
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


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code} before reporting"


@dataclass
class _Running:
    index: int
    job: IsolatedJob
    proc: Any
    conn: Any
    started: float = field(default_factory=time.perf_counter)
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
        crash = _describe_exit(self.proc.exitcode)
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
    ctx = multiprocessing.get_context("spawn" if job.config.device == "cuda" else "fork")
    receive, send = ctx.Pipe(duplex=False)
    sys.stdout.flush()
    sys.stderr.flush()
    proc = ctx.Process(target=_child, args=(send, job), daemon=True)
    # Started with SIGINT ignored, which a spawned interpreter keeps until `_child` runs: a Ctrl-C
    # while it imports must not print its traceback.
    if threading.current_thread() is not threading.main_thread():  # only the main thread sets handlers
        proc.start()
    else:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            proc.start()
        finally:
            signal.signal(signal.SIGINT, previous)
    send.close()
    return _Running(index, job, proc, receive)


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
                running[run.conn] = run
            if not running:
                break
            for conn in multiprocessing.connection.wait(list(running)):
                run = running[conn]
                try:
                    while run.outcome is None and conn.poll():
                        run.handle(conn.recv(), on_tick)
                    finished = run.outcome is not None
                except EOFError:
                    finished = True
                if not finished:
                    continue
                del running[conn]
                run.proc.join()
                conn.close()
                try:
                    results[run.index] = run.findings()
                except RunSetupError as e:
                    setup_error = setup_error or e
                    continue
                if on_done is not None:
                    on_done(run.index, results[run.index])
    finally:
        for run in running.values():  # an interrupt: stop the children, the caller reports it
            run.proc.kill()
            run.proc.join()
    if setup_error is not None:
        raise setup_error
    return [results[i] for i in range(len(jobs))]


def isolated_run(config: RunConfig, source: ChurnOps | TraceOps, *, name: str = "", lifetime_mode: str = "count",
                 stop_on_sync: bool = False, on_tick: Callable[[int], None] | None = None) -> Findings:
    """One checked run in a child process."""
    tick = (lambda _i, t: on_tick(t)) if on_tick is not None else None
    return isolated_runs([IsolatedJob(config, source, name, lifetime_mode, stop_on_sync)], on_tick=tick)[0]


__all__ = ["IsolatedJob", "isolated_runs", "isolated_run", "default_parallel"]
