"""Philox4x32-10 in numpy for Triton's interpreter: the sampler's counter-based generator at numpy speed.

Under ``TRITON_INTERPRET=1`` each Triton operation costs tens of microseconds of Python (type checks,
broadcasts, casts in ``triton.language.semantic``), whatever the size of its operands.  One
`runnercheck.impl.kernels.rng.philox4x32` call is about 60 such operations (ten rounds of widening
multiplies, shifts, casts and xors), so on the dev box Philox alone was a third of an interpreted
draft-model run.  `install_interpreted_philox` makes the interpreter run ``philox4x32`` as
`philox4x32_numpy`: the same ten rounds on the calls' numpy arrays, a handful of numpy operations.

Only the interpreter is affected: a compiled kernel (a GPU) runs ``rng.py``'s Triton code, and the
interpreter still runs every caller of ``philox4x32`` (noise chunks, lo words, the speculative
streams, the mutants' miswired streams) as written.  The twin must give the same bits as the Triton
function for any argument shapes: ``tests/impl/test_interpreted_philox.py`` compares the two
interpreted, on scalars, blocks and broadcasts, with the Random123 vector pinned in
``tests/reference/test_rng.py``.

How: the interpreter keeps each nested ``@triton.jit`` function's rewritten Python body in
``InterpretedFunction.rewritten_fn`` (keyed by the original function) and calls that body with the
interpreter's tensors; the twin is installed there for ``philox4x32``'s function.  Off under
``RUNNERCHECK_PLAIN_INTERPRETER=1`` (with the other interpreter speed-ups) and on a Triton whose
interpreter is not laid out so (logged; Triton is then left as it is).
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


def install_interpreted_philox(interpreter: Any) -> bool:
    """Make ``interpreter`` (``triton.runtime.interpreter``) run ``rng.philox4x32`` as `philox4x32_numpy`; True when
    in place.  The caller (`runnercheck.impl.kernels.interpreter.speed_up_interpreter`) decides whether to."""
    from runnercheck.impl.kernels import rng

    table = getattr(getattr(interpreter, "InterpretedFunction", None), "rewritten_fn", None)
    fn = getattr(rng.philox4x32, "fn", None)
    if not isinstance(table, dict) or fn is None or not isinstance(rng.philox4x32, interpreter.InterpretedFunction):
        log.info("this Triton's interpreter keeps no table of rewritten functions; philox4x32 runs interpreted")
        return False
    table[fn] = philox4x32_numpy
    return True


def uninstall_interpreted_philox(interpreter: Any) -> None:
    """Undo `install_interpreted_philox` (the next call of ``philox4x32`` rewrites its Triton body again)."""
    from runnercheck.impl.kernels import rng

    table = interpreter.InterpretedFunction.rewritten_fn
    if table.get(rng.philox4x32.fn) is philox4x32_numpy:
        del table[rng.philox4x32.fn]


__all__ = ["philox_rounds", "philox4x32_numpy", "install_interpreted_philox", "uninstall_interpreted_philox"]
