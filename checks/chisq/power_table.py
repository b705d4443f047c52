"""What each chi-square mode can detect: the power of every case against coarse-arithmetic samplers, computed.

For a bias with an exact alternative distribution ``q`` (`ALTERNATIVES`: what the sampler of
`runnercheck.checks.chisq.planted_cdf` draws from), a case's power at ``n`` draws is the larger of its
chi-square test's (`runnercheck.checks.chisq.binding.detection_power`: noncentral chi-square on the test's own
pooled bins, or an impossible token drawn) and, for a tail case, its tail test's (noncentral chi-square with
1 dof on tail vs the rest, ``lambda = n (q_t - p_t)^2 / (p_t (1 - p_t))``), at ``TABLE_ALPHA``, Holm's first
step over a matrix of ~100 tests at 0.01.  Nothing is simulated or guessed.

``python -m runnercheck.checks.chisq.power_table`` prints the table docs/CHISQ.md holds.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
from scipy import stats as sps

from runnercheck.checks.chisq.binding import detection_power
from runnercheck.checks.chisq.case import SamplingCase

TABLE_ALPHA = 1e-4
TARGET_POWER = 0.8


def fp16_probabilities(p: np.ndarray) -> np.ndarray:
    """The distribution drawn when probabilities are stored in fp16 before the cumulative sum."""
    q = p.astype(np.float16).astype(np.float64)
    return q / q.sum()


def uniform_bits(bits: int) -> Callable[[np.ndarray], np.ndarray]:
    """Inverse-CDF with a ``bits``-bit uniform ``u = k / 2^bits``: token i is drawn for ``C_{i-1} <= u < C_i``."""
    def moved(p: np.ndarray) -> np.ndarray:
        grid = np.ceil(np.cumsum(p) * 2.0**bits)
        grid[-1] = 2.0**bits
        return np.diff(np.concatenate([[0.0], grid])) / 2.0**bits
    return moved


ALTERNATIVES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "fp16-probabilities": fp16_probabilities,
    "u16-uniform": uniform_bits(16),
}


def _tail_power(p: np.ndarray, q: np.ndarray, tail: range, n: int, alpha: float) -> float:
    idx = np.arange(tail.start, tail.stop)
    pt, qt = float(p[idx].sum()), float(q[idx].sum())
    if not 0 < pt < 1:
        return 0.0
    lam = n * (qt - pt) ** 2 / (pt * (1 - pt))
    return float(sps.ncx2.sf(sps.chi2.isf(alpha, 1), 1, lam)) if lam > 0 else 0.0


def case_power(case: SamplingCase, bias: str, n: int | None = None, alpha: float = TABLE_ALPHA) -> float:
    """Probability that ``n`` (default: the case's) draws of row 0 from ``bias`` fail the case's tests."""
    from runnercheck.checks.chisq.draws import expected_rows

    n = case.n_samples if n is None else n
    p = expected_rows(case)[0]
    q = ALTERNATIVES[bias](p)
    power = detection_power(p, q, n, alpha)
    if case.tail_tokens is not None:
        power = max(power, _tail_power(p, q, case.tail_tokens, n, alpha))
    return power


def draws_for_power(case: SamplingCase, bias: str, target: float = TARGET_POWER, limit: int = 10**13) -> int | None:
    """The fewest draws (to 2 significant digits) at which the case reaches ``target`` power; None past ``limit``."""
    if case_power(case, bias, limit) < target:
        return None
    lo, hi = 1, limit
    while hi > 1.01 * lo:
        mid = int(math.sqrt(lo * hi))
        lo, hi = (lo, mid) if case_power(case, bias, mid) >= target else (mid, hi)
    return int(float(f"{hi:.2g}"))


def mode_rows(quick: bool) -> list[dict[str, object]]:
    """Per bias: the mode's most sensitive case, its draws, its power there and the draws 0.8 would need."""
    from runnercheck.checks.chisq.cases import build_cases

    cases = [c for c in build_cases(quick) if c.rows == 1 and c.params.temperature > 0]
    rows = []
    for bias in ALTERNATIVES:
        best = max(cases, key=lambda c: case_power(c, bias))
        rows.append({"bias": bias, "mode": "quick" if quick else "full", "case": best.name, "draws": best.n_samples,
                     "power": case_power(best, bias), "draws_for_0.8": draws_for_power(best, bias)})
    return rows


def markdown_table() -> str:
    lines = [f"| bias | mode | most sensitive case | draws | power at alpha {TABLE_ALPHA:g} | draws for power 0.8 |",
             "|---|---|---|---:|---:|---:|"]
    for quick in (True, False):
        for r in mode_rows(quick):
            need = "never (below 1e13)" if r["draws_for_0.8"] is None else f"{r['draws_for_0.8']:.2g}"
            lines.append(f"| {r['bias']} | {r['mode']} | {r['case']} | {r['draws']:.2g} | {r['power']:.3g} | {need} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
