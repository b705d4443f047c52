"""What each C module of `runnercheck.impl.native` is built from, and the stamp that names those sources.

One list and one stamp for the three places that need them: ``setup.py`` (the install's build: it loads this file by
path, before the package can be imported, so it imports nothing but the standard library), `runnercheck.impl.native`
(which compares a built module's stamp with the sources beside it: a stale build is not used) and
`runnercheck.impl.native.variants` (the tests' patched builds).

Owner: nothing at run time; it reads files and returns text.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

SOURCES = Path(__file__).resolve().parent
# Every impl/native/<name>.c, each built as the extension ``runnercheck.impl.native._<name>``.
MODULES = ("steady", "general", "boundary", "staging", "rows", "seeds", "plans", "launcher")
PACKAGE = "runnercheck.impl.native"


class UnknownModuleError(ValueError):
    """A name that is not one of `MODULES`."""


def check_name(name: str) -> str:
    if name not in MODULES:
        raise UnknownModuleError(f"no native module {name!r}; the modules are {', '.join(MODULES)}")
    return name


def headers(root: Path = SOURCES) -> list[str]:
    """The shared headers (every module may include any of them, so each is part of every module's sources)."""
    return sorted(path.name for path in root.glob("*.h"))


def source_files(name: str, root: Path = SOURCES) -> list[str]:
    """The files module ``name`` is compiled from: its ``.c`` first, then every header."""
    return [f"{check_name(name)}.c", *headers(root)]


def read_sources(name: str, root: Path = SOURCES) -> dict[str, str]:
    """File name -> text of module ``name``'s sources under ``root``."""
    return {file: (root / file).read_text(encoding="utf-8") for file in source_files(name, root)}


def stamp(texts: Mapping[str, str]) -> str:
    """The sha256 of these sources (file names and texts, in name order): what a built module carries as
    ``source_sha`` (compiled in as ``RUNNERCHECK_SOURCE_SHA``)."""
    digest = hashlib.sha256()
    for file in sorted(texts):
        digest.update(file.encode() + b"\0" + texts[file].encode("utf-8") + b"\0")
    return digest.hexdigest()


def macros(module: str, texts: Mapping[str, str]) -> list[tuple[str, str]]:
    """The preprocessor symbols every build passes: the module's own name (its init function is
    ``PyInit_<module>``) and its sources' stamp, as a C string."""
    return [("MODULE_NAME", module), ("RUNNERCHECK_SOURCE_SHA", f'"{stamp(texts)}"')]
