"""One case's draws from a sampler and their tests against the exact float64 distributions.

Draw ``i`` of a case (`runnercheck.checks.chisq.case.SamplingCase`) is one request: its rows are sampled at noise
positions ``offset + i * rows + j`` with the case's seed, so every draw uses an independent ``(seed, position)``
key (`draw`).  Each row's counts are tested against `runnercheck.reference.sampler.expected_distribution`
(`expected_rows`); tail cases add an exact binomial tail-mass test; multi-row cases add a joint independence test
(`evaluate`, uncorrected: the run corrects its whole family).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from runnercheck.checks.chisq import stats
from runnercheck.checks.chisq.case import SamplingCase
from runnercheck.checks.chisq.sampler_contract import (
    SamplerContractError, check_sampler_output, declared_unsupported, describe_exception,
)
from runnercheck.checks.chisq.samplers import SamplerUnsupportedError, accepts_keyword, has_penalties


def sampler_can_run(sampler: Callable, case: SamplingCase, max_rows_per_call: int | None = None) -> str | None:
    """None if ``sampler`` can run ``case`` (`runnercheck.checks.chisq.sampler_contract`), else why not."""
    if has_penalties(case.params) and not accepts_keyword(sampler, "history"):
        return "penalties need a sampler that takes history="
    if max_rows_per_call is not None and case.rows > max_rows_per_call:
        return f"one request of this case has {case.rows} rows > {max_rows_per_call} rows per call"
    return declared_unsupported(sampler, case.params)


def draw(
    sampler: Callable, case: SamplingCase, *, seed: int, position_offset: int, device: torch.device,
    n_samples: int | None = None, progress: Callable[[int], None] | None = None, max_rows_per_call: int | None = None,
) -> np.ndarray:
    """Sample ``n_samples`` requests of ``case``: int64 ``[n, rows]`` token ids.

    Every call's result is checked at the seam (`check_sampler_output`); a violation raises
    `SamplerContractError` naming the case.  ``max_rows_per_call`` bounds the rows of one call.
    """
    n = case.n_samples if n_samples is None else n_samples
    rows, vocab = case.rows, case.vocab_size
    # Elements of logits per sampler call: a deep tail needs ~1e12 token-draws, so on a GPU the
    # calls must be big enough that Python overhead per call stays well under the kernel time.
    budget = (1 << 27) if device.type == "cuda" else (1 << 20)
    per_call = max(1, min(n, budget // (rows * vocab)))
    if max_rows_per_call is not None:
        per_call = max(1, min(per_call, max_rows_per_call // rows))
    template = case.logits.to(device)
    kwargs: dict[str, Any] = {}
    if accepts_keyword(sampler, "history"):
        kwargs["history"] = [case.history] * (per_call * rows)
    out = np.empty((n, rows), dtype=np.int64)
    for start in range(0, n, per_call):
        m = min(per_call, n - start)
        logits = template.repeat(m, 1)
        positions = position_offset + start * rows + torch.arange(m * rows, dtype=torch.int64, device=device)
        seeds = torch.full((m * rows,), seed, dtype=torch.int64, device=device)
        call_kwargs = dict(kwargs)
        if "history" in call_kwargs:
            call_kwargs["history"] = call_kwargs["history"][: m * rows]
        if rows > 1 and accepts_keyword(sampler, "request_index"):
            call_kwargs["request_index"] = torch.arange(m, device=device).repeat_interleave(rows)
        where = f"case {case.name}, draws {start}..{start + m - 1}"
        try:
            tokens = sampler(logits, [case.params] * (m * rows), seeds, positions, **call_kwargs)
        except SamplerUnsupportedError:
            raise
        except Exception as e:  # a crashing plug-in is a finding about the plug-in, not a harness traceback
            raise SamplerContractError(f"{where}: sampler raised {describe_exception(e)}") from e
        try:
            ids = check_sampler_output(tokens, m * rows, vocab)
        except SamplerContractError as e:
            raise SamplerContractError(f"{where}: sampler {e}") from None
        out[start : start + m] = ids.reshape(m, rows)
        if progress is not None:
            progress(m)
    return out


def expected_rows(case: SamplingCase, convention: str = "contract") -> list[np.ndarray]:
    """The exact float64 distribution of each row: `runnercheck.reference.sampler.expected_distribution` under the
    contract, `runnercheck.checks.chisq.conventions.convention_distribution` under another convention."""
    from runnercheck.reference.sampler import expected_distribution

    if convention != "contract":
        from runnercheck.checks.chisq.conventions import convention_distribution

        return [convention_distribution(case.logits[j], case.params, convention, case.history.prompt_ids,
                                        case.history.output_ids) for j in range(case.rows)]
    return [
        expected_distribution(case.logits[j].to(torch.float64), case.params,
                              case.history.prompt_ids, case.history.output_ids).numpy()
        for j in range(case.rows)
    ]


def _index_bin_test(counts: np.ndarray, probs: np.ndarray, bins: int, **kw) -> stats.TestResult:
    edges = np.linspace(0, counts.size, bins + 1).astype(int)
    grouped_counts = np.add.reduceat(counts, edges[:-1])
    grouped_probs = np.add.reduceat(probs, edges[:-1])
    if np.any((probs == 0) & (counts > 0)):
        return stats.chisquare_test(counts, probs, **kw)  # an impossible token: report it per token
    labels = {i: f"tokens {edges[i]}..{edges[i + 1] - 1}" for i in range(bins)}
    return stats.chisquare_test(grouped_counts, grouped_probs, label_fn=lambda g: labels[int(g[0])] if g.size == 1
                                else f"pooled ({g.size} ranges)", **kw)


def evaluate(case: SamplingCase, tokens: np.ndarray, expected: Sequence[np.ndarray], alpha: float) -> list[stats.TestResult]:
    """All tests of one case's draws (uncorrected)."""
    config = case.describe()
    results = []
    for j in range(case.rows):
        counts = stats.token_counts(tokens[:, j], case.vocab_size)
        suffix = f"/row{j}" if case.rows > 1 else ""
        kw = dict(name=f"{case.name}{suffix}", config=config, alpha=alpha)
        if case.index_bins:
            results.append(_index_bin_test(counts, expected[j], case.index_bins, **kw))
        else:
            results.append(stats.chisquare_test(counts, expected[j], **kw))
        if case.tail_tokens is not None:
            results.append(stats.tail_mass_test(counts, expected[j], tail_tokens=np.arange(
                case.tail_tokens.start, case.tail_tokens.stop), name=f"{case.name}{suffix}/tail", config=config, alpha=alpha))
    if case.rows > 1:
        results.append(stats.independence_test(tokens[:, 0], tokens[:, 1], expected[0], expected[1],
                                               name=f"{case.name}/rows0-1-joint", config=config, alpha=alpha))
    return results
