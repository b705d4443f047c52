"""GPU-native sampling: per-row sampling state, the Triton sampler, and logprobs (docs/SAMPLING.md)."""
from runnercheck.impl.sample.logprobs import (
    LogprobsComputer,
    LogprobsError,
    LogprobsOutput,
    SelectionConfig,
    default_selection_config,
    prompt_logprobs_chunked,
    token_logprobs,
)
from runnercheck.impl.sample.sampler import Sampler, SamplerError, SamplerOutput
from runnercheck.impl.sample.state import SamplingState, SamplingStateError, prompt_bitmask_words

__all__ = [
    "LogprobsComputer", "LogprobsError", "LogprobsOutput", "SelectionConfig", "default_selection_config",
    "prompt_logprobs_chunked", "token_logprobs", "Sampler", "SamplerError", "SamplerOutput", "SamplingState",
    "SamplingStateError", "prompt_bitmask_words",
]
