"""Bounds-checked memory for interpreted Triton kernels: an access outside the launch's tensors is a
`KernelMemoryError`, not a dead process.

Under ``TRITON_INTERPRET=1`` Triton runs a kernel's loads and stores as numpy calls that dereference
the raw addresses the kernel computed.  A kernel that indexes with garbage (a planted bug: stale
staging bytes read as row indices) reads or writes wherever the address points, and the process
dies of SIGSEGV before any detector of ours can report -- on a GPU the same bug is an illegal
memory access.  `check_interpreted_memory` makes every interpreted load, store and atomic check,
for each active lane (mask on), that the bytes it touches lie inside one tensor argument of the
running launch (from its first element to one past its last, as its shape and strides lay it out),
or inside memory reachable through one (`reachable_through`: the lane copies dereference pinned
buffers whose addresses a table argument holds).  Otherwise it raises `KernelMemoryError` naming the
kernel, the operation, the first offending address, the kernel line, and the nearest argument, with
how far outside it the address lies.  Only a *checked* access is a memory error: whatever lies
between two tensors of the launch (another tensor of the process, an allocator's slack) is refused
too, so a bug that would read a neighbour's bytes without crashing is caught as well.

The checks are vectorised numpy over the lanes: the active addresses' minimum and maximum, one
bisection into the launch's sorted extents (the common case: every lane inside one tensor), and only
on a miss a per-lane ``searchsorted``.  Measured overhead: see docs/CONFIGURATION.md.

Wrapped parts of ``triton.runtime.interpreter`` (checked by `memory_layout_known`, present in triton
3.6 and 3.9): ``GridExecutor.__call__`` (a launch: its extents are pushed and popped, and a
`KernelMemoryError` that Triton wrapped in its ``InterpreterError`` is raised as itself),
``GridExecutor._init_args_hst`` (the host-side arguments the launch runs on: their extents), and
``InterpreterBuilder``'s ``create_masked_load``/``create_masked_store`` (every load and store,
unmasked, tensor-descriptor and atomic load/store ones included: they go through these two) and
``create_atomic_rmw``/``create_atomic_cas``.

Installed, like `runnercheck.impl.kernels.interpreter.speed_up_interpreter`, by whoever turns the
interpreter on for a process (`runnercheck.stress.pytest_plugin`, `runnercheck.stress.cli.main`, the
test suite's conftest) and by the memory detector when it arms on an interpreted run
(`runnercheck.checks.detectors.memory`); a no-op on a GPU (no interpreter), under
``RUNNERCHECK_UNCHECKED_MEMORY=1`` (for a comparison), and on a Triton whose interpreter lacks the
parts it wraps (it logs why and leaves Triton as it is).

Before raising, every function in `MEMORY_FAULT_HOOKS` is called with the error (the memory detector
counts faults there, so a runner that swallows the exception still fails its run).

Ownership: this module owns the per-thread stack of running launches' extents (host; pushed and
popped only by the wrapped launch, filled by the wrapped argument copy) and the reachable-memory
table (weak references: an entry dies with its table tensor).
"""
from __future__ import annotations

import bisect
import inspect
import logging
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from runnercheck.impl.kernels.interpreter import interpreter_to_patch

log = logging.getLogger(__name__)

_INSTALLED_ATTR = "_runnercheck_memory_checked"
OFF_ENV = "RUNNERCHECK_UNCHECKED_MEMORY"

_MIN, _MAX, _UINT64_MAX = np.minimum.reduce, np.maximum.reduce, np.uint64(2**64 - 1)

MEMORY_FAULT_HOOKS: list[Callable[["KernelMemoryError"], None]] = []
# The first fault raised since the last `claim_fault` (host, this process; any thread raises, the harness claims):
# a runner may catch the error, or fail later on its consequence (a result a faulted launch never wrote).
_UNCLAIMED: list["KernelMemoryError"] = []


def claim_fault() -> "KernelMemoryError | None":
    """The first `KernelMemoryError` raised since the previous claim (None if none), forgetting it."""
    return _UNCLAIMED.pop() if _UNCLAIMED else None


class KernelMemoryError(RuntimeError):
    """An interpreted kernel touched memory outside every tensor of its launch.

    ``kernel``: the kernel's name; ``operation``: load, store, atomic_rmw or atomic_cas; ``address``:
    the first offending lane's address; ``nbytes``: the element size; ``lanes``: offending lanes of
    the operation (of ``active`` lanes); ``nearest``: the nearest argument's description (None: the
    launch has no tensor argument); ``where``: ``file:line`` of the kernel code (None if unknown)."""

    def __init__(self, kernel: str, operation: str, address: int, nbytes: int, lanes: int, active: int,
                 nearest: str | None, where: str | None = None):
        self.kernel, self.operation, self.address, self.nbytes = kernel, operation, address, nbytes
        self.lanes, self.active, self.nearest, self.where = lanes, active, nearest, where
        at = f" at {where}" if where else ""
        near = f"; nearest: {nearest}" if nearest else "; the launch has no tensor argument"
        super().__init__(f"kernel {kernel}{at}: {operation} of {nbytes} byte(s) at {address:#x} outside every tensor "
                         f"argument ({lanes} of {active} active lane(s)){near}")

    def __reduce__(self) -> tuple:  # picklable with its fields (it crosses the isolated run's pipe inside findings)
        return (type(self), (self.kernel, self.operation, self.address, self.nbytes, self.lanes, self.active,
                             self.nearest, self.where))


# --------------------------------------------------------------------------- extents


@dataclass(frozen=True)
class Extent:
    """Bytes ``[start, end)`` a launch may touch, and what they are (for the error's "nearest")."""

    start: int
    end: int
    what: str

    def distance(self, address: int) -> tuple[int, str]:
        """(how far ``address`` lies from these bytes, a phrase saying where it lies)."""
        if address < self.start:
            return self.start - address, f"{self.what}, {self.start - address} byte(s) before its start"
        return max(0, address - self.end + 1), f"{self.what}, at byte offset {address - self.start} of its {self.end - self.start}"


def tensor_extent(t: Any, label: str) -> Extent | None:
    """The bytes a tensor's elements occupy, described as ``label`` (None for an empty tensor: a kernel may
    touch none of it)."""
    numel = t.numel()
    if numel == 0:
        return None
    itemsize = t.element_size()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 0)
    start = t.data_ptr()
    dtype = str(t.dtype).replace("torch.", "")
    return Extent(start, start + (last + 1) * itemsize, f"{label} ({dtype}{list(t.shape)} at {start:#x})")


_reachable: dict[int, tuple[weakref.ref, list[weakref.ref]]] = {}  # table's data_ptr -> (table, the buffers)


def reachable_through(table: Any, buffers: Sequence[Any]) -> None:
    """Declare that a kernel given ``table`` may dereference ``buffers`` (their addresses are in it): a
    launch with ``table`` among its arguments may touch them.  Kept while ``table`` lives."""
    key = table.data_ptr()
    _reachable[key] = (weakref.ref(table), [weakref.ref(b) for b in buffers])
    weakref.finalize(table, _reachable.pop, key, None)


def _reachable_extents(t: Any, name: str) -> list[Extent]:
    entry = _reachable.get(t.data_ptr())
    if entry is None or entry[0]() is None:
        return []
    buffers = [(i, ref()) for i, ref in enumerate(entry[1])]
    extents = [tensor_extent(b, f"buffer {i} reachable through argument {name!r}") for i, b in buffers if b is not None]
    return [e for e in extents if e is not None]


@dataclass
class _Launch:
    """One running launch: its kernel's name and the extents of its arguments, sorted by start and merged."""

    kernel: str
    extents: list[Extent] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    np_starts: np.ndarray | None = None
    np_ends: np.ndarray | None = None

    def set_extents(self, extents: Iterable[Extent]) -> None:
        self.extents = sorted(extents, key=lambda e: e.start)
        merged: list[list[int]] = []  # overlapping views of one buffer: one extent
        for e in self.extents:
            if merged and e.start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e.end)
            else:
                merged.append([e.start, e.end])
        self.starts = [m[0] for m in merged]
        self.ends = [m[1] for m in merged]
        self.np_starts = np.array(self.starts, dtype=np.uint64)
        self.np_ends = np.array(self.ends, dtype=np.uint64)


_local = threading.local()


def _stack() -> list[_Launch]:
    return _local.__dict__.setdefault("stack", [])


def _argument_extents(value: Any, name: str, out: list[Extent]) -> None:
    if not isinstance(value, torch.Tensor):
        if isinstance(value, tuple):
            for i, v in enumerate(value):
                _argument_extents(v, f"{name}[{i}]", out)
            return
        value = getattr(value, "base", None)  # a TensorWrapper (a reinterpreting view) or a TensorDescriptor
        if not isinstance(value, torch.Tensor):
            return
    extent = tensor_extent(value, f"argument {name!r}")
    if extent is not None:
        out.append(extent)
    out.extend(_reachable_extents(value, name))


# --------------------------------------------------------------------------- the check


def _where() -> str | None:
    """``file:line`` of the kernel code that made the access: the innermost frame outside Triton and this module
    (the interpreter runs a rewritten kernel, or a nested jit function, under its own file's name and lines)."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if f"{os.sep}triton{os.sep}" not in filename and filename != __file__:
            return f"{os.path.basename(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def check_access(addresses: np.ndarray, mask: np.ndarray | None, nbytes: int, operation: str) -> None:
    """Raise `KernelMemoryError` if an active lane of ``addresses`` (uint64) touches bytes outside the running
    launch's extents; a no-op outside a launch."""
    stack = _stack()
    if not stack:
        return
    launch = stack[-1]
    if mask is None:
        lo, hi = int(_MIN(addresses, axis=None)), int(_MAX(addresses, axis=None))
    else:
        if mask.shape != addresses.shape:
            mask = np.broadcast_to(mask, addresses.shape)
        # One pass each, no copy of the active lanes: masked-off lanes count as +inf / 0.
        lo, hi = int(_MIN(addresses, axis=None, where=mask, initial=_UINT64_MAX)), int(_MAX(addresses, axis=None, where=mask, initial=0))
        if lo > hi:
            return  # no active lane
    i = bisect.bisect_right(launch.starts, lo) - 1
    if i >= 0 and hi + nbytes <= launch.ends[i]:
        return  # every lane inside one extent: the common case
    _fault(launch, addresses.ravel() if mask is None else addresses[mask], nbytes, operation)


def _fault(launch: _Launch, active: np.ndarray, nbytes: int, operation: str) -> None:
    index = np.searchsorted(launch.np_starts, active, side="right").astype(np.int64) - 1
    inside = index >= 0
    ends = launch.np_ends[np.maximum(index, 0)] if launch.ends else np.zeros_like(active)
    inside &= active <= ends - np.uint64(nbytes)  # not ``active + nbytes``: an address near 2**64 would wrap
    bad = active[~inside]
    if bad.size == 0:
        return
    address = int(bad[0])
    nearest = min((e.distance(address) for e in launch.extents), default=(0, None))[1]
    error = KernelMemoryError(launch.kernel, operation, address, nbytes, int(bad.size), int(active.size), nearest,
                              _where())
    if not _UNCLAIMED:
        _UNCLAIMED.append(error)
    for hook in list(MEMORY_FAULT_HOOKS):
        hook(error)
    raise error


def _element_bytes(handle: Any) -> int:
    return max(1, handle.get_element_ty().primitive_bitwidth // 8)


# --------------------------------------------------------------------------- installing it


def _code(fn: Any) -> Any:
    """The code object of ``fn`` under any wrappers (`speed_up_interpreter` wraps the launch too)."""
    return getattr(inspect.unwrap(fn), "__code__", None) if fn is not None else None


def memory_layout_known(interpreter: Any) -> bool:
    """Whether ``interpreter`` (``triton.runtime.interpreter``) has the parts `check_interpreted_memory` wraps,
    with the parameters it passes on: the builder's masked load/store and atomics, and a launch class whose
    call copies its arguments to the host through ``_init_args_hst(args, kwargs)``."""
    builder, launch = getattr(interpreter, "InterpreterBuilder", None), getattr(interpreter, "GridExecutor", None)
    wanted = {"create_masked_load": 6, "create_masked_store": 5, "create_atomic_rmw": 7, "create_atomic_cas": 6}
    for name, argcount in wanted.items():
        code = _code(getattr(builder, name, None))
        if code is None or code.co_argcount != argcount:
            return False
    init_args, call = _code(getattr(launch, "_init_args_hst", None)), _code(getattr(launch, "__call__", None))
    return init_args is not None and init_args.co_argcount == 3 and call is not None and "_init_args_hst" in call.co_names


def _unwrapped(error: BaseException) -> KernelMemoryError | None:
    """The `KernelMemoryError` Triton wrapped (``InterpreterError(repr(e)) from e``, once per nested call)."""
    seen = 0
    while error is not None and seen < 64:
        if isinstance(error, KernelMemoryError):
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def check_interpreted_memory() -> bool:
    """Install the bounds checks into Triton's interpreter; True when in place (module docstring).

    Idempotent.  False (and Triton untouched) when kernels are not interpreted in this process, under
    ``RUNNERCHECK_UNCHECKED_MEMORY=1``, or when the interpreter's layout is not the one this wraps."""
    interpreter, installed = interpreter_to_patch(OFF_ENV, _INSTALLED_ATTR, memory_layout_known,
                                                  "its memory accesses run")
    if interpreter is None or installed:
        return installed
    builder, launch_cls = interpreter.InterpreterBuilder, interpreter.GridExecutor
    run_launch, init_args = launch_cls.__call__, launch_cls._init_args_hst
    masked_load, masked_store = builder.create_masked_load, builder.create_masked_store
    atomic_rmw, atomic_cas = builder.create_atomic_rmw, builder.create_atomic_cas

    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        stack = _stack()
        stack.append(_Launch(getattr(self.fn, "__name__", "?")))
        try:
            return run_launch(self, *args, **kwargs)
        except Exception as e:
            fault = _unwrapped(e)
            if fault is not None and fault is not e:
                raise fault from None
            raise
        finally:
            stack.pop()

    def init_args_hst(self: Any, args_dev: Any, kwargs: Any) -> Any:
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        stack = _stack()
        if stack:
            extents: list[Extent] = []
            names = list(getattr(self, "arg_names", ()))
            for i, value in enumerate(args_hst):
                _argument_extents(value, names[i] if i < len(names) else f"#{i}", extents)
            for name, value in kwargs_hst.items():
                _argument_extents(value, name, extents)
            stack[-1].set_extents(extents)
        return args_hst, kwargs_hst

    def create_masked_load(self: Any, ptrs: Any, mask: Any, other: Any, cache_policy: Any, is_volatile: Any) -> Any:
        check_access(ptrs.data, mask.data, _element_bytes(ptrs), "load")
        return masked_load(self, ptrs, mask, other, cache_policy, is_volatile)

    def create_masked_store(self: Any, ptrs: Any, value: Any, mask: Any, cache_policy: Any) -> Any:
        check_access(ptrs.data, mask.data, _element_bytes(ptrs), "store")
        return masked_store(self, ptrs, value, mask, cache_policy)

    def create_atomic_rmw(self: Any, rmw_op: Any, ptr: Any, val: Any, mask: Any, sem: Any, scope: Any) -> Any:
        check_access(ptr.data, mask.data, _element_bytes(ptr), "atomic_rmw")
        return atomic_rmw(self, rmw_op, ptr, val, mask, sem, scope)

    def create_atomic_cas(self: Any, ptr: Any, cmp: Any, val: Any, sem: Any, scope: Any) -> Any:
        check_access(ptr.data, None, _element_bytes(ptr), "atomic_cas")
        return atomic_cas(self, ptr, cmp, val, sem, scope)

    for wrapper, original in ((launch, run_launch), (init_args_hst, init_args), (create_masked_load, masked_load),
                              (create_masked_store, masked_store), (create_atomic_rmw, atomic_rmw),
                              (create_atomic_cas, atomic_cas)):
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    launch_cls.__call__ = launch
    launch_cls._init_args_hst = init_args_hst
    builder.create_masked_load = create_masked_load
    builder.create_masked_store = create_masked_store
    builder.create_atomic_rmw = create_atomic_rmw
    builder.create_atomic_cas = create_atomic_cas
    setattr(interpreter, _INSTALLED_ATTR, True)
    return True


__all__ = ["Extent", "KernelMemoryError", "MEMORY_FAULT_HOOKS", "OFF_ENV", "check_access", "check_interpreted_memory", "claim_fault",
           "memory_layout_known", "reachable_through", "tensor_extent"]
