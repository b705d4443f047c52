"""The device's launch thread (`runnercheck.impl.launcher`, `impl/native/launcher.c`).

On CPU the native worker runs with stand-ins for the driver's calls (ctypes callbacks with their signatures): jobs
are issued in push order and only once pushed, a paused worker issues nothing, a failed call is named by the next
wait and every one after it, and close issues what was pushed.  A build that reports pushed jobs as issued
(the plant ``issued_early``, tests/impl/native_plants.py) is caught.  On the GPU (``gpu``): a step's fused replay and its marker go
through the thread, a marker whose record the worker has not issued is not complete, and runner outputs with the
thread equal those without it.
"""
from __future__ import annotations

import ctypes
import time

import pytest
import torch

from native_plants import planted
from runnercheck.impl import native
from runnercheck.impl.launcher import LaunchThread, LaunchThreadError, _driver_calls, idle_settings, mode

_HANDLE_CALL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_CONTEXT_CALL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


def _address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


class StandIns:
    """Recording stand-ins for cuGraphLaunch, cuEventRecord and cuCtxSetCurrent; ``fail`` maps a handle to the code
    its call returns."""

    def __init__(self, fail: dict[int, int] | None = None, graph_seconds: float = 0.0):
        self.calls: list[tuple] = []
        self.fail = fail or {}
        self.graph_seconds = graph_seconds  # how long each graph call takes (a slow driver)
        self._keep = (_HANDLE_CALL(self._graph), _HANDLE_CALL(self._event), _CONTEXT_CALL(self._context))

    def _graph(self, handle, stream) -> int:
        self.calls.append(("graph", handle, stream))
        if self.graph_seconds:
            time.sleep(self.graph_seconds)
        return self.fail.get(handle, 0)

    def _event(self, handle, stream) -> int:
        self.calls.append(("event", handle, stream))
        return self.fail.get(handle, 0)

    def _context(self, context) -> int:
        self.calls.append(("context", context))
        return 0

    def launcher(self, module=None, spin_us: int = 50, nap_us: int = 0, nap_for_us: int = 0):
        module = module or _module()
        graph, event, context = (_address(f) for f in self._keep)
        return module.Launcher(graph, event, context, 77, spin_us, nap_us, nap_for_us)


def _module(plant: str | None = None):
    """The built launch thread module, or (``plant``) a variant of it with that planted bug (native_plants.py)."""
    if plant is not None:
        return planted(plant, "launcher")
    module = native.load("launcher")
    if module is None:
        pytest.skip("impl/native is not built here (RUNNERCHECK_NATIVE=0, or not built: " + native.BUILD_HINT + ")")
    return module


def _pushed_while_paused_is_not_issued(module) -> bool:
    """The check a launch thread must pass: jobs pushed while it is paused are neither called nor counted issued."""
    stand_ins = StandIns()
    launcher = stand_ins.launcher(module)
    try:
        time.sleep(0.01)  # the worker made its context current
        launcher.pause()
        launcher.graph(11, 5)
        launcher.event(12, 5)
        time.sleep(0.02)
        held = launcher.issued() == 0 and stand_ins.calls == [("context", 77)]
        launcher.resume()
        launcher.wait()
        return held and launcher.issued() == 2
    finally:
        launcher.close()


def test_jobs_are_issued_in_push_order_after_the_context_and_only_once_pushed():
    stand_ins = StandIns()
    launcher = stand_ins.launcher()
    try:
        seqs = [launcher.graph(1, 9), launcher.event(2, 9), launcher.graph(3, 8)]
        launcher.wait()
        assert seqs == [1, 2, 3]
        assert stand_ins.calls == [("context", 77), ("graph", 1, 9), ("event", 2, 9), ("graph", 3, 8)]
        assert launcher.issued() == launcher.pushed() == 3
        time.sleep(0.005)  # past its polling: the worker sleeps, and a push wakes it
        launcher.graph(4, 9)
        launcher.wait(4)
        assert stand_ins.calls[-1] == ("graph", 4, 9)
        with pytest.raises(ValueError, match="only 4 were pushed"):
            launcher.wait(5)
    finally:
        launcher.close()


def test_a_paused_launch_thread_issues_nothing_and_its_wait_raises():
    assert _pushed_while_paused_is_not_issued(_module())
    stand_ins = StandIns()
    launcher = stand_ins.launcher()
    try:
        launcher.pause()
        launcher.graph(1, 1)
        with pytest.raises(_module().LaunchError, match="paused"):
            launcher.wait()
    finally:
        launcher.close()  # issues the pushed job first
    assert stand_ins.calls[-1] == ("graph", 1, 1)


def test_planted_bug_a_launch_thread_reporting_pushed_jobs_as_issued_is_caught():
    """With issued() answering the jobs pushed, a marker still in the ring would pass for one on the stream: the
    device would ask CUDA about an event not yet recorded (whose last record completed long ago)."""
    assert not _pushed_while_paused_is_not_issued(_module("issued_early"))


def test_a_failed_call_is_named_by_every_later_wait_and_by_close():
    stand_ins = StandIns(fail={2: 700})
    module = _module()
    launcher = stand_ins.launcher(module)
    launcher.graph(1, 3)
    launcher.event(2, 3)
    launcher.graph(3, 3)
    with pytest.raises(module.LaunchError, match=r"cuEventRecord returned CUresult 700 \(launch-thread job 2\)"):
        launcher.wait()
    with pytest.raises(module.LaunchError, match="CUresult 700"):
        launcher.wait(1)
    assert [c[0] for c in stand_ins.calls] == ["context", "graph", "event", "graph"]  # the jobs after it still ran
    with pytest.raises(module.LaunchError, match="CUresult 700"):
        launcher.close()
    with pytest.raises(module.LaunchError, match="closed"):
        launcher.graph(4, 3)


def test_launch_thread_wait_raises_the_typed_error():
    stand_ins = StandIns(fail={5: 1})
    module = _module()
    thread = LaunchThread(stand_ins.launcher(module), 3, module.LaunchError)
    thread.graph(5, 3)
    with pytest.raises(LaunchThreadError, match="cuGraphLaunch returned CUresult 1"):
        thread.wait()
    with pytest.raises(LaunchThreadError, match="cuGraphLaunch returned CUresult 1"):
        thread.close()  # the same typed error as wait's


def test_the_workers_cpu_time_counts_its_polling_and_stops_at_close():
    """`cpu_seconds`: a worker polling after its last job uses CPU time (what the host_cost benchmark reports per
    step); one that sleeps at once (spin 0) uses next to none; after close the total stays."""
    module = _module()
    spinning = LaunchThread(StandIns().launcher(module, spin_us=2_000_000), 3, module.LaunchError)
    sleeping = LaunchThread(StandIns().launcher(module, spin_us=0), 3, module.LaunchError)
    try:
        for thread in (spinning, sleeping):
            thread.graph(1, 3)
            thread.wait()
        time.sleep(0.3)  # inside the spinning worker's 2 s of polling (on a busy 2-core box it still gets a share)
        polled, slept = spinning.cpu_seconds(), sleeping.cpu_seconds()
        assert polled > 0.03 and slept < 0.02, (polled, slept)
    finally:
        spinning.close()
        sleeping.close()
    total = spinning.cpu_seconds()
    time.sleep(0.02)
    assert total >= polled and spinning.cpu_seconds() == total


def test_phases_split_the_time_between_driver_calls_polling_and_the_callers_wait():
    """`phases`: a slow driver call (40 ms) shows in the worker's time inside the calls and, as the caller waits for
    it to be issued, in the caller's wait; a worker that polls 0.2 s between two jobs shows it as polling, one that
    sleeps at once (spin 0) shows next to none.  Wall-clock lower bounds: a busy box only adds to them."""
    module = _module()
    slow = LaunchThread(StandIns(graph_seconds=0.04).launcher(module, spin_us=0), 3, module.LaunchError)
    polling = LaunchThread(StandIns().launcher(module, spin_us=2_000_000), 3, module.LaunchError)
    try:
        slow.graph(1, 3)
        slow.wait()
        issue_ns, poll_ns, wait_ns, jobs = slow.phases()
        assert jobs == 1 and issue_ns >= 35e6 and wait_ns >= 35e6 and poll_ns < 20e6, (issue_ns, poll_ns, wait_ns)
        polling.graph(1, 3)
        polling.wait()
        time.sleep(0.2)  # inside its 2 s of polling; the next job ends the spell
        polling.graph(2, 3)
        polling.wait()
        issue_ns, poll_ns, wait_ns, jobs = polling.phases()
        assert jobs == 2 and poll_ns >= 0.15e9 and issue_ns < poll_ns, (issue_ns, poll_ns, wait_ns)
    finally:
        slow.close()
        polling.close()


def test_bad_launcher_arguments_are_typed_errors():
    module = _module()
    with pytest.raises(ValueError, match="spin_us"):
        module.Launcher(0, 0, 0, 0, 10)
    with pytest.raises(ValueError, match="spin_us"):
        module.Launcher(1, 1, 0, 0, -1)
    for nap_us, nap_for_us in ((0, 10), (-1, 0), (5, -1), (2_000_000, 10)):
        with pytest.raises(ValueError, match="nap_us"):
            module.Launcher(1, 1, 0, 0, 10, nap_us, nap_for_us)
    with pytest.raises(TypeError):
        module.Launcher("a", 1, 0, 0, 1)


def _issued_within(launcher, seconds: float) -> float:
    """Push one job to a worker idle past its polling and return how long it took to be issued."""
    time.sleep(seconds)
    pushed_at = time.perf_counter()
    launcher.graph(2, 9)
    launcher.wait()
    return time.perf_counter() - pushed_at


def test_a_napping_worker_takes_pushed_jobs_without_being_woken():
    """Past its polling a worker naps: a job pushed then is issued at a nap's end, with no system call from the pushing
    thread (``signals``), and a step's ``wake`` costs none either.  Past its naps it sleeps: a push wakes it (one
    signal each)."""
    stand_ins = StandIns()
    launcher = stand_ins.launcher(spin_us=200, nap_us=50, nap_for_us=3_000_000)
    try:
        launcher.graph(1, 9)
        launcher.wait()
        took = _issued_within(launcher, 0.02)  # napping
        launcher.wake()
        launcher.graph(3, 9)
        launcher.wait()
        assert launcher.signals() == 0, launcher.signals()
        assert took < 0.5, took  # a nap's end, not the naps' (3 s); a busy 2-core box may delay it a little
        assert [c[1] for c in stand_ins.calls[1:]] == [1, 2, 3]
    finally:
        launcher.close()
    no_naps = StandIns().launcher(spin_us=200)
    try:
        _issued_within(no_naps, 0.02)  # asleep: woken by the push
        assert no_naps.signals() == 1
    finally:
        no_naps.close()


def test_planted_bug_a_napping_worker_that_looks_only_for_wakes_is_caught():
    """A nap loop that waits for a step's ``wake`` and never looks at the ring leaves a job pushed without one in the
    ring until the naps end: the pushing step would wait for its own launch at its end."""
    launcher = StandIns().launcher(_module("nap_misses_push"), spin_us=200, nap_us=50,
                                   nap_for_us=1_500_000)
    try:
        assert _issued_within(launcher, 0.02) > 1.0
    finally:
        launcher.close()


@pytest.mark.parametrize("value", ["2", "yes"])
def test_bad_launch_thread_modes_are_typed_errors(monkeypatch, value):
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_THREAD", value)
    with pytest.raises(LaunchThreadError, match="RUNNERCHECK_LAUNCH_THREAD"):
        mode()


def test_the_launch_thread_is_off_on_request_and_without_a_driver(monkeypatch):
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_THREAD", "0")
    assert LaunchThread.start(0) is None
    if torch.cuda.is_available():
        return
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_THREAD", "auto")
    assert LaunchThread.start(0) is None  # no libcuda.so.1 or no context here: off, with a log line
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_THREAD", "1")
    with pytest.raises(LaunchThreadError, match="cannot start"):
        LaunchThread.start(0)
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_SPIN_US", "-3")
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_THREAD", "auto")
    with pytest.raises(LaunchThreadError, match="RUNNERCHECK_LAUNCH_SPIN_US"):
        LaunchThread.start(0)


@pytest.mark.parametrize("settings, named", [
    ({"RUNNERCHECK_LAUNCH_NAP_US": "x"}, "RUNNERCHECK_LAUNCH_NAP_US"),
    ({"RUNNERCHECK_LAUNCH_NAP_US": "2000000"}, "RUNNERCHECK_LAUNCH_NAP_US"),
    ({"RUNNERCHECK_LAUNCH_NAP_FOR_US": "-1"}, "RUNNERCHECK_LAUNCH_NAP_FOR_US"),
    ({"RUNNERCHECK_LAUNCH_NAP_US": "0", "RUNNERCHECK_LAUNCH_NAP_FOR_US": "50000"}, "RUNNERCHECK_LAUNCH_NAP_FOR_US=0"),
])
def test_bad_idle_settings_are_typed_errors(monkeypatch, settings, named):
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(LaunchThreadError, match=named):
        idle_settings()
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_NAP_FOR_US", "0")
    if "RUNNERCHECK_LAUNCH_NAP_US" in settings and settings["RUNNERCHECK_LAUNCH_NAP_US"] == "0":
        assert idle_settings()[1:] == (0, 0)  # no naps at all: accepted


def test_cpu_and_sim_devices_have_no_launch_thread():
    from runnercheck.impl.device import Device

    for kind in ("cpu", "sim"):
        assert Device(kind).launcher is None


# ---------------------------------------------------------------------------------------------------------- GPU
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _captured_add(device):
    """A CUDA graph adding 1 to a device counter, captured on the device's stream, and the counter."""
    from runnercheck.impl.device import GraphLaunch

    counter = device.zeros(1, torch.int64)
    device.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=device.stream):
        counter.add_(1)
    device.synchronize()
    counter.zero_()
    torch.cuda.synchronize()
    return GraphLaunch(graph), counter


@pytest.mark.gpu
@needs_gpu
def test_gpu_a_marker_the_worker_has_not_recorded_is_not_complete(monkeypatch):
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_THREAD", "1")
    from runnercheck.impl.device import Device

    device = Device("cuda")
    launch, counter = _captured_add(device)
    assert launch.exec_handle
    device.record_event().synchronize()  # a spare CUDA event whose last record completed
    first = device.record_event()
    first.synchronize()
    device.launcher.pause()
    pushed = device.launcher.pushed()
    device.enqueue(launch, "graph")
    marker = device.record_event()
    assert device.launcher.pushed() == pushed + 2  # the replay and its marker went to the worker
    assert not marker.query() and not marker.is_complete() and not marker.known_complete()
    device.launcher.resume()
    marker.synchronize()
    assert marker.query() and counter.item() == 1
    with device.on_stream():  # a step: its pushes are issued by the time it ends
        device.enqueue(launch, "graph")
        device.enqueue(launch, "graph")
        assert torch.cuda.current_stream() != device.stream  # all its work went to the worker: nothing switched
    assert not device._launch_pending and device.launcher.issued() == device.launcher.pushed()
    device.synchronize()
    assert counter.item() == 3


@pytest.mark.gpu
@needs_gpu
def test_gpu_planted_bug_a_marker_answered_before_its_record_is_issued_is_caught(monkeypatch):
    """The device's check that a marker's record was issued, against a launch thread that reports jobs as issued
    once pushed: the query asks CUDA about the spare event's old record and answers complete while the replay
    before it has not even been launched."""
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_THREAD", "1")
    from runnercheck.impl.device import Device

    device = Device("cuda")
    launch, counter = _captured_add(device)
    device.record_event().synchronize()
    planted = _module("issued_early")
    real = device.launcher
    graph, event, context_call, context = _driver_calls()
    device.launcher = LaunchThread(planted.Launcher(graph, event, context_call, context, 50), real.stream_handle,
                                   planted.LaunchError)
    try:
        device.launcher.pause()
        device.enqueue(launch, "graph")
        marker = device.record_event()
        answered_complete = marker.query()
        device.launcher.resume()
        device.synchronize()
    finally:
        device.launcher.close()
        device.launcher = real
    assert answered_complete  # the planted build is caught: the real one answers False here (test above)
    assert counter.item() == 1


@pytest.mark.gpu
@needs_gpu
def test_gpu_runner_outputs_with_the_launch_thread_equal_those_without(monkeypatch):
    from runnercheck.bench.common import BenchContext
    from runnercheck.bench.case_runner import host_cost_setup
    from runnercheck.impl.device import Device

    outputs = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("RUNNERCHECK_LAUNCH_THREAD", setting)
        device = Device("cuda", seed=0)
        assert (device.launcher is not None) == (setting == "1")
        torch.manual_seed(0)  # the stubbed forward's logits are drawn from torch's generator
        runner, work, _ = host_cost_setup(BenchContext(device, quick=False, seed=0), 64, 0.05)
        got = []
        for _ in range(40):
            got.append(runner.execute_model(work.next_step()).get())
        outputs[setting] = got
        if setting == "1":
            assert device.launcher.pushed() > 40  # the replays and their markers
    assert outputs["1"] == outputs["0"]


def test_a_captured_graph_is_enqueued_as_a_graph_launch_with_its_exec_handle():
    """`StepGraph.set_cuda_graph` (any object with a CUDA graph's two methods): what `run` enqueues is a `GraphLaunch`,
    which a device without a launch thread replays itself."""
    from runnercheck.impl.device import Device, GraphLaunch
    from runnercheck.impl.graphs import StepGraph

    class Captured:
        replays = 0

        def raw_cuda_graph_exec(self) -> int:
            return 1234

        def replay(self) -> None:
            Captured.replays += 1

    graph = StepGraph.__new__(StepGraph)
    graph.set_cuda_graph(Captured())
    assert type(graph.work) is GraphLaunch and graph.work.exec_handle == 1234
    Device("cpu").enqueue(graph.work, "graph")
    assert Captured.replays == 1
