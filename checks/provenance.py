"""Where a result came from: the runnercheck version and commit, the library versions, the device.

Every JSON a command writes (repro, summary, chisq, mutants, bench) carries a ``provenance``
block, so a figure or a repro can be traced to the code and machine that produced it, and
`replay` can say clearly when it runs on something else than what recorded.
"""
from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

_REPO_ROOT = Path(__file__).resolve().parent.parent

# Keys whose difference changes results (a replay on another torch may sample other bits of a
# kernel); the rest (git commit) is reported but is expected to differ during development.
COMPARED_KEYS = ("runnercheck", "git_commit", "torch", "triton", "numpy", "device_name")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The checkout's commit (with ``-dirty`` when the tree has changes), or None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO_ROOT, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_REPO_ROOT,
                               capture_output=True, text=True, timeout=5)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


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
        "runnercheck": _version("runnercheck") or "unknown",
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "torch": _torch_version(),
        "triton": _triton_version(),
        "numpy": numpy.__version__,
        "device_name": device_name,
        "platform": platform.platform(),
    }


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
