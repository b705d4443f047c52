"""The oracle of speculative verification: docs/SAMPLING.md "Probabilistic speculative verification".

One request at a time, float64, Python loops: deliberately slow and obvious.  Given the target's
probabilities ``p[0..k]`` (``k + 1`` rows, row ``k`` the bonus position), the draft tokens
``d[0..k-1]`` and the draft's distributions ``q[0..k-1]``, `verify` returns the emitted tokens
(the accepted drafts plus one resampled or bonus token) and the accepted count:

* greedy mode (temperature 0): accept while ``d_i == argmax p_i``, then emit ``argmax p_a``;
* rejection-sampling mode: accept ``d_i`` iff ``u_i q_i(d_i) < p_i(d_i)`` with ``u_i`` from the
  accept stream; at the first rejection resample from ``max(0, p_a - q_a)`` (``p_a`` when that is
  zero everywhere), after ``k`` acceptances sample the bonus from ``p_k``; resampling is the
  Gumbel-max of ``log r + g`` with ``g`` from the resample stream.

Inputs are checked first and rejected with the `runnercheck.impl.interface.SpecVerifyError` subclasses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from runnercheck.impl.interface import (
    MAX_SEED,
    SpecLayoutError,
    SpecProbabilityError,
    SpecTooManyDraftsError,
    SpecVerifyError,
    SpecVocabMismatchError,
)
from runnercheck.reference.rng import ACCEPT_STREAM, RESAMPLE_STREAM, gumbel_from_bits, philox_64bits, uniform_from_bits
from runnercheck.reference.sampler import TIE_TOLERANCE

DEFAULT_MAX_SPEC_TOKENS = 16
# An accept test this close to its boundary may flip between float64 and the kernel's fp32.
ACCEPT_RTOL = 1e-5


@dataclass(frozen=True)
class SpecVerifyResult:
    """``tokens``: accepted drafts then the resampled/bonus token (``accepted + 1`` of them).

    ``fragile``: some decision lay within fp32 rounding of flipping (an accept test within
    ``ACCEPT_RTOL`` of its boundary, or a resample whose two best scores differ by less than
    ``TIE_TOLERANCE``); the kernel may then legitimately differ.  ``resample_gap``: best minus
    second-best resample score (``inf`` with one candidate or in greedy mode).
    """

    tokens: tuple[int, ...]
    accepted: int
    fragile: bool = False
    resample_gap: float = math.inf


# --------------------------------------------------------------------------- input checks


def _probability_rows(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.is_floating_point():
        raise SpecLayoutError(f"{name} must be a floating-point tensor [rows, V], got {getattr(t, 'shape', type(t))}")
    rows = t.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(rows).all()) or bool((rows < 0).any()):
        raise SpecProbabilityError(f"{name} holds a negative, NaN or infinite probability")
    if rows.shape[0] and bool((rows.sum(dim=1) <= 0).any()):
        raise SpecProbabilityError(f"{name} has a row with no probability mass")
    return rows


def check_inputs(
    target_probs: torch.Tensor, draft_tokens: Sequence[int], draft_probs: torch.Tensor, max_spec_tokens: int
) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """float64 copies ``(p [k+1, V], d [k], q [k, V])``, or the `SpecVerifyError` that says why not."""
    drafts = list(draft_tokens)
    k = len(drafts)
    if k > max_spec_tokens:
        raise SpecTooManyDraftsError(f"{k} draft tokens > max_spec_tokens={max_spec_tokens}")
    for name, t in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise SpecLayoutError(f"{name} must be a tensor [rows, V], got {getattr(t, 'shape', type(t))}")
    vocab = target_probs.shape[1]
    if draft_probs.shape[1] != vocab:
        raise SpecVocabMismatchError(f"draft vocabulary {draft_probs.shape[1]} != target vocabulary {vocab}")
    if target_probs.shape[0] != k + 1 or draft_probs.shape[0] != k:
        raise SpecLayoutError(f"{k} drafts need {k + 1} target rows and {k} draft rows, got "
                              f"{target_probs.shape[0]} and {draft_probs.shape[0]}")
    for tok in drafts:
        if not isinstance(tok, int) or isinstance(tok, bool) or not 0 <= tok < vocab:
            raise SpecLayoutError(f"draft token {tok!r} outside [0, {vocab})")
    return _probability_rows(target_probs, "target_probs"), drafts, _probability_rows(draft_probs, "draft_probs")


def _check_key(seed: int, position: int, temperature: float) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise SpecVerifyError(f"seed {seed!r} must be an int in [0, {MAX_SEED}]")
    if not isinstance(position, int) or isinstance(position, bool) or position < 0:
        raise SpecVerifyError(f"position {position!r} must be an int >= 0")
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise SpecVerifyError(f"temperature {temperature!r} must be finite and >= 0")


# --------------------------------------------------------------------------- the two noises


def accept_uniform(seed: int, position: int) -> float:
    """The accept test's uniform at ``position``: counter ``(0, position, 0, ACCEPT_STREAM)``."""
    hi, lo = philox_64bits(seed, position, torch.zeros(1, dtype=torch.int64), ACCEPT_STREAM)
    return float(uniform_from_bits(hi, lo)[0])


def resample(weights: torch.Tensor, seed: int, position: int, stream: int = RESAMPLE_STREAM) -> tuple[int, float]:
    """``(token, gap)``: Gumbel-max of ``log w_t + g_t`` over ``w_t > 0`` with ``stream``'s noise
    (the resample stream; the draft-model proposer samples its drafts with the draft stream).

    Lowest index on exact ties; ``gap`` is best minus second-best score (inf with one candidate).
    """
    vocab = weights.numel()
    hi, lo = philox_64bits(seed, position, torch.arange(vocab, dtype=torch.int64), stream)
    noise = gumbel_from_bits(hi, lo)
    best, best_token, second = -math.inf, -1, -math.inf
    for t in range(vocab):
        w = float(weights[t])
        if w <= 0.0:
            continue
        score = math.log(w) + float(noise[t])
        if score > best:
            best, best_token, second = score, t, best
        elif score > second:
            second = score
    return best_token, best - second


def _first_argmax(row: torch.Tensor) -> int:
    best, best_token = -math.inf, 0
    for t in range(row.numel()):
        if float(row[t]) > best:
            best, best_token = float(row[t]), t
    return best_token


# --------------------------------------------------------------------------- verification


def verify_greedy(p: torch.Tensor, drafts: Sequence[int]) -> SpecVerifyResult:
    """Greedy mode: accept while ``d_i == argmax p_i``; then the target's own argmax."""
    tokens: list[int] = []
    for i, d in enumerate(drafts):
        target = _first_argmax(p[i])
        if d != target:
            return SpecVerifyResult(tuple(tokens + [target]), accepted=i)
        tokens.append(d)
    return SpecVerifyResult(tuple(tokens + [_first_argmax(p[len(drafts)])]), accepted=len(drafts))


def verify_rejection(p: torch.Tensor, drafts: Sequence[int], q: torch.Tensor, seed: int, position: int) -> SpecVerifyResult:
    """Rejection-sampling mode (docs/SAMPLING.md): exact for any draft distribution ``q``."""
    tokens: list[int] = []
    fragile = False
    for i, d in enumerate(drafts):
        u = accept_uniform(seed, position + i)
        lhs, rhs = u * float(q[i, d]), float(p[i, d])
        fragile |= abs(lhs - rhs) <= ACCEPT_RTOL * max(lhs, rhs) and max(lhs, rhs) > 0
        if lhs < rhs:
            tokens.append(d)
            continue
        residual = torch.clamp(p[i] - q[i], min=0.0)
        if not bool((residual > 0).any()):
            residual = p[i]  # p_i <= q_i everywhere (p_i == q_i up to rounding): sample from p_i
        token, gap = resample(residual, seed, position + i)
        return SpecVerifyResult(tuple(tokens + [token]), accepted=i,
                                fragile=fragile or gap < TIE_TOLERANCE, resample_gap=gap)
    token, gap = resample(p[len(drafts)], seed, position + len(drafts))
    return SpecVerifyResult(tuple(tokens + [token]), accepted=len(drafts),
                            fragile=fragile or gap < TIE_TOLERANCE, resample_gap=gap)


def verify(
    target_probs: torch.Tensor,
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor,
    *,
    seed: int,
    position: int,
    temperature: float,
    max_spec_tokens: int = DEFAULT_MAX_SPEC_TOKENS,
) -> SpecVerifyResult:
    """Verify one request's drafts; ``position`` is the noise position of target row 0.

    ``target_probs`` ``[k+1, V]`` and ``draft_probs`` ``[k, V]`` (probabilities after temperature
    and filters), ``draft_tokens`` ``k`` ids.  ``temperature == 0`` selects greedy mode.
    """
    p, drafts, q = check_inputs(target_probs, draft_tokens, draft_probs, max_spec_tokens)
    _check_key(seed, position, temperature)
    if temperature == 0:
        return verify_greedy(p, drafts)
    return verify_rejection(p, drafts, q, seed, position)


__all__ = [
    "DEFAULT_MAX_SPEC_TOKENS", "ACCEPT_RTOL", "SpecVerifyResult", "check_inputs", "accept_uniform", "resample",
    "verify_greedy", "verify_rejection", "verify",
]
