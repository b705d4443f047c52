"""A logits fault hook: NaN and +Inf entries planted in sampled logit rows, from outside ``impl/``.

The rule is a pure function of the row's noise position ``p`` (the sequence index of the token
the row samples; `runnercheck.checks.compare.first_output_positions`), so the runner and the oracle apply it
identically without sharing state:

* rows with ``p >= min_position`` and ``p % modulus == nan_residue`` get a NaN at column
  ``(p * 7919 + 13) % vocab``;
* rows with ``p >= min_position`` and ``p % modulus == inf_residue`` get a +Inf there.

``min_position`` is at least the longest prompt that asks for prompt logprobs (`runnercheck.stress.sim.churn`
asks only for prompts of at most ``max_prompt_len`` tokens; a conversation's or system prompt's
longer prompt does not), so the rule never touches a row whose logits feed prompt logprobs (those
predict positions inside the prompt); it only touches rows that are sampled (or computed and
discarded).  What the sampler must then do is the NaN rule
of docs/SAMPLING.md: NaN counts as -inf, the first +Inf wins, and the request's ``nan_flags``
entry is set; the oracle's pipeline follows the same rule, so the differential compares it.

Installation patches instances only: the runner's ``sampler.sample`` (device ops on the logits
and the positions tensor it is handed -- no host read) and the oracle's ``model.logits`` (float64
rows, row ``i`` predicting position ``i + 1``).  A runner without an ``runnercheck.impl.sample.Sampler`` at
``runner.sampler`` cannot take the hook; `install` reports that and the campaign notes it.  A
runner with a CUDA-graph manager captures its graphs again after the hook is in place (a graph
captured before it would replay the sampler without the faults: found on the H200, where both
delayed verify runs diverged on ``nan_flag``).

The fault is part of the run configuration (``RunConfig.logits_fault``, a repro field), so a
replay plants the same faults.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

_COLUMN_MUL, _COLUMN_ADD = 7919, 13


class FaultSpecError(ValueError):
    """A ``logits_fault`` description that is not a valid `LogitsFault`."""


@dataclass(frozen=True)
class LogitsFault:
    min_position: int
    modulus: int = 7
    nan_residue: int = 3
    inf_residue: int = 5

    def __post_init__(self) -> None:
        ints = (self.min_position, self.modulus, self.nan_residue, self.inf_residue)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints) or self.min_position < 0 \
                or self.modulus < 2 or not 0 <= self.nan_residue < self.modulus or not 0 <= self.inf_residue < self.modulus \
                or self.nan_residue == self.inf_residue:
            raise FaultSpecError(f"invalid logits fault {self!r}")

    @classmethod
    def from_dict(cls, d: Any) -> "LogitsFault":
        if not isinstance(d, dict) or d.get("name") != "nan-inf-rows":
            raise FaultSpecError(f"unknown logits fault {d!r}")
        try:
            return cls(**{k: v for k, v in d.items() if k != "name"})
        except TypeError as e:
            raise FaultSpecError(f"logits fault {d!r}: {e}") from None

    def describe(self) -> dict:
        return {"name": "nan-inf-rows", **asdict(self)}

    def kind_at(self, position: int) -> str | None:
        """"nan", "inf" or None: what the rule plants in the row that samples ``position``."""
        if position < self.min_position:
            return None
        r = position % self.modulus
        return "nan" if r == self.nan_residue else "inf" if r == self.inf_residue else None

    # ------------------------------------------------------------------ applying the rule
    def apply_rows(self, logits: torch.Tensor, positions: torch.Tensor) -> None:
        """Plant the faults in ``logits[i]`` for noise positions ``positions[i]`` (in place, device ops only)."""
        n, vocab = positions.shape[0], logits.shape[-1]
        if n == 0:
            return
        pos = positions.to(torch.int64)
        rows = torch.arange(n, device=logits.device)
        cols = (pos * _COLUMN_MUL + _COLUMN_ADD) % vocab
        eligible = pos >= self.min_position
        residue = pos % self.modulus
        current = logits[rows, cols]
        nan = torch.full_like(current, float("nan"))
        inf = torch.full_like(current, float("inf"))
        planted = torch.where(eligible & (residue == self.nan_residue), nan,
                              torch.where(eligible & (residue == self.inf_residue), inf, current))
        logits[rows, cols] = planted

    def install(self, runner: Any, oracle: Any) -> bool:
        """Hook the runner's sampler and the oracle's model; False (nothing patched) when the runner has no sampler."""
        sampler = getattr(runner, "sampler", None)
        if sampler is None or not callable(getattr(sampler, "sample", None)) or not hasattr(oracle, "model"):
            return False
        fault = self
        original_sample = sampler.sample

        def sample(logits: torch.Tensor, state: Any, rows: torch.Tensor, positions: torch.Tensor, *, num_rows: int,
                   **kwargs: Any) -> Any:
            fault.apply_rows(logits[:num_rows], positions[:num_rows])
            return original_sample(logits, state, rows, positions, num_rows=num_rows, **kwargs)

        sampler.sample = sample
        model = oracle.model
        original_logits = model.logits

        def logits(token_ids: Any) -> torch.Tensor:
            out = original_logits(token_ids).clone()
            fault.apply_rows(out, torch.arange(1, out.shape[0] + 1, dtype=torch.int64))
            return out

        model.logits = logits
        graphs = getattr(runner, "graphs", None)
        if graphs is not None and callable(getattr(graphs, "recapture", None)):
            graphs.recapture()  # graphs captured before the hook would replay unfaulted logits
        return True


__all__ = ["LogitsFault", "FaultSpecError"]
