"""Mutants of processed logprobs (issue 60 item 3): logprobs that do not describe the distribution sampled.

Registered into the catalogue of `runnercheck.stress.mutants.registry` (imported by `runnercheck.stress.mutants.catalogue`),
each killed by the differential on the ``processed-logprobs`` workload (the oracle reports the log of its own
`runnercheck.reference.sampler.distribution`):

* ``processed_logprobs_without_temperature`` -- the kept set is right, the values are the penalised logits
  without the temperature (vLLM's processed logprobs ignored it);
* ``processed_logprobs_before_filters`` -- penalties and temperature but no min-p/top-k/top-p mask: the
  logprobs of a distribution the sampler never drew from (processed before the filters ran);
* ``processed_logprobs_mode_kept_on_reuse`` -- a row keeps its last request's mode: a raw request admitted into
  a row a processed one held reports processed logprobs (stale per-row state, as vLLM #42245's stale prompt
  logprobs with prefix caching).

The first two run a private copy of `runnercheck.impl.kernels.sampling_processed` whose ``_kept_scores`` is
rebound (a device function is bound at compile time: a Python patch cannot reach it), which the target's
`runnercheck.impl.sample.processed.ProcessedScores` launches in place of the real one.

Ownership: this module owns its cache of kernel copies (host, process lifetime, written once per variant).
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import triton
import triton.language as tl

import runnercheck.impl.kernels.sampling_processed  # noqa: F401 - the module the variants copy
from runnercheck.stress.mutants.kernels import _load
from runnercheck.stress.mutants.registry import AppliedMutant, _mutant

_VARIANTS: dict[str, ModuleType] = {}


@triton.jit
def scores_without_temperature(score, bound, temperature):
    divisor = tl.where(temperature == 0.0, 1.0, temperature)
    return tl.where(score >= bound, score * divisor, float("-inf"))


@triton.jit
def scores_before_filters(score, bound, temperature):
    return score


def processed_variant(tag: str, kept_scores: Any) -> ModuleType:
    """A private copy of `runnercheck.impl.kernels.sampling_processed` with ``_kept_scores`` rebound."""
    if tag not in _VARIANTS:
        module = _load(sys.modules["runnercheck.impl.kernels.sampling_processed"].__file__,
                       f"runnercheck.stress._mutant_processed_{tag}")
        vars(module).update(_kept_scores=kept_scores)
        _VARIANTS[tag] = module
    return _VARIANTS[tag]


def _launch_processed_variant(target: Any, m: AppliedMutant, variant: ModuleType) -> None:
    """``target.sampler``'s processed scores launch ``variant``'s kernel, for its own calls only (a run in this
    process after the mutant's keeps the real kernel even without an undo)."""
    import runnercheck.impl.sample.processed as module

    scores = target.sampler.processed
    launch = scores.launch

    def launch_with_variant(*args: Any, **kwargs: Any) -> Any:
        original = module.processed_scores_kernel
        module.processed_scores_kernel = variant.processed_scores_kernel
        try:
            return launch(*args, **kwargs)
        finally:
            module.processed_scores_kernel = original

    m.set(scores, "launch", launch_with_variant)


@_mutant("processed_logprobs_without_temperature", "sampler", ("differential",), "processed-logprobs", ("sampler",),
         "processed logprobs from the penalised logits without the temperature (the kept set right, the values not)")
def _without_temperature(target: Any, m: AppliedMutant) -> None:
    _launch_processed_variant(target, m, processed_variant("no_temperature", scores_without_temperature))


@_mutant("processed_logprobs_before_filters", "sampler", ("differential",), "processed-logprobs", ("sampler",),
         "processed logprobs taken before min-p/top-k/top-p: normalised over tokens the sampler could not draw")
def _before_filters(target: Any, m: AppliedMutant) -> None:
    _launch_processed_variant(target, m, processed_variant("before_filters", scores_before_filters))


@_mutant("processed_logprobs_mode_kept_on_reuse", "state", ("differential",), "processed-logprobs", ("sampling_state",),
         "a reused row keeps its last request's logprobs mode: a raw request there reports processed logprobs")
def _mode_kept_on_reuse(target: Any, m: AppliedMutant) -> None:
    state = target.sampling_state
    note = state.note_logprobs_mode

    def note_processed_only(row: int, processed: bool) -> None:
        if processed:  # the reset to raw is the step that got lost
            note(row, True)

    m.set(state, "note_logprobs_mode", note_processed_only)


__all__ = ["processed_variant", "scores_before_filters", "scores_without_temperature"]
