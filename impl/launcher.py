"""The device's launch thread: a cuda step's graph replay and its marker issued by a worker, not by the step.

On an H200 host a graph launch called from inside a host step costs 10-30 us, against ~3 us for the same call made
back to back (H200 runs 79-82, 2026-12-02, in git history of docs/BENCHMARKS.md: the step's own work leaves the driver's code and data cold in the
caches), and the marker after it ~3 us more.  A worker thread that does nothing else keeps them warm.  The step
pushes the two jobs (~1 us) and goes on with its bookkeeping while the worker issues them, in push order, on the
device's stream; `runnercheck.impl.device.Device` makes every other use of the stream wait until the worker has issued what
was pushed before it (`Device.drain_launches`), and ends each step that way, so when ``execute_model`` returns
its work is on the stream as before.  A marker pushed and not yet issued is not complete
(`runnercheck.impl.device.DeviceEvent`): the device is never asked about an event that is not yet recorded.

The worker is C (`impl/native/launcher.c`): it calls the driver's ``cuGraphLaunch`` and ``cuEventRecord`` (found
in ``libcuda.so.1`` through ctypes; runtime and driver handles are the same objects) and never takes the GIL.
By default it never polls: once its jobs are issued it sleeps in a blocking wait that uses no CPU, and the
step's push wakes it (one futex wake, a system call on the step's thread: some microseconds on the H200's virtual
machine, H200 run 118 in git history of docs/BENCHMARKS.md).  Polling is there to take
that call out of the step, and it costs a core: on a lent H100 (run 148, host_cost at 64 requests, 1% churn)
the polling worker used 186 us of CPU a step (179 us of it polling) against 6 us for the sleeping one, for
execute_model host times within 4% of each other (0.369x against 0.381x of the baseline).  ``RUNNERCHECK_LAUNCH_SPIN_US`` > 0 (microseconds) turns
it on: idle, the worker then polls for a job, then (optionally) naps, then sleeps.  Its polling after a burst of
jobs adapts to the steps: at most ``RUNNERCHECK_LAUNCH_SPIN_PERCENT`` (default 10) percent of the
median interval between its recent bursts, capped at ``RUNNERCHECK_LAUNCH_SPIN_US``, so steps far
apart do not keep a core busy -- and not at all while each recent quiet after a burst (to the next step's wake
or job) outlasted that poll: such polling never catches the next step, whose wake finds the worker asleep anyway.
A step tells it that it begins (`Device.on_stream`; a no-op without polling): the worker then polls the whole cap,
so it is polling by the time the step pushes -- after a *lead wait*: it learns how long a step takes from its wake
to its first push and waits, blocked, until ``RUNNERCHECK_LAUNCH_LEAD_MARGIN_US`` (default 30; ``off``: no lead
wait) before the shortest of the recent ones, so a step's own host work does not keep a second core polling.  A
push that comes sooner finds it blocked and wakes it, as below (a mispredicted lead counts in `signals`).  A
polling or napping worker finds a push by itself (no system call on the step's thread); only a sleeping one must
be woken.  Naps (``RUNNERCHECK_LAUNCH_NAP_US`` at a time for ``RUNNERCHECK_LAUNCH_NAP_FOR_US``, default 0:
none) keep that call out of steps that come closer together than the naps last, at a nap's CPU each.
The host_cost benchmark counts the worker's CPU time (`LaunchThread.cpu_seconds`) in the host CPU per step and reports
the wakes per step (`LaunchThread.signals`) and where its time went (`LaunchThread.phases`).

``RUNNERCHECK_LAUNCH_THREAD``: ``auto`` (default: on for cuda when `on_by_default` says the machine has a spare
core for each GPU, the C module builds and the driver's calls are found, else off with one log line), ``0`` (off:
the step launches and records itself, as without the thread), ``1`` (required: raises `LaunchThreadError` when it
cannot start, whatever the core count).

Ownership: `LaunchThread` owns the native launcher (its ring of jobs, host memory, and its worker thread) for
the device's lifetime; only the device's thread pushes, only the worker issues.
"""
from __future__ import annotations

import ctypes
import logging
import os

from runnercheck.impl import native

log = logging.getLogger(__name__)

DEFAULT_SPIN_US = 0  # no polling: run 148's host_cost (module docstring)
DEFAULT_SPIN_PERCENT = 10
DEFAULT_NAP_US = 20
DEFAULT_NAP_FOR_US = 0
DEFAULT_LEAD_MARGIN_US = 30


class LaunchThreadError(RuntimeError):
    """The launch thread was required (``RUNNERCHECK_LAUNCH_THREAD=1``) and cannot start, or a job it issued failed."""


def mode() -> str:
    return native.tri_state("RUNNERCHECK_LAUNCH_THREAD", LaunchThreadError)


def spare_cores(cpus: int | None = None) -> int:
    """Cores this process may run on besides the caller's own: ``os.sched_getaffinity(0)`` minus 1 (``cpus``: that
    count given, for tests)."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, cpus - 1)


def on_by_default(cpus: int | None = None, gpus: int | None = None) -> bool:
    """The ``auto`` rule: a launch thread per device only where each has a spare core (`spare_cores` >= GPUs).  With
    fewer, the workers' polling would take cores the callers' steps need.  ``cpus`` / ``gpus``: counts given (tests);
    by default this process's affinity and ``torch.cuda.device_count()``."""
    if gpus is None:
        gpus = torch_gpus()
    return spare_cores(cpus) >= max(1, gpus)


def spin_percent() -> int:
    """``RUNNERCHECK_LAUNCH_SPIN_PERCENT``: the most of the recent step interval the idle worker polls (1-100)."""
    percent = _micros("RUNNERCHECK_LAUNCH_SPIN_PERCENT", DEFAULT_SPIN_PERCENT, 100)
    if percent < 1:
        raise LaunchThreadError("RUNNERCHECK_LAUNCH_SPIN_PERCENT=0: expected an int in [1, 100] (percent)")
    return percent


def lead_margin() -> int:
    """``RUNNERCHECK_LAUNCH_LEAD_MARGIN_US``: how long before a step's expected first push the worker's lead wait ends
    (microseconds), or -1 for ``off`` (the worker polls from the step's wake)."""
    if os.environ.get("RUNNERCHECK_LAUNCH_LEAD_MARGIN_US", "").strip().lower() == "off":
        return -1
    return _micros("RUNNERCHECK_LAUNCH_LEAD_MARGIN_US", DEFAULT_LEAD_MARGIN_US, 1_000_000, also=" or 'off'")


def idle_settings() -> tuple[int, int, int]:
    """The worker's idle phases in microseconds: (polling, one nap, naps for) from ``RUNNERCHECK_LAUNCH_SPIN_US``,
    ``RUNNERCHECK_LAUNCH_NAP_US`` and ``RUNNERCHECK_LAUNCH_NAP_FOR_US`` (typed errors for values the worker refuses)."""
    spin = _micros("RUNNERCHECK_LAUNCH_SPIN_US", DEFAULT_SPIN_US, 3_600_000_000)
    nap = _micros("RUNNERCHECK_LAUNCH_NAP_US", DEFAULT_NAP_US, 1_000_000)
    nap_for = _micros("RUNNERCHECK_LAUNCH_NAP_FOR_US", DEFAULT_NAP_FOR_US, 3_600_000_000)
    if nap_for and not nap:
        raise LaunchThreadError("RUNNERCHECK_LAUNCH_NAP_US=0 with naps for "
                                f"{nap_for} us: a nap must last >= 1 us (set RUNNERCHECK_LAUNCH_NAP_FOR_US=0 for none)")
    return spin, nap, nap_for


def _micros(name: str, default: int, most: int, also: str = "") -> int:
    """The int value of ``name`` in [0, ``most``] (``default`` when unset); ``also`` names other accepted values in
    the error."""
    value = os.environ.get(name, str(default))
    try:
        micros = int(value)
    except ValueError:
        micros = -1
    if not 0 <= micros <= most:
        unit = "percent" if name.endswith("PERCENT") else "microseconds"
        raise LaunchThreadError(f"{name}={value!r}: expected an int in [0, {most}] ({unit}){also}")
    return micros


def _driver_calls() -> tuple[int, int, int, int]:
    """Addresses of cuGraphLaunch, cuEventRecord and cuCtxSetCurrent, and this thread's current context."""
    driver = ctypes.CDLL("libcuda.so.1")
    addresses = tuple(ctypes.cast(getattr(driver, name), ctypes.c_void_p).value
                      for name in ("cuGraphLaunch", "cuEventRecord", "cuCtxSetCurrent"))
    context = ctypes.c_void_p()
    code = driver.cuCtxGetCurrent(ctypes.byref(context))
    if code != 0 or not context.value:
        raise OSError(f"cuCtxGetCurrent returned {code} (context {context.value})")
    return (*addresses, context.value)


class LaunchThread:
    """The worker and the device's view of it (see the module docstring)."""

    def __init__(self, launcher: object, stream_handle: int, error: type[Exception] = RuntimeError):
        self._launcher = launcher
        self._error = error  # what the native launcher raises for a failed job
        self.stream_handle = stream_handle
        self.graph = launcher.graph  # (exec handle, stream handle) -> job number
        self.event = launcher.event  # (event handle, stream handle) -> job number
        self.issued = launcher.issued  # () -> jobs issued so far
        self.pushed = launcher.pushed  # () -> jobs pushed so far
        self.wake = launcher.wake  # () -> None: a step begins (a system call only when the worker sleeps)
        self.signals = launcher.signals  # () -> times a pushing thread has woken the sleeping worker
        self.cpu_seconds = launcher.cpu_seconds  # () -> CPU seconds the worker has used (its polling is the most of it)
        self.sleeps = launcher.sleeps  # () -> times the worker has gone to its blocking wait
        # () -> (ns inside the driver's calls, ns polling, ns the pushing thread spun in `wait`, jobs issued): wall time
        self.phases = launcher.phases
        self.idle_window = launcher.idle_window  # () -> (median ns between burst starts, ns it polls after a burst)
        self.lead = launcher.lead  # () -> (shortest recent wake-to-first-push ns, last lead wait ns, lead waits)

    @classmethod
    def start(cls, stream_handle: int) -> "LaunchThread | None":
        """A started launch thread for ``stream_handle`` (call on the device's thread, its context current), or None
        when it is off or cannot start (``auto``)."""
        wanted = mode()
        if wanted == "0":
            return None
        idle = (*idle_settings(), spin_percent(), lead_margin())
        if wanted == "auto" and not on_by_default():
            log.info("launch thread off: %d spare core(s) for %d GPU(s) (RUNNERCHECK_LAUNCH_THREAD=1 turns it on)",
                     spare_cores(), torch_gpus())
            return None
        try:
            module = native.load("launcher")
            if module is None:
                raise OSError(f"impl/native/launcher.c is not loaded (RUNNERCHECK_NATIVE=0, or {native.BUILD_HINT})")
            graph, event, set_context, context = _driver_calls()
            return cls(module.Launcher(graph, event, set_context, context, *idle), stream_handle, module.LaunchError)
        except (OSError, AttributeError, native.NativeBuildError) as err:
            if wanted == "1":
                raise LaunchThreadError(f"the launch thread cannot start: {err}") from err
            log.info("launch thread off (%s): each step launches its graph itself", err)
            return None

    def wait(self, seq: int = -1) -> None:
        """Return once the jobs up to ``seq`` (-1: all pushed) are issued; a failed job raises `LaunchThreadError`."""
        try:
            self._launcher.wait(seq)
        except self._error as err:
            raise LaunchThreadError(str(err)) from err

    def pause(self) -> None:
        """Hold issuing (tests: a pushed job stays off the stream until `resume`)."""
        self._launcher.pause()

    def resume(self) -> None:
        self._launcher.resume()

    def close(self) -> None:
        """Issue what was pushed and stop the worker; a job that failed raises `LaunchThreadError`, as `wait` does."""
        try:
            self._launcher.close()
        except self._error as err:
            raise LaunchThreadError(str(err)) from err


def torch_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


__all__ = ["DEFAULT_LEAD_MARGIN_US", "DEFAULT_NAP_FOR_US", "DEFAULT_NAP_US", "DEFAULT_SPIN_PERCENT", "DEFAULT_SPIN_US", "LaunchThread",
           "LaunchThreadError", "idle_settings", "lead_margin", "mode", "on_by_default", "spare_cores", "spin_percent", "torch_gpus"]
