"""Speculative-decoding mutants (registered in the `runnercheck.stress.mutants.catalogue` catalogue) and their workload.

``accepted_count_read_on_host`` models the bug issue 20 names: a runner that reads how many drafts
were accepted on the host inside the step (here to skip the proposer's launch when a step accepted
nothing).  The count is device data produced by the step's own post-update kernel, so the read
waits for the step -- async scheduling is gone -- and on ``sim`` it even reads the count before the
queued work wrote it.  The check built for it is the sync detector.

A runner built without the proposer gets the same read in its step bookkeeping (logging the
counts), so the mutant applies to every runner.

The ``ngram`` workload (`runnercheck.stress.mutants.workloads`) runs the runner's n-gram proposer (`SchedulerConfig.ngram_spec_tokens`):
greedy requests on repeated-pattern prompts, so decodes ask for device drafts every step.

The rejection-sampling biases of `runnercheck.checks.chisq.spec.SPEC_BIASES`, planted in the runner's
draft-model verification (`runnercheck.impl.draft_proposer`): the proposer's `SpecVerifier.verify` is replaced,
for that runner only, by the float64 twin `runnercheck.checks.chisq.spec.SpecTwin` with one knob turned,
run per request on the device inside the step's verify closure (its outputs land in the verifier's
own buffers, which the scatter kernel reads as usual).  Each is killed by the differential on the
``draft-model`` workload (temperatures 2.5..4, micro-draft: some, all and no drafts accepted):

* ``spec_accept_ratio_normalised`` -- accepting ``d`` with ``p(d)/q(d)`` *without the min* is not
  observable: the test ``u < p/q`` with ``u`` in ``[0, 1)`` accepts every ``p/q >= 1`` either way.
  The observable form of an unclamped ratio is to "normalise" it into [0, 1] by its row maximum
  ``max_t p_t/q_t`` (the chi-square bias ``normalised-ratio``): it accepts too rarely;
* ``spec_residual_abs`` -- the residual ``|p - q|`` instead of ``max(0, p - q)``;
* ``spec_accept_uses_draft_noise`` -- the accept test's uniform taken from the draft stream's bits
  of the draft token (the very noise that made it win);
* ``spec_bonus_dropped`` -- all drafts accepted and no bonus token emitted.  The step's last token is then the
  twin's -1, which the proposer feeds to the draft model in the same step: on ``sim`` its embedding lookup raises
  (a runner error, the differential's), on cuda the lookup's device-side assert is the memory detector's finding.

On cuda the twin's masked writes wait on the device inside a named `allow_host_sync` scope (the
planting's own plumbing), so there too the differential must be what kills them.
"""
from __future__ import annotations

from typing import Any

import logging

from runnercheck.stress.mutants.kernels import MutantTargetError
from runnercheck.stress.mutants.registry import AppliedMutant, _mutant

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


def _plant_biased_verifier(runner: Any, m: AppliedMutant, **variant: str) -> None:
    """Replace the draft-model proposer's `SpecVerifier.verify` by `SpecTwin` with ``variant``."""
    import torch

    from runnercheck.checks.chisq.spec import SpecTwin, SpecVariant
    from runnercheck.checks.detectors.sync import allow_host_sync
    from runnercheck.impl.draft_proposer import DraftModelProposer
    from runnercheck.impl.sample.spec_verify import SpecVerifyOutput

    proposer = getattr(runner, "proposer", None)
    if not isinstance(proposer, DraftModelProposer):
        raise MutantTargetError("a rejection-sampling mutant needs a runner with the draft-model proposer")
    verifier, twin = proposer.verifier, SpecTwin(SpecVariant(**variant), name=f"spec-twin {variant}")

    def biased_verify(target_probs: Any, draft_probs: Any, draft_tokens: Any, cu: Any, idx_mapping: Any, seeds: Any,
                      temperature: Any, positions: Any, *, num_drafts: Any) -> SpecVerifyOutput:
        counts = list(num_drafts)
        tokens, accepted = verifier.tokens[: len(counts)], verifier.accepted[: len(counts)]
        tokens.fill_(-1)
        start = 0
        # The twin is a float64 torch stand-in for the verify kernel: its masked writes wait on the
        # device, which is plumbing of the planting, not the bug under test (a distribution the
        # differential must see), so the sync detector is told so by name.
        with torch.device(target_probs.device), allow_host_sync("SpecTwin stand-in for the verify kernel (mutant)"):
            for r, k in enumerate(counts):  # one request at a time: host ints only, no device read
                p = target_probs[start + r : start + r + k + 1].double().unsqueeze(0)
                q = draft_probs[start : start + k].double().unsqueeze(0)
                d = draft_tokens[start : start + k].long().unsqueeze(0)
                seed = seeds.index_select(0, idx_mapping[r : r + 1].long())
                got, acc = twin(p, d, q, seed, positions[r : r + 1])
                tokens[r, : k + 1] = got[0]
                accepted[r] = acc[0]
                start += k
        return SpecVerifyOutput(tokens, accepted)

    m.set(verifier, "verify", biased_verify)
    # The twin is host-driven (per-request host ints): no CUDA graph could hold it, so bucketed steps run their
    # launches eagerly (recorded closures on sim would reach it anyway; captured CUDA graphs would not).
    graphs = getattr(runner, "graphs", None)
    if graphs is not None:
        m.set(graphs, "enabled", False)


_SPEC_REQUIRES = ("proposer",)


@_mutant("spec_accept_ratio_normalised", "sampler", ("differential",), "draft-model", _SPEC_REQUIRES,
         "rejection sampling accepts with the ratio p/q unclamped, 'normalised' by its row maximum (the min(1, p/q) "
         "dropped; without the normalisation it would not be observable)")
def _spec_accept_ratio_normalised(runner: Any, m: AppliedMutant) -> None:
    _plant_biased_verifier(runner, m, accept="normalised-ratio")


@_mutant("spec_residual_abs", "sampler", ("differential",), "draft-model", _SPEC_REQUIRES,
         "after a rejection the resample draws from |p - q| instead of max(0, p - q)")
def _spec_residual_abs(runner: Any, m: AppliedMutant) -> None:
    _plant_biased_verifier(runner, m, residual="abs")


@_mutant("spec_accept_uses_draft_noise", "sampler", ("differential",), "draft-model", _SPEC_REQUIRES,
         "the accept test's uniform comes from the draft stream's bits of the draft token (the noise that chose it)")
def _spec_accept_uses_draft_noise(runner: Any, m: AppliedMutant) -> None:
    _plant_biased_verifier(runner, m, accept="draft-noise")


@_mutant("spec_bonus_dropped", "sampler", ("differential", "memory"), "draft-model", _SPEC_REQUIRES,
         "when every draft is accepted no bonus token is emitted")
def _spec_bonus_dropped(runner: Any, m: AppliedMutant) -> None:
    _plant_biased_verifier(runner, m, bonus="dropped")
