"""pytest-xdist workers pinned one per visible GPU, and each worker's device in the run's log.

Importing this module pins the process: in an xdist worker (``PYTEST_XDIST_WORKER=gw<k>``) whose
``CUDA_VISIBLE_DEVICES`` lists several devices, it keeps only device ``k mod n`` of that list, so
the workers spread over the GPUs one each in turn.  It must run before CUDA initialises (the CUDA
runtime reads the variable once): the suite's ``conftest.py`` imports it before torch, and
``pytest -p runnercheck.stress.gpu_workers`` does the same for another suite.  An empty or one-device list,
or a process that is not an xdist worker, is left as it is.

As a pytest plugin it reports where each worker ran: a worker hands its pinned list to the
controller when it finishes (xdist's ``workeroutput``), and the controller prints one line per
worker in the terminal summary (``gw0: CUDA_VISIBLE_DEVICES=0``).

Ownership: the module writes only this process's ``CUDA_VISIBLE_DEVICES`` (once, at import) and
the controller's list of worker lines (host, one session).
"""
from __future__ import annotations

import os
from typing import Any, MutableMapping

import pytest

WORKER_OUTPUT_KEY = "runnercheck_cuda_visible_devices"


def worker_devices(worker: str | None, visible: str | None) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` value for xdist worker ``worker`` (``gw<k>``) given the parent's
    ``visible`` list; None when nothing should change (no worker, unset, empty or one device)."""
    if not worker or not worker.startswith("gw") or not worker[2:].isdigit() or visible is None:
        return None
    devices = [d.strip() for d in visible.split(",") if d.strip()]
    if len(devices) < 2:
        return None
    return devices[int(worker[2:]) % len(devices)]


def pin_worker_gpu(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Pin this process (see the module docstring); returns the new value, or None if unchanged."""
    pinned = worker_devices(environ.get("PYTEST_XDIST_WORKER"), environ.get("CUDA_VISIBLE_DEVICES"))
    if pinned is not None:
        environ["CUDA_VISIBLE_DEVICES"] = pinned
    return pinned


PINNED = pin_worker_gpu()
_worker_lines: list[str] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)  # set on xdist workers only
    if output is not None:
        output[WORKER_OUTPUT_KEY] = (os.environ.get("PYTEST_XDIST_WORKER", "?"), os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    output = getattr(node, "workeroutput", None) or {}
    if WORKER_OUTPUT_KEY in output:
        worker, devices = output[WORKER_OUTPUT_KEY]
        _worker_lines.append(f"{worker}: CUDA_VISIBLE_DEVICES={devices}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _worker_lines:
        terminalreporter.section("devices of the xdist workers")
        for line in sorted(_worker_lines):
            terminalreporter.write_line(line)
