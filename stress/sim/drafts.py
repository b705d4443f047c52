"""Draft tokens that get accepted: the scheduler's guesses replaced by the oracle's continuation.

The scheduler simulator guesses drafts from a request's history; with random-weight models those
guesses are almost never right, so a campaign would exercise only the "none accepted" path of
speculative decoding.  `OracleDrafts` rewrites each step's drafts (same count, so the scheduler's
bookkeeping holds) before the step is enqueued: it continues the request's sequence with the
oracle's own pipeline (`runnercheck.reference.sampler.sample` on the oracle model's logits, the request's seed
and noise positions; tokens of steps still in flight are predicted the same way), then, seeded,
keeps the whole continuation (all drafts accepted), breaks it after a random prefix (some
accepted), or breaks its first token (none accepted).

It reads the oracle's per-request state (``ReferenceRunner._requests``: tokens, prompt length,
params, seed), which is current up to the last delivered step.  The rewrite is deterministic
given the run's seed and the trace, so a replay re-creates it (``RunConfig.draft_source``).

Ownership: an `OracleDrafts` owns its RNG (host, one run).
"""
from __future__ import annotations

import dataclasses
import random
from typing import Any

from runnercheck.checks.compare import first_output_positions
from runnercheck.impl.interface import SchedulerOutput

DRAFT_SOURCES = ("random", "oracle")


class OracleDrafts:
    """``rewrite(sched) -> sched`` for `runnercheck.stress.run.driver.DifferentialRun`; see the module docstring."""

    def __init__(self, oracle: Any, seed: int, vocab_size: int):
        self.oracle = oracle
        self.rng = random.Random(seed ^ 0x5D2AF7)
        self.vocab_size = vocab_size

    def __call__(self, sched: SchedulerOutput) -> SchedulerOutput:
        if not sched.draft_token_ids:
            return sched
        first = first_output_positions(sched)
        drafts = {rid: self._drafts(rid, first.get(rid), guessed) for rid, guessed in sched.draft_token_ids.items()}
        return dataclasses.replace(sched, draft_token_ids=drafts)

    def _drafts(self, rid: str, first_position: int | None, guessed: tuple[int, ...]) -> tuple[int, ...]:
        from runnercheck.reference.sampler import sample

        state = getattr(self.oracle, "_requests", {}).get(rid)
        if state is None or first_position is None:
            return guessed
        k = len(guessed)
        seq = list(state.tokens)
        if len(seq) > first_position:
            return guessed  # the oracle is ahead of this step (cannot happen in the driver's order)
        while len(seq) < first_position + k:
            row = self.oracle.model.logits(seq)[-1]
            seq.append(sample(row, state.params, state.seed, len(seq), seq[: state.prompt_len],
                              seq[state.prompt_len:]).token)
        continuation = seq[first_position: first_position + k]
        mode = self.rng.randrange(3)
        if mode == 0:
            return tuple(continuation)
        cut = self.rng.randrange(1, k) if mode == 1 and k > 1 else 0
        continuation[cut] = (continuation[cut] + 1 + self.rng.randrange(self.vocab_size - 1)) % self.vocab_size
        return tuple(continuation)


__all__ = ["OracleDrafts", "DRAFT_SOURCES"]
