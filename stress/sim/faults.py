"""A logits fault hook: NaN and +Inf entries planted in sampled logit rows, from outside ``impl/``.

The rule is a pure function of the row's noise position ``p`` (the sequence index of the token
the row samples; `runnercheck.checks.compare.first_output_positions`), so the runner and the oracle apply it
identically without sharing state:

* rows with ``p >= min_position`` and ``p % modulus == nan_residue`` get a NaN at column
  ``(p * 7919 + 13) % vocab``;
* rows with ``p >= min_position`` and ``p % modulus == inf_residue`` get a +Inf there;
* with ``row_modulus`` set (0: off), whole rows are rewritten where ``p % row_modulus`` is one of
  the row residues (these take precedence over the single-entry rule above):
  ``all_nan_residue``: every entry NaN (the non-finite rule's "every entry -inf" case: token 0);
  ``neg_residue``: NaN and -Inf alternating by column (token 0 too, through the NaN -> -inf step);
  ``inf_mix_residue``: that NaN/-Inf row with +Inf at two columns (the lower index wins);
  ``tie_residue``: three more columns set to the row's maximum (never its own column), so four or more entries tie
  exactly at the top (greedy's lowest-index rule, top-k's "ties at t_k all kept", top-p's
  threshold and the top-n logprob order by lower index are all reached; bf16-quantised logits
  tie the same way).  A tie row is finite and not flagged; its logprobs are compared.

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
_TIE_STRIDE = 17  # the tied columns: c, c + 17, c + 34 (mod vocab)
ROW_KINDS = ("all-nan", "nan/-inf", "+inf/-inf", "tie")


class FaultSpecError(ValueError):
    """A ``logits_fault`` description that is not a valid `LogitsFault`."""


@dataclass(frozen=True)
class LogitsFault:
    min_position: int
    modulus: int = 7
    nan_residue: int = 3
    inf_residue: int = 5
    # Whole-row kinds (module docstring); off unless row_modulus > 0, so repros written before them replay unchanged.
    row_modulus: int = 0
    all_nan_residue: int = 0
    neg_residue: int = 1
    inf_mix_residue: int = 2
    tie_residue: int = 3

    def __post_init__(self) -> None:
        ints = (self.min_position, self.modulus, self.nan_residue, self.inf_residue, self.row_modulus,
                *self._row_residues())
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints) or self.min_position < 0 \
                or self.modulus < 2 or not 0 <= self.nan_residue < self.modulus or not 0 <= self.inf_residue < self.modulus \
                or self.nan_residue == self.inf_residue:
            raise FaultSpecError(f"invalid logits fault {self!r}")
        if self.row_modulus and (self.row_modulus < len(ROW_KINDS) or len(set(self._row_residues())) != len(ROW_KINDS)
                                 or not all(0 <= r < self.row_modulus for r in self._row_residues())):
            raise FaultSpecError(f"invalid logits fault {self!r}: row residues must be distinct and below row_modulus")
        if self.row_modulus < 0:
            raise FaultSpecError(f"invalid logits fault {self!r}: row_modulus must be >= 0")

    def _row_residues(self) -> tuple[int, int, int, int]:
        return self.all_nan_residue, self.neg_residue, self.inf_mix_residue, self.tie_residue

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
        """"nan", "inf", one of `ROW_KINDS` or None: what the rule plants in the row that samples ``position``."""
        if position < self.min_position:
            return None
        if self.row_modulus:
            rr = position % self.row_modulus
            for kind, residue in zip(ROW_KINDS, self._row_residues()):
                if rr == residue:
                    return kind
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
        row_kind = [torch.zeros_like(eligible)] * len(ROW_KINDS)
        if self.row_modulus:
            rr = pos % self.row_modulus
            row_kind = [eligible & (rr == r) for r in self._row_residues()]
            eligible = eligible & ~(row_kind[0] | row_kind[1] | row_kind[2] | row_kind[3])
        residue = pos % self.modulus
        current = logits[rows, cols]
        nan = torch.full_like(current, float("nan"))
        inf = torch.full_like(current, float("inf"))
        planted = torch.where(eligible & (residue == self.nan_residue), nan,
                              torch.where(eligible & (residue == self.inf_residue), inf, current))
        logits[rows, cols] = planted
        if self.row_modulus:
            self._apply_row_kinds(logits[:n], row_kind, rows, cols)

    @staticmethod
    def _apply_row_kinds(logits: torch.Tensor, kind: list[torch.Tensor], rows: torch.Tensor, cols: torch.Tensor) -> None:
        """The whole-row kinds, with device ops only (masks, never a host read of which rows they hit)."""
        vocab = logits.shape[-1]
        all_nan, neg, inf_mix, tie = kind
        # The tie value is read before any row is rewritten (a tie row is otherwise untouched, so finite).
        top, top_col = logits.max(dim=-1)
        tied = torch.stack([cols, (cols + _TIE_STRIDE) % vocab, (cols + 2 * _TIE_STRIDE) % vocab], dim=1)
        # A tied column on the row's own maximum would leave three ties, not four: move it one column on (the
        # three stay distinct for vocab > 2 * _TIE_STRIDE + 1, and none lands on the maximum's).
        tied = torch.where(tied == top_col[:, None], (tied + 1) % vocab, tied)
        # Filled on the device: a ``torch.tensor(value, device=cuda)`` is a pageable copy, a host sync that a
        # graph capture refuses (the faults run inside the runner's captured sample op).
        alternating = torch.full((vocab,), float("-inf"), dtype=logits.dtype, device=logits.device)
        alternating[::2] = float("nan")
        logits.copy_(torch.where(all_nan[:, None], torch.full_like(logits, float("nan")),
                                 torch.where((neg | inf_mix)[:, None], alternating.expand_as(logits), logits)))
        second = (cols + vocab // 2) % vocab
        for c in (cols, second):
            logits[rows, c] = torch.where(inf_mix, torch.full_like(top, float("inf")), logits[rows, c])
        for j in range(tied.shape[1]):
            logits[rows, tied[:, j]] = torch.where(tie, top, logits[rows, tied[:, j]])

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


__all__ = ["LogitsFault", "FaultSpecError", "ROW_KINDS"]
