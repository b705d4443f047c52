"""C parts of the runner's host side: optional extension modules, built when the package is installed or built.

Native code
-----------
*What is built when.*  Each ``impl/native/<name>.c`` (`sources.MODULES`) is the extension module
``runnercheck.impl.native._<name>``, declared in ``setup.py`` as optional: ``pip install .`` and ``pip install -e .``
compile them (numpy's headers come from the build requirements), and an install without a working compiler still
succeeds, without them.  An editable install and ``python setup.py build_ext --inplace`` put the built files beside
the sources in ``impl/native/`` (git ignores them), so a source checkout used with ``PYTHONPATH=<checkout>`` and no
install loads them too.  Nothing is compiled when the package is imported.

*How to rebuild.*  After changing a ``.c`` or ``.h`` file, run ``python setup.py build_ext --inplace`` (or
``pip install -e .`` again).  Every built module carries the stamp of the sources it was built from
(`sources.stamp`); one whose sources have changed since is stale and is not used.

*Switches.*  ``RUNNERCHECK_NATIVE``: ``auto`` (default: use what is built; anything missing or stale gives ONE
warning per process, naming how to build it, and the Python twins run), ``0`` (never: the Python twins always),
``1`` (required: a missing or stale module raises `NativeBuildError`).  ``RUNNERCHECK_NATIVE_CACHE``: where the
tests' variants are compiled and kept (default ``~/.cache/runnercheck/native``); the product never uses it.

Each C module has a Python twin that stays the reference and the fallback: the runner is whole without them, only
its host side is slower.  Variants with a planted bug are the tests' business: `runnercheck.impl.native.variants`
compiles a patched copy of the sources under a private module name.

Owner: this module owns the loaded modules (`load` caches one per name); it holds no tensor or array.
"""
from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

from runnercheck.impl.native import sources

log = logging.getLogger(__name__)

_MODES = ("auto", "0", "1")
BUILD_HINT = ("build impl/native with `pip install -e .` (an install) or `python setup.py build_ext --inplace` "
              "(a source checkout used on PYTHONPATH)")
_loaded: dict[str, ModuleType | None] = {}
_warned = False  # the one warning of this process about modules not built (or stale) was given


class NativeBuildError(RuntimeError):
    """A C module is missing or stale while ``RUNNERCHECK_NATIVE=1`` asks for it, or a variant failed to build."""


def tri_state(variable: str, error: type[Exception]) -> str:
    """An ``auto`` / ``0`` / ``1`` switch from the environment (``auto`` when unset); ``error`` for any other value.
    ``RUNNERCHECK_NATIVE`` here, ``RUNNERCHECK_LAUNCH_THREAD`` in `runnercheck.impl.launcher`: one rule for both."""
    value = os.environ.get(variable, "auto")
    if value not in _MODES:
        raise error(f"{variable}={value!r}: expected one of {', '.join(_MODES)}")
    return value


def mode() -> str:
    return tri_state("RUNNERCHECK_NATIVE", NativeBuildError)


def load(name: str) -> ModuleType | None:
    """The built C module of ``impl/native/<name>.c``; None when native code is off, or (``auto``) when the module
    is not built or is stale -- the caller then runs its Python twin.  Never compiles."""
    sources.check_name(name)
    if name not in _loaded:
        wanted = mode()
        _loaded[name] = None if wanted == "0" else _import_built(name, required=wanted == "1")
    return _loaded[name]


def describe(name: str = "steady") -> str:
    """What a run uses for ``impl/native/<name>.c``: "C" when it is built and loaded, else "Python" (its twins)."""
    return "C" if load(name) is not None else "Python"


def _import_built(name: str, required: bool) -> ModuleType | None:
    try:
        module = importlib.import_module(f"{__name__}._{name}")
    except ImportError as err:  # not built (ModuleNotFoundError), or built against another numpy / Python
        problem = f"native module {name!r} is not built ({err})"
    else:
        built_from = getattr(module, "source_sha", None)
        try:
            current = sources.stamp(sources.read_sources(name))
        except OSError:  # an install that ships no sources: nothing to compare with
            current = built_from
        if built_from == current:
            return module
        problem = f"native module {name!r} is stale: its sources changed since it was built"
    if required:
        raise NativeBuildError(f"{problem}; RUNNERCHECK_NATIVE=1 asks for it: {BUILD_HINT}")
    global _warned
    if not _warned:
        _warned = True
        log.warning("%s; the runner uses the Python twin of each C module not built or stale (a slower host side): "
                    "%s (RUNNERCHECK_NATIVE=0 uses the twins without this warning)", problem, BUILD_HINT)
    return None


__all__ = ["BUILD_HINT", "NativeBuildError", "describe", "load", "mode"]
