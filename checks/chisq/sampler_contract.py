"""The seam between the statistics and a sampler someone else wrote: what it may decline, what it
must return.

A third-party sampler may implement only part of `SamplingParams`.  It says so in one of two ways:

* it declares ``supported_params``: the `SamplingParams` fields it implements (e.g.
  ``{"temperature", "top_k", "top_p"}``); a case that sets any other field away from its default is
  skipped before the sampler is called, with the fields named;
* or it raises `runnercheck.checks.chisq.samplers.SamplerUnsupportedError` from a call; the case is then skipped with
  the error's message as the reason.

It may also bound its batch with a ``max_rows_per_call`` attribute (``--max-rows-per-call`` on the
command line; the smaller of the two wins): a case whose one request has more rows than that is
skipped, every other case is drawn in calls of at most that many rows.

What it returns is checked after every call (`check_sampler_output`), before any count is taken:
``None``, a non-tensor, the wrong number of ids, a float or bool dtype (float ids would be silently
truncated), non-finite values and ids outside ``[0, V)`` each raise `SamplerContractError`, which the
run reports as a failed check of the case -- never a traceback.  So does an exception the sampler
raises (other than `SamplerUnsupportedError`), named with its innermost frame.
"""
from __future__ import annotations

import math
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from runnercheck.checks.chisq.stats_results import TestResult
from runnercheck.impl.interface import SAMPLING_FIELD_NAMES, SAMPLING_FIELDS, SamplingParams

# The fields a sampler may declare (``supported_params``): the interface's table of sampling fields.
PARAM_FIELDS = SAMPLING_FIELD_NAMES


class SamplerContractError(RuntimeError):
    """A sampler returned something other than ``N`` integer token ids in ``[0, V)``."""


class SamplerLimitError(ValueError):
    """A rows-per-call bound that is not a positive integer."""


def params_in_use(params: SamplingParams) -> set[str]:
    """The sampling fields ``params`` sets away from their neutral ("off") values."""
    return {f.name for f in SAMPLING_FIELDS if getattr(params, f.name) != f.neutral}


def declared_unsupported(sampler: Callable, params: SamplingParams) -> str | None:
    """Why ``sampler``'s ``supported_params`` declaration rules out ``params``, or None."""
    declared = getattr(sampler, "supported_params", None)
    if declared is None:
        return None
    missing = sorted(params_in_use(params) - set(declared))
    if missing:
        return f"sampler declares no support for {', '.join(missing)} (supported_params)"
    return None


def rows_per_call_bound(sampler: Callable, option: int | None) -> int | None:
    """The tighter of the sampler's ``max_rows_per_call`` and the command-line bound (None: unbounded)."""
    bounds = [b for b in (getattr(sampler, "max_rows_per_call", None), option) if b is not None]
    for b in bounds:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise SamplerLimitError(f"max rows per call must be an integer >= 1, got {b!r}")
    return min(bounds) if bounds else None


def check_sampler_output(result: Any, num_rows: int, vocab_size: int) -> np.ndarray:
    """``result`` as int64 ``[num_rows]`` on the host, or `SamplerContractError` saying what is wrong.

    Accepts a torch tensor or numpy array of any integer dtype with exactly ``num_rows`` elements in
    ``[0, vocab_size)``; a ``[num_rows, 1]`` column is accepted too (one id per row either way).
    """
    if result is None:
        raise SamplerContractError(f"returned None instead of {num_rows} token ids")
    if isinstance(result, torch.Tensor):
        host = result.detach().cpu()
        dtype_ok = not (host.is_floating_point() or host.is_complex() or host.dtype == torch.bool)
        values = host.numpy() if dtype_ok else host.to(torch.float64).numpy()
        dtype_name = str(host.dtype)
    elif isinstance(result, np.ndarray):
        dtype_ok = np.issubdtype(result.dtype, np.integer)
        values = result if dtype_ok else (result.astype(np.float64) if result.dtype.kind in "fb" else None)
        dtype_name = str(result.dtype)
    else:
        raise SamplerContractError(f"returned {type(result).__name__}, not a tensor of {num_rows} token ids")
    shape = tuple(values.shape) if values is not None else tuple(result.shape)
    if shape not in ((num_rows,), (num_rows, 1)):
        raise SamplerContractError(f"returned shape {list(shape)} for {num_rows} logit rows (expected [{num_rows}])")
    if not dtype_ok:
        detail = ""
        if values is not None and not np.all(np.isfinite(values)):
            detail = f"; {int(np.sum(~np.isfinite(values)))} non-finite values"
        raise SamplerContractError(f"returned dtype {dtype_name}: token ids must be integers{detail} "
                                   "(float ids would be truncated silently)")
    ids = values.reshape(num_rows).astype(np.int64, copy=False)
    bad = (ids < 0) | (ids >= vocab_size)
    if bad.any():
        first = int(np.argmax(bad))
        raise SamplerContractError(f"returned {int(bad.sum())} ids outside [0, {vocab_size}) "
                                   f"(first: {int(ids[first])} at row {first})")
    return ids


def describe_exception(error: BaseException) -> str:
    """``Type: message (at file:line in function)``, the innermost frame: enough to find the plug-in's bug."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def contract_failure(case_name: str, config: dict[str, Any], error: SamplerContractError) -> TestResult:
    """A contract violation as a failed ``contract`` check of its case (no p-value: it stays out of the
    multiple-testing family, and fails the run whatever the correction)."""
    return TestResult(name=f"{case_name}/contract", kind="contract", config=config, statistic=math.nan, dof=0,
                      p_value=0.0, n_samples=0, adjusted_p_value=0.0, passed=False, notes=str(error))
