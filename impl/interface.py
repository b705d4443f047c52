"""The scheduler <-> runner contract, shared by the runner (`impl`) and the oracle (`reference`).

This module imports nothing else from `impl`: the oracle may import it.

One step of the contract
------------------------
The scheduler sends a `SchedulerOutput`; the runner answers (asynchronously) with a
`ModelRunnerOutput`.  For every scheduled request the step computes the tokens at positions
``[num_computed, num_computed + n)`` of that request's prefill/sequence, where ``n`` is its entry in
`SchedulerOutput.num_scheduled_tokens` and ``num_computed`` is the request's computed-token count
*before* the step (for a new request: its prefix-cache hit `NewRequest.num_computed_tokens`, usually
0; for a cached request: its entry in `CachedRequests.num_computed_tokens`).
A request *samples* in a step when the scheduled tokens reach the end of everything the runner
knows about it (its whole prefill, or for a decode the last sampled token).  A partial prefill chunk
samples nothing (its `sampled_token_ids` entry is empty).

Draft tokens (speculative decoding): ``draft_token_ids[req]`` lists k draft tokens appended after
the request's last known token; ``n`` then counts them (``n = 1 + k`` for a decode).  The runner
samples one target token at each of the k+1 positions with the position-keyed noise, accepts
drafts while they equal the target's token, and returns the accepted drafts plus the first
target token that disagreed (or the bonus token).  Because noise is keyed by position, the output
equals that of a run without drafts.

Seeds: a request whose `SamplingParams.seed` is None samples with `effective_seed(...)`, derived
from the runner's base seed and the request id, so every run is replayable and the oracle
(given the same base seed) samples the same tokens.  The seed used is reported in
`ModelRunnerOutput.seeds`.

Errors: the boundary checks (`runnercheck.impl.boundary`) raise a subclass of `SchedulerOutputError` naming the
request and field; a runner runs them before changing any state (all-or-nothing).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Iterable, Iterator, Mapping, Protocol, runtime_checkable

MAX_SEED = 2**63 - 1
DEFAULT_MAX_LOGPROBS = 20


# --------------------------------------------------------------------------- errors


class SchedulerOutputError(ValueError):
    """A bad `SchedulerOutput` (or request) rejected at the runner's boundary.

    ``req_id`` and ``field`` name what was wrong; no runner state was changed.
    """

    def __init__(self, message: str, *, req_id: str | None = None, field: str | None = None):
        where = []
        if req_id is not None:
            where.append(f"request {req_id!r}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = f"[{', '.join(where)}] " if where else ""
        super().__init__(prefix + message)
        self.req_id = req_id
        self.field = field


class UnknownRequestError(SchedulerOutputError):
    """A cached/finished/preempted/scheduled id the runner does not hold."""


class DuplicateRequestError(SchedulerOutputError):
    """A new request whose id is already live, or an id listed twice in one step."""


class TokenOutOfVocabError(SchedulerOutputError):
    """A prompt, output, draft or stop token id outside ``[0, vocab_size)``."""


class ScheduledTokensError(SchedulerOutputError):
    """Negative, zero, over-budget or beyond-the-known-tokens scheduled counts."""


class MaxModelLenError(SchedulerOutputError):
    """A sequence that would grow beyond ``max_model_len``."""


class BlockIdError(SchedulerOutputError):
    """A KV block id out of range, or too few blocks for the scheduled tokens."""


class SamplingParamsError(SchedulerOutputError):
    """A sampling parameter outside its domain (temperature < 0 or NaN, top_p outside (0, 1], ...)."""


class LogprobsLimitError(SchedulerOutputError):
    """More (prompt) logprobs asked for than the runner's ``max_logprobs``."""


class LogprobsModeError(SamplingParamsError):
    """A ``logprobs_mode`` that is not one of `LOGPROBS_MODES` (``"raw"``, ``"processed"``)."""


class FinishedAndScheduledError(SchedulerOutputError):
    """A request listed as finished or preempted and also scheduled or cached in the same step."""


class CapacityError(SchedulerOutputError):
    """More live requests than ``max_num_reqs`` rows."""


class StepIdError(SchedulerOutputError):
    """A ``step_id`` that is not an int, or not larger than the last accepted step's."""


class SchedulerOutputTypeError(SchedulerOutputError, TypeError):
    """A field (or an element of one) of the wrong type: a list where a set is expected, ``None``
    sampling params, a float token id, a request that is not a `NewRequest`, cached requests that are not a
    `CachedRequests` of tuples of one length, ..."""


class PrefixHitError(SchedulerOutputError):
    """A new request's ``num_computed_tokens`` (prefix-cache hit) that the runner cannot honour."""


class PrefixHitAlignmentError(PrefixHitError):
    """A hit that is not a whole number of KV blocks."""


class PrefixHitLengthError(PrefixHitError):
    """A hit that is not an int, negative, or not below the prefill (at least one token must be computed)."""


class PrefixHitBlocksError(PrefixHitError):
    """A hit whose cached positions are not covered by the request's leading block ids."""


class PrefixHitPromptLogprobsError(PrefixHitError):
    """A hit on a request asking for prompt logprobs (their positions would never be computed)."""


class DeviceDraftsError(ScheduledTokensError):
    """A bad ``num_device_drafts`` entry: no proposer configured, k above its ``num_spec_tokens``, a
    request not scheduled (or scheduled with explicit drafts too), or one with no proposal yet (it has
    not sampled since its admission)."""


class SpecVerifyError(ValueError):
    """Inputs that speculative verification (`runnercheck.reference.spec_verify`, `runnercheck.impl.sample.spec_verify`)
    cannot take; raised before any device work.  Shared by the oracle and the runner's launcher."""


class SpecTooManyDraftsError(SpecVerifyError):
    """A request with more draft tokens than the configured ``max_spec_tokens``."""


class SpecVocabMismatchError(SpecVerifyError):
    """Draft probabilities over a vocabulary of another size than the target's."""


class SpecProbabilityError(SpecVerifyError):
    """A probability row (target or draft) holding a negative, NaN or infinite entry, or no mass."""


class SpecLayoutError(SpecVerifyError):
    """Row counts, cumulative offsets or per-request tensors that do not agree, or a draft token id
    outside the vocabulary."""


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class SamplingField:
    """One per-row sampling parameter: a row of `SAMPLING_FIELDS`, the one list of them.

    Everything that needs the *set* of sampling parameters reads it from that table: `SamplingParams.validate`,
    the per-row device tensors (`runnercheck.impl.sample.state.SamplingState`), the C boundary and admission
    (handed the table as data: `runnercheck.impl.step_reader.BOUNDARY_RULES`, `runnercheck.impl.admission.ADMISSION_FIELDS`),
    the sampler contract, the chi-square binding cases, random churn, coverage and the state machine
    (`runnercheck.stress`).  What a parameter *does* (the kernels', the oracle's and the baseline samplers' code)
    stays code.  docs/EXTENDING.md walks through adding one.

    ``dtype``: the per-row device tensor's element type, ``"float32"`` (a Python int or float, finite) or
    ``"int32"`` (a Python int).  ``neutral``: the value that turns the parameter off, also its default.  A value
    is valid when it is ``neutral`` or lies within ``low``/``high`` (None: unbounded; ``*_open``: the bound itself
    excluded).  ``stage``: where the pipeline applies it (``"temperature"``, ``"filter"`` on the scaled scores,
    ``"penalty"`` on the raw logits), which tells churn and coverage which combinations interact.  ``label`` and
    ``short`` name it in reports.  ``draw``: a range of "on" values random workloads draw from (rounded to 3 places;
    an ``int32`` draw is capped at the vocabulary size when ``counts_tokens``).
    """

    name: str
    dtype: str
    neutral: float | int
    low: float | int | None
    high: float | int | None
    stage: str
    label: str
    short: str
    draw: tuple[float, float]
    doc: str
    low_open: bool = False
    high_open: bool = False
    counts_tokens: bool = False

    @property
    def is_int(self) -> bool:
        return self.dtype == "int32"

    @property
    def rule(self) -> str:
        """The validation rule in words (the message of a `SamplingParamsError`)."""
        if self.high is None:
            bound = f"{'>' if self.low_open else '>='} {self.low:g}"
            if not self.in_range(self.neutral):
                return f"be {self.neutral!r} (off) or {bound}"
            return f"be {bound}" if self.is_int else f"be a finite number {bound}"
        span = f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        return f"be {self.neutral!r} (off) or lie in {span}" if not self.in_range(self.neutral) else f"lie in {span}"

    def in_range(self, value: float | int) -> bool:
        """Whether ``value`` (an int, or a finite float) lies within the bounds."""
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def accepts(self, value: object) -> bool:
        """Whether ``value`` is valid for this field (of its type, neutral or within range; a float finite)."""
        if isinstance(value, bool):
            return False
        if self.is_int:
            return isinstance(value, int) and (value == self.neutral or self.in_range(value))
        if not isinstance(value, (int, float)):
            return False
        try:
            as_float = float(value)  # an int too large for a float is rejected here, not by an OverflowError later
        except OverflowError:
            return False
        return math.isfinite(as_float) and (value == self.neutral or self.in_range(value))


# The per-row sampling parameters, in the order of their device tensors, of the C twins' layouts and of the
# random draws in `runnercheck.stress.sim.churn` (a new one goes last, so existing seeds keep drawing what they drew).
SAMPLING_FIELDS: tuple[SamplingField, ...] = (
    SamplingField("temperature", "float32", 1.0, 0.0, None, "temperature", "temperature", "T", (0.3, 1.5),
                  "Divides the logits; 0 is greedy."),
    SamplingField("top_k", "int32", -1, 1, None, "filter", "top-k", "k", (1, 64),
                  "Keep the k highest-scoring tokens (ties at the k-th kept).", counts_tokens=True),
    SamplingField("top_p", "float32", 1.0, 0.0, 1.0, "filter", "top-p", "p", (0.3, 0.99),
                  "Keep the smallest head whose probability mass reaches p.", low_open=True),
    SamplingField("min_p", "float32", 0.0, 0.0, 1.0, "filter", "min-p", "minp", (0.01, 0.3),
                  "Keep tokens whose probability is at least min_p times the top one's."),
    SamplingField("repetition_penalty", "float32", 1.0, 0.0, None, "penalty", "repetition penalty", "rep", (0.8, 1.5),
                  "Divides positive (multiplies negative) logits of tokens seen in prompt or output.", low_open=True),
    SamplingField("frequency_penalty", "float32", 0.0, -2.0, 2.0, "penalty", "frequency penalty", "freq", (-1.0, 1.0),
                  "Subtracted once per occurrence of a token in the output."),
    SamplingField("presence_penalty", "float32", 0.0, -2.0, 2.0, "penalty", "presence penalty", "pres", (-1.0, 1.0),
                  "Subtracted once from every token present in the output."),
)
SAMPLING_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in SAMPLING_FIELDS)
SAMPLING_STAGES = ("temperature", "filter", "penalty")
SAMPLING_FIELDS_BY_NAME: Mapping[str, SamplingField] = {f.name: f for f in SAMPLING_FIELDS}

# What a request's logprobs describe (`SamplingParams.logprobs_mode`, docs/SAMPLING.md "Logprobs"):
# "raw": log_softmax of the model's raw logits; "processed": the log of the exact distribution the
# sampler drew the token from (penalties, temperature, min-p/top-k/top-p; filtered tokens -inf).  Not a row
# of `SAMPLING_FIELDS`: it changes what is reported, never which token is sampled.
LOGPROBS_MODES: tuple[str, ...] = ("raw", "processed")


def runner_logprobs_modes(runner: object) -> tuple[str, ...]:
    """The logprobs modes ``runner`` declares it reports (its ``logprobs_modes`` attribute, a subset of
    `LOGPROBS_MODES`); ``("raw",)`` for a runner that declares none, so traffic generators ask a runner written
    before processed logprobs existed for raw ones only.  A declaration naming an unknown mode is a
    `LogprobsModeError`."""
    declared = getattr(runner, "logprobs_modes", ("raw",))
    modes = tuple(declared) if isinstance(declared, (tuple, list, set, frozenset)) else None
    if modes is None or not modes or any(m not in LOGPROBS_MODES for m in modes):
        raise LogprobsModeError(f"{type(runner).__name__}.logprobs_modes must be a non-empty collection of "
                                f"{LOGPROBS_MODES}, not {declared!r}")
    return tuple(m for m in LOGPROBS_MODES if m in modes)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters.

    The sampling fields' neutral ("off") values and valid ranges are rows of `SAMPLING_FIELDS` (``top_k = -1``,
    ``top_p = 1.0``, ``min_p = 0.0``, ...); ``temperature = 0`` is greedy.  ``logprobs`` / ``prompt_logprobs``: number of top logprobs to return, None for none
    (0 returns only the sampled / actual token's logprob and rank).  ``logprobs_mode`` (one of `LOGPROBS_MODES`)
    says what the sampled tokens' logprobs describe: ``"raw"`` (the model's log-softmax) or ``"processed"``
    (the log of the distribution the sampler drew from); prompt logprobs are always raw.
    """

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    logprobs_mode: str = "raw"

    def validate(self, vocab_size: int, max_logprobs: int, req_id: str | None = None) -> None:
        def bad(cls: type[SchedulerOutputError], name: str, why: str) -> SchedulerOutputError:
            return cls(f"{name}={getattr(self, name)!r}: {why}", req_id=req_id, field=name)

        for name in (*SAMPLING_FIELD_NAMES, "seed", "logprobs", "prompt_logprobs", "max_tokens"):
            if isinstance(getattr(self, name), bool):
                raise bad(SamplingParamsError, name, "must be a number, not a bool")
        if not isinstance(self.stop_token_ids, (tuple, list)):
            raise bad(SchedulerOutputTypeError, "stop_token_ids", "must be a tuple of token ids")
        for spec in SAMPLING_FIELDS:  # one rule per row of the table, in its order
            if not spec.accepts(getattr(self, spec.name)):
                raise bad(SamplingParamsError, spec.name, f"must {spec.rule}")
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed <= MAX_SEED):
            raise bad(SamplingParamsError, "seed", f"must be an int in [0, {MAX_SEED}]")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is None:
                continue
            if not isinstance(v, int) or v < 0:
                raise bad(SamplingParamsError, name, "must be None or an int >= 0")
            if v > max_logprobs:
                raise bad(LogprobsLimitError, name, f"at most {max_logprobs} allowed")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise bad(SamplingParamsError, "max_tokens", "must be an int >= 1")
        if type(self.logprobs_mode) is not str or self.logprobs_mode not in LOGPROBS_MODES:
            raise bad(LogprobsModeError, "logprobs_mode", f"must be one of {', '.join(map(repr, LOGPROBS_MODES))}")
        for tok in self.stop_token_ids:
            if not isinstance(tok, int) or isinstance(tok, bool) or not 0 <= tok < vocab_size:
                raise bad(TokenOutOfVocabError, "stop_token_ids", f"token {tok!r} outside [0, {vocab_size})")

    @cached_property  # asked at admission and again at release; the params are frozen
    def filtered(self) -> bool:
        """Whether a filter (a ``"filter"`` stage row of `SAMPLING_FIELDS`: top-k, top-p, min-p) is on at a temperature
        above 0.  Host-side, from the values as given: every row the sampler's kernels treat as filtered (they test
        the fp32 values, top-k also against the vocabulary) is filtered here, so a batch with none may skip the
        filter launches (`runnercheck.impl.state.RequestStateTable.unfiltered`)."""
        if self.temperature == 0:
            return False
        for name, neutral in _FILTER_NEUTRALS:
            if getattr(self, name) != neutral:
                return True
        return False


# (name, neutral value) of the filter rows of `SAMPLING_FIELDS`: `SamplingParams.filtered` reads them once a request.
_FILTER_NEUTRALS: tuple[tuple[str, float | int], ...] = tuple((f.name, f.neutral) for f in SAMPLING_FIELDS
                                                               if f.stage == "filter")


def _check_sampling_table() -> None:
    """At import: every row of `SAMPLING_FIELDS` is a `SamplingParams` field whose default is its neutral value, of
    a known dtype and stage (a table and a dataclass that disagree would fail far from here, or not at all)."""
    defaults = {f.name: f.default for f in fields(SamplingParams)}
    for spec in SAMPLING_FIELDS:
        if spec.name not in defaults or defaults[spec.name] != spec.neutral or type(defaults[spec.name]) is not type(spec.neutral):
            raise TypeError(f"sampling field {spec.name!r}: SamplingParams needs a field {spec.name} = {spec.neutral!r}")
        if spec.dtype not in ("float32", "int32") or spec.stage not in SAMPLING_STAGES:
            raise TypeError(f"sampling field {spec.name!r}: dtype {spec.dtype!r} / stage {spec.stage!r} unknown")
    if len(set(SAMPLING_FIELD_NAMES)) != len(SAMPLING_FIELDS):
        raise TypeError(f"sampling fields named twice: {SAMPLING_FIELD_NAMES}")


_check_sampling_table()


@dataclass(frozen=True)
class NewRequest:
    """A request entering the runner: admitted for the first time, or resumed after preemption.

    For a resumed request ``output_token_ids`` holds every token it produced before preemption;
    its prefill is ``prompt_token_ids + output_token_ids`` (the prompt alone counts as the prompt
    for penalties and prompt logprobs).

    ``num_computed_tokens`` is a prefix-cache hit: the KV of the first ``num_computed_tokens``
    prefill positions already sits in the leading ``num_computed_tokens // block_size`` blocks of
    ``block_ids`` (blocks other live requests may share, and which the runner must never write);
    the first step computes from there.  It is a whole number of blocks and below the prefill
    length (the last position is always computed, to sample from).  A request asking for prompt
    logprobs gets no hit -- as in the engines, which skip the prefix cache for such requests,
    because cached positions produce no logits (`validate_prefix_hit`).
    """

    req_id: str
    prompt_token_ids: tuple[int, ...]
    sampling_params: SamplingParams
    block_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...] = ()
    num_computed_tokens: int = 0

    @property
    def prefill_token_ids(self) -> tuple[int, ...]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_resumed(self) -> bool:
        return len(self.output_token_ids) > 0


@dataclass(frozen=True)
class CachedRequest:
    """One request already in the runner, as a view of one entry of `CachedRequests`.

    ``num_computed_tokens`` is the scheduler's count of tokens already scheduled before this step
    (with async scheduling it includes tokens whose outputs have not arrived yet).  A step carries
    its cached requests as `CachedRequests` only; this per-request form is for building one
    (`CachedRequests.of`) and for slow readers that iterate one (the oracle, checks, tests).
    """

    req_id: str
    new_block_ids: tuple[int, ...]
    num_computed_tokens: int


@dataclass(frozen=True)
class CachedRequests:
    """The requests already in the runner that a step updates, as parallel tuples (vLLM V1's ``CachedRequestData``).

    Entry ``i`` of each tuple belongs to request ``req_ids[i]``: the KV blocks appended this step
    (``new_block_ids[i]``, often ``()``) and its computed count (`CachedRequest`).  Parallel tuples
    rather than one object per request, so that the runner reads a steady decode step with C-level
    operations on whole sequences (`runnercheck.impl.step_reader.read_steady_step`).  Nothing is checked here:
    the runner's boundary rejects bad contents (`runnercheck.impl.boundary.check_containers` and the per-entry
    checks) with a typed error and no state changed, so a bad one must be constructible.
    """

    req_ids: tuple[str, ...] = ()
    new_block_ids: tuple[tuple[int, ...], ...] = ()
    num_computed_tokens: tuple[int, ...] = ()

    @classmethod
    def of(cls, requests: Iterable[CachedRequest]) -> CachedRequests:
        """The struct of the per-request views ``requests`` (in order); their fields are taken as they are."""
        reqs = tuple(requests)
        return cls(tuple(r.req_id for r in reqs), tuple(r.new_block_ids for r in reqs),
                   tuple(r.num_computed_tokens for r in reqs))

    def __len__(self) -> int:
        return len(self.req_ids)

    def __iter__(self) -> Iterator[CachedRequest]:
        """The entries as `CachedRequest` views, in order (the slow, obvious form; ValueError on unequal lengths)."""
        for rid, blocks, computed in zip(self.req_ids, self.new_block_ids, self.num_computed_tokens, strict=True):
            yield CachedRequest(rid, blocks, computed)


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's schedule.  Batch order is the order of ``num_scheduled_tokens``."""

    step_id: int
    new_requests: tuple[NewRequest, ...] = ()
    cached_requests: CachedRequests = CachedRequests()
    num_scheduled_tokens: Mapping[str, int] = field(default_factory=dict)
    finished_req_ids: frozenset[str] = frozenset()
    preempted_req_ids: frozenset[str] = frozenset()
    draft_token_ids: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # k drafts whose ids the runner's own proposer holds on the device (`runnercheck.impl.spec`): the scheduler
    # knows only how many it asks for; the tokens are scheduled like ``draft_token_ids`` of length k.
    num_device_drafts: Mapping[str, int] = field(default_factory=dict)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    def num_drafts(self, req_id: str) -> int:
        """Drafts scheduled for ``req_id`` this step, explicit or from the runner's proposer."""
        return len(self.draft_token_ids.get(req_id, ())) + self.num_device_drafts.get(req_id, 0)


@dataclass(frozen=True)
class TokenLogprobs:
    """Logprobs of one position: from the raw model logits (log-softmax before any processing), or, for a
    sampled token of a request with ``logprobs_mode="processed"``, of the distribution it was sampled from.

    ``token_id`` is the sampled token (or, for prompt logprobs, the actual next prompt token);
    ``rank`` is 1 + the number of tokens with a strictly larger score (logit, or processed logprob).
    """

    token_id: int
    logprob: float
    rank: int
    top_token_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


@dataclass(frozen=True)
class ModelRunnerOutput:
    """One step's result, in batch order.

    ``sampled_token_ids[i]`` is empty for a partial prefill chunk; for drafts it holds the accepted
    drafts plus one target token.  ``logprobs[i]`` has one entry per sampled token (None when the
    request asked for none).  ``prompt_logprobs[req_id]`` covers the prompt positions computed this
    step whose next token is a prompt token.  ``nan_flags[i]`` is True when any of the request's
    logit rows held a NaN (the token is then chosen by the NaN rule of the sampler).
    """

    step_id: int
    req_ids: tuple[str, ...]
    sampled_token_ids: tuple[tuple[int, ...], ...]
    logprobs: tuple[tuple[TokenLogprobs, ...] | None, ...] = ()
    prompt_logprobs: Mapping[str, tuple[TokenLogprobs, ...]] = field(default_factory=dict)
    nan_flags: tuple[bool, ...] = ()
    seeds: Mapping[str, int] = field(default_factory=dict)

    def token_dict(self) -> dict[str, tuple[int, ...]]:
        return dict(zip(self.req_ids, self.sampled_token_ids))


# --------------------------------------------------------------------------- runner protocol


@runtime_checkable
class AsyncOutput(Protocol):
    def get(self) -> ModelRunnerOutput:
        """Wait for the step's device work (the one allowed wait) and return its output."""
        ...


@runtime_checkable
class Runner(Protocol):
    """Anything the differential machine and `runnercheck stress` can drive against the oracle."""

    def execute_model(self, sched: SchedulerOutput) -> AsyncOutput: ...


@dataclass(frozen=True)
class RunnerLimits:
    """What the boundary checks against; shared by the runner and the oracle."""

    vocab_size: int
    max_num_reqs: int
    max_model_len: int
    max_num_batched_tokens: int
    num_kv_blocks: int
    block_size: int
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    max_num_draft_tokens: int = 4


@dataclass(frozen=True)
class NgramConfig:
    """The n-gram (prompt lookup) proposer a runner and its oracle run (docs/SAMPLING.md, "N-gram proposer").

    After each step that samples for a request, the proposer writes ``num_spec_tokens`` drafts for
    it: the continuation after the most recent earlier occurrence of the longest suffix of length
    ``max_n`` .. ``min_n`` of its tokens.  A scheduler may then ask for up to ``num_spec_tokens`` of
    them (`SchedulerOutput.num_device_drafts`).
    """

    num_spec_tokens: int = 3
    min_n: int = 1
    max_n: int = 3

    def __post_init__(self) -> None:
        for name in ("num_spec_tokens", "min_n", "max_n"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"NgramConfig.{name}={v!r} must be an int >= 1")
        if self.min_n > self.max_n:
            raise ValueError(f"NgramConfig.min_n={self.min_n} > max_n={self.max_n}")


@dataclass(frozen=True)
class DraftModelConfig:
    """The draft-model proposer a runner and its oracle run (docs/SAMPLING.md, "Draft-model proposer").

    A second, smaller model (``preset``, a name in `runnercheck.impl.model.weights.PRESETS`, with random weights
    from ``weights_seed``) that must share the target's vocabulary.  After each step that samples
    for a request it runs ``num_spec_tokens`` decode steps and keeps the drafts and their
    distributions ``q`` on the device; a scheduler asks for up to ``num_spec_tokens`` of them
    (`SchedulerOutput.num_device_drafts`), verified by rejection sampling.
    """

    preset: str = "micro-draft"
    num_spec_tokens: int = 3
    weights_seed: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.preset, str) or not self.preset:
            raise ValueError(f"DraftModelConfig.preset={self.preset!r} must be a preset name")
        for name in ("num_spec_tokens", "weights_seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "num_spec_tokens" else 0):
                raise ValueError(f"DraftModelConfig.{name}={v!r} must be an int >= {1 if name == 'num_spec_tokens' else 0}")


@dataclass
class LiveRequest:
    """The host's mirror of one live request, as the boundary check needs it."""

    num_tokens: int  # prefill + outputs known so far (upper bound of what the device will hold)
    num_computed_upper: int  # tokens scheduled so far (upper bound of device num_computed)
    num_blocks: int


def effective_seed(params: SamplingParams, req_id: str, base_seed: int) -> int:
    """The seed a request samples with: its own, or one derived from (base seed, request id)."""
    if params.seed is not None:
        return params.seed
    digest = hashlib.blake2b(f"{base_seed}:{req_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & MAX_SEED


def blocks_per_request(max_model_len: int, block_size: int) -> int:
    """The most KV blocks one request can hold: enough for ``max_model_len`` tokens."""
    return -(-max_model_len // block_size)
