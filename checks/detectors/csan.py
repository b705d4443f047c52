"""PyTorch's CUDA stream sanitizer (CSAN, ``torch.cuda._sanitizer``) as a detector: races become findings.

CSAN watches every ATen op through a ``TorchDispatchMode`` and the CUDA trace hooks (event
record/wait, stream and device synchronizations, allocations).  When an op touches a tensor whose
previous access happened on another stream with no ordering between the two, CSAN *prints* each
`UnsynchronizedAccessError` to stderr and then *raises* ``CUDASanitizerErrors`` from the offending
op -- after the op ran (``torch/cuda/_sanitizer.py``, ``CUDASanitizerDispatchMode.__torch_dispatch__``).
Raised from inside the runner, that would abandon a step half done and surface as a runner crash.
So the harness arms a `CsanMonitor` instead: count mode, like the sync detector's.  It wraps the
event handler's ``_handle_kernel_launch`` so each race is recorded as a `CsanRace` (plain,
picklable host data: it crosses the isolated-run process boundary) and the op returns normally.
CSAN keeps tracking after a race, so later races are recorded too.

What CSAN sees: ATen ops only.  A Triton kernel launch is invisible to it (no dispatch), so a
race in which both sides are Triton kernels is not reported; a race where either side is an ATen
op (a copy, a fill, a matmul) is.

Lifetime: `enable` turns CSAN on once per process and it stays on (torch ties the mode to the
application's lifetime, and tracking must see the writes before the reads: enable before the
runner is built).  A monitor is armed and disarmed per run; arming nests (last armed records).
"""
from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from runnercheck.checks.detectors.base import ArmContext, BaseDetector, DetectorResult

_log = logging.getLogger(__name__)
_THIS_FILE = os.path.abspath(__file__).replace(os.sep, "/")  # its own frames (the recording wrapper) are no site

CHECK_NAME = "csan"
NEEDS_CUDA = "--csan needs --device cuda"
MAX_RECORDED = 20  # races kept in full per run; the rest are counted
_MAX_TEXT = 6000  # characters of CSAN's own message kept per race


class CsanUnavailableError(RuntimeError):
    """This torch has no CUDA sanitizer in the form the monitor hooks (or no CUDA device)."""


def enabled() -> bool:
    """Whether CSAN is on in this process (``enable``, ``TORCH_CUDA_SANITIZER=1`` or the pytest option)."""
    try:
        from torch.cuda import _sanitizer
    except ImportError:
        return False
    return bool(getattr(getattr(_sanitizer, "cuda_sanitizer", None), "enabled", False))


def _event_handler() -> Any:
    from torch.cuda import _sanitizer

    sanitizer = getattr(_sanitizer, "cuda_sanitizer", None)
    handler = getattr(getattr(sanitizer, "dispatch", None), "event_handler", None)
    if handler is None or not callable(getattr(handler, "_handle_kernel_launch", None)):
        import torch

        raise CsanUnavailableError(f"torch {torch.__version__}: torch.cuda._sanitizer has no event handler to record races from")
    return handler


def enable() -> None:
    """Turn CSAN on for this process (idempotent); `CsanUnavailableError` when it cannot be."""
    import torch

    if not torch.cuda.is_available():
        raise CsanUnavailableError(NEEDS_CUDA + ": torch sees no CUDA device")
    _event_handler()  # fail before enabling a sanitizer the monitor cannot read
    if not enabled():
        from torch.cuda import _sanitizer

        _sanitizer.enable_cuda_sanitizer()
        _log.info("CUDA stream sanitizer enabled")


# --------------------------------------------------------------------------- reports


def _site(stack: Any) -> str:
    """The innermost frame of ``stack`` outside torch: where in the runner (or the test) the access was made."""
    frames = list(stack or ())
    for frame in reversed(frames):
        name = frame.filename.replace(os.sep, "/")
        if "/torch/" not in name and name != _THIS_FILE and "/site-packages/" not in name:
            return f"{_short_path(frame.filename)}:{frame.lineno} in {frame.name}"
    return f"{_short_path(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name}" if frames else "?"


def _short_path(path: str) -> str:
    cwd = os.getcwd() + os.sep
    return path[len(cwd):] if path.startswith(cwd) else path


def _op(operator: Any) -> str:
    return str(operator).split("(", 1)[0]


@dataclass(frozen=True)
class CsanRace:
    """One unsynchronized access pair CSAN reported (what its printed message names, condensed)."""

    data_ptr: int
    access: str  # "reading from" / "writing to"
    operator: str
    stream: int
    site: str
    previous_access: str
    previous_operator: str
    previous_stream: int
    previous_site: str
    allocated_at: str
    text: str  # CSAN's own message (with both stack traces), truncated

    def line(self) -> str:
        return (f"tensor {self.data_ptr:#x} (allocated at {self.allocated_at}): {self.access} it in {self.operator} on "
                f"stream {self.stream} at {self.site}, unordered after {self.previous_access} it in "
                f"{self.previous_operator} on stream {self.previous_stream} at {self.previous_site}")

    def to_dict(self) -> dict:
        return dict(asdict(self), line=self.line())


def race_from_error(error: Any) -> CsanRace:
    """A `CsanRace` from one of CSAN's ``UnsynchronizedAccessError`` (any object with its fields)."""
    current, previous = error.current_access, error.previous_access
    allocation = getattr(error, "allocation_stack_trace", None)
    try:
        text = str(error)
    except Exception as e:  # a report that cannot format itself is still a race
        text = f"(CSAN's message could not be formatted: {type(e).__name__}: {e})"
    return CsanRace(
        data_ptr=int(error.data_ptr), access=str(current.type), operator=_op(current.operator), stream=int(current.stream),
        site=_site(current.stack_trace), previous_access=str(previous.type), previous_operator=_op(previous.operator),
        previous_stream=int(previous.stream), previous_site=_site(previous.stack_trace),
        allocated_at=_site(allocation) if allocation else "unknown (allocated before CSAN was enabled)",
        text=text[:_MAX_TEXT],
    )


class CsanMonitor:
    """Count-mode CSAN: every race reported while armed is recorded (`races`, `count`), none is raised."""

    def __init__(self, limit: int = MAX_RECORDED):
        self.limit = limit
        self.races: list[CsanRace] = []
        self.count = 0
        self._handler: Any = None
        self._shadowed: Any = None
        self._had_instance_attr = False

    @property
    def armed(self) -> bool:
        return self._handler is not None

    def record(self, errors: Iterable[Any]) -> None:
        """The report path: CSAN's errors of one op (also what a test injects)."""
        for error in errors:
            if not hasattr(error, "current_access"):  # another kind of SynchronizationError: keep its text
                _log.warning("CSAN reported %s: %s", type(error).__name__, error)
                continue
            self.count += 1
            if len(self.races) < self.limit:
                race = race_from_error(error)
                self.races.append(race)
                _log.warning("CSAN race: %s", race.line())

    def arm(self) -> "CsanMonitor":
        """Enable CSAN (if off) and record its reports instead of letting them raise."""
        if not self.armed:
            enable()
            self._attach(_event_handler())
        return self

    def _attach(self, handler: Any) -> None:
        """Shadow ``handler._handle_kernel_launch`` (CSAN's race check per op) with a recording one."""
        self._had_instance_attr = "_handle_kernel_launch" in vars(handler)
        self._shadowed = handler._handle_kernel_launch
        shadowed, record = self._shadowed, self.record

        def recording_kernel_launch(*args: Any, **kwargs: Any) -> list:
            errors = shadowed(*args, **kwargs)
            if errors:
                record(errors)
            return []  # CSAN raises only when this list is non-empty

        handler._handle_kernel_launch = recording_kernel_launch
        self._handler = handler

    def disarm(self) -> None:
        """Stop recording; CSAN stays on (raising again unless an outer monitor records)."""
        if self._handler is None:
            return
        if self._had_instance_attr:
            self._handler._handle_kernel_launch = self._shadowed
        else:
            del self._handler._handle_kernel_launch
        self._handler = None

    def lines(self, limit: int = 10) -> list[str]:
        return [r.line() for r in self.races[:limit]]

    def to_dicts(self) -> list[dict]:
        return [r.to_dict() for r in self.races]

    def summary(self) -> str | None:
        """None when clean, else one line: how many races and the first."""
        if not self.count:
            return None
        return f"{self.count} unsynchronized access(es) between streams; first: {self.races[0].line()}"


# --------------------------------------------------------------------------- the registered detector


class _ArmedCsan:
    """The run's `CsanMonitor` read as a detector.  The monitor was armed before the runner was
    built and is disarmed by whoever armed it (the run owner, after the results are read)."""

    def __init__(self, monitor: CsanMonitor):
        self.monitor = monitor

    def disarm(self) -> None:
        pass  # the monitor outlives the detectors: device work drained after them may still race

    def fired(self) -> str | None:
        return self.monitor.summary()

    def result(self) -> DetectorResult:
        m = self.monitor
        return DetectorResult(checked=True, violations=m.count, lines=m.lines(),
                              extra={"reports": [r.text for r in m.races[:3]]})


class CsanDetector(BaseDetector):
    """CUDA stream races CSAN reports (runs under ``--csan`` only: the context carries the monitor)."""

    name = CHECK_NAME
    label = "csan races"
    noun = "csan race(s)"
    tag = "CSAN"
    column = "csan"

    def arm(self, runner: Any, context: ArmContext) -> _ArmedCsan | None:
        return _ArmedCsan(context.csan) if context.csan is not None else None

    def describe(self, result: DetectorResult) -> str:
        return str(result.violations) + "".join(f"\n{line}" for line in result.lines[:3])

    def details(self, result: DetectorResult) -> list[str]:
        return list(result.extra.get("reports", []))


__all__ = ["CHECK_NAME", "NEEDS_CUDA", "CsanDetector", "CsanMonitor", "CsanRace", "CsanUnavailableError", "enable", "enabled",
           "race_from_error"]
