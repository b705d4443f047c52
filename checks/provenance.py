"""Where a result came from: when, the runnercheck version and commit, the library versions, the
device and the exact command line.

Every JSON a command writes (repro, summary, chisq, mutants, bench) carries a ``provenance``
block, and every report's top Markdown its `markdown_lines`, so a figure or a repro can be traced
to the code and machine that produced it, and `replay` can say clearly when it runs on something
else than what recorded.

The commit is reported only when the package runs from a runnercheck checkout (the folder above
the package holds a ``pyproject.toml`` naming runnercheck): installed from a wheel into a venv
inside a user's repository, git would otherwise answer with the user's commit.  The sources'
digest (`source_digest`) names the code itself, wherever it runs: a wheel has no commit, and a
copied tree whose git metadata is older than its files reports the older commit (``-dirty``).
"""
from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import platform
import shlex
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

_REPO_ROOT = Path(__file__).resolve().parent.parent

# Keys whose difference changes results (a replay on another torch may sample other bits of a
# kernel); the rest (git commit) is reported but is expected to differ during development.
COMPARED_KEYS = ("runnercheck", "git_commit", "source_digest", "torch", "triton", "numpy", "device_name")

# runnercheck's packages, as pyproject.toml's ``packages`` lists them (tests/packaging holds the two equal): the
# files `source_digest` reads.  A folder outside them (bench/lab) is not shipped, so it is not part of the code.
SOURCE_PACKAGES = (
    "runnercheck", "runnercheck.impl", "runnercheck.impl.kernels", "runnercheck.impl.model", "runnercheck.impl.native",
    "runnercheck.impl.sample", "runnercheck.reference", "runnercheck.checks", "runnercheck.checks.chisq",
    "runnercheck.checks.detectors", "runnercheck.stress", "runnercheck.stress.cli", "runnercheck.stress.invariance",
    "runnercheck.stress.mutants", "runnercheck.stress.report", "runnercheck.stress.run", "runnercheck.stress.sim",
    "runnercheck.bench",
)
_SOURCE_SUFFIXES = (".py", ".c", ".h")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


_command_line: str | None = None


def record_command_line(argv: list[str], program: str = "runnercheck") -> None:
    """Remember the command line a CLI was given (``program`` and its arguments), for every report it writes."""
    global _command_line
    _command_line = shlex.join([program, *argv])


def command_line() -> str:
    """The recorded command line, else this process's own ``sys.argv``."""
    return _command_line if _command_line is not None else shlex.join(sys.argv)


def utc_now() -> str:
    """Now, as an ISO 8601 UTC timestamp to the second (``2025-01-31T12:00:00Z``)."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_runnercheck_checkout(root: Path) -> bool:
    """Whether ``root`` is a runnercheck source checkout: its ``pyproject.toml`` names the project runnercheck."""
    try:
        doc = tomllib.loads((root / "pyproject.toml").read_text())
    except (OSError, ValueError):
        return False
    return doc.get("project", {}).get("name") == "runnercheck"


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The runnercheck checkout's commit (with ``-dirty`` when the tree has changes); None when the
    package does not run from a runnercheck checkout or git cannot tell."""
    if not is_runnercheck_checkout(_REPO_ROOT):
        return None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO_ROOT, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_REPO_ROOT,
                               capture_output=True, text=True, timeout=5)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _package_folder(name: str) -> Path | None:
    """The folder of package ``name`` (``runnercheck.<wing>...``): under ``runnercheck/`` in a wheel, beside it in a
    checkout (`runnercheck.__path__` holds both places)."""
    import runnercheck

    parts = name.split(".")[1:]
    for entry in runnercheck.__path__:
        folder = Path(entry).joinpath(*parts)
        if (folder / "__init__.py").is_file():
            return folder
    return None


@functools.lru_cache(maxsize=1)
def source_digest() -> str | None:
    """The first 16 hex digits of a sha256 over runnercheck's own sources: each package's ``.py``, ``.c`` and ``.h``
    files (`SOURCE_PACKAGES`, not their subfolders), in order, each as its package, name, size and bytes.  The same
    code gives the same digest on any machine, from a wheel or a checkout, whatever git says; ``runnercheck env``
    prints it, so a result can be matched to a tree by hand.  None when a package's folder cannot be found."""
    digest = hashlib.sha256()
    for package in SOURCE_PACKAGES:
        folder = _package_folder(package)
        if folder is None:
            return None
        for path in sorted(p for p in folder.iterdir() if p.suffix in _SOURCE_SUFFIXES and p.is_file()):
            data = path.read_bytes()
            digest.update(f"{package}/{path.name}\0{len(data)}\0".encode())
            digest.update(data)
    return digest.hexdigest()[:16]


def _torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def provenance(device_name: str | None = None) -> dict[str, Any]:
    """The provenance block for a result written now (`device_name`: e.g. ``NVIDIA H200`` or ``sim``)."""
    import numpy

    return {
        "date": utc_now(),
        "command_line": command_line(),
        "runnercheck": _version("runnercheck") or "unknown",
        "git_commit": git_commit(),
        "source_digest": source_digest(),
        "python": platform.python_version(),
        "torch": _torch_version(),
        "triton": _triton_version(),
        "numpy": numpy.__version__,
        "device_name": device_name,
        "platform": platform.platform(),
    }


def markdown_lines(prov: dict[str, Any]) -> list[str]:
    """The lines a report's Markdown shows its provenance with: date, versions, command line."""
    code = [f"commit {prov['git_commit']}"] if prov.get("git_commit") else []
    code += [f"sources {prov['source_digest']}"] if prov.get("source_digest") else []
    commit = f" ({', '.join(code)})" if code else ""
    libraries = ", ".join(f"{name} {prov[name]}" for name in ("python", "torch", "triton", "numpy") if prov.get(name))
    device = f"; device {prov['device_name']}" if prov.get("device_name") else ""
    return [f"- date: {prov.get('date', 'unknown')}",
            f"- runnercheck {prov.get('runnercheck', 'unknown')}{commit}; {libraries}{device}",
            f"- command: `{prov.get('command_line', 'unknown')}`"]


def device_name(kind: str) -> str:
    """A readable name for a device kind: the GPU's name on cuda, the kind itself elsewhere."""
    if kind == "cuda":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    return kind


def provenance_differences(recorded: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """Human-readable differences in the keys that matter; a missing recording is one difference."""
    if not recorded:
        return ["the recording has no provenance (written by an older runnercheck)"]
    return [
        f"{key}: recorded {recorded.get(key)!r}, running {current.get(key)!r}"
        for key in COMPARED_KEYS
        if recorded.get(key) != current.get(key)
    ]
