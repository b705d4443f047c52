"""Host bookkeeping shared by the runner's device proposers (n-gram, draft model).

A proposer keeps its drafts on the device; the host only needs to know *whether* a row holds a
proposal (its request sampled since its admission), which it decides exactly from its own mirror,
and to check a step's ``num_device_drafts`` before any state changes
(`runnercheck.impl.boundary.check_device_drafts`).  The step is then planned as if the drafts were explicit,
with the placeholder -1 in the staged draft array, which the proposer's gather replaces on the device.

Ownership: ``has_proposal`` numpy bool ``[max_num_reqs]``, host, owned by the proposer object for
its lifetime; row r's request sampled since its admission.  Written only by `note_step`
(cleared at admission, set when a step samples).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from runnercheck.impl.boundary import check_device_drafts, with_device_drafts
from runnercheck.impl.interface import DraftModelConfig, NgramConfig, RunnerLimits, SchedulerOutput

PLACEHOLDER_DRAFT = -1  # a staged draft the gather kernel replaces by the proposer's


class ProposerConfigError(ValueError):
    """A proposer configuration that does not fit the runner's limits (raised at construction)."""


class DeviceDraftRows:
    """Which rows hold a proposal, and the host side of asking for device drafts (see the module docstring)."""

    def __init__(self, config: NgramConfig | DraftModelConfig, limits: RunnerLimits):
        if config.num_spec_tokens > limits.max_num_draft_tokens:
            raise ProposerConfigError(
                f"num_spec_tokens {config.num_spec_tokens} > limits.max_num_draft_tokens {limits.max_num_draft_tokens}")
        self.config = config
        self.limits = limits
        self.has_proposal = np.zeros(limits.max_num_reqs, np.bool_)

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


__all__ = ["DeviceDraftRows", "PLACEHOLDER_DRAFT", "ProposerConfigError"]
