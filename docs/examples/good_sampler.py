"""A sampler written the way a user writes one, for ``runnercheck chisq --sampler good_sampler:sample``.

Plain PyTorch: temperature, then min-p, top-k and top-p (docs/SAMPLING.md, steps 3-6), then
``torch.multinomial``; temperature 0 is greedy.  It implements no penalties and says so with
``supported_params``, so cases with penalties are reported as skipped, not failed.

The contract (``runnercheck.checks.chisq.samplers.SamplerFn``): ``sample(logits, params, seeds, positions)``
gets float32 logits ``[N, V]``, ``N`` `SamplingParams`, and int64 ``[N]`` request seeds and noise
positions; it returns ``N`` integer token ids in ``[0, V)``.
"""
import torch


def _column(params, name, device, dtype=torch.float64):
    return torch.tensor([getattr(p, name) for p in params], dtype=dtype, device=device).unsqueeze(1)


def without_nan(logits):
    """NaN logits count as -inf (docs/SAMPLING.md, step 0)."""
    return logits.masked_fill(torch.isnan(logits), -float("inf"))


def keep_top_p(scores, top_p):
    """Keep the fewest highest scores whose probability reaches ``top_p`` (ties at the edge all kept)."""
    ordered = scores.sort(dim=1, descending=True).values
    mass = torch.softmax(ordered, dim=1).cumsum(dim=1)
    edge = (mass < top_p).sum(dim=1, keepdim=True).clamp(max=scores.shape[1] - 1)
    tau = ordered.gather(1, edge)
    return scores.masked_fill((top_p < 1.0) & (scores < tau), -float("inf"))


def filtered_scores(logits, params, top_p_filter=keep_top_p):
    """``logits / T`` with min-p, top-k and top-p applied (filtered tokens at -inf), in float64."""
    dev = logits.device
    temperature = _column(params, "temperature", dev)
    scores = without_nan(logits).to(torch.float64)
    scores = scores / torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    min_p = _column(params, "min_p", dev)
    floor = scores.max(dim=1, keepdim=True).values + torch.log(min_p.clamp(min=1e-300))
    scores = scores.masked_fill((min_p > 0) & (scores < floor), -float("inf"))
    vocab = scores.shape[1]
    top_k = _column(params, "top_k", dev, torch.int64)
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, torch.full_like(top_k, vocab))
    kth = scores.sort(dim=1, descending=True).values.gather(1, k - 1)
    scores = scores.masked_fill(scores < kth, -float("inf"))
    return top_p_filter(scores, _column(params, "top_p", dev))


def draw(logits, params, seeds, positions, scores):
    """One token per row: greedy at T = 0, else a multinomial draw from ``softmax(scores)``."""
    raw = without_nan(logits)
    gen = torch.Generator(device=logits.device)
    gen.manual_seed((int(seeds[0]) * 1_000_003 + int(positions[0])) % 2**63)
    probs = torch.softmax(scores, dim=1)
    unusable = ~torch.isfinite(probs).all(dim=1, keepdim=True)  # rows with +inf or only -inf: decided below
    probs = torch.where(unusable, torch.ones_like(probs), probs)
    sampled = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    greedy = torch.tensor([p.temperature == 0 for p in params], device=logits.device)
    tokens = torch.where(greedy, raw.argmax(dim=1), sampled)
    # A row holding +inf yields its first +inf token; a row of only -inf yields token 0.
    posinf = torch.isposinf(raw)
    tokens = torch.where(posinf.any(dim=1), posinf.to(torch.int8).argmax(dim=1), tokens)
    return torch.where(torch.isneginf(raw).all(dim=1), torch.zeros_like(tokens), tokens)


def sample(logits, params, seeds, positions):
    return draw(logits, params, seeds, positions, filtered_scores(logits, params))


sample.supported_params = {"temperature", "top_k", "top_p", "min_p"}
