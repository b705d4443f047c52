"""The distributions a sampler call drew its rows from, on the device (docs/SAMPLING.md steps 0-6, then softmax).

Rejection sampling (`runnercheck.impl.sample.spec_verify`) needs the target's and the draft's whole
distributions, not a sampled token.  `drawn_distribution` reads them off the `Sampler` call that just
sampled the same rows, so ``p`` is by construction the distribution the sampler drew from -- its kept
threshold, its penalties, its fp32 scores -- not a second implementation of the pipeline:

* the row's scores (NaN -> -inf, penalties with the row's draft prefix counted as outputs, ``/ T``), ``-inf``
  below the sampler's kept threshold ``Sampler.bound`` (min-p, top-k and top-p combined) -- the same fp32
  function as the sampler's passes and the processed logprobs (`runnercheck.impl.kernels.sampling_processed`);
* their softmax;
* a point mass on the sampler's own token where no noise was involved: greedy rows (temperature 0: the
  penalised argmax, lowest index), rows whose top score is ``+inf`` (the lowest raw ``+inf``; or a penalty
  that overflowed) and rows with no finite score (token 0).

Two launches (`runnercheck.impl.kernels.sampling_distribution`: the scores with per-span softmax partials, then the
probabilities in place), no host read, so it runs inside an enqueued closure or a CUDA-graph capture, after the
`Sampler.sample` call over the same ``logits`` rows, state rows and draft prefix (stream order is the
only synchronisation).  It allocates its result and partials per call (inside a capture: from the graph's memory pool,
live for one replay).  The oracle's twin is `runnercheck.reference.sampler.distribution` (float64), whose
fragility report covers the fp32 boundaries.
"""
from __future__ import annotations

import torch

from runnercheck.impl.kernels.launch import launch, next_power_of_2
from runnercheck.impl.kernels.sampling_distribution import distribution_finish_kernel, distribution_scores_kernel
from runnercheck.impl.kernels.spec_verify import SPAN_BLOCK, SPAN_TOKENS, spans_of
from runnercheck.impl.sample.sampler import Sampler
from runnercheck.impl.sample.state import SamplingState


def drawn_distribution(sampler: Sampler, logits: torch.Tensor, state: SamplingState, rows_map: torch.Tensor,
                       draft_prefix: torch.Tensor | None, num_rows: int, span_tokens: int = SPAN_TOKENS) -> torch.Tensor:
    """float32 ``[num_rows, V]``: the distribution ``sampler``'s last `Sampler.sample` call drew each of the first
    ``num_rows`` rows of ``logits`` from.  ``rows_map`` int32 ``[>= num_rows]`` and ``draft_prefix`` int32
    ``[>= num_rows, D]`` (-1 padded) or None: the arguments that call took.  ``span_tokens``: the widest vocabulary
    span one program covers (a power of two; tests narrow it to split small rows).  Device work only."""
    vocab = sampler.vocab_size
    out = torch.empty((num_rows, vocab), dtype=torch.float32, device=logits.device)
    if num_rows == 0:
        return out
    span, spans = spans_of(vocab, span_tokens)
    block = min(span, SPAN_BLOCK)
    partials = torch.empty((num_rows, spans, 2), dtype=torch.float32, device=logits.device)
    grid = (num_rows, spans)
    launch(distribution_scores_kernel, grid,
           logits, logits.stride(0), rows_map, state.temperature.base, *state.kernel_params()[1], sampler.bound,
           *sampler.penalty_rows(state, draft_prefix), out, out.stride(0), partials, spans, vocab, SPAN=span,
           BLOCK=block)
    launch(distribution_finish_kernel, grid,
           out, out.stride(0), partials, spans, rows_map, state.temperature.base, sampler.tokens, vocab, SPAN=span,
           BLOCK=block, SPANS_P2=next_power_of_2(spans))
    return out


__all__ = ["drawn_distribution"]
