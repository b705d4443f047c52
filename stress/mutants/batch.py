"""Batch-dependence mutants: output that depends on what else is in the batch.

Registered into the catalogue (`runnercheck.stress.mutants.registry.CATALOGUE`) when
`runnercheck.stress.mutants.catalogue` is imported.  Each patches one `runnercheck.impl.runner.ModelRunner`
instance (``target="runner"``) so that a request computes the same thing alone and something else
in a batch -- bugs real engines shipped -- and each is killed by the batch-invariance check
(`runnercheck.stress.invariance`, check ``invariance``), which compares a request's tokens and
logprobs alone and in batches bit for bit.  The differential against the oracle may miss them: a
mutant that is right alone and off by rounding in a batch stays inside the oracle's tie tolerance.

* ``sampler_path_by_batch_size`` (vLLM #50979 style): above `BATCHED_PATH_ROWS` logit rows the
  sampler takes a "batched" path that reads the logits rounded to bf16, so top-k keeps every token
  tied with the k-th after rounding and the logprobs come from the rounded logits; a row alone
  takes the exact path.
* ``noise_keyed_by_batch_slot`` (SGLang #35697 style): the Gumbel noise of a row is keyed by
  (seed, position + the row's slot in the batch) instead of (seed, position, token): alone (slot
  0) it is right, in a batch every row but the first draws other noise.
* ``norm_block_from_num_tokens`` (vLLM #48391 style): the RMSNorm's sum of squares is split into
  blocks whose count is chosen from the number of rows in the launch, so its float rounding --
  and every logit after it -- depends on num_tokens.  Observable on CPU too: fp32 partial sums
  added in another grouping round differently.

After patching, captured CUDA graphs are captured again with the bug (`recapture_graphs`).
"""
from __future__ import annotations

from typing import Any

import torch

from runnercheck.stress.mutants.graphs import recapture_graphs
from runnercheck.stress.mutants.registry import AppliedMutant, _mutant

BATCHED_PATH_ROWS = 2  # more logit rows than this take the mutant's batched sampler path

BATCH_MUTANTS = ("sampler_path_by_batch_size", "noise_keyed_by_batch_slot", "norm_block_from_num_tokens")


@_mutant("sampler_path_by_batch_size", "sampler", ("invariance",), "steady", ("sampler",),
         f"above {BATCHED_PATH_ROWS} logit rows the sampler reads bf16-rounded logits (top-k keeps the k-th's "
         "rounding ties, logprobs from the rounded values); a row alone takes the exact path")
def _sampler_path_by_batch_size(runner: Any, m: AppliedMutant) -> None:
    sampler = runner.sampler
    sample = sampler.sample

    def batched_path(logits: Any, state: Any, rows: Any, positions: Any, *, num_rows: int, draft_prefix: Any = None,
                     max_num_logprobs: int = -1, **flags: Any) -> Any:
        if num_rows > BATCHED_PATH_ROWS:
            logits = logits[:num_rows].to(torch.bfloat16).to(torch.float32)
        return sample(logits, state, rows, positions, num_rows=num_rows, draft_prefix=draft_prefix,
                      max_num_logprobs=max_num_logprobs, **flags)

    m.set(sampler, "sample", batched_path)
    recapture_graphs(runner, m)


@_mutant("noise_keyed_by_batch_slot", "sampler", ("invariance",), "steady", ("sampler",),
         "Gumbel noise keyed by (seed, position + the row's slot in the batch): right alone, other noise for "
         "every row after the first of a batch")
def _noise_keyed_by_batch_slot(runner: Any, m: AppliedMutant) -> None:
    sampler = runner.sampler
    sample = sampler.sample

    def slot_keyed(logits: Any, state: Any, rows: Any, positions: Any, *, num_rows: int, draft_prefix: Any = None,
                   max_num_logprobs: int = -1, **flags: Any) -> Any:
        if num_rows > 1:
            slots = torch.arange(num_rows, dtype=positions.dtype, device=positions.device)
            positions = positions[:num_rows] + slots
        return sample(logits, state, rows, positions, num_rows=num_rows, draft_prefix=draft_prefix,
                      max_num_logprobs=max_num_logprobs, **flags)

    m.set(sampler, "sample", slot_keyed)
    recapture_graphs(runner, m)


def split_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, blocks: int) -> torch.Tensor:
    """RMSNorm whose sum of squares is ``blocks`` fp32 partial sums added in order (the mutant's norm)."""
    xf = x.float()
    squares = (xf * xf).view(x.shape[0], blocks, -1)
    total = squares[:, 0].sum(-1)
    for b in range(1, blocks):
        total = total + squares[:, b].sum(-1)
    return (xf * torch.rsqrt(total / x.shape[-1] + eps)[:, None] * weight.float()).to(x.dtype)


def norm_blocks(num_tokens: int, hidden: int) -> int:
    """The mutant's block count: one block for a lone token, more as num_tokens grows (a divisor of hidden)."""
    wanted = 1 if num_tokens <= 1 else (2 if num_tokens <= 4 else 4)
    while hidden % wanted:
        wanted //= 2
    return max(wanted, 1)


@_mutant("norm_block_from_num_tokens", "state", ("invariance",), "steady", ("model",),
         "RMSNorm's sum of squares split into blocks whose count follows num_tokens: its rounding, and every "
         "logit after it, depends on the batch")
def _norm_block_from_num_tokens(runner: Any, m: AppliedMutant) -> None:
    model = runner.model

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return split_rms_norm(x, weight, model.eps, norm_blocks(x.shape[0], x.shape[-1]))

    m.set(model, "_rms_norm", norm)
    recapture_graphs(runner, m)


__all__ = ["BATCH_MUTANTS", "BATCHED_PATH_ROWS", "split_rms_norm", "norm_blocks"]
