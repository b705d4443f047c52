"""Per-row sampling distributions on the device: docs/SAMPLING.md steps 0-6, then the softmax.

Rejection sampling (`runnercheck.impl.sample.spec_verify`) needs the target's and the draft's whole
distributions, not a sampled token: `filtered_probs` turns logit rows into the probabilities the
pipeline samples from, reading each row's parameters through its state row exactly as the sampler
does (`runnercheck.impl.sample.state.SamplingState`):

0. NaN counts as -inf; a row holding +inf is a point mass on its lowest +inf entry; an all -inf
   row is a point mass on token 0;
1. penalties over the request's prompt mask and output counts plus the row's draft prefix
   (tokens counted as outputs, -1 padded);
2. temperature 0: a point mass on the penalised argmax (lowest index);
3.-6. ``s = l / T``, min-p, top-k (ties at the k-th kept), top-p (the largest ``tau`` whose kept
   mass reaches ``top_p``, ties kept); then ``softmax(s)`` over the kept entries, 0 elsewhere.

These are torch ops on the device (sorts for top-k/top-p): launches only, no host read, so it
runs inside an enqueued closure or a CUDA-graph capture.  It allocates its result and temporaries per
call (inside a capture: from the graph's memory pool, live for one replay).  fp32 throughout; the oracle's twin is
`runnercheck.reference.sampler.distribution` (float64), whose fragility report covers the fp32 boundaries.
"""
from __future__ import annotations

import torch

from runnercheck.impl.sample.state import SamplingState


def _penalised(logits: torch.Tensor, state: SamplingState, rows: torch.Tensor,
               draft_prefix: torch.Tensor | None) -> torch.Tensor:
    """Step 1 on NaN-cleaned fp32 rows (the order the sampler's kernels apply them)."""
    num_rows, vocab = logits.shape
    counts = state.output_counts.index_select(0, rows)
    if draft_prefix is not None and draft_prefix.shape[1]:
        prefix = draft_prefix[:num_rows].long()
        counts = counts.scatter_add(1, prefix.clamp(min=0), (prefix >= 0).to(counts.dtype))
    token = torch.arange(vocab, device=logits.device)
    words = state.prompt_mask.base.index_select(0, rows)
    in_prompt = ((words[:, token >> 5] >> (token & 31)) & 1) != 0
    seen = counts > 0
    rep = state.repetition_penalty.base.index_select(0, rows).unsqueeze(1)
    freq = state.frequency_penalty.base.index_select(0, rows).unsqueeze(1)
    pres = state.presence_penalty.base.index_select(0, rows).unsqueeze(1)
    l = torch.where((in_prompt | seen) & (rep != 1.0), torch.where(logits > 0, logits / rep, logits * rep), logits)
    return l - freq * counts.to(l.dtype) - pres * seen.to(l.dtype)


def _point_mass(num_rows: int, vocab: int, token: torch.Tensor, device: torch.device) -> torch.Tensor:
    out = torch.zeros((num_rows, vocab), dtype=torch.float32, device=device)
    return out.scatter(1, token.view(-1, 1), 1.0)


def filtered_probs(logits: torch.Tensor, state: SamplingState, rows_map: torch.Tensor,
                   draft_prefix: torch.Tensor | None, num_rows: int) -> torch.Tensor:
    """float32 ``[num_rows, V]``: the distribution each of the first ``num_rows`` logit rows samples from.

    ``rows_map`` int32 ``[>= num_rows]`` (state row of each logit row); ``draft_prefix`` int32
    ``[>= num_rows, D]`` (-1 padded) or None.  Device work only.
    """
    l = logits[:num_rows].float()
    vocab = l.shape[1]
    device = l.device
    rows = rows_map[:num_rows].long()
    l = torch.where(torch.isnan(l), float("-inf"), l)
    has_inf = torch.isposinf(l).any(dim=1)
    first_inf = torch.argmax(torch.isposinf(l).to(torch.int8), dim=1)
    all_neg_inf = (l == float("-inf")).all(dim=1)
    l = _penalised(l, state, rows, draft_prefix)

    temperature = state.temperature.base.index_select(0, rows)
    greedy = temperature == 0.0
    s = l / torch.where(greedy, 1.0, temperature).unsqueeze(1)
    neg_inf = float("-inf")  # a Python scalar: no host-to-device copy of a constant
    keep = s > neg_inf

    min_p = state.min_p.base.index_select(0, rows).unsqueeze(1)
    top = s.max(dim=1, keepdim=True).values
    keep &= (min_p <= 0.0) | (s >= top + torch.log(torch.where(min_p > 0.0, min_p, 1.0)))

    kept = torch.where(keep, s, neg_inf)
    ordered = torch.sort(kept, dim=1, descending=True, stable=True).values
    num_kept = keep.sum(dim=1, keepdim=True)
    top_k = state.top_k.base.index_select(0, rows).unsqueeze(1).long()
    kth = ordered.gather(1, (top_k.clamp(1, vocab) - 1))
    no_top_k = (top_k == -1) | (top_k >= num_kept)
    keep &= no_top_k | (s >= kth)

    top_p = state.top_p.base.index_select(0, rows).unsqueeze(1)
    # The kept values after top-k, sorted: top-k keeps the prefix of ``ordered`` at or above kth, so masking
    # the sorted values is the sort of the new kept row (values only: equal values are interchangeable) --
    # one full-vocabulary sort per row instead of two.
    ordered = torch.where(no_top_k | (ordered >= kth), ordered, neg_inf)
    cumulative = torch.cumsum(torch.softmax(ordered, dim=1), dim=1)
    reaching = cumulative >= top_p
    first = torch.where(reaching.any(dim=1, keepdim=True), torch.argmax(reaching.to(torch.int8), dim=1, keepdim=True),
                        keep.sum(dim=1, keepdim=True) - 1)
    first = torch.minimum(first, keep.sum(dim=1, keepdim=True) - 1).clamp(min=0)
    tau = ordered.gather(1, first)
    keep &= (top_p >= 1.0) | (s >= tau)

    probs = torch.softmax(torch.where(keep, s, neg_inf), dim=1)
    forced = torch.where(has_inf, first_inf, torch.where(greedy, torch.argmax(l, dim=1), torch.zeros_like(first_inf)))
    use_forced = (has_inf | all_neg_inf | greedy).unsqueeze(1)
    return torch.where(use_forced, _point_mass(num_rows, vocab, forced, device), probs)


__all__ = ["filtered_probs"]
