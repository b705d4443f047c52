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
  kills it as a ``scheduler-invariant`` divergence with a repro.

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


REACH_MUTANTS = ("neg_inf_row_not_token_zero", "output_read_before_event",
                 "block_leaked_on_release")

__all__ = ["REACH_MUTANTS"]
