"""Processed logprobs: the logprobs kernels run on the scores the sampler drew from (docs/SAMPLING.md "Logprobs").

A request with ``logprobs_mode="processed"`` gets, for each sampled token, the log of the exact distribution
the sampler sampled it from: penalties, temperature, then min-p/top-k/top-p, filtered tokens ``-inf``
(greedy rows: the temperature-1 distribution after penalties, unfiltered).  `ProcessedScores.launch` writes
those scores (`runnercheck.impl.kernels.sampling_processed`), a chunk of rows at a time, into a buffer and runs
the unchanged logprobs kernels (`runnercheck.impl.sample.logprobs.LogprobsComputer`) on it; rows that ask for
raw logprobs are copied raw, so one launch serves a mixed batch.  Device work only: the mode is read per row
on the device (``SamplingState.logprobs_mode``), the kept threshold from the sampler's ``bound``.

Ownership: a `ProcessedScores` owns ``scores`` f32 ``[C, V]`` (``C`` = ``chunk_rows``, at most the sampler's
row count; on the device for its lifetime, persistent address): written by the scores kernel, read by the
logprobs launch that follows it in the same enqueue, meaningless between chunks.  Peak memory is ``C x V``
floats whatever the batch (64 rows of a 151936-token vocabulary: 39 MB).
"""
from __future__ import annotations

import torch

from runnercheck.impl.device import Device
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.kernels.launch import cdiv, launch
from runnercheck.impl.kernels.sampling_processed import processed_scores_kernel
from runnercheck.impl.sample.logprobs import LogprobsComputer, LogprobsError, LogprobsOutput

DEFAULT_CHUNK_ROWS = 64


class ProcessedScores:
    """The processed-score rows of a sampler (ownership: see the module docstring)."""

    def __init__(self, device: Device, vocab_size: int, max_num_rows: int, chunk: int, chunk_rows: int | None = None):
        rows = min(max_num_rows, DEFAULT_CHUNK_ROWS if chunk_rows is None else chunk_rows)
        if rows < 1 or chunk < 1:
            raise LogprobsError(f"processed scores need chunk_rows >= 1 and chunk >= 1, got {chunk_rows!r}, {chunk}")
        self.vocab_size = vocab_size
        self.chunk = chunk
        self.chunk_rows = rows
        self.scores = device.zeros((rows, vocab_size), torch.float32)

    @hot_path
    def launch(self, logits: torch.Tensor, state: object, rows_map: torch.Tensor, penalty_rows: tuple,
               bound: torch.Tensor, tokens: torch.Tensor, num_rows: int, num_top: int,
               computer: LogprobsComputer) -> LogprobsOutput:
        """Logprobs of ``tokens`` for rows ``[0, num_rows)``, processed where the row's request asks, into
        ``computer``'s buffers (launches only).  ``penalty_rows``: the sampler's
        ``(prompt_mask, its stride, output_counts, its stride, drafts, draft stride, num_drafts)``."""
        computer.check(logits, tokens, num_rows, num_top)
        out = LogprobsOutput(computer.logprob[:num_rows], computer.rank[:num_rows], computer.top_ids[:num_rows, :num_top],
                             computer.top_logprobs[:num_rows, :num_top])
        if num_rows == 0:
            return out
        penalties = state.kernel_params()[1]  # the table's penalties, in its order (as the sampler's kernels take them)
        blocks = cdiv(self.vocab_size, self.chunk)
        for start in range(0, num_rows, self.chunk_rows):
            n = min(self.chunk_rows, num_rows - start)
            launch(processed_scores_kernel, (n, blocks),
                   logits, logits.stride(0), rows_map, state.temperature.base, *penalties, state.logprobs_mode.base,
                   bound, *penalty_rows, start, self.scores, self.scores.stride(0), self.vocab_size, CHUNK=self.chunk)
            end = start + n
            computer.launch(self.scores, tokens[start:end], n, num_top,
                            out=LogprobsOutput(out.logprob[start:end], out.rank[start:end], out.top_ids[start:end],
                                               out.top_logprobs[start:end]))
        return out
