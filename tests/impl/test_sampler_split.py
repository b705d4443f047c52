"""The split-row paths of the sampler and logprobs kernels, on CPU (interpreted) against the oracle.

Small vocabulary, 32-entry chunks: every path of `runnercheck.impl.kernels.sampling` is taken on purpose and
asserted (the plan is read back), so a change that silently routes rows to the fallback fails
here.  Planted bugs in the chunk combines (a private copy of the kernel module with one device
function rebound) must be caught by the same oracle comparison.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from runnercheck.impl.device import Device
from runnercheck.impl.interface import SamplingParams
from runnercheck.impl.kernels.sampling_split import MODE_DONE, MODE_FALLBACK, MODE_GATHER, MODE_THRESHOLD
from runnercheck.impl.sample import LogprobsComputer, Sampler, SamplingState, SelectionConfig
from test_sampler_harness import LogitRow, RowRequest, admit, reference_results, run_sampler

ref = pytest.importorskip("runnercheck.reference.sampler")

VOCAB = 300  # 10 chunks of 32, the last one partial
CONFIG = SelectionConfig(block=64, narrow_block=64, candidates=32, num_warps=4, chunk=32, slots=8, split_warps=1)


@pytest.fixture(scope="module")
def dev() -> Device:
    return Device("cuda" if torch.cuda.is_available() else "cpu")


def _run(dev: Device, sampler: Sampler, params: list[SamplingParams], logits: torch.Tensor) -> tuple[list, list, list]:
    requests = {row: RowRequest(p, 1234 + row, (3, 17), (5,)) for row, p in enumerate(params)}
    state = SamplingState(dev, len(params), VOCAB)
    admit(dev, state, requests)
    rows = [LogitRow(i, 40 + i) for i in range(len(params))]
    tokens = run_sampler(dev, sampler, state, logits, rows).tokens.tolist()
    expected = [r.token for r in reference_results(logits, requests, rows)]
    return tokens, expected, sampler.mode[: len(params)].tolist()


@pytest.mark.parametrize("select_programs", [0, 20, 3], ids=["a-chunk-a-program", "groups-of-4", "a-row-a-program"])
def test_every_split_path_is_taken_and_matches_the_oracle(dev, select_programs):
    """The select pass one chunk a program, and in groups (`select_group`: 70 chunks over about 20 programs, groups
    of 4 with a partial last one; over about 3, each row's 10 chunks in one program)."""
    config = dataclasses.replace(CONFIG, select_programs=select_programs)
    sampler = Sampler(dev, VOCAB, max_logprobs=0, max_num_rows=8, config=config)
    params = [
        SamplingParams(temperature=0.9),                          # one read, Gumbel argmax
        SamplingParams(temperature=0.0, presence_penalty=0.5),    # one read, argmax
        SamplingParams(top_k=5, top_p=0.8, min_p=0.01),           # chunk-max bound, gather
        SamplingParams(min_p=0.05, temperature=1.5),              # threshold pass
        SamplingParams(top_p=0.7),                                # top-p without top-k: fallback
        SamplingParams(top_k=12),                                 # k above the chunk count: fallback
        SamplingParams(top_k=4),                                  # gather overflow (row 6): fallback
    ]
    logits = torch.randn(len(params), VOCAB, generator=torch.Generator().manual_seed(4)) * 2
    logits[6, 64:96] += 30.0  # one chunk holds 32 entries above the bound: more than its 8 slots
    tokens, expected, modes = _run(dev, sampler, params, logits)
    assert modes == [MODE_DONE, MODE_DONE, MODE_GATHER, MODE_THRESHOLD, MODE_FALLBACK, MODE_FALLBACK, MODE_FALLBACK]
    assert tokens == expected


@pytest.mark.parametrize("field, value", [("select_programs", -1), ("select_programs", 2.5), ("block_maxnreg", -8),
                                          ("greedy_stages", 0), ("greedy_stages", True)])
def test_bad_launch_shapes_are_typed_errors(dev, field, value):
    """A negative or fractional select-pass program count, a negative register cap and a greedy loop of no stages
    are refused at construction."""
    from runnercheck.impl.sample import LogprobsError

    with pytest.raises(LogprobsError, match=field):
        Sampler(dev, VOCAB, max_logprobs=0, max_num_rows=8, config=dataclasses.replace(CONFIG, **{field: value}))


def test_non_finite_rows_finish_in_the_plan(dev):
    sampler = Sampler(dev, VOCAB, max_logprobs=0, max_num_rows=8, config=CONFIG)
    params = [SamplingParams(top_k=5)] * 3
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(5))
    logits[0, 290] = float("inf")  # +inf in the last, partial chunk wins
    logits[1] = float("-inf")      # all -inf: token 0
    logits[2, 7] = float("nan")    # NaN only flags
    tokens, expected, modes = _run(dev, sampler, params, logits)
    assert tokens == expected and tokens[:2] == [290, 0]
    assert modes[:2] == [MODE_DONE, MODE_DONE]
    assert sampler.nan_flags[:3].tolist() == [1, 0, 1]


def test_non_finite_logits_in_noisy_rows(dev):
    """Unfiltered temperature rows (the first split pass's Gumbel path, which finds NaN and +inf through its scores'
    maximum and only then rescans), with and without penalties: NaN in every chunk is flagged and never sampled, a
    +inf wins, as the oracle says.  Skipping the rescan loses every chunk with a NaN (its maximum is NaN)."""
    sampler = Sampler(dev, VOCAB, max_logprobs=0, max_num_rows=8, config=CONFIG)
    params = [SamplingParams(temperature=0.8),
              SamplingParams(temperature=1.2, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2)] * 2
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(8)) * 2
    logits[:2, ::7] = float("nan")  # a NaN in every chunk
    logits[2, [5, 150]] = float("nan")
    logits[2, 100] = float("inf")
    logits[3, [250, 299]] = float("inf")  # the lowest +inf wins
    tokens, expected, modes = _run(dev, sampler, params, logits)
    assert tokens == expected and tokens[2:] == [100, 250]
    assert modes == [MODE_DONE] * 4
    assert sampler.nan_flags[:4].tolist() == [1, 1, 1, 1]


def _kernel_copy(module_name: str, tag: str, **rebound) -> object:
    """A private copy of a kernel module with device functions rebound (its kernels compile afresh)."""
    name = f"tests._split_variant_{tag}"
    spec = importlib.util.spec_from_file_location(name, Path(sys.modules[module_name].__file__))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    vars(module).update(rebound)
    return module


@triton.jit
def _argmax_skipping_last_chunk(best_ptr, token_ptr, base, num_blocks, vocab_size, NB_P2: tl.constexpr):
    blocks = tl.arange(0, NB_P2)
    valid = blocks < num_blocks - 1  # the planted bug: the last chunk's partial is never combined
    best = tl.load(best_ptr + base + blocks, mask=valid, other=float("-inf"))
    token = tl.load(token_ptr + base + blocks, mask=valid, other=vocab_size)
    top = tl.max(best, axis=0)
    chosen = tl.min(tl.where(valid & (best == top), token, vocab_size), axis=0)
    return tl.where((top == float("-inf")) | (chosen >= vocab_size), 0, chosen)


def test_planted_combine_bug_is_caught(dev, monkeypatch):
    """A combine that drops the last chunk's partial: the oracle comparison must fail."""
    variant = _kernel_copy("runnercheck.impl.kernels.sampling", "skip_last", reduce_block_argmax=_argmax_skipping_last_chunk)
    sampler = Sampler(dev, VOCAB, max_logprobs=0, max_num_rows=8, config=CONFIG)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.5)]
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(6))
    logits[:, 295] = 9.0  # the head sits in the last chunk
    tokens, expected, _ = _run(dev, sampler, params, logits)
    assert tokens == expected == [295, 295]
    monkeypatch.setattr(sys.modules["runnercheck.impl.sample.sampler"], "sampler_plan_kernel", variant.sampler_plan_kernel)
    tokens, expected, _ = _run(dev, sampler, params, logits)
    assert tokens != expected


@triton.jit
def _bound_one_too_high(max_ptr, base, num_blocks, k, NB_P2: tl.constexpr, COLS: tl.constexpr):
    blocks = tl.arange(0, NB_P2)
    value = tl.load(max_ptr + base + blocks, mask=blocks < num_blocks, other=float("-inf"))
    ordered = tl.sort(value, descending=True)
    return tl.max(tl.where(blocks == k - 2, ordered, float("-inf")), axis=0)  # planted: the (k-1)-th


def test_logprobs_top_lists_and_a_planted_bound_bug(dev, monkeypatch):
    """Top-5 lists decided by the row's last chunk program (mode DONE, counters back to 0), then a
    bound one chunk max too high (the 4th largest instead of the 5th), which misses entries."""
    config = dataclasses.replace(CONFIG, logprobs_sub=8, logprobs_candidates=32)
    computer = LogprobsComputer(dev, VOCAB, 5, 8, config)
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(8)) * 3
    logits[3] = torch.round(logits[3])  # ties in the top list: lower index first
    targets = torch.tensor([0, 299, 150, 31])
    order = torch.argsort(logits.double(), dim=1, descending=True, stable=True)[:, :5]

    def top_ids(computer: LogprobsComputer) -> list:
        box = {}
        dev.enqueue(lambda: box.setdefault("out", computer.launch(dev.to_device(logits), dev.to_device(targets), 4, 5)),
                    "logprobs")
        dev.synchronize()
        out = box["out"]
        lp = torch.log_softmax(logits.double(), dim=-1)
        assert torch.allclose(out.logprob.cpu().double(), lp[torch.arange(4), targets], atol=1e-4)
        return out.top_ids.cpu().long().tolist()

    assert top_ids(computer) == order.tolist()
    assert computer.mode[:4].tolist() == [MODE_DONE] * 4
    assert computer.arrivals.tolist() == [0] * 8  # each row's last program reset its counter
    assert top_ids(computer) == order.tolist()  # ... so a second launch finishes every row again
    variant = _kernel_copy("runnercheck.impl.kernels.sampling_logprobs", "bound_high", kth_largest_block_max=_bound_one_too_high)
    monkeypatch.setattr(sys.modules["runnercheck.impl.sample.logprobs"], "logprobs_block_kernel", variant.logprobs_block_kernel)
    assert top_ids(LogprobsComputer(dev, VOCAB, 5, 8, config)) != order.tolist()  # fresh (zeroed) outputs
