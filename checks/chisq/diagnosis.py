"""Why a sampler failed a case: which filter binds, which tokens it drew that the convention forbids or
never drew that it allows, and which shipped convention (`runnercheck.checks.chisq.conventions`) the draws fit.

`diagnose` runs on the draws of one failed row test: the same counts are tested against every shipped
convention's exact distribution (`runnercheck.checks.chisq.stats.chisquare_test`, scipy's Pearson chi-square;
an impossible token gives p = 0) and the conventions whose p-value reaches ``FIT_ALPHA`` are said to fit.
Token ranks are 1-based by the penalised, temperature-scaled score (rank 1: the most likely token).
The result is a plain dict (JSON-ready) that the reports render (`runnercheck.checks.chisq.diagnosis_report`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from runnercheck.checks.chisq import stats
from runnercheck.checks.chisq.case import SamplingCase
from runnercheck.checks.chisq.conventions import CONVENTIONS, FILTER_FIELDS, convention_distribution, get_convention
from runnercheck.impl.interface import SAMPLING_FIELDS_BY_NAME

FIT_ALPHA = 0.01  # a convention "fits" the draws when its own test does not reject at this level
MISSING_MIN_EXPECTED = 5.0  # a never-drawn token is reported as missing when it was expected at least this often


def _ranks(case: SamplingCase, row: int) -> np.ndarray:
    """1-based rank of every token by its unfiltered score (ties by lower id)."""
    from runnercheck.reference.sampler import filtered_scores

    off = {f: SAMPLING_FIELDS_BY_NAME[f].neutral for f in FILTER_FIELDS}
    params = case.params if case.params.temperature > 0 else replace(case.params, temperature=1.0)
    s = filtered_scores(case.logits[row].to(torch.float64), replace(params, **off), case.history.prompt_ids,
                        case.history.output_ids).numpy()
    order = np.lexsort((np.arange(s.size), -s))
    ranks = np.empty(s.size, dtype=np.int64)
    ranks[order] = np.arange(1, s.size + 1)
    return ranks


def _span(ranks: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``."""
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(f"{start}" if start == r else f"{start}-{r}")
            start = None
    return ", ".join(out)


def fits(case: SamplingCase, counts: np.ndarray, row: int = 0) -> list[dict[str, Any]]:
    """Every shipped convention's p-value for these counts, best first."""
    out = []
    for name, conv in CONVENTIONS.items():
        probs = convention_distribution(case.logits[row], case.params, conv, case.history.prompt_ids, case.history.output_ids)
        result = stats.chisquare_test(counts, probs, name=f"{case.name}@{name}")
        out.append({"convention": name, "p_value": float(result.p_value), "kept": int((probs > 0).sum()),
                    "fits": bool(result.p_value >= FIT_ALPHA), "summary": conv.summary})
    return sorted(out, key=lambda f: -f["p_value"])


def diagnose(case: SamplingCase, counts: np.ndarray, expected: np.ndarray, convention: str, row: int = 0) -> dict[str, Any]:
    """The diagnosis of one failed row test (module docstring): a JSON-ready dict with a one-line ``verdict``."""
    conv = get_convention(convention)
    n = int(counts.sum())
    ranks = _ranks(case, row)
    allowed = np.flatnonzero(expected > 0)
    drawn = np.flatnonzero(counts > 0)
    impossible = sorted((int(t) for t in drawn if expected[t] == 0), key=lambda t: ranks[t])
    missing = sorted((int(t) for t in allowed if counts[t] == 0 and expected[t] * n >= MISSING_MIN_EXPECTED), key=lambda t: ranks[t])
    fit = fits(case, counts, row)
    fitting = [f for f in fit if f["fits"]]
    allowed_ranks = sorted(int(ranks[t]) for t in allowed)
    words = [f"{conv.name} keeps {allowed.size} token{'s' if allowed.size != 1 else ''} (ranks {_span(allowed_ranks)})"]
    if impossible:
        share = sum(int(counts[t]) for t in impossible) / n
        words.append(f"the sampler also drew ranks {_span(sorted(int(ranks[t]) for t in impossible))} ({share:.1%} of draws)")
    if missing:
        words.append(f"never drew ranks {_span(sorted(int(ranks[t]) for t in missing))}")
    if not impossible and not missing:
        words.append("the sampler drew the same token set with other frequencies")
    if fitting:
        best = fitting[0]
        others = [f["convention"] for f in fitting[1:]]
        words.append(f"draws fit {best['convention']}: {best['summary']} (p={best['p_value']:.3g})"
                     + (f"; also fit: {', '.join(others)}" if others else ""))
    else:
        words.append("draws fit no shipped convention (a bug, or a convention not shipped)")
    binding = list(case.binds) or ([f"{case.tie_filter} (ties)"] if case.tie_filter else [])
    residual_ids = sorted(set(allowed.tolist()) | set(drawn.tolist()), key=lambda t: (ranks[t], t))
    return {
        "convention": conv.name,
        "row": row,
        "binding_filters": binding,
        "kept_expected": int(allowed.size),
        "kept_observed": int(drawn.size),
        "impossible": [{"token": t, "rank": int(ranks[t]), "count": int(counts[t])} for t in impossible],
        "missing": [{"token": t, "rank": int(ranks[t]), "expected": float(expected[t] * n)} for t in missing],
        "fits": fit,
        "residuals": [{"token": int(t), "rank": int(ranks[t]), "observed": int(counts[t]), "expected": float(expected[t] * n)}
                      for t in residual_ids[:200]],
        "verdict": "; ".join(words),
    }


__all__ = ["FIT_ALPHA", "diagnose", "fits"]
