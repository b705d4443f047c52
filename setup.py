"""The build of runnercheck's optional C modules (impl/native/*.c); everything else about the package is in pyproject.toml.

A setup.py only because each extension needs numpy's include directory, known when the build runs.  Each module is
``optional``: where no compiler works the install still succeeds, without it, and `runnercheck.impl.native.load`
then warns once and the Python twins run.

    pip install -e .                       an editable install: the modules built beside their sources
    python setup.py build_ext --inplace    the same build for a checkout used on PYTHONPATH, no install (no network)
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
NATIVE = "impl/native"  # relative: setuptools wants relative source paths

# impl/native/sources.py imports only the standard library, so it is read here by path: the package itself cannot
# be imported before it is built.
_spec = importlib.util.spec_from_file_location("_runnercheck_native_sources", ROOT / NATIVE / "sources.py")
assert _spec is not None and _spec.loader is not None
sources = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sources)


class BuildNative(build_ext):
    """build_ext with numpy's headers: numpy is imported only when something is compiled (a build requirement)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        # Always compile (a few seconds): build_ext's own check compares file times only, so a checkout whose sources
        # changed without newer times (a branch switch, a copied tree) would keep a stale build that `load` refuses.
        self.force = True
        import numpy

        for extension in self.extensions:
            extension.include_dirs.append(numpy.get_include())


def extension(name: str) -> Extension:
    texts = sources.read_sources(name)  # the stamp compiled in is the stamp `load` compares with
    return Extension(
        f"{sources.PACKAGE}._{name}",
        sources=[f"{NATIVE}/{name}.c"],
        depends=[f"{NATIVE}/{header}" for header in sources.headers()],  # a changed header rebuilds every module
        include_dirs=[NATIVE],
        define_macros=sources.macros(f"_{name}", texts),
        optional=True,
    )


setup(ext_modules=[extension(name) for name in sources.MODULES], cmdclass={"build_ext": BuildNative})
