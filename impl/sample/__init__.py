"""GPU-native sampling: per-row sampling state, the Triton sampler, and logprobs (docs/SAMPLING.md)."""
from impl.sample.launch_config import LaunchConfigError, SelectionConfig, default_selection_config, split_shape
from impl.sample.logprobs import LogprobsComputer, LogprobsError, LogprobsOutput, prompt_logprobs_chunked, token_logprobs
from impl.sample.sampler import Sampler, SamplerError, SamplerOutput
from impl.sample.state import SamplingState, SamplingStateError, prompt_bitmask_words

__all__ = [
    "LaunchConfigError", "LogprobsComputer", "LogprobsError", "LogprobsOutput", "SelectionConfig",
    "default_selection_config", "split_shape",
    "prompt_logprobs_chunked", "token_logprobs", "Sampler", "SamplerError", "SamplerOutput", "SamplingState",
    "SamplingStateError", "prompt_bitmask_words",
]
