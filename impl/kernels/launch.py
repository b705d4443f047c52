"""Cheap Triton launches for kernels launched from the host every step (issue 14 item 2).

``kernel[grid](*args)`` goes through ``JITFunction.run`` each time: device and stream look-ups,
argument binding and specialization, the compile-cache key, then the compiled kernel's launcher.
Measured on the H200 host: ~70 µs per launch with triton 3.6.  `launch` does that work once per
*specialization key* and afterwards calls the compiled kernel's launcher directly.

Why it is right: the key of an argument list (`specialization_key`) is at least as fine as
Triton's own specialization -- the launch options it knows (``num_warps``, ``num_stages``, ``num_ctas``, ``maxnreg``: compile
options) by exact value (None and absent alike: Triton's default for each is None or is filled in from it), tensors by dtype and 16-byte alignment (Triton's only pointer
specialization), ints that the kernel marks ``do_not_specialize`` by their integer type (i32, i64,
u64: what Triton keys them on), every other value (other ints, floats, bools, constexprs) by its
exact value -- plus the device.  Equal keys therefore mean the compiled kernel Triton would pick
is the one it picked the first time, when the miss went through the normal path.  Over-fine keys
only cost misses.

The fast path is off (every call is ``kernel[grid](*args, **kwargs)``) under ``TRITON_INTERPRET=1``,
without CUDA, while Triton's launch hooks are set (profilers need ``launch_metadata``), when a
call passes a launch option other than those four or leaves parameters to their defaults, for values it cannot key,
when the compiled kernel lacks the launcher fields this code calls (checked once per kernel;
present in triton 3.6 and 3.9), and for good once a launcher rejects a call's arguments.
``RUNNERCHECK_SLOW_LAUNCH=1`` turns it off, for a comparison.

Ownership: this module owns the per-kernel caches (host; one `_KernelPlan` kept as an attribute of
each kernel object, living as long as the kernel; written only here, cleared when one holds
`MAX_KEYS` entries) and the process-wide launch counters.
"""
from __future__ import annotations

import os
from operator import attrgetter, itemgetter
from typing import Any, Callable, Sequence

import torch

from runnercheck.impl.device import triton_interpreted
from runnercheck.impl.hotpath import hot_path

MAX_KEYS = 64  # specialization keys kept per kernel (a kernel whose ints change every step misses, then clears)
_I32, _I64 = (-(2**31), 2**31 - 1), (-(2**63), 2**63 - 1)


class _KernelPlan:
    """What `launch` needs of one JITFunction: its parameter names and which it specializes (made once)."""

    def __init__(self, kernel: Any):
        params = kernel.params
        self.names = [p.name for p in params]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.loose_int = [bool(getattr(p, "do_not_specialize", False)) for p in params]
        self.loose_ptr = [bool(getattr(p, "do_not_specialize_on_alignment", False)) for p in params]
        self.compiled: dict[tuple, Any] = {}
        self.layouts: dict[tuple[type, ...], _ArgLayout] = {}  # by the types of an argument list (`specialization_key`)
        # False for a kernel the interpreter runs (TRITON_INTERPRET=1 when it was decorated: it has no
        # compiled launcher), and once a compiled kernel lacks the launcher fields.
        self.usable = not _interpreted_kernel(kernel)


def _interpreted_kernel(kernel: Any) -> bool:
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return triton_interpreted()
    return isinstance(kernel, InterpretedFunction)


_PLAN_ATTR = "_runnercheck_launch_plan"
_stats = {"fast": 0, "slow": 0}


def _hook_reader():
    """A function returning Triton's (launch enter, launch exit) hooks, resolved once; None if unknown."""
    try:
        from triton import knobs

        return lambda: (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    except (ImportError, AttributeError):  # triton releases before `knobs`: the hooks are CompiledKernel attributes
        try:
            from triton.compiler.compiler import CompiledKernel
        except ImportError:
            return None
        return lambda: (getattr(CompiledKernel, "launch_enter_hook", None), getattr(CompiledKernel, "launch_exit_hook", None))


_read_hooks: Any = False  # `_hook_reader()`, made on the first launch (False: not yet)
_cuda_available: bool | None = None  # torch.cuda.is_available(), asked once: it does not change in a process


def fast_path_enabled() -> bool:
    """Whether `launch` may skip ``JITFunction.run`` in this process (see the module docstring).

    The environment and the hooks are read on every call (tests and profilers change them); what
    cannot change in a process (CUDA present, where Triton keeps its hooks) is resolved once."""
    return not triton_interpreted() and _launch_gate_open()


def _launch_gate_open() -> bool:
    """`fast_path_enabled` less the interpreter check, which `launch` makes per kernel (`_KernelPlan.usable`):
    the kernel object, not the environment read on every launch (~1 us on an H200 host), says whether
    the interpreter runs it."""
    global _read_hooks, _cuda_available
    if os.environ.get("RUNNERCHECK_SLOW_LAUNCH") == "1":
        return False
    if _cuda_available is None:
        _cuda_available = torch.cuda.is_available()
    if not _cuda_available:
        return False
    if _read_hooks is False:
        _read_hooks = _hook_reader()
    if _read_hooks is None:
        return False
    # triton 3.4+ keeps each hook as a HookChain, empty (``calls == []``) unless a profiler added one.
    enter, exit_ = _read_hooks()
    return (enter is None or getattr(enter, "calls", None) == []) and (exit_ is None or getattr(exit_, "calls", None) == [])


def _loose_int_key(value: int) -> tuple:
    """A ``do_not_specialize`` int: only the integer type Triton passes it as."""
    return ("i32",) if _I32[0] <= value <= _I32[1] else ("i64",) if _I64[0] <= value <= _I64[1] else ("u64",)


def _positions(positions: list[int]) -> Callable[[Sequence[Any]], tuple]:
    """A function picking ``positions`` out of a sequence as a tuple (``itemgetter`` returns a bare value for one)."""
    if not positions:
        return lambda values: ()
    if len(positions) == 1:
        i = positions[0]
        return lambda values: (values[i],)
    return itemgetter(*positions)


class _ArgLayout:
    """Where the tensors, the loose ints and the other values sit in one kernel's argument lists whose
    element types are ``types`` (made once per types tuple, so a call keys its arguments in C-level passes)."""

    def __init__(self, plan: "_KernelPlan", types: tuple[type, ...]):
        tensors = [i for i, t in enumerate(types) if issubclass(t, torch.Tensor)]
        loose = [i for i, t in enumerate(types) if t is int and plan.loose_int[i]]
        values = [i for i in range(len(types)) if i not in tensors and i not in loose]
        self.tensors, self.loose, self.values = _positions(tensors), _positions(loose), _positions(values)
        # Triton specializes a pointer on 16-byte alignment unless told not to: mask 15, or 0 (always "aligned").
        self.align_masks = tuple(0 if plan.loose_ptr[i] else 15 for i in tensors)


_DTYPE = attrgetter("dtype")
_DATA_PTR = torch.Tensor.data_ptr


def specialization_key(plan: _KernelPlan, ordered: Sequence[Any], device_index: int) -> tuple:
    """The cache key of one argument list (in parameter order); raises TypeError for a value it cannot key.

    Every argument's exact type; tensors by dtype and whether they miss 16-byte alignment; ints the kernel
    marks ``do_not_specialize`` by their integer type; every other value by itself.  The per-position
    work is C-level passes over the list, in the positions `_ArgLayout` found for this types tuple."""
    types = tuple(map(type, ordered))
    layout = plan.layouts.get(types)
    if layout is None:
        if len(plan.layouts) >= MAX_KEYS:
            plan.layouts.clear()
        layout = plan.layouts[types] = _ArgLayout(plan, types)
    tensors = layout.tensors(ordered)
    key = (device_index, types, tuple(map(_DTYPE, tensors)),
           tuple(map(bool, map(int.__and__, map(_DATA_PTR, tensors), layout.align_masks))),
           tuple(map(_loose_int_key, layout.loose(ordered))), layout.values(ordered))
    hash(key)  # a value of an unhashable type cannot key: TypeError, and the caller falls back
    return key


def _plan_of(kernel: Any) -> _KernelPlan:
    # Kept on the kernel object itself: a cache keyed by id() could hand a freed kernel's plan to a new one.
    plan = getattr(kernel, _PLAN_ATTR, None)
    if plan is None:
        plan = _KernelPlan(kernel)
        setattr(kernel, _PLAN_ATTR, plan)
    return plan


# Launch options `launch` may key on: each picks compile options (part of Triton's own cache key), and a
# compiled kernel carries its own (in ``packed_metadata``), so a hit passes nothing more.  Any other
# option (``enable_fp_fusion``, ...) keeps the normal path.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def _ordered(plan: _KernelPlan, args: tuple, kwargs: dict) -> list | None:
    """Every parameter's value in parameter order, or None (defaults left out, unknown launch options, unknown names).

    The known launch options (`LAUNCH_OPTIONS`) are not parameters; `_options` keys them."""
    options = 0
    for name in LAUNCH_OPTIONS:
        if name in kwargs:
            options += 1
    if len(args) + len(kwargs) - options != len(plan.names):
        return None
    ordered = list(args)
    for name in plan.names[len(args):]:
        if name not in kwargs:
            return None
        ordered.append(kwargs[name])
    return ordered


def _options(kwargs: dict) -> tuple:
    """The known launch options of a call, by exact value, in a fixed order (absent ones as None)."""
    return tuple(kwargs.get(name) for name in LAUNCH_OPTIONS) if kwargs else _NO_OPTIONS


_NO_OPTIONS = (None,) * len(LAUNCH_OPTIONS)


def call_key(plan: _KernelPlan, ordered: Sequence[Any], device_index: int, kwargs: dict) -> tuple:
    """The cache key of one call: its arguments' `specialization_key` and its known launch options;
    raises TypeError for a value or an option that cannot key."""
    key = specialization_key(plan, ordered, device_index) + _options(kwargs)
    hash(key)  # an option of an unhashable type cannot key
    return key


@hot_path
def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """``kernel[grid](*args, **kwargs)``, through the compiled kernel's launcher once its key was seen."""
    if not _launch_gate_open():
        _stats["slow"] += 1
        kernel[grid](*args, **kwargs)
        return
    plan = _plan_of(kernel)
    ordered = _ordered(plan, args, kwargs) if plan.usable else None
    key = None
    if ordered is not None:
        try:
            # The current device without `torch.cuda.current_device`'s Python wrapper: a compiled kernel exists
            # (below) only after a launch through Triton, which initialised CUDA.
            key = call_key(plan, ordered, torch._C._cuda_getDevice(), kwargs)
        except TypeError:
            key = None
    compiled = plan.compiled.get(key) if key is not None else None
    if compiled is None:
        _stats["slow"] += 1
        compiled = kernel[grid](*args, **kwargs)  # compiles or looks up, and launches
        if key is not None and compiled is not None:
            if not all(hasattr(compiled, f) for f in ("run", "function", "packed_metadata")):
                plan.usable = False
                return
            if len(plan.compiled) >= MAX_KEYS:
                plan.compiled.clear()
            plan.compiled[key] = compiled
        return
    g0, g1, g2 = grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1
    stream = torch._C._cuda_getCurrentRawStream(key[0])  # the current stream: a capture stream inside a graph capture
    # Triton's launcher signature (3.6 and 3.9): grid, stream, function, packed metadata, launch metadata
    # (None: no hooks, checked above), the enter/exit hooks, then every argument in parameter order.
    try:
        compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None, *ordered)
    except TypeError:
        # The launcher parses its arguments before launching: a signature this code does not know
        # launched nothing.  Use the normal path for this kernel from now on.
        plan.usable = False
        _stats["slow"] += 1
        kernel[grid](*args, **kwargs)
        return
    _stats["fast"] += 1


def cdiv(a: int, b: int) -> int:
    """``triton.cdiv`` for host ints: that one is a constexpr function, ~1 us a call on the host."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` for host ints >= 0 (the same values: 0 -> 0, 1 -> 1, 5 -> 8), without its
    constexpr-function call overhead."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def launch_stats() -> dict[str, int]:
    """Launches taken by the fast path and by the normal one since the process started (a copy)."""
    return dict(_stats)


__all__ = ["LAUNCH_OPTIONS", "MAX_KEYS", "call_key", "cdiv", "fast_path_enabled", "launch", "next_power_of_2", "launch_stats", "specialization_key"]
