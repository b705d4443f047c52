"""good_sampler.py with one planted bug that ``runnercheck chisq`` must catch: top-p off by one.

The top-p filter keeps the tokens whose cumulative probability stays below ``top_p`` and drops the
one that reaches it, where the contract (docs/SAMPLING.md, step 6) keeps the fewest tokens whose
probability reaches ``top_p``: the kept set is one token short.  A case with a binding top-p fails
its chi-square test.
"""
import torch

from good_sampler import draw, filtered_scores


def keep_top_p_one_short(scores, top_p):
    ordered = scores.sort(dim=1, descending=True).values
    mass = torch.softmax(ordered, dim=1).cumsum(dim=1)
    edge = ((mass < top_p).sum(dim=1, keepdim=True) - 1).clamp(min=0)  # the bug: one token short
    tau = ordered.gather(1, edge)
    return scores.masked_fill((top_p < 1.0) & (scores < tau), -float("inf"))


def sample(logits, params, seeds, positions):
    return draw(logits, params, seeds, positions, filtered_scores(logits, params, keep_top_p_one_short))


sample.supported_params = {"temperature", "top_k", "top_p", "min_p"}
