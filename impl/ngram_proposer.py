"""The runner's n-gram (prompt lookup) proposer: drafts proposed and kept on the device.

The scheduler asks for ``k`` drafts of a request (`SchedulerOutput.num_device_drafts`) without
knowing their ids; the runner's step then

1. (host) checks the counts (`runnercheck.impl.boundary.check_device_drafts`) and plans the step as if the
   drafts were explicit, with the placeholder -1 in the staged draft array (`mark_placeholders`);
2. (device, before input prep) gathers the ids from `proposed` into `step_drafts`
   (`enqueue_gather`); input prep, the sampler's draft prefixes, the padded-step copy and the
   post-update kernel read `step_drafts`, so verification is the exact-match rule of
   docs/SAMPLING.md ("Speculative rows");
3. (device, after post-update) appends each sampling request's accepted tokens to its history and
   proposes its next drafts (`enqueue_propose`).

The accepted count stays on the device (``num_sampled``, row state); the host learns it only from
the step's output like every other token.  Whether a request has a proposal (it sampled since its
admission) is known exactly on the host: a step samples for a request when its scheduled tokens
reach the end of what is known, which the host mirror decides without device data.

Ownership (all owned by this object, allocated at init, for the runner's lifetime):

    history       int32 [max_num_reqs, max_model_len]  device.  Row r, positions [PREFILL_LEN, NUM_TOKENS):
                  the outputs of row r's request since its admission (the prefill stays in the
                  state table's pinned ``prefill_tokens``); other entries are stale and never read.
                  Written only by the propose kernel; read by it.
    proposed      int32 [max_num_reqs, num_spec_tokens]  device.  Row r: the drafts proposed after
                  row r's request last sampled.  Written only by the propose kernel; read by the
                  gather kernel of a later step.
    step_drafts   int32 [max_num_reqs * max(1, max_num_draft_tokens)]  device, contents valid for
                  one step.  Written only by the gather kernel; read by that step's input prep,
                  padded-step copy and post-update (stream order keeps steps apart).
    has_proposal  host bookkeeping of `runnercheck.impl.device_drafts.DeviceDraftRows` (its docstring).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from runnercheck.impl.device import Device
from runnercheck.impl.device_drafts import PLACEHOLDER_DRAFT, DeviceDraftRows, ProposerConfigError
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.interface import NgramConfig, RunnerLimits
from runnercheck.impl.kernels.ngram import launch_gather_drafts, launch_ngram_propose


class NgramProposer(DeviceDraftRows):
    """See the module docstring for the protocol and the ownership of every tensor."""

    def __init__(self, device: Device, config: NgramConfig, limits: RunnerLimits):
        if not isinstance(config, NgramConfig):
            raise ProposerConfigError(f"speculative must be an NgramConfig, got {type(config).__name__}")
        super().__init__(config, limits)
        self.device = device
        r = limits.max_num_reqs
        self.history = device.zeros((r, limits.max_model_len), torch.int32)
        self.proposed = device.zeros((r, config.num_spec_tokens), torch.int32)
        self.step_drafts = device.zeros(r * max(1, limits.max_num_draft_tokens), torch.int32)

    # ------------------------------------------------------------------ device work
    @hot_path
    def enqueue_gather(self, staged: Any, num_reqs: int, out: torch.Tensor | None = None) -> Any:
        """Enqueue the gather of the step's device drafts; returns ``staged`` reading `step_drafts` instead.

        ``out``: gather into this buffer instead (a bucketed step's graph step buffer, same layout as the
        staged drafts), which the caller owns."""
        rows, draft_start, staged_drafts = staged.rows, staged.draft_start, staged.drafts
        proposed, max_drafts = self.proposed, self.limits.max_num_draft_tokens
        out = self.step_drafts if out is None else out

        def gather() -> None:
            launch_gather_drafts(rows=rows, draft_start=draft_start, staged_drafts=staged_drafts, proposed=proposed,
                                 out=out, num_reqs=num_reqs, max_drafts=max_drafts)

        self.device.enqueue(gather, "gather device drafts")
        return dataclasses.replace(staged, drafts=out)

    @hot_path
    def enqueue_propose(self, staged: Any, num_reqs: int, num_sampled: torch.Tensor, sampled: torch.Tensor,
                        row_state: torch.Tensor, prefill_tokens: torch.Tensor) -> None:
        """Enqueue the append + propose kernel for the step's sampling requests (after post-update)."""
        rows, logits_start = staged.rows, staged.logits_start
        cfg, history, proposed = self.config, self.history, self.proposed
        max_sampled = 1 + self.limits.max_num_draft_tokens

        def propose() -> None:
            launch_ngram_propose(rows=rows, logits_start=logits_start, num_sampled=num_sampled, sampled=sampled,
                                 row_state=row_state, prefill_tokens=prefill_tokens, history=history, proposed=proposed,
                                 num_reqs=num_reqs, min_n=cfg.min_n, max_n=cfg.max_n, num_spec_tokens=cfg.num_spec_tokens,
                                 max_sampled=max_sampled)

        self.device.enqueue(propose, "ngram propose")


__all__ = ["NgramProposer", "PLACEHOLDER_DRAFT", "ProposerConfigError"]
