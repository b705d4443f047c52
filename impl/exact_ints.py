"""Exact-int checks of a whole sequence in one C-level pass: every element an ``int`` (not a bool, a
float, a numpy integer or an int subclass) and equal to an expected value.

The boundary's rule for counts is ``type(x) is int``; checking it element by element
(``set(map(type, values))``) and then the values (``list(values) == expected.tolist()``) costs two
passes and a list of Python ints per check.  `marshal` (format version 2, which writes each object
by its exact type and has no back-references) encodes an exact int in ``[-2**31, 2**31)`` as the
byte ``i`` and its four little-endian bytes, a bool as ``T``/``F``, a float as ``g``..., and refuses
int subclasses.  So the encoding of a tuple (list) of exact ints is a fixed byte pattern that numpy
can build from the expected values, and one byte comparison checks every element's type and value:
the first element must begin with ``i`` and so take exactly five bytes, and so on by induction.

If this interpreter's marshal does not write that pattern (checked once, at import), the checks
fall back to the two-pass form; the verdicts are the same either way.
"""
from __future__ import annotations

import marshal
import struct

import numpy as np

_MARSHAL_VERSION = 2
_ENTRY = np.dtype([("code", "S1"), ("value", "<i4")])  # one exact int: b"i" + int32 little-endian
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _marshal_layout_holds() -> bool:
    sample = (7, -3, 70000)
    want = b"(" + struct.pack("<i", 3) + b"".join(b"i" + struct.pack("<i", v) for v in sample)
    try:
        return (marshal.dumps(sample, _MARSHAL_VERSION) == want and marshal.dumps([1], _MARSHAL_VERSION)[:1] == b"["
                and marshal.dumps((True,), _MARSHAL_VERSION)[5:] == b"T")
    except ValueError:
        return False


FAST = _marshal_layout_holds()


def _container_code(values: tuple | list) -> bytes:
    return b"(" if type(values) is tuple else b"["


def encode_ints(values: np.ndarray, container: bytes = b"(") -> bytes:
    """The marshal (version 2) bytes of a tuple (``container=b"("``) or list (``b"["``) of exact ints
    equal to ``values``, each in int32 range (the caller's bound; not checked here)."""
    entries = np.empty(len(values), _ENTRY)
    entries["code"] = b"i"
    entries["value"] = values
    return container + struct.pack("<i", len(values)) + entries.tobytes()


def equal_exact_ints(values: tuple | list, expected: np.ndarray) -> bool:
    """Whether ``values`` (a tuple or list) holds exactly ``len(expected)`` exact ints equal to ``expected``.

    ``expected``: an integer array whose values lie in int32 range (a host mirror's counts).
    Never raises on odd elements: anything that is not an exact int makes it False.
    """
    if FAST:
        try:
            return marshal.dumps(values, _MARSHAL_VERSION) == encode_ints(expected, _container_code(values))
        except ValueError:  # an element marshal cannot write (an int subclass, an arbitrary object)
            return False
    return len(values) == len(expected) and set(map(type, values)) <= {int} and list(values) == expected.tolist()


class RepeatedInt:
    """Checks that a list holds ``n`` copies of one exact int (``value``), the bytes built once per ``n``.

    Host-only; owned by whoever makes it (a step reader), which calls it from one thread."""

    def __init__(self, value: int):
        if not _INT32_MIN <= value <= _INT32_MAX:
            raise ValueError(f"{value} is outside int32 range")
        self.value = value
        self._encoded: dict[int, bytes] = {}

    def matches(self, values: list) -> bool:
        """Whether the list ``values`` is ``[value] * len(values)`` with every element an exact int."""
        if not FAST:
            return values.count(self.value) == len(values) and set(map(type, values)) <= {int}
        n = len(values)
        encoded = self._encoded.get(n)
        if encoded is None:
            if len(self._encoded) >= 64:
                self._encoded.clear()
            encoded = self._encoded[n] = encode_ints(np.full(n, self.value, np.int64), b"[")
        try:
            return marshal.dumps(values, _MARSHAL_VERSION) == encoded
        except ValueError:
            return False


__all__ = ["FAST", "RepeatedInt", "encode_ints", "equal_exact_ints"]
