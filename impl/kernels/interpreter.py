"""A cheaper Triton interpreter on CPU: a nested ``@triton.jit`` call stops re-patching the language.

Under ``TRITON_INTERPRET=1`` Triton runs a kernel by swapping ``triton.language``'s builtins for
numpy-backed ones (``_patch_lang``) for the length of the launch, then restoring them.  It also calls
``_patch_lang`` again at every call of a nested ``@triton.jit`` function, once per program and per
call site, and each call walks every member of ``tl``, ``tl.core``, ``tl.tensor`` and ``tl.math``
with ``inspect.getmembers``.  Those repeat patches change nothing: the builtins they look for are
already swapped (they are skipped), and the rest are set again to equivalent functions.  On the dev
box they were a quarter of an interpreted mutant run's time (the sampler kernels call nested
functions in loops).

`speed_up_nested_calls` keeps, per thread and per running launch, which language modules the
launch has patched; a nested call whose function sees only those is not patched again.  A nested
function that sees another language module (``tl.core`` under a kernel that sees only ``tl``) is
patched as before.  The launch's own patch and its restore are Triton's, untouched.

Installed by whoever turns the interpreter on for a process (`stress.pytest_plugin`,
`stress.cli`); a no-op on a GPU (no interpreter), under ``RUNNERCHECK_PLAIN_INTERPRETER=1`` (for a
comparison), and on a Triton whose interpreter lacks the parts it wraps (it logs why and leaves
Triton as it is).

Ownership: `NestedPatchCache` owns the per-thread stack of patched-language sets (host, one entry
per running launch, pushed and popped only by its `launch`, the top entry written by `patch_lang`).
"""
from __future__ import annotations

import inspect
import logging
import os
import threading
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Callable, Iterator

from impl.device import triton_interpreted

log = logging.getLogger(__name__)

_INSTALLED_ATTR = "_runnercheck_nested_patch_cache"


class _NoPatch:
    """What a skipped nested patch returns in place of Triton's scope: nothing to restore."""

    def restore(self) -> None:
        pass


class NestedPatchCache:
    """Which language modules each running launch (per thread) has patched, and the `patch_lang`
    that skips a nested function's patch when it sees only those.

    ``full_patch`` is Triton's ``_patch_lang``; ``languages`` the modules it patches when a
    function's globals hold them (``tl``, ``tl.core``)."""

    def __init__(self, full_patch: Callable[[Any], Any], languages: tuple[ModuleType, ...]):
        self.full_patch = full_patch
        self.languages = languages
        self._local = threading.local()

    def _stack(self) -> list[frozenset[int] | None]:
        return self._local.__dict__.setdefault("stack", [])

    @contextmanager
    def launch(self) -> Iterator[None]:
        """One launch: its own (first) `patch_lang` runs in full and records what it patched."""
        stack = self._stack()
        stack.append(None)
        try:
            yield
        finally:
            stack.pop()

    def patch_lang(self, fn: Any) -> Any:
        stack = self._stack()
        if not stack:  # outside any launch: Triton's behaviour
            return self.full_patch(fn)
        patched = stack[-1]
        seen = frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in self.languages)
        if patched is not None and seen <= patched:
            return _NO_PATCH
        stack[-1] = seen | (patched or frozenset())
        return self.full_patch(fn)


_NO_PATCH = _NoPatch()


def speed_up_nested_calls() -> bool:
    """Install the nested-call patch cache into Triton's interpreter; True when it is in place.

    Idempotent.  False (and Triton untouched) when kernels are not interpreted in this process, when
    ``RUNNERCHECK_PLAIN_INTERPRETER=1``, or when the interpreter's layout is not the one this wraps."""
    if not triton_interpreted() or os.environ.get("RUNNERCHECK_PLAIN_INTERPRETER") == "1":
        return False
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    if getattr(interpreter, _INSTALLED_ATTR, False):
        return True
    launch_cls = getattr(interpreter, "GridExecutor", None)
    nested_cls = getattr(interpreter, "InterpretedFunction", None)
    full_patch = getattr(interpreter, "_patch_lang", None)
    if full_patch is None or not all(cls is not None and "_patch_lang" in cls.__call__.__code__.co_names
                                     for cls in (launch_cls, nested_cls)):
        log.info("this Triton's interpreter is not laid out as expected; nested jit calls keep re-patching the language")
        return False

    cache = NestedPatchCache(full_patch, (tl, tl.core))
    run_launch = launch_cls.__call__

    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        with cache.launch():
            return run_launch(self, *args, **kwargs)

    interpreter._patch_lang = cache.patch_lang
    launch_cls.__call__ = launch
    setattr(interpreter, _INSTALLED_ATTR, True)
    return True
