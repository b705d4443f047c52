"""What a differential campaign exercised: a count per feature, from the steps it compared.

`CoverageCounter.observe` reads each delivered step (the `SchedulerOutput` and the runner's
output that the oracle agreed with) and counts, per feature of `FEATURES`:

* sampling parameters, each on its own and in the pairs/groups that interact (filters with
  filters, filters with penalties, penalties with penalties, greedy with penalties);
* penalties applied over prompt tokens only (a request's first sampled token) and over output
  tokens (later tokens of a penalized request);
* request and row transitions: admitted, resumed after preemption, preempted, finished or
  aborted, a row taken over by another request;
* draft tokens: none, some or all of a step's drafts accepted;
* prefill chunking: a prefill in one step, the first / a middle / the final chunk of a split
  prefill, a chunk ending on a block boundary, a decode step, a prompt-logprob prefill chunk that
  fills the step's token budget;
* processed logprobs: sampled tokens whose processed logprobs a compared step reported;
* NaN and +Inf logit rows sampled, and with the whole-row kinds all-NaN, NaN/-Inf, +Inf/-Inf and
  exact-tie rows (planted by `runnercheck.stress.sim.faults` in runner and oracle alike; counted
  in runs whose runner took the hook: `FAULT_FEATURES`);
* shown, not gated (`SHOWN_FEATURES`: the sim plan's traffic reaches them, the cuda plan's churn
  draws neither small top-k nor full-chunk prompts): an exact-tie row sampled by a request with
  top-k 1..3 (a tie at the k-th value: the tie row holds four or more entries at its top) at a
  temperature above 0, and a step whose prompt-logprob rows are exactly the token budget (the
  runner's prompt-logprob chunk is full).

Features counted by other observers (staged-write patterns: `runnercheck.stress.run.staged_writes`) are merged in
with `add`.  A campaign whose total for a feature is zero did not test it: `zero_features` names
those, and `verify` fails on them.  `CoverageTally` words the headline every report shows: how many
features a campaign exercised (a count above zero), and of those it never reached, which the gate
fails it for and which are only shown.

Ownership: a counter owns its per-request bookkeeping (host dicts, one run).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from runnercheck.checks.compare import first_output_positions
from runnercheck.impl.interface import SAMPLING_FIELDS, RunnerLimits, SamplingField, SamplingParams

# The knobs of the interface's table of sampling fields (temperature aside: its features are greedy / temperature
# sampling), by report label; a knob is on when its field is away from its neutral value.
_KNOBS = {f.label: f for f in SAMPLING_FIELDS if f.stage != "temperature"}
_FILTERS = tuple(k for k, f in _KNOBS.items() if f.stage == "filter")
_PENALTIES = tuple(k for k, f in _KNOBS.items() if f.stage == "penalty")
def _on(spec: SamplingField, p: SamplingParams) -> bool:
    return getattr(p, spec.name) != spec.neutral


PARAM_PAIRS = tuple((a, b) for i, a in enumerate(_KNOBS) for b in list(_KNOBS)[i + 1:])

FEATURES: tuple[str, ...] = (
    "params: greedy", "params: temperature sampling", *(f"params: {k}" for k in _KNOBS),
    "params: explicit seed", "params: logprobs", "params: prompt logprobs", "params: stop tokens",
    *(f"combo: {a} + {b}" for a, b in PARAM_PAIRS),
    "combo: all three filters", "combo: all three penalties", "combo: greedy + penalties",
    "penalty over prompt tokens", "penalty over output tokens",
    "request admitted", "request resumed after preemption", "request preempted", "request finished or aborted",
    "row taken over by another request",  # ROW_FEATURE
    "drafts: none accepted", "drafts: some accepted", "drafts: all accepted",
    "prefill in one step", "prefill chunk: first", "prefill chunk: middle", "prefill chunk: final",
    "chunk ends on a block boundary", "decode step",
    "prompt logprobs: a chunk fills the token budget",  # FULL_CHUNK_FEATURE
    "logprobs: processed rows compared",  # PROCESSED_FEATURE
)
FULL_CHUNK_FEATURE = "prompt logprobs: a chunk fills the token budget"
# Sampled tokens whose processed logprobs (`SamplingParams.logprobs_mode`) a compared step reported.
PROCESSED_FEATURE = "logprobs: processed rows compared"
# Counted only in runs whose runner took the logits fault hook (`runnercheck.stress.sim.faults`).
# Counted from the runner's own row table (``state.req_to_row``); a runner without one cannot show it,
# so its runs leave it out rather than report a zero the gate would fail on.
ROW_FEATURE = "row taken over by another request"
FAULT_FEATURES: tuple[str, ...] = ("logits: NaN row sampled", "logits: +Inf row sampled")
# The whole-row fault kinds (`runnercheck.stress.sim.faults.ROW_KINDS`), counted when the fault sets ``row_modulus``.
ROW_FAULT_FEATURES: dict[str, str] = {"nan": "logits: NaN row sampled", "inf": "logits: +Inf row sampled",
                                      "all-nan": "logits: all-NaN row sampled",
                                      "nan/-inf": "logits: NaN/-Inf row sampled (no finite entry)",
                                      "+inf/-inf": "logits: +Inf/-Inf row sampled (no finite entry)",
                                      "tie": "logits: exact-tie row sampled"}
TIE_TOP_K_FEATURE = "logits: exact tie at the k-th value sampled (top-k 1..3)"
FULL_ROWS_FEATURE = "prompt logprobs: a step's rows fill the token budget"
# Counted and shown, never failing the coverage gate (module docstring).
SHOWN_FEATURES: tuple[str, ...] = (TIE_TOP_K_FEATURE, FULL_ROWS_FEATURE)
_TIE_WIDTH = 3  # a tie row's top holds at least this many entries past the first (`runnercheck.stress.sim.faults`)


def param_features(p: SamplingParams) -> list[str]:
    """The sampling-parameter features one request exercises."""
    on = [k for k, spec in _KNOBS.items() if _on(spec, p)]
    feats = ["params: greedy" if p.temperature == 0.0 else "params: temperature sampling"]
    feats += [f"params: {k}" for k in on]
    feats += [f"combo: {a} + {b}" for a, b in PARAM_PAIRS if a in on and b in on]
    if all(f in on for f in _FILTERS):
        feats.append("combo: all three filters")
    if all(q in on for q in _PENALTIES):
        feats.append("combo: all three penalties")
    if p.temperature == 0.0 and any(q in on for q in _PENALTIES):
        feats.append("combo: greedy + penalties")
    if p.seed is not None:
        feats.append("params: explicit seed")
    if p.logprobs is not None:
        feats.append("params: logprobs")
    if p.prompt_logprobs is not None:
        feats.append("params: prompt logprobs")
    if p.stop_token_ids:
        feats.append("params: stop tokens")
    return feats


class CoverageCounter:
    """Counts `FEATURES` over one run's delivered steps (see the module docstring)."""

    def __init__(self, limits: RunnerLimits, fault: Any = None, *, rows_observable: bool = True):
        self.limits = limits
        self.fault = fault
        self.rows_observable = rows_observable
        self.counts: Counter[str] = Counter()
        if fault is not None:
            self.counts.update({f: 0 for f in FAULT_FEATURES})
            if getattr(fault, "row_modulus", 0):
                self.counts.update({f: 0 for f in ROW_FAULT_FEATURES.values()})
                self.counts[TIE_TOP_K_FEATURE] = 0
        self.counts[FULL_ROWS_FEATURE] = 0
        self._params: dict[str, SamplingParams] = {}
        self._prompt_rows_len: dict[str, int] = {}  # prompt length of each live request that scores prompt logprobs
        self._prefill_len: dict[str, int] = {}
        self._outputs: dict[str, int] = {}
        self._rows_seen: dict[int, str] = {}

    def add(self, counts: Mapping[str, int]) -> None:
        self.counts.update(counts)

    def observe(self, report: Any) -> None:
        """Count the features of one delivered step (``report``: a `runnercheck.stress.run.driver.StepReport`)."""
        sched, got = report.sched, report.got
        if got is None or not report.comparison.ok:
            return
        c = self.counts
        gone = sched.finished_req_ids | sched.preempted_req_ids
        c["request preempted"] += len(sched.preempted_req_ids)
        c["request finished or aborted"] += len(sched.finished_req_ids)
        for rid in gone:
            self._params.pop(rid, None)
            self._prompt_rows_len.pop(rid, None)
        starts: dict[str, int] = {}
        for req in sched.new_requests:
            c["request resumed after preemption" if req.is_resumed else "request admitted"] += 1
            if not req.is_resumed:
                c.update(param_features(req.sampling_params))
            self._params[req.req_id] = req.sampling_params
            self._prefill_len[req.req_id] = len(req.prefill_token_ids)
            if req.sampling_params.prompt_logprobs is not None and not req.is_resumed:
                self._prompt_rows_len[req.req_id] = len(req.prompt_token_ids)
            else:  # a resumed request's prompt was scored before its preemption
                self._prompt_rows_len.pop(req.req_id, None)
            self._outputs[req.req_id] = len(req.output_token_ids)
            starts[req.req_id] = 0
        for cached in sched.cached_requests:
            starts[cached.req_id] = cached.num_computed_tokens
        produced = got.token_dict()
        flagged = dict(zip(got.req_ids, got.nan_flags)) if got.nan_flags else {}
        first_positions = first_output_positions(sched)
        prompt_rows = 0
        for rid, n in sched.num_scheduled_tokens.items():
            start, prefill = starts.get(rid, 0), self._prefill_len.get(rid, 0)
            drafts = sched.num_drafts(rid)
            self._count_chunk(start, n, prefill, drafts)
            asked = self._params.get(rid)
            if asked is not None and asked.prompt_logprobs is not None and start < prefill \
                    and n == self.limits.max_num_batched_tokens:
                c[FULL_CHUNK_FEATURE] += 1
            if rid in self._prompt_rows_len:  # positions p of this step with p + 1 inside the prompt score one row each
                prompt_rows += max(0, min(start + n - drafts, self._prompt_rows_len[rid] - 1) - start)
            toks = produced.get(rid, ())
            if drafts:
                accepted = len(toks) - 1
                c["drafts: none accepted" if accepted <= 0 else "drafts: all accepted" if accepted == drafts
                  else "drafts: some accepted"] += 1
                if rid in sched.num_device_drafts:
                    c["device drafts (n-gram)"] += 1
                    c["device drafts: none accepted" if accepted <= 0 else "device drafts: all accepted"
                      if accepted == drafts else "device drafts: some accepted"] += 1
            params = self._params.get(rid)
            if toks and params is not None and any(_on(_KNOBS[q], params) for q in _PENALTIES):
                c["penalty over output tokens" if self._outputs.get(rid, 0) else "penalty over prompt tokens"] += 1
            self._outputs[rid] = self._outputs.get(rid, 0) + len(toks)
            if toks and params is not None and params.logprobs is not None and params.logprobs_mode == "processed":
                c[PROCESSED_FEATURE] += len(toks)
            if self.fault is not None and rid in first_positions:
                for j in range(len(toks)):
                    kind = self.fault.kind_at(first_positions[rid] + j)
                    # A non-finite row is counted when the runner flagged it (the rule fired); a tie row is finite.
                    if kind is not None and (flagged.get(rid) or kind == "tie"):
                        c[ROW_FAULT_FEATURES[kind]] += 1
                    if kind == "tie" and params is not None and params.temperature > 0 \
                            and 1 <= params.top_k <= _TIE_WIDTH:
                        c[TIE_TOP_K_FEATURE] += 1
        if prompt_rows and prompt_rows == self.limits.max_num_batched_tokens:
            c[FULL_ROWS_FEATURE] += 1

    def observe_rows(self, req_to_row: Mapping[str, int]) -> None:
        """Count rows that changed hands (from a runner exposing ``state.req_to_row``)."""
        for rid, row in req_to_row.items():
            before = self._rows_seen.get(row)
            if before is not None and before != rid:
                self.counts["row taken over by another request"] += 1
            self._rows_seen[row] = rid

    def _count_chunk(self, start: int, n: int, prefill: int, drafts: int) -> None:
        c = self.counts
        end = start + n - drafts
        if start >= prefill:
            c["decode step"] += 1
        elif start == 0 and end >= prefill:
            c["prefill in one step"] += 1
        elif start == 0:
            c["prefill chunk: first"] += 1
        elif end < prefill:
            c["prefill chunk: middle"] += 1
        else:
            c["prefill chunk: final"] += 1
        if start < prefill and end % self.limits.block_size == 0:
            c["chunk ends on a block boundary"] += 1

    def totals(self) -> dict[str, int]:
        features = FEATURES if self.rows_observable else tuple(f for f in FEATURES if f != ROW_FEATURE)
        return {f: int(self.counts.get(f, 0)) for f in features} | {
            k: int(v) for k, v in self.counts.items() if k not in FEATURES}


def merge(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Feature totals over several runs: each feature of `FEATURES` some run could observe (all of them when
    there is no run), then the rest."""
    runs = list(counts)
    total: Counter[str] = Counter()
    for c in runs:
        total.update(c)
    observable = [f for f in FEATURES if not runs or any(f in c for c in runs)]
    return {f: int(total.get(f, 0)) for f in observable} | {k: int(v) for k, v in total.items() if k not in FEATURES}


def zero_features(totals: Mapping[str, int]) -> list[str]:
    """Features a campaign never exercised (patterns the runner never issues are shown, not gated)."""
    from runnercheck.stress.run.staged_writes import UNGATED_STAGED_FEATURES

    return [f for f in totals if totals[f] == 0 and f not in UNGATED_STAGED_FEATURES and f not in SHOWN_FEATURES]


@dataclass(frozen=True)
class CoverageTally:
    """A campaign's feature totals sorted for its headline.

    ``gated``: whether this run fails on a gated feature it never reached (``verify``'s gate; off in
    ``stress``, in a shard and under ``--no-coverage-gate``).  ``unreached_gated`` lists the features
    at zero the gate applies to (failures when ``gated``); ``unreached_ungated`` those it never
    applies to (staged-write patterns a runner need not issue, `SHOWN_FEATURES`).
    """

    total: int
    exercised: int
    unreached_gated: tuple[str, ...]
    unreached_ungated: tuple[str, ...]
    gated: bool

    @property
    def unreached(self) -> int:
        return len(self.unreached_gated) + len(self.unreached_ungated)

    def headline(self) -> str:
        """E.g. ``22 of 46 features exercised (24 never reached: 21 gated, failing the run; 3 shown only,
        patterns a runner need not produce)``."""
        line = f"{self.exercised} of {self.total} features exercised"
        if not self.unreached:
            return line
        gated, shown = len(self.unreached_gated), len(self.unreached_ungated)
        shown_only = f"{shown} shown only: patterns a runner need not produce or the plan need not reach"
        if self.gated:
            parts = [f"{gated} gated, failing the run"] * bool(gated) + [shown_only] * bool(shown)
            return f"{line} ({self.unreached} never reached: {'; '.join(parts)})"
        split = f": {gated} the coverage gate checks; {shown_only}" if gated and shown else ""
        return f"{line} ({self.unreached} never reached, not gated in this run{split})"


def tally(totals: Mapping[str, int], *, gated: bool) -> CoverageTally:
    """The headline numbers of ``totals`` (`merge`'s output); ``gated``: see `CoverageTally`."""
    zero = [f for f, n in totals.items() if n == 0]
    gate_applies = set(zero_features(totals))
    return CoverageTally(total=len(totals), exercised=len(totals) - len(zero),
                         unreached_gated=tuple(f for f in zero if f in gate_applies),
                         unreached_ungated=tuple(f for f in zero if f not in gate_applies), gated=gated)


__all__ = ["CoverageCounter", "CoverageTally", "FEATURES", "FAULT_FEATURES", "SHOWN_FEATURES", "PARAM_PAIRS", "param_features", "merge",
           "tally", "zero_features"]
