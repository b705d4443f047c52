"""The eager step's device work: forward -> sampler (prompt logprobs included) -> the draft model's verify ->
post-update -> penalty counts, each launch shaped by the step's own plan.

A step that no bucket serves (drafts that differ, prompt logprobs, above the largest bucket, a draft-model
runner's prefills and mixed batches: `runnercheck.impl.graphs.FALLBACK_REASONS`) runs these launches after the
input-prep kernel; a bucketed step runs `runnercheck.impl.graph_step`'s padded launches instead (a graph replay, or
the same launches eagerly; a draft-model bucket's verify and proposal among them).  The
forward's logits for prompt logprobs are made a chunk of positions at a time (`PROMPT_CHUNK_ROWS`).

Ownership: holds no tensor.  Every buffer it binds belongs to a component of the runner (input batch,
model, sampler, logprobs computer, sampling state, request state, output ring, proposer) and is written
here only by the launches those components document as its writers.
"""
from __future__ import annotations

from typing import Any, Protocol

import torch

from runnercheck.impl.input_batch import StagedStepArrays, StepPlan
from runnercheck.impl.draft_proposer import DraftModelProposer
from runnercheck.impl.kernels.post_update import launch_post_update
from runnercheck.impl.sample import LogprobsOutput, prompt_logprobs_chunked



class EagerRunner(Protocol):
    """The parts of a `runnercheck.impl.runner.ModelRunner` an eager step reads (a protocol: the runner imports
    this module, so this module does not import the runner)."""

    device: Any
    input_batch: Any
    limits: Any
    model: Any
    outputs: Any
    prompt_logprobs: Any
    processed_logprobs_reqs: Any  # live request ids asking for processed logprobs
    proposer: Any
    sampler: Any
    sampling_state: Any
    state: Any

# Prompt-logprob positions whose logits exist at once (x vocab fp32): 256 x 151936 x 4 B = 156 MB.
PROMPT_CHUNK_ROWS = 256


def enqueue_eager_step(runner: EagerRunner, plan: StepPlan, staged: StagedStepArrays, all_greedy: bool = False,
                       unfiltered: bool = False) -> dict:
    """Enqueue the step's forward, sampling (and prompt logprobs), the draft model's verify, post-update and the
    penalty-count update, shaped by ``plan``; returns the dict the sampler's output lands in when they run.

    ``all_greedy``: the host knows every row has temperature 0 (`runnercheck.impl.state.RequestStateTable.all_greedy`):
    the sampler's all-greedy launch instead of its split passes.  ``unfiltered``: the host knows no row has a filter on
    (`runnercheck.impl.state.RequestStateTable.unfiltered`): the split passes without their filter launches."""
    ib, result = runner.input_batch, {}
    num_reqs, num_tokens = plan.num_reqs, plan.num_tokens
    num_rows, num_prompt_rows = plan.num_sampling_rows, plan.num_prompt_rows
    max_query_len, max_seq_len, max_num_logprobs = plan.max_query_len, plan.max_seq_len, plan.max_num_logprobs
    draft_prefix = ib.logits_draft_prefix if len(plan.drafts) else None
    prompt_top = plan.max_num_prompt_logprobs
    processed = max_num_logprobs >= 0 and bool(runner.processed_logprobs_reqs)  # host: a live request asks for them

    def forward() -> None:
        hidden = runner.model.forward(
            ib.input_ids, ib.positions, ib.slot_mapping, ib.query_start_loc, ib.seq_lens, ib.block_table,
            ib.logits_indices[: num_rows + num_prompt_rows], num_reqs=num_reqs, num_tokens=num_tokens,
            max_query_len=max_query_len, max_seq_len=max_seq_len, return_hidden=True,
        )
        result["hidden"] = hidden
        result["logits"] = runner.model.compute_logits(hidden[:num_rows])

    def sample() -> None:
        result["out"] = runner.sampler.sample(
            result["logits"], runner.sampling_state, ib.logits_state_rows, ib.logits_positions,
            num_rows=num_rows, draft_prefix=draft_prefix, max_num_logprobs=max_num_logprobs, all_greedy=all_greedy,
            unfiltered=unfiltered,
            **({"processed_logprobs": True} if processed else {}),
        )
        if num_prompt_rows:
            result["prompt"] = _prompt_logprobs(runner, result["hidden"][num_rows:], staged.prompt_targets, num_prompt_rows, prompt_top)

    def post_update() -> None:
        launch_post_update(
            rows=staged.rows, cu=staged.cu, logits_start=staged.logits_start, draft_start=staged.draft_start,
            drafts=staged.drafts, sampled=runner.sampler.tokens, row_state=runner.state.base,
            num_sampled=runner.outputs.num_sampled, row_valid=runner.outputs.row_valid,
            num_reqs=num_reqs, max_drafts=runner.limits.max_num_draft_tokens,
        )

    runner.device.enqueue(forward, "forward")
    runner.device.enqueue(sample, "sample")
    if isinstance(runner.proposer, DraftModelProposer):
        runner.proposer.enqueue_verify(result, plan, staged, runner.sampler, processed)
    runner.device.enqueue(post_update, "post update")
    runner.sampling_state.enqueue_post_update(ib.logits_state_rows, runner.sampler.tokens, runner.outputs.row_valid, num_rows)
    return result


def _prompt_logprobs(runner: EagerRunner, hidden: torch.Tensor, targets: torch.Tensor, num_rows: int, num_top: int) -> LogprobsOutput:
    """Prompt logprobs a chunk of positions at a time: peak memory is PROMPT_CHUNK_ROWS x vocab logits."""
    computer = runner.prompt_logprobs
    out = LogprobsOutput(computer.logprob[:num_rows], computer.rank[:num_rows], computer.top_ids[:num_rows, :num_top],
                         computer.top_logprobs[:num_rows, :num_top])
    chunk = min(PROMPT_CHUNK_ROWS, computer.max_num_rows)
    return prompt_logprobs_chunked(lambda start, end: runner.model.compute_logits(hidden[start:end]), targets, num_rows,
                                   num_top, computer, out, chunk_rows=chunk)
