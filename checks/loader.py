"""One ``package.module:attribute`` loader for every plug-in seam (runner factories, samplers).

`load_callable` imports the module and returns the named callable; every failure is a typed
`LoaderError` naming the spec, never a bare ImportError/AttributeError.  `accepts_keyword` tells
whether a plug-in callable takes an optional keyword (e.g. ``cuda_graphs`` on a runner factory),
so the harness passes it only to factories that declare it.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable


class LoaderError(ValueError):
    """A ``package.module:attribute`` spec that names nothing loadable."""


class SpecSyntaxError(LoaderError):
    """Not of the form ``package.module:attribute`` (both parts non-empty, one colon)."""


class SpecNotFoundError(LoaderError):
    """The module cannot be imported, or it has no such attribute."""


class SpecNotCallableError(LoaderError):
    """The attribute exists but is not callable."""


def split_spec(spec: Any, what: str = "object") -> tuple[str, str]:
    """``(module, attribute)`` of ``spec``; `SpecSyntaxError` unless it has both parts and one colon."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise SpecSyntaxError(f"{what} spec {spec!r} must look like 'package.module:attribute'")
    module_name, attr = spec.strip().split(":")
    if not module_name or not attr:
        raise SpecSyntaxError(f"{what} spec {spec!r} must name both the module and the attribute")
    return module_name, attr


def load_callable(spec: str, what: str = "object") -> Callable:
    """Import ``package.module:attribute`` and return the callable (``what`` names it in errors)."""
    module_name, attr = split_spec(spec, what)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise SpecNotFoundError(f"cannot import {module_name!r} for {what} {spec!r}: {e}") from e
    if not hasattr(module, attr):
        raise SpecNotFoundError(f"{what} {spec!r}: {module_name} has no attribute {attr!r}")
    value = getattr(module, attr)
    if not callable(value):
        raise SpecNotCallableError(f"{what} {spec!r}: {type(value).__name__} is not callable")
    return value


def accepts_keyword(fn: Callable, name: str) -> bool:
    """Whether ``fn`` can be called with keyword ``name`` (declared, or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD or (p.name == name and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
               for p in params)


__all__ = ["LoaderError", "SpecSyntaxError", "SpecNotFoundError", "SpecNotCallableError", "split_spec",
           "load_callable", "accepts_keyword"]
