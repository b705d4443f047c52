"""Marks per-step (hot-path) functions for the static lint (`runnercheck lint`).

A hot function must never read device data on the host (no `.item()`, `.tolist()`, `.cpu()`,
`.numpy()`, synchronisation, or a device tensor used as a condition).  The decorator is a no-op
at run time apart from setting a marker attribute.
"""
from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def hot_path(fn: F) -> F:
    fn.__runnercheck_hot__ = True  # type: ignore[attr-defined]
    return fn
