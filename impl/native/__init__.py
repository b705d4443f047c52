"""C parts of the runner's host side, built at first use with the interpreter's own compiler settings.

Each C module here has a Python twin that stays the reference and the fallback: the runner is
whole without a compiler, only its host side is slower.  A module is compiled once per source,
interpreter and numpy version into a cache directory (``RUNNERCHECK_NATIVE_CACHE``, else
``~/.cache/runnercheck/native``, else the temporary directory), written under a temporary name
and renamed into place, so parallel test workers may race to build it.

``RUNNERCHECK_NATIVE``: ``auto`` (default: build if a compiler works, else warn once and use the
Python twins), ``0`` (never), ``1`` (required: a failed build raises `NativeBuildError`).

Owner: this module owns the loaded modules (`load` caches one per name and variant); it holds no
tensor or array.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np

log = logging.getLogger(__name__)

_SOURCES = Path(__file__).resolve().parent
_MODES = ("auto", "0", "1")
_loaded: dict[tuple[str, tuple[str, ...]], ModuleType | None] = {}


class NativeBuildError(RuntimeError):
    """A C module could not be built or loaded while ``RUNNERCHECK_NATIVE=1`` asked for it (or a variant was asked for)."""


def tri_state(variable: str, error: type[Exception]) -> str:
    """An ``auto`` / ``0`` / ``1`` switch from the environment (``auto`` when unset); ``error`` for any other value.
    ``RUNNERCHECK_NATIVE`` here, ``RUNNERCHECK_LAUNCH_THREAD`` in `runnercheck.impl.launcher`: one rule for both."""
    value = os.environ.get(variable, "auto")
    if value not in _MODES:
        raise error(f"{variable}={value!r}: expected one of {', '.join(_MODES)}")
    return value


def mode() -> str:
    return tri_state("RUNNERCHECK_NATIVE", NativeBuildError)


def load(name: str, defines: tuple[str, ...] = ()) -> ModuleType | None:
    """The C module ``impl/native/<name>.c``, built if needed; None when native code is off or cannot be built.

    ``defines``: preprocessor symbols of a variant (the planted-bug tests' mutants); a variant is its
    own module (``<name>__<defines>``), and failing to build one always raises.
    """
    key = (name, defines)
    if key not in _loaded:
        wanted = mode()
        if wanted == "0" and not defines:
            _loaded[key] = None
        else:
            try:
                _loaded[key] = _build_and_import(name, defines)
            except (OSError, subprocess.SubprocessError, ImportError) as err:
                if wanted == "1" or defines:
                    raise NativeBuildError(f"native module {name!r} {defines or ''}: {err}") from err
                log.warning("native module %s not built (%s); the runner uses its Python twin", name, err)
                _loaded[key] = None
    return _loaded[key]


def describe(name: str = "steady") -> str:
    """What a run uses for ``impl/native/<name>.c``: "C" when it is built and loaded, else "Python" (its twins)."""
    return "C" if load(name) is not None else "Python"


def cache_dir() -> Path:
    configured = os.environ.get("RUNNERCHECK_NATIVE_CACHE")
    if configured:
        return Path(configured)
    home = Path.home() / ".cache" / "runnercheck" / "native"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK):
            return home
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"runnercheck-native-{os.getuid() if hasattr(os, 'getuid') else 'user'}"


def _module_name(name: str, defines: tuple[str, ...]) -> str:
    return "_" + name + "".join("__" + d.lower() for d in defines)


def _build_and_import(name: str, defines: tuple[str, ...]) -> ModuleType:
    source = (_SOURCES / f"{name}.c").read_bytes()
    headers = [path.read_bytes() for path in sorted(_SOURCES.glob("*.h"))]  # included by every module
    module = _module_name(name, defines)
    stamp = hashlib.sha256(b"\0".join([source, *headers, sys.version.encode(), np.__version__.encode(),
                                       repr(defines).encode()])).hexdigest()[:16]
    target = cache_dir() / stamp / f"{module}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not target.exists():
        _compile(_SOURCES / f"{name}.c", module, defines, target)
    spec = importlib.util.spec_from_file_location(f"{__name__}.{module}", target,
                                                  loader=importlib.machinery.ExtensionFileLoader(f"{__name__}.{module}", str(target)))
    if spec is None or spec.loader is None:
        raise ImportError(f"no loader for {target}")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def _compile(source: Path, module: str, defines: tuple[str, ...], target: Path) -> None:
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    ldshared = shlex.split(sysconfig.get_config_var("LDSHARED") or "cc -shared")
    # LDSHARED names the compiler as its first word; keep its linker flags (-shared, macOS's -bundle ...).
    command = [*cc, *ldshared[1:], *shlex.split(sysconfig.get_config_var("CCSHARED") or ""), "-O2",
               "-I", sysconfig.get_paths()["include"], "-I", np.get_include(), "-I", str(source.parent),
               f"-DMODULE_NAME={module}", *(f"-D{d}" for d in defines), str(source)]
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    result = subprocess.run([*command, "-o", str(partial)], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise OSError(f"{shlex.join(command)} failed: {result.stderr.strip()[-2000:]}")
    os.replace(partial, target)
    log.info("built native module %s at %s", module, target)


__all__ = ["NativeBuildError", "cache_dir", "describe", "load", "mode"]
