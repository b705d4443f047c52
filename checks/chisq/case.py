"""One configuration of the chi-square matrix (`SamplingCase`): the record every part of the statistics
reads -- the catalogue that builds them (`runnercheck.checks.chisq.cases`), the check of which filters
bind (`runnercheck.checks.chisq.binding`, which the catalogue uses: hence a module of its own), the runs
and the reports."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from runnercheck.checks.chisq.samplers import TokenHistory
from runnercheck.impl.interface import SAMPLING_FIELDS, SamplingParams


@dataclass(frozen=True, eq=False)
class SamplingCase:
    """One configuration of the matrix.

    ``logits`` float32 ``[rows, V]`` (rows > 1: a target row and draft rows of one request, drawn
    together).  ``tail_tokens``: the token set of the exact tail-mass test (None: no tail test).
    ``index_bins``: test on this many contiguous token-index ranges instead of per-token bins (for
    biases that act by index, e.g. tie-breaking); None: per-token bins, sparse ones pooled.
    ``tie_filter``: the case puts exact ties at this filter's threshold, so it tests the tie rule
    (keep every tied token, or cut by sort position: `runnercheck.checks.chisq.conventions`), not a move of
    the threshold; ``binds`` is then empty (a move of a threshold inside a tie changes nothing).
    """

    name: str
    group: str
    logits: torch.Tensor
    params: SamplingParams
    n_samples: int
    history: TokenHistory = TokenHistory()
    tail_tokens: range | None = None
    index_bins: int | None = None
    description: str = ""
    binds: tuple[str, ...] = ()
    tie_filter: str | None = None  # the case tests the tie rule at this filter's threshold (`binding.case_problems`)

    @property
    def rows(self) -> int:
        return self.logits.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.logits.shape[1]

    def describe(self) -> dict[str, Any]:
        p = self.params
        params = {f.name: getattr(p, f.name) for f in SAMPLING_FIELDS if getattr(p, f.name) != f.neutral}
        return {"case": self.name, "group": self.group, "vocab_size": self.vocab_size, "rows": self.rows,
                "params": params, "n_samples": self.n_samples, "prompt_len": len(self.history.prompt_ids),
                "num_outputs": len(self.history.output_ids), "binds": list(self.binds), "tie_filter": self.tie_filter, "description": self.description}


__all__ = ["SamplingCase"]
