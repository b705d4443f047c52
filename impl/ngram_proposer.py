"""The runner's n-gram (prompt lookup) proposer: drafts proposed and kept on the device.

The scheduler asks for ``k`` drafts of a request (`SchedulerOutput.num_device_drafts`) without
knowing their ids; the runner's step then

1. (host) checks the counts (`impl.boundary.check_device_drafts`) and plans the step as if the
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
    has_proposal  numpy bool [max_num_reqs]  host.  Row r's request sampled since its admission.
                  Written only by `note_step` (cleared at admission, set when a step samples).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np
import torch

from impl.boundary import check_device_drafts, with_device_drafts
from impl.device import Device
from impl.hotpath import hot_path
from impl.interface import NgramConfig, RunnerLimits, SchedulerOutput
from impl.kernels.ngram import launch_gather_drafts, launch_ngram_propose

PLACEHOLDER_DRAFT = -1  # a staged draft the gather kernel replaces by the proposer's


class ProposerConfigError(ValueError):
    """A proposer configuration that does not fit the runner's limits (raised at construction)."""


class NgramProposer:
    """See the module docstring for the protocol and the ownership of every tensor."""

    def __init__(self, device: Device, config: NgramConfig, limits: RunnerLimits):
        if not isinstance(config, NgramConfig):
            raise ProposerConfigError(f"speculative must be an NgramConfig, got {type(config).__name__}")
        if config.num_spec_tokens > limits.max_num_draft_tokens:
            raise ProposerConfigError(
                f"num_spec_tokens {config.num_spec_tokens} > limits.max_num_draft_tokens {limits.max_num_draft_tokens}")
        self.device = device
        self.config = config
        self.limits = limits
        r = limits.max_num_reqs
        self.history = device.zeros((r, limits.max_model_len), torch.int32)
        self.proposed = device.zeros((r, config.num_spec_tokens), torch.int32)
        self.step_drafts = device.zeros(r * max(1, limits.max_num_draft_tokens), torch.int32)
        self.has_proposal = np.zeros(r, np.bool_)

    # ------------------------------------------------------------------ host, before any state changes
    def check(self, sched: SchedulerOutput, req_to_row: Mapping[str, int]) -> dict[str, int]:
        """The step's device-draft counts (request -> k > 0), checked; raises `DeviceDraftsError`."""
        has = self.has_proposal

        def has_proposal(rid: str) -> bool:
            row = req_to_row.get(rid)
            return row is not None and bool(has[row])

        return check_device_drafts(sched, self.limits, self.config, has_proposal)

    @staticmethod
    def placeholder_schedule(sched: SchedulerOutput, counts: Mapping[str, int]) -> SchedulerOutput:
        """``sched`` with k valid stand-in ids per device-draft request, for the boundary's array checks."""
        return with_device_drafts(sched, {rid: (0,) * k for rid, k in counts.items()})

    @staticmethod
    def mark_placeholders(plan: Any, counts: Mapping[str, int]) -> None:
        """Put `PLACEHOLDER_DRAFT` in the plan's draft slots of the device-draft requests (before staging)."""
        wanted = set(counts)
        for i, rid in enumerate(plan.req_ids):
            if rid in wanted:
                plan.drafts[plan.draft_start[i] : plan.draft_start[i + 1]] = PLACEHOLDER_DRAFT

    def note_step(self, step: Any, new_requests: Any, req_to_row: Mapping[str, int]) -> None:
        """After the step's admissions: admitted requests have no proposal; sampling requests will have one."""
        for req in new_requests:
            self.has_proposal[req_to_row[req.req_id]] = False
        samples = step.ends == step.known + step.num_drafts
        self.has_proposal[step.rows[samples]] = True

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
