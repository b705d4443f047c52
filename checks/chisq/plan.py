"""What a chi-square run draws: its options, and the matrix cases and planted biases they select.

The catalogue (`runnercheck.checks.chisq.cases`) filtered by ``--cases`` and the deep-tail switch, then shared out
among ``--shard`` jobs (`in_shard`); `zero_cases_reason` says why a run whose matrix was asked for tested nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from runnercheck.checks.chisq.case import SamplingCase
from runnercheck.checks.chisq.cases import build_cases, deep_tail_cases
from runnercheck.checks.chisq.isolated import Isolation

DEFAULT_ALPHA = 0.01


@dataclass
class RunOptions:
    """A chi-square run's options: the command's arguments (`runnercheck.checks.chisq.run`), or a caller's."""

    quick: bool = True
    device: str = "auto"
    samples: int | None = None
    seed: int = 0
    alpha: float = DEFAULT_ALPHA
    correction: str = "holm"
    calibration: bool = True
    calibration_runs: int | None = None
    power: bool = True
    deep_tail: bool = False
    case_filter: str | None = None
    matrix: bool = True
    biases: tuple[str, ...] | None = None  # planted biases for the power report (None: the mode's plan)
    power_repeats: int | None = None
    max_rows_per_call: int | None = None  # bound on the logit rows of one sampler call (None: the sampler's own or none)
    spec: bool = True  # the speculative-verification cases (`runnercheck.checks.chisq.spec`), with the matrix
    shard: tuple[int, int] = (0, 1)  # (I, N): every N-th matrix case and planted bias from I; spec cases, calibration in I = 0
    # The sampler is third-party code: run it in a child process (`runnercheck.checks.chisq.isolated.Isolation`).
    isolation: Isolation | None = None
    convention: str = "contract"  # `runnercheck.checks.chisq.conventions.CONVENTIONS` name the expected distributions follow


def zero_cases_reason(matched: int, selected: int, skipped: Sequence[dict], opts: RunOptions) -> str:
    """Why a run whose matrix was asked for tested no case (such a run fails): ``matched`` cases
    met ``--cases``, ``selected`` of them fell to this shard, the rest of those were ``skipped``."""
    which = f"--cases {opts.case_filter}" if opts.case_filter else "the catalogue"
    if matched == 0:
        return f"0 cases matched {which}"
    if selected == 0:
        return f"0 cases ran: shard {opts.shard[0]}/{opts.shard[1]} got none of the {matched} cases of {which}"
    reasons: dict[str, int] = {}
    for s in skipped:
        reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
    if len(reasons) == 1:
        return f"0 cases ran: {len(skipped)} skipped because {next(iter(reasons))}"
    return f"0 cases ran: {len(skipped)} skipped (" + "; ".join(f"{n} because {why}" for why, n in reasons.items()) + ")"


def in_shard(items: list, shard: tuple[int, int]) -> list:
    """A shard's items in campaign order: every N-th from I (the shards of N jobs partition ``items``)."""
    index, count = shard
    return items[index::count]


def matching_cases(opts: RunOptions) -> list[SamplingCase]:
    """The matrix cases ``opts`` asks for (catalogue, deep tails, ``--cases``), before sharding."""
    cases = build_cases(opts.quick) + (deep_tail_cases() if opts.deep_tail else [])
    if opts.case_filter:
        cases = [c for c in cases if opts.case_filter in c.name]
    return cases
