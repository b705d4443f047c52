"""Numpy twins of runnercheck's hottest device functions for Triton's interpreter: the same bits at numpy speed.

Under ``TRITON_INTERPRET=1`` each Triton operation costs tens of microseconds of Python (type checks,
broadcasts, casts in ``triton.language.semantic``), whatever the size of its operands.  Two of our
device functions are long chains of such operations:

* `runnercheck.impl.kernels.rng.philox4x32`: about 60 operations a call (ten rounds of widening
  multiplies, shifts, casts and xors); on the dev box Philox alone was a third of an interpreted
  draft-model run.  Twin: `philox4x32_numpy`, the same ten rounds on the call's numpy arrays.
* `runnercheck.impl.kernels.sampling_select.sorted_descending`: ``tl.sort``'s bitonic network, a few
  hundred operations for a 64-entry candidate row (12% of that run).  Twin: `sorted_descending_numpy`,
  numpy's sort of the packed int64 keys (integers: every correct sort gives the same row).

`install_interpreted_twins` makes the interpreter run each twin in place of its function.  Only the
interpreter is affected, and only these functions of ours (never Triton's own ``tl.sort`` or a user's
kernel): a compiled kernel (a GPU) runs the Triton code, and the interpreter still runs every caller
as written (noise chunks, lo words, the speculative streams, the mutants' miswired streams, the
candidate gathers).  Each twin must give its function's bits for any argument the kernels can pass:
``tests/impl/test_interpreted_twins.py`` compares each pair interpreted, twin on and off.

How: the interpreter keeps each nested ``@triton.jit`` function's rewritten Python body in
``InterpretedFunction.rewritten_fn`` (keyed by the original function) and calls that body with the
interpreter's tensors; a twin is installed there under its function.  Installed by
`runnercheck.impl.kernels.interpreter.speed_up_interpreter` (off under ``RUNNERCHECK_PLAIN_INTERPRETER=1``
with the other interpreter speed-ups); on a Triton whose interpreter is not laid out so, logged and
left as it is.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_LOW32 = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


def philox_rounds(seed: np.ndarray, counter: np.ndarray, position: np.ndarray, stream: int) -> tuple[np.ndarray, ...]:
    """The four uint32 words of Philox4x32-10 at ``(counter, position, 0, stream)`` under ``seed`` (numpy arrays of
    any integer dtype, broadcast together; each taken mod 2^64 and ``counter``/``position`` then mod 2^32, as the
    Triton function's casts do)."""
    seed64 = np.asarray(seed).astype(np.uint64)
    k0 = (seed64 & _LOW32).astype(np.uint32)
    k1 = ((seed64 >> _SHIFT) & _LOW32).astype(np.uint32)
    c0_in = np.asarray(counter).astype(np.uint64).astype(np.uint32)
    pos = np.asarray(position).astype(np.uint64).astype(np.uint32)
    shape = np.broadcast_shapes(k0.shape, c0_in.shape, pos.shape)
    p0 = c0_in.astype(np.uint64) * _M0
    c0 = np.broadcast_to(pos ^ k0, shape)
    c1 = np.zeros(shape, np.uint32)
    c2 = np.broadcast_to((p0 >> _SHIFT).astype(np.uint32) ^ np.uint32(stream) ^ k1, shape)
    c3 = np.broadcast_to(p0.astype(np.uint32), shape)
    k0 = np.broadcast_to(k0 + _W0, shape)
    k1 = np.broadcast_to(k1 + _W1, shape)
    for i in range(9):
        p0 = c0.astype(np.uint64) * _M0
        p1 = c2.astype(np.uint64) * _M1
        c0, c1, c2, c3 = ((p1 >> _SHIFT).astype(np.uint32) ^ c1 ^ k0, p1.astype(np.uint32),
                          (p0 >> _SHIFT).astype(np.uint32) ^ c3 ^ k1, p0.astype(np.uint32))
        if i < 8:
            k0 = k0 + _W0
            k1 = k1 + _W1
    return c0, c1, c2, c3


def _operand(value: Any, name: str, tensor_only: bool) -> tuple[np.ndarray, list[int] | None]:
    """An argument's numpy data and, for a block, its block shape (None for a scalar).  ``seed``, ``counter`` and
    ``position`` must be tensors (the Triton function calls their ``.to``); ``stream`` may be an int or constexpr."""
    import triton.language as tl

    if isinstance(value, tl.tensor):
        block = list(value.type.shape) if isinstance(value.type, tl.block_type) else None
        return value.handle.data, block
    value = value.value if isinstance(value, tl.constexpr) else value
    if tensor_only or isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"philox4x32: {name} must be an integer tensor, got {type(value).__name__}")
    return np.array([int(value)], np.int64), None


def philox4x32_numpy(seed: Any, counter: Any, position: Any, stream: Any) -> tuple[Any, Any, Any, Any]:
    """``rng.philox4x32`` for the interpreter: its arguments are the interpreter's tensors (or Python ints,
    constexprs), its result four uint32 tensors of the broadcast block shape (a scalar when no argument is a block)."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    operands = [_operand(v, n, True) for v, n in ((seed, "seed"), (counter, "counter"), (position, "position"))]
    stream_data, stream_block = _operand(stream, "stream", False)
    if stream_block is not None or stream_data.size != 1:
        raise TypeError("philox4x32's stream must be a scalar")
    blocks = [b for _, b in operands if b is not None]
    words = philox_rounds(*(d for d, _ in operands), int(stream_data[0]))
    if blocks:
        shape = list(np.broadcast_shapes(*(tuple(b) for b in blocks)))
        ty = tl.block_type(tl.uint32, shape)
        return tuple(tl.tensor(TensorHandle(np.ascontiguousarray(np.broadcast_to(w, shape)), tl.uint32), ty)
                     for w in words)
    return tuple(tl.tensor(TensorHandle(np.ascontiguousarray(w.reshape(1)), tl.uint32), tl.uint32) for w in words)


def sorted_descending_numpy(packed: Any) -> Any:
    """``sampling_select.sorted_descending`` for the interpreter: a 1-D int64 block sorted largest first."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    if not isinstance(packed, tl.tensor) or not isinstance(packed.type, tl.block_type) or len(packed.type.shape) != 1 \
            or packed.dtype != tl.int64:
        raise TypeError(f"sorted_descending takes a 1-D int64 block, got {getattr(packed, 'type', type(packed))}")
    data = np.sort(packed.handle.data, kind="stable")[::-1]
    return tl.tensor(TensorHandle(np.ascontiguousarray(data), tl.int64), packed.type)


def _twins() -> dict[Any, Any]:
    """Each twinned function's interpreter object -> its twin."""
    from runnercheck.impl.kernels import rng, sampling_select

    return {rng.philox4x32: philox4x32_numpy, sampling_select.sorted_descending: sorted_descending_numpy}


def install_interpreted_twins(interpreter: Any) -> bool:
    """Make ``interpreter`` (``triton.runtime.interpreter``) run each function's numpy twin; True when in place.
    The caller (`runnercheck.impl.kernels.interpreter.speed_up_interpreter`) decides whether to."""
    table = getattr(getattr(interpreter, "InterpretedFunction", None), "rewritten_fn", None)
    twins = _twins()
    if not isinstance(table, dict) or not all(isinstance(f, interpreter.InterpretedFunction) for f in twins):
        log.info("this Triton's interpreter keeps no table of rewritten functions; the numpy twins are not used")
        return False
    for function, twin in twins.items():
        table[function.fn] = twin
    return True


def uninstall_interpreted_twins(interpreter: Any) -> None:
    """Undo `install_interpreted_twins` (the next call of each function rewrites its Triton body again)."""
    table = interpreter.InterpretedFunction.rewritten_fn
    for function, twin in _twins().items():
        if table.get(function.fn) is twin:
            del table[function.fn]


__all__ = ["philox_rounds", "philox4x32_numpy", "sorted_descending_numpy", "install_interpreted_twins",
           "uninstall_interpreted_twins"]
