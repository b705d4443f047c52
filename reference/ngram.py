"""The n-gram (prompt lookup) proposer, written the obvious way (the oracle of `runnercheck.impl.kernels.ngram`).

docs/SAMPLING.md ("N-gram proposer") is the contract: for ``n = max_n`` down to ``min_n``, the
first ``n`` whose suffix ``tokens[-n:]`` occurs earlier wins; the occurrence used is the most
recent one that ends before the last token; the drafts continue after it, repeating with the
period the match implies; with no match every draft is the last token.
"""
from __future__ import annotations

from typing import Sequence

from runnercheck.impl.interface import NgramConfig


def propose_ngram(tokens: Sequence[int], config: NgramConfig) -> tuple[int, ...]:
    """``config.num_spec_tokens`` drafts proposed from a request's tokens (prompt + outputs)."""
    tokens = list(tokens)
    total = len(tokens)
    for n in range(config.max_n, config.min_n - 1, -1):
        suffix = tokens[total - n:] if total >= n else None
        if suffix is None:
            continue
        # Candidate starts m with m + n <= total - 1: the occurrence is not the suffix itself.
        for m in range(total - n - 1, -1, -1):  # most recent first
            if tokens[m : m + n] == suffix:
                period = total - n - m
                return tuple(tokens[m + n + (r % period)] for r in range(config.num_spec_tokens))
    return tuple(tokens[-1] for _ in range(config.num_spec_tokens))


__all__ = ["propose_ngram"]
