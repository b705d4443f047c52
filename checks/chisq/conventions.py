"""Sampling conventions as data: how an engine orders and measures its filters, and the float64 oracle under one.

docs/SAMPLING.md (the *contract*) applies temperature, then min-p, top-k and top-p, with top-p's mass
renormalised over the tokens min-p and top-k kept and every tie at a threshold kept.  Real engines
differ in documented, deliberate ways; a chi-square failure against the contract is then a
convention, not a bug.  A `Convention` states what can differ:

* ``order``: the threshold filters (the interface table's ``stage == "filter"`` rows) in the order applied.
  Top-k (by rank) and min-p (a ratio to the top token, which every filter keeps) give the same mask
  in any order; what the order changes is the set top-p measures its mass over.
* ``top_p_mass``: ``"kept"`` (renormalised over the tokens the filters before it kept) or ``"full"``
  (the *joint* rule: cumulative mass of the full softmax, whatever top-k/min-p removed).
  ``top_p_mass_with_min_p`` overrides it on rows with min-p on (SGLang's FlashInfer path switches).
* ``top_k_ties`` / ``top_p_ties``: ``"keep"`` (every token tied with the threshold token stays) or a
  sort-position rule, ``"lower-id-first"`` / ``"higher-id-first"`` (the tied tokens a sort places first
  are kept).  A real engine's ``torch.sort`` is not stable on CUDA: the rule models a stable sort.
* ``min_p_space``: ``"probability"`` (``p_i >= min_p * p_max``) or ``"logit"`` (``s_i >= s_max + log min_p``):
  the same set in exact arithmetic, recorded because engines differ in it and fp32 rounding at the boundary does.
* ``min_p_scores``: ``"scaled"`` (after temperature, every shipped engine) or ``"unscaled"`` (before it).

Temperature applies to the penalised logits before every filter in all shipped profiles (the
contract's step 3); penalties are the contract's.  The oracle (`convention_distribution`) is slow and
obvious on purpose: one row, float64, each filter a mask written out.  Under `CONTRACT` it equals
`runnercheck.reference.sampler.expected_distribution` (tests/checks/test_chisq_conventions.py checks
the whole quick catalogue).  Each profile cites the source file and version it was read from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np
import torch

from runnercheck.impl.interface import SAMPLING_FIELDS, SAMPLING_FIELDS_BY_NAME, SamplingParams

# The threshold filters and their "off" values come from the interface's one table of sampling fields.
FILTER_FIELDS: tuple[str, ...] = tuple(f.name for f in SAMPLING_FIELDS if f.stage == "filter")
MASS_RULES = ("kept", "full")
TIE_RULES = ("keep", "lower-id-first", "higher-id-first")
MIN_P_SPACES = ("probability", "logit")
MIN_P_SCORES = ("scaled", "unscaled")


class ConventionError(ValueError):
    """An unknown convention name, or a convention whose fields are not one of the allowed values."""


@dataclass(frozen=True)
class Convention:
    """One engine's sampling convention (module docstring); ``summary`` says how it differs from the contract."""

    name: str
    title: str
    order: tuple[str, ...]
    top_p_mass: str = "kept"
    top_p_mass_with_min_p: str | None = None
    top_k_ties: str = "keep"
    top_p_ties: str = "keep"
    min_p_space: str = "probability"
    min_p_scores: str = "scaled"
    summary: str = ""
    citation: str = ""

    def __post_init__(self) -> None:
        if sorted(self.order) != sorted(FILTER_FIELDS):
            raise ConventionError(f"{self.name}: order {self.order} must list each filter of the interface table "
                                  f"once ({', '.join(FILTER_FIELDS)})")
        for field, value, allowed in (("top_p_mass", self.top_p_mass, MASS_RULES),
                                      ("top_p_mass_with_min_p", self.top_p_mass_with_min_p or "kept", MASS_RULES),
                                      ("top_k_ties", self.top_k_ties, TIE_RULES), ("top_p_ties", self.top_p_ties, TIE_RULES),
                                      ("min_p_space", self.min_p_space, MIN_P_SPACES),
                                      ("min_p_scores", self.min_p_scores, MIN_P_SCORES)):
            if value not in allowed:
                raise ConventionError(f"{self.name}: {field} = {value!r}, allowed: {', '.join(allowed)}")

    def mass_rule(self, params: SamplingParams) -> str:
        """Top-p's mass rule for a row with these params (the min-p override applies when min-p is on)."""
        if self.top_p_mass_with_min_p is not None and _on(params, "min_p"):
            return self.top_p_mass_with_min_p
        return self.top_p_mass

    def order_text(self) -> str:
        return " -> ".join(["temperature", *(SAMPLING_FIELDS_BY_NAME[f].label for f in self.order)])

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "title": self.title, "order": self.order_text(), "top_p_mass": self.top_p_mass,
                "top_p_mass_with_min_p": self.top_p_mass_with_min_p, "top_k_ties": self.top_k_ties,
                "top_p_ties": self.top_p_ties, "min_p_space": self.min_p_space, "min_p_scores": self.min_p_scores,
                "summary": self.summary, "citation": self.citation}


def _order(text: str) -> tuple[str, ...]:
    """``"min_p -> top_k -> top_p"`` -> the filters in that order (checked against the table by `Convention`)."""
    return tuple(part.strip() for part in text.split("->"))


def _on(params: SamplingParams, name: str) -> bool:
    return getattr(params, name) != SAMPLING_FIELDS_BY_NAME[name].neutral


# --------------------------------------------------------------------------- the shipped profiles

CONTRACT = Convention(
    "contract", "docs/SAMPLING.md (the default)", _order("min_p -> top_k -> top_p"),
    summary="min-p, top-k, then top-p over the kept tokens renormalised; ties at thresholds kept",
    citation="docs/SAMPLING.md, pipeline steps 3-6 (this repository)")

CONVENTIONS: Mapping[str, Convention] = {c.name: c for c in (
    CONTRACT,
    Convention(
        "vllm-v1", "vLLM V1 sampler (PyTorch top-k/top-p path)", _order("min_p -> top_k -> top_p"), top_p_ties="higher-id-first",
        summary="the contract's order and mass; top-p ties cut by ascending-sort position (tied tokens with "
                "lower ids dropped first), top-k ties kept",
        citation="vllm-project/vllm vllm/v1/sample/sampler.py (temperature, min_p logits processor, then top_k/top_p) and "
                 "vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p (ascending sort; top-k: logits_sort < k-th "
                 "value masked; top-p: cumsum <= 1 - p masked by position), main branch as stored in the search index, 2026-12"),
    Convention(
        "vllm-mrv2", "vLLM Model Runner V2 sampler", _order("min_p -> top_k -> top_p"), top_p_ties="higher-id-first",
        min_p_space="logit",
        summary="as vllm-v1, with min-p compared in logit space (logit >= max + log min_p): the same set in exact arithmetic",
        citation="vllm-project/vllm vllm/v1/worker/gpu/sample/sampler.py @ b9928aee (penalties, temperature, apply_min_p, "
                 "apply_top_k_top_p, gumbel_sample) and vllm/v1/worker/gpu/sample/min_p.py @ ff583b3c "
                 "(threshold = max + log(min_p))"),
    Convention(
        "transformers", "Hugging Face transformers generate()", _order("top_k -> top_p -> min_p"), top_p_ties="higher-id-first",
        summary="top-p measured before min-p (generate() order temperature -> top-k -> top-p -> min-p): top-p's mass "
                "is renormalised over top-k's tokens only",
        citation="huggingface/transformers src/transformers/generation/utils.py _get_logits_processor (Temperature, TopK, "
                 "TopP, MinP warpers appended in that order) and generation/logits_process.py (TopPLogitsWarper: ascending "
                 "sort, cumsum <= 1 - top_p removed; MinPLogitsWarper: probs < min_p * top prob removed), 5.25.0 "
                 "(the same order in the 4.x source of the search index)"),
    Convention(
        "sglang-torch", "SGLang sampler, PyTorch backend (top_k_top_p_min_p_sampling_from_probs_torch)",
        _order("top_k -> top_p -> min_p"), top_p_mass="full", top_k_ties="lower-id-first", top_p_ties="lower-id-first",
        summary="joint top-p: mass measured over the full softmax (not renormalised after top-k or min-p); top-k by "
                "sort position",
        citation="sgl-project/sglang python/sglang/srt/layers/sampler.py top_k_top_p_min_p_sampling_from_probs_torch "
                 "(probs sorted descending; probs_sum = cumsum of the full sorted probs; positions >= top_k zeroed; "
                 "(probs_sum - probs_sort) > top_p zeroed; min-p against probs_sort[:, 0]), main 2025"),
    Convention(
        "sglang-flashinfer", "SGLang sampler, FlashInfer backend", _order("top_k -> top_p -> min_p"), top_p_mass="full",
        top_p_mass_with_min_p="kept",
        summary="joint top-p (filter_apply_order='joint') without min-p; with min-p on, top_k_renorm_prob -> "
                "top_p_renorm_prob -> min_p_sampling_from_probs: top-p measured before min-p",
        citation="sgl-project/sglang python/sglang/srt/layers/sampler.py (flashinfer branch: need_min_p_sampling -> "
                 "top_k_renorm_prob, top_p_renorm_prob, min_p_sampling_from_probs; else top_k_top_p_sampling_from_probs("
                 "filter_apply_order='joint')), main 2025"),
    Convention(
        "flashinfer-top-k-first", "FlashInfer top_k_top_p_sampling_from_*(filter_apply_order='top_k_first')",
        _order("min_p -> top_k -> top_p"),
        summary="top-k, then top-p renormalised over top-k's tokens (min-p, not part of the call, applied before as vLLM "
                "does): the contract's distribution",
        citation="flashinfer-ai/flashinfer flashinfer/sampling.py top_k_top_p_sampling_from_probs / _from_logits "
                 "(filter_apply_order default 'top_k_first': top_k_renorm_probs then top_p_sampling), v0.2.x"),
    Convention(
        "flashinfer-joint", "FlashInfer top_k_top_p_sampling_from_*(filter_apply_order='joint')",
        _order("min_p -> top_p -> top_k"),
        summary="joint top-p: top-k and top-p both judged on the distribution handed to the call (top-p measured "
                "before top-k, not renormalised after it); min-p, not part of the call, applied before as vLLM does",
        citation="flashinfer-ai/flashinfer flashinfer/sampling.py top_k_top_p_sampling_from_probs "
                 "(filter_apply_order='joint': 'apply top-k and top-p filter jointly' on the unfiltered probs), v0.2.x"),
)}


def get_convention(name: str | Convention) -> Convention:
    """The shipped convention of this name (a `Convention` passes through); `ConventionError` lists the names."""
    if isinstance(name, Convention):
        return name
    try:
        return CONVENTIONS[name]
    except KeyError:
        raise ConventionError(f"unknown convention {name!r}; known: {', '.join(CONVENTIONS)}") from None


# --------------------------------------------------------------------------- the oracle under a convention


def _order_key(scores: np.ndarray, idx: np.ndarray, ties: str) -> np.ndarray:
    """``idx`` sorted by descending score, ties broken by the rule (``keep`` breaks them by id; callers treat them as one)."""
    ids = idx if ties != "higher-id-first" else -idx
    return idx[np.lexsort((ids, -scores[idx]))]


def _top_k(s: np.ndarray, keep: np.ndarray, k: int, ties: str) -> np.ndarray:
    idx = np.flatnonzero(keep)
    if k >= idx.size:
        return keep
    ordered = _order_key(s, idx, ties)
    out = np.zeros_like(keep)
    if ties == "keep":
        out[idx[s[idx] >= s[ordered[k - 1]]]] = True
    else:
        out[ordered[:k]] = True
    return out


def _top_p(s: np.ndarray, keep: np.ndarray, finite: np.ndarray, top_p: float, mass: str, ties: str) -> np.ndarray:
    """Keep a token when the mass ranked above it (strictly higher score for ``keep`` ties, earlier in the sort
    otherwise) is below ``top_p``: the first token whose cumulative mass reaches ``top_p`` is the last kept."""
    measured = np.flatnonzero(keep if mass == "kept" else finite)
    w = np.exp(s[measured] - s[measured].max())
    probs = dict(zip(measured.tolist(), (w / w.sum()).tolist()))
    ordered = _order_key(s, measured, ties)
    out = keep.copy()
    above, i = 0.0, 0
    while i < ordered.size:
        j = i + 1
        if ties == "keep":  # a run of equal scores shares the mass strictly above it
            while j < ordered.size and s[ordered[j]] == s[ordered[i]]:
                j += 1
        group = ordered[i:j]
        if above >= top_p:
            out[group] = False
        above += sum(probs[int(t)] for t in group)
        i = j
    return out & keep


def _min_p(s: np.ndarray, unscaled: np.ndarray, keep: np.ndarray, min_p: float, convention: Convention) -> np.ndarray:
    scores = s if convention.min_p_scores == "scaled" else unscaled
    top = scores[keep].max()
    if convention.min_p_space == "logit":
        return keep & (scores >= top + math.log(min_p))
    probs = np.exp(scores - top)  # ratio to the top token's probability: the normaliser cancels
    return keep & (probs >= min_p)


def convention_distribution(logits: torch.Tensor, params: SamplingParams, convention: str | Convention = CONTRACT,
                            prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = ()) -> np.ndarray:
    """float64 ``[V]``: the exact distribution of one row's sampled token under ``convention``.

    Penalties, temperature, greedy and the non-finite rule are the contract's
    (`runnercheck.reference.sampler`); only the filters follow the convention.
    """
    from runnercheck.reference.sampler import expected_distribution, filtered_scores

    convention = get_convention(convention)
    row = logits.detach().to(device="cpu", dtype=torch.float64)
    if params.temperature == 0 or bool(torch.isposinf(row).any()) or not bool(torch.isfinite(row).any()):
        return expected_distribution(row, params, prompt_ids, output_ids).numpy()
    off = {f: SAMPLING_FIELDS_BY_NAME[f].neutral for f in FILTER_FIELDS}
    s = filtered_scores(row, replace(params, **off), prompt_ids, output_ids).numpy()
    unscaled = s * float(params.temperature)
    finite = np.isfinite(s)
    keep = finite.copy()
    for name in convention.order:
        if not _on(params, name):
            continue
        if name == "min_p":
            keep = _min_p(s, unscaled, keep, float(params.min_p), convention)
        elif name == "top_k":
            keep = _top_k(s, keep, int(params.top_k), convention.top_k_ties)
        elif name == "top_p":
            keep = _top_p(s, keep, finite, float(params.top_p), convention.mass_rule(params), convention.top_p_ties)
        else:  # a new filter row in the interface table needs its rule here before any convention can order it
            raise ConventionError(f"no oracle rule for filter {name!r}")
    w = np.where(keep, np.exp(np.where(keep, s, -np.inf) - s[keep].max()), 0.0)
    return w / w.sum()


__all__ = ["CONTRACT", "CONVENTIONS", "Convention", "ConventionError", "FILTER_FIELDS", "convention_distribution",
           "get_convention"]
