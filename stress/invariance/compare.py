"""Bitwise comparison of a probe's batched trace with its alone trace, and what a difference means.

Equality is exact by default: the same token ids, and logprobs, ranks and top-n lists whose floats
have the same bits (``tolerance`` > 0 allows that much absolute logprob difference instead).  The
first difference of a probe in a scenario is classified from the two runs' logprobs at that step:

``logprob-drift``   the same token, different logprobs: the logits depend on the batch (numerics),
                    nothing visible changed yet
``tie-flip``        a different token whose margin (the gap between the two tokens' logprobs in the
                    alone run) is within the step's drift: rounding that depends on the batch
                    flipped a near-tie (greedy); for a sampled request, a flip under drift
``sampler-path``    a different token although every logprob the two runs report is identical:
                    the logits agree, so the choice itself depends on the batch (noise keyed by
                    batch slot, a filter path chosen by batch size)
``corruption``      a different token with a margin well beyond the drift: not rounding
``prompt-logprobs`` a prompt-logprob row differs (drift or a different top-n)
``length``          one run produced more tokens than the other
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from runnercheck.impl.interface import TokenLogprobs
from runnercheck.stress.invariance.execute import ProbeTrace, StepBatch

# A sampled token's flip counts as a tie flip when the logits drift this little (logprob units).
SAMPLED_FLIP_DRIFT = 1e-3


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def _float_equal(a: float, b: float, tolerance: float) -> bool:
    if tolerance == 0.0:
        return _bits(a) == _bits(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= tolerance


def logprobs_equal(a: TokenLogprobs | None, b: TokenLogprobs | None, tolerance: float = 0.0) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return (a.token_id == b.token_id and a.rank == b.rank and a.top_token_ids == b.top_token_ids
            and _float_equal(a.logprob, b.logprob, tolerance)
            and len(a.top_logprobs) == len(b.top_logprobs)
            and all(_float_equal(x, y, tolerance) for x, y in zip(a.top_logprobs, b.top_logprobs)))


def _table(lp: TokenLogprobs | None) -> dict[int, float]:
    if lp is None:
        return {}
    table = dict(zip(lp.top_token_ids, lp.top_logprobs))
    table.setdefault(lp.token_id, lp.logprob)
    return table


def drift(a: TokenLogprobs | None, b: TokenLogprobs | None) -> float:
    """Largest absolute logprob difference over the tokens both runs report (0 when none is shared)."""
    ta, tb = _table(a), _table(b)
    diffs = [abs(ta[t] - tb[t]) for t in ta.keys() & tb.keys() if math.isfinite(ta[t]) and math.isfinite(tb[t])]
    return max(diffs, default=0.0)


@dataclass(frozen=True)
class Difference:
    """The first place a probe's batched run left its alone run."""

    scenario: str
    change: str  # the scenario's batch change, in words
    probe: str
    probe_description: str
    what: str  # "token" or "prompt-logprob"
    index: int  # output (or prompt position) index
    kind: str  # see the module docstring
    alone_step: StepBatch | None
    batched_step: StepBatch | None
    alone_token: int | None
    batched_token: int | None
    margin: float | None  # logprob gap between the two tokens in the alone run (None: not reported)
    drift: float  # largest logprob difference between the runs at this index

    def line(self) -> str:
        where = f"output {self.index}" if self.what == "token" else f"prompt position {self.index + 1}"
        step = self.batched_step.describe() if self.batched_step else "no step"
        alone = self.alone_step.describe() if self.alone_step else "no step"
        tok = (f"token {self.alone_token} alone vs {self.batched_token} batched"
               if self.alone_token != self.batched_token else f"token {self.alone_token} in both")
        if self.alone_token == self.batched_token:
            margin = "same token"
        else:
            margin = "margin unknown (token outside the reported top-n)" if self.margin is None else f"margin {self.margin:.3g}"
        return (f"{self.kind}: {self.probe} in scenario {self.scenario!r} ({self.change}) at {where}: {tok}; "
                f"{margin}, logprob drift {self.drift:.3g}; batched {step}; alone {alone}")

    def to_dict(self) -> dict:
        return {
            "scenario": self.scenario, "change": self.change, "probe": self.probe, "probe_description": self.probe_description,
            "what": self.what, "index": self.index, "kind": self.kind,
            "alone_step": None if self.alone_step is None else self.alone_step.__dict__ | {"req_ids": list(self.alone_step.req_ids)},
            "batched_step": None if self.batched_step is None else self.batched_step.__dict__ | {"req_ids": list(self.batched_step.req_ids)},
            "alone_token": self.alone_token, "batched_token": self.batched_token,
            "margin": self.margin, "drift": self.drift, "line": self.line(),
        }


def _classify(alone: ProbeTrace, batched: ProbeTrace, i: int, greedy: bool, tolerance: float) -> tuple[str, float | None, float]:
    a_lp, b_lp = alone.logprobs[i], batched.logprobs[i]
    d = drift(a_lp, b_lp)
    a_tok, b_tok = alone.tokens[i], batched.tokens[i]
    if a_tok == b_tok:
        return "logprob-drift", None, d
    table = _table(a_lp)
    margin = table[a_tok] - table[b_tok] if a_tok in table and b_tok in table else None
    if a_lp is not None and b_lp is not None and logprobs_equal(
            TokenLogprobs(0, 0.0, 0, a_lp.top_token_ids, a_lp.top_logprobs),
            TokenLogprobs(0, 0.0, 0, b_lp.top_token_ids, b_lp.top_logprobs), tolerance):
        return "sampler-path", margin, d
    if greedy:
        flip = margin is not None and abs(margin) <= max(4 * d, 1e-6)
    else:
        flip = 0 < d <= SAMPLED_FLIP_DRIFT
    return ("tie-flip" if flip else "corruption"), margin, d


def first_difference(scenario: str, change: str, probe: str, description: str, greedy: bool, alone: ProbeTrace,
                     batched: ProbeTrace, tolerance: float = 0.0) -> Difference | None:
    """The first difference between ``batched`` and ``alone`` (prompt logprobs first: they come from
    the prefill, before any token is sampled), or None when they agree."""
    for i, (a, b) in enumerate(zip(alone.prompt_logprobs, batched.prompt_logprobs)):
        if not logprobs_equal(a, b, tolerance):
            return Difference(scenario, change, probe, description, "prompt-logprob", i, "prompt-logprobs",
                              alone.prompt_steps[i], batched.prompt_steps[i], a.token_id, b.token_id, None, drift(a, b))
    if len(alone.prompt_logprobs) != len(batched.prompt_logprobs):
        i = min(len(alone.prompt_logprobs), len(batched.prompt_logprobs))
        return Difference(scenario, change, probe, description, "prompt-logprob", i, "length", None, None, None, None, None, 0.0)
    for i, (a_tok, b_tok) in enumerate(zip(alone.tokens, batched.tokens)):
        if a_tok != b_tok or not logprobs_equal(alone.logprobs[i], batched.logprobs[i], tolerance):
            kind, margin, d = _classify(alone, batched, i, greedy, tolerance)
            return Difference(scenario, change, probe, description, "token", i, kind, alone.steps[i], batched.steps[i],
                              a_tok, b_tok, margin, d)
    if len(alone.tokens) != len(batched.tokens):
        i = min(len(alone.tokens), len(batched.tokens))
        return Difference(scenario, change, probe, description, "token", i, "length", None, None, None, None, None, 0.0)
    return None


__all__ = ["Difference", "first_difference", "logprobs_equal", "drift", "SAMPLED_FLIP_DRIFT"]
