"""impl/kernels/spec_verify.py through impl/sample/spec_verify.py: token for token the oracle's
(reference/spec_verify.py), bad inputs refused before any launch, no host read in `verify`."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runnercheck.impl.device import Device
from runnercheck.impl.interface import SpecLayoutError, SpecProbabilityError, SpecTooManyDraftsError, SpecVocabMismatchError
from runnercheck.impl.sample import spec_verify as launcher
from runnercheck.impl.sample.spec_verify import SpecVerifier
from runnercheck.reference.spec_verify import verify as oracle_verify

MAX_K = 3


@dataclass
class Batch:
    """Host tensors of one verification call (the layout `SpecVerifier.verify` documents)."""

    target: torch.Tensor
    draft_probs: torch.Tensor
    draft_tokens: torch.Tensor
    cu: torch.Tensor
    idx_mapping: torch.Tensor
    seeds: torch.Tensor
    temperature: torch.Tensor
    positions: torch.Tensor
    num_drafts: list[int]

    def args(self, dev: Device) -> tuple:
        return tuple(dev.to_device(t) for t in (self.target, self.draft_probs, self.draft_tokens, self.cu,
                                                 self.idx_mapping, self.seeds, self.temperature, self.positions))

    def oracle(self, r: int):
        k = self.num_drafts[r]
        d0 = int(self.cu[r])
        row = int(self.idx_mapping[r])
        return oracle_verify(self.target[d0 + r : d0 + r + k + 1], self.draft_tokens[d0 : d0 + k].tolist(),
                             self.draft_probs[d0 : d0 + k], seed=int(self.seeds[row]), position=int(self.positions[r]),
                             temperature=float(self.temperature[row]), max_spec_tokens=MAX_K)


def _probs(weights: torch.Tensor) -> torch.Tensor:
    return (weights / weights.sum(dim=1, keepdim=True)).to(torch.float32)


@st.composite
def batches(draw) -> Batch:
    """Small batches: integer weights (so exact ties and zeros occur), q == p on some rows."""
    vocab = draw(st.sampled_from([5, 8, 24]))
    num_drafts = draw(st.lists(st.integers(0, MAX_K), min_size=1, max_size=3))
    n_reqs, n_drafts = len(num_drafts), sum(num_drafts)

    def weights(rows: int) -> torch.Tensor:
        w = torch.tensor(draw(st.lists(st.integers(0, 5), min_size=rows * vocab, max_size=rows * vocab)),
                         dtype=torch.float64).reshape(rows, vocab)
        w[:, draw(st.integers(0, vocab - 1))] += 1.0  # every row holds mass
        return w

    target = _probs(weights(n_drafts + n_reqs))
    draft_probs = _probs(weights(n_drafts)) if n_drafts else torch.zeros(0, vocab)
    cu = [0]
    for k in num_drafts:
        cu.append(cu[-1] + k)
    for r in range(n_reqs):
        for i in range(num_drafts[r]):
            if draw(st.booleans()):  # q_i == p_i: every such draft is accepted
                draft_probs[cu[r] + i] = target[cu[r] + r + i]
    tokens = torch.tensor(draw(st.lists(st.integers(0, vocab - 1), min_size=n_drafts, max_size=n_drafts)), dtype=torch.int64)
    num_state_rows = n_reqs + 1
    mapping = draw(st.permutations(list(range(num_state_rows))))[:n_reqs]
    seeds = torch.tensor(draw(st.lists(st.integers(0, 2**63 - 1), min_size=num_state_rows, max_size=num_state_rows)))
    temperature = torch.tensor(draw(st.lists(st.sampled_from([0.0, 0.7, 1.0]), min_size=num_state_rows,
                                             max_size=num_state_rows)), dtype=torch.float32)
    positions = torch.tensor(draw(st.lists(st.integers(0, 2**31), min_size=n_reqs, max_size=n_reqs)), dtype=torch.int64)
    return Batch(target, draft_probs, tokens, torch.tensor(cu, dtype=torch.int32), torch.tensor(mapping, dtype=torch.int32),
                 seeds, temperature, positions, num_drafts)


def _run(batch: Batch, dev: Device | None = None, chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    dev = dev or Device("cpu")
    verifier = SpecVerifier(dev, batch.target.shape[1], max_num_reqs=max(4, len(batch.num_drafts)), max_spec_tokens=MAX_K,
                            chunk=chunk)
    out = verifier.verify(*batch.args(dev), num_drafts=batch.num_drafts)
    return out.tokens.clone(), out.accepted.clone()


def _assert_matches_oracle(batch: Batch, tokens: torch.Tensor, accepted: torch.Tensor) -> int:
    """Token-for-token equality per request (requests the oracle marks fragile are skipped); fragile count."""
    fragile = 0
    for r in range(len(batch.num_drafts)):
        ref = batch.oracle(r)
        if ref.fragile:
            fragile += 1
            continue
        row = tokens[r].tolist()
        assert int(accepted[r]) == ref.accepted, (r, row, ref)
        assert tuple(row[: ref.accepted + 1]) == ref.tokens, (r, row, ref)
        assert all(t == -1 for t in row[ref.accepted + 1 :]), row
    return fragile


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches(), st.sampled_from([2, 4, 1024]))
def test_kernel_equals_the_oracle(batch: Batch, chunk: int) -> None:
    """Whatever the span width of the resample: a row in one span, or in several with a partial last one."""
    tokens, accepted = _run(batch, chunk=chunk)
    _assert_matches_oracle(batch, tokens, accepted)


@pytest.mark.parametrize("chunk", [0, 3, 24, "4"])
def test_a_bad_span_width_is_refused(chunk: object) -> None:
    with pytest.raises(launcher.SpecVerifyError, match="chunk"):
        SpecVerifier(Device("cpu"), 8, max_num_reqs=2, max_spec_tokens=MAX_K, chunk=chunk)


def test_q_equal_p_accepts_everything_and_samples_the_bonus() -> None:
    gen = torch.Generator().manual_seed(4)
    p = _probs(torch.rand(8, 16, generator=gen, dtype=torch.float64))
    q = torch.cat([p[0:3], p[4:7]])  # request 0: rows 0..2 + bonus 3; request 1: rows 4..6 + bonus 7
    batch = Batch(p, q, torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([0, 3, 6], dtype=torch.int32),
                  torch.tensor([0, 1], dtype=torch.int32), torch.tensor([11, 12]), torch.tensor([1.0, 1.0]),
                  torch.tensor([100, 7]), [3, 3])
    tokens, accepted = _run(batch)
    assert accepted.tolist() == [3, 3]
    assert tokens[0, :3].tolist() == [1, 2, 3] and tokens[1, :3].tolist() == [4, 5, 6]
    assert _assert_matches_oracle(batch, tokens, accepted) == 0


def test_greedy_prefix_and_ties() -> None:
    p = torch.full((4, 5), 0.1)
    for i, t in enumerate((2, 4, 1, 3)):
        p[i, t] = 0.6
    p[1, 0] = 0.6  # row 1: tie between 0 and 4, lowest index wins
    q = torch.full((3, 5), 0.2)
    batch = Batch(p, q, torch.tensor([2, 0, 1]), torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                  torch.tensor([0]), torch.tensor([0.0]), torch.tensor([0]), [3])
    tokens, accepted = _run(batch)
    assert tokens[0].tolist() == [2, 0, 1, 3] and accepted.tolist() == [3]
    batch.draft_tokens = torch.tensor([2, 4, 1])
    tokens, accepted = _run(batch)
    assert tokens[0].tolist() == [2, 0, -1, -1] and accepted.tolist() == [1]


# --------------------------------------------------------------------------- bad inputs


def _good_batch() -> Batch:
    gen = torch.Generator().manual_seed(9)
    p = _probs(torch.rand(5, 8, generator=gen, dtype=torch.float64))
    q = _probs(torch.rand(3, 8, generator=gen, dtype=torch.float64))
    return Batch(p, q, torch.tensor([1, 2, 3]), torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([1, 0], dtype=torch.int32),
                 torch.tensor([5, 6]), torch.tensor([1.0, 0.0]), torch.tensor([3, 9]), [2, 1])


def _bad(batch: Batch, **changes) -> Batch:
    for k, v in changes.items():
        setattr(batch, k, v)
    return batch


BAD_INPUTS = {
    "k above max_spec_tokens": (lambda b: _bad(b, num_drafts=[4, 1], cu=torch.tensor([0, 4, 5], dtype=torch.int32)),
                                SpecTooManyDraftsError),
    "draft vocabulary differs": (lambda b: _bad(b, draft_probs=torch.full((3, 9), 1 / 9)), SpecVocabMismatchError),
    "too few target rows": (lambda b: _bad(b, target=b.target[:4]), SpecLayoutError),
    "too few draft tokens": (lambda b: _bad(b, draft_tokens=b.draft_tokens[:2]), SpecLayoutError),
    "cu of the wrong dtype": (lambda b: _bad(b, cu=b.cu.to(torch.int64)), SpecLayoutError),
    "cu disagrees with the counts": (lambda b: _bad(b, cu=torch.tensor([0, 1, 3], dtype=torch.int32)), SpecLayoutError),
    "negative draft probability": (lambda b: _bad(b, draft_probs=b.draft_probs.index_fill(1, torch.tensor([2]), -0.1)),
                                   SpecProbabilityError),
    "NaN draft probability": (lambda b: _bad(b, draft_probs=b.draft_probs.index_fill(1, torch.tensor([0]), math.nan)),
                              SpecProbabilityError),
    "draft token outside the vocabulary": (lambda b: _bad(b, draft_tokens=torch.tensor([1, 8, 3])), SpecLayoutError),
    "idx_mapping outside the state rows": (lambda b: _bad(b, idx_mapping=torch.tensor([2, 0], dtype=torch.int32)),
                                           SpecLayoutError),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs_raise_before_any_launch(case: str, monkeypatch) -> None:
    batch, error = BAD_INPUTS[case][0](_good_batch()), BAD_INPUTS[case][1]

    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError("the kernel was launched")

    monkeypatch.setattr(launcher, "spec_verify_kernel", NoLaunch())
    dev = Device("cpu")
    verifier = SpecVerifier(dev, 8, max_num_reqs=4, max_spec_tokens=MAX_K)
    with pytest.raises(error):
        verifier.verify_checked(*batch.args(dev), num_drafts=batch.num_drafts)


def test_the_good_batch_passes_the_checks() -> None:
    batch = _good_batch()
    dev = Device("cpu")
    out = SpecVerifier(dev, 8, max_num_reqs=4, max_spec_tokens=MAX_K).verify_checked(*batch.args(dev), num_drafts=batch.num_drafts)
    _assert_matches_oracle(batch, out.tokens, out.accepted)


@pytest.mark.skipif(torch.cuda.is_available(), reason="sim kernels run interpreted")
def test_verify_reads_no_device_data_on_the_host() -> None:
    sync = pytest.importorskip("runnercheck.checks.detectors.sync")
    batch = _good_batch()
    dev = Device("sim", seed=3, lag_policy="lag-1-steps")
    verifier = SpecVerifier(dev, 8, max_num_reqs=4, max_spec_tokens=MAX_K)
    args = batch.args(dev)
    box = {}
    with sync.forbid_host_sync("sim") as scope:
        dev.enqueue(lambda: box.setdefault("out", verifier.verify(*args, num_drafts=batch.num_drafts)), "spec verify")
        dev.begin_step()
    assert scope.count == 0
    dev.synchronize()
    _assert_matches_oracle(batch, box["out"].tokens, box["out"].accepted)


@pytest.mark.gpu
def test_kernel_equals_the_oracle_at_a_real_vocabulary_on_cuda() -> None:
    gen = torch.Generator().manual_seed(21)
    vocab, num_drafts = 32000, [3, 0, 2, 3, 1, 3, 3, 2]
    n_reqs, n_drafts = len(num_drafts), sum(num_drafts)
    p = _probs(torch.rand(n_drafts + n_reqs, vocab, generator=gen, dtype=torch.float64) ** 8)
    q = _probs(torch.rand(n_drafts, vocab, generator=gen, dtype=torch.float64) ** 8)
    cu = [0]
    for k in num_drafts:
        cu.append(cu[-1] + k)
    # half the drafts are the target's most likely token, so long accepted prefixes occur
    draft_rows = [cu[r] + r + i for r in range(n_reqs) for i in range(num_drafts[r])]
    tokens = torch.where(torch.arange(n_drafts) % 2 == 0, p[draft_rows].argmax(dim=1),
                         torch.randint(0, vocab, (n_drafts,), generator=gen))
    batch = Batch(p, q, tokens, torch.tensor(cu, dtype=torch.int32), torch.arange(n_reqs, dtype=torch.int32),
                  torch.arange(n_reqs, dtype=torch.int64) * 7919, torch.tensor([1.0, 0.0] * (n_reqs // 2)),
                  torch.arange(n_reqs, dtype=torch.int64) * 100, num_drafts)
    tokens_out, accepted = _run(batch, Device("cuda"))
    _assert_matches_oracle(batch, tokens_out.cpu(), accepted.cpu())
