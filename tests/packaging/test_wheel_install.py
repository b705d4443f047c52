"""The wheel as a user gets it: one import namespace, every package in it, no shadowing by user code.

runnercheck once installed its wings as top-level ``impl``/``checks``/``stress`` packages, so a user
project with its own ``checks/`` package broke every runnercheck fixture (``ImportError: cannot
import name 'chisq' from 'checks'``).  These tests build the wheel from a copy of the sources
(building in place would write ``build/`` and ``*.egg-info`` into the checkout), check what it
holds, and install it non-editable into a fresh virtual environment that sees the test
environment's dependencies (torch, numpy, pytest, ...) but not the checkout, and there run
pytest from a user project that has its own ``checks``, ``stress`` and ``impl`` packages.
"""
from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WINGS = ("impl", "reference", "checks", "stress", "bench")
SOURCES = ("pyproject.toml", "setup.py", "README.md", "runnercheck", *WINGS)
# Package folders of the checkout left out of the wheel on purpose: the benchmark lab's investigation
# tools (bench/lab/__init__.py says why); the wheel test checks they stay out.
NOT_SHIPPED = frozenset({"runnercheck.bench.lab"})


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def package_folders() -> dict[str, Path]:
    """Every package folder of the distribution (a folder with ``__init__.py``), by its import name."""
    package_dir = _pyproject()["tool"]["setuptools"]["package-dir"]
    found: dict[str, Path] = {}
    for top, folder in package_dir.items():
        if "." in top:  # the wings are mapped one by one; their subfolders are found by walking
            continue
        found[top] = REPO / folder
    for name, folder in package_dir.items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(root)
            found[".".join((name, *rel.parts)) if rel.parts else name] = init.parent
    return found


def test_pyproject_packages_name_every_package_folder() -> None:
    """A new subpackage (a folder with ``__init__.py`` under a wing) cannot be left out of the wheel."""
    tool = _pyproject()["tool"]["setuptools"]
    assert set(tool["package-dir"]) == {"runnercheck", *(f"runnercheck.{w}" for w in WINGS)}
    for name, folder in tool["package-dir"].items():
        assert (REPO / folder / "__init__.py").is_file(), f"package-dir maps {name} to {folder}/, which has no __init__.py"
    listed, on_disk = set(tool["packages"]), set(package_folders()) - NOT_SHIPPED
    assert not listed & NOT_SHIPPED, f"packages kept out of the wheel on purpose are listed: {sorted(listed & NOT_SHIPPED)}"
    assert not on_disk - listed, f"package folders missing from pyproject's packages list: {sorted(on_disk - listed)}"
    assert not listed - on_disk, f"pyproject lists packages with no folder: {sorted(listed - on_disk)}"
    from runnercheck.checks.provenance import SOURCE_PACKAGES

    assert set(SOURCE_PACKAGES) == listed, "provenance's SOURCE_PACKAGES (the code its digest names) must be the wheel's"


def _build_wheel(out: Path) -> Path:
    src = out / "src"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    dist = out / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(dist), str(src)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = dist.glob("runnercheck-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_holds_every_module_under_runnercheck_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    stray = sorted(n for n in names if n.split("/")[0] not in ("runnercheck", dist_info))
    assert not stray, f"files outside runnercheck/ (would shadow or be shadowed by a user's packages): {stray[:10]}"
    expected = set()
    for name, folder in package_folders().items():
        if name in NOT_SHIPPED:
            assert not any(n.startswith("/".join(name.split(".")) + "/") for n in names), f"{name} must not ship"
            continue
        target = "/".join(name.split("."))
        expected |= {f"{target}/{f.name}" for f in folder.iterdir() if f.suffix == ".py"}
    assert not expected - set(names), f"modules missing from the wheel: {sorted(expected - set(names))[:10]}"
    native = {f"runnercheck/impl/native/{f.name}" for f in (REPO / "impl" / "native").iterdir() if f.suffix in (".c", ".h")}
    assert native and native <= set(names), "the native C sources must ship (the build stamp is checked against them)"
    from runnercheck.impl.native.sources import MODULES

    built = {n.rsplit("/", 1)[1].split(".")[0] for n in names if n.startswith("runnercheck/impl/native/_") and n.endswith(".so")}
    assert built == {f"_{m}" for m in MODULES}, f"the wheel's compiled C parts: {sorted(built)}"
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "runnercheck = runnercheck.stress.pytest_plugin" in entry_points
    assert "runnercheck = runnercheck.stress.cli.main:main" in entry_points


# --------------------------------------------------------------------------- installed, in a user project

# The user's own packages with the names runnercheck's wings have in the repository.
USER_PACKAGES = {
    "checks/__init__.py": "chisq = None  # the user's checks package, not runnercheck's\nOWNER = 'user'\n",
    "stress/__init__.py": "OWNER = 'user'\n",
    "impl/__init__.py": "OWNER = 'user'\n",
}

USER_TESTS = '''
import os
import sys
from pathlib import Path

import torch

import checks
import impl
import stress
import runnercheck


def test_runnercheck_is_the_installed_wheel_and_user_packages_are_the_users():
    venv = Path(sys.prefix).resolve()
    assert Path(runnercheck.__file__).resolve().is_relative_to(venv), runnercheck.__file__
    from runnercheck.checks.chisq import run as their_chisq
    from runnercheck.stress import pytest_plugin
    for mod in (their_chisq, pytest_plugin):
        assert Path(mod.__file__).resolve().is_relative_to(venv), mod.__file__
    checkout = Path(os.environ["RUNNERCHECK_CHECKOUT"]).resolve()
    assert all(not p or Path(p).resolve() != checkout for p in sys.path), sys.path
    assert not any("__editable__" in type(f).__module__ for f in sys.meta_path), sys.meta_path
    assert (checks.OWNER, stress.OWNER, impl.OWNER) == ("user", "user", "user")
    assert checks.chisq is None
    assert Path(checks.__file__).resolve().parent.parent == Path.cwd().resolve()


def my_sampler(logits, params, seeds, positions):
    """Softmax(logits / T) and torch.multinomial; T = 0 is greedy."""
    temperature = torch.tensor([p.temperature for p in params], dtype=logits.dtype).unsqueeze(1)
    gen = torch.Generator().manual_seed((int(seeds[0]) * 1_000_003 + int(positions[0])) % 2**63)
    probs = torch.softmax(logits / temperature.clamp(min=1e-6), dim=1)
    sampled = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    return torch.where(temperature.squeeze(1) == 0, logits.argmax(dim=1), sampled)


my_sampler.supported_params = {"temperature"}


def test_chisq_fixture(runnercheck_chisq):
    summary = runnercheck_chisq(my_sampler, cases=["temperature-1-v97", "greedy-v97"], samples=2000)
    assert len(summary.tests) >= 2


def test_differential_fixture(runnercheck_differential):
    runnercheck_differential(steps=4)  # the built-in runner: Triton kernels, native parts, from the wheel
'''


def _dependency_site_dirs() -> list[str]:
    """The test process's site-packages directories (torch, numpy, pytest, ...), never the checkout."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    out: list[str] = []
    for d in dirs:
        if d and Path(d).is_dir() and Path(d).resolve() != REPO and d not in out:
            out.append(d)
    return out


def _fresh_venv(root: Path, wheel: Path) -> Path:
    """A venv with the wheel installed (not editable) and the test environment's dependencies visible."""
    venv = root / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True, text=True, timeout=300,
                   # A PYTHONPATH naming the checkout would make pip see runnercheck as installed already.
                   env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")})
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    # Lines of a .pth file are appended to sys.path after the venv's own site-packages, and .pth
    # files inside them (the test environment's editable install of runnercheck) are not run.
    (Path(purelib) / "zz_test_dependencies.pth").write_text("\n".join(_dependency_site_dirs()) + "\n")
    return python


def _user_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PYTEST_", "RUNNERCHECK_", "TRITON_INTERPRET", "VIRTUAL_ENV"))}
    env.update(CUDA_VISIBLE_DEVICES="", RUNNERCHECK_CHECKOUT=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    return env


def test_installed_wheel_runs_the_plugin_in_a_project_with_its_own_checks_stress_impl(wheel: Path, tmp_path: Path) -> None:
    python = _fresh_venv(tmp_path, wheel)
    project = tmp_path / "project"
    for rel, text in USER_PACKAGES.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    (project / "tests").mkdir()
    (project / "tests" / "test_user.py").write_text(USER_TESTS)
    # What the child sees, before pytest runs: the wheel's runnercheck, the user's checks.
    probe = subprocess.run(
        [str(python), "-c", "import json, sys, runnercheck, checks; from runnercheck.checks.provenance import source_digest; "
         "print(json.dumps({'runnercheck': runnercheck.__file__, 'checks': checks.__file__, 'path': sys.path, "
         "'digest': source_digest()}))"],
        cwd=project, env=_user_env(), capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert Path(seen["runnercheck"]).resolve().is_relative_to((tmp_path / "venv").resolve())
    assert Path(seen["checks"]).resolve() == (project / "checks" / "__init__.py").resolve()
    assert str(REPO) not in seen["path"]
    from runnercheck.checks.provenance import source_digest

    assert seen["digest"] == source_digest() is not None  # the same code: the same digest, installed or checked out
    result = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--runnercheck-device", "sim",
         "tests/test_user.py"],
        cwd=project, env=_user_env(), capture_output=True, text=True, timeout=600)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "3 passed" in out, out[-4000:]
    assert "cannot import name" not in out
