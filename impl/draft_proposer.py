"""The runner's draft-model proposer: a second, smaller model drafting on the device, with its q.

With ``speculative=DraftModelConfig(preset, num_spec_tokens)`` the runner (`runnercheck.impl.runner`) runs,
besides the target, a `PagedDecoder` over the draft preset's weights (the target's vocabulary:
`runnercheck.impl.model.weights.draft_weights`).  Per step, all device work, nothing read on the host:

1. (host, before any state changes) `check_schedule` and `check`: the device-draft counts (`runnercheck.impl.boundary.check_device_drafts`)
   and what a draft-model runner refuses (`runnercheck.impl.boundary.check_draft_model_schedule`: explicit
   drafts, which carry no q; prefix-cache hits, which its own KV does not hold);
2. (before input prep) `enqueue_gather`: the step's draft ids into ``step_drafts`` (a bucketed step's:
   into the graph's step buffer, which its pad kernel copies) and their
   distributions into ``step_q`` (the layout `SpecVerifier` reads);
3. (between the sampler and post-update) `enqueue_verify` (`_verify`): the target's distributions ``p`` of
   every logit row (`runnercheck.impl.sample.probs.drawn_distribution`: the distribution the step's sampler
   drew each row from, the draft prefix counted for penalties), `SpecVerifier` over the batch, then the verified tokens
   written over the sampler's for requests with drafts and temperature > 0 (greedy requests keep
   the exact-match rule, equal to the verifier's greedy mode); the accepted count reaches the
   post-update kernel through the sampler's tokens and a poisoned rejected draft, never the host;
4. (after post-update) `enqueue_propose` (`_propose`): the draft model's *catch-up* forward over the step's
   own input tokens (so its KV holds every position the target computed), then
   ``num_spec_tokens`` decode steps from each scheduled row's new last token: decode ``j`` feeds
   the previous draft at position ``NUM_TOKENS - 1 + j``, turns its logits into ``q`` with the
   request's own parameters (the drafts so far counted as outputs; ``draft_sampler`` run on them, then
   `drawn_distribution`) and samples draft ``j`` by
   Gumbel-max over ``log q`` with ``DRAFT_STREAM`` noise at position ``NUM_TOKENS + j`` (a greedy
   request's ``q`` is a point mass on the argmax).  Rows that did not sample this step (a partial
   prefill) decode too: their proposal is never asked for (`has_proposal`) and every KV entry
   they write lies at or beyond their next computed position, which that computation overwrites.

Bucketed steps (CUDA graphs, `runnercheck.impl.graph_step`): a uniform decode batch (every request ``1 + k``
tokens with its k device drafts, or 1 token and none) is padded to a capture size, and its graph holds,
besides input prep .. post-update, the verification (`padded_launches`: after the sampler) and the
proposal (after post-update) with every shape taken from the bucket; the gathers of the step's drafts
and q run before the replay, as the n-gram proposer's do.  The eager step (other batches: prefills,
mixed query lengths) runs the same `_verify` and `_propose` launches shaped by its own counts.  Neither
reads device data on the host: no ``.item()``, no data-dependent shape (``repeat_interleave`` gets its
output size from the host).  A padding request (row -1) reads `PADDING_STATE_ROW`'s state (in bounds),
writes no KV (slot -1), and puts its q and drafts in the dummy row ``R`` (``dummy_row``).

Its per-request rows are the target's state rows (same index, same lifetime): ``proposed``, ``q`` and KV row r belong to the
request in state row r.

The draft model's KV cache is its own and not paged by the scheduler: row r owns blocks
``[r * B, (r + 1) * B)`` (``B = ceil(max_model_len / block_size)``), so drafting may write past
the blocks the scheduler allocated.  A row's KV is written before it is read (positions ``< p``
are written by the row's current request before position ``p`` attends to them).

Ownership (all owned by this object, on the device, allocated at init, for the runner's lifetime):

    model.kv_cache   the draft's K/V, ``[layers, R * B, block_size, kv_heads, head_dim]``.  Row r's
                     blocks: written by the catch-up and decode forwards of row r's request, read by them.
    block_table      int32 [R + 1, B]: constant (row r -> its own blocks; the dummy row R -> row 0's, read
                     only: its slots are -1), written at init only.
    proposed         int32 [R + 1, K]: row r's drafts from its last sampling step (row R: padding's, never
                     read by a live row).  Written only by the draft-sample kernel; read by the next step's
                     gather and by later decodes (penalties).
    q                float32 [R + 1, K, V]: the distributions ``proposed`` were sampled from.  Written
                     by `_propose` (eager or in a graph); read by the draft-sample kernel and the next step's gather.
    step_drafts      int32 [R * max(1, D)] (D = max_num_draft_tokens): the step's draft ids in the
                     staged layout.  Written by the gather kernel, and by the scatter kernel (a rejected
                     draft poisoned to -1); read by input prep, the sampler's draft prefixes, the
                     verifier and post-update of the same step.
    step_q           float32 [R * max(1, D), V]: the step's draft distributions, same layout.  Written
                     by the q-gather kernel; read by that step's verifier.
    next_tokens      int64 [R]: a decode's sampled drafts, the next decode's input.  Draft-sample kernel only.
    sample_partials  int32 [R, 4, S]: a draft sample's Gumbel-max per vocabulary span of ``sample_span`` tokens
                     (`runnercheck.impl.kernels.spec_verify.spans_of`; `launch_draft_sample`),
                     written by its partials launch, read by its combine launch; meaningless between them.
    draft_sampler    a `Sampler` over the draft decodes' rows (its buffers: see its docstring): run on each decode's
                     logits so that `drawn_distribution` reads q off its kept thresholds and tokens; its tokens
                     are not the drafts.
    decode_qsl       int32 [R + 1], decode_rows int64 [R]: constants ``0..R`` (one token per request).
    verifier         `SpecVerifier` (owns its output tokens / accepted counts, see its docstring).
    has_proposal     host bookkeeping (`runnercheck.impl.device_drafts.DeviceDraftRows`).

Host state valid for one step (set by `note_step` and `mark_bucketed`, read by the step's enqueues): the
step's token count, longest query and sequence-length bounds, and whether it runs as a bucket.
Tensors a graph step allocates inside its launches (probabilities, indices) come from the graph's pool
and live for one replay.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import torch

from runnercheck.impl.boundary import check_draft_model_schedule
from runnercheck.impl.device import Device
from runnercheck.impl.device_drafts import DeviceDraftRows, ProposerConfigError
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.interface import DraftModelConfig, RunnerLimits, SchedulerOutput
from runnercheck.impl.kernels.draft_model import launch_draft_sample, launch_gather_draft_probs, launch_scatter_verified
from runnercheck.impl.kernels.input_prep import PADDING_STATE_ROW as _PADDING_STATE_ROW
from runnercheck.impl.kernels.ngram import launch_gather_drafts
from runnercheck.impl.kernels.spec_verify import spans_of
from runnercheck.impl.model.forward import PagedDecoder
from runnercheck.impl.model.weights import ModelConfig, WeightsError, draft_weights
from runnercheck.impl.sample.probs import drawn_distribution
from runnercheck.impl.sample.sampler import Sampler
from runnercheck.impl.sample.spec_verify import SpecVerifier
from runnercheck.impl.sample.state import SamplingState
from runnercheck.impl.state import LAST_TOKEN, NUM_TOKENS

# The state row a bucket's padding request reads (in bounds, never written): the input-prep kernels' choice.
PADDING_STATE_ROW = int(getattr(_PADDING_STATE_ROW, "value", _PADDING_STATE_ROW))


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
        self.dummy_row = r  # a bucket's padding requests write their q and drafts here (read by nothing live)
        table = torch.arange(r * self.blocks_per_row, dtype=torch.int32).view(r, self.blocks_per_row)
        self.block_table = device.to_device(torch.cat([table, table[:1]]))  # the dummy row reads row 0's blocks
        self.proposed = device.zeros((r + 1, k), torch.int32)
        self.q = device.zeros((r + 1, k, v), torch.float32)
        max_draft_rows = r * max(1, limits.max_num_draft_tokens)
        self.step_drafts = device.zeros(max_draft_rows, torch.int32)
        self.step_q = device.zeros((max_draft_rows, v), torch.float32)
        self.next_tokens = device.zeros(r, torch.int64)
        self.sample_span, spans = spans_of(v)
        self.sample_partials = device.zeros((r, 4, spans), torch.int32)
        # its kept thresholds and point-mass tokens define q (`drawn_distribution`); no logprobs, one processed row
        self.draft_sampler = Sampler(device, v, max_logprobs=0, max_num_rows=r, processed_rows=1)
        self.decode_qsl = device.to_device(torch.arange(r + 1, dtype=torch.int32))
        self.decode_rows = device.to_device(torch.arange(r, dtype=torch.int64))
        self.verifier = SpecVerifier(device, v, max_num_reqs=r, max_spec_tokens=limits.max_num_draft_tokens)
        self._bounds: tuple[int, int, int, int] = (0, 0, 0, 0)  # this step: tokens, max query, max seq, decode bound
        self._verify_step = False  # this step gathered device drafts (so it verifies them)
        self._bucketed = False  # this step runs as a bucket: its graph verifies and proposes (`mark_bucketed`)

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
        """Enqueue the gathers of the step's drafts and their q; returns ``staged`` reading the drafts' buffer.

        ``out``: gather the draft ids into this buffer instead of `step_drafts` (a bucketed step's graph step
        buffer, same layout as the staged drafts, which the caller owns; its graph pads them from there).  The
        q rows land in `step_q` either way, at the staged layout, which a uniform bucket's padded layout
        repeats (request i's drafts at ``i * k``)."""
        rows, draft_start, staged_drafts = staged.rows, staged.draft_start, staged.drafts
        proposed, q, step_q = self.proposed, self.q, self.step_q
        drafts_out = self.step_drafts if out is None else out
        max_drafts = self.limits.max_num_draft_tokens

        def gather() -> None:
            launch_gather_drafts(rows=rows, draft_start=draft_start, staged_drafts=staged_drafts, proposed=proposed,
                                 out=drafts_out, num_reqs=num_reqs, max_drafts=max_drafts)
            launch_gather_draft_probs(rows=rows, draft_start=draft_start, q_buf=q, out=step_q, num_reqs=num_reqs,
                                      max_drafts=max_drafts)

        self.device.enqueue(gather, "gather device drafts and q")
        self._verify_step = True
        return dataclasses.replace(staged, drafts=drafts_out)

    @hot_path
    def enqueue_verify(self, result: dict, plan: Any, staged: Any, sampler: Any, processed_logprobs: bool = False) -> None:
        """Rejection-sampling verification of the step's drafts (after the sampler, before post-update)."""
        if not self._verify_step:
            return
        num_reqs, num_rows = plan.num_reqs, plan.num_sampling_rows
        counts = plan.num_drafts.tolist()  # runnercheck: allow-host-read the plan's host numpy counts, no device data
        max_num_logprobs = plan.max_num_logprobs

        def verify() -> None:
            self._verify(result["logits"], staged.rows, staged.draft_start, staged.logits_start, staged.drafts, counts,
                         num_rows, sampler, max_num_logprobs, self.step_q, processed_logprobs)

        self.device.enqueue(verify, "rejection-sampling verify")

    def _verify(self, logits: torch.Tensor, rows32: torch.Tensor, draft_start: torch.Tensor, logits_start: torch.Tensor,
                drafts: torch.Tensor, counts: list[int], num_rows: int, sampler: Any, max_num_logprobs: int,
                step_q: torch.Tensor, processed_logprobs: bool = False) -> None:
        """Launches of the verification (device work, or a capture): the same ops for an eager step and a bucket.

        ``rows32`` may hold padding requests (-1): they read `PADDING_STATE_ROW`'s seed and temperature (in
        bounds) and write only their own (padding) token rows and drafts, which nothing live reads."""
        ib, ss, num_reqs = self.input_batch, self.sampling_state, len(counts)
        rows32 = rows32[:num_reqs]
        state_rows = torch.where(rows32 >= 0, rows32, PADDING_STATE_ROW)
        p = drawn_distribution(sampler, logits, ss, ib.logits_state_rows, ib.logits_draft_prefix, num_rows)
        positions = ib.logits_positions.index_select(0, logits_start[:num_reqs].long())
        out = self.verifier.verify(p, step_q, drafts, draft_start, state_rows, ss.seed.base, ss.temperature.base,
                                   positions, num_drafts=counts)
        launch_scatter_verified(rows=state_rows, draft_start=draft_start, logits_start=logits_start,
                                temperature=ss.temperature.base, verified=out.tokens, accepted=out.accepted,
                                sampled=sampler.tokens, drafts=drafts, num_reqs=num_reqs)
        if max_num_logprobs >= 0:  # the sampler scored its own tokens; score the verified ones
            processed = None
            if processed_logprobs:  # the emitted token is distributed as p: the sampler's own kept rows
                processed = (ss, ib.logits_state_rows, sampler.penalty_rows(ss, ib.logits_draft_prefix))
            sampler.score_tokens(logits, sampler.tokens[:num_rows], num_rows, max_num_logprobs, processed)

    @hot_path
    def enqueue_propose(self, staged: Any, num_reqs: int, num_sampled: torch.Tensor, sampled: torch.Tensor,
                        row_state: torch.Tensor, prefill_tokens: torch.Tensor) -> None:
        """Enqueue the catch-up forward and the draft decodes for an eager step's rows (after post-update).

        Same signature as the n-gram proposer's; the draft model reads the new last token and
        ``NUM_TOKENS`` from ``row_state`` (``num_sampled``, ``sampled`` and ``prefill_tokens`` are unused).
        A bucketed step proposes inside its graph instead (`padded_launches`): this is a no-op for it."""
        if self._bucketed:
            return
        num_tokens, max_query_len, max_seq_len, bound = self._bounds

        def propose() -> None:
            rows = staged.rows[:num_reqs]
            query_lens = (staged.cu[1 : num_reqs + 1] - staged.cu[:num_reqs]).long()
            token_rows = torch.repeat_interleave(rows.long(), query_lens, output_size=num_tokens)
            self._propose(rows, token_rows, num_tokens, max_query_len, max_seq_len, bound, row_state)

        self.device.enqueue(propose, "draft model propose")

    def _propose(self, rows32: torch.Tensor, token_rows: torch.Tensor, num_tokens: int, max_query_len: int,
                 max_seq_len: int, decode_bound: int, row_state: torch.Tensor) -> None:
        """Launches of the catch-up forward and the k draft decodes (device work, or a capture).

        Fixed shapes (``len(rows32)`` requests, ``num_tokens`` input tokens) and no host read, so a
        bucket captures it as is.  ``rows32`` int32 (-1: a bucket's padding request), ``token_rows``
        int64 ``[num_tokens]`` (each input token's row, -1 for a padding request's).  A padding request
        writes no KV (slot -1), reads the dummy row's table (row 0's blocks) and the state of
        `PADDING_STATE_ROW`, and puts its q and drafts in the dummy row ``R``, which nothing live reads.
        ``max_seq_len`` and ``decode_bound`` only bound the lengths (the kernels read them from the inputs)."""
        ib, ss, model = self.input_batch, self.sampling_state, self.model
        k, max_len, stride, num_reqs = self.config.num_spec_tokens, self.limits.max_model_len, self.row_stride, len(rows32)
        real = rows32 >= 0
        own_rows = torch.where(real, rows32, self.dummy_row)  # q, proposed, KV table: padding -> the dummy row
        own_rows64 = own_rows.long()
        state_rows32 = torch.where(real, rows32, PADDING_STATE_ROW)  # row and sampling state: read only
        table = self.block_table.index_select(0, own_rows64)
        positions = ib.positions[:num_tokens]
        slots = torch.where(token_rows >= 0, token_rows * stride + positions, -1)
        model.forward(ib.input_ids, positions, slots, ib.query_start_loc, ib.seq_lens, table,
                      self.decode_rows[:1], num_reqs=num_reqs, num_tokens=num_tokens,
                      max_query_len=max_query_len, max_seq_len=max_seq_len, return_hidden=True)
        state = row_state.index_select(0, state_rows32.long())
        total = state[:, NUM_TOKENS].long()
        tokens_in = state[:, LAST_TOKEN].long()
        for j in range(k):
            # Drafts past the context are never asked for; a padding request may read a free row (NUM_TOKENS 0):
            # position 0, not -1, keeps its RoPE and KV-table reads in bounds (a live row's total is >= 1).
            positions = (total - 1 + j).clamp(min=0, max=max_len - 1)
            slots = torch.where(real, own_rows64 * stride + positions, -1)
            logits = model.forward(tokens_in, positions, slots, self.decode_qsl, (positions + 1).to(torch.int32), table,
                                   self.decode_rows[:num_reqs], num_reqs=num_reqs, num_tokens=num_reqs, max_query_len=1,
                                   max_seq_len=min(decode_bound + j, max_len))
            prefix = self.proposed.index_select(0, own_rows64)[:, :j] if j else None
            # q: the distribution the draft sampler draws the row from (its tokens are not the drafts: those take the
            # draft stream's noise below, independent of the target's)
            noise_positions = total + j
            self.draft_sampler.sample(logits, ss, state_rows32, noise_positions, num_rows=num_reqs, draft_prefix=prefix)
            q = drawn_distribution(self.draft_sampler, logits, ss, state_rows32, prefix, num_reqs)
            self.q[:, j].index_copy_(0, own_rows64, q)
            launch_draft_sample(rows=own_rows, state_rows=state_rows32, positions=noise_positions, seeds=ss.seed.base,
                                q_buf=self.q, proposed=self.proposed, next_tokens=self.next_tokens,
                                partials=self.sample_partials, chunk=self.sample_span, j=j, num_reqs=num_reqs)
            tokens_in = self.next_tokens[:num_reqs]

    # ------------------------------------------------------------------ bucketed (graph) steps
    def padded_launches(self, inputs: Any, key: Any, result: dict, sampler: Any, row_state: torch.Tensor
                        ) -> tuple[list[tuple[str, Callable[[], None]]], list[tuple[str, Callable[[], None]]]]:
        """The draft model's launches of a uniform decode bucket ``key`` (`runnercheck.impl.graph_step`): (the
        verification, to run after the sampler; the proposal, to run after post-update).

        Every shape comes from the bucket: ``size`` requests (padding rows -1 in ``inputs.rows``), each with
        ``query_len - 1`` drafts at ``inputs.draft_start``; lengths are bounded by ``max_model_len``.  The
        q rows were gathered before the step into `step_q` (`enqueue_gather`)."""
        size, query_len, num_top = key.size, key.mode.query_len, key.mode.num_top
        if key.mode.query_len < 1:
            raise ProposerConfigError(f"a draft-model runner captures uniform decode buckets only, not {key.describe()}")
        num_tokens, max_len = size * query_len, self.limits.max_model_len
        rows = inputs.rows[:size]
        draft_start, logits_start, drafts = inputs.draft_start[query_len], inputs.logits_start[query_len], inputs.drafts
        counts = [query_len - 1] * size
        step_q = self.step_q  # bound now, as a capture binds its addresses (a later re-allocation is not seen)

        def verify() -> None:
            self._verify(result["logits"], rows, draft_start, logits_start, drafts, counts, num_tokens, sampler, num_top,
                         step_q)

        def propose() -> None:
            # Each request's row repeated query_len times: a view and a copy, no size to read back (capturable).
            token_rows = rows.long().unsqueeze(1).expand(size, query_len).reshape(num_tokens)
            self._propose(rows, token_rows, num_tokens, query_len, max_len, max_len, row_state)

        verify_launches = [("draft verify", verify)] if query_len > 1 else []
        return verify_launches, [("draft propose", propose)]

    def mark_bucketed(self, bucketed: bool) -> None:
        """This step runs as a bucket (its graph verifies and proposes): the eager enqueues do nothing."""
        self._bucketed = bucketed


__all__ = ["DraftModelProposer"]
