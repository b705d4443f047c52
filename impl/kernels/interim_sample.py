"""Interim sampling until `impl.sample` is wired: greedy, and temperature-only Gumbel-max.

Follows docs/SAMPLING.md steps 0, 2, 3 and 7 (non-finite rule, greedy, temperature, Gumbel-max
with the shared RNG of `impl.kernels.rng`); a request asking for anything else (top-k/p, min-p,
penalties, logprobs) is rejected at the boundary by `InterimSamplingState.check`, so nothing is
silently sampled from the wrong distribution.  It exposes the same calls as
``impl.sample.SamplingState`` / ``impl.sample.Sampler`` and is deleted once those are wired.

Ownership: `InterimSamplingState` owns ``temperature`` (float32) and ``seed`` (int64), two
`StagedWriteTensor` ``[max_num_reqs]`` on the device for the runner's lifetime, written only by
their apply kernels at admission.  `InterimSampler` owns nothing persistent: its outputs are
per-step temporaries.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import triton
import triton.language as tl

from impl.buffers import StagedWriteTensor, StagingWriter
from impl.device import Device
from impl.interface import SamplingParams, SamplingParamsError, SchedulerOutput
from impl.kernels.rng import gumbel_noise


@triton.jit
def _interim_sample_kernel(
    logits_ptr, logits_row_stride, state_rows_ptr, positions_ptr, temperature_ptr, seed_ptr,
    tokens_ptr, nan_flags_ptr, vocab, BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    row = tl.load(state_rows_ptr + i)
    temperature = tl.load(temperature_ptr + row)
    seed = tl.load(seed_ptr + row)
    position = tl.load(positions_ptr + i)
    greedy = temperature == 0.0
    inv_t = tl.where(greedy, 1.0, 1.0 / tl.where(greedy, 1.0, temperature))
    # Per-lane running best (strictly greater wins, so each lane keeps its lowest id), reduced
    # across lanes at the end: the lowest-index argmax over the whole vocabulary.
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_ids = tl.zeros([BLOCK], tl.int32)
    flagged = tl.zeros([BLOCK], tl.int32)
    for start in range(0, vocab, BLOCK):
        ids = start + tl.arange(0, BLOCK)
        m = ids < vocab
        logit = tl.load(logits_ptr + i.to(tl.int64) * logits_row_stride + ids, mask=m, other=float("-inf"))
        flagged = tl.maximum(flagged, ((logit != logit) | (logit == float("inf"))).to(tl.int32))
        logit = tl.where(logit != logit, float("-inf"), logit)
        noise = tl.where(greedy, 0.0, gumbel_noise(seed, position, ids))
        # +inf stays +inf and -inf stays -inf under the noise, so the lowest-index argmax
        # also realises the non-finite rule (first +inf wins; all -inf gives token 0).
        score = tl.where(m, logit * inv_t + noise, float("-inf"))
        take = score > best
        best_ids = tl.where(take, ids, best_ids)
        best = tl.where(take, score, best)
    top = tl.max(best, axis=0)
    best_id = tl.min(tl.where(best == top, best_ids, vocab), axis=0)
    flagged = tl.max(flagged, axis=0)
    tl.store(tokens_ptr + i, best_id.to(tl.int64))
    tl.store(nan_flags_ptr + i, flagged.to(tl.int32))


@dataclass
class InterimSamplerOutput:
    """Per logit row: the token and the non-finite flag.  No logprobs on the interim path."""

    tokens: torch.Tensor  # int64 [N]
    nan_flags: torch.Tensor  # int32 [N]
    logprob: torch.Tensor | None = None
    rank: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None


class InterimSamplingState:
    """Per-row temperature and seed.  See the module docstring for ownership."""

    def __init__(self, device: Device, max_num_reqs: int, vocab_size: int):
        self.device = device
        self.vocab_size = vocab_size
        self.temperature = StagedWriteTensor(device, max_num_reqs, torch.float32, "interim_temperature")
        self.seed = StagedWriteTensor(device, max_num_reqs, torch.int64, "interim_seed")

    @staticmethod
    def check(sched: SchedulerOutput) -> None:
        """Reject requests that need more than greedy / temperature sampling (before any state change)."""
        neutral = SamplingParams()
        for req in sched.new_requests:
            p = req.sampling_params
            for name in ("top_k", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty"):
                if getattr(p, name) != getattr(neutral, name):
                    raise SamplingParamsError(f"{name} is not supported by the interim sampler", req_id=req.req_id, field=name)
            for name in ("logprobs", "prompt_logprobs"):
                if getattr(p, name) is not None:
                    raise SamplingParamsError(f"{name} is not supported by the interim sampler", req_id=req.req_id, field=name)

    def add_request(self, row: int, params: SamplingParams, seed: int, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int] = ()) -> None:
        self.temperature.stage_scalar(row, float(params.temperature))
        self.seed.stage_scalar(row, seed)

    def flush(self, writer: StagingWriter) -> None:
        self.temperature.flush(writer)
        self.seed.flush(writer)

    def enqueue_apply(self) -> None:
        self.temperature.enqueue_apply()
        self.seed.enqueue_apply()

    def enqueue_post_update(self, rows_dev: torch.Tensor, tokens_dev: torch.Tensor, valid_dev: torch.Tensor, num: int) -> None:
        """Nothing to count: the interim path has no penalties."""


class InterimSampler:
    def __init__(self, device: Device, vocab_size: int, max_logprobs: int = 20):
        self.device = device
        self.vocab_size = vocab_size

    def sample(
        self, logits: torch.Tensor, state: InterimSamplingState, logit_rows_to_state_rows: torch.Tensor,
        positions: torch.Tensor, *, num_rows: int, draft_prefix: torch.Tensor | None = None, max_num_logprobs: int = -1,
    ) -> InterimSamplerOutput:
        """Sample one token per logit row (device work: call from inside an enqueued closure)."""
        tokens = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
        nan_flags = torch.empty(num_rows, dtype=torch.int32, device=logits.device)
        block = min(1024, triton.next_power_of_2(self.vocab_size))
        _interim_sample_kernel[(num_rows,)](
            logits, logits.stride(0), logit_rows_to_state_rows, positions, state.temperature.base, state.seed.base,
            tokens, nan_flags, self.vocab_size, BLOCK=block,
        )
        return InterimSamplerOutput(tokens, nan_flags)
