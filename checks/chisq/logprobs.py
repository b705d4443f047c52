"""Logprob consistency of a third-party sampler that returns logprobs (docs/PLUGIN.md, "The sampler contract").

A sampler opts in by taking the keyword ``return_logprobs`` (passed only to samplers whose signature names it,
like ``history=``).  Called with ``return_logprobs=True`` it returns ``(token ids, logprobs)``: the ids as
without it, and float ``[N, V]`` logprobs, row ``i`` the log of the distribution it drew token ``i`` from
(processed logprobs: after penalties, temperature and the filters; filtered tokens ``-inf``).  A sampler that
does not name the keyword is never asked: the contract is unchanged for it.

For every case such a sampler runs, `check_case_logprobs` draws the case once more with logprobs (at positions
past the main draws) and reports:

* ``<case>/logprobs`` -- ``exp(logprobs)`` of each row against the exact float64 distribution the run's
  convention gives (`runnercheck.checks.chisq.draws.expected_rows`): every token within
  ``PROB_ATOL + PROB_RTOL * p``.  A failure lies outside the multiple-testing family (like a contract
  violation: no p-value) and its note names the worst token and, when one matches, what the logprobs look
  like instead (`ALTERNATIVES`: without the temperature, before the filters, the raw logits).  Greedy rows
  may report either the point mass on the drawn token or the temperature-1 distribution (the runner's
  convention, docs/SAMPLING.md "Logprobs");
* ``<case>/logprobs-draws`` -- Pearson chi-square (scipy, sparse bins pooled) of the sampler's own draws
  against ``exp`` of the logprobs it returned with them: the logprobs must describe what was sampled,
  whatever the convention (temperature > 0 rows only; part of the family).

Malformed logprobs (not a pair, wrong shape, NaN, +inf, rows whose probabilities do not sum to 1 within
``SUM_ATOL``) raise `SamplerLogprobsError`, reported as the case's failed contract check.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np
import torch

from runnercheck.checks.chisq import stats
from runnercheck.checks.chisq.case import SamplingCase
from runnercheck.checks.chisq.sampler_contract import SamplerContractError, check_sampler_output, describe_exception
from runnercheck.checks.chisq.samplers import SamplerUnsupportedError, accepts_keyword
from runnercheck.checks.chisq.stats_results import TestResult
from runnercheck.impl.interface import SamplingParams

RETURN_LOGPROBS = "return_logprobs"
PROB_ATOL = 1e-4  # fp32 softmax of logits ~10 is good to ~1e-6; a planted bug moves probabilities by ~1e-2
PROB_RTOL = 1e-3
SUM_ATOL = 1e-3


class SamplerLogprobsError(SamplerContractError):
    """Logprobs a sampler returned that are not ``N`` rows of a distribution over ``V`` tokens."""


def returns_logprobs(sampler: Callable) -> bool:
    """Whether ``sampler`` takes ``return_logprobs=`` (and so is checked by this module)."""
    return accepts_keyword(sampler, RETURN_LOGPROBS)


def check_logprobs_output(result: Any, num_rows: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids int64 [N], probabilities float64 [N, V])`` of a ``return_logprobs=True`` call, or `SamplerContractError`."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise SamplerLogprobsError(f"with return_logprobs=True it must return (token ids, logprobs), got "
                                   f"{type(result).__name__}")
    ids = check_sampler_output(result[0], num_rows, vocab_size)
    lp = result[1]
    if not isinstance(lp, torch.Tensor) or not lp.is_floating_point():
        raise SamplerLogprobsError(f"returned logprobs of type {type(lp).__name__}, not a float tensor")
    if tuple(lp.shape) != (num_rows, vocab_size):
        raise SamplerLogprobsError(f"returned logprobs of shape {list(lp.shape)} (expected [{num_rows}, {vocab_size}])")
    host = lp.detach().to("cpu", torch.float64)
    if torch.isnan(host).any() or torch.isposinf(host).any():
        raise SamplerLogprobsError("returned logprobs holding NaN or +inf")
    probs = torch.exp(host)
    worst = float((probs.sum(dim=1) - 1.0).abs().max())
    if worst > SUM_ATOL:
        raise SamplerLogprobsError(f"returned logprobs whose probabilities sum to 1 +- {worst:.3g} (> {SUM_ATOL:g})")
    return ids, probs.numpy()


def draw_with_logprobs(sampler: Callable, case: SamplingCase, *, seed: int, position_offset: int, device: torch.device,
                       n_samples: int, max_rows_per_call: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tokens int64 [n, rows], mean probabilities float64 [rows, V], spread [rows])`` from ``return_logprobs=True``
    calls: each row's reported distribution averaged over the draws, and how far any draw's lay from the first's
    (the same logits and params must give the same distribution).  O(rows x V) memory whatever ``n``."""
    rows, vocab = case.rows, case.vocab_size
    per_call = max(1, min(n_samples, (1 << 18) // (rows * vocab)))  # the probabilities come back to the host
    if max_rows_per_call is not None:
        per_call = max(1, min(per_call, max_rows_per_call // rows))
    template = case.logits.to(device)
    tokens = np.empty((n_samples, rows), dtype=np.int64)
    total = np.zeros((rows, vocab), dtype=np.float64)
    first: np.ndarray | None = None
    spread = np.zeros(rows, dtype=np.float64)
    for start in range(0, n_samples, per_call):
        m = min(per_call, n_samples - start)
        kwargs: dict[str, Any] = {RETURN_LOGPROBS: True}
        if accepts_keyword(sampler, "history"):
            kwargs["history"] = [case.history] * (m * rows)
        if rows > 1 and accepts_keyword(sampler, "request_index"):
            kwargs["request_index"] = torch.arange(m, device=device).repeat_interleave(rows)
        positions = position_offset + start * rows + torch.arange(m * rows, dtype=torch.int64, device=device)
        seeds = torch.full((m * rows,), seed, dtype=torch.int64, device=device)
        where = f"case {case.name}, draws {start}..{start + m - 1} with logprobs"
        try:
            result = sampler(template.repeat(m, 1), [case.params] * (m * rows), seeds, positions, **kwargs)
        except SamplerUnsupportedError:
            raise
        except Exception as e:  # a crashing plug-in is a finding about the plug-in
            raise SamplerContractError(f"{where}: sampler raised {describe_exception(e)}") from e
        try:
            ids, p = check_logprobs_output(result, m * rows, vocab)
        except SamplerContractError as e:
            raise type(e)(f"{where}: sampler {e}") from None
        tokens[start:start + m] = ids.reshape(m, rows)
        p = p.reshape(m, rows, vocab)
        first = p[0] if first is None else first
        spread = np.maximum(spread, np.abs(p - first).max(axis=(0, 2)))
        total += p.sum(axis=0)
    return tokens, total / n_samples, spread


def _alternatives(params: SamplingParams) -> list[tuple[str, SamplingParams]]:
    """What wrong processed logprobs commonly are, as the params whose contract distribution they would match."""
    unfiltered = replace(params, top_k=-1, top_p=1.0, min_p=0.0)
    raw = replace(unfiltered, temperature=1.0, repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)
    out = []
    if params.temperature not in (0.0, 1.0):
        out.append(("without the temperature (logits / 1)", replace(params, temperature=1.0)))
    if unfiltered != params:
        out.append(("before the filters (no min-p/top-k/top-p mask)", unfiltered))
    if raw not in (params, unfiltered):
        out.append(("the raw logits' log-softmax", raw))
    return out


ALTERNATIVES = ("without the temperature", "before the filters", "the raw logits' log-softmax")


def _within(reported: np.ndarray, expected: np.ndarray) -> bool:
    return bool(np.all(np.abs(reported - expected) <= PROB_ATOL + PROB_RTOL * expected))


def _row_verdict(case: SamplingCase, j: int, reported: np.ndarray, expected: np.ndarray,
                 drawn: np.ndarray) -> str | None:
    """None when row ``j``'s reported distribution is right, else what is wrong with it."""
    from runnercheck.reference.sampler import expected_distribution

    prompt, outputs = case.history.prompt_ids, case.history.output_ids
    logits = case.logits[j].to(torch.float64)
    if case.params.temperature == 0:
        at_one = expected_distribution(logits, replace(case.params, temperature=1.0), prompt, outputs).numpy()
        at_one_unfiltered = expected_distribution(
            logits, replace(case.params, temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0), prompt, outputs).numpy()
        if any(_within(reported, e) for e in (expected, at_one, at_one_unfiltered)) \
                and np.all(np.argmax(reported) == drawn):
            return None
    elif _within(reported, expected):
        return None
    gap = np.abs(reported - expected)
    t = int(np.argmax(gap))
    note = (f"row {j}: token {t} reported p={reported[t]:.6g}, the convention's p={expected[t]:.6g} "
            f"(|diff| {gap[t]:.3g} > {PROB_ATOL:g} + {PROB_RTOL:g} p)")
    for label, params in _alternatives(case.params):
        if _within(reported, expected_distribution(logits, params, prompt, outputs).numpy()):
            return f"{note}; the logprobs match the distribution {label}"
    return note


def check_case_logprobs(sampler: Callable, case: SamplingCase, expected: Sequence[np.ndarray], *, seed: int,
                        position_offset: int, device: torch.device, n_samples: int, alpha: float,
                        max_rows_per_call: int | None = None) -> tuple[list[TestResult], list[TestResult]]:
    """``(tests in the family, failures outside it)`` of ``case``'s logprobs (see the module docstring).

    ``expected``: the case's exact rows under the run's convention.  A malformed answer raises
    `SamplerContractError` (the caller reports it as the case's contract failure)."""
    tokens, mean, spread = draw_with_logprobs(sampler, case, seed=seed, position_offset=position_offset, device=device,
                                       n_samples=n_samples, max_rows_per_call=max_rows_per_call)
    config = {**case.describe(), "seed": seed, "position_offset": position_offset}
    results: list[TestResult] = []
    failures: list[TestResult] = []
    for j in range(case.rows):
        suffix = f"/row{j}" if case.rows > 1 else ""
        reported = mean[j]
        verdict = _row_verdict(case, j, reported, np.asarray(expected[j], dtype=np.float64), tokens[:, j])
        if verdict is None and spread[j] > PROB_ATOL:
            verdict = f"row {j}: identical rows reported distributions up to {spread[j]:.3g} apart"
        if verdict is not None:
            failures.append(TestResult(name=f"{case.name}{suffix}/logprobs", kind="logprobs", config=config,
                                       statistic=math.nan, dof=0, p_value=0.0, n_samples=n_samples,
                                       adjusted_p_value=0.0, passed=False, notes=verdict))
        if case.params.temperature > 0:
            counts = stats.token_counts(tokens[:, j], case.vocab_size)
            results.append(stats.chisquare_test(counts, reported / reported.sum(), name=f"{case.name}{suffix}/logprobs-draws",
                                                config=config, alpha=alpha))
    return results, failures


__all__ = ["ALTERNATIVES", "PROB_ATOL", "PROB_RTOL", "RETURN_LOGPROBS", "SUM_ATOL", "SamplerLogprobsError",
           "check_case_logprobs", "check_logprobs_output", "draw_with_logprobs", "returns_logprobs"]
