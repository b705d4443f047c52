"""What a runner is built from, checked and sized at construction.

`check_limits`: the `RunnerLimits` against the model and the int32 range of the device state (before anything
is allocated); `staging_capacity`: a staging slot's bytes, which must hold the largest per-step staging
allocation; `admission_staging_bytes`: what one admission stages (a mixed bucket's lane room,
`runnercheck.impl.lanes`); `make_proposer`: the runner's own draft proposer from its ``speculative`` config.
Each raises `RunnerConfigError`, the runner's construction-time error.

Ownership: holds no tensor; the proposer `make_proposer` builds owns its own (documented in its module).
"""
from __future__ import annotations

import torch

from runnercheck.impl.device import Device
from runnercheck.impl.device_drafts import ProposerConfigError
from runnercheck.impl.draft_proposer import DraftModelProposer
from runnercheck.impl.input_batch import InputBatch
from runnercheck.impl.interface import DraftModelConfig, NgramConfig, RunnerLimits
from runnercheck.impl.model.weights import ModelConfig, ModelWeights
from runnercheck.impl.ngram_proposer import NgramProposer
from runnercheck.impl.sample.state import SamplingState

_INT32_MAX = 2**31 - 1

# An admission's staged words besides its prompt bitmask and block ids: the row-state diff (3 + 5), the two
# rows' table entries (3 + 3), the eight sampling-parameter cells (8 x 3 + 9), its count-reset row, alignment.
_ADMISSION_WORDS = 64


class RunnerConfigError(ValueError):
    """Limits that do not fit the model or each other (raised at construction)."""


def check_limits(weights: ModelWeights, limits: RunnerLimits) -> None:
    cfg = weights.config
    if limits.vocab_size != cfg.vocab_size:
        raise RunnerConfigError(f"limits.vocab_size {limits.vocab_size} != model vocab_size {cfg.vocab_size}")
    if limits.max_model_len > cfg.max_model_len:
        raise RunnerConfigError(f"limits.max_model_len {limits.max_model_len} > model max_model_len {cfg.max_model_len}")
    for name in ("max_num_reqs", "max_model_len", "max_num_batched_tokens", "num_kv_blocks", "block_size"):
        value = getattr(limits, name)
        if not isinstance(value, int) or value < 1:
            raise RunnerConfigError(f"limits.{name}={value!r} must be an int >= 1")
        if value > _INT32_MAX:  # counts and block ids live in int32 device tensors (and `runnercheck.impl.exact_ints` reads them so)
            raise RunnerConfigError(f"limits.{name}={value} is above {_INT32_MAX}, the int32 range of the device state")
    if limits.max_num_draft_tokens < 0 or limits.max_logprobs < 0:
        raise RunnerConfigError("limits.max_num_draft_tokens and limits.max_logprobs must be >= 0")


def admission_staging_bytes(num_mask_words: int, max_blocks_per_req: int) -> int:
    """The staged bytes of one admitted request: its prompt bitmask (``num_mask_words``), its block ids and the rest."""
    return 4 * (num_mask_words + max_blocks_per_req + _ADMISSION_WORDS)


def staging_capacity(requested: int | None, limits: RunnerLimits, max_blocks_per_req: int) -> int:
    """A staging slot's bytes: ``requested``, else twice the largest per-step staging allocation (at least 1 MiB)."""
    largest_alloc = max(
        4 * limits.max_num_reqs * max_blocks_per_req,
        InputBatch.staging_bytes_needed(limits.max_num_reqs, limits.max_num_batched_tokens, limits.max_num_draft_tokens),
    )
    capacity = requested or max(1 << 20, 2 * largest_alloc)
    if capacity < largest_alloc:
        raise RunnerConfigError(f"staging_bytes {capacity} < {largest_alloc}, the largest per-step staging allocation")
    return capacity


def make_proposer(device: Device, speculative: NgramConfig | DraftModelConfig, limits: RunnerLimits, config: ModelConfig, *,
                  dtype: torch.dtype, sampling_state: SamplingState,
                  input_batch: InputBatch) -> NgramProposer | DraftModelProposer:
    """The proposer ``speculative`` asks for: a draft model (sharing the runner's sampling state and input batch),
    else the n-gram proposer."""
    try:
        if isinstance(speculative, DraftModelConfig):
            return DraftModelProposer(device, speculative, limits, config, dtype=dtype, sampling_state=sampling_state,
                                      input_batch=input_batch)
        return NgramProposer(device, speculative, limits)
    except (ProposerConfigError, ValueError) as e:
        raise RunnerConfigError(f"speculative: {e}") from None
