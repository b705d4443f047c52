"""Hugging Face transformers' own warpers as a chi-square sampler:
``runnercheck chisq --quick --sampler docs/examples/transformers_sampler.py:sample --convention transformers``.

The pipeline is the one ``generate()`` builds (transformers ``generation/utils.py``, ``_get_logits_processor``):
``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``, ``MinPLogitsWarper`` in that order, in a
``LogitsProcessorList``, then ``torch.multinomial`` on the softmax, one generator per row seeded from the row's
(seed, position) so every draw is independent and a rerun repeats it.  Temperature 0 is greedy (argmax).

transformers is an optional extra (``pip install runnercheck[transformers]``); nothing in runnercheck imports it.
Under the contract (docs/SAMPLING.md) this sampler fails the cases where min-p is on and top-p binds: generate()
measures top-p's mass before min-p removes tokens.  That is transformers' documented order, not a bug; the
convention ``transformers`` (docs/CHISQ.md, Conventions) expects it.  The warpers have no repetition/frequency/
presence penalties in runnercheck's sense, so the adapter takes no ``history`` and penalty cases are skipped.
"""
import torch
from transformers import LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

_MIX = 0x9E3779B97F4A7C15


def warpers(params):
    """generate()'s warper list for one row's `SamplingParams` (only the filters that are on)."""
    out = LogitsProcessorList()
    if params.temperature != 1.0:
        out.append(TemperatureLogitsWarper(float(params.temperature)))
    if params.top_k != -1:
        out.append(TopKLogitsWarper(top_k=int(params.top_k)))
    if params.top_p < 1.0:
        out.append(TopPLogitsWarper(top_p=float(params.top_p)))
    if params.min_p > 0.0:
        out.append(MinPLogitsWarper(min_p=float(params.min_p)))
    return out


def sample(logits, params, seeds, positions):
    scores = logits.float().masked_fill(torch.isnan(logits), -float("inf"))
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    groups = {}
    for i, p in enumerate(params):
        groups.setdefault(p, []).append(i)
    for p, rows in groups.items():
        index = torch.tensor(rows)
        if p.temperature == 0:
            out[index] = scores[index].argmax(dim=1).cpu()
            continue
        probs = torch.softmax(warpers(p)(None, scores[index].clone()), dim=-1).cpu()
        for r, row in zip(rows, probs):
            key = (int(seeds[r]) * _MIX + int(positions[r])) % (2**63)
            out[r] = torch.multinomial(row, 1, generator=torch.Generator().manual_seed(key))[0]
    return out.to(logits.device)
