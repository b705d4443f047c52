"""The runner's draft-model proposer: a second, smaller model drafting on the device, with its q.

With ``speculative=DraftModelConfig(preset, num_spec_tokens)`` the runner (`runnercheck.impl.runner`) runs,
besides the target, a `PagedDecoder` over the draft preset's weights (the target's vocabulary:
`runnercheck.impl.model.weights.draft_weights`).  Per step, all device work, nothing read on the host:

1. (host, before any state changes) `check_schedule` and `check`: the device-draft counts (`runnercheck.impl.boundary.check_device_drafts`)
   and what a draft-model runner refuses (`runnercheck.impl.boundary.check_draft_model_schedule`: explicit
   drafts, which carry no q; prefix-cache hits, which its own KV does not hold);
2. (before input prep) `enqueue_gather`: the step's draft ids into ``step_drafts`` and their
   distributions into ``step_q`` (the layout `SpecVerifier` reads);
3. (between the sampler and post-update) `enqueue_verify`: the target's distributions ``p`` of
   every logit row (`runnercheck.impl.sample.probs.filtered_probs`: docs/SAMPLING.md steps 0-6 + softmax, the
   draft prefix counted for penalties), `SpecVerifier` over the batch, then the verified tokens
   written over the sampler's for requests with drafts and temperature > 0 (greedy requests keep
   the exact-match rule, equal to the verifier's greedy mode); the accepted count reaches the
   post-update kernel through the sampler's tokens and a poisoned rejected draft, never the host;
4. (after post-update) `enqueue_propose`: the draft model's *catch-up* forward over the step's
   own input tokens (so its KV holds every position the target computed), then
   ``num_spec_tokens`` decode steps from each scheduled row's new last token: decode ``j`` feeds
   the previous draft at position ``NUM_TOKENS - 1 + j``, turns its logits into ``q`` with the
   request's own parameters (the drafts so far counted as outputs) and samples draft ``j`` by
   Gumbel-max over ``log q`` with ``DRAFT_STREAM`` noise at position ``NUM_TOKENS + j`` (a greedy
   request's ``q`` is a point mass on the argmax).  Rows that did not sample this step (a partial
   prefill) decode too: their proposal is never asked for (`has_proposal`) and every KV entry
   they write lies at or beyond their next computed position, which that computation overwrites.

A draft-model runner's steps run eager: no CUDA graph is captured (its verify launches sit
between the sampler and post-update, which a graph replays as one).  Its per-request rows are the
target's state rows (same index, same lifetime): ``proposed``, ``q`` and KV row r belong to the
request in state row r.

The draft model's KV cache is its own and not paged by the scheduler: row r owns blocks
``[r * B, (r + 1) * B)`` (``B = ceil(max_model_len / block_size)``), so drafting may write past
the blocks the scheduler allocated.  A row's KV is written before it is read (positions ``< p``
are written by the row's current request before position ``p`` attends to them).

Ownership (all owned by this object, on the device, allocated at init, for the runner's lifetime):

    model.kv_cache   the draft's K/V, ``[layers, R * B, block_size, kv_heads, head_dim]``.  Row r's
                     blocks: written by the catch-up and decode forwards of row r's request, read by them.
    block_table      int32 [R, B]: constant (row r -> its own blocks), written at init only.
    proposed         int32 [R, K]: row r's drafts from its last sampling step.  Written only by the
                     draft-sample kernel; read by the next step's gather and by later decodes (penalties).
    q                float32 [R, K, V]: the distributions ``proposed`` were sampled from.  Written
                     by `enqueue_propose`; read by the draft-sample kernel and the next step's gather.
    step_drafts      int32 [R * max(1, D)] (D = max_num_draft_tokens): the step's draft ids in the
                     staged layout.  Written by the gather kernel, and by the scatter kernel (a rejected
                     draft poisoned to -1); read by input prep, the sampler's draft prefixes, the
                     verifier and post-update of the same step.
    step_q           float32 [R * max(1, D), V]: the step's draft distributions, same layout.  Written
                     by the q-gather kernel; read by that step's verifier.
    next_tokens      int64 [R]: a decode's sampled drafts, the next decode's input.  Draft-sample kernel only.
    decode_qsl       int32 [R + 1], decode_rows int64 [R]: constants ``0..R`` (one token per request).
    verifier         `SpecVerifier` (owns its output tokens / accepted counts, see its docstring).
    has_proposal     host bookkeeping (`runnercheck.impl.device_drafts.DeviceDraftRows`).

Host state valid for one step (set by `note_step`, read by the step's enqueues): the step's
token count, longest query and sequence-length bounds.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from runnercheck.impl.boundary import check_draft_model_schedule
from runnercheck.impl.device import Device
from runnercheck.impl.device_drafts import DeviceDraftRows, ProposerConfigError
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.interface import DraftModelConfig, RunnerLimits, SchedulerOutput
from runnercheck.impl.kernels.draft_model import launch_draft_sample, launch_gather_draft_probs, launch_scatter_verified
from runnercheck.impl.kernels.ngram import launch_gather_drafts
from runnercheck.impl.model.forward import PagedDecoder
from runnercheck.impl.model.weights import ModelConfig, WeightsError, draft_weights
from runnercheck.impl.sample.probs import filtered_probs
from runnercheck.impl.sample.spec_verify import SpecVerifier
from runnercheck.impl.sample.state import SamplingState
from runnercheck.impl.state import LAST_TOKEN, NUM_TOKENS


class DraftModelProposer(DeviceDraftRows):
    """See the module docstring for the protocol and the ownership of every tensor."""

    def __init__(self, device: Device, config: DraftModelConfig, limits: RunnerLimits, target: ModelConfig, *,
                 dtype: torch.dtype, sampling_state: SamplingState, input_batch: Any):
        if not isinstance(config, DraftModelConfig):
            raise ProposerConfigError(f"speculative must be a DraftModelConfig, got {type(config).__name__}")
        super().__init__(config, limits)
        try:
            weights = draft_weights(config.preset, config.weights_seed, target)
        except WeightsError as e:
            raise ProposerConfigError(str(e)) from e
        self.device = device
        self.sampling_state = sampling_state
        self.input_batch = input_batch
        r, k, v = limits.max_num_reqs, config.num_spec_tokens, limits.vocab_size
        self.blocks_per_row = -(-limits.max_model_len // limits.block_size)
        self.row_stride = self.blocks_per_row * limits.block_size  # KV slots per row
        self.model = PagedDecoder(weights, device, dtype=dtype, num_kv_blocks=r * self.blocks_per_row,
                                  block_size=limits.block_size)
        self.block_table = device.to_device(torch.arange(r * self.blocks_per_row, dtype=torch.int32).view(r, self.blocks_per_row))
        self.proposed = device.zeros((r, k), torch.int32)
        self.q = device.zeros((r, k, v), torch.float32)
        max_draft_rows = r * max(1, limits.max_num_draft_tokens)
        self.step_drafts = device.zeros(max_draft_rows, torch.int32)
        self.step_q = device.zeros((max_draft_rows, v), torch.float32)
        self.next_tokens = device.zeros(r, torch.int64)
        self.decode_qsl = device.to_device(torch.arange(r + 1, dtype=torch.int32))
        self.decode_rows = device.to_device(torch.arange(r, dtype=torch.int64))
        self.verifier = SpecVerifier(device, v, max_num_reqs=r, max_spec_tokens=limits.max_num_draft_tokens)
        self._bounds: tuple[int, int, int, int] = (0, 0, 0, 0)  # this step: tokens, max query, max seq, decode bound
        self._verify_step = False  # this step gathered device drafts (so it verifies them)

    # ------------------------------------------------------------------ host, before any state changes
    @staticmethod
    def check_schedule(sched: SchedulerOutput) -> None:
        """Every step: what a draft-model runner refuses (`runnercheck.impl.boundary.check_draft_model_schedule`)."""
        check_draft_model_schedule(sched)

    def note_step(self, step: Any, new_requests: Any, req_to_row: Mapping[str, int]) -> None:
        super().note_step(step, new_requests, req_to_row)
        self._verify_step = False
        if len(step.req_ids):
            # A row's new NUM_TOKENS is at most its end + 1 when it sampled, else what it knew.
            bound = max(int(step.ends.max()) + 1, int(step.known.max()))
            self._bounds = (int(step.query_lens.sum()), int(step.query_lens.max()), int(step.ends.max()), bound)

    # ------------------------------------------------------------------ device work
    @hot_path
    def enqueue_gather(self, staged: Any, num_reqs: int, out: torch.Tensor | None = None) -> Any:
        """Enqueue the gathers of the step's drafts and their q; returns ``staged`` reading `step_drafts`.

        ``out`` must be None: a draft-model step never runs as a bucketed graph step."""
        if out is not None:
            raise ProposerConfigError("a draft-model step runs eager; it has no graph step buffer to gather into")
        rows, draft_start, staged_drafts = staged.rows, staged.draft_start, staged.drafts
        proposed, q, step_drafts, step_q = self.proposed, self.q, self.step_drafts, self.step_q
        max_drafts = self.limits.max_num_draft_tokens

        def gather() -> None:
            launch_gather_drafts(rows=rows, draft_start=draft_start, staged_drafts=staged_drafts, proposed=proposed,
                                 out=step_drafts, num_reqs=num_reqs, max_drafts=max_drafts)
            launch_gather_draft_probs(rows=rows, draft_start=draft_start, q_buf=q, out=step_q, num_reqs=num_reqs,
                                      max_drafts=max_drafts)

        self.device.enqueue(gather, "gather device drafts and q")
        self._verify_step = True
        return dataclasses.replace(staged, drafts=step_drafts)

    @hot_path
    def enqueue_verify(self, result: dict, plan: Any, staged: Any, sampler: Any) -> None:
        """Rejection-sampling verification of the step's drafts (after the sampler, before post-update)."""
        if not self._verify_step:
            return
        ib, ss, verifier = self.input_batch, self.sampling_state, self.verifier
        num_reqs, num_rows = plan.num_reqs, plan.num_sampling_rows
        counts = plan.num_drafts.tolist()  # runnercheck: allow-host-read the plan's host numpy counts, no device data
        max_num_logprobs = plan.max_num_logprobs

        def verify() -> None:
            logits = result["logits"]
            p = filtered_probs(logits, ss, ib.logits_state_rows, ib.logits_draft_prefix, num_rows)
            positions = ib.logits_positions.index_select(0, staged.logits_start[:num_reqs].long())
            out = verifier.verify(p, self.step_q, staged.drafts, staged.draft_start, staged.rows, ss.seed.base,
                                  ss.temperature.base, positions, num_drafts=counts)
            launch_scatter_verified(rows=staged.rows, draft_start=staged.draft_start, logits_start=staged.logits_start,
                                    temperature=ss.temperature.base, verified=out.tokens, accepted=out.accepted,
                                    sampled=sampler.tokens, drafts=staged.drafts, num_reqs=num_reqs)
            if max_num_logprobs >= 0:  # the sampler scored its own tokens; score the verified ones
                sampler.logprobs.launch(logits, sampler.tokens[:num_rows], num_rows, max_num_logprobs)

        self.device.enqueue(verify, "rejection-sampling verify")

    @hot_path
    def enqueue_propose(self, staged: Any, num_reqs: int, num_sampled: torch.Tensor, sampled: torch.Tensor,
                        row_state: torch.Tensor, prefill_tokens: torch.Tensor) -> None:
        """Enqueue the catch-up forward and the draft decodes for the step's rows (after post-update).

        Same signature as the n-gram proposer's; the draft model reads the new last token and
        ``NUM_TOKENS`` from ``row_state`` (``num_sampled``, ``sampled`` and ``prefill_tokens`` are unused)."""
        ib, ss, model = self.input_batch, self.sampling_state, self.model
        num_tokens, max_query_len, max_seq_len, bound = self._bounds
        k, max_len = self.config.num_spec_tokens, self.limits.max_model_len

        def propose() -> None:
            rows32 = staged.rows[:num_reqs]
            rows = rows32.long()
            table = self.block_table.index_select(0, rows)
            query_lens = (staged.cu[1 : num_reqs + 1] - staged.cu[:num_reqs]).long()
            token_rows = torch.repeat_interleave(rows, query_lens, output_size=num_tokens)
            slots = token_rows * self.row_stride + ib.positions[:num_tokens]
            model.forward(ib.input_ids, ib.positions, slots, ib.query_start_loc, ib.seq_lens, table,
                          self.decode_rows[:1], num_reqs=num_reqs, num_tokens=num_tokens,
                          max_query_len=max_query_len, max_seq_len=max_seq_len, return_hidden=True)
            state = row_state.index_select(0, rows)
            total = state[:, NUM_TOKENS].long()
            tokens_in = state[:, LAST_TOKEN].long()
            for j in range(k):
                positions = (total - 1 + j).clamp(max=max_len - 1)  # drafts past the context are never asked for
                logits = model.forward(tokens_in, positions, rows * self.row_stride + positions, self.decode_qsl,
                                       (positions + 1).to(torch.int32), table, self.decode_rows[:num_reqs],
                                       num_reqs=num_reqs, num_tokens=num_reqs, max_query_len=1,
                                       max_seq_len=min(bound + j, max_len))
                prefix = self.proposed.index_select(0, rows)[:, :j] if j else None
                self.q[rows, j] = filtered_probs(logits, ss, rows32, prefix, num_reqs)
                launch_draft_sample(rows=rows32, positions=total + j, seeds=ss.seed.base, q_buf=self.q,
                                    proposed=self.proposed, next_tokens=self.next_tokens, j=j, num_reqs=num_reqs)
                tokens_in = self.next_tokens[:num_reqs]

        self.device.enqueue(propose, "draft model propose")


__all__ = ["DraftModelProposer"]
