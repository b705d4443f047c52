"""Compare one step of a runner's output with the oracle's.

Rules (docs/SAMPLING.md, "Ties and tolerance")
----------------------------------------------
* **Batch**: the same request ids in the same order.
* **Token ids: exact.**  Where the runner's token differs from the oracle's and the oracle's
  `SampleResult` for that token reports ``gap < TIE_TOLERANCE`` (best minus second-best final
  score, absolute) or ``fragile=True`` (a filter boundary within 1e-4 of flipping), the difference
  is a `Tie`: reported, and the driver adopts the runner's token in the oracle.  Any other
  difference is a `Divergence`.  A tie in a draft row whose adoption would change how many drafts
  were accepted cannot be adopted token-for-token; it is a divergence (kind ``tie-length``).
* **Logprobs: within float32 tolerance.**  The runner computes logits in float32, the oracle in
  float64, so a logprob may differ by the fp32 model error: ``|got - expected| <= logprob_atol``
  (default 1e-3, in nats, relative to fp32 model logits of magnitude ~10).  Ranks and top-n lists
  are exact, except that two tokens whose oracle logprobs lie within ``logprob_atol`` of each other
  (near-tied logits) may swap order: a top-n difference is accepted only when the oracle's own top-n
  list shows such a near tie, and a rank may move by at most the number of the oracle's near-tied
  neighbours of the target (``neighbour_gaps``, listed at any rank), or when the top-n list shows one.  ``-inf`` must match ``-inf``.
* **Processed logprobs** (``logprobs_mode="processed"``) follow the same rules over the processed scores;
  an entry the oracle marks ``fragile`` (a filter boundary within fp32 reach: the kept set, hence the
  normaliser, may differ) is not compared.
* **NaN-flagged rows** (the oracle's ``nan_flags``) skip the logprob comparison for that request;
  the flags themselves must match.
* **Seeds**: for requests both sides report, equal.

Runner-output contract (`check_output_contract`, before any comparison): a runner's output for a
step is a `ModelRunnerOutput` for that step id, naming each scheduled request once, with one
token tuple (and, when reported, one logprob entry and one NaN flag) per request, integer token
ids in ``[0, vocab_size)``, at most ``drafts + 1`` tokens per request, and prompt logprobs only
for requests of the step.  A violation is a `Divergence` of kind ``output-contract`` -- recorded
with a repro like any other -- never an exception from the comparison.

Positions: a divergence names the 0-based index, in the request's full sequence, of the produced
token (``first_output_positions`` derives it from the `SchedulerOutput`), or of the prompt token
for prompt logprobs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from runnercheck.impl.interface import ModelRunnerOutput, SchedulerOutput, TokenLogprobs

DEFAULT_LOGPROB_ATOL = 1e-3


class SampleResultLike(Protocol):
    token: int
    gap: float
    fragile: bool
    nan_flag: bool


def default_tie_tolerance() -> float:
    """The oracle's documented tie tolerance (``runnercheck.reference.sampler.TIE_TOLERANCE``)."""
    from runnercheck.reference.sampler import TIE_TOLERANCE

    return float(TIE_TOLERANCE)


@dataclass(frozen=True)
class Tie:
    """A token the runner chose differently where the oracle's choice was within tolerance."""

    step: int
    req_id: str
    position: int | None
    expected: int
    got: int
    gap: float
    fragile: bool

    def line(self) -> str:
        why = "fragile filter boundary" if self.fragile else f"score gap {self.gap:.3g}"
        return f"step {self.step}: request {self.req_id!r} {_where(self.position)}: tie, oracle {self.expected} vs runner {self.got} ({why})"


@dataclass(frozen=True)
class Divergence:
    """A difference outside every tolerance.  ``kind`` says which rule it broke."""

    step: int
    req_id: str | None
    position: int | None
    kind: str  # token, tie-length, length, batch, nan_flag, logprob, rank, top, presence, seed,
    # runner-error, kernel-memory (a runner error that is a kernel's out-of-bounds access:
    # `runnercheck.checks.detectors.memory`), output-contract, crash (the run's process died: ``got`` says how)
    expected: object
    got: object
    detail: str = ""

    def line(self) -> str:
        if self.kind == "runner-error":
            return f"step {self.step}: runner raised {self.got}: {self.detail}"
        if self.kind == "kernel-memory":
            return f"step {self.step}: kernel memory fault ({self.got}): {self.detail}"
        if self.kind == "crash":
            return f"step {self.step}: the run crashed ({self.got}); last completed: {self.expected}{' (' + self.detail + ')' if self.detail else ''}"
        if self.kind == "output-contract":
            return f"step {self.step}: runner output breaks the output contract: {self.detail}"
        where = " ".join(
            part for part in (
                f"request {self.req_id!r}" if self.req_id is not None else "",
                f"position {self.position}" if self.position is not None else "",
            ) if part
        )
        head = f"step {self.step}: {where}: " if where else f"step {self.step}: "
        if self.kind == "token":
            what = f"expected token {self.expected}, got {self.got}"
        else:
            what = f"{self.kind}: expected {self.expected!r}, got {self.got!r}"
        extra = f" ({self.detail})" if self.detail else ""
        return head + what + extra


def _where(position: int | None) -> str:
    return f"position {position}" if position is not None else "position ?"


@dataclass
class StepComparison:
    step: int
    ties: list[Tie] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    tokens_compared: int = 0
    logprobs_compared: int = 0

    @property
    def ok(self) -> bool:
        return not self.divergences

    def first_divergence_line(self) -> str | None:
        return self.divergences[0].line() if self.divergences else None


def first_output_positions(sched: SchedulerOutput) -> dict[str, int]:
    """Sequence index of the first token each scheduled request produces in ``sched``'s step.

    A step computing positions ``[start, start + n)`` with ``k`` drafts samples its first token at
    ``start + n - k``.  ``start`` is 0 for a new request and ``num_computed_tokens`` for a cached
    one; requests the step lists in neither are left out.
    """
    starts = {r.req_id: 0 for r in sched.new_requests}
    starts.update({c.req_id: c.num_computed_tokens for c in sched.cached_requests})
    return {
        rid: starts[rid] + n - sched.num_drafts(rid)
        for rid, n in sched.num_scheduled_tokens.items()
        if rid in starts
    }


def compare_step(
    got: ModelRunnerOutput,
    expected: ModelRunnerOutput,
    results: Mapping[str, Sequence[SampleResultLike]],
    *,
    positions: Mapping[str, int] | None = None,
    tie_tolerance: float | None = None,
    logprob_atol: float = DEFAULT_LOGPROB_ATOL,
) -> StepComparison:
    """Compare ``got`` (runner) with ``expected`` (oracle); ``results`` is the oracle's per-token detail."""
    tol = default_tie_tolerance() if tie_tolerance is None else tie_tolerance
    positions = positions or {}
    cmp = StepComparison(step=expected.step_id)
    if got.step_id != expected.step_id or got.req_ids != expected.req_ids:
        cmp.divergences.append(
            Divergence(expected.step_id, None, None, "batch", (expected.step_id, expected.req_ids), (got.step_id, got.req_ids))
        )
        return cmp
    got_flags = _per_request(got.nan_flags, got.req_ids, False)
    exp_flags = _per_request(expected.nan_flags, expected.req_ids, False)
    got_lps = _per_request(got.logprobs, got.req_ids, None)
    exp_lps = _per_request(expected.logprobs, expected.req_ids, None)
    for i, rid in enumerate(expected.req_ids):
        first_pos = positions.get(rid)
        toks_matched = _compare_tokens(cmp, rid, first_pos, got.sampled_token_ids[i], expected.sampled_token_ids[i], results.get(rid, ()), tol)
        if exp_flags[rid] != got_flags[rid]:
            cmp.divergences.append(Divergence(cmp.step, rid, first_pos, "nan_flag", exp_flags[rid], got_flags[rid]))
        if exp_flags[rid]:
            continue
        e_lp, g_lp = exp_lps[rid] or (), got_lps[rid] or ()
        e_want = 0 if exp_lps[rid] is None else len(expected.sampled_token_ids[i])
        g_want = 0 if got_lps[rid] is None else len(got.sampled_token_ids[i])
        if (len(e_lp), len(g_lp)) != (e_want, g_want) or bool(e_lp) != bool(g_lp):
            cmp.divergences.append(
                Divergence(cmp.step, rid, first_pos, "presence", f"{len(e_lp)} logprob entries", f"{len(g_lp)} logprob entries")
            )
            continue
        for j in range(min(toks_matched, len(e_lp), len(g_lp))):
            pos = None if first_pos is None else first_pos + j
            _compare_logprobs(cmp, rid, pos, e_lp[j], g_lp[j], logprob_atol)
    for rid in set(expected.prompt_logprobs) | set(got.prompt_logprobs):
        if exp_flags.get(rid, False):
            continue
        e_p, g_p = tuple(expected.prompt_logprobs.get(rid, ())), tuple(got.prompt_logprobs.get(rid, ()))
        if len(e_p) != len(g_p):
            cmp.divergences.append(Divergence(cmp.step, rid, None, "presence", f"{len(e_p)} prompt logprobs", f"{len(g_p)} prompt logprobs"))
            continue
        for e, g in zip(e_p, g_p):
            if e.token_id != g.token_id:
                cmp.divergences.append(Divergence(cmp.step, rid, None, "prompt token", e.token_id, g.token_id))
                break
            _compare_logprobs(cmp, rid, None, e, g, logprob_atol, prompt=True)
    for rid in set(expected.seeds) & set(got.seeds):
        if expected.seeds[rid] != got.seeds[rid]:
            cmp.divergences.append(Divergence(cmp.step, rid, None, "seed", expected.seeds[rid], got.seeds[rid]))
    return cmp


def _is_token(v: object, vocab_size: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab_size


def check_output_contract(got: object, sched: SchedulerOutput, vocab_size: int) -> list[Divergence]:
    """What is wrong with ``got`` as the output of ``sched``'s step (empty when nothing); see the module docstring."""
    step = sched.step_id

    def bad(detail: str, req_id: str | None = None) -> list[Divergence]:
        return [Divergence(step, req_id, None, "output-contract", "a well-formed output", type(got).__name__, detail)]

    if not isinstance(got, ModelRunnerOutput):
        return bad(f"expected a ModelRunnerOutput, got {type(got).__name__}")
    if got.step_id != step:
        return bad(f"output is for step {got.step_id!r}, not step {step}")
    req_ids = got.req_ids
    if not isinstance(req_ids, tuple) or not all(isinstance(r, str) for r in req_ids):
        return bad(f"req_ids must be a tuple of strings, got {req_ids!r}"[:300])
    scheduled = set(sched.num_scheduled_tokens)
    if len(set(req_ids)) != len(req_ids) or set(req_ids) != scheduled:
        return bad(f"req_ids {sorted(req_ids)} must name each scheduled request once: {sorted(scheduled)}"[:300])
    n = len(req_ids)
    sampled = got.sampled_token_ids
    if not isinstance(sampled, tuple) or len(sampled) != n:
        return bad(f"{len(sampled) if isinstance(sampled, tuple) else type(sampled).__name__} token rows for {n} requests")
    for name in ("logprobs", "nan_flags"):
        value = getattr(got, name)
        if not isinstance(value, tuple) or len(value) not in (0, n):
            return bad(f"{name} holds {len(value) if isinstance(value, tuple) else type(value).__name__} entries for {n} requests")
    if got.nan_flags and not all(isinstance(f, bool) for f in got.nan_flags):
        return bad("nan_flags must be bools")
    for i, (rid, toks) in enumerate(zip(req_ids, sampled)):
        if not isinstance(toks, tuple) or not all(_is_token(t, vocab_size) for t in toks):
            return bad(f"tokens {toks!r} of request {rid!r} are not token ids in [0, {vocab_size})"[:300], rid)
        allowed = sched.num_drafts(rid) + 1
        if len(toks) > allowed:
            return bad(f"request {rid!r} produced {len(toks)} tokens, at most {allowed} possible", rid)
        if got.logprobs and got.logprobs[i] is not None:
            lps = got.logprobs[i]
            if not isinstance(lps, tuple) or len(lps) != len(toks) or not all(isinstance(lp, TokenLogprobs) for lp in lps):
                return bad(f"logprobs of request {rid!r} must hold one TokenLogprobs per token", rid)
    if not isinstance(got.prompt_logprobs, Mapping) or not set(got.prompt_logprobs) <= scheduled:
        return bad("prompt_logprobs must map requests of the step to their entries")
    if not isinstance(got.seeds, Mapping):
        return bad("seeds must map request ids to seeds")
    return []


def _per_request(values: Sequence, req_ids: Sequence[str], missing: object) -> dict:
    """A per-batch-row tuple as a dict; an empty tuple means the field was not reported."""
    if len(values) == 0:
        return {rid: missing for rid in req_ids}
    return dict(zip(req_ids, values))


def _compare_tokens(cmp: StepComparison, rid: str, first_pos: int | None, got: Sequence[int], exp: Sequence[int], results: Sequence[SampleResultLike], tol: float) -> int:
    """Compare one request's produced tokens; returns how many leading tokens matched exactly."""
    step = cmp.step
    for j in range(min(len(got), len(exp))):
        pos = None if first_pos is None else first_pos + j
        cmp.tokens_compared += 1
        if got[j] == exp[j]:
            continue
        res = results[j] if j < len(results) else None
        if res is not None and (res.gap < tol or res.fragile):
            if len(got) == len(exp) == j + 1:
                cmp.ties.append(Tie(step, rid, pos, exp[j], got[j], float(res.gap), bool(res.fragile)))
            else:
                cmp.divergences.append(
                    Divergence(step, rid, pos, "tie-length", tuple(exp), tuple(got), "a near-tie in a draft row changed the accepted drafts; the oracle cannot adopt it")
                )
            return j
        detail = "" if res is None else f"oracle gap {res.gap:.3g}"
        cmp.divergences.append(Divergence(step, rid, pos, "token", exp[j], got[j], detail))
        return j
    if len(got) != len(exp):
        pos = None if first_pos is None else first_pos + min(len(got), len(exp))
        cmp.divergences.append(Divergence(step, rid, pos, "length", tuple(exp), tuple(got), "different number of produced tokens"))
    return min(len(got), len(exp))


def _close(a: float, b: float, atol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol


def _rank_within_near_ties(exp: TokenLogprobs, got_rank: int, atol: float) -> bool:
    """Whether ``got_rank`` is one the oracle's near-tied neighbours allow (at any rank, not only in
    the top-n list): each neighbour within ``atol`` above the target may fall below it, each within
    ``atol`` below (or equal) may rise above it.  Needs the oracle's ``neighbour_gaps``
    (`runnercheck.reference.sampler.OracleTokenLogprobs`); without them no rank moves."""
    gaps = getattr(exp, "neighbour_gaps", ())
    above = sum(1 for g in gaps if 0 < g <= atol)
    below = sum(1 for g in gaps if -atol <= g <= 0)
    return exp.rank - above <= got_rank <= exp.rank + below


def _near_tie_evidence(exp: TokenLogprobs, a: float, atol: float, exclude: int) -> bool:
    """Whether the oracle's top-n list holds another token within ``atol`` of logprob ``a``."""
    return any(t != exclude and _close(lp, a, atol) for t, lp in zip(exp.top_token_ids, exp.top_logprobs))


def _compare_logprobs(cmp: StepComparison, rid: str, pos: int | None, exp: TokenLogprobs, got: TokenLogprobs, atol: float, *, prompt: bool = False) -> None:
    step = cmp.step
    if getattr(exp, "fragile", False):
        # processed logprobs over a kept set that fp32 may draw otherwise (a filter boundary within reach): the
        # token comparison already treats that row as a tie; its normaliser has no single right value
        return
    cmp.logprobs_compared += 1
    label = "prompt " if prompt else ""
    if not _close(got.logprob, exp.logprob, atol):
        cmp.divergences.append(
            Divergence(step, rid, pos, f"{label}logprob", exp.logprob, got.logprob, f"token {exp.token_id}, atol {atol:g}")
        )
        return
    if got.rank != exp.rank and not _rank_within_near_ties(exp, got.rank, atol) \
            and not _near_tie_evidence(exp, exp.logprob, atol, exp.token_id):
        cmp.divergences.append(Divergence(step, rid, pos, f"{label}rank", exp.rank, got.rank, f"token {exp.token_id}"))
        return
    if len(got.top_token_ids) != len(exp.top_token_ids) or len(got.top_logprobs) != len(got.top_token_ids):
        cmp.divergences.append(Divergence(step, rid, pos, f"{label}top", len(exp.top_token_ids), len(got.top_token_ids), "top-n length"))
        return
    exp_lp_of = dict(zip(exp.top_token_ids, exp.top_logprobs))
    for k, (e_tok, e_lp, g_tok, g_lp) in enumerate(zip(exp.top_token_ids, exp.top_logprobs, got.top_token_ids, got.top_logprobs)):
        if not _close(g_lp, e_lp, atol):
            cmp.divergences.append(Divergence(step, rid, pos, f"{label}top", (e_tok, e_lp), (g_tok, g_lp), f"top-{k + 1} logprob"))
            return
        if g_tok == e_tok:
            continue
        # A swap is fine only between near-tied tokens: the runner's token at this rank must hold
        # (per the oracle) a logprob within atol of the oracle's token at this rank; past the end
        # of the oracle's list we can only require that the oracle's last entries are near-tied.
        swapped_ok = (
            _close(exp_lp_of[g_tok], e_lp, atol)
            if g_tok in exp_lp_of
            else _near_tie_evidence(exp, e_lp, atol, e_tok) or k == len(exp.top_token_ids) - 1
        )
        if not swapped_ok:
            cmp.divergences.append(Divergence(step, rid, pos, f"{label}top", (e_tok, e_lp), (g_tok, g_lp), f"top-{k + 1} token"))
            return
