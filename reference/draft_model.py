"""The draft-model proposer, written the obvious way (the oracle of `runnercheck.impl.draft_proposer`).

For a request with tokens ``t_0..t_{T-1}`` the proposer drafts ``k`` tokens one at a time: draft
``j`` comes from the draft model's float64 logits at the last position of ``t + d_0..d_{j-1}``
(full recompute, no KV cache), turned into ``q_j`` by the request's own pipeline
(`runnercheck.reference.sampler.distribution`: penalties with ``d_0..d_{j-1}`` counted as outputs,
temperature, filters, softmax; a point mass for greedy), and sampled by Gumbel-max over
``log q_j`` with ``DRAFT_STREAM`` noise at position ``T + j`` (`runnercheck.reference.spec_verify.resample`).
The verifier then reads the drafts and their ``q`` (docs/SAMPLING.md).

Each draft also carries a *fragile* flag: its ``q`` had a filter boundary (or greedy near-tie)
within fp32 reach, or its Gumbel-max gap was below ``TIE_TOLERANCE``: the fp32 runner may then
draft another token, and the comparison treats a difference it causes as a tie (`runnercheck.checks.compare`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from runnercheck.impl.interface import DraftModelConfig, SamplingParams
from runnercheck.impl.model.weights import ModelConfig, draft_weights
from runnercheck.reference.model import ReferenceModel
from runnercheck.reference.rng import DRAFT_STREAM
from runnercheck.reference.sampler import TIE_TOLERANCE, distribution
from runnercheck.reference.spec_verify import resample


@dataclass(frozen=True)
class DraftProposal:
    """``drafts`` (k ids), ``q`` float64 ``[k, V]`` (their distributions), ``fragile`` (k flags)."""

    drafts: tuple[int, ...]
    q: torch.Tensor
    fragile: tuple[bool, ...]


class ReferenceDraftModel:
    """The draft model in float64.  Holds only its `ReferenceModel` (weights, owned, for its lifetime)."""

    def __init__(self, config: DraftModelConfig, target: ModelConfig) -> None:
        self.config = config
        self.model = ReferenceModel(draft_weights(config.preset, config.weights_seed, target))

    def propose(self, tokens: Sequence[int], k: int, params: SamplingParams, seed: int, prompt: Sequence[int],
                outputs: Sequence[int]) -> DraftProposal:
        """The first ``k >= 1`` drafts after ``tokens`` (prompt + outputs) for a request of these params and seed."""
        sequence, drafts, rows, fragile = list(tokens), [], [], []
        for j in range(k):
            logits = self.model.logits(sequence)[-1]
            q, boundary = distribution(logits, params, prompt, list(outputs) + drafts)
            token, gap = resample(q, seed, len(tokens) + j, stream=DRAFT_STREAM)
            drafts.append(token)
            rows.append(q)
            fragile.append(boundary or gap < TIE_TOLERANCE)
            sequence.append(token)
        return DraftProposal(tuple(drafts), torch.stack(rows), tuple(fragile))


__all__ = ["DraftProposal", "ReferenceDraftModel"]
