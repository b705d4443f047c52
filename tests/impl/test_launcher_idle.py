"""The launch thread when idle (`runnercheck.impl.launcher`, `impl/native/launcher.c`): it sleeps, it is woken.

On CPU with stand-ins for the driver's calls (`test_launcher.StandIns`): a worker given no work goes to its blocking
wait and its CPU time stays low; its polling after a burst is bounded by the measured interval between bursts; a
stress loop of pushes around its going to sleep never leaves a job unissued (no lost wakeup), and a build whose push
skips the wake when the worker is asleep (the plant ``push_skips_sleeper``, tests/impl/native_plants.py) is caught
by that loop.  The ``auto`` rule (a spare core per GPU) is checked with given core counts.  Bounds are generous
correctness bounds for a busy 2-core box, not speed targets.
"""
from __future__ import annotations

import os
import random
import time

import pytest

from runnercheck.impl import launcher as launcher_module
from runnercheck.impl.launcher import LaunchThread, LaunchThreadError, on_by_default, spare_cores, spin_percent
from test_launcher import StandIns, _address, _module


def _launcher(module=None, spin_us: int = 300, percent: int = 10, lead_margin_us: int = -1):
    """A native launcher on stand-ins, no naps (the default): poll, then sleep; no lead wait unless a margin is given."""
    stand_ins = StandIns()
    module = module or _module()
    graph, event, context = (_address(f) for f in stand_ins._keep)
    return stand_ins, module.Launcher(graph, event, context, 0, spin_us, 0, 0, percent, lead_margin_us)


def _until(predicate, seconds: float) -> bool:
    """Poll ``predicate`` (never the launcher's own wait, which wakes a sleeping worker itself) for ``seconds``."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if predicate():
            return True
        time.sleep(0.0002)
    return predicate()


def _tasks() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/task")}


def _proc_cpu_seconds(tid: int) -> float:
    """A thread's user + system CPU time as the kernel counts it (/proc/self/task/<tid>/stat, clock ticks): a reading
    independent of the launcher's own `cpu_seconds`."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15 of stat


def _started_with_tid(**kwargs):
    before = _tasks()
    stand_ins, launcher = _launcher(**kwargs)
    (tid,) = _tasks() - before  # the worker thread it started
    return launcher, tid


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_an_idle_worker_sleeps_and_its_cpu_time_stays_low():
    """After its last job a worker polls at most its cap (300 us), then sleeps: over 0.5 s without work it uses a
    small fraction of that in CPU time, by its own clock and by the kernel's count; a worker that polls the whole
    time (a 2 s cap, the whole interval) shows up in the same readings."""
    launcher, tid = _started_with_tid()
    spinning, spinning_tid = _started_with_tid(spin_us=2_000_000, percent=100)
    try:
        for thread in (launcher, spinning):
            thread.graph(1, 9)
        assert _until(lambda: launcher.issued() == 1 and spinning.issued() == 1, 2.0)
        time.sleep(0.05)  # past its 300 us of polling after the job
        slept = launcher.sleeps()
        assert slept >= 1
        before, kernel_before = launcher.cpu_seconds(), _proc_cpu_seconds(tid)
        spun_before = _proc_cpu_seconds(spinning_tid)
        time.sleep(0.5)
        used, kernel_used = launcher.cpu_seconds() - before, _proc_cpu_seconds(tid) - kernel_before
        spun = _proc_cpu_seconds(spinning_tid) - spun_before
        assert used < 0.05 and kernel_used <= 0.05, (used, kernel_used)  # asleep: no polling, no timed wake-ups
        assert launcher.sleeps() == slept  # it did not wake up on its own
        assert spun > 0.03, spun  # the readings see a polling worker (a busy 2-core box still gives it a share)
    finally:
        launcher.close()
        spinning.close()


def test_polling_after_a_burst_is_bounded_by_the_measured_interval():
    """Bursts 20 ms apart: the worker measures their interval (median) and would poll after a burst ``percent`` of it,
    capped; but each quiet after a burst (20 ms to the next job) outlasts that poll, so it polls not at all and
    sleeps at once.  Given the whole interval to poll (100%), the poll covers the quiet and is kept."""
    _, capped = _launcher(spin_us=300, percent=10)
    _, shared = _launcher(spin_us=1_000_000, percent=10)
    _, whole = _launcher(spin_us=1_000_000, percent=100)
    launchers = (capped, shared, whole)
    try:
        for i in range(8):
            for launcher in launchers:
                launcher.graph(i + 1, 9)
                launcher.event(i + 100, 9)  # the same burst: microseconds after the graph
            time.sleep(0.02)
        assert _until(lambda: all(launcher.issued() == 16 for launcher in launchers), 2.0)
        for launcher in launchers:
            median, _ = launcher.idle_window()
            assert 0.015e9 < median < 0.5e9, median  # the burst interval, not the graph-to-marker one
        assert capped.idle_window()[1] == 0 and shared.idle_window()[1] == 0  # 300 us / 2 ms: the 20 ms quiets outlast them
        median, window = whole.idle_window()
        assert window == median // 100 * 100, (median, window)
        sleeps = capped.sleeps()
        capped.graph(99, 9)
        assert _until(lambda: capped.issued() == 17 and capped.sleeps() > sleeps, 2.0)  # asleep right after the burst
    finally:
        for launcher in launchers:
            launcher.close()


def _steps(launcher, count: int, host_work_s: float) -> None:
    """``count`` steps as the device runs them: wake, ``host_work_s`` of the caller's own work, a graph launch and its
    marker pushed, then every job waited for (by polling ``issued``: the launcher's own wait wakes a sleeper)."""
    for _ in range(count):
        launcher.wake()
        time.sleep(host_work_s)
        seq = launcher.graph(1, 9)
        seq = launcher.event(2, 9)
        assert _until(lambda: launcher.issued() >= seq, 2.0), "a step's jobs were not issued within 2 s"


def test_the_lead_wait_keeps_a_steps_host_work_from_being_polled_through():
    """Steps whose host work takes 4 ms before they push, with a cap (20 ms) long enough to poll through all of it:
    with the lead wait off the worker polls from each wake to the push; with it on it learns the wake-to-push interval
    (about 4 ms), waits blocked for most of it, and uses a fraction of that CPU time; a step that pushes far sooner
    than learnt still has its jobs issued, through a wake of the blocked worker (``signals``)."""
    _, polling = _launcher(spin_us=20_000, percent=100)
    _, waiting = _launcher(spin_us=20_000, percent=100, lead_margin_us=300)
    try:
        used = {}
        for name, launcher in (("polling", polling), ("waiting", waiting)):
            _steps(launcher, 4, 0.004)  # learn the interval
            before = launcher.cpu_seconds()
            _steps(launcher, 10, 0.004)
            used[name] = launcher.cpu_seconds() - before
        least, last_wait, waits = waiting.lead()
        assert 0.004e9 <= least < 0.05e9, least  # the caller's 4 ms sleep, not the graph-to-marker gap
        assert waits >= 8 and 0.001e9 < last_wait < least, (waits, last_wait)
        assert polling.lead()[2] == 0
        assert used["polling"] > 0.01, used  # ~40 ms polled on a quiet box; a busy 2-core one still gives it a share
        assert used["waiting"] < 0.4 * used["polling"], used
        signals = waiting.signals()
        _steps(waiting, 1, 0.0)  # sooner than learnt: the push finds it in its lead wait and wakes it
        assert waiting.signals() > signals
    finally:
        polling.close()
        waiting.close()


def test_a_worker_that_never_polls_is_woken_by_the_push_alone():
    """The default (no polling, spin 0): a step's wake() is no system call and leaves the sleeping worker asleep --
    it would only go back to sleep --, the push wakes it (one signal) and its job is issued.  A worker that polls
    (spin > 0) is woken by wake() itself (the control: a build whose wake() did nothing would fail it)."""
    _, never = _launcher(spin_us=0)
    _, polls = _launcher(spin_us=300, percent=100)
    try:
        for launcher in (never, polls):
            launcher.graph(1, 9)
            launcher.wait()
            assert _until(lambda launcher=launcher: launcher.sleeps() >= 1, 2.0)
        signals, sleeps = never.signals(), never.sleeps()
        for _ in range(5):
            never.wake()
        time.sleep(0.02)
        assert never.signals() == signals and never.sleeps() == sleeps  # no system call, never woken
        never.graph(2, 9)
        assert _until(lambda: never.issued() == 2, 2.0) and never.signals() == signals + 1
        signals = polls.signals()
        polls.wake()
        assert polls.signals() == signals + 1
    finally:
        never.close()
        polls.close()


def test_a_bad_lead_margin_is_a_typed_error(monkeypatch):
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_LEAD_MARGIN_US", "off")
    assert launcher_module.lead_margin() == -1
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_LEAD_MARGIN_US", "-3")
    with pytest.raises(LaunchThreadError, match="LEAD_MARGIN_US.*'off'"):
        launcher_module.lead_margin()
    with pytest.raises(ValueError, match="lead_margin_us"):
        _module().Launcher(1, 1, 0, 0, 10, 0, 0, 10, -2)


def _push_around_sleep(module, rounds: int, seconds_each: float) -> tuple[int, float]:
    """Alternate pushes and pauses that end before, around and after the worker goes to sleep (polling 50 us); return
    the rounds done before one's job went unissued for ``seconds_each`` (``rounds``: none did) and the time taken."""
    rng = random.Random(61)
    _, launcher = _launcher(module, spin_us=50, percent=100)
    began = time.perf_counter()
    try:
        for done in range(rounds):
            kind = done % 3
            if kind == 0:  # asleep (40 times its polling)
                time.sleep(0.002)
            elif kind == 1:  # about when it goes to sleep
                time.sleep(rng.uniform(0.0, 0.0003))
            seq = launcher.graph(done + 1, 9)
            if not _until(lambda: launcher.issued() >= seq, seconds_each):
                return done, time.perf_counter() - began
        return rounds, time.perf_counter() - began
    finally:
        launcher.close()  # wakes the worker itself: a planted build's stuck job is issued here


def test_no_lost_wakeup_under_a_stress_loop_of_pushes_and_sleeps():
    """Every job pushed, whether the worker is polling, going to sleep or asleep, is issued promptly."""
    done, took = _push_around_sleep(_module(), 300, 2.0)
    assert done == 300, f"round {done}: a job pushed was not issued within 2 s (lost wakeup)"
    assert took < 60, took  # a generous bound: the rounds themselves last ~0.1 s


def test_planted_bug_a_push_that_skips_waking_a_sleeping_worker_is_caught():
    done, _ = _push_around_sleep(_module("push_skips_sleeper"), 300, 1.0)
    assert done < 300  # the first round that finds it asleep leaves its job in the ring


@pytest.mark.parametrize("cpus, gpus, on", [
    (2, 1, True), (1, 1, False), (2, 2, False), (8, 8, False), (9, 8, True), (16, 8, True), (1, 0, False), (4, 0, True),
])
def test_the_launch_thread_is_on_by_default_only_with_a_spare_core_per_gpu(cpus, gpus, on):
    assert spare_cores(cpus) == cpus - 1
    assert on_by_default(cpus, gpus) is on


def test_auto_with_too_few_spare_cores_starts_no_thread_and_1_still_forces_it(monkeypatch):
    def no_load(name):
        raise AssertionError("auto with too few spare cores must not load the launcher")

    monkeypatch.setattr(launcher_module, "on_by_default", lambda cpus=None, gpus=None: False)
    monkeypatch.setattr(launcher_module.native, "load", no_load)
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_THREAD", "auto")
    assert LaunchThread.start(0) is None
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_THREAD", "1")
    with pytest.raises(AssertionError, match="must not load"):  # forced on: it goes on to load the worker
        LaunchThread.start(0)


@pytest.mark.parametrize("value", ["0", "101", "x", "-5"])
def test_bad_spin_percent_is_a_typed_error(monkeypatch, value):
    monkeypatch.setenv("RUNNERCHECK_LAUNCH_SPIN_PERCENT", value)
    with pytest.raises(LaunchThreadError, match="RUNNERCHECK_LAUNCH_SPIN_PERCENT"):
        spin_percent()


def test_bad_spin_percent_argument_is_a_value_error():
    module = _module()
    for percent in (0, 101):
        with pytest.raises(ValueError, match="spin_percent"):
            module.Launcher(1, 1, 0, 0, 10, 0, 0, percent)


# ---------------------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a GPU")
def test_gpu_runner_steps_far_apart_let_the_launch_thread_sleep_with_outputs_unchanged(monkeypatch):
    """Steps 20 ms apart on cuda: between them the worker sleeps (its CPU time a small share of the wall time), each
    step's wake gets its jobs issued (no hang: every output is read), and the outputs equal those of steps back to
    back with the thread off."""
    import torch

    from runnercheck.bench.case_runner import host_cost_setup
    from runnercheck.bench.common import BenchContext
    from runnercheck.impl.device import Device

    outputs = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("RUNNERCHECK_LAUNCH_THREAD", setting)
        device = Device("cuda", seed=0)
        torch.manual_seed(0)
        runner, work, _ = host_cost_setup(BenchContext(device, quick=False, seed=0), 64, 0.05)
        got = []
        cpu_before, wall_before = (device.launcher.cpu_seconds(), time.perf_counter()) if setting == "1" else (0, 0)
        sleeps_before = device.launcher.sleeps() if setting == "1" else 0
        for _ in range(30):
            got.append(runner.execute_model(work.next_step()).get())
            if setting == "1":
                time.sleep(0.02)
        if setting == "1":
            cpu, wall = device.launcher.cpu_seconds() - cpu_before, time.perf_counter() - wall_before
            assert device.launcher.sleeps() - sleeps_before >= 25  # it slept between (nearly) every two steps
            assert cpu < 0.25 * wall, (cpu, wall)  # a generous bound: it polled a core the whole time before
        outputs[setting] = got
    assert outputs["1"] == outputs["0"]
