"""The device layer: every piece of a step's device work is enqueued through one `Device`.

Kinds
-----
``cuda``  ``enqueue(fn)`` runs ``fn`` now under the runner's one stream; ``fn`` only *launches*
          work (kernels, async copies), so it returns before the GPU has done anything.  A captured
          graph's replay (`GraphLaunch`) and the markers after it go to the device's launch thread
          (`runnercheck.impl.launcher`), which issues them in order; everything else waits until it has
          (`Device.drain_launches`), and so does the end of each step (`Device.on_stream`).
``cpu``   ``enqueue(fn)`` runs ``fn`` now on CPU tensors (Triton kernels interpreted).  Work is done
          when ``enqueue`` returns: good for fast, exact unit tests, blind to races.
``sim``   ``enqueue(fn)`` appends ``fn`` to a queue.  A seeded `LagPolicy` decides when queued work
          runs -- never later than an event the host waits on.  This reproduces what a real GPU
          does to a careless host: a pinned staging buffer rewritten before the queued copy ran is
          copied with its *new* contents; a host read of a device tensor sees stale data.  Because
          the policy is seeded, every interleaving is replayable.

Ownership
---------
The `Device` owns the stream and its launch thread (cuda) or the work queue (sim) and the events it hands out.  It does
not own the tensors it allocates: their owners (state table, buffers, input batch) hold them.  It
*registers* every device allocation and pinned host allocation by storage pointer, so detectors
can tell "device memory" from host memory even when both are CPU tensors
(`is_device_memory`, `is_pinned_memory`).

Host-wait hooks
---------------
Every host wait on device work (`DeviceEvent.synchronize`, `Device.synchronize`) first calls the
functions in `HOST_WAIT_HOOKS` with a short description.  The sync detector (``checks/detectors/sync.py``)
installs one; `impl` itself never imports a checker.
"""
from __future__ import annotations

import os
import random
import threading
import weakref
from collections import deque
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from runnercheck.impl.lag_policies import LagPolicy, RunImmediately, make_lag_policy
from runnercheck.impl.launcher import LaunchThread

DEVICE_KINDS = ("cuda", "cpu", "sim")

HOST_WAIT_HOOKS: list[Callable[[str], None]] = []

_NO_SCOPE = nullcontext()  # `Device.on_stream` where there is no stream to switch

_work_context = threading.local()


def device_work_active() -> bool:
    """True while this thread runs an enqueued closure (device-side work, not a host read).

    On cpu/sim the "device" is the host, and Triton's interpreter converts tensors to numpy to run
    kernels; detectors use this to tell that apart from the host reading device data.
    """
    return getattr(_work_context, "depth", 0) > 0


def _run_as_device_work(fn: Callable[[], None]) -> None:
    _work_context.depth = getattr(_work_context, "depth", 0) + 1
    try:
        fn()
    finally:
        _work_context.depth -= 1


class DeviceError(RuntimeError):
    """Misuse of the device layer (unknown kind, CUDA asked for without a GPU, bad policy)."""


# --------------------------------------------------------------------------- registries

_registry_lock = threading.Lock()
_device_storages: dict[int, weakref.ref] = {}
_pinned_storages: dict[int, weakref.ref] = {}


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _register(table: dict[int, weakref.ref], t: torch.Tensor) -> None:
    ptr = _storage_ptr(t)
    if ptr == 0:  # zero-size tensors have no storage to tell apart
        return
    with _registry_lock:
        table[ptr] = weakref.ref(t)


def _registered(table: dict[int, weakref.ref], t: torch.Tensor) -> bool:
    ref = table.get(_storage_ptr(t))
    return ref is not None and ref() is not None


def is_device_memory(t: object) -> bool:
    """True for CUDA tensors and for CPU tensors allocated through a cpu/sim `Device`."""
    if not isinstance(t, torch.Tensor):
        return False
    if t.is_cuda:
        return True
    return _registered(_device_storages, t)


def is_pinned_memory(t: object) -> bool:
    """True for page-locked host tensors (or their cpu/sim stand-ins allocated by `Device.pinned`)."""
    if not isinstance(t, torch.Tensor) or t.is_cuda:
        return False
    return _registered(_pinned_storages, t) or (torch.cuda.is_available() and t.is_pinned())


def _call_host_wait_hooks(what: str) -> None:
    for hook in list(HOST_WAIT_HOOKS):
        hook(what)


# --------------------------------------------------------------------------- events

_CUDA_EVENT_BASE = getattr(torch._C, "_CudaEventBase", None)  # its methods exist only in CUDA builds of torch
_new_cuda_event = getattr(_CUDA_EVENT_BASE, "__new__", None)
_record_cuda_event = getattr(_CUDA_EVENT_BASE, "record", None)
_query_cuda_event = getattr(_CUDA_EVENT_BASE, "query", None)


# CUDA events of markers seen complete, for new markers to re-record (`DeviceEvent`); at most this many kept.
_MAX_SPARE_CUDA_EVENTS = 64


class DeviceEvent:
    """A marker in the device's work order.  ``query`` never blocks; ``synchronize`` is a host wait.

    On cuda a marker seen complete (by a query, a completion check or a wait) stays complete and gives
    its CUDA event back to its device, whose next marker re-records it: ~1-2 us less host time a
    marker on an H200 host than creating, recording and destroying one.  Every cuda marker is recorded
    on the device's one stream, whose work completes in order, so a marker seen complete also
    completes every marker recorded before it: the device keeps the newest such marker's number
    (``Device._cuda_done_marker``), and a check of an older marker asks CUDA nothing.  cpu/sim markers
    are not cached: a sim lag policy runs on every query.
    """

    def __init__(self, dev: "Device"):
        self._dev = dev
        self._cuda_event: torch.cuda.Event | None = None
        self._seq = -1
        self.recorded = False
        self._complete = False  # cuda only: seen complete (its CUDA event then went back to the device)
        self._issue = 0  # cuda with a launch thread: the job recording it (0: recorded by the host itself)

    def record(self) -> "DeviceEvent":
        dev = self._dev
        if dev.kind == "cuda":
            spares = dev._spare_cuda_events
            if dev._launch_pending and spares:
                # After work the launch thread holds: recorded by it, behind that work (a spare event exists on
                # the device already; a new one is made by its first record, here, after a drain).
                event = self._cuda_event = spares.pop()
                launcher = dev.launcher
                self._issue = launcher.event(event.cuda_event, launcher.stream_handle)
            else:
                dev.drain_launches()
                # A new event is made and recorded through `torch.cuda.Event`'s base class: the Python
                # wrappers (keyword defaults, a stream look-up) cost several us per step on an H200 host.
                self._cuda_event = spares.pop() if spares else _new_cuda_event(torch.cuda.Event)
                _record_cuda_event(self._cuda_event, dev.stream)
            dev._cuda_markers += 1
            self._seq = dev._cuda_markers
        elif dev.kind == "sim":
            self._seq = dev._next_seq - 1
        self.recorded = True
        return self

    def _cuda_complete(self, ask: bool = True) -> bool:
        """Seen complete, recorded before a marker that was, or (``ask``) complete by a CUDA query -- asked only once
        the launch thread recorded it (before that its work is not on the stream yet)."""
        if not self._complete and (self._seq <= self._dev._cuda_done_marker or (
                ask and (not self._issue or self._dev.launcher.issued() >= self._issue) and _query_cuda_event(self._cuda_event))):
            self._seen_complete()
        return self._complete

    def _seen_complete(self) -> None:
        self._complete = True
        dev = self._dev
        if self._seq > dev._cuda_done_marker:
            dev._cuda_done_marker = self._seq
        spares = dev._spare_cuda_events
        if len(spares) < _MAX_SPARE_CUDA_EVENTS:
            spares.append(self._cuda_event)
        self._cuda_event = None

    def query(self) -> bool:
        dev = self._dev
        if not self.recorded:
            raise DeviceError("query() on an event that was never recorded")
        if dev.kind == "cuda":
            return self._cuda_complete()
        if dev.kind == "sim":
            dev.policy.on_query(dev)
            return dev._done_seq >= self._seq
        return True

    def known_complete(self) -> bool:
        """`is_complete` without asking CUDA: on cuda, whether this marker was seen complete or was recorded
        before one that was (False says only "not known yet").  For bookkeeping that may wait for the answer."""
        if self._complete:  # cuda: seen complete before (the usual answer for an old marker; no call)
            return True
        if not self.recorded:
            raise DeviceError("known_complete() on an event that was never recorded")
        if self._dev.kind == "cuda":
            return self._cuda_complete(ask=False)
        return self.is_complete()

    def is_complete(self) -> bool:
        """Whether the work before the event has run, without letting a sim lag policy run any."""
        dev = self._dev
        if not self.recorded:
            raise DeviceError("is_complete() on an event that was never recorded")
        if dev.kind == "cuda":
            return self._cuda_complete()
        if dev.kind == "sim":
            return dev._done_seq >= self._seq
        return True

    def synchronize(self) -> None:
        dev = self._dev
        if not self.recorded:
            raise DeviceError("synchronize() on an event that was never recorded")
        _call_host_wait_hooks("DeviceEvent.synchronize")
        if dev.kind == "cuda":
            if not self._complete:
                if self._issue:
                    dev.launcher.wait(self._issue)
                self._cuda_event.synchronize()
                self._seen_complete()
        elif dev.kind == "sim":
            dev._run_through(self._seq)


class _StreamScope:
    """`Device.on_stream` on cuda: a plain class, not a generator context manager (cheaper per step).

    The stream is made current by the scope's first enqueue that runs on its thread (`switch`), not on entry: a
    step whose device work all goes to the launch thread (a fused replay and its marker) switches nothing."""

    __slots__ = ("_dev", "_prev", "thread")

    def __init__(self, dev: "Device"):
        self._dev = dev
        self._prev = None
        self.thread = 0  # the thread that entered it: read only while it is open

    def __enter__(self) -> None:
        self.thread = threading.get_ident()  # the device's one scope is entered anew by each step
        dev = self._dev
        if dev.launcher is not None:  # the step will push: the worker polls again by then
            dev.launcher.wake()
        dev._scope = self

    def switch(self) -> bool:
        """Make the device's stream current until the scope ends; False (nothing switched) when another device is
        current (each enqueue then switches both itself)."""
        dev = self._dev
        stream_id, index, device_type = dev._stream_key
        if torch._C._cuda_getDevice() != index:
            return False
        self._prev = torch._C._cuda_getCurrentStream(index)
        torch._C._cuda_setStream(stream_id=stream_id, device_index=index, device_type=device_type)
        dev._on_stream = self.thread
        return True

    def __exit__(self, *exc: object) -> None:
        dev = self._dev
        dev._scope = None
        try:
            if dev._launch_pending:  # a step ends with its work on the stream
                dev.drain_launches()
        finally:
            prev = self._prev
            if prev is not None:
                self._prev = None
                dev._on_stream = None
                torch._C._cuda_setStream(stream_id=prev[0], device_index=prev[1], device_type=prev[2])


class GraphLaunch:
    """A captured CUDA graph's replay as device work for `Device.enqueue`: handed to the device's launch thread as
    its exec handle when there is one (`runnercheck.impl.launcher`), else replayed on the caller's thread."""

    __slots__ = ("cuda_graph", "exec_handle")

    def __init__(self, cuda_graph: "torch.cuda.CUDAGraph"):
        self.cuda_graph = cuda_graph
        try:
            self.exec_handle = int(cuda_graph.raw_cuda_graph_exec())
        except (AttributeError, RuntimeError):  # a torch without the accessor: replayed here
            self.exec_handle = 0

    def __call__(self) -> None:
        self.cuda_graph.replay()


@dataclass
class _QueuedWork:
    seq: int
    step_index: int
    fn: Callable[[], None]
    label: str


# --------------------------------------------------------------------------- device


def resolve_device_kind(kind: str) -> str:
    """The one rule for a device kind, everywhere it is asked for (CLI, pytest plugin, `Device`):
    ``auto`` is ``cuda`` when torch sees a GPU, else ``sim``; ``cuda`` must be present when named.
    `DeviceError` for an unknown kind or a missing GPU."""
    if kind == "auto":
        return "cuda" if torch.cuda.is_available() else "sim"
    if kind not in DEVICE_KINDS:
        raise DeviceError(f"unknown device kind {kind!r}; expected one of {DEVICE_KINDS} or 'auto'")
    if kind == "cuda" and not torch.cuda.is_available():
        raise DeviceError("device kind 'cuda' asked for, but torch sees no CUDA device")
    return kind


class Device:
    """One device and its single always-enqueueing stream (or sim queue).  See the module docstring."""

    def __init__(self, kind: str = "auto", *, seed: int = 0, lag_policy: str | LagPolicy | dict = "random-drain", cuda_index: int = 0):
        kind = resolve_device_kind(kind)
        self.kind = kind
        self.seed = seed
        self.step_index = 0
        self.launcher: LaunchThread | None = None  # cuda: the launch thread, when it starts (`runnercheck.impl.launcher`)
        self.num_enqueued = 0
        if kind == "cuda":
            self.torch_device = torch.device("cuda", cuda_index)
            self.stream = torch.cuda.Stream(device=self.torch_device)
            # Resolved once: `enqueue` switches the thread's current stream with the calls the stream
            # context manager makes underneath (the context manager costs ~18 us per enqueue on an
            # H200, re-resolving device and stream each time; these ~1.5 us).
            self._stream_key = (self.stream.stream_id, self.stream.device_index, self.stream.device_type)
            with torch.cuda.device(self.torch_device):  # its context current on this thread for the worker to adopt
                self.launcher = LaunchThread.start(self.stream.cuda_stream)
        else:
            self.torch_device = torch.device("cpu")
            self.stream = None
        self._launch_pending = False  # jobs pushed to the launch thread that no drain has waited for
        self._queue: deque[_QueuedWork] = deque()
        self._next_seq = 0
        self._done_seq = -1
        self._running = False
        self.policy: LagPolicy = make_lag_policy(lag_policy, seed) if kind == "sim" else RunImmediately()
        self.trace: list[str] | None = None  # sim: labels in the order they ran, when enabled
        self._on_stream: int | None = None  # cuda: the thread inside `on_stream` whose stream it made current
        self._scope: _StreamScope | None = None  # cuda: the open `on_stream` scope
        self._stream_scope: _StreamScope | None = None  # cuda: the one scope `on_stream` hands out, made at first use
        # cuda: CUDA events of this device's markers seen complete, re-recorded by its next markers (`DeviceEvent`)
        self._spare_cuda_events: list[torch.cuda.Event] = []
        self._cuda_markers = 0  # cuda: markers recorded so far (each marker's number, in stream order)
        self._cuda_done_marker = 0  # cuda: every marker numbered up to this one is complete

    # ---------------------------------------------------------------- properties
    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def triton_interpreted(self) -> bool:
        return os.environ.get("TRITON_INTERPRET", "0") == "1"

    def describe(self) -> dict:
        return {"kind": self.kind, "seed": self.seed, "policy": self.policy.describe() if self.kind == "sim" else None}

    # ---------------------------------------------------------------- allocation
    def empty(self, shape: Sequence[int] | int, dtype: torch.dtype) -> torch.Tensor:
        """Device memory (registered so detectors know it is device data)."""
        t = torch.empty(shape, dtype=dtype, device=self.torch_device)
        if self.kind != "cuda":
            _register(_device_storages, t)
        return t

    def zeros(self, shape: Sequence[int] | int, dtype: torch.dtype) -> torch.Tensor:
        t = self.empty(shape, dtype)
        t.zero_()
        self._stream_waits_for_current()
        return t

    def full(self, shape: Sequence[int] | int, value: float | int, dtype: torch.dtype) -> torch.Tensor:
        t = self.empty(shape, dtype)
        t.fill_(value)
        self._stream_waits_for_current()
        return t

    def _stream_waits_for_current(self) -> None:
        """Order the device's stream after work just issued on the caller's current stream.

        Init-time fills and copies run on whatever stream is current (the default one outside
        `enqueue`); kernels on the device's own stream must not read the memory before they land.
        Enqueue-only: no host wait.
        """
        if self.kind == "cuda":
            self.drain_launches()
            current = torch.cuda.current_stream(self.torch_device)
            if current != self.stream:
                self.stream.wait_stream(current)

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """A registered device copy of a host tensor (init-time only: it may block on cuda)."""
        out = self.empty(tuple(t.shape), t.dtype)
        out.copy_(t)
        self._stream_waits_for_current()
        return out

    def pinned(self, shape: Sequence[int] | int, dtype: torch.dtype) -> torch.Tensor:
        """Page-locked host memory (a registered plain CPU tensor on cpu/sim)."""
        if self.kind == "cuda":
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        t = torch.empty(shape, dtype=dtype)
        _register(_pinned_storages, t)
        return t

    def is_device_tensor(self, t: torch.Tensor) -> bool:
        return is_device_memory(t)

    # ---------------------------------------------------------------- work
    def enqueue(self, fn: Callable[[], None], label: str = "") -> None:
        """Hand device work to the stream/queue.  Returns without waiting for it on cuda and sim."""
        self.num_enqueued += 1
        if self.kind == "cuda":
            if self.launcher is not None:
                if type(fn) is GraphLaunch and fn.exec_handle:
                    self.launcher.graph(fn.exec_handle, self.launcher.stream_handle)
                    self._launch_pending = True
                    return
                if self._launch_pending:  # work of this thread's goes on the stream after what the worker holds
                    self.drain_launches()
            self._run_on_stream(fn)
            return
        if self.kind == "cpu":
            _run_as_device_work(fn)
            return
        if self._running:
            # Work enqueued from inside running work keeps stream order: run it right away.
            _run_as_device_work(fn)
            return
        self._queue.append(_QueuedWork(self._next_seq, self.step_index, fn, label))
        self._next_seq += 1
        self.policy.on_enqueue(self)

    def _run_on_stream(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` with the device's stream current (cuda), restoring the caller's stream after."""
        thread = threading.get_ident()
        if self._on_stream == thread:  # inside this thread's `on_stream`: already current
            _run_as_device_work(fn)
            return
        scope = self._scope
        if scope is not None and scope.thread == thread and scope._prev is None and scope.switch():
            _run_as_device_work(fn)  # current from here to the scope's end
            return
        stream_id, index, device_type = self._stream_key
        if torch._C._cuda_getDevice() != index:  # another current device: let the context manager switch both
            with torch.cuda.stream(self.stream):
                _run_as_device_work(fn)
            return
        prev = torch._C._cuda_getCurrentStream(index)
        if prev[0] == stream_id:  # already on it (work enqueued from inside enqueued work)
            _run_as_device_work(fn)
            return
        torch._C._cuda_setStream(stream_id=stream_id, device_index=index, device_type=device_type)
        try:
            _run_as_device_work(fn)
        finally:
            torch._C._cuda_setStream(stream_id=prev[0], device_index=prev[1], device_type=prev[2])

    def on_stream(self) -> AbstractContextManager:
        """A step's scope (cuda; a no-op elsewhere): the device's stream is made current by its first enqueue run on
        this thread and stays so to its end -- one switch and one restore, not two per enqueue (each costs host time
        on an H200), and none for a step whose work all goes to the launch thread.  It wakes the launch thread on
        entry and waits at its end until the thread has issued what the step pushed.  Nested use is a no-op."""
        if self.kind != "cuda" or self._scope is not None:
            return _NO_SCOPE
        scope = self._stream_scope  # one per device, entered by each step (no object made a step)
        if scope is None:
            scope = self._stream_scope = _StreamScope(self)
        return scope

    def record_event(self) -> DeviceEvent:
        return DeviceEvent(self).record()

    def begin_step(self) -> None:
        """Mark a step boundary (lag policies measure lag in steps)."""
        self.step_index += 1
        if self.kind == "sim":
            self.policy.on_step_boundary(self)

    def inject_delay(self, microseconds: float) -> None:
        """Make the device lag the host: on cuda a spin kernel on the stream; a no-op elsewhere."""
        if self.kind != "cuda" or microseconds <= 0:
            return
        cycles = int(microseconds * _clock_mhz(self.torch_device))
        self.enqueue(lambda: torch.cuda._sleep(cycles), "delay")

    def drain_launches(self) -> None:
        """Wait until the launch thread (`runnercheck.impl.launcher`) has issued every job pushed to it: a wait on the worker's
        driver calls, not on device work.  Before any other use of the stream, and at the end of each step."""
        if self._launch_pending:
            self._launch_pending = False
            self.launcher.wait()

    def synchronize(self) -> None:
        """Wait for all enqueued work (a host wait: never in the hot path)."""
        _call_host_wait_hooks("Device.synchronize")
        if self.kind == "cuda":
            self.drain_launches()
            self.stream.synchronize()
            self._cuda_done_marker = self._cuda_markers
        elif self.kind == "sim":
            self._run_pending(len(self._queue))

    @property
    def num_pending(self) -> int:
        return len(self._queue)

    def set_lag_policy(self, policy: str | LagPolicy | dict) -> None:
        if self.kind != "sim":
            raise DeviceError(f"lag policies apply to the sim device, not {self.kind!r}")
        self.policy = make_lag_policy(policy, self.seed)

    # ---------------------------------------------------------------- sim internals
    def _run_pending(self, n: int) -> None:
        for _ in range(min(n, len(self._queue))):
            item = self._queue.popleft()
            self._running = True
            try:
                _run_as_device_work(item.fn)
            finally:
                self._running = False
            self._done_seq = item.seq
            if self.trace is not None:
                self.trace.append(item.label)

    def _run_leading(self, runnable: Callable[[_QueuedWork], bool]) -> None:
        """Run the queue's leading items while ``runnable`` holds (stream order: stop at the first that does not)."""
        n = 0
        for item in self._queue:
            if not runnable(item):
                break
            n += 1
        self._run_pending(n)

    def _run_through(self, seq: int) -> None:
        self._run_leading(lambda item: item.seq <= seq)


_CLOCK_MHZ: dict[int, float] = {}


def _clock_mhz(dev: torch.device) -> float:
    idx = dev.index or 0
    if idx not in _CLOCK_MHZ:
        try:
            rate = torch.cuda.get_device_properties(idx).clock_rate  # kHz
            _CLOCK_MHZ[idx] = rate / 1000.0 if rate else 1980.0
        except (AttributeError, RuntimeError):
            _CLOCK_MHZ[idx] = 1980.0
    return _CLOCK_MHZ[idx]


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
