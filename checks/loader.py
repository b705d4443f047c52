"""One loader for every plug-in seam (runner factories, samplers): ``module:attribute`` or ``file.py:attribute``.

Two spec forms:

* ``package.module:attribute`` imports the module.  If it is not importable as things stand, the
  current working folder is *appended* to ``sys.path`` and the import tried once more, so a module
  next to where the command runs is found (as ``python -m`` would find it) but never shadows an
  installed package of the same name: an installed ``utils`` wins over ``./utils.py``.  Use the file
  form to name a file unambiguously.
* ``path/to/file.py:attribute`` (relative to the working folder, or absolute) loads that file under
  a private module name, ``runnercheck._user.<stem>_<hash of the path>``, never a bare top-level
  name, so it cannot replace or be replaced by another module.  The file's folder is appended to
  ``sys.path`` so that it can import its neighbours.  Loading the same file again returns the
  module already loaded.

`canonical_spec` gives the form another process can load again (a file spec with its absolute
path); `spec_of` names an already-loaded callable that way.  Every failure is a typed `LoaderError`
naming the spec in one line, never a bare ImportError/AttributeError or the user module's own
traceback.  `accepts_keyword` tells whether a plug-in callable takes an optional keyword (e.g.
``cuda_graphs`` on a runner factory), so the harness passes it only to callables that declare it.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

# The package that holds modules loaded from file specs (a plain in-memory package: nothing on disk).
USER_PACKAGE = "runnercheck._user"


class LoaderError(ValueError):
    """A spec that names nothing loadable."""


class SpecSyntaxError(LoaderError):
    """Neither ``package.module:attribute`` nor ``path/file.py:attribute`` (both parts non-empty)."""


class SpecNotFoundError(LoaderError):
    """The module or file cannot be found, or it has no such attribute."""


class SpecImportError(LoaderError):
    """The module or file was found but raised while it was being imported."""


class SpecNotCallableError(LoaderError):
    """The attribute exists but is not callable."""


@dataclass(frozen=True)
class Spec:
    """A parsed spec: ``module`` is a dotted module name, or ``path`` a ``.py`` file (absolute)."""

    attribute: str
    module: str | None = None
    path: Path | None = None

    @property
    def target(self) -> str:
        return str(self.path) if self.path is not None else str(self.module)

    def __str__(self) -> str:
        return f"{self.target}:{self.attribute}"


def parse_spec(spec: Any, what: str = "object") -> Spec:
    """The `Spec` of ``spec``; `SpecSyntaxError` naming both accepted forms when it is neither."""
    forms = "'package.module:attribute' or 'path/to/file.py:attribute'"
    if not isinstance(spec, str) or ":" not in spec:
        raise SpecSyntaxError(f"{what} spec {spec!r} must look like {forms}")
    target, _, attr = spec.strip().rpartition(":")  # the last colon: a Windows path has one of its own
    if not target or not attr:
        raise SpecSyntaxError(f"{what} spec {spec!r} must name both the module (or file) and the attribute")
    if not attr.isidentifier():
        raise SpecSyntaxError(f"{what} spec {spec!r}: {attr!r} is not an attribute name")
    if target.endswith(".py"):
        return Spec(attr, path=Path(target).expanduser().absolute())
    if not all(part.isidentifier() for part in target.split(".")):
        hint = " (a file spec names a .py file)" if ("/" in target or os.sep in target) else ""
        raise SpecSyntaxError(f"{what} spec {spec!r}: {target!r} is not a dotted module name{hint}; use {forms}")
    return Spec(attr, module=target)


def split_spec(spec: Any, what: str = "object") -> tuple[str, str]:
    """``(module or absolute file path, attribute)`` of ``spec`` (`parse_spec`)."""
    parsed = parse_spec(spec, what)
    return parsed.target, parsed.attribute


def canonical_spec(spec: str, what: str = "object") -> str:
    """``spec`` as another process (started anywhere) loads it: a file spec's path made absolute."""
    return str(parse_spec(spec, what))


def _append_to_path(folder: str) -> None:
    """Append ``folder`` to ``sys.path`` unless it is already there (appended: installed packages keep winning)."""
    resolved = os.path.realpath(folder)
    if all(os.path.realpath(p or os.curdir) != resolved for p in sys.path):
        sys.path.append(folder)
        importlib.invalidate_caches()


def _import_error(spec: str, what: str, name: str, error: BaseException) -> LoaderError:
    if isinstance(error, ImportError):
        return SpecNotFoundError(f"cannot import {name!r} for {what} {spec!r}: {error}")
    return SpecImportError(f"{what} {spec!r}: importing {name} raised {type(error).__name__}: {error}")


def _import_module(name: str, spec: str, what: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        # Only a miss of the named module itself is retried with the working folder on the path.
        if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
            raise _import_error(spec, what, name, e) from None
    except Exception as e:  # the user's module raised on import: one line, not its traceback
        raise _import_error(spec, what, name, e) from None
    _append_to_path(os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        raise SpecNotFoundError(f"{what} {spec!r}: module {name!r} not found on sys.path or in the working folder "
                                f"{os.getcwd()} ({e}); name a file as 'path/to/file.py:attribute'") from None
    except Exception as e:
        raise _import_error(spec, what, name, e) from None


def _user_module_name(path: Path) -> str:
    stem = "".join(c if c.isalnum() or c == "_" else "_" for c in path.stem)
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    return f"{USER_PACKAGE}.{stem}_{digest}"


def _user_package() -> types.ModuleType:
    package = sys.modules.get(USER_PACKAGE)
    if package is None:
        import runnercheck

        package = types.ModuleType(USER_PACKAGE, "Modules runnercheck loaded from 'file.py:attribute' specs.")
        package.__path__ = []  # a package (so its submodules import by name) with nothing on disk
        sys.modules[USER_PACKAGE] = package
        runnercheck._user = package  # type: ignore[attr-defined]
    return package


def _load_file(path: Path, spec: str, what: str) -> types.ModuleType:
    name = _user_module_name(path)
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise SpecNotFoundError(f"{what} {spec!r}: no file {path}")
    package = _user_package()
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise SpecNotFoundError(f"{what} {spec!r}: {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    _append_to_path(str(path.parent))
    sys.modules[name] = module  # before it runs: pickling and its own relative lookups see it
    try:
        module_spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[name]
        if not isinstance(e, Exception):
            raise
        raise _import_error(spec, what, str(path), e) from None
    setattr(package, name.rsplit(".", 1)[1], module)
    return module


def load_callable(spec: str, what: str = "object") -> Callable:
    """Load ``package.module:attribute`` or ``path/file.py:attribute`` (module docstring) and return
    the callable; ``what`` names it in errors."""
    parsed = parse_spec(spec, what)
    if parsed.path is not None:
        module = _load_file(parsed.path, spec, what)
        where = str(parsed.path)
    else:
        module = _import_module(str(parsed.module), spec, what)
        where = str(parsed.module)
    if not hasattr(module, parsed.attribute):
        raise SpecNotFoundError(f"{what} {spec!r}: {where} has no attribute {parsed.attribute!r}")
    value = getattr(module, parsed.attribute)
    if not callable(value):
        raise SpecNotCallableError(f"{what} {spec!r}: {type(value).__name__} is not callable")
    return value


def spec_of(fn: Callable, *, by_file: bool = False) -> str:
    """The spec that names ``fn`` (for a child process or a repro line); a callable loaded from a
    file spec is named by its file, and with ``by_file`` any top-level callable of a module that has
    a ``.py`` file (a command run from elsewhere loads it without the caller's ``sys.path``).
    Whether it loads back to ``fn`` is the caller's check."""
    module_name = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__name__
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if file and (module_name.startswith(USER_PACKAGE + ".") or (by_file and file.endswith(".py") and qualname.isidentifier())):
        return f"{file}:{qualname}"
    return f"{module_name}:{qualname}"


def accepts_keyword(fn: Callable, name: str) -> bool:
    """Whether ``fn`` can be called with keyword ``name`` (declared, or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD or (p.name == name and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
               for p in params)


__all__ = ["LoaderError", "SpecSyntaxError", "SpecNotFoundError", "SpecImportError", "SpecNotCallableError", "Spec",
           "parse_spec", "split_spec", "canonical_spec", "load_callable", "spec_of", "accepts_keyword", "USER_PACKAGE"]
