"""The launcher of speculative verification (`runnercheck.impl.kernels.spec_verify`), a batch per call.

`SpecVerifier.verify` is pure device work: it checks shapes, dtypes and the host's own draft
counts (ints the scheduler already holds), then launches the accept kernel (``num_reqs`` programs), the
resample's span partials (``num_reqs`` x ``ceil(V / chunk)`` programs) and their combine (``num_reqs``).  It
reads no device data and allocates nothing per call.  Probabilities are the target's and the
draft's distributions after temperature and filters (docs/SAMPLING.md); the temperature of each
request's state row only picks greedy (0) or rejection-sampling mode.

`SpecVerifier.check_values` reads the device inputs on the host (a sync): values that the shape
checks cannot see (negative/NaN probabilities, offsets that disagree with the host's counts, draft
ids outside the vocabulary).  It is for tests and debugging, outside the hot path;
`verify_checked` runs it and then `verify`.

Ownership: a `SpecVerifier` owns, on the device for its lifetime (persistent addresses, sized at
construction from ``max_num_reqs`` R and ``max_spec_tokens`` K):

* ``tokens`` i64 ``[R, K + 1]``: emitted tokens (accepted drafts, then the resampled/bonus token,
  then -1 padding), written entirely by the kernel for the requests of a call;
* ``accepted`` i32 ``[R]``: accepted draft counts;
* ``partials`` i32 ``[R, 4, S]`` (``S`` spans of ``chunk`` tokens): each request's resample Gumbel-max per
  span (`runnercheck.impl.kernels.spec_verify.store_partials`), written by the partials launch and read by the
  combine launch of the same call; meaningless between calls.

A call's outputs are valid until the next call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import triton

from runnercheck.impl.device import Device
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.kernels.launch import launch
from runnercheck.impl.interface import (
    SpecLayoutError,
    SpecProbabilityError,
    SpecTooManyDraftsError,
    SpecVerifyError,
    SpecVocabMismatchError,
)
from runnercheck.impl.kernels.spec_verify import (SPAN_BLOCK, SPAN_TOKENS, spans_of, spec_resample_combine_kernel,
                                                  spec_resample_partials_kernel, spec_verify_kernel)


@dataclass(frozen=True)
class SpecVerifyOutput:
    """Device views: ``tokens`` i64 ``[num_reqs, max_spec_tokens + 1]`` (-1 padded), ``accepted`` i32 ``[num_reqs]``."""

    tokens: torch.Tensor
    accepted: torch.Tensor


def _int_list(values: object, name: str) -> list[int]:
    if not isinstance(values, (list, tuple)):
        raise SpecLayoutError(f"{name} must be a list of ints (the host's draft counts)")
    out = list(values)
    for v in out:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise SpecLayoutError(f"{name} holds {v!r}, not an int >= 0")
    return out


def _vector(t: object, name: str, dtypes: tuple[torch.dtype, ...], min_len: int) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in dtypes or t.shape[0] < min_len:
        raise SpecLayoutError(f"{name} must be a 1-D {'/'.join(map(str, dtypes))} tensor of at least {min_len} entries, "
                              f"got {getattr(t, 'dtype', type(t))} {tuple(getattr(t, 'shape', ()))}")


class SpecVerifier:
    """Verifies drafts for up to ``max_num_reqs`` requests of up to ``max_spec_tokens`` drafts each."""

    def __init__(self, device: Device, vocab_size: int, *, max_num_reqs: int, max_spec_tokens: int,
                 chunk: int = SPAN_TOKENS):
        if vocab_size < 1 or max_num_reqs < 1 or max_spec_tokens < 0:
            raise SpecVerifyError("need vocab_size >= 1, max_num_reqs >= 1 and max_spec_tokens >= 0")
        if not isinstance(chunk, int) or chunk < 2 or chunk & (chunk - 1):
            raise SpecVerifyError(f"chunk must be a power of two >= 2, got {chunk!r}")
        self.device = device
        self.vocab_size = vocab_size
        self.max_num_reqs = max_num_reqs
        self.max_spec_tokens = max_spec_tokens
        self.tokens = device.full((max_num_reqs, max_spec_tokens + 1), -1, torch.int64)
        self.accepted = device.zeros(max_num_reqs, torch.int32)
        self.chunk, self.num_chunks = spans_of(vocab_size, chunk)
        self.block = min(SPAN_BLOCK, self.chunk)
        self.partials = device.zeros((max_num_reqs, 4, self.num_chunks), torch.int32)

    def check(self, target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
              cu_num_draft_tokens: torch.Tensor, idx_mapping: torch.Tensor, seeds: torch.Tensor,
              temperature: torch.Tensor, positions: torch.Tensor, num_drafts: Sequence[int]) -> int:
        """Shape/dtype checks against the host's draft counts; the number of requests.  No device read."""
        counts = _int_list(num_drafts, "num_drafts")
        num_reqs = len(counts)
        if num_reqs > self.max_num_reqs:
            raise SpecLayoutError(f"{num_reqs} requests > max_num_reqs={self.max_num_reqs}")
        for r, k in enumerate(counts):
            if k > self.max_spec_tokens:
                raise SpecTooManyDraftsError(f"request {r} has {k} draft tokens > max_spec_tokens={self.max_spec_tokens}")
        for name, t in (("target_probs", target_probs), ("draft_probs", draft_probs)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype != torch.float32 or t.stride(1) != 1:
                raise SpecLayoutError(f"{name} must be a float32 tensor [rows, V] with contiguous columns")
        if target_probs.shape[1] != self.vocab_size:
            raise SpecVocabMismatchError(f"target vocabulary {target_probs.shape[1]} != verifier vocabulary {self.vocab_size}")
        if draft_probs.shape[1] != target_probs.shape[1]:
            raise SpecVocabMismatchError(f"draft vocabulary {draft_probs.shape[1]} != target vocabulary {target_probs.shape[1]}")
        num_draft_rows = sum(counts)
        if target_probs.shape[0] < num_draft_rows + num_reqs or draft_probs.shape[0] < num_draft_rows:
            raise SpecLayoutError(f"{num_reqs} requests with {num_draft_rows} drafts need {num_draft_rows + num_reqs} target "
                                  f"rows and {num_draft_rows} draft rows, got {target_probs.shape[0]} and {draft_probs.shape[0]}")
        _vector(draft_tokens, "draft_tokens", (torch.int32, torch.int64), num_draft_rows)
        _vector(cu_num_draft_tokens, "cu_num_draft_tokens", (torch.int32,), num_reqs + 1)
        _vector(idx_mapping, "idx_mapping", (torch.int32,), num_reqs)
        _vector(positions, "positions", (torch.int64,), num_reqs)
        _vector(seeds, "seeds", (torch.int64,), 1)
        _vector(temperature, "temperature", (torch.float32,), seeds.shape[0])
        return num_reqs

    def check_values(self, target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                     cu_num_draft_tokens: torch.Tensor, idx_mapping: torch.Tensor, seeds: torch.Tensor,
                     num_drafts: Sequence[int]) -> None:
        """What the shape checks cannot see; reads device data on the host (a sync: not for the hot path)."""
        counts = list(num_drafts)
        n_drafts, num_reqs = sum(counts), len(counts)
        cu = [0]
        for k in counts:
            cu.append(cu[-1] + k)
        if cu_num_draft_tokens[: num_reqs + 1].tolist() != cu:
            raise SpecLayoutError(f"cu_num_draft_tokens {cu_num_draft_tokens[: num_reqs + 1].tolist()} != {cu} (from num_drafts)")
        mapped = idx_mapping[:num_reqs]
        if num_reqs and (int(mapped.min()) < 0 or int(mapped.max()) >= seeds.shape[0]):
            raise SpecLayoutError(f"idx_mapping outside [0, {seeds.shape[0]})")
        ids = draft_tokens[:n_drafts]
        if n_drafts and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise SpecLayoutError(f"a draft token id outside [0, {self.vocab_size})")
        for name, rows in (("target_probs", target_probs[: n_drafts + num_reqs]), ("draft_probs", draft_probs[:n_drafts])):
            if not bool(torch.isfinite(rows).all()) or bool((rows < 0).any()):
                raise SpecProbabilityError(f"{name} holds a negative, NaN or infinite probability")
            if rows.shape[0] and bool((rows.sum(dim=1) <= 0).any()):
                raise SpecProbabilityError(f"{name} has a row with no probability mass")

    @hot_path
    def verify(self, target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
               cu_num_draft_tokens: torch.Tensor, idx_mapping: torch.Tensor, seeds: torch.Tensor,
               temperature: torch.Tensor, positions: torch.Tensor, *, num_drafts: Sequence[int]) -> SpecVerifyOutput:
        """Verify the drafts of ``len(num_drafts)`` requests; launches only.

        ``target_probs`` f32 ``[>= sum(k) + num_reqs, V]``, ``draft_probs`` f32 ``[>= sum(k), V]``,
        ``draft_tokens`` i32/i64 ``[>= sum(k)]``, ``cu_num_draft_tokens`` i32 ``[>= num_reqs + 1]``
        (``cu[0] = 0``; request r's drafts are rows ``cu[r]..cu[r+1]``, its target rows
        ``cu[r] + r .. cu[r+1] + r``), ``idx_mapping`` i32 ``[>= num_reqs]`` (request -> state
        row), ``seeds`` i64 and ``temperature`` f32 per state row, ``positions`` i64
        ``[>= num_reqs]`` (noise position of each request's target row 0).  ``num_drafts``: the
        host's draft count per request (its cumulative sum must equal ``cu``).
        """
        num_reqs = self.check(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens, idx_mapping, seeds,
                              temperature, positions, num_drafts)
        tokens, accepted = self.tokens[:num_reqs], self.accepted[:num_reqs]
        if num_reqs == 0:
            return SpecVerifyOutput(tokens, accepted)
        width = self.max_spec_tokens + 1
        launch(spec_verify_kernel, (num_reqs,),
            target_probs, target_probs.stride(0), draft_probs, draft_probs.stride(0), draft_tokens, cu_num_draft_tokens,
            idx_mapping, seeds, temperature, positions, self.tokens, self.tokens.stride(0), self.accepted,
            self.vocab_size, OUT_WIDTH=width, OUT_P2=triton.next_power_of_2(width), BLOCK=self.block, num_warps=4)
        launch(spec_resample_partials_kernel, (num_reqs, self.num_chunks),
            target_probs, target_probs.stride(0), draft_probs, draft_probs.stride(0), cu_num_draft_tokens, idx_mapping,
            seeds, temperature, positions, self.accepted, self.partials, self.num_chunks, self.vocab_size,
            CHUNK=self.chunk, BLOCK=self.block, num_warps=4)
        launch(spec_resample_combine_kernel, (num_reqs,),
            idx_mapping, temperature, self.accepted, self.partials, self.tokens, self.tokens.stride(0), self.num_chunks,
            self.vocab_size, CHUNKS_P2=max(2, triton.next_power_of_2(self.num_chunks)))
        return SpecVerifyOutput(tokens, accepted)

    def verify_checked(self, target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                       cu_num_draft_tokens: torch.Tensor, idx_mapping: torch.Tensor, seeds: torch.Tensor,
                       temperature: torch.Tensor, positions: torch.Tensor, *, num_drafts: Sequence[int]) -> SpecVerifyOutput:
        """`check`, `check_values` (host reads), then `verify`: every error before any launch."""
        self.check(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens, idx_mapping, seeds, temperature,
                   positions, num_drafts)
        self.check_values(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens, idx_mapping, seeds, num_drafts)
        return self.verify(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens, idx_mapping, seeds,
                           temperature, positions, num_drafts=num_drafts)
