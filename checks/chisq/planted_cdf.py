"""Inverse-CDF samplers with coarse arithmetic: the planted biases a Gumbel-max variant cannot express.

`InverseCdfSampler` takes the contract's exact distribution (docs/SAMPLING.md, the float64 oracle's
`expected_distribution`), then draws ``token = first i with cumsum(p)_i > u``.  Two knobs:

* ``probs="fp16"``: the probabilities are stored in fp16 before the cumulative sum (a kernel that keeps its
  softmax in half precision).  fp16's subnormal spacing is 2^-24 (6e-8): a token of probability 1.25 * 2^-24
  is stored as 2^-24, 20% too little, and every token below 2^-25 is never drawn.
* ``uniform_bits=16``: ``u`` takes 2^16 values (a kernel that splits one 32-bit random word in two).  A token
  is drawn with probability (grid points in its CDF interval) / 2^16: one of probability 2.5 / 2^16 gets 2 or 3
  points, 20% off either way, and one below 2^-16 is drawn with probability 0 or 2^-16.

With ``probs="fp64"`` and ``uniform_bits=53`` it is a correct sampler (the probes' control: it must pass them).
Randomness: a torch generator per call seeded from the first row's (seed, position), float64 uniforms.
The probe cases that expose these biases are `runnercheck.checks.chisq.cases.coarse_probe_cases`; the numbers
behind their sizes are `runnercheck.checks.chisq.power_table`.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from runnercheck.impl.interface import SamplingParams

_MIX = 0x9E3779B97F4A7C15


class InverseCdfSampler:
    """``sampler(logits, params, seeds, positions)``: inverse-CDF sampling with the module docstring's knobs."""

    def __init__(self, probs: str = "fp64", uniform_bits: int = 53, name: str | None = None) -> None:
        if probs not in ("fp64", "fp16") or not 1 <= uniform_bits <= 53:
            raise ValueError(f"probs must be fp64 or fp16 and uniform_bits in 1..53, got {probs!r}, {uniform_bits}")
        self.probs, self.uniform_bits = probs, uniform_bits
        self.name = name or f"inverse-cdf-{probs}-u{uniform_bits}"

    def _probs(self, logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
        # The oracle's exact distribution (no import of the baseline samplers: they list this sampler as a bias).
        from runnercheck.reference.sampler import expected_distribution

        rows = [expected_distribution(row, p) for row, p in zip(logits.detach().to("cpu", torch.float64), params)]
        return torch.stack([torch.as_tensor(r, dtype=torch.float64) for r in rows])

    def __call__(self, logits: torch.Tensor, params: Sequence[SamplingParams], seeds: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
        if len(set(params)) == 1:  # the chi-square's calls: one params for every row, filters computed once
            probs = self._probs(logits[:1], params[:1]).expand(logits.shape[0], -1)
        else:
            probs = self._probs(logits, params)
        probs = probs.to(logits.device)
        if self.probs == "fp16":
            probs = probs.to(torch.float16).to(torch.float64)
        cumulative = probs.cumsum(dim=1)
        generator = torch.Generator(device=logits.device).manual_seed((int(seeds[0]) * _MIX + int(positions[0])) % 2**63)
        u = torch.rand(logits.shape[0], 1, dtype=torch.float64, device=logits.device, generator=generator)
        u = torch.floor(u * 2.0**self.uniform_bits) / 2.0**self.uniform_bits * cumulative[:, -1:]
        token = torch.searchsorted(cumulative, u, right=True).clamp(max=logits.shape[1] - 1)
        return token[:, 0]


def inverse_cdf_factory(**knobs) -> Callable[[], Callable]:
    """A `runnercheck.checks.chisq.samplers.PlantedBias` factory: an `InverseCdfSampler` with these knobs."""
    return lambda: InverseCdfSampler(**knobs)


__all__ = ["InverseCdfSampler", "inverse_cdf_factory"]
