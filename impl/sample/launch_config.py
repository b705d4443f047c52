"""Launch shapes of the sampling kernels: block sizes, candidate capacities, programs per row.

`default_selection_config` picks wide blocks and enough programs per row to fill a GPU (from its
multiprocessor count), or one program per row with large blocks under the Triton interpreter,
where cost is per operation.  `split_shape` turns a config and a batch size into the split grid.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from impl.device import Device


class LaunchConfigError(ValueError):
    """A launch shape the kernels cannot take (capacity not a power of two, too many splits)."""


@dataclass(frozen=True)
class SelectionConfig:
    """Launch shape shared by the sampler and logprobs kernels (see `default_selection_config`).

    ``block``: chunk of the split passes; ``narrow_block``: chunk of the threshold passes;
    ``candidates``: the sampler's candidate capacity (power of two); ``logprob_candidates``: the
    per-span capacity of the top-n selection; ``pivots``: thresholds tested per narrowing pass;
    ``max_splits``: most programs per row; ``target_programs``: how many programs a launch aims
    for (rows x splits), enough to fill the device; ``num_warps`` for the split passes and
    ``select_num_warps`` for the one-program-per-row threshold selection.
    """

    block: int
    narrow_block: int
    candidates: int
    logprob_candidates: int = 256
    pivots: int = 16
    max_passes: int = 40
    num_warps: int = 8
    select_num_warps: int = 8
    max_splits: int = 16
    target_programs: int = 1


def default_selection_config(device: Device, candidate_capacity: int | None = None) -> SelectionConfig:
    """Wide blocks and enough split programs to fill a GPU; one program per row when interpreted."""
    if device.is_cuda:
        sms = torch.cuda.get_device_properties(device.torch_device).multi_processor_count
        config = SelectionConfig(block=1024, narrow_block=512, candidates=1024, pivots=8, target_programs=4 * sms)
    else:
        config = SelectionConfig(block=512, narrow_block=256, candidates=64, logprob_candidates=64, num_warps=4)
    if candidate_capacity is not None:
        if candidate_capacity < 2 or candidate_capacity & (candidate_capacity - 1):
            raise LaunchConfigError(f"candidate_capacity must be a power of two >= 2, got {candidate_capacity}")
        config = replace(config, candidates=candidate_capacity)
    return config


def split_shape(config: SelectionConfig, num_rows: int, vocab_size: int, block: int,
                num_splits: int | None = None) -> tuple[int, int]:
    """``(splits, split_len)``: programs per row and the columns each covers (a multiple of ``block``).

    ``num_splits`` (at most ``config.max_splits``) overrides the choice from ``target_programs``.
    """
    if num_splits is None:
        num_splits = -(-config.target_programs // max(num_rows, 1))
    elif not 1 <= num_splits <= config.max_splits:
        raise LaunchConfigError(f"num_splits={num_splits} outside [1, {config.max_splits}]")
    wanted = max(1, min(config.max_splits, num_splits, -(-vocab_size // block)))
    split_len = -(-(-(-vocab_size // wanted)) // block) * block
    return -(-vocab_size // split_len), split_len
