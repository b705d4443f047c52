"""Speculative-decoding mutants (registered in the `stress.mutants` catalogue) and their workload.

``accepted_count_read_on_host`` models the bug issue 20 names: a runner that reads how many drafts
were accepted on the host inside the step (here to skip the proposer's launch when a step accepted
nothing).  The count is device data produced by the step's own post-update kernel, so the read
waits for the step -- async scheduling is gone -- and on ``sim`` it even reads the count before the
queued work wrote it.  The check built for it is the sync detector.

A runner built without the proposer gets the same read in its step bookkeeping (logging the
counts), so the mutant applies to every runner.

The ``ngram`` workload (`stress.mutant_workloads`) runs the runner's n-gram proposer (`SchedulerConfig.ngram_spec_tokens`):
greedy requests on repeated-pattern prompts, so decodes ask for device drafts every step.
"""
from __future__ import annotations

from typing import Any

import logging

from stress.mutant_registry import AppliedMutant, _mutant

_log = logging.getLogger(__name__)

@_mutant("accepted_count_read_on_host", "sync", ("sync",), "ngram", ("proposer", "outputs"),
         "the step reads the accepted draft counts on the host (.tolist() of num_sampled) to skip the "
         "proposer's launch when nothing was accepted (without a proposer: to log them)")
def _accepted_count_read_on_host(runner: Any, m: AppliedMutant) -> None:
    proposer, num_sampled = runner.proposer, runner.outputs.num_sampled
    if proposer is None:
        record = runner._record_stats

        def record_stats_logging_accepted(step_id: int, num_reqs: int, *args: Any, **kwargs: Any) -> None:
            if num_reqs:
                _log.debug("step %d sampled %s", step_id, num_sampled[:num_reqs].tolist())  # the bug
            record(step_id, num_reqs, *args, **kwargs)

        m.set(runner, "_record_stats", record_stats_logging_accepted)
        return
    enqueue = proposer.enqueue_propose

    def propose_only_after_acceptance(staged: Any, num_reqs: int, num_sampled: Any, *args: Any) -> None:
        counts = num_sampled[:num_reqs].tolist()  # the bug: device data read in the step
        if any(counts):
            enqueue(staged, num_reqs, num_sampled, *args)

    m.set(proposer, "enqueue_propose", propose_only_after_acceptance)
