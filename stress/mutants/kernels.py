"""Private copies of the sampling kernel for the kernel-level mutants in `runnercheck.stress.mutants.catalogue`.

A kernel bug cannot be planted by patching a Python attribute: the kernel calls its device functions
by name at compile time.  So a mutant loads a private copy of `runnercheck.impl.kernels.sampling` (registered in
``sys.modules`` under ``runnercheck.stress._mutant_sampling_<tag>``) with one device function rebound, and
`launch_variant` makes one sampler launch that copy's kernels for its own calls only.  The rebound
device functions live here: the precision bugs (`fp16_chunk_argmax` / `fp16_gumbel_noise`,
`u24_chunk_argmax` / `u24_gumbel_noise`: the whole noise of a chunk and of a candidate list
computed wrongly, dense, as a sampler with that bug would), RNG contract v2's own failure modes
(`V2_KERNEL_MUTANTS`: refinement skipped for all but the top candidate, lo words from the hi
stream, lo words from the accept stream; killed by `runnercheck.checks.chisq.refinement`'s bitwise
probe), and `strict_top_p_threshold` (generated from
`runnercheck.impl.kernels.sampling._filtered_threshold`'s signature).

Ownership: this module owns the cache of kernel copies (host, process lifetime, written once per
variant) and the temporary folder of the generated wrapper (removed at exit).
"""
from __future__ import annotations

import atexit
import importlib.util
import inspect
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import triton
import triton.language as tl

import runnercheck.impl.kernels.sampling  # noqa: F401 - the module the kernel variants copy
from runnercheck.impl.kernels.rng import (
    ACCEPT_STREAM, NOISE_STREAM, gumbel_from_bits, neg_log1p_neg, noise_hi_at, noise_hi_chunk,
    noise_lo, philox4x32, uniform_from_bits,
)
from runnercheck.impl.kernels.sampling_select import next_float_up, scale_by_temperature

if TYPE_CHECKING:
    from runnercheck.stress.mutants.registry import AppliedMutant


# Defined here because the kernel machinery raises it and `runnercheck.stress.mutants.catalogue` (which re-exports it)
# imports this module.
class MutantTargetError(ValueError):
    """The object a mutant is applied to lacks the parts the mutant patches (e.g. not an `impl` runner)."""


_KERNEL_VARIANTS: dict[str, ModuleType] = {}


def _load(path: Path | str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # registered like any import: Triton and inspect may look a kernel's module up
    spec.loader.exec_module(module)
    return module


def sampling_kernels_variant(tag: str, **rebound: Any) -> ModuleType:
    """A private copy of `runnercheck.impl.kernels.sampling` with device functions rebound (its kernels compile afresh)."""
    if tag not in _KERNEL_VARIANTS:
        module = _load(sys.modules["runnercheck.impl.kernels.sampling"].__file__, f"runnercheck.stress._mutant_sampling_{tag}")
        vars(module).update(rebound)
        _KERNEL_VARIANTS[tag] = module
    return _KERNEL_VARIANTS[tag]


def launch_variant(target: Any, m: "AppliedMutant", variant: ModuleType) -> None:
    """``target.sampler`` launches ``variant``'s kernels in place of `runnercheck.impl.kernels.sampling`'s, for its own calls only."""
    sampler = target.sampler
    sample = sampler.sample
    module = sys.modules[type(sampler).__module__]
    base = sys.modules["runnercheck.impl.kernels.sampling"]
    kernels = {name: getattr(variant, name) for name, value in vars(module).items()
               if getattr(base, name, None) is value and isinstance(value, triton.runtime.KernelInterface)}
    if not kernels:
        raise MutantTargetError(f"{module.__name__} launches no kernel of impl.kernels.sampling")

    def sample_with_variant(*args: Any, **kwargs: Any) -> Any:
        originals = {name: getattr(module, name) for name in kernels}
        vars(module).update(kernels)
        try:
            return sample(*args, **kwargs)
        finally:
            vars(module).update(originals)

    m.set(sampler, "sample", sample_with_variant)


@triton.jit
def _fp16_noise(hi, lo):
    u = uniform_from_bits(hi, lo).to(tl.float16).to(tl.float32)
    return (-tl.log(neg_log1p_neg(u))).to(tl.float16).to(tl.float32)


@triton.jit
def _u24_noise(hi):
    u = (hi >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2^-24: torch.rand-style, can be exactly 0
    return -tl.log(neg_log1p_neg(u))


@triton.jit
def _dense_argmax(score, key, offs, start):
    key = tl.where(score > float("-inf"), key, float("-inf"))
    best = tl.max(key, axis=0)
    return best, tl.min(tl.where(key == best, offs, 2147483647), axis=0) + start * 0


@triton.jit
def _chunk_scores_of(score, temperature, LOGITS: tl.constexpr):
    """The scores `_noisy_chunk_argmax` is given: as they are, or (LOGITS) the logits scaled as its reload does."""
    if LOGITS:
        score = scale_by_temperature(score, temperature, True)
    return score


# The ``fp16_gumbel_noise`` mutant: `_noisy_chunk_argmax` and `gumbel_noise` of the sampling copy.
@triton.jit
def fp16_chunk_argmax(score, offs, seed, position, start, m, logits_row, temperature, reload, CHUNK: tl.constexpr,
                      LOGITS: tl.constexpr = False):
    score = _chunk_scores_of(score, temperature, LOGITS)
    hi = noise_hi_chunk(seed, position, start, CHUNK)
    return _dense_argmax(score, score + _fp16_noise(hi, noise_lo(seed, position, offs)), offs, start)


@triton.jit
def fp16_gumbel_noise(seed, position, token_id):
    return _fp16_noise(noise_hi_at(seed, position, token_id), noise_lo(seed, position, token_id))


# The ``u24_uniform`` mutant: the same two device functions.
@triton.jit
def u24_chunk_argmax(score, offs, seed, position, start, m, logits_row, temperature, reload, CHUNK: tl.constexpr,
                     LOGITS: tl.constexpr = False):
    score = _chunk_scores_of(score, temperature, LOGITS)
    return _dense_argmax(score, score + _u24_noise(noise_hi_chunk(seed, position, start, CHUNK)), offs, start)


@triton.jit
def u24_gumbel_noise(seed, position, token_id):
    return _u24_noise(noise_hi_at(seed, position, token_id))


# RNG contract v2's failure modes (`V2_KERNEL_MUTANTS`).
@triton.jit
def refine_reference_only(score, offs, candidate, count, seed, position, best, best_token, logits_row, temperature,
                          reload):
    """`sampling._refine_candidates` that refines no candidate: the chunk's reference lane (the smallest
    bound-based estimate, refined before the candidates are) always wins."""
    return best, best_token


@triton.jit
def lo_from_hi_stream(seed, position, token_id):
    """`noise_lo` drawn from the hi words' stream: token t's lo is token 4t's hi."""
    c0, c1, c2, c3 = philox4x32(seed, token_id, position, NOISE_STREAM)
    return c0


@triton.jit
def gumbel_noise_lo_from_hi_stream(seed, position, token_id):
    return gumbel_from_bits(noise_hi_at(seed, position, token_id), lo_from_hi_stream(seed, position, token_id))


@triton.jit
def lo_from_accept_stream(seed, position, token_id):
    """`noise_lo` drawn from the speculative accept stream: token 0's lo is the accept test's hi word."""
    c0, c1, c2, c3 = philox4x32(seed, token_id, position, ACCEPT_STREAM)
    return c0


@triton.jit
def gumbel_noise_lo_from_accept_stream(seed, position, token_id):
    return gumbel_from_bits(noise_hi_at(seed, position, token_id), lo_from_accept_stream(seed, position, token_id))


# name -> (description, the sampling copy's rebound device functions)
V2_KERNEL_MUTANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "v2_refine_top_only": ("refinement skipped for every candidate but the reference (the largest bound on the key)",
                           {"_refine_candidates": refine_reference_only}),
    "v2_lo_from_hi_stream": ("lo words drawn from the hi words' stream (token t's lo = token 4t's hi)",
                             {"noise_lo": lo_from_hi_stream, "gumbel_noise": gumbel_noise_lo_from_hi_stream}),
    "v2_lo_from_accept_stream": ("lo words drawn from the speculative accept stream",
                                 {"noise_lo": lo_from_accept_stream, "gumbel_noise": gumbel_noise_lo_from_accept_stream}),
}


def v2_kernel_variant(name: str) -> ModuleType:
    """The sampling copy of one `V2_KERNEL_MUTANTS` entry (for `launch_variant`)."""
    return sampling_kernels_variant(name, **V2_KERNEL_MUTANTS[name][1])


def strict_top_p_threshold() -> Any:
    """`runnercheck.impl.kernels.sampling._filtered_threshold` wrapped so its top-p comparison is strict.

    The wrapper is generated with the wrapped function's exact signature (written to a file: Triton
    reads kernel source), so it follows the kernel's edits; it relies only on ``row_max`` and
    ``top_p_on`` among the parameters and on the ``(threshold, use_candidates, candidates)`` result.
    """
    if "strict_top_p_threshold" not in _KERNEL_VARIANTS:
        spec = sys.modules["runnercheck.impl.kernels.sampling"]._filtered_threshold
        params = inspect.signature(spec.fn).parameters
        if not {"row_max", "top_p_on"} <= set(params):
            raise MutantTargetError("runnercheck.impl.kernels.sampling._filtered_threshold no longer takes row_max and top_p_on")
        declared = ", ".join(f"{n}: tl.constexpr" if p.annotation in ("tl.constexpr", tl.constexpr) else n
                             for n, p in params.items())
        folder = Path(tempfile.mkdtemp(prefix="runnercheck-mutant-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        (folder / "strict_top_p.py").write_text(
            "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
            f"def strict_top_p_threshold({declared}):\n"
            f"    threshold, use_candidates, candidates = spec_filtered_threshold({', '.join(params)})\n"
            "    # bounded by row_max so the top token stays: an empty kept set would emit an id past the vocabulary\n"
            "    strict = tl.minimum(next_float_up(threshold), row_max)\n"
            "    return tl.where(top_p_on, strict, threshold), use_candidates, candidates\n")
        module = _load(folder / "strict_top_p.py", "runnercheck.stress._mutant_strict_top_p")
        module.spec_filtered_threshold, module.next_float_up = spec, next_float_up
        _KERNEL_VARIANTS["strict_top_p_threshold"] = module
    return _KERNEL_VARIANTS["strict_top_p_threshold"].strict_top_p_threshold
