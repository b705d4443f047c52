"""Which filters *bind* in a chi-square case: the catalogue check behind `runnercheck.checks.chisq.cases`.

A filter binds in a case when moving its own threshold or parameter a little changes the case's
exact distribution by enough that the case's draws would see it.  A case in which a filter does
not bind cannot detect an error in that filter: when top-k keeps fewer tokens than min-p, any
min-p threshold between the two gives the same distribution, and a min-p that is computed in the
wrong space (before the temperature, say) passes every test.

The moves (both directions; a filter binds only if every move of it is detectable):

* ``top_k``: ``k - 1`` and ``k + 1``.
* ``min_p``: the threshold moved to the geometric midpoint of the next ratio ``p_i / p_max`` up
  and down, i.e. one token fewer / one more *at min-p's own boundary* (before top-k and top-p).
* ``top_p``: moved to the midpoint of the next cumulative mass up and down over the tokens that
  min-p and top-k left, i.e. one token fewer / one more at top-p's own boundary.
* penalties, and any other field of the interface's table without moves of its own: the parameter scaled by
  ``1 +- PENALTY_STEP`` (for a multiplicative penalty such as repetition, its logarithm).

Distributions are `runnercheck.reference.sampler.expected_distribution` (float64).  A move is *detectable*
when the case's chi-square test at its own sample count would reject the moved distribution with
probability at least ``REQUIRED_POWER`` at level ``BINDING_ALPHA`` (Bonferroni over a matrix of up
to 100 tests at 0.01, which is Holm's first step), or when the moved distribution puts so much
mass on tokens the case calls impossible that at least one is drawn with that probability.  The
chi-square power is the noncentral chi-square approximation on the bins the test itself pools
(`runnercheck.checks.chisq.stats.pool_bins`).

``python -m runnercheck.checks.chisq.binding [--full]`` prints, per case, which filters bind.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch
from scipy import stats as sps

from runnercheck.checks.chisq import stats
from runnercheck.checks.chisq.case import SamplingCase
from runnercheck.impl.interface import SAMPLING_FIELDS, SAMPLING_FIELDS_BY_NAME, SamplingParams


# From the interface's table of sampling fields: the filters on the scaled scores, the penalties on the logits.
THRESHOLD_FILTERS = tuple(f.name for f in SAMPLING_FIELDS if f.stage == "filter")
PENALTIES = tuple(f.name for f in SAMPLING_FIELDS if f.stage == "penalty")
FILTERS = THRESHOLD_FILTERS + PENALTIES
SHORT_NAMES = {f.name: f.short for f in SAMPLING_FIELDS if f.name in FILTERS}
PENALTY_STEP = 0.25
BINDING_ALPHA = 1e-4
REQUIRED_POWER = 0.99


@dataclass(frozen=True)
class Move:
    """One move of a filter's parameter and how visible it is to the case's draws."""

    label: str
    params: SamplingParams | None  # None: no such move exists (e.g. k - 1 at k = 1)
    total_variation: float
    power: float

    @property
    def detectable(self) -> bool:
        return self.params is not None and self.power >= REQUIRED_POWER


@dataclass(frozen=True)
class FilterBinding:
    """One active filter of a case: its moves, and whether every one of them is detectable."""

    name: str
    moves: tuple[Move, ...]

    @property
    def binds(self) -> bool:
        return bool(self.moves) and all(m.detectable for m in self.moves)

    def line(self) -> str:
        parts = [f"{m.label}: " + ("no such move" if m.params is None else f"TV {m.total_variation:.3g}, power {m.power:.3g}")
                 for m in self.moves]
        return f"{self.name} {'binds' if self.binds else 'does NOT bind'} ({'; '.join(parts)})"


def active_filters(params: SamplingParams) -> tuple[str, ...]:
    """The filters a case turns on; at temperature 0 only the penalties act (greedy ignores the rest)."""
    names = PENALTIES if params.temperature == 0 else FILTERS
    return tuple(f for f in names if getattr(params, f) != SAMPLING_FIELDS_BY_NAME[f].neutral)


# --------------------------------------------------------------------------- the exact distributions


def _expected(case: SamplingCase, params: SamplingParams) -> list[np.ndarray]:
    from runnercheck.reference.sampler import expected_distribution

    return [expected_distribution(case.logits[j].to(torch.float64), params, case.history.prompt_ids,
                                  case.history.output_ids).numpy() for j in range(case.rows)]


def _scores(case: SamplingCase, params: SamplingParams, *, drop: Sequence[str]) -> np.ndarray:
    """Row 0's penalised, temperature-scaled scores with the filters in ``drop`` turned off (-inf: filtered)."""
    from runnercheck.reference.sampler import filtered_scores

    moved = replace(params, **{f: SAMPLING_FIELDS_BY_NAME[f].neutral for f in drop})
    return filtered_scores(case.logits[0].to(torch.float64), moved, case.history.prompt_ids, case.history.output_ids).numpy()


def detection_power(expected: np.ndarray, moved: np.ndarray, n: int, alpha: float = BINDING_ALPHA) -> float:
    """Probability that ``n`` draws from ``moved`` fail the chi-square test against ``expected``.

    Draws of tokens ``expected`` gives probability 0 fail the test outright (impossible tokens);
    otherwise the Pearson statistic on the test's own pooled bins is noncentral chi-square with
    ``lambda = n sum (q_b - p_b)^2 / p_b``.
    """
    impossible = float(moved[expected == 0].sum())
    p_impossible = -math.expm1(n * math.log1p(-min(impossible, 1.0 - 1e-16)))
    groups = stats.pool_bins(n * expected)
    if len(groups) < 2:
        return p_impossible
    p_bins = np.array([expected[g].sum() for g in groups])
    q_bins = np.array([moved[g].sum() for g in groups])
    noncentrality = n * float(np.sum((q_bins - p_bins) ** 2 / p_bins))
    dof = len(groups) - 1
    p_chisq = float(sps.ncx2.sf(sps.chi2.isf(alpha, dof), dof, noncentrality)) if noncentrality > 0 else 0.0
    return max(p_impossible, p_chisq)


# --------------------------------------------------------------------------- moves


def _geometric_mid(a: float, b: float) -> float:
    return math.sqrt(a * b) if b > 0 else a / 2


def _min_p_moves(case: SamplingCase) -> list[tuple[str, SamplingParams | None]]:
    p = case.params
    s = _scores(case, p, drop=THRESHOLD_FILTERS)
    ratios = np.sort(np.exp(s[np.isfinite(s)] - s.max()))[::-1]
    kept = int((ratios >= p.min_p).sum())
    tighter = replace(p, min_p=_geometric_mid(ratios[kept - 2], ratios[kept - 1])) if kept >= 2 else None
    looser = (replace(p, min_p=_geometric_mid(ratios[kept], ratios[kept + 1] if kept + 1 < ratios.size else 0.0))
              if kept < ratios.size else None)
    return [(f"min-p keeps {kept - 1}", tighter), (f"min-p keeps {kept + 1}", looser)]


def _top_p_moves(case: SamplingCase) -> list[tuple[str, SamplingParams | None]]:
    p = case.params
    s = _scores(case, p, drop=("top_p",))
    finite = np.sort(s[np.isfinite(s)])[::-1]
    cumulative = np.cumsum(np.exp(finite - finite.max())) / np.exp(finite - finite.max()).sum()
    kept = int(np.searchsorted(cumulative, p.top_p, side="left")) + 1  # first index with mass >= top_p
    kept = min(kept, cumulative.size)
    tighter = None
    if kept >= 2:
        below = cumulative[kept - 3] if kept >= 3 else 0.0
        tighter = replace(p, top_p=float((below + cumulative[kept - 2]) / 2))
    looser = replace(p, top_p=float((cumulative[kept - 1] + cumulative[kept]) / 2)) if kept < cumulative.size else None
    return [(f"top-p keeps {kept - 1}", tighter), (f"top-p keeps {kept + 1}", looser)]


def _top_k_moves(case: SamplingCase) -> list[tuple[str, SamplingParams | None]]:
    k = case.params.top_k
    return [(f"top-k {k - 1}", replace(case.params, top_k=k - 1) if k > 1 else None),
            (f"top-k {k + 1}", replace(case.params, top_k=k + 1))]


def _scaled_moves(case: SamplingCase, name: str) -> list[tuple[str, SamplingParams | None]]:
    """The parameter scaled by ``1 -+ PENALTY_STEP`` (a multiplicative penalty's logarithm: the penalty raised to
    that power); a move outside the field's valid values does not exist.  Every field without moves of its own
    (a new one in the table included) is moved so."""
    spec = SAMPLING_FIELDS_BY_NAME[name]
    value = getattr(case.params, name)
    out = []
    for factor in (1 - PENALTY_STEP, 1 + PENALTY_STEP):
        moved = value ** factor if spec.neutral == 1.0 and spec.stage == "penalty" else value * factor
        moved = round(moved) if spec.is_int else moved
        out.append((f"{spec.short} {moved:.4g}", replace(case.params, **{name: moved}) if spec.accepts(moved) else None))
    return out


def filter_moves(case: SamplingCase, name: str) -> list[tuple[str, SamplingParams | None]]:
    """The two moves of filter ``name`` in ``case`` (module docstring), labelled."""
    if name == "top_k":
        return _top_k_moves(case)
    if name == "top_p":
        return _top_p_moves(case)
    if name == "min_p":
        return _min_p_moves(case)
    if name in FILTERS:
        return _scaled_moves(case, name)
    raise ValueError(f"unknown filter {name!r}; known: {FILTERS}")


# --------------------------------------------------------------------------- the check


def binding_report(case: SamplingCase, alpha: float = BINDING_ALPHA) -> dict[str, FilterBinding]:
    """For every active filter of ``case``: its moves and whether it binds (at test level ``alpha``)."""
    base = _expected(case, case.params)
    report = {}
    for name in active_filters(case.params):
        moves = []
        for label, params in filter_moves(case, name):
            if params is None:
                moves.append(Move(label, None, 0.0, 0.0))
                continue
            moved = _expected(case, params)
            tv = max(0.5 * float(np.abs(m - b).sum()) for m, b in zip(moved, base))
            miss = math.prod(1.0 - detection_power(b, m, case.n_samples, alpha) for b, m in zip(base, moved))
            moves.append(Move(label, params, tv, 1.0 - miss))
        report[name] = FilterBinding(name, tuple(moves))
    return report


def binding_filters(case: SamplingCase, alpha: float = BINDING_ALPHA) -> tuple[str, ...]:
    return tuple(name for name, b in binding_report(case, alpha).items() if b.binds)


def case_problems(case: SamplingCase, report: dict[str, FilterBinding] | None = None, alpha: float = BINDING_ALPHA) -> list[str]:
    """Why ``case`` cannot detect an error in the filter(s) it declares (``case.binds``); [] if it can."""
    report = binding_report(case, alpha) if report is None else report
    active = active_filters(case.params)
    problems = []
    if case.tie_filter is not None:
        problems += tie_problems(case, alpha)
    elif active and not case.binds:
        problems.append(f"{case.name}: turns on {', '.join(active)} but declares no binding filter")
    for name in case.binds:
        if name not in active:
            problems.append(f"{case.name}: declares {name} binding, but {name} is not on")
        elif not report[name].binds:
            problems.append(f"{case.name}: {report[name].line()}")
    return problems


def tie_problems(case: SamplingCase, alpha: float = BINDING_ALPHA) -> list[str]:
    """Why ``case`` cannot tell its tie rule from the sort-position rules (`runnercheck.checks.chisq.conventions`); [] if it can."""
    from runnercheck.checks.chisq.conventions import CONTRACT, TIE_RULES, convention_distribution

    name = case.tie_filter
    if name not in active_filters(case.params):
        return [f"{case.name}: tests ties at {name}, but {name} is not on"]
    field = {"top_k": "top_k_ties", "top_p": "top_p_ties"}.get(name)
    if field is None:
        return [f"{case.name}: no tie rule exists for {name}"]
    base = _expected(case, case.params)
    problems = []
    for rule in TIE_RULES[1:]:
        other = replace(CONTRACT, name=f"ties-{rule}", **{field: rule})
        moved = [convention_distribution(case.logits[j], case.params, other, case.history.prompt_ids,
                                         case.history.output_ids) for j in range(case.rows)]
        power = 1.0 - math.prod(1.0 - detection_power(b, m, case.n_samples, alpha) for b, m in zip(base, moved))
        if power < REQUIRED_POWER:
            problems.append(f"{case.name}: {name} ties cut {rule} are not detectable (power {power:.3g})")
    return problems


def catalogue_problems(cases: Sequence[SamplingCase], alpha: float = BINDING_ALPHA) -> list[str]:
    return [p for case in cases for p in case_problems(case, alpha=alpha)]
