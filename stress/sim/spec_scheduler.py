"""Device drafts in the scheduler simulator: how many drafts of the runner's n-gram proposer to ask for.

With ``SchedulerConfig.ngram_spec_tokens = K > 0`` the runner under test holds an n-gram proposer
(`runnercheck.impl.ngram_proposer`, `runnercheck.reference.ngram`) and every decode of a request may ask for ``k <= K`` of
its drafts through ``SchedulerOutput.num_device_drafts``: the scheduler never sees the draft ids.
The step then schedules ``1 + k`` tokens; like explicit drafts, the request is not scheduled again
until that step's output says how many were accepted (``len(tokens) - 1``), and its computed count
rolls back to the accepted length.

``k`` is capped by the step's token budget and by ``max_model_len`` (the sequence may never grow
past it), but *not* by ``max_tokens`` or stop tokens: accepted drafts past either are produced by
the runner and dropped by the scheduler (``stats.dropped_tokens``), which is the case the engines
must get right.  The choice is seeded: mostly the largest ``k`` allowed, sometimes a smaller one
(0 included), so steps with and without drafts mix in one batch.

`SpecStats` counts what was asked for and accepted; ``acceptance_rate`` is reported in the run
summary and the coverage table.  Owned and written only by the simulator.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from runnercheck.impl.interface import RunnerLimits


@dataclass
class SpecStats:
    """Drafts asked of the runner's proposer and how many came back accepted (scheduler-side, host)."""

    draft_steps: int = 0  # request-steps that asked for at least one device draft
    draft_tokens: int = 0  # device drafts asked for
    accepted_tokens: int = 0  # of those, accepted (learned from the outputs)
    all_accepted_steps: int = 0
    none_accepted_steps: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    def note_output(self, asked: int, produced: int) -> None:
        accepted = max(0, min(asked, produced - 1))
        self.accepted_tokens += accepted
        self.all_accepted_steps += accepted == asked
        self.none_accepted_steps += accepted == 0

    def to_dict(self) -> dict:
        return {"draft_steps": self.draft_steps, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "all_accepted_steps": self.all_accepted_steps, "none_accepted_steps": self.none_accepted_steps,
                "acceptance_rate": self.acceptance_rate}


def device_draft_count(rng: random.Random, limits: RunnerLimits, num_spec_tokens: int, known_tokens: int, budget_left: int,
                       *, always_most: bool = False) -> int:
    """Drafts to ask for on a decode that already holds one scheduled token (``budget_left`` after it).

    ``always_most``: the largest ``k`` allowed, never a random one (a benchmark's uniform decodes)."""
    cap = min(num_spec_tokens, limits.max_num_draft_tokens, budget_left, limits.max_model_len - known_tokens)
    if cap <= 0:
        return 0
    return cap if always_most or rng.random() < 0.7 else rng.randint(0, cap)


__all__ = ["SpecStats", "device_draft_count"]
