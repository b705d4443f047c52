"""The oracle's sampler: docs/SAMPLING.md in float64, each step written the obvious way.

One logit row at a time (the row of raw model logits at the position before the produced token):

0. non-finite rule (NaN counts as -inf; a row with NaN or +inf is flagged; any +inf wins at its
   lowest index; an all -inf row gives token 0),
1. penalties (repetition over prompt + outputs, frequency and presence over outputs only),
2. greedy for temperature 0 (argmax, lowest index on ties),
3. ``s = l / temperature``, then 4. min-p, 5. top-k, 6. top-p (each keeps ties at its threshold),
7. Gumbel-max with the RNG spec's noise ``runnercheck.reference.rng.gumbel_noise(seed, position, V)``.

Besides the token, `sample` reports what the comparison with the fp32 runner needs: the gap
between the best and second-best final score, and whether a filter boundary was *fragile*, i.e.
a score or cumulative mass lay within ``BOUNDARY_RTOL`` of a threshold, where fp32 rounding could
flip the kept set.  "Within" means ``|a - b| <= BOUNDARY_RTOL * max(1, |a|, |b|)``: relative for
large scores, absolute (a relative change of the probability) for scores near 0.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from runnercheck.impl.interface import MAX_SEED, SamplingParams, TokenLogprobs, TokenOutOfVocabError
from runnercheck.reference.rng import gumbel_noise

TIE_TOLERANCE = 1e-3
BOUNDARY_RTOL = 1e-4

_NO_LIMIT = 2**62


class SamplerInputError(ValueError):
    """Logits, seed, position or token ids that the sampler cannot take."""


@dataclass(frozen=True)
class SampleResult:
    """One sampled token and the diagnostics the runner comparison needs.

    ``gap``: best minus second-best final score (``s + g`` for temperature > 0, penalised logits for
    greedy); ``inf`` when only one candidate exists or the non-finite rule chose the token.
    ``fragile``: a min-p/top-k/top-p boundary lay within ``BOUNDARY_RTOL`` of flipping.
    ``nan_flag``: the raw row held a NaN or +inf.  ``runner_up``: the second-best token (-1: none).
    """

    token: int
    gap: float
    fragile: bool
    nan_flag: bool
    runner_up: int = -1


# --------------------------------------------------------------------------- input checks


def _row(logits: torch.Tensor) -> torch.Tensor:
    if not isinstance(logits, torch.Tensor):
        raise SamplerInputError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 1 or logits.numel() == 0:
        raise SamplerInputError(f"logits must be one non-empty row [V], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise SamplerInputError(f"logits must be floating point, got {logits.dtype}")
    return logits.detach().to(device="cpu", dtype=torch.float64).clone()


def _check_ids(ids: Sequence[int], vocab_size: int, name: str) -> list[int]:
    out = list(ids)
    for tok in out:
        if not isinstance(tok, int) or isinstance(tok, bool) or not 0 <= tok < vocab_size:
            raise TokenOutOfVocabError(f"token {tok!r} outside [0, {vocab_size})", field=name)
    return out


def _check_params(params: SamplingParams, vocab_size: int) -> None:
    if not isinstance(params, SamplingParams):
        raise SamplerInputError(f"params must be SamplingParams, got {type(params).__name__}")
    params.validate(vocab_size, max_logprobs=_NO_LIMIT)


def _without_nan(row: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(row), torch.tensor(-math.inf, dtype=row.dtype), row)


def is_flagged(logits: torch.Tensor) -> bool:
    """True when the raw row holds a NaN or a +inf (the ``nan_flags`` rule)."""
    row = _row(logits)
    return bool(torch.isnan(row).any() or torch.isposinf(row).any())


def _near(a: torch.Tensor | float, b: float) -> torch.Tensor:
    """Elementwise ``|a - b| <= BOUNDARY_RTOL * max(1, |a|, |b|)``; never true for infinite ``a``."""
    a = torch.as_tensor(a, dtype=torch.float64)
    scale = torch.clamp(torch.maximum(a.abs(), torch.tensor(abs(b), dtype=torch.float64)), min=1.0)
    return torch.isfinite(a) & ((a - b).abs() <= BOUNDARY_RTOL * scale)


def _first_max(scores: torch.Tensor) -> int:
    best = scores.max()
    return int(torch.nonzero(scores == best)[0, 0])


# --------------------------------------------------------------------------- pipeline steps


def apply_penalties(
    logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int], output_ids: Sequence[int]
) -> torch.Tensor:
    """Step 1: repetition (prompt + outputs), frequency and presence (outputs only); float64 copy."""
    row = _row(logits)
    vocab = row.numel()
    prompt = _check_ids(prompt_ids, vocab, "prompt_ids")
    outputs = _check_ids(output_ids, vocab, "output_ids")
    _check_params(params, vocab)
    out_counts = Counter(outputs)
    r = float(params.repetition_penalty)
    if r != 1.0:
        for tok in sorted(set(prompt) | set(outputs)):
            value = float(row[tok])
            row[tok] = value / r if value > 0 else value * r
    f = float(params.frequency_penalty)
    if f != 0.0:
        for tok, count in out_counts.items():
            row[tok] -= f * count
    p = float(params.presence_penalty)
    if p != 0.0:
        for tok in out_counts:
            row[tok] -= p
    return row


def _min_p(s: torch.Tensor, keep: torch.Tensor, min_p: float) -> tuple[torch.Tensor, bool]:
    top = float(s[keep].max())
    threshold = top + math.log(min_p)
    new_keep = keep & (s >= threshold)
    # The top token can never drop out (s_top - max = 0 >= log(min_p)); everything else can.
    at_risk = keep & (s < top)
    fragile = bool((_near(s, threshold) & at_risk).any())
    return new_keep, fragile


def _top_k(s: torch.Tensor, keep: torch.Tensor, k: int) -> tuple[torch.Tensor, bool]:
    kept_scores = sorted(s[keep].tolist(), reverse=True)
    if k >= len(kept_scores):
        return keep, False
    threshold = kept_scores[k - 1]
    new_keep = keep & (s >= threshold)
    # Exact ties at the threshold are all kept in fp32 as well; a near-tie below it may not be.
    dropped = keep & (s < threshold)
    fragile = bool((_near(s, threshold) & dropped).any())
    return new_keep, fragile


def _top_p(s: torch.Tensor, keep: torch.Tensor, top_p: float) -> tuple[torch.Tensor, bool]:
    kept_scores = s[keep]
    probs = torch.softmax(kept_scores, dim=0)
    order = torch.sort(kept_scores, descending=True, stable=True).indices
    cumulative = torch.cumsum(probs[order], dim=0)
    reaching = torch.nonzero(cumulative >= top_p)
    # Rounding can leave the total a hair under a top_p just below 1: then everything is kept.
    first = int(reaching[0, 0]) if reaching.numel() else len(order) - 1
    tau = float(kept_scores[order[first]])
    new_keep = keep & (s >= tau)
    mass_at_tau = float(probs[kept_scores >= tau].sum())
    mass_above_tau = float(probs[kept_scores > tau].sum())
    fragile = bool(
        _near(mass_at_tau, top_p) or _near(mass_above_tau, top_p) or (_near(kept_scores, tau) & (kept_scores != tau)).any()
    )
    return new_keep, fragile


def _filters(s: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, bool]:
    """Steps 4-6 on temperature-scaled scores: (kept mask, any boundary fragile)."""
    if torch.isposinf(s).any():
        return torch.isposinf(s), False
    keep = s > -math.inf
    if not bool(keep.any()):  # nothing finite (an all-NaN / -inf row, flagged): no filter has a top to measure from
        return keep, False
    fragile = False
    if params.min_p > 0.0:
        keep, f = _min_p(s, keep, float(params.min_p))
        fragile |= f
    if params.top_k != -1:
        keep, f = _top_k(s, keep, int(params.top_k))
        fragile |= f
    if params.top_p < 1.0:
        keep, f = _top_p(s, keep, float(params.top_p))
        fragile |= f
    return keep, fragile


def filtered_scores(
    logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int], output_ids: Sequence[int]
) -> torch.Tensor:
    """Scores ``s`` = penalised logits / T, -inf where filtered out (T == 0: penalised logits, unfiltered).

    NaN counts as -inf.  For a row holding +inf the +inf entries are the only ones kept.
    """
    penalised = apply_penalties(_without_nan(_row(logits)), params, prompt_ids, output_ids)
    if params.temperature == 0:
        return penalised
    s = penalised / float(params.temperature)
    keep, _ = _filters(s, params)
    return torch.where(keep, s, torch.tensor(-math.inf, dtype=torch.float64))


def _non_finite_choice(row: torch.Tensor) -> int | None:
    """Step 0's forced token, or None when the row goes through the pipeline."""
    positive_inf = torch.nonzero(torch.isposinf(row))
    if positive_inf.numel():
        return int(positive_inf[0, 0])
    if bool((_without_nan(row) == -math.inf).all()):
        return 0
    return None


def expected_distribution(
    logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = ()
) -> torch.Tensor:
    """float64 ``[V]``: the exact distribution of the sampled token (softmax of kept scores)."""
    return distribution(logits, params, prompt_ids, output_ids)[0]


def distribution(
    logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = ()
) -> tuple[torch.Tensor, bool]:
    """``(probabilities [V] float64, fragile)``: steps 0-6 and the softmax (what rejection sampling reads).

    A greedy or non-finite row is a point mass.  ``fragile``: a filter boundary lay within
    ``BOUNDARY_RTOL`` of flipping, or (greedy) the two best penalised logits lie within
    ``TIE_TOLERANCE``: an fp32 twin may then hold another distribution.
    """
    row = _row(logits)
    vocab = row.numel()
    _check_params(params, vocab)
    _check_ids(prompt_ids, vocab, "prompt_ids")
    _check_ids(output_ids, vocab, "output_ids")
    forced, fragile = _non_finite_choice(row), False
    if forced is None and params.temperature == 0:
        penalised = apply_penalties(_without_nan(row), params, prompt_ids, output_ids)
        forced = _first_max(penalised)
        top2 = torch.topk(penalised, min(2, vocab)).values
        fragile = vocab > 1 and bool(top2[0] - top2[1] < TIE_TOLERANCE)
    if forced is not None:
        one_hot = torch.zeros(vocab, dtype=torch.float64)
        one_hot[forced] = 1.0
        return one_hot, fragile
    s = apply_penalties(_without_nan(row), params, prompt_ids, output_ids) / float(params.temperature)
    keep, fragile = _filters(s, params)
    s = torch.where(keep, s, torch.tensor(-math.inf, dtype=torch.float64))
    weights = torch.exp(s - s.max())
    return weights / weights.sum(), fragile


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    seed: int,
    position: int,
    prompt_ids: Sequence[int] = (),
    output_ids: Sequence[int] = (),
) -> SampleResult:
    """The token the pipeline produces at noise position ``position`` for request seed ``seed``."""
    row = _row(logits)
    vocab = row.numel()
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise SamplerInputError(f"seed {seed!r} must be an int in [0, {MAX_SEED}]")
    if not isinstance(position, int) or isinstance(position, bool) or position < 0:
        raise SamplerInputError(f"position {position!r} must be an int >= 0")
    _check_params(params, vocab)
    _check_ids(prompt_ids, vocab, "prompt_ids")
    _check_ids(output_ids, vocab, "output_ids")
    nan_flag = bool(torch.isnan(row).any() or torch.isposinf(row).any())
    forced = _non_finite_choice(row)
    if forced is not None:
        return SampleResult(token=forced, gap=math.inf, fragile=False, nan_flag=nan_flag)

    penalised = apply_penalties(_without_nan(row), params, prompt_ids, output_ids)
    if params.temperature == 0:
        final, fragile = penalised, False
    else:
        s = penalised / float(params.temperature)
        keep, fragile = _filters(s, params)
        noisy = s + gumbel_noise(seed, position, vocab)
        final = torch.where(keep, noisy, torch.tensor(-math.inf, dtype=torch.float64))

    token = _first_max(final)
    others = final.clone()
    others[token] = -math.inf
    if bool((others == -math.inf).all()):
        return SampleResult(token=token, gap=math.inf, fragile=fragile, nan_flag=nan_flag)
    runner_up = _first_max(others)
    gap = float(final[token] - final[runner_up])
    return SampleResult(token=token, gap=gap, fragile=fragile, nan_flag=nan_flag, runner_up=runner_up)


RANK_NEIGHBOUR_WINDOW = 1e-2  # logit distance within which the oracle lists a target's neighbours
MAX_RANK_NEIGHBOURS = 64  # at most this many (the closest): enough for any tolerance the comparison uses


@dataclass(frozen=True)
class OracleTokenLogprobs(TokenLogprobs):
    """`TokenLogprobs` plus what only the oracle, holding the whole row, can say about its rank.

    ``fragile``: (processed logprobs) a filter boundary of the row lay within ``BOUNDARY_RTOL`` of flipping, so
    an fp32 sampler may keep another set and normalise over it.  ``neighbour_gaps``: ``l[j] - l[token_id]`` for the other tokens within `RANK_NEIGHBOUR_WINDOW`
    of the target's logit (the closest `MAX_RANK_NEIGHBOURS`), ascending by distance.  A float32
    runner may order such a token on the other side of the target at any rank, not only inside the
    top-n list (`runnercheck.checks.compare`): a rank may move by the neighbours within the comparison's
    tolerance, and by no more.
    """

    neighbour_gaps: tuple[float, ...] = ()
    fragile: bool = False  # processed logprobs: a filter boundary within fp32 reach, the kept set may differ


def token_logprobs(logits: torch.Tensor, token_id: int, num_top: int) -> TokenLogprobs:
    """Logprob and rank of ``token_id`` and the ``num_top`` best tokens, from the raw logits.

    ``rank = 1 + #{j : l[j] > l[token_id]}``; the top list is by logit, descending, ties by lower
    index.  NaN counts as -inf (such rows are flagged and their logprobs are not compared).
    """
    return _row_logprobs(_without_nan(_row(logits)), token_id, num_top)


def processed_scores(
    logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = ()
) -> tuple[torch.Tensor, bool]:
    """``(scores [V] float64, fragile)`` whose log-softmax is what processed logprobs report.

    Temperature > 0: the kept scores of `distribution` (penalties, ``/ T``, min-p, top-k, top-p; -inf where
    filtered), so ``exp(log_softmax)`` is exactly the distribution the token is sampled from.  Greedy: the
    penalised logits at temperature 1, unfiltered -- the distribution whose argmax the greedy token is (a
    point mass would report 0 and -inf, nothing a user can read, and flip wholesale at every near tie).
    ``fragile``: a filter boundary lay within ``BOUNDARY_RTOL`` of flipping (an fp32 kept set may differ).
    A row holding +inf keeps its +inf entries only (flagged: not compared).
    """
    row = _row(logits)
    vocab = row.numel()
    _check_params(params, vocab)
    penalised = apply_penalties(_without_nan(row), params, prompt_ids, output_ids)
    if params.temperature == 0:
        return penalised, False
    s = penalised / float(params.temperature)
    keep, fragile = _filters(s, params)
    return torch.where(keep, s, torch.tensor(-math.inf, dtype=torch.float64)), fragile


def request_token_logprobs(
    logits: torch.Tensor, token_id: int, params: SamplingParams, prompt_ids: Sequence[int] = (),
    output_ids: Sequence[int] = (),
) -> TokenLogprobs:
    """A sampled token's `TokenLogprobs` in the request's ``logprobs_mode`` (``params.logprobs`` top entries):
    `token_logprobs` for ``"raw"``; for ``"processed"`` the same over `processed_scores`, whose ``fragile`` is
    reported (`OracleTokenLogprobs.fragile`: the comparison skips a row whose kept set fp32 may choose otherwise)."""
    if params.logprobs_mode != "processed":
        return token_logprobs(logits, token_id, params.logprobs)
    scores, fragile = processed_scores(logits, params, prompt_ids, output_ids)
    if torch.isposinf(scores).any():  # a flagged row: its logprobs are not compared; keep them finite-shaped
        scores = torch.where(torch.isposinf(scores), torch.tensor(0.0, dtype=torch.float64),
                             torch.tensor(-math.inf, dtype=torch.float64))
    return replace(_row_logprobs(scores, token_id, params.logprobs), fragile=fragile)


def _row_logprobs(row: torch.Tensor, token_id: int, num_top: int) -> OracleTokenLogprobs:
    """`token_logprobs` of a float64 row already free of NaN (raw logits, or processed scores)."""
    vocab = row.numel()
    _check_ids([token_id], vocab, "token_id")
    if not isinstance(num_top, int) or isinstance(num_top, bool) or not 0 <= num_top <= vocab:
        raise SamplerInputError(f"num_top {num_top!r} must be an int in [0, {vocab}]")
    log_normaliser = torch.logsumexp(row, dim=0)
    rank = 1 + int((row > row[token_id]).sum())
    top = torch.sort(row, descending=True, stable=True).indices[:num_top]
    gaps: list[float] = []
    if math.isfinite(float(row[token_id])):
        diff = row - row[token_id]
        diff[token_id] = math.inf  # not its own neighbour
        near = diff[diff.abs() <= RANK_NEIGHBOUR_WINDOW]
        gaps = sorted((float(g) for g in near), key=abs)[:MAX_RANK_NEIGHBOURS]
    return OracleTokenLogprobs(
        token_id=token_id,
        logprob=float(row[token_id] - log_normaliser),
        rank=rank,
        top_token_ids=tuple(int(t) for t in top),
        top_logprobs=tuple(float(row[t] - log_normaliser) for t in top),
        neighbour_gaps=tuple(gaps),
    )


__all__ = [
    "TIE_TOLERANCE", "BOUNDARY_RTOL", "SampleResult", "SamplerInputError", "apply_penalties",
    "filtered_scores", "expected_distribution", "distribution", "sample", "token_logprobs", "is_flagged",
    "processed_scores", "request_token_logprobs",
    "OracleTokenLogprobs", "RANK_NEIGHBOUR_WINDOW",
]
