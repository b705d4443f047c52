"""The catalogue `runnercheck.checks.detectors.sync` traps: which torch calls count as a host read of device data, an op
whose output shape depends on device data, or a copy CUDA makes synchronous -- and which tensors
count as device data at all.

`WATCHED` maps a torch function or ``Tensor`` method to a check ``(args, kwargs) -> str | None``
that names the offence (or returns None when this call is fine); `runnercheck.checks.detectors.sync`'s
``TorchFunctionMode`` consults it on an armed thread only.  The list of what is trapped, and why
device work on cpu/sim is exempt, is in `runnercheck.checks.detectors.sync`'s docstring.

Device data is `runnercheck.impl.device.is_device_memory` plus, on cpu/sim, tensors computed from it or by
device work (`mark_derived` registers them; `is_device_data` asks).  The registry is owned by this
module, lives on the host, holds weak references keyed by storage pointer (an entry dies with its
tensor) and is written only by `mark_derived`, under a lock.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable, Iterable, Iterator

import torch

from runnercheck.impl import device as device_layer

# --------------------------------------------------------------------------- device data

# On cpu/sim only tensors a `Device` allocated are registered as device memory; a tensor computed
# from them (``x > 0``, ``x.sum()``) or by device work is device data too, so the trap registers it
# here (weakly, by storage, like `runnercheck.impl.device` does).
_derived_lock = threading.Lock()
_derived: dict[int, weakref.ref] = {}


def is_device_data(t: object) -> bool:
    """Device memory (`runnercheck.impl.device.is_device_memory`) or a CPU tensor `mark_derived` registered."""
    if device_layer.is_device_memory(t):
        return True
    if not isinstance(t, torch.Tensor):
        return False
    ref = _derived.get(t.untyped_storage().data_ptr())
    return ref is not None and ref() is not None


def _tensors_in(values: Iterable[object]) -> Iterator[torch.Tensor]:
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (x for x in v if isinstance(x, torch.Tensor))


def mark_derived(args: tuple, kwargs: dict, out: object) -> None:
    """Register the CPU outputs of a torch call as device data when it read device data or ran as
    device work (outputs sharing an input's storage, and pinned staging, keep their own status)."""
    outputs = [t for t in _tensors_in((out,)) if not t.is_cuda]
    if not outputs:
        return
    inputs = list(_tensors_in((*args, *kwargs.values())))
    if not device_layer.device_work_active() and not any(is_device_data(t) for t in inputs):
        return
    input_storages = {t.untyped_storage().data_ptr() for t in inputs}
    for t in outputs:
        ptr = t.untyped_storage().data_ptr()
        if ptr == 0 or ptr in input_storages or device_layer.is_pinned_memory(t):
            continue
        with _derived_lock:
            if len(_derived) > 4096:
                for key in [k for k, ref in _derived.items() if ref() is None]:
                    del _derived[key]
            _derived[ptr] = weakref.ref(t)


# --------------------------------------------------------------------------- watched ops


def _is_device_side(t: object) -> bool:
    """Device memory the host may not read now (a CPU stand-in read by device work is fine)."""
    if not is_device_data(t):
        return False
    return t.is_cuda or not device_layer.device_work_active()  # type: ignore[union-attr]


def _is_dense(t: torch.Tensor) -> bool:
    expected = 1
    for size, stride in sorted(((s, st) for s, st in zip(t.shape, t.stride()) if s != 1), key=lambda p: p[1]):
        if size == 0:
            return True
        if stride != expected:
            return False
        expected *= size
    return True


def _async_safe_host(t: torch.Tensor) -> bool:
    return device_layer.is_pinned_memory(t) and _is_dense(t)


def _reads_self(label: str) -> Callable:
    return lambda args, kwargs: f"{label} on device memory" if args and _is_device_side(args[0]) else None


def _reads_any(label: str) -> Callable:
    def check(args: tuple, kwargs: dict) -> str | None:
        values = (*args, *kwargs.values())
        return f"{label} on device memory" if any(_is_device_side(v) for v in values) else None

    return check


def _is_mask(index: object) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in items)


def _mask_index(label: str) -> Callable:
    def check(args: tuple, kwargs: dict) -> str | None:
        if len(args) > 1 and _is_device_side(args[0]) and _is_mask(args[1]):
            return f"{label} with a boolean mask (data-dependent shape) on device memory"
        return None

    return check


def _one_arg_where(args: tuple, kwargs: dict) -> str | None:
    if len(args) + len(kwargs) == 1 and _is_device_side((*args, *kwargs.values())[0]):
        return "torch.where(condition) (data-dependent shape) on device memory"
    return None


def _repeat_interleave(args: tuple, kwargs: dict) -> str | None:
    repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if len(args) == 1 else None)
    if isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None and _is_device_side(repeats):
        return "repeat_interleave with device repeats and no output_size"
    return None


def _copy(args: tuple, kwargs: dict) -> str | None:
    dst, src = args[0], args[1] if len(args) > 1 else kwargs.get("src")
    non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    if not isinstance(src, torch.Tensor):
        return None
    dst_dev, src_dev = is_device_data(dst), is_device_data(src)
    if dst_dev == src_dev:
        return None
    host = src if dst_dev else dst
    if non_blocking and not _async_safe_host(host):
        direction = "host->device" if dst_dev else "device->host"
        return f"non_blocking {direction} copy_ with pageable or non-dense host memory (synchronous on CUDA)"
    device_side = dst if dst_dev else src
    if not non_blocking and _is_device_side(device_side):
        return "blocking copy_ between device and host memory"
    return None


def _to_target(args: tuple, kwargs: dict) -> tuple[torch.device | None, torch.Tensor | None, bool]:
    target, other, non_blocking = kwargs.get("device"), None, kwargs.get("non_blocking", False)
    for a in args[1:]:
        if isinstance(a, torch.Tensor):
            other = a
        elif isinstance(a, (str, torch.device, int)) and not isinstance(a, bool) and target is None:
            target = a
        elif isinstance(a, bool):
            non_blocking = a
    if other is not None:
        target = other.device
    return (torch.device(target) if target is not None else None), other, bool(non_blocking)


def _to(args: tuple, kwargs: dict) -> str | None:
    src = args[0]
    target, other, non_blocking = _to_target(args, kwargs)
    if target is None:
        return None
    if target.type == "cpu" and (other is None or not is_device_data(other)) and _is_device_side(src):
        return ".to(cpu) on device memory"
    to_device = target.type == "cuda" or (other is not None and is_device_data(other))
    if non_blocking and to_device and not is_device_data(src) and not _async_safe_host(src):
        return "non_blocking .to(device) from pageable or non-dense host memory (synchronous on CUDA)"
    return None


def _cuda_copy(args: tuple, kwargs: dict) -> str | None:
    non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
    src = args[0]
    if non_blocking and not is_device_data(src) and not _async_safe_host(src):
        return "non_blocking .cuda() from pageable or non-dense host memory (synchronous on CUDA)"
    return None


_T = torch.Tensor
WATCHED: dict[Callable, Callable[[tuple, dict], str | None]] = {
    **{getattr(_T, name): _reads_self(label) for name, label in (
        ("item", ".item()"), ("tolist", ".tolist()"), ("__bool__", "bool()"), ("__int__", "int()"),
        ("__float__", "float()"), ("__complex__", "complex()"), ("__index__", "operator.index()"),
        ("numpy", ".numpy()"), ("__array__", "np.asarray()"), ("__repr__", "repr()"),
        ("__format__", "format()"), ("__contains__", "`in`"), ("cpu", ".cpu()"),
        ("is_nonzero", ".is_nonzero()"), ("nonzero", ".nonzero() (data-dependent shape)"),
        ("argwhere", ".argwhere() (data-dependent shape)"), ("masked_select", ".masked_select() (data-dependent shape)"),
        ("unique", ".unique() (data-dependent shape)"), ("unique_consecutive", ".unique_consecutive() (data-dependent shape)"),
        ("equal", ".equal()"), ("allclose", ".allclose()"),
    )},
    **{getattr(torch, name): _reads_any(label) for name, label in (
        ("equal", "torch.equal"), ("allclose", "torch.allclose"), ("is_nonzero", "torch.is_nonzero"),
        ("nonzero", "torch.nonzero (data-dependent shape)"), ("argwhere", "torch.argwhere (data-dependent shape)"),
        ("masked_select", "torch.masked_select (data-dependent shape)"), ("unique", "torch.unique (data-dependent shape)"),
        ("unique_consecutive", "torch.unique_consecutive (data-dependent shape)"),
    )},
    _T.__getitem__: _mask_index("indexing"),
    _T.__setitem__: _mask_index("index assignment"),
    torch.where: _one_arg_where,
    torch.repeat_interleave: _repeat_interleave,
    _T.repeat_interleave: _repeat_interleave,
    _T.copy_: _copy,
    _T.to: _to,
    _T.cuda: _cuda_copy,
}
