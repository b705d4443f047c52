"""Host-sync detector: a scope in which any host read of device data, or host wait on the device,
is an error (or, in count mode, an event on a report).

Why: the runner's steady-state step must never make the host wait for the GPU.  One stray
``.item()`` serialises host and device and hides every race the suite looks for.

What is trapped
---------------
On every device kind (a `torch.overrides.TorchFunctionMode`, pushed on the armed thread only):

* reads of device memory (`runnercheck.impl.device.is_device_memory`: CUDA tensors and tensors a cpu/sim
  `Device` allocated): ``.item()``, ``.tolist()``, ``bool()``, ``int()``, ``float()``,
  ``complex()``, ``operator.index``, ``.numpy()``, ``np.asarray``, ``repr``/format, ``in``,
  ``.cpu()``, ``.to(cpu)`` / ``.to(host tensor)``, ``torch.equal``/``allclose``/``is_nonzero``;
* ops whose output shape depends on device data (on CUDA they wait for the stream): ``nonzero``,
  ``argwhere``, ``masked_select``, ``unique``, one-argument ``where``, boolean-mask indexing and
  assignment, ``repeat_interleave`` with tensor repeats and no ``output_size``;
* copies that are synchronous on CUDA: a blocking ``copy_`` between device and host memory, and a
  ``non_blocking=True`` copy whose host side is pageable (not `runnercheck.impl.device.is_pinned_memory`) or
  pinned but not dense -- CUDA silently makes those synchronous;
* host waits through the device layer (`runnercheck.impl.device.HOST_WAIT_HOOKS`: ``Device.synchronize``,
  ``DeviceEvent.synchronize``).

On ``cuda`` additionally: ``torch.cuda.set_sync_debug_mode("warn")`` while any thread is armed
(every synchronising CUDA op it knows: ``.item()``, ``nonzero``, masked indexing,
``Stream.synchronize`` ...), whose warnings are turned into reports on the armed thread, plus
patches for what it misses (measured on an H200): ``torch.cuda.synchronize()``,
``torch.cuda.Event.synchronize()`` (and ``Stream.synchronize`` for a clean location).

The catalogue of watched ops and of what counts as device data is `runnercheck.checks.detectors.sync_ops`.

Device work is not a host read: on cpu/sim the "device" is the host, and Triton's interpreter
converts tensors to numpy to run a kernel inside an enqueued closure.  Reads of non-CUDA tensors
while `runnercheck.impl.device.device_work_active()` are therefore not flagged (a pageable ``non_blocking``
copy still is: that is about how the host launches work).  Reads of CUDA tensors are flagged even
inside a closure, because there the closure runs on the host.

Scopes and threads
------------------
All state is thread-local: arming one thread never affects another.  Scopes nest; an event is
recorded in every armed scope of the thread and raises if any of them is in ``error`` mode (an
inner ``count`` scope cannot relax an outer ``error`` scope).  `allow_host_sync` disarms the
scopes opened before it (the one legal wait, e.g. ``AsyncOutput.get``); a scope opened inside an
allow scope is armed again.  CUDA patches are installed once and consult the thread-local state;
the global sync-debug mode and warning hook are reference-counted and restored on the last exit.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from runnercheck.checks.detectors.base import ArmContext, BaseDetector, DetectorResult
from runnercheck.checks.detectors.sync_ops import WATCHED, mark_derived
from runnercheck.impl import device as device_layer

SYNC_CHECK_ENV = "RUNNERCHECK_SYNC_CHECK"
MODES = ("error", "count")
_CUDA_SYNC_WARNING = "synchronizing CUDA operation"


class HostSyncError(RuntimeError):
    """A host read of device data (or host wait) inside a `forbid_host_sync` scope."""

    def __init__(self, what: str, location: str):
        super().__init__(f"host sync in a forbidden scope: {what} at {location}")
        self.what = what
        self.location = location


@dataclass
class SyncReport:
    """Events (``(what, "file:line")``) recorded by one or more scopes; ``count`` is their number."""

    mode: str = "count"
    events: list[tuple[str, str]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.events)

    def summary(self) -> str:
        if not self.events:
            return "no host syncs"
        lines = [f"{self.count} host sync(s):"]
        for (what, loc), n in Counter(self.events).most_common():
            lines.append(f"  {n:>5} x {what} at {loc}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- thread-local state


class _AllowMarker:
    def __init__(self, name: str):
        self.name = name


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.stack: list[Any] = []  # SyncScope and _AllowMarker entries, innermost last
        self.num_scopes = 0
        self.trap: _ReadTrap | None = None
        self.suppress = 0  # >0 while running an op whose sync was already reported
        self.host_wait_key: tuple[int, int] | None = None


_state = _ThreadState()


def _armed_scopes() -> list["SyncScope"]:
    armed = []
    for entry in reversed(_state.stack):
        if isinstance(entry, _AllowMarker):
            break
        armed.append(entry)
    return armed


def host_sync_armed() -> bool:
    """True when a host sync on this thread would be reported now."""
    return bool(_armed_scopes()) and _state.suppress == 0


# --------------------------------------------------------------------------- locations


def _package_dir(module: Any) -> str:
    return os.path.dirname(os.path.realpath(module.__file__)) + os.sep


def _skipped_prefixes() -> tuple[tuple[str, ...], frozenset[str]]:
    import triton

    import runnercheck.checks as checks_package

    dirs = (_package_dir(torch), _package_dir(triton), _package_dir(checks_package))
    files = frozenset({os.path.realpath(device_layer.__file__), os.path.realpath(warnings.__file__),
                       os.path.realpath(functools.__file__)})
    return dirs, files


_SKIP_DIRS, _SKIP_FILES = _skipped_prefixes()
_skip_cache: dict[str, bool] = {}


def _is_skipped(filename: str) -> bool:
    hit = _skip_cache.get(filename)
    if hit is None:
        real = os.path.realpath(filename)
        hit = real in _SKIP_FILES or real.startswith(_SKIP_DIRS) or filename.startswith("<frozen")
        _skip_cache[filename] = hit
    return hit


def _offending_frame() -> Any:
    frame = sys._getframe(1)
    while frame is not None and _is_skipped(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def _describe(frame: Any) -> str:
    if frame is None:
        return "<unknown>"
    path = frame.f_code.co_filename
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            path = rel
    except ValueError:
        pass
    return f"{path}:{frame.f_lineno} (in {frame.f_code.co_name})"


# --------------------------------------------------------------------------- reporting


def _report(what: str, *, host_wait: bool = False) -> None:
    """Record ``what`` in every armed scope of this thread; raise if one of them is in error mode.

    A host wait through the device layer on cuda is followed by the CUDA wait it makes (patched or
    sync-debug trapped) from the same call instruction; ``host_wait_key`` counts that pair once.
    """
    scopes = _armed_scopes()
    if not scopes or _state.suppress:
        return
    frame = _offending_frame()
    key = (id(frame), frame.f_lasti) if frame is not None else None
    if not host_wait and key is not None and key == _state.host_wait_key:
        _state.host_wait_key = None
        return
    _state.host_wait_key = key if host_wait else None
    location = _describe(frame)
    for scope in scopes:
        scope.report.events.append((what, location))
    if any(scope.mode == "error" for scope in scopes):
        raise HostSyncError(what, location)


class _suppressed:
    """Run an op whose sync was already reported without reporting it again."""

    def __enter__(self) -> None:
        _state.suppress += 1

    def __exit__(self, *exc: object) -> None:
        _state.suppress -= 1


# --------------------------------------------------------------------------- the trap


class _ReadTrap(TorchFunctionMode):
    """Checks watched ops and marks CPU tensors computed from device data as device data."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        try:
            check = WATCHED.get(func)
        except TypeError:  # an unhashable callable is never one of ours
            check = None
        what = check(args, kwargs) if check is not None and host_sync_armed() else None
        if what is None:
            out = func(*args, **kwargs)
        else:
            _report(what)
            with _suppressed():
                out = func(*args, **kwargs)
        mark_derived(args, kwargs, out)
        return out


def _host_wait_hook(what: str) -> None:
    _report(f"{what} (host wait on the device)", host_wait=True)


# --------------------------------------------------------------------------- cuda machinery

_global_lock = threading.Lock()
_hook_users = 0
_cuda_users = 0
_cuda_saved: dict[str, Any] = {}
_cuda_patched = False


def _patch_cuda_waits() -> None:
    """Wrap the CUDA waits sync-debug mode misses.  Installed once; inert unless a thread is armed."""
    global _cuda_patched
    if _cuda_patched:
        return

    def wrap(owner: Any, name: str, what: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if host_sync_armed():
                _report(what)
                with _suppressed():
                    return original(*args, **kwargs)
            return original(*args, **kwargs)

        setattr(owner, name, guarded)

    wrap(torch.cuda, "synchronize", "torch.cuda.synchronize()")
    wrap(torch.cuda.Event, "synchronize", "torch.cuda.Event.synchronize()")
    wrap(torch.cuda.Stream, "synchronize", "torch.cuda.Stream.synchronize()")
    _cuda_patched = True


def _sync_warning_hook(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
    if _CUDA_SYNC_WARNING in str(message):
        if _armed_scopes():
            _report("synchronizing CUDA operation (torch sync-debug mode)")
            return
        if _cuda_saved.get("debug_mode", 0) == 0:
            return  # this thread is not armed and nobody else asked for these warnings
    _cuda_saved["showwarning"](message, category, filename, lineno, file, line)


def _arm_cuda() -> None:
    global _cuda_users
    with _global_lock:
        _cuda_users += 1
        if _cuda_users > 1:
            return
        _patch_cuda_waits()
        _cuda_saved["debug_mode"] = torch.cuda.get_sync_debug_mode()
        _cuda_saved["showwarning"] = warnings.showwarning
        warnings.filterwarnings("always", message=f".*{_CUDA_SYNC_WARNING}")
        _cuda_saved["filter"] = warnings.filters[0]
        warnings.showwarning = _sync_warning_hook
        with warnings.catch_warnings():  # "prototype feature" notice, once per process anyway
            warnings.simplefilter("ignore")
            torch.cuda.set_sync_debug_mode("warn")


def _disarm_cuda() -> None:
    global _cuda_users
    with _global_lock:
        _cuda_users -= 1
        if _cuda_users > 0:
            return
        torch.cuda.set_sync_debug_mode(_cuda_saved["debug_mode"])
        if warnings.showwarning is _sync_warning_hook:
            warnings.showwarning = _cuda_saved["showwarning"]
        if _cuda_saved["filter"] in warnings.filters:
            warnings.filters.remove(_cuda_saved["filter"])
            getattr(warnings, "_filters_mutated", lambda: None)()
        _cuda_saved.clear()


def _arm_hooks() -> None:
    global _hook_users
    with _global_lock:
        _hook_users += 1
        if _hook_users == 1:
            device_layer.HOST_WAIT_HOOKS.append(_host_wait_hook)


def _disarm_hooks() -> None:
    global _hook_users
    with _global_lock:
        _hook_users -= 1
        if _hook_users == 0 and _host_wait_hook in device_layer.HOST_WAIT_HOOKS:
            device_layer.HOST_WAIT_HOOKS.remove(_host_wait_hook)


# --------------------------------------------------------------------------- scopes


class SyncScope:
    """One `forbid_host_sync` scope; ``events``/``count`` are those of its report."""

    def __init__(self, device_kind: str | None, mode: str, report: SyncReport | None):
        if mode not in MODES:
            raise ValueError(f"forbid_host_sync mode must be one of {MODES}, got {mode!r}")
        if device_kind not in (None, *device_layer.DEVICE_KINDS):
            raise ValueError(f"device_kind must be None or one of {device_layer.DEVICE_KINDS}, got {device_kind!r}")
        if device_kind == "cuda" and not torch.cuda.is_available():
            raise ValueError("forbid_host_sync('cuda') asked for, but torch sees no CUDA device")
        self.device_kind = device_kind
        self.mode = mode
        self.report = report if report is not None else SyncReport(mode)
        self._uses_cuda = device_kind == "cuda" or (device_kind is None and torch.cuda.is_available())
        self._entered = False

    @property
    def events(self) -> list[tuple[str, str]]:
        return self.report.events

    @property
    def count(self) -> int:
        return self.report.count

    def __enter__(self) -> "SyncScope":
        if self._entered:
            raise RuntimeError("a forbid_host_sync scope cannot be entered twice")
        self._entered = True
        _arm_hooks()
        if self._uses_cuda:
            _arm_cuda()
        if _state.num_scopes == 0:
            _state.trap = _ReadTrap()
            _state.trap.__enter__()
        _state.num_scopes += 1
        _state.stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if not _state.stack or _state.stack[-1] is not self:
            raise RuntimeError("forbid_host_sync / allow_host_sync scopes exited out of order")
        _state.stack.pop()
        _state.num_scopes -= 1
        if _state.num_scopes == 0:
            trap, _state.trap = _state.trap, None
            trap.__exit__(None, None, None)
            _state.host_wait_key = None
        if self._uses_cuda:
            _disarm_cuda()
        _disarm_hooks()


def forbid_host_sync(device_kind: str | None = None, *, mode: str = "error", report: SyncReport | None = None) -> SyncScope:
    """A scope in which host reads of device data raise `HostSyncError` (``mode="error"``) or are
    recorded (``mode="count"``).

    ``device_kind`` None arms the CUDA machinery when a GPU is present; ``"cpu"``/``"sim"`` arm
    only the kind-independent traps.  Events are appended to ``report`` when given (several scopes
    can share one), else to a fresh one; the scope exposes ``count`` and ``events`` either way.
    """
    return SyncScope(device_kind, mode, report)


class allow_host_sync:
    """Named scope in which host waits/reads are legal (e.g. ``"AsyncOutput.get"``)."""

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise ValueError("allow_host_sync needs a non-empty name saying which wait is legal")
        self.name = name
        self._marker = _AllowMarker(name)

    def __enter__(self) -> "allow_host_sync":
        _state.stack.append(self._marker)
        return self

    def __exit__(self, *exc: object) -> None:
        if not _state.stack or _state.stack[-1] is not self._marker:
            raise RuntimeError("forbid_host_sync / allow_host_sync scopes exited out of order")
        _state.stack.pop()


# --------------------------------------------------------------------------- runners


def resolve_mode(mode: str | None) -> str:
    """``mode`` if given, else ``$RUNNERCHECK_SYNC_CHECK`` (unset or empty: ``"off"``)."""
    source = "mode" if mode is not None else SYNC_CHECK_ENV
    value = mode if mode is not None else os.environ.get(SYNC_CHECK_ENV, "off").strip().lower() or "off"
    if value not in (*MODES, "off"):
        raise ValueError(f"{source} must be one of error|count|off, got {value!r}")
    return value


class _GuardedOutput:
    """Stands in for an AsyncOutput whose ``get`` cannot be replaced in place."""

    def __init__(self, inner: Any, get: Callable[[], Any]):
        self._inner = inner
        self.get = get

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _allow_get(output: Any) -> Any:
    inner_get = output.get

    @functools.wraps(inner_get)
    def get(*args: Any, **kwargs: Any) -> Any:
        with allow_host_sync("AsyncOutput.get"):
            return inner_get(*args, **kwargs)

    try:
        output.get = get
        return output
    except (AttributeError, TypeError):
        return _GuardedOutput(output, get)


def arm_runner(runner: Any, mode: str | None = None) -> SyncReport:
    """Run every ``runner.execute_model`` call inside `forbid_host_sync`; its outputs' ``get`` is the
    allowed wait.  ``mode``: ``"error"``, ``"count"``, ``"off"`` or None (``$RUNNERCHECK_SYNC_CHECK``,
    default off).  Returns the report every call appends to (empty when off)."""
    resolved = resolve_mode(mode)
    report = SyncReport(resolved)
    if resolved == "off":
        return report
    original = runner.execute_model
    if getattr(original, "__runnercheck_sync_report__", None) is not None:
        raise ValueError("this runner is already armed by arm_runner")
    kind = getattr(getattr(runner, "device", None), "kind", None)
    kind = kind if kind in device_layer.DEVICE_KINDS else None

    @functools.wraps(original)
    def execute_model(sched: Any) -> Any:
        with forbid_host_sync(kind, mode=resolved, report=report):
            output = original(sched)
        return _allow_get(output)

    execute_model.__runnercheck_sync_report__ = report  # type: ignore[attr-defined]
    runner.execute_model = execute_model
    return report


# --------------------------------------------------------------------------- the registered detector


def counted_waits(runner: Any) -> int:
    """Host waits ``runner`` counts itself (back-pressure), as `runnercheck.impl.runner.ModelRunner` exposes them; 0 otherwise."""
    counters = (("state", "num_quarantine_waits"), ("staging", "num_backpressure_waits"), ("outputs", "num_backpressure_waits"))
    return sum(int(getattr(getattr(runner, owner, None), name, 0) or 0) for owner, name in counters)


def unaccounted_syncs_message(report: SyncReport, runner: Any) -> str | None:
    """None when every host sync in ``report`` is one of the runner's counted waits, else a description."""
    waits = counted_waits(runner)
    if report.count <= waits:
        return None
    return f"{report.count - waits} host sync(s) beyond the runner's {waits} counted back-pressure wait(s); {report.summary()}"


class _ArmedSync:
    """`arm_runner` in count mode on one runner; a host sync beyond its counted waits is a finding."""

    def __init__(self, runner: Any):
        self.runner = runner
        self.report = arm_runner(runner, "count")

    def disarm(self) -> None:
        pass  # the wrapper stays on the runner: a checked runner is discarded after its run

    def fired(self) -> str | None:
        return unaccounted_syncs_message(self.report, self.runner)

    def result(self) -> DetectorResult:
        waits = counted_waits(self.runner)
        beyond = max(0, self.report.count - waits)
        sites = [f"{n} x {what} at {where}" for (what, where), n in Counter(self.report.events).most_common(10)] if beyond else []
        return DetectorResult(checked=True, violations=beyond, lines=sites, extra={"counted_waits": waits})


class SyncDetector(BaseDetector):
    """Host reads of device data in ``execute_model``, beyond the runner's own counted back-pressure waits."""

    name = "sync"
    label = "host syncs in execute_model"
    noun = "host sync(s)"
    tag = "HOST SYNC"
    column = "syncs"

    def arm(self, runner: Any, context: ArmContext) -> _ArmedSync:
        return _ArmedSync(runner)

    def describe(self, result: DetectorResult) -> str:
        return f"{result.violations} beyond {result.extra.get('counted_waits', 0)} counted back-pressure wait(s)"

    def cell(self, result: DetectorResult) -> str:
        return f"{result.violations} ({result.extra.get('counted_waits', 0)} waits)"

    def total(self, results: list[DetectorResult]) -> str:
        waits = sum(int(r.extra.get("counted_waits", 0)) for r in results)
        return f"{sum(r.violations for r in results)} (plus {waits} counted back-pressure wait(s))"
