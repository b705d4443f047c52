"""The host-sync detector: every trap fires when its bug is planted, and stays quiet otherwise."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from runnercheck.checks.detectors.sync import (
    SYNC_CHECK_ENV,
    HostSyncError,
    SyncReport,
    allow_host_sync,
    arm_runner,
    forbid_host_sync,
)
from runnercheck.impl.device import HOST_WAIT_HOOKS, Device

THIS_FILE = os.path.basename(__file__)
needs_interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton kernels on cpu/sim tensors need TRITON_INTERPRET=1"
)


@pytest.fixture(params=["cpu", "sim"])
def dev(request: pytest.FixtureRequest) -> Device:
    return Device(request.param, seed=0, lag_policy="lag-1-steps") if request.param == "sim" else Device("cpu")


def _tensors(dev: Device) -> dict[str, torch.Tensor]:
    d = dev.zeros(8, torch.int64)
    d[3] = 5
    pinned = dev.pinned(8, torch.int64)
    return {
        "d": d,
        "d0": d[3],
        "host": torch.zeros(8, dtype=torch.int64),
        "pinned": pinned,
        "pinned_strided": dev.pinned(16, torch.int64)[::2],
    }


# Each trap is one line, so the error can be checked to name exactly that line.
TRAPS = {
    "item": lambda t, dev: t["d0"].item(),
    "tolist": lambda t, dev: t["d"].tolist(),
    "bool": lambda t, dev: bool(t["d0"]),
    "int": lambda t, dev: int(t["d0"]),
    "float": lambda t, dev: float(t["d0"]),
    "index": lambda t, dev: [0, 1, 2, 3, 4, 5][t["d0"]],
    "numpy": lambda t, dev: t["d"].numpy(),
    "np.asarray": lambda t, dev: np.asarray(t["d"]),
    "cpu": lambda t, dev: t["d"].cpu(),
    "to('cpu')": lambda t, dev: t["d"].to("cpu"),
    "to(device cpu)": lambda t, dev: t["d"].to(torch.device("cpu")),
    "to(host tensor)": lambda t, dev: t["d"].to(t["host"]),
    "to(device=cpu)": lambda t, dev: t["d"].to(device="cpu"),
    "repr": lambda t, dev: repr(t["d"]),
    "f-string": lambda t, dev: f"{t['d0']}",
    "in": lambda t, dev: 5 in t["d"],
    "derived sum": lambda t, dev: t["d"].sum().item(),
    "derived compare": lambda t, dev: bool((t["d"] > 2).any()),
    "torch.equal": lambda t, dev: torch.equal(t["d"], t["d"]),
    "nonzero": lambda t, dev: t["d"].nonzero(),
    "torch.where(cond)": lambda t, dev: torch.where(t["d"] > 0),
    "masked index": lambda t, dev: t["d"][t["d"] > 0],
    "masked assign": lambda t, dev: t["d"].__setitem__(t["d"] > 0, 1),
    "unique": lambda t, dev: torch.unique(t["d"]),
    "repeat_interleave": lambda t, dev: t["d"].repeat_interleave(t["d"]),
    "blocking d2h copy_": lambda t, dev: t["host"].copy_(t["d"]),
    "blocking h2d copy_": lambda t, dev: t["d"].copy_(t["host"]),
    "non_blocking pageable h2d": lambda t, dev: t["d"].copy_(t["host"], non_blocking=True),
    "non_blocking non-dense pinned h2d": lambda t, dev: t["d"].copy_(t["pinned_strided"], non_blocking=True),
    "non_blocking d2h into pageable": lambda t, dev: t["host"].copy_(t["d"], non_blocking=True),
    "Device.synchronize": lambda t, dev: dev.synchronize(),
    "DeviceEvent.synchronize": lambda t, dev: dev.record_event().synchronize(),
}


@pytest.mark.parametrize("trap", list(TRAPS))
def test_trap_raises_naming_the_line(dev: Device, trap: str) -> None:
    t = _tensors(dev)
    fn = TRAPS[trap]
    with pytest.raises(HostSyncError) as info:
        with forbid_host_sync(dev.kind):
            fn(t, dev)
    assert info.value.location.split(" ")[0].endswith(f"{THIS_FILE}:{fn.__code__.co_firstlineno}"), info.value


# The same operations on host memory (or the async-safe form of a copy) are not host syncs.
CLEAN = {
    "host reads": lambda t, dev: (t["host"].tolist(), t["host"][0].item(), bool(t["host"][0]), repr(t["host"])),
    "pinned reads": lambda t, dev: (t["pinned"].tolist(), t["pinned"].numpy()),
    "device math": lambda t, dev: (t["d"] + 1).mul_(2).to(torch.float32).sum(),
    "device int indexing": lambda t, dev: t["d"][torch.tensor([0, 2])],
    "metadata": lambda t, dev: (t["d"].shape, t["d"].numel(), t["d"].dtype, len(t["d"])),
    "non_blocking pinned h2d": lambda t, dev: t["d"].copy_(t["pinned"], non_blocking=True),
    "event query": lambda t, dev: dev.record_event().query(),
    "device to device": lambda t, dev: t["d"].to(dev.zeros(8, torch.int64)),
    "enqueued reads": lambda t, dev: (
        dev.enqueue(lambda: (t["d"].tolist(), t["pinned"].copy_(t["d"]), t["d"].sum().item())),
        dev.begin_step(),
        dev.begin_step(),  # lag-1-steps: the closure runs now, inside the scope
        dev.num_pending == 0 or pytest.fail("closure did not run inside the scope"),
    ),
}


@pytest.mark.parametrize("case", list(CLEAN))
def test_clean_operations_pass(dev: Device, case: str) -> None:
    t = _tensors(dev)
    with forbid_host_sync(dev.kind) as scope:
        CLEAN[case](t, dev)
    assert scope.count == 0
    with allow_host_sync("test drains the queue"):
        dev.synchronize()


@triton.jit
def _add_one_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask) + 1, mask=mask)


@needs_interpreter
def test_interpreted_kernel_inside_enqueued_closure_is_device_work(dev: Device) -> None:
    src = dev.zeros(16, torch.int32)
    dst = dev.zeros(16, torch.int32)
    out = dev.pinned(16, torch.int32)
    with forbid_host_sync(dev.kind) as scope:
        dev.enqueue(lambda: _add_one_kernel[(2,)](src, dst, 16, BLOCK=8), "kernel")
        dev.enqueue(lambda: out.copy_(dst, non_blocking=True), "d2h")
        event = dev.record_event()
        with allow_host_sync("AsyncOutput.get"):
            event.synchronize()
        assert out.tolist() == [1] * 16
    assert scope.count == 0


def test_allow_scope_and_rearming_inside_it(dev: Device) -> None:
    x = dev.zeros(4, torch.int64)
    with forbid_host_sync(dev.kind):
        with allow_host_sync("AsyncOutput.get"):
            x.tolist()
            dev.synchronize()
            with pytest.raises(HostSyncError):
                with forbid_host_sync(dev.kind):
                    x.tolist()
            x.tolist()
        with pytest.raises(HostSyncError):
            x.tolist()


def test_count_mode_counts_without_raising(dev: Device) -> None:
    x = dev.zeros(4, torch.int64)
    with forbid_host_sync(dev.kind, mode="count") as scope:
        for _ in range(3):
            x.tolist()
        dev.synchronize()
        y = x.sum()
    assert scope.count == 4
    assert [what for what, _ in scope.events] == [".tolist() on device memory"] * 3 + ["Device.synchronize (host wait on the device)"]
    assert all(THIS_FILE in loc for _, loc in scope.events)
    assert y.item() == 0  # outside the scope: not counted
    assert scope.count == 4


def test_nesting_records_in_every_scope_and_error_wins(dev: Device) -> None:
    x = dev.zeros(4, torch.int64)
    with forbid_host_sync(dev.kind, mode="count") as outer:
        with forbid_host_sync(dev.kind, mode="count") as inner:
            x.tolist()
        assert inner.count == 1
        with pytest.raises(HostSyncError):
            with forbid_host_sync(dev.kind, mode="error"):
                x.tolist()
        x.tolist()
    assert outer.count == 3
    with forbid_host_sync(dev.kind, mode="error"):
        with pytest.raises(HostSyncError):
            with forbid_host_sync(dev.kind, mode="count"):
                x.tolist()


def test_exit_restores_everything(dev: Device) -> None:
    x = dev.zeros(4, torch.int64)
    hooks_before = list(HOST_WAIT_HOOKS)
    modes_before = torch._C._len_torch_function_stack()
    with forbid_host_sync(dev.kind):
        with forbid_host_sync(dev.kind):
            pass
        assert len(HOST_WAIT_HOOKS) == len(hooks_before) + 1
    with pytest.raises(HostSyncError):
        with forbid_host_sync(dev.kind):
            x.tolist()
    assert HOST_WAIT_HOOKS == hooks_before
    assert torch._C._len_torch_function_stack() == modes_before
    x.tolist()
    dev.synchronize()


def test_scopes_must_exit_in_order() -> None:
    outer = forbid_host_sync("cpu")
    allow = allow_host_sync("x")
    outer.__enter__()
    allow.__enter__()
    with pytest.raises(RuntimeError, match="out of order"):
        outer.__exit__(None, None, None)
    allow.__exit__(None, None, None)
    outer.__exit__(None, None, None)


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="mode"):
        forbid_host_sync("cpu", mode="loud")
    with pytest.raises(ValueError, match="device_kind"):
        forbid_host_sync("tpu")
    with pytest.raises(ValueError, match="non-empty"):
        allow_host_sync("")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            forbid_host_sync("cuda")


def test_other_threads_are_not_affected(dev: Device) -> None:
    x = dev.zeros(4, torch.int64)
    armed, done = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def other_thread() -> None:
        armed.wait(5)
        try:
            results["read"] = x.tolist()
            dev.synchronize()
        except BaseException as e:  # noqa: BLE001 - reported to the main thread
            results["error"] = e
        done.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    with forbid_host_sync(dev.kind):
        armed.set()
        assert done.wait(5)
    worker.join()
    assert "error" not in results and results["read"] == [0, 0, 0, 0]

    # and a thread that arms itself does not arm this one
    inside, release = threading.Event(), threading.Event()

    def arming_thread() -> None:
        with forbid_host_sync(dev.kind, mode="count") as scope:
            inside.set()
            release.wait(5)
            results["thread_count"] = scope.count

    worker = threading.Thread(target=arming_thread)
    worker.start()
    assert inside.wait(5)
    x.tolist()
    release.set()
    worker.join()
    assert results["thread_count"] == 0


# --------------------------------------------------------------------------- arm_runner


class _FakeOutput:
    def __init__(self, event, host_tokens: torch.Tensor):  # noqa: ANN001
        self._event, self._host = event, host_tokens

    def get(self) -> list[int]:
        self._event.synchronize()
        return self._host.tolist()


class _SlottedOutput(_FakeOutput):
    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        if name == "get":
            raise AttributeError("read-only")
        super().__setattr__(name, value)


class _FakeRunner:
    """Decodes ``token + 1`` on the device; ``careless`` plants a host read in the hot path."""

    def __init__(self, device: Device, careless: bool = False, output_cls: type = _FakeOutput):
        self.device = device
        self.careless = careless
        self.output_cls = output_cls
        self.tokens = device.zeros(4, torch.int64)

    def execute_model(self, sched: object) -> _FakeOutput:
        self.device.begin_step()
        if self.careless and self.tokens[0].item() >= 0:
            pass
        host = self.device.pinned(4, torch.int64)
        tokens = self.tokens
        self.device.enqueue(lambda: (tokens.add_(1), host.copy_(tokens, non_blocking=True)), "step")
        return self.output_cls(self.device.record_event(), host)


@pytest.mark.parametrize("output_cls", [_FakeOutput, _SlottedOutput])
def test_arm_runner_clean_runner_passes_and_get_is_allowed(output_cls: type) -> None:
    runner = _FakeRunner(Device("sim", lag_policy="lag-1-steps"), output_cls=output_cls)
    report = arm_runner(runner, mode="error")
    outputs = [runner.execute_model(None) for _ in range(3)]
    assert [o.get() for o in outputs] == [[1] * 4, [2] * 4, [3] * 4]
    assert report.count == 0 and report.mode == "error"
    with pytest.raises(ValueError, match="already armed"):
        arm_runner(runner, mode="count")


def test_arm_runner_catches_a_hot_path_read() -> None:
    runner = _FakeRunner(Device("sim"), careless=True)
    report = arm_runner(runner, mode="error")
    with pytest.raises(HostSyncError, match="item"):
        runner.execute_model(None)
    assert report.count == 1 and "execute_model" in report.events[0][1]


def test_arm_runner_count_mode() -> None:
    runner = _FakeRunner(Device("cpu"), careless=True)
    report = arm_runner(runner, mode="count")
    for _ in range(5):
        runner.execute_model(None).get()
    assert report.count == 5
    assert "5 x .item() on device memory" in report.summary()


def test_env_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SYNC_CHECK_ENV, raising=False)
    runner = _FakeRunner(Device("cpu"), careless=True)
    report = arm_runner(runner)
    runner.execute_model(None).get()
    assert report.mode == "off" and report.count == 0

    monkeypatch.setenv(SYNC_CHECK_ENV, "count")
    runner = _FakeRunner(Device("cpu"), careless=True)
    report = arm_runner(runner)
    runner.execute_model(None).get()
    assert report.mode == "count" and report.count == 1

    monkeypatch.setenv(SYNC_CHECK_ENV, "ERROR")
    runner = _FakeRunner(Device("cpu"), careless=True)
    arm_runner(runner)
    with pytest.raises(HostSyncError):
        runner.execute_model(None)

    monkeypatch.setenv(SYNC_CHECK_ENV, "sometimes")
    with pytest.raises(ValueError, match=SYNC_CHECK_ENV):
        arm_runner(_FakeRunner(Device("cpu")))


def test_report_summary() -> None:
    report = SyncReport("count", [("a", "f.py:1"), ("a", "f.py:1"), ("b", "g.py:2")])
    assert report.count == 3
    assert report.summary().splitlines()[1].split() == ["2", "x", "a", "at", "f.py:1"]
    assert SyncReport().summary() == "no host syncs"


# --------------------------------------------------------------------------- cuda

CUDA_TRAPS = {
    "item": lambda t: t["d"][0].item(),
    "nonzero": lambda t: t["d"].nonzero(),
    "masked index": lambda t: t["d"][t["d"] > 0],
    "torch.cuda.synchronize": lambda t: torch.cuda.synchronize(),
    "Event.synchronize": lambda t: t["event"].synchronize(),
    "Stream.synchronize": lambda t: torch.cuda.current_stream().synchronize(),
    "non_blocking pageable h2d": lambda t: t["d"].copy_(t["host"], non_blocking=True),
    "non_blocking pageable .to": lambda t: t["host"].to("cuda", non_blocking=True),
    "non_blocking non-dense pinned h2d": lambda t: t["d"].copy_(t["pinned_strided"], non_blocking=True),
    "Device.synchronize": lambda t: t["dev"].synchronize(),
    "bincount (sync-debug only)": lambda t: torch.bincount(t["d"]),
    "one_hot (sync-debug only)": lambda t: torch.nn.functional.one_hot(t["d"]),
}


def _cuda_tensors() -> dict[str, object]:
    dev = Device("cuda")
    event = torch.cuda.Event()
    event.record()
    return {
        "dev": dev,
        "d": torch.arange(8, device="cuda"),
        "host": torch.arange(8),
        "pinned": torch.arange(8).pin_memory(),
        "pinned_strided": torch.arange(16).pin_memory()[::2],
        "event": event,
    }


@pytest.mark.gpu
@pytest.mark.parametrize("trap", list(CUDA_TRAPS))
def test_cuda_trap_raises_naming_the_line(trap: str) -> None:
    t = _cuda_tensors()
    fn = CUDA_TRAPS[trap]
    with pytest.raises(HostSyncError) as info:
        with forbid_host_sync("cuda"):
            fn(t)
    assert info.value.location.split(" ")[0].endswith(f"{THIS_FILE}:{fn.__code__.co_firstlineno}"), info.value
    if "sync-debug only" in trap:
        assert "sync-debug" in info.value.what


@pytest.mark.gpu
@pytest.mark.parametrize("trap", list(CUDA_TRAPS))
def test_cuda_count_mode_does_not_double_count(trap: str) -> None:
    t = _cuda_tensors()
    with forbid_host_sync("cuda", mode="count") as scope:
        CUDA_TRAPS[trap](t)
    if "sync-debug only" in trap:
        assert scope.count >= 1, scope.events  # bincount really syncs twice (min and max)
    else:
        assert scope.count == 1, scope.events  # our trap and sync-debug mode never both count one op


@pytest.mark.gpu
def test_cuda_clean_step_and_restore() -> None:
    t = _cuda_tensors()
    out = torch.empty(8, dtype=torch.int64).pin_memory()
    before = torch.cuda.get_sync_debug_mode()
    with forbid_host_sync("cuda") as scope:
        t["d"].copy_(t["pinned"], non_blocking=True)
        y = (t["d"] * 2).cumsum(0)
        out.copy_(y, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        ev.query()
        with allow_host_sync("AsyncOutput.get"):
            ev.synchronize()
            assert out.tolist() == (torch.arange(8) * 2).cumsum(0).tolist()
    assert scope.count == 0
    assert torch.cuda.get_sync_debug_mode() == before
    t["d"][0].item()
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_cuda_other_thread_not_affected() -> None:
    d = torch.arange(4, device="cuda")
    armed, done = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def other_thread() -> None:
        armed.wait(5)
        try:
            results["value"] = d[1].item()
            d.nonzero()
            torch.cuda.synchronize()
        except BaseException as e:  # noqa: BLE001
            results["error"] = e
        done.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    with forbid_host_sync("cuda"):
        armed.set()
        assert done.wait(10)
        with pytest.raises(HostSyncError):
            d.nonzero()
    worker.join()
    assert "error" not in results and results["value"] == 1
