"""Speculative-decoding mutants (registered in the `stress.mutants` catalogue) and their workload.

``accepted_count_read_on_host`` models the bug issue 20 names: a runner that reads how many drafts
were accepted on the host inside the step (here to skip the proposer's launch when a step accepted
nothing).  The count is device data produced by the step's own post-update kernel, so the read
waits for the step -- async scheduling is gone -- and on ``sim`` it even reads the count before the
queued work wrote it.  The check built for it is the sync detector.

The ``ngram`` workload runs the runner's n-gram proposer (`SchedulerConfig.ngram_spec_tokens`):
greedy requests on repeated-pattern prompts, so decodes ask for device drafts every step.
"""
from __future__ import annotations

from typing import Any

from stress.churn import ChurnConfig
from stress.mutant_registry import AppliedMutant, _mutant
from stress.mutant_workloads import WORKLOADS, Workload

WORKLOADS["ngram"] = Workload(
    "ngram", "greedy requests on repeated-pattern prompts, the n-gram proposer on (3 device drafts a decode)",
    ChurnConfig(add_prob=0.8, abort_prob=0.0, preempt_prob=0.05, top_k_prob=0.0, top_p_prob=0.0, min_p_prob=0.0,
                penalty_prob=0.0, logprobs_prob=0.0, prompt_logprobs_prob=0.0, stop_prob=0.0, greedy_prob=1.0,
                max_prompt_len=10, max_new_tokens=12, repetitive_prompt_prob=1.0),
    max_num_reqs=2, max_batched_tokens=8, ngram_spec_tokens=3, ticks=12, full_ticks=40)


@_mutant("accepted_count_read_on_host", "sync", ("sync",), "ngram", ("proposer",),
         "the step reads the accepted draft counts on the host (.tolist() of num_sampled) to skip the "
         "proposer's launch when nothing was accepted")
def _accepted_count_read_on_host(runner: Any, m: AppliedMutant) -> None:
    proposer = runner.proposer
    if proposer is None:
        from stress.mutant_kernels import MutantTargetError

        raise MutantTargetError("accepted_count_read_on_host needs a runner built with the n-gram proposer")
    enqueue = proposer.enqueue_propose

    def propose_only_after_acceptance(staged: Any, num_reqs: int, num_sampled: Any, *args: Any) -> None:
        counts = num_sampled[:num_reqs].tolist()  # the bug: device data read in the step
        if any(counts):
            enqueue(staged, num_reqs, num_sampled, *args)

    m.set(proposer, "enqueue_propose", propose_only_after_acceptance)
