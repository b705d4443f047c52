"""Plain PyTorch paths the benchmarks compare against (what a runner without custom kernels does)."""
from __future__ import annotations

import torch


def torch_sample_temperature(logits: torch.Tensor, temperature: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
    probs = torch.softmax(logits / temperature[:, None], dim=-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(1)


def torch_sample_top_k_top_p(logits: torch.Tensor, temperature: torch.Tensor, k: int, p: float, min_p: float = 0.0, gen: torch.Generator | None = None) -> torch.Tensor:
    """Sort-based top-k / top-p (the common PyTorch implementation), then softmax + multinomial."""
    scores = logits / temperature[:, None]
    sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
    if k > 0:
        kth = sorted_scores[:, k - 1 : k]
        sorted_scores = sorted_scores.masked_fill(sorted_scores < kth, float("-inf"))
    probs = torch.softmax(sorted_scores, dim=-1)
    if min_p > 0:
        sorted_scores = sorted_scores.masked_fill(probs < min_p * probs[:, :1], float("-inf"))
        probs = torch.softmax(sorted_scores, dim=-1)
    cum = probs.cumsum(dim=-1)
    drop = (cum - probs) >= p
    sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
    choice = torch.multinomial(torch.softmax(sorted_scores, dim=-1), 1, generator=gen)
    return order.gather(1, choice).squeeze(1)


def torch_topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Full log_softmax then topk: materialises a [rows, vocab] logprob tensor."""
    lp = torch.log_softmax(logits, dim=-1)
    return torch.topk(lp, k, dim=-1)


def torch_greedy(logits: torch.Tensor) -> torch.Tensor:
    """``torch.argmax`` over the vocabulary (first index on ties): the greedy rows' baseline."""
    return torch.argmax(logits, dim=-1)
