"""Samplers written the way each engine's source does it (`runnercheck.checks.chisq.conventions` cites the files):
independent of the convention oracle, so a test that one passes under its convention checks the oracle too.

Every sampler fits the chi-square sampler contract (``sampler(logits, params, seeds, positions)``), works in
float64 and draws with ``torch.multinomial`` from a generator seeded by the call's first (seed, position):
draws are independent across calls because every call gets fresh positions.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from runnercheck.impl.interface import SamplingParams


def _generator(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Generator:
    return torch.Generator().manual_seed((int(seeds[0]) * 1_000_003 + int(positions[0])) % (2**63))


def _one_params(params: Sequence[SamplingParams]) -> SamplingParams:
    assert all(p == params[0] for p in params), "these test samplers take one SamplingParams per call"
    return params[0]


def _sample_probs(probs: torch.Tensor, seeds, positions) -> torch.Tensor:
    return torch.multinomial(probs, 1, generator=_generator(seeds, positions))[:, 0]


def _min_p_probability(s: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = torch.softmax(s, -1)
    return s.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), -math.inf)


def _min_p_logit(s: torch.Tensor, min_p: float) -> torch.Tensor:
    return s.masked_fill(s < s.amax(-1, keepdim=True) + math.log(min_p), -math.inf)


def _vllm_top_k_top_p(s: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """vLLM's apply_top_k_top_p: ascending sort; top-k by the k-th value; top-p by cumulative position."""
    srt, idx = s.sort(dim=-1, descending=False, stable=True)
    if k != -1 and k < s.shape[-1]:
        srt = srt.masked_fill(srt < srt[:, -k].unsqueeze(1), -math.inf)
    if p < 1.0:
        cum = torch.softmax(srt, -1).cumsum(-1)
        mask = cum <= 1 - p
        mask[:, -1] = False
        srt = srt.masked_fill(mask, -math.inf)
    return torch.empty_like(s).scatter_(-1, idx, srt)


def _vllm(min_p_rule: Callable) -> Callable:
    def sampler(logits, params, seeds, positions):
        prm = _one_params(params)
        s = logits.double() / prm.temperature
        if prm.min_p > 0:
            s = min_p_rule(s, prm.min_p)
        s = _vllm_top_k_top_p(s, prm.top_k, prm.top_p)
        return _sample_probs(torch.softmax(s, -1), seeds, positions)
    return sampler


vllm_v1_sampler = _vllm(_min_p_probability)
vllm_mrv2_sampler = _vllm(_min_p_logit)


def transformers_style_sampler(logits, params, seeds, positions):
    """generate()'s warpers: temperature, top-k (value), top-p (ascending sort, cumsum <= 1 - p), min-p last."""
    prm = _one_params(params)
    s = logits.double() / prm.temperature
    if prm.top_k != -1:
        s = s.masked_fill(s < torch.topk(s, prm.top_k)[0][..., -1, None], -math.inf)
    if prm.top_p < 1.0:
        srt, idx = torch.sort(s, dim=-1, descending=False, stable=True)
        remove = torch.softmax(srt, -1).cumsum(-1) <= 1 - prm.top_p
        remove[..., -1:] = False
        s = s.masked_fill(remove.scatter(1, idx, remove), -math.inf)
    if prm.min_p > 0:
        s = _min_p_probability(s, prm.min_p)
    return _sample_probs(torch.softmax(s, -1), seeds, positions)


def sglang_torch_sampler(logits, params, seeds, positions):
    """SGLang's top_k_top_p_min_p_sampling_from_probs_torch: joint top-p on the full sorted softmax."""
    prm = _one_params(params)
    probs = torch.softmax(logits.double() / prm.temperature, -1)
    srt, idx = probs.sort(dim=-1, descending=True, stable=True)
    cum = srt.cumsum(-1)
    k = prm.top_k if prm.top_k != -1 else probs.shape[-1]
    srt[(torch.arange(probs.shape[-1]).view(1, -1) >= k).expand_as(srt)] = 0.0
    srt[(cum - srt) > prm.top_p] = 0.0
    if prm.min_p > 0:
        srt[srt < (srt[:, 0] * prm.min_p).view(-1, 1)] = 0.0
    return idx.gather(1, _sample_probs(srt, seeds, positions).view(-1, 1))[:, 0]


def _pivot_top_k(probs: torch.Tensor, k: int) -> torch.Tensor:
    """FlashInfer-style threshold: keep probs >= the k-th largest (ties kept); zeros elsewhere."""
    if k == -1 or k >= probs.shape[-1]:
        return probs
    return probs * (probs >= torch.topk(probs, k)[0][..., -1, None])


def _pivot_top_p(probs: torch.Tensor, measured: torch.Tensor, p: float) -> torch.Tensor:
    """Keep tokens whose mass strictly above them (in ``measured``) is below ``p``; ties kept."""
    norm = measured / measured.sum(-1, keepdim=True)
    above = (norm.unsqueeze(1) * (norm.unsqueeze(1) > norm.unsqueeze(2))).sum(-1)
    return probs * (above < p)


def _flashinfer(joint: bool, min_p_first: bool) -> Callable:
    def sampler(logits, params, seeds, positions):
        prm = _one_params(params)
        s = logits.double() / prm.temperature
        if prm.min_p > 0 and min_p_first:
            s = _min_p_logit(s, prm.min_p)
        probs = torch.softmax(s, -1)
        if prm.min_p > 0 and not min_p_first:  # SGLang: top_k_renorm -> top_p_renorm -> min_p
            kept = _pivot_top_k(probs, prm.top_k)
            kept = _pivot_top_p(kept, kept, prm.top_p) if prm.top_p < 1 else kept
            kept = kept * (kept >= prm.min_p * kept.amax(-1, keepdim=True))
        else:
            kept = _pivot_top_k(probs, prm.top_k)
            if prm.top_p < 1:
                kept = _pivot_top_p(kept, probs if joint else kept, prm.top_p)
        return _sample_probs(kept, seeds, positions)
    return sampler


sglang_flashinfer_sampler = _flashinfer(joint=True, min_p_first=False)
flashinfer_top_k_first_sampler = _flashinfer(joint=False, min_p_first=True)
flashinfer_joint_sampler = _flashinfer(joint=True, min_p_first=True)

SAMPLERS = {
    "vllm-v1": vllm_v1_sampler,
    "vllm-mrv2": vllm_mrv2_sampler,
    "transformers": transformers_style_sampler,
    "sglang-torch": sglang_torch_sampler,
    "sglang-flashinfer": sglang_flashinfer_sampler,
    "flashinfer-top-k-first": flashinfer_top_k_first_sampler,
    "flashinfer-joint": flashinfer_joint_sampler,
}
