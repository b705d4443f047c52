"""Reach mutants (issue 60): realistic bugs that survived only because the main job's traffic never
reached their code.  Each is killed by ``runnercheck mutants --campaign verify --quick`` on sim
(the runs of ``verify --quick``) through the traffic that now reaches it, and by the catalogue's own
campaign under the ``reach`` workload (the same faults and lag mix, short):

* ``neg_inf_row_not_token_zero`` (sampler): the no-finite-entry rule is keyed on "every entry NaN";
  a row of NaN and -Inf goes through the max reduction, which keeps the last index -- reached by
  the whole-row logits faults (`runnercheck.stress.sim.faults`, NaN/-Inf rows);
* ``output_read_before_event`` (race): ``get()`` decodes the pinned output slot without waiting on
  the step's event when it is called right after the step -- reached by verify's lag-k runs and,
  in default ``stress`` and the ``reach`` workload, by the random-drain mix that holds whole steps
  (`runnercheck.stress.sim.lag_mix`): the slot still holds an older step's output (the output-slot
  lifetime check sees the early read too);
* ``block_leaked_on_release`` (state, scheduler): the scheduler's release of a request's blocks
  drops its last block's reference nowhere (an off-by-one ``blocks[:-1]``): the pool leaks, which
  no KV read ever shows; `runnercheck.stress.sim.scheduler.SchedulerSim.check_invariants`, now run
  at every step of every run (`runnercheck.stress.run.driver.DifferentialRun.check_scheduler`),
  kills it as a ``scheduler-invariant`` divergence with a repro;
* ``top_k_tie_keeps_first_k`` (sampler): top-k keeps exactly k entries (a stable sort's first k)
  where the contract keeps every entry tied at the k-th value -- reached only by an exact tie at
  the k-th logit: the exact-tie rows of the logits faults (four entries at the top) sampled by a
  request with top-k 1..3 (`runnercheck.stress.sim.churn.ChurnConfig.tie_top_k_prob`; own workload
  ``top-k-ties``);
* ``prompt_logprobs_full_chunk_drops_last_row`` (state): the prompt-logprob chunk loop's end is
  inclusive, so a chunk that is full (the step's prompt-logprob rows equal the token budget, the
  runner's chunk size) never scores its last row -- reached by the full-chunk prompts
  (`ChurnConfig.full_chunk_prob`; own workload ``full-chunk``);
* ``draft_rejection_keeps_target_sample`` (sampler): at a rejected draft the step emits the
  target sampler's own token instead of the verifier's resample from max(0, p - q) -- reached by
  the draft-model run of ``verify --quick`` on sim (mostly rejected drafts: every rejection
  changes a token); a runner without the draft-model proposer has nothing to patch.

Registered into the catalogue (`runnercheck.stress.mutants.registry.CATALOGUE`) when
`runnercheck.stress.mutants.catalogue` is imported.
"""
from __future__ import annotations

from typing import Any

import torch

from runnercheck.stress.mutants.registry import AppliedMutant, _mutant


def _recapture(target: Any, m: AppliedMutant) -> None:
    from runnercheck.stress.mutants.graphs import recapture_graphs

    recapture_graphs(target, m)  # bucketed steps replay captured launches: capture them with the bug


@_mutant("neg_inf_row_not_token_zero", "sampler", ("differential",), "reach", ("sampler",),
         "the no-finite-entry rule fires only when every logit is NaN: a row of NaN and -Inf (no +Inf) "
         "samples the last index (a max reduction keeping the later of equal -inf scores) instead of token 0")
def _neg_inf_row_not_token_zero(target: Any, m: AppliedMutant) -> None:
    sampler = target.sampler
    sample = sampler.sample

    def sample_keyed_on_all_nan(logits: Any, state: Any, rows: Any, positions: Any, *, num_rows: int,
                                **kwargs: Any) -> Any:
        rows_in = logits[:num_rows]
        # Read before the sampler runs (it may clean the logits in place); device ops only.
        no_finite = ~torch.isfinite(rows_in).any(dim=-1) & ~torch.isposinf(rows_in).any(dim=-1)
        wrong = no_finite & ~torch.isnan(rows_in).all(dim=-1)
        out = sample(logits, state, rows, positions, num_rows=num_rows, **kwargs)
        last = torch.full_like(out.tokens[:num_rows], logits.shape[-1] - 1)
        out.tokens[:num_rows] = torch.where(wrong, last, out.tokens[:num_rows])
        return out

    m.set(sampler, "sample", sample_keyed_on_all_nan)
    _recapture(target, m)


@_mutant("output_read_before_event", "race", ("lifetime", "differential"), "reach", ("outputs",),
         "get() decodes the pinned output slot without waiting on the step's event (the event is taken as "
         "complete when get() follows the step): the slot still holds an older step's output")
def _output_read_before_event(runner: Any, m: AppliedMutant) -> None:
    outputs = runner.outputs
    enqueue = outputs.enqueue_copy_out

    def copy_out_with_unwaited_get(*args: Any, **kwargs: Any) -> Any:
        result = enqueue(*args, **kwargs)

        def get_without_wait() -> Any:
            if result._result is None:
                result._materialise()
            return result._result

        result.get = get_without_wait
        return result

    m.set(outputs, "enqueue_copy_out", copy_out_with_unwaited_get)


@_mutant("block_leaked_on_release", "state", ("differential",), "row-reuse", ("blocks",),
         "the scheduler releases a finished or preempted request's blocks except the last (blocks[:-1]): the "
         "pool leaks one block per release, which no KV read shows", target="scheduler")
def _block_leaked_on_release(scheduler: Any, m: AppliedMutant) -> None:
    cache = scheduler.blocks
    release = cache.release

    def release_all_but_last(blocks: Any) -> None:
        release(list(blocks)[:-1])

    m.set(cache, "release", release_all_but_last)


@_mutant("top_k_tie_keeps_first_k", "sampler", ("differential",), "top-k-ties", ("sampler",),
         "top-k keeps exactly k entries (torch.topk's, ties broken by the lower index) instead of every entry tied at "
         "the k-th value (the contract's 'ties at t_k all kept'; the path split of vLLM #50979): only an exact tie at "
         "the k-th logit shows it")
def _top_k_tie_keeps_first_k(target: Any, m: AppliedMutant) -> None:
    sampler = target.sampler
    sample = sampler.sample

    def sample_keeping_first_k(logits: Any, state: Any, rows: Any, positions: Any, *, num_rows: int, **kwargs: Any) -> Any:
        x = logits[:num_rows]
        vocab = x.shape[-1]
        # Device ops only (no host read): the entries tied at the k-th value that a stable descending sort puts at
        # rank k or later, in rows whose top-k is on (finite rows: the NaN rule decides the others).
        k = state.top_k.base.index_select(0, rows[:num_rows].long().clamp(min=0)).long()
        on = (k >= 1) & (k < vocab) & torch.isfinite(x).all(dim=-1)
        values, order = torch.sort(x, dim=-1, descending=True, stable=True)
        kth = values.gather(1, (k.clamp(1, vocab) - 1)[:, None])
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(vocab, device=x.device).expand_as(order))
        dropped = on[:, None] & (x == kth) & (rank >= k[:, None])
        masked = logits.clone()
        masked[:num_rows] = torch.where(dropped, torch.full_like(x, float("-inf")), x)
        # The token from the exact-k path; everything else (logprobs of the raw logits, flags) from the real call.
        kept = sample(masked, state, rows, positions, num_rows=num_rows, **kwargs).tokens[:num_rows].clone()
        out = sample(logits, state, rows, positions, num_rows=num_rows, **kwargs)
        out.tokens[:num_rows] = torch.where(dropped.any(dim=-1), kept, out.tokens[:num_rows])
        return out

    m.set(sampler, "sample", sample_keeping_first_k)
    _recapture(target, m)


@_mutant("prompt_logprobs_full_chunk_drops_last_row", "state", ("differential",), "full-chunk", ("prompt_logprobs",),
         "prompt logprobs' chunk end is computed inclusively (start + chunk_rows - 1, clamped to the rows): a step whose "
         "prompt-logprob rows fill the chunk (the token budget) never scores its last row, which keeps an older "
         "step's values")
def _prompt_logprobs_full_chunk_drops_last_row(runner: Any, m: AppliedMutant) -> None:
    import runnercheck.impl.eager_step as eager_step_module
    from runnercheck.impl.sample.logprobs import LogprobsOutput

    chunked, computer = eager_step_module.prompt_logprobs_chunked, runner.prompt_logprobs

    def chunked_with_inclusive_end(compute_logits: Any, target_ids: Any, num_positions: int, num_top: int,
                                   owner: Any, out: Any, chunk_rows: int | None = None) -> Any:
        if owner is not computer:  # another runner in this process: untouched
            return chunked(compute_logits, target_ids, num_positions, num_top, owner, out, chunk_rows)
        chunk_rows = chunk_rows or owner.max_num_rows
        for start in range(0, num_positions, chunk_rows):
            end = min(start + chunk_rows - 1, num_positions)  # the bug: an inclusive end where an exclusive one was meant
            chunk_out = LogprobsOutput(out.logprob[start:end], out.rank[start:end], out.top_ids[start:end],
                                       out.top_logprobs[start:end])
            owner.launch(compute_logits(start, end), target_ids[start:end], end - start, num_top, out=chunk_out)
        return out

    m.set(eager_step_module, "prompt_logprobs_chunked", chunked_with_inclusive_end)


@_mutant("draft_rejection_keeps_target_sample", "sampler", ("differential",), "draft-model", ("proposer", "sampler"),
         "at a rejected draft the step emits the target sampler's own token for that position instead of the "
         "verifier's resample from max(0, p - q) (the 'recovered' token): tokens the draft model favours come out "
         "too often")
def _draft_rejection_keeps_target_sample(runner: Any, m: AppliedMutant) -> None:
    import runnercheck.impl.draft_proposer as draft_proposer_module
    from runnercheck.impl.draft_proposer import DraftModelProposer

    if not isinstance(getattr(runner, "proposer", None), DraftModelProposer):
        return  # the bug lives in the draft-model proposer's verification: a runner without one cannot have it
    scatter, own_tokens = draft_proposer_module.launch_scatter_verified, runner.sampler.tokens

    def scatter_keeping_target_sample(*, rows: Any, draft_start: Any, logits_start: Any, temperature: Any, verified: Any,
                                      accepted: Any, sampled: Any, drafts: Any, num_reqs: int) -> None:
        args = dict(rows=rows, draft_start=draft_start, logits_start=logits_start, temperature=temperature,
                    verified=verified, accepted=accepted, sampled=sampled, drafts=drafts, num_reqs=num_reqs)
        if sampled is not own_tokens:  # another runner in this process: untouched
            return scatter(**args)
        # Device ops only: the logit row of each request's first rejected draft, and the target's token there.
        num_accepted = accepted[:num_reqs].long()
        num_drafts = (draft_start[1 : num_reqs + 1] - draft_start[:num_reqs]).long()
        at = (logits_start[:num_reqs].long() + num_accepted.clamp(min=0)).clamp(max=sampled.shape[0] - 1)
        target_token = sampled.index_select(0, at).clone()
        scatter(**args)
        rejected = (num_drafts > 0) & (num_accepted < num_drafts) & (temperature.index_select(0, rows[:num_reqs].long()) != 0)
        sampled.index_copy_(0, at, torch.where(rejected, target_token, sampled.index_select(0, at)))

    m.set(draft_proposer_module, "launch_scatter_verified", scatter_keeping_target_sample)
    _recapture(runner, m)


REACH_MUTANTS = ("neg_inf_row_not_token_zero", "output_read_before_event",
                 "block_leaked_on_release", "top_k_tie_keeps_first_k", "prompt_logprobs_full_chunk_drops_last_row",
                 "draft_rejection_keeps_target_sample")

__all__ = ["REACH_MUTANTS"]
