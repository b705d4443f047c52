"""How the C modules of `runnercheck.impl.native` are built and loaded, and how the tests' planted bugs are built.

The loader never compiles: it imports the module the install (or ``setup.py build_ext --inplace``) built, and
without one -- or with one older than its sources -- it warns once per process and the Python twins run
(``RUNNERCHECK_NATIVE=1``: an error; ``=0``: the twins, silently).  Importing every module of runnercheck.impl
starts no process at all.  Planted bugs are patches in tests/impl/native_plants.py, not switches in the product C:
no ``PLANT_`` in impl/native, every patch applies exactly once, one that no longer applies is a `PatchError`
naming its plant, and a variant is cached by what it was built from.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import native_plants
import runnercheck.impl.native as native
from runnercheck.impl.native import sources, variants
from runnercheck.impl.native.variants import Patch, PatchError

NATIVE_DIR = Path(native.__file__).resolve().parent
CHECKOUT = NATIVE_DIR.parent.parent
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")


def _built(name: str) -> Path:
    return NATIVE_DIR / f"_{name}{SUFFIX}"


needs_build = pytest.mark.skipif(not all(_built(name).exists() for name in sources.MODULES),
                                 reason=f"impl/native not built: {native.BUILD_HINT}")


@pytest.fixture
def fresh_loader(monkeypatch):
    """`native.load` with an empty module cache and no warning given yet in this process."""
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr(native, "_warned", False)
    monkeypatch.delenv("RUNNERCHECK_NATIVE", raising=False)


@pytest.fixture
def not_built(fresh_loader, monkeypatch, tmp_path):
    """The package's submodules looked up in an empty folder: as a checkout that was never built."""
    monkeypatch.setattr(native, "__path__", [str(tmp_path)])
    for name in sources.MODULES:
        monkeypatch.delitem(sys.modules, f"{native.__name__}._{name}", raising=False)
    return tmp_path


@pytest.fixture
def no_process(monkeypatch):
    """Any attempt to start a process (a compiler) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(subprocess, "run", refuse)


# --------------------------------------------------------------------------- the product C holds no plant

def test_no_planted_bug_switch_is_left_in_the_product_c():
    files = sorted(NATIVE_DIR.glob("*.[ch]"))
    assert files
    offenders = [f"{path.name}:{number}" for path in files
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if "PLANT_" in line or "RUNNERCHECK_PLANT" in line or "PASSES_ONLY" in line]
    assert offenders == []


def test_every_c_file_is_a_module_the_build_declares():
    assert sorted(path.stem for path in NATIVE_DIR.glob("*.c")) == sorted(sources.MODULES)
    setup = (CHECKOUT / "setup.py").read_text(encoding="utf-8")
    assert "sources.MODULES" in setup and "optional=True" in setup


# --------------------------------------------------------------------------- the loader

def test_a_missing_build_warns_once_and_gives_the_python_twins(not_built, no_process, caplog):
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        got = [native.load(name) for name in sources.MODULES]
    assert got == [None] * len(sources.MODULES)
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1  # one per process, not one per module
    assert "Python twin" in warnings[0].getMessage()
    assert "pip install -e ." in warnings[0].getMessage() and "build_ext --inplace" in warnings[0].getMessage()
    assert native.describe("steady") == "Python"
    assert not any(not_built.iterdir())  # nothing was built


def test_a_missing_build_is_an_error_when_native_code_is_required(not_built, no_process, monkeypatch):
    monkeypatch.setenv("RUNNERCHECK_NATIVE", "1")
    with pytest.raises(native.NativeBuildError, match=r"'steady' is not built.*build_ext --inplace"):
        native.load("steady")


def test_native_off_gives_the_python_twins_without_a_warning(fresh_loader, no_process, monkeypatch, caplog):
    monkeypatch.setenv("RUNNERCHECK_NATIVE", "0")
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert all(native.load(name) is None for name in sources.MODULES)
    assert caplog.records == []


def test_a_bad_native_setting_is_a_typed_error(fresh_loader, monkeypatch):
    monkeypatch.setenv("RUNNERCHECK_NATIVE", "yes")
    with pytest.raises(native.NativeBuildError, match="RUNNERCHECK_NATIVE"):
        native.load("steady")


def test_an_unknown_module_is_a_typed_error(fresh_loader):
    with pytest.raises(sources.UnknownModuleError, match="nosuch"):
        native.load("nosuch")


@needs_build
def test_a_built_module_is_loaded_and_is_c(fresh_loader, no_process):
    for name in sources.MODULES:
        module = native.load(name)
        assert module is not None and Path(module.__file__).resolve() == _built(name)
        assert module.source_sha == sources.stamp(sources.read_sources(name))
        assert native.describe(name) == "C"


@needs_build
def test_a_build_older_than_its_sources_is_not_used(fresh_loader, no_process, monkeypatch, tmp_path, caplog):
    changed = tmp_path / "sources"
    shutil.copytree(NATIVE_DIR, changed, ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    (changed / "rows.c").write_text((changed / "rows.c").read_text() + "\n/* changed after the build */\n")
    read = sources.read_sources
    monkeypatch.setattr(sources, "read_sources", lambda name, root=changed: read(name, root))
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.load("rows") is None
        assert native.load("steady") is not None  # its own sources did not change
    assert "stale" in caplog.text and "build_ext --inplace" in caplog.text
    native._loaded.clear()
    monkeypatch.setenv("RUNNERCHECK_NATIVE", "1")
    with pytest.raises(native.NativeBuildError, match="'rows' is stale"):
        native.load("rows")


def test_importing_the_runner_starts_no_process(tmp_path):
    """Every module of runnercheck.impl imported in a fresh interpreter, native code wanted: no process is started
    (an audit hook sees every subprocess and exec), whether or not the modules are built."""
    probe = (
        "import sys, pkgutil, importlib\n"
        "started = []\n"
        "sys.addaudithook(lambda event, args: started.append((event, str(args)[:200]))"
        " if event in ('subprocess.Popen', 'os.system', 'os.exec', 'os.posix_spawn', 'os.spawn', 'os.fork') else None)\n"
        "import runnercheck.impl\n"
        "for info in pkgutil.walk_packages(runnercheck.impl.__path__, 'runnercheck.impl.'):\n"
        "    importlib.import_module(info.name)\n"
        "import runnercheck.impl.native as n\n"
        "[n.load(name) for name in n.sources.MODULES]\n"
        "print('STARTED', started)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT), "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1",
           "RUNNERCHECK_NATIVE": "auto", "RUNNERCHECK_NATIVE_CACHE": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "STARTED []" in result.stdout, result.stdout[-3000:]
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------- the planted bugs' patches

@pytest.mark.parametrize("plant", [*native_plants.PLANTS, *native_plants.VARIANTS])
def test_every_plant_applies_exactly_once_to_the_c_as_it_is(plant):
    entry = {**native_plants.PLANTS, **native_plants.VARIANTS}[plant]
    for patch in entry.patches:
        text = (NATIVE_DIR / patch.file).read_text(encoding="utf-8")
        assert text.count(patch.original) == 1, f"{plant}: {patch.file}"
        assert patch.planted != patch.original
    modules = {patch.file[:-2] for patch in entry.patches if patch.file.endswith(".c")} or {"steady"}
    for module in modules:
        assert native_plants.sources(plant, module) != sources.read_sources(module)


def test_a_patch_that_no_longer_applies_is_an_error_naming_its_plant():
    texts = sources.read_sources("rows")
    gone = Patch("rows.c", "a line the C no longer has\n", "anything\n")
    with pytest.raises(PatchError, match=r"plant 'gone_plant' no longer applies: .* 0 times in impl/native/rows\.c"):
        variants.patched("rows", "gone_plant", [gone], texts)
    doubled = dict(texts, **{"rows.c": texts["rows.c"] + texts["rows.c"]})
    twice = native_plants.PLANTS["no_sample"].patches
    with pytest.raises(PatchError, match=r"plant 'no_sample' no longer applies: .* 2 times"):
        variants.patched("rows", "no_sample", twice, doubled)


def test_a_plant_that_touches_none_of_a_modules_files_is_an_error():
    with pytest.raises(PatchError, match=r"'no_sample' changes nothing in module 'seeds'"):
        native_plants.sources("no_sample", "seeds")


def test_patching_writes_nothing_in_the_checkout():
    before = {path.name: path.read_bytes() for path in NATIVE_DIR.glob("*.[ch]")}
    patched = native_plants.sources("trust_computed", "steady")
    assert patched["steady.c"] != before["steady.c"]
    assert {path.name: path.read_bytes() for path in NATIVE_DIR.glob("*.[ch]")} == before


def test_an_unknown_plant_is_a_typed_error():
    with pytest.raises(KeyError, match="no plant 'nosuch'"):
        native_plants.sources("nosuch", "steady")


# --------------------------------------------------------------------------- variants

def test_a_variant_is_cached_by_what_it_was_built_from(monkeypatch, tmp_path):
    if native.mode() == "0":
        pytest.skip("RUNNERCHECK_NATIVE=0")
    monkeypatch.setenv("RUNNERCHECK_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(variants, "_built", {})
    texts = native_plants.sources("seed_rounds", "seeds")
    try:
        first = variants.build_variant("seeds", "seed_rounds", texts)
    except native.NativeBuildError as err:
        pytest.skip(f"no C compiler here: {err}")
    built = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert len(built) == 1 and re.match(r"_variant_seeds_seed_rounds_[0-9a-f]{16}\.", built[0].name)
    assert first.source_sha == sources.stamp(texts)
    monkeypatch.setattr(variants, "_built", {})
    calls, run = [], subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: calls.append(args) or run(*args, **kwargs))
    assert variants.build_variant("seeds", "seed_rounds", texts).source_sha == first.source_sha
    assert calls == []  # found in the cache, not compiled again
    other = dict(texts, **{"seeds.c": texts["seeds.c"] + "\n"})
    assert variants.build_variant("seeds", "seed_rounds", other).source_sha == sources.stamp(other)
    assert len(calls) == 1  # other sources: another key, compiled


def test_a_variant_without_a_compiler_is_a_native_build_error(monkeypatch, tmp_path):
    monkeypatch.setenv("RUNNERCHECK_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(variants, "_built", {})
    real = sysconfig.get_config_var
    monkeypatch.setattr(variants.sysconfig, "get_config_var",
                        lambda name: "/nonexistent/cc" if name in ("CC", "LDSHARED") else real(name))
    with pytest.raises(native.NativeBuildError, match="variant 'seed_rounds' of native module 'seeds'"):
        variants.build_variant("seeds", "seed_rounds", native_plants.sources("seed_rounds", "seeds"))
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]


# --------------------------------------------------------------------------- the launch thread's module

def test_the_launch_thread_loads_its_module_the_same_way(not_built, no_process, monkeypatch):
    """Not built: the launch thread is off (``auto``) or names the build (``RUNNERCHECK_LAUNCH_THREAD=1``); nothing is
    compiled either way."""
    from runnercheck.impl.launcher import LaunchThread, LaunchThreadError

    monkeypatch.setenv("RUNNERCHECK_LAUNCH_THREAD", "auto")
    assert LaunchThread.start(0) is None
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_THREAD", "1")
    with pytest.raises(LaunchThreadError, match="launcher.c is not loaded.*build_ext --inplace"):
        LaunchThread.start(0)
    assert not any(not_built.iterdir())
