"""A cheaper Triton interpreter on CPU: nested ``@triton.jit`` calls stop re-patching the language,
and the interpreter's dtype table is built once.

Under ``TRITON_INTERPRET=1`` Triton runs a kernel by swapping ``triton.language``'s builtins for
numpy-backed ones (``_patch_lang``) for the length of the launch, then restoring them.  It also calls
``_patch_lang`` again at every call of a nested ``@triton.jit`` function, once per program and per
call site, and each call walks every member of ``tl``, ``tl.core``, ``tl.tensor`` and ``tl.math``
with ``inspect.getmembers``.  Those repeat patches change nothing: the builtins they look for are
already swapped (they are skipped), and the rest are set again to equivalent functions.  On the dev
box they were a quarter of an interpreted mutant run's time (the sampler kernels call nested
functions in loops).

`speed_up_interpreter` keeps, per thread and per running launch, which language modules the
launch has patched; a nested call whose function sees only those is not patched again.  A nested
function that sees another language module (``tl.core`` under a kernel that sees only ``tl``) is
patched as before.  The launch's own patch and its restore are Triton's, untouched.

It also memoises the interpreter's ``_get_np_dtype`` (a Triton dtype's numpy dtype), which builds a
19-entry dict on each of its calls -- one per interpreted operation, the largest own time left in an
interpreted run after the patches (8% of one on the dev box).  Its answer depends on the type alone,
and a Triton type's class and name say which type it is, so a memo returns what it would.

And it runs two of our device functions as their numpy twins (`runnercheck.impl.kernels.interpreted_twins`:
Philox and the candidate sort, the same bits; Philox alone was a third of an interpreted draft-model run).

Installed by whoever turns the interpreter on for a process (`runnercheck.stress.pytest_plugin`,
`runnercheck.stress.cli.main`); a no-op on a GPU (no interpreter), under ``RUNNERCHECK_PLAIN_INTERPRETER=1`` (for a
comparison), and on a Triton whose interpreter lacks the parts it wraps (it logs why and leaves
Triton as it is).

Ownership: `NestedPatchCache` owns the per-thread stack of patched-language sets (host, one entry
per running launch, pushed and popped only by its `launch`, the top entry written by `patch_lang`)
and the language modules each function sees (written by `patch_lang`, kept for the process);
the dtype memo is owned by the wrapper `speed_up_interpreter` installs.
"""
from __future__ import annotations

import inspect
import logging
import os
import threading
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Callable, Iterator

from runnercheck.impl.device import triton_interpreted
from runnercheck.impl.kernels.interpreted_twins import install_interpreted_twins

log = logging.getLogger(__name__)

_INSTALLED_ATTR = "_runnercheck_sped_up"


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
        self._seen: dict[Any, tuple[int, frozenset[int]]] = {}  # function -> (its globals' size, languages)

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
        seen = self._languages_seen_by(fn)
        if patched is not None and seen <= patched:
            return _NO_PATCH
        stack[-1] = seen | (patched or frozenset())
        return self.full_patch(fn)

    def _languages_seen_by(self, fn: Any) -> frozenset[int]:
        """The language modules among ``fn``'s globals (looked up again when its module's globals grow)."""
        size = len(fn.__globals__)
        known = self._seen.get(fn)
        if known is None or known[0] != size:
            known = (size, frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in self.languages))
            self._seen[fn] = known
        return known[1]


_NO_PATCH = _NoPatch()


def _memoised(dtype_of: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``dtype_of`` memoised by (type, name): a block or pointer type defines ``__eq__`` without
    ``__hash__``, and a name spells out the whole type (element type, pointee, block shape)."""
    memo: dict[tuple[type, str], Any] = {}

    def memoised_dtype_of(tt_dtype: Any) -> Any:
        key = (type(tt_dtype), getattr(tt_dtype, "name", None))
        if key[1] is None:
            return dtype_of(tt_dtype)
        found = memo.get(key)
        if found is None:
            memo[key] = found = dtype_of(tt_dtype)
        return found

    memoised_dtype_of.__wrapped__ = dtype_of  # type: ignore[attr-defined]
    return memoised_dtype_of


def layout_known(interpreter: Any) -> bool:
    """Whether ``interpreter`` (``triton.runtime.interpreter`` before `speed_up_interpreter`) has the
    parts it wraps: ``_patch_lang`` and ``_get_np_dtype``, and a launch class and a nested-function
    class whose calls look ``_patch_lang`` up by name."""

    def looks_up_patch(cls: Any) -> bool:
        call = getattr(cls, "__call__", None)  # under another wrapper of ours (the memory checks): the original's code
        code = getattr(inspect.unwrap(call), "__code__", None) if call is not None else None
        return code is not None and "_patch_lang" in code.co_names

    return (callable(getattr(interpreter, "_patch_lang", None)) and callable(getattr(interpreter, "_get_np_dtype", None))
            and looks_up_patch(getattr(interpreter, "GridExecutor", None))
            and looks_up_patch(getattr(interpreter, "InterpretedFunction", None)))


def interpreter_to_patch(off_env: str, installed_attr: str, layout_ok: Callable[[ModuleType], bool],
                         what: str) -> tuple[ModuleType | None, bool]:
    """``(triton.runtime.interpreter, already_installed)`` when a patch of ours (its flag ``installed_attr``) may go
    into Triton's interpreter; ``(None, False)`` when kernels are not interpreted in this process, when
    ``off_env=1``, when Triton is missing, or when ``layout_ok`` says the interpreter is not laid out as the
    patch expects (logged: ``what`` then runs unchanged)."""
    if not triton_interpreted() or os.environ.get(off_env) == "1":
        return None, False
    try:
        from triton.runtime import interpreter
    except ImportError:
        return None, False
    if getattr(interpreter, installed_attr, False):
        return interpreter, True
    if not layout_ok(interpreter):
        log.info("this Triton's interpreter is not laid out as expected; %s unchanged", what)
        return None, False
    return interpreter, False


def speed_up_interpreter() -> bool:
    """Install the nested-call patch cache, the dtype memo and the numpy twins into Triton's interpreter; True when
    in place.

    Idempotent.  False (and Triton untouched) when kernels are not interpreted in this process, when
    ``RUNNERCHECK_PLAIN_INTERPRETER=1``, or when the interpreter's layout is not the one this wraps."""
    interpreter, installed = interpreter_to_patch("RUNNERCHECK_PLAIN_INTERPRETER", _INSTALLED_ATTR, layout_known,
                                                  "it runs")
    if interpreter is None or installed:
        return installed
    import triton.language as tl

    launch_cls, full_patch, dtype_of = interpreter.GridExecutor, interpreter._patch_lang, interpreter._get_np_dtype
    cache = NestedPatchCache(full_patch, (tl, tl.core))
    run_launch = launch_cls.__call__

    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        with cache.launch():
            return run_launch(self, *args, **kwargs)

    launch.__wrapped__ = run_launch  # type: ignore[attr-defined]
    interpreter._patch_lang = cache.patch_lang
    interpreter._get_np_dtype = _memoised(dtype_of)
    launch_cls.__call__ = launch
    install_interpreted_twins(interpreter)
    setattr(interpreter, _INSTALLED_ATTR, True)
    return True
