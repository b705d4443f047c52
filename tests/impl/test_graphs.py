"""CUDA graphs (`runnercheck.impl.graphs`, `runnercheck.impl.graph_step`): capture sizes, buckets and fallbacks, replay equal to eager
bit for bit at every capture size and padding amount (with and without drafts), padding that leaves
live state alone, typed errors, and the replay of recorded closures catching a stale buffer on CPU."""
from __future__ import annotations

import pytest
import torch

from runnercheck.impl.device import Device
from runnercheck.impl.graphs import GraphCaptureError, GraphConfigError, default_capture_sizes, format_graph_stats, validate_capture_sizes
from runnercheck.impl.interface import RunnerLimits, SamplingParams
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import ModelRunner, make_runner
from runnercheck.stress.sim.scheduler import SchedulerSim

LIMITS = RunnerLimits(vocab_size=256, max_num_reqs=4, max_model_len=48, max_num_batched_tokens=16, num_kv_blocks=40,
                      block_size=4, max_logprobs=3, max_num_draft_tokens=1)


@pytest.fixture(scope="module")
def weights():
    return random_weights(preset("micro"), seed=11)


def _requests(sched: SchedulerSim, logprobs: bool) -> None:
    """Four requests admitted together that finish one after another: decode batches of 4, 3, 2, 1."""
    sp = SamplingParams
    sched.add_request("a", (3, 4, 5), sp(temperature=0.0, max_tokens=3))
    sched.add_request("b", (7, 8), sp(temperature=0.9, seed=5, repetition_penalty=1.3, max_tokens=5,
                                      logprobs=2 if logprobs else None))
    sched.add_request("c", (9, 10, 11, 12), sp(temperature=1.1, frequency_penalty=0.6, presence_penalty=0.4, max_tokens=7))
    sched.add_request("d", (20,), sp(temperature=0.8, min_p=0.05, max_tokens=9))


def lockstep(runners: list[ModelRunner], *, drafts: bool, logprobs: bool, seed: int = 0, max_steps: int = 40) -> list:
    """Feed one schedule to every runner; every runner's output must equal the first's.  Returns the outputs."""
    sched = SchedulerSim(LIMITS, seed=seed, draft_prob=1.0 if drafts else 0.0)
    _requests(sched, logprobs)
    outputs = []
    for _ in range(max_steps):
        if not sched.has_work:
            break
        step = sched.schedule()
        got = [r.execute_model(step).get() for r in runners]
        for other in got[1:]:
            assert other == got[0], f"step {step.step_id}: {other} != {got[0]}"
        outputs.append(got[0])
        sched.update(got[0])
    assert not sched.has_work
    return outputs


def _buckets_used(runner: ModelRunner, trace: list[tuple[int, bool]]) -> set[tuple[int, int]]:
    return {(runner.graphs.bucket_for(n), n) for n, replayed in trace if replayed}


def _record(runner: ModelRunner, trace: list) -> None:
    execute = runner.execute_model

    def execute_and_record(sched):
        out = execute(sched)
        stats = runner.last_step_stats
        trace.append((stats.num_reqs, stats.graph_replayed))
        return out

    runner.execute_model = execute_and_record


# --------------------------------------------------------------------------- config


def test_default_capture_sizes():
    assert default_capture_sizes(1) == (1,)
    assert default_capture_sizes(4) == (1, 2, 4)
    assert default_capture_sizes(40) == (1, 2, 4, 8, 16, 24, 32, 40)
    assert default_capture_sizes(30) == (1, 2, 4, 8, 16, 24, 30)
    assert default_capture_sizes(256)[-3:] == (240, 248, 256)


@pytest.mark.parametrize("sizes, named", [
    ([], "empty"), ([2, 1], "2"), ([1, 2, 2], "2"), ([0, 1], "0"), ([-1], "-1"), ([1, 5], "5"), ([1.5], "1.5"),
    ("124", "124"),
])
def test_bad_capture_sizes_are_a_typed_error_naming_the_value(weights, sizes, named):
    with pytest.raises(GraphConfigError, match=named):
        validate_capture_sizes(sizes, 4)
    with pytest.raises(GraphConfigError, match=named):
        ModelRunner(weights, LIMITS, Device("cpu"), capture_sizes=sizes)


# --------------------------------------------------------------------------- replay == eager


@pytest.mark.parametrize("drafts, capture_sizes", [
    (False, (4,)), (True, None),  # bucket 4 padded by 3, 2, 1, 0; with drafts buckets 1, 2, 4 (4 padded by 1)
    pytest.param(False, None, marks=pytest.mark.slow), pytest.param(True, (4,), marks=pytest.mark.slow),
], ids=["no-drafts-one-bucket", "drafts-default-sizes", "no-drafts-default-sizes", "drafts-one-bucket"])
def test_replay_equals_eager_bit_for_bit_at_every_size_and_padding(weights, capture_sizes, drafts):
    # Decode buckets only (the prefill steps run eager, unpadded): mixed buckets have their own tests.
    graphed = ModelRunner(weights, LIMITS, Device("sim", seed=3), base_seed=7, capture_sizes=capture_sizes, mixed_sizes=())
    eager = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=7, cuda_graphs=False, capture_sizes=capture_sizes,
                        mixed_sizes=())
    trace: list = []
    _record(graphed, trace)
    lockstep([graphed, eager], drafts=drafts, logprobs=True)
    sizes = graphed.graphs.capture_sizes
    # every batch size 1..4 was replayed, so every capture size and every padding amount of it ran
    expected = {(graphed.graphs.bucket_for(n), n) for n in range(1, 5)}
    assert _buckets_used(graphed, trace) == expected, (sizes, trace)
    stats = graphed.cuda_graph_stats()
    assert stats["enabled"] and stats["replays"] == sum(r for _, r in trace) > 0
    assert set(stats["fallbacks"]) == {"non_uniform"}  # the prefill steps
    assert eager.cuda_graph_stats()["padded_eager"] == stats["replays"]
    assert format_graph_stats(stats) == f"graphs on: {stats['replays']} replays; fallbacks: non_uniform {stats['fallbacks']['non_uniform']}"
    assert format_graph_stats(eager.cuda_graph_stats()).startswith("graphs off (eager)")


def test_replay_matches_the_oracle_with_drafts_and_logprobs(weights):
    reference = pytest.importorskip("runnercheck.reference.runner")
    compare = pytest.importorskip("runnercheck.checks.compare")
    runner = make_runner(weights, LIMITS, Device("sim", seed=1), 7)
    oracle = reference.ReferenceRunner(weights, LIMITS, base_seed=7)
    sched = SchedulerSim(LIMITS, seed=2, draft_prob=1.0)
    _requests(sched, logprobs=True)
    while sched.has_work:
        step = sched.schedule()
        got = runner.execute_model(step).get()
        expected = oracle.execute_model(step)
        cmp = compare.compare_step(got, expected, oracle.last_results, positions=compare.first_output_positions(step))
        assert cmp.ok, "\n".join(d.line() for d in cmp.divergences)
        for tie in cmp.ties:
            oracle.replace_output_token(tie.req_id, 0, got.token_dict()[tie.req_id][-1])
        sched.update(got)
    assert runner.cuda_graph_stats()["replays"] > 0


# --------------------------------------------------------------------------- padding


def test_padding_rows_change_no_live_or_free_state(weights):
    """Three requests in a bucket of 4: everything outside the three rows and their KV slots stays as it was."""
    runner = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=1, capture_sizes=(4,))
    sched = SchedulerSim(LIMITS, seed=0)
    for i, rid in enumerate("abc"):
        sched.add_request(rid, (5 + i, 6, 7), SamplingParams(temperature=0.0, max_tokens=6, frequency_penalty=0.5))
    while True:  # the prefill step
        step = sched.schedule()
        sched.update(runner.execute_model(step).get())
        if all(n == 1 for n in step.num_scheduled_tokens.values()) or not sched.has_work:
            break
    step = sched.schedule()
    assert set(step.num_scheduled_tokens) == set("abc") and all(n == 1 for n in step.num_scheduled_tokens.values())
    live_rows = sorted(runner.state.row_of(r) for r in "abc")
    free_rows = [r for r in range(LIMITS.max_num_reqs) if r not in live_rows]
    before = (runner.state.base.clone(), runner.sampling_state.output_counts.clone(), runner.model.kv_cache.k.clone())
    sched.update(runner.execute_model(step).get())
    assert runner.last_step_stats.graph_replayed and runner.last_step_stats.num_reqs == 3
    state, counts, k_cache = runner.state.base, runner.sampling_state.output_counts, runner.model.kv_cache.k
    assert torch.equal(state[free_rows], before[0][free_rows]), "a padding row wrote a free row's state"
    assert torch.equal(counts[free_rows], before[1][free_rows]), "a padding row counted tokens into a free row"
    assert (counts[live_rows].sum(dim=1) - before[1][live_rows].sum(dim=1)).tolist() == [1, 1, 1]
    slot_mapping = runner.input_batch.slot_mapping
    assert slot_mapping[3].item() == -1, "the padding token was given a KV slot"
    slots_written = set(slot_mapping[:3].tolist())
    flat_before, flat = before[2].flatten(1, 2), k_cache.flatten(1, 2)  # [layers, slots, heads, dim]
    changed = {s for s in range(flat.shape[1]) if not torch.equal(flat[:, s], flat_before[:, s])}
    assert changed <= slots_written, f"KV slots {sorted(changed - slots_written)} written by padding"


def test_a_bucket_whose_padded_tokens_exceed_the_budget_has_no_graph_and_falls_back(weights):
    """Budget 6: a bucket of 4 with drafts would pad to 8 tokens.  Not captured; 3 drafted decodes (6 tokens) run eager."""
    limits = RunnerLimits(**{**LIMITS.__dict__, "max_num_batched_tokens": 6})
    graphed = ModelRunner(weights, limits, Device("cpu"), base_seed=7, capture_sizes=(4,))
    eager = ModelRunner(weights, limits, Device("cpu"), base_seed=7, capture_sizes=(4,), cuda_graphs=False)
    assert {(k.size, k.mode.query_len) for k in graphed.graphs.graphs if not k.mixed} == {(4, 1)}
    sched = SchedulerSim(limits, seed=0, draft_prob=1.0)
    for rid in "abc":
        sched.add_request(rid, (3, 4), SamplingParams(temperature=0.0, max_tokens=4))
    while sched.has_work:
        step = sched.schedule()
        got = [r.execute_model(step).get() for r in (graphed, eager)]
        assert got[0] == got[1]
        sched.update(got[0])
    assert graphed.cuda_graph_stats()["fallbacks"].get("bucket_above_token_budget", 0) > 0
    assert eager.cuda_graph_stats()["fallbacks"] == graphed.cuda_graph_stats()["fallbacks"]


def test_padding_requests_in_the_kernels_write_no_state_and_no_kv_slot():
    """Input prep, post-update and the pad kernel on rows [3, -1, -1] (bucket 3, one real request, q = 2)."""
    from runnercheck.impl.kernels.input_prep import launch_pad_step_inputs, launch_prepare_inputs
    from runnercheck.impl.kernels.post_update import launch_post_update
    from runnercheck.impl.state import NUM_ROW_FIELDS

    dev, q, size, bs = Device("cpu"), 2, 3, 4
    state = dev.zeros((4, NUM_ROW_FIELDS), torch.int32)
    state[3] = torch.tensor([5, 6, 5, 5, 77])  # a decode with one draft: last token 77 at position 5
    state[0] = torch.tensor([9, 10, 9, 9, 11])  # the row padding reads parameters from
    before = state.clone()
    prefill = dev.pinned((4, 16), torch.int32)
    prefill.zero_()
    table = dev.zeros((4, 4), torch.int32)
    table[3] = torch.tensor([5, 6, 7, 8], dtype=torch.int32)
    rows_staged, drafts_staged = torch.tensor([3], dtype=torch.int32), torch.tensor([42], dtype=torch.int32)
    rows, drafts = dev.full(size, 123, torch.int32), dev.full(size, 0, torch.int32)
    header = torch.tensor([1, 1, 0, 0], dtype=torch.int32)  # one request, one draft: counts read on the device
    launch_pad_step_inputs(header=header, rows=rows_staged, drafts=drafts_staged, padded_rows=rows, padded_drafts=drafts,
                           size=size, max_drafts_total=size * (q - 1))
    assert rows.tolist() == [3, -1, -1] and drafts[0].item() == 42
    index = torch.arange(size + 1, dtype=torch.int32)
    cu, logits_start, draft_start = index * q, index * q, index * (q - 1)
    t = size * q
    out = dict(input_ids=dev.full(t, -7, torch.int64), positions=dev.full(t, -7, torch.int64), slot_mapping=dev.full(t, -7, torch.int64),
               query_start_loc=dev.full(size + 1, -7, torch.int32), seq_lens=dev.full(size, -7, torch.int32),
               idx_mapping=dev.full(size, -7, torch.int32), block_table_out=dev.full((size, 4), -7, torch.int32),
               logits_indices=dev.full(t, -7, torch.int64), logits_rows=dev.full(t, -7, torch.int32),
               logits_positions=dev.full(t, -7, torch.int64), draft_prefix=dev.full((t, 1), -7, torch.int32))
    launch_prepare_inputs(rows=rows, cu=cu, logits_start=logits_start, draft_start=draft_start, drafts=drafts,
                          prompt_token_index=rows, row_state=state, prefill_tokens=prefill, block_table=table, **out,
                          num_reqs=size, num_tokens=t, padded_num_tokens=t, num_sampling_rows=t, num_prompt_rows=0,
                          kv_block_size=bs, max_drafts=1)
    assert out["input_ids"].tolist() == [77, 42, 0, 0, 0, 0]
    assert out["slot_mapping"].tolist() == [6 * bs + 1, 6 * bs + 2, -1, -1, -1, -1]  # padding: no KV slot
    assert out["query_start_loc"].tolist() == [0, 2, 4, 6] and out["seq_lens"].tolist() == [7, 2, 2]
    assert out["logits_rows"].tolist() == [3, 3, 0, 0, 0, 0]  # padding reads row 0's parameters
    assert out["draft_prefix"].flatten().tolist() == [-1, 42, -1, -1, -1, -1]
    sampled = torch.tensor([42, 50, 1, 2, 3, 4], dtype=torch.int64)
    num_sampled, row_valid = dev.full(size, -7, torch.int32), dev.full(t, -7, torch.int32)
    launch_post_update(rows=rows, cu=cu, logits_start=logits_start, draft_start=draft_start, drafts=drafts, sampled=sampled,
                       row_state=state, num_sampled=num_sampled, row_valid=row_valid, num_reqs=size, max_drafts=1)
    assert state[3].tolist() == [7, 8, 5, 5, 50]  # draft accepted, bonus token 50
    assert torch.equal(state[:3], before[:3]), "a padding request wrote row state"
    assert num_sampled.tolist() == [2, 0, 0] and row_valid.tolist() == [1, 1, 0, 0, 0, 0]


# --------------------------------------------------------------------------- recorded closures, failures


def test_a_buffer_reallocated_after_capture_diverges_on_cpu(weights):
    """Replay runs the launches recorded at capture, bound to the old buffer; eager binds the new one."""
    graphed = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=7)
    eager = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=7, cuda_graphs=False)
    for runner in (graphed, eager):  # e.g. the row-state table grown after capture
        runner.state.row_state._base = runner.state.row_state.base.clone()
    with pytest.raises(AssertionError, match="!="):
        lockstep([graphed, eager], drafts=False, logprobs=False)


def test_capture_failure_names_the_size_and_the_op(weights, monkeypatch):
    runner = ModelRunner(weights, LIMITS, Device("cpu"), cuda_graphs=False)
    manager = runner.graphs
    manager.enabled = True
    monkeypatch.setattr(type(manager.device), "is_cuda", property(lambda self: True))
    monkeypatch.setattr(manager.device, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)

    class Uncapturable:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def bad_forward(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", Uncapturable)
    monkeypatch.setattr(runner.model, "forward", bad_forward)
    with pytest.raises(GraphCaptureError, match=r"size 4 .*'forward'.*not permitted"):
        manager.capture()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("drafts", [False, True], ids=["no-drafts", "drafts"])
def test_cuda_replay_equals_eager_bit_for_bit(weights, drafts):
    graphed = ModelRunner(weights, LIMITS, Device("cuda"), base_seed=7, capture_sizes=(1, 2, 4))
    eager = ModelRunner(weights, LIMITS, Device("cuda"), base_seed=7, cuda_graphs=False, capture_sizes=(1, 2, 4))
    one_bucket = ModelRunner(weights, LIMITS, Device("cuda"), base_seed=7, capture_sizes=(4,))
    one_bucket_eager = ModelRunner(weights, LIMITS, Device("cuda"), base_seed=7, cuda_graphs=False, capture_sizes=(4,))
    trace: list = []
    _record(graphed, trace)
    lockstep([graphed, eager], drafts=drafts, logprobs=True)
    lockstep([one_bucket, one_bucket_eager], drafts=drafts, logprobs=True)
    assert _buckets_used(graphed, trace) == {(graphed.graphs.bucket_for(n), n) for n in range(1, 5)}
    assert graphed.graphs.graphs[next(iter(graphed.graphs.graphs))].cuda_graph is not None


@pytest.mark.parametrize("kind", ["sim", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")])])
def test_replay_under_the_armed_sync_detector_counts_zero(weights, kind):
    """Async (two steps in flight), detector armed around every execute_model: replays read nothing back."""
    sync = pytest.importorskip("runnercheck.checks.detectors.sync")
    runner = ModelRunner(weights, LIMITS, Device(kind), base_seed=7)
    sched = SchedulerSim(LIMITS, seed=0)
    _requests(sched, logprobs=True)
    pending = []
    report = sync.arm_runner(runner, mode="count")
    while sched.has_work or pending:
        if sched.has_work and len(pending) < 2 and sched.can_schedule:
            pending.append(runner.execute_model(sched.schedule()))
            continue
        sched.update(pending.pop(0).get())
    assert runner.cuda_graph_stats()["replays"] > 0
    assert report.mode == "count" and report.count == 0, report.summary()
