"""Variants of a C module built from a patched copy of its sources: the planted-bug tests' mutants.

The product C holds no planted bug.  A test names a `Patch` (file, the exact text it replaces, the text it plants),
`patched` applies it to a copy of a module's sources -- the text must occur exactly once, so a patch the C has
outgrown is a loud `PatchError` naming its plant, never a variant that silently plants nothing -- and
`build_variant` compiles that copy under a private module name, with the interpreter's compiler and flags, into a
cache keyed by every patched source text, the compiler command and the Python and numpy versions.  The cache is
``RUNNERCHECK_NATIVE_CACHE``, else ``~/.cache/runnercheck/native``, else the temporary directory; a build is written
under a temporary name and renamed into place, so parallel test workers may race to build it.

Only tests (and mutants) call this; the runner loads its modules with `runnercheck.impl.native.load`, which never
compiles.

Owner: this module owns the variants it loaded (one per cache key); it holds no tensor or array.
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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from runnercheck.impl.native import NativeBuildError, sources

log = logging.getLogger(__name__)

_built: dict[str, ModuleType] = {}


class PatchError(ValueError):
    """A patch that does not apply: its original text is not in its file exactly once (the C changed under it)."""


@dataclass(frozen=True)
class Patch:
    """In ``file`` (a name in impl/native), replace ``original`` -- which must occur exactly once -- by ``planted``."""
    file: str
    original: str
    planted: str


def patched(name: str, plant: str, patches: Iterable[Patch], texts: Mapping[str, str] | None = None) -> dict[str, str]:
    """Module ``name``'s sources (``texts``, else those in impl/native) with the patches of ``plant`` that touch its
    files applied.  `PatchError` (naming ``plant``) when a patch's original text is not there exactly once, or when
    no patch touches the module at all."""
    result = dict(sources.read_sources(name) if texts is None else texts)
    applied = 0
    for patch in patches:
        if patch.file not in result:
            continue
        found = result[patch.file].count(patch.original)
        if found != 1:
            raise PatchError(f"plant {plant!r} no longer applies: its original text occurs {found} times in "
                             f"impl/native/{patch.file} (expected exactly once); update the plant to the C as it is "
                             f"now:\n{patch.original}")
        result[patch.file] = result[patch.file].replace(patch.original, patch.planted)
        applied += 1
    if applied == 0:
        raise PatchError(f"plant {plant!r} changes nothing in module {name!r} (none of its patches is in "
                         f"{', '.join(sorted(result))})")
    return result


def compile_command() -> list[str]:
    """The interpreter's compiler with the flags setuptools would use for an extension (CFLAGS, CCSHARED, and
    LDSHARED's own linker flags): compile and link in one call."""
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    ldshared = shlex.split(sysconfig.get_config_var("LDSHARED") or "cc -shared")
    # LDSHARED names the compiler as its first word; keep its linker flags (-shared, macOS's -bundle ...).
    return [*cc, *shlex.split(sysconfig.get_config_var("CFLAGS") or ""),
            *shlex.split(sysconfig.get_config_var("CCSHARED") or ""), *ldshared[1:],
            "-I", sysconfig.get_paths()["include"], "-I", np.get_include()]


def build_variant(name: str, label: str, texts: Mapping[str, str]) -> ModuleType:
    """Module ``name`` compiled from ``texts`` (file name -> text, as `patched` returns) under a private module name
    made of ``label`` and the cache key; `NativeBuildError` when it cannot be compiled or loaded."""
    sources.check_name(name)
    command = compile_command()
    key = hashlib.sha256(b"\0".join([sources.stamp(texts).encode(), shlex.join(command).encode(),
                                     sys.version.encode(), np.__version__.encode()])).hexdigest()[:16]
    if key not in _built:
        module = f"_variant_{name}_{''.join(c if c.isalnum() else '_' for c in label.lower())}_{key}"
        target = cache_dir() / key / f"{module}{sysconfig.get_config_var('EXT_SUFFIX')}"
        try:
            if not target.exists():
                _compile(command, module, name, texts, target)
            _built[key] = _import(module, target)
        except (OSError, subprocess.SubprocessError, ImportError) as err:
            raise NativeBuildError(f"variant {label!r} of native module {name!r}: {err}") from err
    return _built[key]


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


def _compile(command: list[str], module: str, name: str, texts: Mapping[str, str], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    with tempfile.TemporaryDirectory(prefix=f"runnercheck-{module}-") as copy:
        for file, text in texts.items():  # the patched copy; the checkout's own files are never written
            (Path(copy) / file).write_text(text, encoding="utf-8")
        full = [*command, "-I", copy, *(f"-D{symbol}={value}" for symbol, value in sources.macros(module, texts)),
                str(Path(copy) / f"{name}.c"), "-o", str(partial)]
        result = subprocess.run(full, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise OSError(f"{shlex.join(full)} failed: {result.stderr.strip()[-2000:]}")
    os.replace(partial, target)
    log.info("built native variant %s at %s", module, target)


def _import(module: str, target: Path) -> ModuleType:
    qualified = f"{sources.PACKAGE}.{module}"
    spec = importlib.util.spec_from_file_location(
        qualified, target, loader=importlib.machinery.ExtensionFileLoader(qualified, str(target)))
    if spec is None or spec.loader is None:
        raise ImportError(f"no loader for {target}")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


__all__ = ["Patch", "PatchError", "build_variant", "cache_dir", "compile_command", "patched"]
