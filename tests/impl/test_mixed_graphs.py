"""Mixed CUDA graphs (`runnercheck.impl.graphs`, `runnercheck.impl.graph_step` mode MIXED): a batch whose query lengths differ -- decodes next
to admitted prompts and prefill chunks -- replays one graph padded to a token size.  Its tokens equal the unpadded
eager step's, its padding touches no free row, penalty count or KV slot, and bad sizes are typed errors."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from runnercheck.impl.device import Device
from runnercheck.impl.graph_step import MIXED
from runnercheck.impl.graphs import GraphConfigError, default_mixed_sizes
from runnercheck.impl.interface import RunnerLimits, SamplingParams
from runnercheck.impl.model.weights import preset, random_weights
from runnercheck.impl.runner import ModelRunner
from runnercheck.checks.detectors.kv_provenance import arm_kv_provenance
from runnercheck.stress.mutants import catalogue
from runnercheck.stress.sim.scheduler import SchedulerSim

LIMITS = RunnerLimits(vocab_size=256, max_num_reqs=4, max_model_len=48, max_num_batched_tokens=24, num_kv_blocks=40,
                      block_size=4, max_logprobs=3, max_num_draft_tokens=0)


@pytest.fixture(scope="module")
def weights():
    return random_weights(preset("micro"), seed=11)


def churn(runners: list[ModelRunner], seed: int = 0, max_steps: int = 60, oracle=None) -> list:
    """Requests arriving while others decode (every few steps a prompt of 2-9 tokens joins the batch), one schedule
    fed to every runner; every runner's output must equal the first's (and the ``oracle``'s, ties adopted).
    Returns the outputs."""
    sched = SchedulerSim(LIMITS, seed=seed)
    params = [SamplingParams(temperature=0.0, max_tokens=6),
              SamplingParams(temperature=0.9, seed=5, repetition_penalty=1.3, max_tokens=8, logprobs=2),
              SamplingParams(temperature=1.1, frequency_penalty=0.6, presence_penalty=0.4, max_tokens=7),
              SamplingParams(temperature=0.8, min_p=0.05, max_tokens=9)]
    outputs, added = [], 0
    for tick in range(max_steps):
        if tick % 3 == 0 and added < 8:
            prompt = tuple(range(3 + added, 3 + added + 2 + (added * 5) % 8))
            sched.add_request(f"r{added}", prompt, params[added % len(params)])
            added += 1
        if not sched.has_work:
            if added >= 8:
                break
            continue
        step = sched.schedule()
        got = [r.execute_model(step).get() for r in runners]
        for other in got[1:]:
            _assert_same_output(other, got[0], step.step_id)
        if oracle is not None:
            compare = pytest.importorskip("runnercheck.checks.compare")
            cmp = compare.compare_step(got[0], oracle.execute_model(step), oracle.last_results,
                                       positions=compare.first_output_positions(step))
            assert cmp.ok, "\n".join(d.line() for d in cmp.divergences)
            for tie in cmp.ties:
                oracle.replace_output_token(tie.req_id, 0, got[0].token_dict()[tie.req_id][-1])
        outputs.append(got[0])
        sched.update(got[0])
    assert added == 8 and not sched.has_work
    return outputs


def _logprob_values(out) -> tuple[list, list]:
    """(every id and rank of the output's logprobs, every logprob value), in order."""
    exact, values = [], []
    entries = [e for per_request in out.logprobs if per_request for e in per_request]
    entries += [e for rid in sorted(out.prompt_logprobs) for e in out.prompt_logprobs[rid]]
    for e in entries:
        exact.append((e.token_id, e.rank, e.top_token_ids))
        values += [e.logprob, *e.top_logprobs]
    return exact, values


def _assert_same_output(other, first, step_id: int) -> None:
    """Equal outputs -- tokens, ids, ranks and flags exactly; logprob values to float32 rounding: a padded batch's
    matmuls may round a logit differently from the unpadded step's on CPU (seen with triton 3.9's interpreter:
    -1.3635311 against -1.3635292)."""
    assert (replace(other, logprobs=(), prompt_logprobs={}) == replace(first, logprobs=(), prompt_logprobs={})), (
        f"step {step_id}: {other} != {first}")
    (other_exact, other_values), (first_exact, first_values) = _logprob_values(other), _logprob_values(first)
    assert other_exact == first_exact, f"step {step_id}: {other} != {first}"
    assert other_values == pytest.approx(first_values, rel=1e-5, abs=1e-6), f"step {step_id}: {other} != {first}"


def test_default_mixed_sizes():
    assert default_mixed_sizes(4, 24) == (16, 24)
    assert default_mixed_sizes(256, 8192) == (16, 32, *range(64, 769, 64))
    assert default_mixed_sizes(64, 100) == (16, 32, 64, 100)
    assert default_mixed_sizes(8, 10) == (10,)


@pytest.mark.parametrize("sizes, named", [((0,), "0"), ((8, 4), "4 after 8"), ((25,), "max_num_batched_tokens=24"),
                                          ((8, 8), "8 is duplicated"), ("16", "sequence")])
def test_bad_mixed_sizes_are_a_typed_error_naming_the_value(weights, sizes, named):
    with pytest.raises(GraphConfigError, match=named):
        ModelRunner(weights, LIMITS, Device("cpu"), mixed_sizes=sizes)


def test_mixed_batches_replay_one_graph_and_match_the_unpadded_eager_step(weights):
    mixed = ModelRunner(weights, LIMITS, Device("sim", seed=3), base_seed=7)
    padded_eager = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=7, cuda_graphs=False)
    unpadded = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=7, mixed_sizes=())
    churn([mixed, padded_eager, unpadded])
    stats = mixed.cuda_graph_stats()
    assert stats["mixed_sizes"] == [16, 24] and stats["mixed_replays"] > 0
    assert not stats["fallbacks"], stats  # every step with tokens replayed a graph
    assert {k.mode.query_len for k in mixed.graphs.graphs} == {1, MIXED}
    assert padded_eager.cuda_graph_stats()["padded_eager"] == stats["replays"]
    assert unpadded.cuda_graph_stats()["fallbacks"]["non_uniform"] == stats["mixed_replays"]


def test_a_mixed_step_above_the_largest_mixed_size_runs_eager(weights):
    small = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=7, mixed_sizes=(8,))
    unpadded = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=7, mixed_sizes=())
    churn([small, unpadded])
    stats = small.cuda_graph_stats()
    assert stats["mixed_replays"] > 0 and stats["fallbacks"]["batch_above_largest_size"] > 0


def test_mixed_padding_changes_no_free_state_count_or_kv_slot(weights):
    """A decode and an admitted 3-token prompt (4 tokens, 2 requests) in a bucket of 16 tokens and 4 requests."""
    runner = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=1)
    sched = SchedulerSim(LIMITS, seed=0)
    sched.add_request("a", (5, 6), SamplingParams(temperature=0.0, max_tokens=8, frequency_penalty=0.5))
    for _ in range(2):  # a's prefill, then a decode
        sched.update(runner.execute_model(sched.schedule()).get())
    sched.add_request("b", (7, 8, 9), SamplingParams(temperature=0.0, max_tokens=8, frequency_penalty=0.5))
    step = sched.schedule()
    assert step.num_scheduled_tokens == {"a": 1, "b": 3}
    before = (runner.state.base.clone(), runner.sampling_state.output_counts.clone(), runner.model.kv_cache.k.clone())
    sched.update(runner.execute_model(step).get())
    stats = runner.last_step_stats
    assert stats.graph_replayed and runner.cuda_graph_stats()["mixed_replays"] == 2  # a's prefill, this step
    live_rows = sorted(runner.state.row_of(r) for r in "ab")
    free_rows = [r for r in range(LIMITS.max_num_reqs) if r not in live_rows]
    state, counts, k_cache = runner.state.base, runner.sampling_state.output_counts, runner.model.kv_cache.k
    assert torch.equal(state[free_rows], before[0][free_rows]), "a padding request wrote a free row's state"
    assert torch.equal(counts[free_rows], before[1][free_rows]), "a padding request counted tokens into a free row"
    assert (counts[live_rows].sum(dim=1) - before[1][live_rows].sum(dim=1)).tolist() == [1, 1]
    slot_mapping, query_start = runner.input_batch.slot_mapping, runner.input_batch.query_start_loc
    assert query_start[:5].tolist() == [0, 1, 4, 4, 4], "padding requests are not empty"
    assert (slot_mapping[4:16] == -1).all(), "a padding token was given a KV slot"
    slots_written = set(slot_mapping[:4].tolist())
    flat_before, flat = before[2].flatten(1, 2), k_cache.flatten(1, 2)  # [layers, slots, heads, dim]
    changed = {s for s in range(flat.shape[1]) if not torch.equal(flat[:, s], flat_before[:, s])}
    assert changed <= slots_written, f"KV slots {sorted(changed - slots_written)} written by padding"


def test_a_mixed_step_whose_padding_tokens_keep_stale_slots_is_caught(weights):
    """The planted bug (`mixed_tail_left_stale`): the tail is not padded, so padding tokens write an earlier step's
    KV slots again; KV provenance names the write."""
    planted = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=7)
    with catalogue.apply("mixed_tail_left_stale", runner=planted):
        checker = arm_kv_provenance(planted)
        churn([planted])
        violations = checker.finish()
        checker.detach()
    assert violations and violations[0].kind == "padding-write", [v.line() for v in violations[:3]]
    clean = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=7)
    checker = arm_kv_provenance(clean)
    churn([clean])
    assert checker.finish() == []


def test_mixed_replay_matches_the_oracle(weights):
    reference = pytest.importorskip("runnercheck.reference.runner")
    runner = ModelRunner(weights, LIMITS, Device("sim", seed=1), base_seed=7)
    churn([runner], oracle=reference.ReferenceRunner(weights, LIMITS, base_seed=7))
    assert runner.cuda_graph_stats()["mixed_replays"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_mixed_replay_equals_padded_eager_and_the_oracle_with_no_host_sync(weights):
    """Captured mixed graphs on the GPU: tokens equal the same padded launches run eagerly and the oracle's,
    and a detector armed around every execute_model counts no host read."""
    reference = pytest.importorskip("runnercheck.reference.runner")
    sync = pytest.importorskip("runnercheck.checks.detectors.sync")
    graphed = ModelRunner(weights, LIMITS, Device("cuda"), base_seed=7)
    padded_eager = ModelRunner(weights, LIMITS, Device("cuda"), base_seed=7, cuda_graphs=False)
    report = sync.arm_runner(graphed, mode="count")
    churn([graphed, padded_eager], oracle=reference.ReferenceRunner(weights, LIMITS, base_seed=7))
    stats = graphed.cuda_graph_stats()
    assert stats["mixed_replays"] > 0 and not stats["fallbacks"], stats
    assert next(g for k, g in graphed.graphs.graphs.items() if k.mixed).cuda_graph is not None
    assert report.count == 0, report.summary()


@pytest.mark.parametrize("lanes", [True, False])
def test_an_admission_step_is_one_fused_replay_or_one_h2d_one_replay_and_one_output_copy(lanes):
    """The admissions' diffs and their rows' count reset are named in the step header and run inside the graph;
    with the lanes (`runnercheck.impl.lanes`) the replay copies the slot in and the output out itself: one enqueue."""
    runner = ModelRunner(random_weights(preset("micro"), seed=11), LIMITS, Device("cpu"), base_seed=1)
    if not lanes:
        runner.graphs.fused_in_bytes.clear()
    labels: list[str] = []
    enqueue = runner.device.enqueue
    runner.device.enqueue = lambda fn, label="": (labels.append(label), enqueue(fn, label))[1]
    sched = SchedulerSim(LIMITS, seed=0)
    sched.add_request("a", (5, 6, 7), SamplingParams(temperature=0.0, max_tokens=4, frequency_penalty=0.5))
    sched.update(runner.execute_model(sched.schedule()).get())
    if lanes:
        assert len(labels) == 1 and labels[0].startswith("fused graph replay") and "mixed" in labels[0], labels
    else:
        assert len(labels) == 3 and labels[0].startswith("h2d") and "mixed" in labels[1] and labels[2].startswith("d2h"), labels


def test_a_reused_row_starts_at_zero_counts_and_a_graph_that_skips_the_reset_is_caught(weights):
    """Requests with strong penalties one after another in the same rows: the mixed graph's reset gives each a clean
    count row (tokens equal the eager reset's); with the graph's reset planted away the counts carry over."""
    def sequential(runners: list[ModelRunner]) -> None:
        sched = SchedulerSim(LIMITS, seed=0)
        for i in range(6):
            sched.add_request(f"s{i}", (3 + i, 4, 5, 9), SamplingParams(temperature=0.0, max_tokens=6, frequency_penalty=2.0,
                                                                       presence_penalty=2.0))
        while sched.has_work:
            step = sched.schedule()
            got = [r.execute_model(step).get() for r in runners]
            for other in got[1:]:
                assert other == got[0], f"step {step.step_id}: {other} != {got[0]}"
            sched.update(got[0])

    eager_reset = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=3, mixed_sizes=())
    graph_reset = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=3)
    sequential([eager_reset, graph_reset])
    planted = ModelRunner(weights, LIMITS, Device("cpu"), base_seed=3)
    with catalogue.apply("graph_skips_admitted_count_reset", runner=planted):
        with pytest.raises(AssertionError, match="step"):
            sequential([ModelRunner(weights, LIMITS, Device("cpu"), base_seed=3, mixed_sizes=()), planted])
