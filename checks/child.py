"""Third-party code in a child process: a crash or a hang ends the child, never the caller.

`start_child(target, args, spawn=...)` starts ``target(conn, *args)`` in a child process that leads
its own process group and talks back over a one-way pipe (``conn.send``).  The caller reads with
`ChildProcess.receive` under a deadline; when the child dies without reporting, `exit_reason`
names the signal (``killed by signal SIGSEGV``) or the status, and on a timeout `kill` ends the
child's whole process group (whatever the user's code started goes with it).

Children are forked on cpu/sim (fast, and in-process test plants survive) and spawned on cuda:
CUDA cannot cross a fork.  Used by the stress runs (`runnercheck.stress.run.isolation`) and by the
chi-square runs of a user's sampler (`runnercheck.checks.chisq.isolated`).
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

# How long a hung third-party call may take before it is a finding (per case or per run).
DEFAULT_TIMEOUT_S = 600.0
# A differential run (stress, verify) lasts longer than a chi-square case: a full verify run on sim
# takes minutes on a 2-core CPU, so its default limit only catches a hang.
DEFAULT_RUN_TIMEOUT_S = 1800.0


class ChildTimeout(Exception):
    """`ChildProcess.receive` waited past the deadline."""


class ChildGone(Exception):
    """The child closed its pipe (it exited or died) before the message the caller waited for."""


def describe_exit(code: int | None) -> str:
    """``killed by signal SIGSEGV`` for a negative exit code, else the status."""
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code} before reporting"


def describe_timeout(seconds: float) -> str:
    return f"timed out after {seconds:g} s (process group killed)"


def _enter(target: Callable[..., None], conn: Any, *args: Any) -> None:
    # Interrupts belong to the parent, which stops its children itself: SIGINT ignored, SIGTERM at
    # its default (so `kill` from the parent or CI ends the child without a traceback).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # A group of its own, so a timeout can kill whatever the user's code started too.
    try:
        os.setpgid(0, 0)
    except OSError:  # already a group leader (or not permitted): the child itself is still killed
        pass
    target(conn, *args)


@dataclass
class ChildProcess:
    proc: Any
    conn: Any
    started: float = field(default_factory=time.perf_counter)

    def receive(self, deadline: float | None) -> Any:
        """The next message; `ChildTimeout` past ``deadline`` (a `time.perf_counter` value; None: no
        deadline), `ChildGone` when the pipe closed first."""
        timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
        if not self.conn.poll(timeout):
            raise ChildTimeout()
        try:
            return self.conn.recv()
        except EOFError:
            raise ChildGone() from None

    def kill(self) -> None:
        """End the child and its process group, and reap it."""
        if self.proc.is_alive():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                self.proc.kill()
        self.proc.join()
        self.conn.close()

    def finish(self) -> str:
        """Reap a child whose pipe closed; how it ended (`describe_exit`)."""
        self.proc.join()
        self.conn.close()
        return describe_exit(self.proc.exitcode)


def start_child(target: Callable[..., None], args: tuple, *, spawn: bool) -> ChildProcess:
    """Start ``target(conn, *args)`` in a child (module docstring); ``target`` and ``args`` must
    pickle when ``spawn``."""
    ctx = multiprocessing.get_context("spawn" if spawn else "fork")
    receive, send = ctx.Pipe(duplex=False)
    sys.stdout.flush()
    sys.stderr.flush()
    proc = ctx.Process(target=_enter, args=(target, send, *args), daemon=True)
    # Started with SIGINT ignored, which a spawned interpreter keeps until `_enter` runs: a Ctrl-C
    # while it imports must not print its traceback.  Only the main thread may set handlers.
    if threading.current_thread() is not threading.main_thread():
        proc.start()
    else:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            proc.start()
        finally:
            signal.signal(signal.SIGINT, previous)
    send.close()
    return ChildProcess(proc, receive)


__all__ = ["ChildProcess", "ChildTimeout", "ChildGone", "DEFAULT_TIMEOUT_S", "DEFAULT_RUN_TIMEOUT_S", "describe_exit", "describe_timeout",
           "start_child"]
