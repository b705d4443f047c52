"""Private copies of the sampling kernel for the kernel-level mutants in `runnercheck.stress.mutants.catalogue`.

A kernel bug cannot be planted by patching a Python attribute: the kernel calls its device functions
by name at compile time.  So a mutant loads a private copy of `runnercheck.impl.kernels.sampling` (registered in
``sys.modules`` under ``runnercheck.stress._mutant_sampling_<tag>``) with one device function rebound, and
`launch_variant` makes one sampler launch that copy's kernels for its own calls only.  The rebound
device functions live here: `fp16_gumbel_noise`, `u24_gumbel_noise`, and `strict_top_p_threshold`
(generated from `runnercheck.impl.kernels.sampling._filtered_threshold`'s signature).

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
from runnercheck.impl.kernels.rng import neg_log1p_neg, philox_64bits, uniform_from_bits
from runnercheck.impl.kernels.sampling_select import next_float_up

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


# The `gumbel_noise` device function of the ``fp16_gumbel_noise`` mutant.
@triton.jit
def fp16_gumbel_noise(seed, position, token_id):
    hi, lo = philox_64bits(seed, position, token_id, 0)
    u = uniform_from_bits(hi, lo).to(tl.float16).to(tl.float32)
    return (-tl.log(neg_log1p_neg(u))).to(tl.float16).to(tl.float32)


# The `gumbel_noise` device function of the ``u24_uniform`` mutant.
@triton.jit
def u24_gumbel_noise(seed, position, token_id):
    hi, lo = philox_64bits(seed, position, token_id, 0)
    u = (hi >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2^-24: torch.rand-style, can be exactly 0
    return -tl.log(neg_log1p_neg(u))


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
