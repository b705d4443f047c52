"""The distributions a sampler call drew its rows from, on the device (docs/SAMPLING.md steps 0-6, then softmax).

Rejection sampling (`runnercheck.impl.sample.spec_verify`) needs the target's and the draft's whole
distributions, not a sampled token.  `drawn_distribution` reads them off the `Sampler` call that just
sampled the same rows, so ``p`` is by construction the distribution the sampler drew from -- its kept
threshold, its penalties, its fp32 scores -- not a second implementation of the pipeline:

* one launch of the processed-scores kernel (`runnercheck.impl.kernels.sampling_processed`, every row
  processed): the row's scores (NaN -> -inf, penalties with the row's draft prefix counted as outputs,
  ``/ T``), ``-inf`` below the sampler's kept threshold ``Sampler.bound`` (min-p, top-k and top-p combined);
* ``softmax`` of those scores;
* a point mass on the sampler's own token where no noise was involved: greedy rows (temperature 0: the
  penalised argmax, lowest index), rows whose top score is ``+inf`` (the lowest raw ``+inf``; or a penalty
  that overflowed) and rows with no finite score (token 0).

Launches only, no host read, so it runs inside an enqueued closure or a CUDA-graph capture, after the
`Sampler.sample` call over the same ``logits`` rows, state rows and draft prefix (stream order is the
only synchronisation).  It allocates its result per call (inside a capture: from the graph's memory pool,
live for one replay).  The oracle's twin is `runnercheck.reference.sampler.distribution` (float64), whose
fragility report covers the fp32 boundaries.
"""
from __future__ import annotations

import torch

from runnercheck.impl.kernels.launch import cdiv, launch
from runnercheck.impl.kernels.sampling_processed import processed_scores_kernel
from runnercheck.impl.sample.sampler import Sampler
from runnercheck.impl.sample.state import SamplingState


def drawn_distribution(sampler: Sampler, logits: torch.Tensor, state: SamplingState, rows_map: torch.Tensor,
                       draft_prefix: torch.Tensor | None, num_rows: int) -> torch.Tensor:
    """float32 ``[num_rows, V]``: the distribution ``sampler``'s last `Sampler.sample` call drew each of the first
    ``num_rows`` rows of ``logits`` from.  ``rows_map`` int32 ``[>= num_rows]`` and ``draft_prefix`` int32
    ``[>= num_rows, D]`` (-1 padded) or None: the arguments that call took.  Device work only."""
    vocab = sampler.vocab_size
    out = torch.empty((num_rows, vocab), dtype=torch.float32, device=logits.device)
    if num_rows == 0:
        return out
    chunk = sampler.layout.chunk
    mode_unread = sampler.mode  # ALL_PROCESSED: the kernel reads no row's logprobs mode
    launch(processed_scores_kernel, (num_rows, cdiv(vocab, chunk)),
           logits, logits.stride(0), rows_map, state.temperature.base, *state.kernel_params()[1], mode_unread,
           sampler.bound, *sampler.penalty_rows(state, draft_prefix), 0, out, out.stride(0), vocab, CHUNK=chunk,
           ALL_PROCESSED=True)
    top = out.amax(dim=1, keepdim=True)
    greedy = state.temperature.base.index_select(0, rows_map[:num_rows].long()).unsqueeze(1) == 0.0
    point = greedy | torch.isinf(top)
    probs = torch.softmax(out, dim=1)
    mass = torch.zeros_like(probs).scatter_(1, sampler.tokens[:num_rows].view(-1, 1), 1.0)
    return torch.where(point, mass, probs)


__all__ = ["drawn_distribution"]
