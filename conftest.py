"""Suite-wide test configuration.

TRITON_INTERPRET must be set before triton is imported anywhere, so this runs first: when no
CUDA device is present, kernels run in Triton's interpreter on CPU tensors.  Before that, an
xdist worker is pinned to one of several visible GPUs (`runnercheck.stress.gpu_workers`).
"""
from __future__ import annotations

import os

# Before anything can initialise CUDA: an xdist worker keeps one of several visible GPUs.
import runnercheck.stress.gpu_workers  # noqa: E402,F401

pytest_plugins = ["runnercheck.stress.gpu_workers"]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from runnercheck.impl.kernels.interpreted_memory import check_interpreted_memory
    from runnercheck.impl.kernels.interpreter import speed_up_interpreter

    # Here, not only in the pytest plugin: the suite runs at the same speed, and with the same memory
    # checks, with `-p no:runnercheck`.
    speed_up_interpreter()
    check_interpreted_memory()

    # xdist already runs one worker per core; intra-op threads on top only oversubscribe
    # (measured: a smoke run took 11-19 s with the default threads vs 0.9 s with one).
    torch.set_num_threads(1)

import pytest  # noqa: E402
from hypothesis import HealthCheck, Verbosity, settings  # noqa: E402

settings.register_profile(
    "dev", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci",
    max_examples=20,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "nightly",
    max_examples=500,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    verbosity=Verbosity.normal,
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_addoption(parser: pytest.Parser) -> None:
    # No "auto" here: that word means "cuda, else sim" everywhere (`resolve_device_kind`), and the
    # device-parametrised unit tests want cpu when there is no GPU (sim is for the race tests).
    parser.addoption(
        "--device",
        action="store",
        default="cuda" if _cuda_available() else "cpu",
        choices=["cuda", "cpu", "sim"],
        help="device kind for device-parametrised tests (default: cuda when present, else cpu)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def device_kind(request: pytest.FixtureRequest) -> str:
    kind = request.config.getoption("--device")
    if kind == "cuda" and not _cuda_available():
        pytest.skip("needs a CUDA device")
    return kind


@pytest.fixture
def device(device_kind: str):
    from runnercheck.impl.device import Device

    return Device(device_kind, seed=0)
