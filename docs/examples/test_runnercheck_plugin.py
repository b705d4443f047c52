"""An example of runnercheck's pytest plugin in another project's suite (docs/PLUGIN.md).

Run it from any directory once runnercheck is installed, with the Python that has it installed:
``python -m pytest --junitxml=junit.xml test_runnercheck_plugin.py``.
"""

import torch


def my_sampler(logits, params, seeds, positions):
    """A user's sampler: top-k, then softmax(logits / T) and torch.multinomial; T = 0 is greedy."""
    temperature = torch.tensor([p.temperature for p in params], device=logits.device).unsqueeze(1)
    top_k = torch.tensor([p.top_k if p.top_k > 0 else logits.shape[1] for p in params], device=logits.device).unsqueeze(1)
    kth = logits.sort(dim=1, descending=True).values.gather(1, top_k - 1)
    logits = logits.masked_fill(logits < kth, -float("inf"))
    gen = torch.Generator(logits.device).manual_seed((int(seeds[0]) ^ int(positions[0])) & (2**63 - 1))
    probs = torch.softmax(logits / temperature.clamp(min=1e-6), dim=1)
    sampled = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    return torch.where(temperature.squeeze(1) == 0, logits.argmax(dim=1), sampled)


my_sampler.supported_params = {"temperature", "top_k"}


def test_builtin_runner_matches_the_oracle(runnercheck_differential):
    runnercheck_differential(steps=12)


def test_my_sampler_by_chi_square(runnercheck_chisq):
    runnercheck_chisq(my_sampler, cases=["temperature-0.5-v97", "greedy-v97", "top-k-10-v97", "top-p-v97"], samples=4000)
