"""The Triton sampler against the float64 oracle (reference.sampler), on CPU (interpreted).

Token ids must be identical except documented ties (oracle gap < TIE_TOLERANCE, or a fragile
filter boundary); ties are counted and must be rare.  Small vocabularies (not a multiple of the
kernel block) and small candidate capacities force every selection path: the one-pass Gumbel,
gather-all, bracket gather, single-value brackets (massive ties) and the full threshold pass.
"""
from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runnercheck.impl.device import Device
from runnercheck.impl.interface import SamplingParams
from runnercheck.impl.sample import Sampler, SamplerError, SamplingState
from test_sampler_harness import Agreement, LogitRow, RowRequest, admit, reference_results, run_sampler

ref = pytest.importorskip("runnercheck.reference.sampler")

VOCAB = 300  # not a multiple of any kernel block
NUM_STATE_ROWS = 4


@pytest.fixture(scope="module")
def dev() -> Device:
    """The kernels' device: interpreted CPU, or the GPU where one is present (real launches)."""
    return Device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="module")
def samplers(dev: Device) -> dict[int, Sampler]:
    # capacity 16 forces narrowing passes and bracket gathers; 64 mostly gathers at once
    return {cap: Sampler(dev, VOCAB, max_logprobs=4, max_num_rows=8, candidate_capacity=cap) for cap in (16, 64)}


def _sample(device: Device, sampler: Sampler, requests: dict[int, RowRequest], rows: list[LogitRow],
            logits: torch.Tensor) -> list[int]:
    state = SamplingState(device, NUM_STATE_ROWS, logits.shape[1])
    admit(device, state, requests)
    return run_sampler(device, sampler, state, logits, rows).tokens.tolist()


def _check_agreement(tokens: list[int], results: list, agreement: Agreement | None = None) -> Agreement:
    agreement = agreement or Agreement()
    for i, (tok, res) in enumerate(zip(tokens, results)):
        agreement.add(tok, res, i)
    assert not agreement.mismatches, f"runner != oracle outside ties: {agreement.mismatches}"
    return agreement


# --------------------------------------------------------------------------- randomized comparison

params_strategy = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.3, 1.0, 2.5]),
    top_k=st.sampled_from([-1, 1, 2, 7, 40, 150, 299, 300, 1000]),
    top_p=st.sampled_from([1.0, 0.99, 0.9, 0.5, 0.05]),
    min_p=st.sampled_from([0.0, 0.0, 0.01, 0.2]),
    repetition_penalty=st.sampled_from([1.0, 1.0, 1.4, 0.7]),
    frequency_penalty=st.sampled_from([0.0, 0.0, 0.5, -0.3]),
    presence_penalty=st.sampled_from([0.0, 0.0, 0.8, -1.0]),
)
token = st.integers(0, VOCAB - 1)


@st.composite
def batches(draw):
    requests = {
        row: RowRequest(draw(params_strategy), draw(st.integers(0, 2**63 - 1)),
                        tuple(draw(st.lists(token, min_size=1, max_size=12))),
                        tuple(draw(st.lists(token, max_size=10))))
        for row in range(2)
    }
    rows = [LogitRow(draw(st.integers(0, 1)), draw(st.integers(0, 10**6)), tuple(draw(st.lists(token, max_size=3))))
            for _ in range(3)]
    scale = draw(st.sampled_from([0.5, 3.0, 12.0]))
    quantum = draw(st.sampled_from([0.0, 0.5]))  # 0.5: coarse logits full of exact ties
    capacity = draw(st.sampled_from([16, 64]))
    seed = draw(st.integers(0, 2**31))
    return requests, rows, scale, quantum, capacity, seed


@settings(max_examples=20, deadline=None)
@given(batch=batches())
def test_matches_reference_on_random_batches(dev, samplers, batch):
    requests, rows, scale, quantum, capacity, seed = batch
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(rows), VOCAB, generator=gen) * scale
    if quantum:
        logits = torch.round(logits / quantum) * quantum
    tokens = _sample(dev, samplers[capacity], requests, rows, logits)
    _check_agreement(tokens, reference_results(logits, requests, rows))


def test_ties_are_rare_over_a_seeded_sweep(dev, samplers):
    """Count and report ties over a fixed sweep of filtered, penalised rows; they must be rare."""
    rng = random.Random(1234)
    agreement = Agreement()
    for trial in range(6):
        requests = {
            row: RowRequest(
                SamplingParams(temperature=rng.choice([0.0, 0.6, 1.0, 1.5]), top_k=rng.choice([-1, 5, 50]),
                               top_p=rng.choice([1.0, 0.95, 0.7]), min_p=rng.choice([0.0, 0.02]),
                               repetition_penalty=rng.choice([1.0, 1.2]), frequency_penalty=rng.choice([0.0, 0.4])),
                rng.randrange(2**62), tuple(rng.randrange(VOCAB) for _ in range(8)),
                tuple(rng.randrange(VOCAB) for _ in range(rng.randrange(6))))
            for row in range(NUM_STATE_ROWS)
        }
        rows = [LogitRow(r, rng.randrange(10**6)) for r in range(NUM_STATE_ROWS)]
        logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(trial)) * 4.0
        tokens = _sample(dev, samplers[16 if trial % 2 else 64], requests, rows, logits)
        _check_agreement(tokens, reference_results(logits, requests, rows), agreement)
    print(f"\nsampler vs oracle: {agreement.rows} rows, {agreement.ties} documented ties")
    assert agreement.rows == 24
    assert agreement.ties <= 1


# --------------------------------------------------------------------------- greedy and filters


def test_greedy_takes_lowest_index_on_exact_ties(dev, samplers):
    logits = torch.zeros(3, VOCAB)
    logits[0, [17, 5, 230]] = 4.0  # tie between 5, 17, 230
    logits[1, 299] = 1.0  # the last token, in the partial last block
    logits[2] = -1.0  # all tied
    requests = {0: RowRequest(SamplingParams(temperature=0.0), 7, (1,))}
    rows = [LogitRow(0, p) for p in (3, 4, 5)]
    assert _sample(dev, samplers[16], requests, rows, logits) == [5, 299, 0]


def test_greedy_tie_created_by_penalties(dev, samplers):
    logits = torch.zeros(1, VOCAB)
    logits[0, 10] = 3.0
    logits[0, 20] = 1.5
    # repetition 2.0 on prompt token 10 halves it to 1.5: now 10 and 20 tie and 10 wins (lower id)
    requests = {0: RowRequest(SamplingParams(temperature=0.0, repetition_penalty=2.0), 1, (10,))}
    assert _sample(dev, samplers[64], requests, [LogitRow(0, 0)], logits) == [10]
    requests = {0: RowRequest(SamplingParams(temperature=0.0, frequency_penalty=1.5), 1, (3,), (10,))}
    assert _sample(dev, samplers[64], requests, [LogitRow(0, 0)], logits) == [10]
    requests = {0: RowRequest(SamplingParams(temperature=0.0, presence_penalty=2.0), 1, (3,), (10, 10))}
    assert _sample(dev, samplers[64], requests, [LogitRow(0, 0)], logits) == [20]


FILTERS = [
    pytest.param(SamplingParams(top_k=1), id="top_k=1"),
    pytest.param(SamplingParams(top_k=3), id="top_k=3"),
    pytest.param(SamplingParams(top_k=120), id="top_k=120"),
    pytest.param(SamplingParams(top_p=0.3), id="top_p=0.3"),
    pytest.param(SamplingParams(top_p=0.97, temperature=3.0), id="top_p=0.97-flat"),
    pytest.param(SamplingParams(min_p=0.3), id="min_p=0.3"),
    pytest.param(SamplingParams(min_p=0.001, temperature=2.0), id="min_p=0.001"),
    pytest.param(SamplingParams(top_k=30, top_p=0.8, min_p=0.05, temperature=0.8), id="combined"),
]


@pytest.mark.parametrize("params", FILTERS)
def test_each_filter_keeps_exactly_the_reference_set(dev, samplers, params):
    """Over many noise positions every sampled token lies in the oracle's kept set and matches its token."""
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(3)) * 2.0
    kept = ref.filtered_scores(logits[0], params, (), ()) > -math.inf
    requests = {0: RowRequest(params, 99, (0,))}
    rows = [LogitRow(0, p) for p in range(8)]
    logits8 = logits.expand(8, VOCAB).contiguous()
    tokens = _sample(dev, samplers[16], requests, rows, logits8)
    assert all(bool(kept[t]) for t in tokens), (tokens, int(kept.sum()))
    _check_agreement(tokens, reference_results(logits8, requests, rows))


def test_ties_at_thresholds_are_all_kept(dev, samplers):
    """top-k and top-p keep every entry tied with the threshold; 200 ties force the single-value bracket."""
    logits = torch.full((1, VOCAB), -30.0)
    logits[0, 0] = 2.0
    logits[0, 50:250] = 1.0  # 200 ties at the 2nd-largest value
    for params in (SamplingParams(top_k=2), SamplingParams(top_k=150), SamplingParams(top_p=0.5)):
        kept = ref.filtered_scores(logits[0], params, (), ()) > -math.inf
        assert int(kept.sum()) == 201
        requests = {0: RowRequest(params, 5, (1,))}
        rows = [LogitRow(0, p) for p in range(6)]
        batch = logits.expand(6, VOCAB).contiguous()
        tokens = _sample(dev, samplers[16], requests, rows, batch)
        assert all(t == 0 or 50 <= t < 250 for t in tokens)
        _check_agreement(tokens, reference_results(batch, requests, rows))


def test_penalties_with_draft_prefix_and_shared_state_rows(dev, samplers):
    """Draft rows share one state row; each counts its preceding drafts as outputs (docs/SAMPLING.md)."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(4, VOCAB, generator=gen) * 2.0
    params = SamplingParams(temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.7, presence_penalty=0.5)
    top = logits.argmax(dim=1).tolist()
    drafts = (top[1], top[2], top[3])  # row j counts drafts top[1..j]: its own argmax is penalised
    requests = {2: RowRequest(params, 3, (top[3],), (top[2],))}
    rows = [LogitRow(2, 10 + j, drafts[:j]) for j in range(4)]
    tokens = _sample(dev, samplers[64], requests, rows, logits)
    _check_agreement(tokens, reference_results(logits, requests, rows))
    # the drafts really changed the outcome somewhere (otherwise the test could not fail)
    no_drafts = [LogitRow(2, 10 + j) for j in range(4)]
    assert tokens != _sample(dev, samplers[64], requests, no_drafts, logits)


def test_seed_and_position_select_the_noise(dev, samplers):
    logits = torch.zeros(6, VOCAB)
    requests = {0: RowRequest(SamplingParams(), 1, (1,)), 1: RowRequest(SamplingParams(), 2, (1,))}
    rows = [LogitRow(0, 5), LogitRow(0, 5), LogitRow(0, 6), LogitRow(1, 5), LogitRow(1, 6), LogitRow(0, 7)]
    tokens = _sample(dev, samplers[64], requests, rows, logits)
    assert tokens[0] == tokens[1]
    assert len(set(tokens)) >= 4  # uniform over 300 tokens: different streams give different tokens
    _check_agreement(tokens, reference_results(logits, requests, rows))


# --------------------------------------------------------------------------- non-finite rule


def test_non_finite_rule(dev, samplers):
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(5))
    logits[0, 40] = float("nan")  # NaN counts as -inf and flags the row
    logits[1, [260, 120]] = float("inf")  # lowest +inf wins
    logits[2] = float("-inf")  # all -inf: token 0, not flagged
    logits[3] = float("nan")  # all NaN: token 0, flagged
    logits[4, 7] = float("inf")
    logits[4, 3] = float("nan")
    logits[5, 100:] = float("-inf")  # partially masked row samples among the first 100
    for params in (SamplingParams(), SamplingParams(temperature=0.0), SamplingParams(top_k=5, top_p=0.8, min_p=0.1)):
        requests = {0: RowRequest(params, 8, (1,))}
        rows = [LogitRow(0, i) for i in range(6)]
        state = SamplingState(dev, NUM_STATE_ROWS, VOCAB)
        admit(dev, state, requests)
        out = run_sampler(dev, samplers[16], state, logits, rows)
        tokens, flags = out.tokens.tolist(), out.nan_flags.tolist()
        results = reference_results(logits, requests, rows)
        assert flags == [1, 1, 0, 1, 1, 0] == [int(r.nan_flag) for r in results]
        assert tokens[1] == 120 and tokens[2] == 0 and tokens[3] == 0 and tokens[4] == 7
        assert tokens[0] != 40 and tokens[5] < 100
        _check_agreement(tokens, results)


# --------------------------------------------------------------------------- boundary and host reads


def test_bad_arguments_raise_before_any_launch(dev, samplers):
    sampler = samplers[16]
    state = SamplingState(dev, NUM_STATE_ROWS, VOCAB)
    logits = dev.zeros((2, VOCAB), torch.float32)
    rows = dev.zeros(2, torch.int32)
    positions = dev.zeros(2, torch.int64)
    before = sampler.tokens.clone()
    with pytest.raises(SamplerError, match="num_rows"):
        sampler.sample(logits, state, rows, positions, num_rows=9)
    with pytest.raises(SamplerError, match="logits"):
        sampler.sample(logits.double(), state, rows, positions, num_rows=2)
    with pytest.raises(SamplerError, match="positions"):
        sampler.sample(logits, state, rows, positions.int(), num_rows=2)
    with pytest.raises(SamplerError, match="logit_rows_to_state_rows"):
        sampler.sample(logits, state, rows[:1], positions, num_rows=2)
    with pytest.raises(SamplerError, match="draft_prefix"):
        sampler.sample(logits, state, rows, positions, num_rows=2, draft_prefix=dev.zeros((2, 2), torch.int64))
    with pytest.raises(SamplerError, match="max_num_logprobs"):
        sampler.sample(logits, state, rows, positions, num_rows=2, max_num_logprobs=5)
    with pytest.raises(SamplerError, match="vocabulary"):
        sampler.sample(logits, SamplingState(dev, 2, VOCAB + 1), rows, positions, num_rows=2)
    for flag in ("all_greedy", "unfiltered", "processed_logprobs"):  # the host's launch choices: bools, not truthy values
        with pytest.raises(SamplerError, match=f"{flag} must be a bool"):
            sampler.sample(logits, state, rows, positions, num_rows=2, **{flag: 1})
    assert torch.equal(sampler.tokens, before)


@pytest.mark.skipif(torch.cuda.is_available(), reason="sim kernels run interpreted; the GPU twin is in test_sampler_gpu")
def test_sample_reads_no_device_data_on_the_host():
    """On a lagging sim device, sampling (with logprobs) inside an enqueue trips no host-read trap."""
    sync = pytest.importorskip("runnercheck.checks.detectors.sync")
    dev = Device("sim", seed=3, lag_policy="lag-1-steps")
    sampler = Sampler(dev, VOCAB, max_logprobs=3, max_num_rows=4, candidate_capacity=16)
    state = SamplingState(dev, NUM_STATE_ROWS, VOCAB)
    requests = {0: RowRequest(SamplingParams(top_k=9, top_p=0.9, frequency_penalty=0.3), 4, (2, 3), (5,))}
    logits_host = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(2))
    logits = dev.to_device(logits_host)
    rows = dev.to_device(torch.zeros(2, dtype=torch.int32))
    positions = dev.to_device(torch.tensor([4, 5], dtype=torch.int64))
    box = {}
    with sync.forbid_host_sync("sim") as scope:
        admit(dev, state, requests)
        dev.enqueue(lambda: box.setdefault("out", sampler.sample(logits, state, rows, positions, num_rows=2,
                                                                 max_num_logprobs=3)), "sample")
        dev.begin_step()
    assert scope.count == 0
    dev.synchronize()
    results = reference_results(logits_host, requests, [LogitRow(0, 4), LogitRow(0, 5)])
    _check_agreement(box["out"].tokens.tolist(), results)
