"""The seed an admitted request samples with, for the runner's host step.

`runnercheck.impl.interface.effective_seed` defines it (the request's own, else one derived from the runner's base seed and the
request id) and stays the reference: the oracle and every other caller use it.  The runner asks `request_seed`,
which derives the seed in C when `runnercheck.impl.native` built `impl/native/seeds.c` (the same BLAKE2b digest without a
hashlib object, bytes and int conversion per admission) and falls back to the reference for anything the C twin
declines.  Owner: nothing here holds state besides the loaded module.
"""
from __future__ import annotations

from runnercheck.impl import native
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.interface import SamplingParams, effective_seed

_seeds = native.load("seeds")  # `derived_seed`, the C twin of the derivation; None: the reference alone


@hot_path
def request_seed(params: SamplingParams, req_id: str, base_seed: int) -> int:
    """`effective_seed(params, req_id, base_seed)`, derived in C when it can be."""
    if params.seed is not None:
        return params.seed
    if _seeds is not None:
        seed = _seeds.derived_seed(base_seed, req_id)
        if seed is not NotImplemented:
            return seed
    return effective_seed(params, req_id, base_seed)
