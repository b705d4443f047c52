"""The device layer: the race class the suite exists for shows on sim, and is replayable."""
from __future__ import annotations

import pytest
import torch

from runnercheck.impl.device import (
    Device,
    DeviceError,
    HOST_WAIT_HOOKS,
    is_device_memory,
    is_pinned_memory,
)
from runnercheck.impl.lag_policies import LagKSteps, LagPolicyError, make_lag_policy


def _staged_copy_sequence(dev: Device, steps: int = 20) -> list[int]:
    """Each step writes a value into ONE reused pinned buffer and enqueues a copy of it."""
    staging = dev.pinned(1, torch.int64)
    dst = dev.zeros(steps, torch.int64)
    out = dev.pinned(steps, torch.int64)
    for i in range(steps):
        dev.begin_step()
        staging.fill_(i)  # the careless host reuses the staging buffer without waiting
        dev.enqueue(lambda i=i: dst[i : i + 1].copy_(staging, non_blocking=True), f"copy{i}")
    dev.enqueue(lambda: out.copy_(dst), "d2h")
    dev.record_event().synchronize()
    return out.tolist()


def test_sim_copy_sees_host_write_made_after_enqueue():
    dev = Device("sim", lag_policy="lag-2-steps")
    staging = dev.pinned(4, torch.int64)
    dst = dev.zeros(4, torch.int64)
    staging.fill_(1)
    dev.enqueue(lambda: dst.copy_(staging, non_blocking=True), "h2d")
    staging.fill_(2)  # written after enqueue, before the queued copy ran
    ev = dev.record_event()
    assert not ev.query()
    ev.synchronize()
    assert dst.tolist() == [2, 2, 2, 2]


def test_cpu_copy_runs_at_enqueue():
    dev = Device("cpu")
    staging = dev.pinned(4, torch.int64)
    dst = dev.zeros(4, torch.int64)
    staging.fill_(1)
    dev.enqueue(lambda: dst.copy_(staging), "h2d")
    staging.fill_(2)
    assert dst.tolist() == [1, 1, 1, 1]


def test_careless_reuse_corrupts_on_lagging_policies():
    for policy in ("lag-2-steps", "random-drain"):
        dev = Device("sim", seed=3, lag_policy=policy)
        got = _staged_copy_sequence(dev)
        assert got != list(range(20)), policy
    assert _staged_copy_sequence(Device("sim", lag_policy="run-immediately")) == list(range(20))


def test_same_seed_same_interleaving():
    traces = []
    for _ in range(2):
        dev = Device("sim", seed=11, lag_policy="random-drain")
        dev.trace = []
        values = _staged_copy_sequence(dev)
        traces.append((values, list(dev.trace)))
    assert traces[0] == traces[1]
    other = Device("sim", seed=12, lag_policy="random-drain")
    assert _staged_copy_sequence(other) != traces[0][0] or True  # different seeds may coincide


def test_different_seeds_give_different_interleavings():
    results = {tuple(_staged_copy_sequence(Device("sim", seed=s, lag_policy="random-drain"))) for s in range(6)}
    assert len(results) > 1


def test_event_never_later_than_wait():
    dev = Device("sim", lag_policy="lag-100-steps")
    x = dev.zeros(1, torch.int64)
    dev.enqueue(lambda: x.add_(1), "a")
    ev = dev.record_event()
    dev.enqueue(lambda: x.add_(10), "b")
    ev.synchronize()
    assert x.item() == 1  # only work up to the event ran
    assert dev.num_pending == 1
    dev.synchronize()
    assert x.item() == 11


def test_registration_tells_device_from_host():
    dev = Device("sim")
    d = dev.empty((3, 4), torch.float32)
    p = dev.pinned(8, torch.int32)
    h = torch.zeros(3)
    assert is_device_memory(d) and is_device_memory(d[1:, 2])
    assert not is_device_memory(h) and not is_device_memory(p)
    assert is_pinned_memory(p) and not is_pinned_memory(h) and not is_pinned_memory(d)


def test_host_wait_hooks_see_waits():
    seen: list[str] = []
    HOST_WAIT_HOOKS.append(seen.append)
    try:
        dev = Device("sim")
        dev.record_event().synchronize()
        dev.synchronize()
    finally:
        HOST_WAIT_HOOKS.remove(seen.append)
    assert seen == ["DeviceEvent.synchronize", "Device.synchronize"]


def test_bad_kinds_and_policies_are_typed_errors():
    with pytest.raises(DeviceError):
        Device("tpu")
    with pytest.raises(LagPolicyError):
        make_lag_policy("sometimes")
    with pytest.raises(DeviceError):
        Device("cpu").set_lag_policy("random-drain")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError):
            Device("cuda")


def test_lag_k_steps_runs_old_work_at_boundaries():
    dev = Device("sim", lag_policy=LagKSteps(1))
    x = dev.zeros(1, torch.int64)
    dev.enqueue(lambda: x.add_(1), "s0")
    dev.begin_step()
    assert dev.num_pending == 1
    dev.begin_step()
    assert dev.num_pending == 0


@pytest.mark.parametrize("kind", ["sim", "cpu"])
def test_an_unrecorded_marker_is_a_typed_error_for_every_check(kind: str):
    from runnercheck.impl.device import DeviceEvent

    marker = DeviceEvent(Device(kind))
    for check in (marker.query, marker.is_complete, marker.known_complete, marker.synchronize):
        with pytest.raises(DeviceError, match="never recorded"):
            check()


@pytest.mark.gpu
def test_cuda_stream_event_roundtrip():
    from runnercheck.stress.cli.env_cmd import device_selftest

    dev = Device("cuda")
    assert device_selftest(dev)
    # The host is not blocked by enqueue: a long sleep leaves the event pending.
    dev.inject_delay(20000)
    ev = dev.record_event()
    assert not ev.query()
    ev.synchronize()
    assert ev.query()


@pytest.mark.gpu
def test_cuda_marker_gives_its_event_back_only_once_seen_complete():
    """A marker not yet seen complete keeps its CUDA event (re-recording it would move the point the marker stands
    for); one seen complete gives it back to the device, stays complete without it, and the next marker re-records it."""
    dev = Device("cuda")
    dev.inject_delay(20000)
    first = dev.record_event()
    event = first._cuda_event
    second = dev.record_event()  # first not seen complete: second gets an event of its own
    assert second._cuda_event is not None and second._cuda_event is not event
    assert not first.query() and first._cuda_event is event
    first.synchronize()
    assert first._cuda_event is None and dev._spare_cuda_events == [event]
    dev.inject_delay(20000)
    third = dev.record_event()
    assert third._cuda_event is event and not dev._spare_cuda_events
    assert first.query() and first.is_complete()
    first.synchronize()  # a wait on a marker seen complete returns at once
    assert not third.query(), "the re-recorded event marks the work queued after it, not the old point"
    third.synchronize()
    assert third.query() and second.query()


@pytest.mark.gpu
def test_cuda_marker_seen_complete_completes_the_earlier_ones_without_asking_cuda(monkeypatch: pytest.MonkeyPatch):
    """One stream completes its work in order: a marker seen complete answers for every marker recorded before it,
    and for none after it (a watermark that reached past it would report pending work done)."""
    import runnercheck.impl.device as device_module

    dev = Device("cuda")
    dev.inject_delay(20000)
    earlier = [dev.record_event() for _ in range(3)]
    newest = dev.record_event()
    newest.synchronize()
    dev.inject_delay(20000)
    later = dev.record_event()
    asked = []
    query = device_module._query_cuda_event
    monkeypatch.setattr(device_module, "_query_cuda_event", lambda event: asked.append(event) or query(event))
    assert all(marker.query() for marker in earlier) and not asked
    assert all(marker._cuda_event is None for marker in earlier), "markers known complete give their events back"
    assert not later.query() and len(asked) == 1, "a marker recorded after the one seen complete must be asked"
    dev.synchronize()
    assert later.query() and len(asked) == 1, "a whole-stream wait completes every marker recorded before it"


def _cuda_decode_runner():
    """A micro runner on cuda with a 3-request decode workload (no churn: its steps become steady)."""
    from runnercheck.bench.workload import DecodeWorkload
    from runnercheck.impl.interface import RunnerLimits, SamplingParams
    from runnercheck.impl.model.weights import preset, random_weights
    from runnercheck.impl.runner import ModelRunner

    limits = RunnerLimits(vocab_size=256, max_num_reqs=4, max_model_len=128, max_num_batched_tokens=16, num_kv_blocks=200,
                          block_size=4)
    runner = ModelRunner(random_weights(preset("micro"), seed=3), limits, Device("cuda"), base_seed=5)
    work = DecodeWorkload(num_reqs=3, prompt_len=5, vocab_size=256, block_size=4, num_blocks=200, token_budget=16, churn=0.0,
                          params=SamplingParams(temperature=0.8, seed=7, max_tokens=1 << 20), seed=1)
    return runner, work


@pytest.mark.gpu
def test_unread_outputs_keep_the_rows_use_list_short():
    """`mark_used` drops only markers known complete (no CUDA query); with no output read by the caller its list
    of steps in flight must still stay bounded."""
    from runnercheck.impl.quarantine import _MAX_PENDING_USES

    runner, work = _cuda_decode_runner()
    outputs = [runner.execute_model(work.next_step()) for _ in range(_MAX_PENDING_USES + 40)]
    assert len(runner.state._use_events) <= _MAX_PENDING_USES + 1
    for out in outputs:
        out.get()


@pytest.mark.gpu
def test_steady_runner_steps_re_record_their_slots_events():
    """A run of graphed steady steps makes no new CUDA events once the first steps' markers were seen complete."""
    import runnercheck.impl.device as device_module

    runner, work = _cuda_decode_runner()
    for _ in range(12):
        runner.execute_model(work.next_step()).get()
    made, asked = [], []
    new_event, query = device_module._new_cuda_event, device_module._query_cuda_event
    device_module._new_cuda_event = lambda cls: made.append(1) or new_event(cls)
    device_module._query_cuda_event = lambda event: asked.append(1) or query(event)
    try:
        for _ in range(40):
            runner.execute_model(work.next_step()).get()
        pending = runner.execute_model(work.next_step())
        for i in range(44):  # async scheduling: each step's output read after the next step is issued
            if i == 4:  # one more step in flight holds two more events: counted after they were made
                made.clear()
            pending, previous = runner.execute_model(work.next_step()), pending
            previous.get()
    finally:
        device_module._new_cuda_event, device_module._query_cuda_event = new_event, query
    assert runner.last_step_stats.steady
    assert len(made) == 0, f"{len(made)} CUDA events made in 40 async steady steps after warm-up"
    # Outputs read (their markers seen complete) complete the staging copies and the rows' last uses recorded
    # before them on the one stream: the steady step's bookkeeping asks CUDA nothing.
    assert len(asked) == 0, f"{len(asked)} CUDA event queries in 84 steady steps whose outputs were read"


@pytest.mark.gpu
def test_cuda_registration_and_pinned():
    dev = Device("cuda")
    assert is_device_memory(dev.empty(4, torch.float32))
    assert is_pinned_memory(dev.pinned(4, torch.float32))
    assert not is_pinned_memory(torch.zeros(4))


def test_on_stream_is_a_no_op_without_a_stream():
    dev = Device("cpu")
    with dev.on_stream():
        dev.enqueue(lambda: None, "noop")
    assert dev.num_enqueued == 1


@pytest.mark.gpu
def test_cuda_on_stream_switches_at_its_first_enqueue_and_restores_the_callers_stream():
    """Inside `Device.on_stream` enqueued work lands on the runner's stream, made current by the scope's first
    enqueue that runs on this thread (a step whose work all goes to the launch thread switches nothing); the
    caller's stream comes back after, also when the step raises."""
    dev = Device("cuda")
    caller = torch.cuda.current_stream()
    seen = []
    with dev.on_stream():
        assert torch.cuda.current_stream() == caller  # nothing enqueued yet: nothing switched
        dev.enqueue(lambda: seen.append(torch.cuda.current_stream()), "probe")
        assert torch.cuda.current_stream() == dev.stream
        dev.enqueue(lambda: seen.append(torch.cuda.current_stream()), "probe")
    assert seen == [dev.stream, dev.stream]
    assert torch.cuda.current_stream() == caller
    with pytest.raises(RuntimeError):
        with dev.on_stream():
            dev.enqueue(lambda: None, "probe")
            raise RuntimeError("a step that fails")
    assert torch.cuda.current_stream() == caller
    dev.enqueue(lambda: seen.append(torch.cuda.current_stream()), "probe")  # outside: enqueue switches per call
    assert seen == [dev.stream, dev.stream, dev.stream] and torch.cuda.current_stream() == caller


def test_auto_means_one_thing_in_every_front_end(monkeypatch) -> None:
    """``--device auto`` (CLI, chisq, the pytest plugin, `Device`) is cuda when present, else sim -- one function."""
    import types

    import runnercheck.impl.device as device_module
    from runnercheck.checks.chisq.run import resolve_device as chisq_device
    from runnercheck.stress.cli.options import resolve_device as cli_device
    from runnercheck.stress.pytest_plugin import _device_kind

    plugin_config = types.SimpleNamespace(getoption=lambda name: "auto")
    monkeypatch.setattr(device_module.torch.cuda, "is_available", lambda: False)
    assert device_module.resolve_device_kind("auto") == "sim"
    assert cli_device("auto") == "sim" and _device_kind(plugin_config) == "sim"
    assert device_module.Device("auto").kind == "sim"
    assert chisq_device("auto").type == "cpu"  # chisq samples sim on CPU tensors
    seen = []
    monkeypatch.setattr(device_module, "resolve_device_kind", lambda kind: seen.append(kind) or "sim")
    cli_device("auto"), chisq_device("auto"), _device_kind(plugin_config), device_module.Device("auto")
    assert seen == ["auto"] * 4  # each front end asks the one rule


def test_a_missing_gpu_or_an_unknown_kind_is_a_typed_error(monkeypatch) -> None:
    import runnercheck.impl.device as device_module

    monkeypatch.setattr(device_module.torch.cuda, "is_available", lambda: False)
    for kind in ("cuda", "tpu"):
        with pytest.raises(device_module.DeviceError):
            device_module.resolve_device_kind(kind)
