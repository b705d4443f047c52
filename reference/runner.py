"""The oracle runner: consumes the runner's `SchedulerOutput` stream, computes everything from scratch.

Per step, for each scheduled request in batch order, `ReferenceRunner` recomputes
`ReferenceModel.logits` over the request's known sequence up to the last scheduled position (by
causality the same numbers the whole sequence would give), and samples with `runnercheck.reference.sampler`
when the scheduled tokens reach the end of what it knows.  No KV cache, no rows, no batching.

Conventions it fixes for the comparison with the GPU runner (`runnercheck.impl.interface`, docs/SAMPLING.md):

* A request computes positions ``[start, start + n)`` where ``start`` is the cached request's
  ``num_computed_tokens`` when the scheduler sends one, else the oracle's own count; a new request
  starts at its prefix-cache hit (``NewRequest.num_computed_tokens``).  The oracle keeps no KV, so
  a hit changes only where computing starts: logits still come from the whole token sequence,
  and any KV mix-up in a runner's shared blocks shows up as a divergence.
* It samples when ``start + n == len(tokens) + len(drafts)``.  Logit row ``j`` (``0 <= j <= k``
  drafts) is the logits at position ``len(tokens) - 1 + j``, sampled at noise position
  ``len(tokens) + j`` with the drafts ``d_1..d_j`` counted as outputs for the penalties; drafts are
  accepted while ``sample_j == d_{j+1}``; the output is the accepted drafts plus the first
  disagreeing (or bonus) sample.  After the step ``num_computed = len(tokens) - 1``.
* ``logprobs[i]`` holds one `TokenLogprobs` per produced token (empty for a partial prefill), or
  None when the request asked for none.  ``prompt_logprobs[req]`` is present only when the step
  computed at least one prompt position ``i`` with ``i + 1 < prompt_len`` on a first admission.
* ``nan_flags[i]`` is True when any logit row the step computed for the request (all ``k + 1``
  with drafts, sampled or not) held a NaN or +inf.
* ``seeds`` names the effective seed of every request admitted this step (first or resumed).

With ``proposer=NgramConfig(...)`` a step's ``num_device_drafts`` become explicit drafts proposed by
`runnercheck.reference.ngram.propose_ngram` from the request's tokens (the runner's proposer ran on the same
tokens after the request's last sampling step), checked first by `runnercheck.impl.boundary.check_device_drafts`.
With ``proposer=DraftModelConfig(...)`` they come from `runnercheck.reference.draft_model` (float64 draft model,
with their q) and a request with temperature > 0 verifies them by rejection sampling
(`runnercheck.reference.spec_verify.verify_rejection`, its ``p`` from `runnercheck.reference.sampler.distribution`);
`runnercheck.impl.boundary.check_draft_model_schedule` runs first (no explicit drafts, no prefix hits).

The host mirror handed to `validate_scheduler_output` is built from the per-request state, with
``num_tokens`` exact (the oracle knows how many drafts were accepted).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from runnercheck.impl.boundary import check_device_drafts, check_draft_model_schedule, validate_scheduler_output, with_device_drafts
from runnercheck.impl.interface import (
    DraftModelConfig,
    LiveRequest,
    ModelRunnerOutput,
    NgramConfig,
    RunnerLimits,
    SamplingParams,
    SchedulerOutput,
    TokenLogprobs,
    TokenOutOfVocabError,
    UnknownRequestError,
    effective_seed,
)
from runnercheck.impl.model.weights import ModelWeights
from runnercheck.reference.draft_model import DraftProposal, ReferenceDraftModel
from runnercheck.reference.model import ReferenceModel
from runnercheck.reference.ngram import propose_ngram
from runnercheck.reference.sampler import (SampleResult, distribution, is_flagged, request_token_logprobs, sample,
                                           token_logprobs)
from runnercheck.reference.spec_verify import verify_rejection


class ReferenceRunnerError(ValueError):
    """The oracle cannot be built for these weights and limits, or a diagnostic call is malformed."""


@dataclass
class _RequestState:
    """Everything the oracle keeps about one live request (host, owned by `ReferenceRunner`)."""

    tokens: list[int]  # prompt + every output so far (including those from before a preemption)
    prompt_len: int
    num_computed: int
    num_blocks: int
    params: SamplingParams
    seed: int
    first_admission: bool  # prompt logprobs are only returned on a request's first admission
    sampled_since_admission: bool = False  # the n-gram proposer has drafts for it (`runnercheck.reference.ngram`)

    @property
    def prompt(self) -> list[int]:
        return self.tokens[: self.prompt_len]

    @property
    def outputs(self) -> list[int]:
        return self.tokens[self.prompt_len :]


@dataclass(frozen=True)
class ReadyOutput:
    """An `runnercheck.impl.interface.AsyncOutput` whose work is already done."""

    output: ModelRunnerOutput

    def get(self) -> ModelRunnerOutput:
        return self.output


@dataclass
class _StepResult:
    tokens: tuple[int, ...] = ()
    results: list[SampleResult] = field(default_factory=list)
    logprobs: tuple[TokenLogprobs, ...] | None = None
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()
    nan_flag: bool = False


class ReferenceRunner:
    """The float64 oracle behind the `Runner` contract, synchronous and slow on purpose.

    State: ``_requests`` (request id -> `_RequestState`), owned by this object, on the host, one
    entry from admission to finish/preemption, written only by `execute_model` (whole-step commit)
    and `replace_output_token`.  ``last_results`` is rewritten by each `execute_model`.  The model's
    float64 weights are owned by its `ReferenceModel`.
    """

    def __init__(self, weights: ModelWeights, limits: RunnerLimits, base_seed: int = 0,
                 proposer: NgramConfig | DraftModelConfig | None = None) -> None:
        if not isinstance(limits, RunnerLimits):
            raise ReferenceRunnerError(f"limits must be RunnerLimits, got {type(limits).__name__}")
        config = weights.config
        if limits.vocab_size != config.vocab_size:
            raise ReferenceRunnerError(f"limits.vocab_size {limits.vocab_size} != model vocab {config.vocab_size}")
        if limits.max_model_len > config.max_model_len:
            raise ReferenceRunnerError(
                f"limits.max_model_len {limits.max_model_len} > model max_model_len {config.max_model_len}"
            )
        if not isinstance(base_seed, int) or isinstance(base_seed, bool):
            raise ReferenceRunnerError(f"base_seed must be an int, got {base_seed!r}")
        self.model = ReferenceModel(weights)
        self.limits = limits
        self.base_seed = base_seed
        self.proposer = proposer
        # The draft model's float64 twin (its preset must share the target's vocabulary: typed error otherwise).
        self._draft = ReferenceDraftModel(proposer, config) if isinstance(proposer, DraftModelConfig) else None
        self._requests: dict[str, _RequestState] = {}
        self.last_results: dict[str, list[SampleResult]] = {}

    # ------------------------------------------------------------------ queries

    @property
    def num_live(self) -> int:
        return len(self._requests)

    def live_req_ids(self) -> tuple[str, ...]:
        return tuple(self._requests)

    def outputs(self, req_id: str) -> tuple[int, ...]:
        """Every output token of a live request, those from before a preemption included."""
        return tuple(self._state(req_id).outputs)

    def num_computed(self, req_id: str) -> int:
        return self._state(req_id).num_computed

    def host_mirror(self) -> dict[str, LiveRequest]:
        """The boundary-check view of the live requests (fresh objects; mutating them changes nothing)."""
        return {
            rid: LiveRequest(num_tokens=len(st.tokens), num_computed_upper=st.num_computed, num_blocks=st.num_blocks)
            for rid, st in self._requests.items()
        }

    def _state(self, req_id: str) -> _RequestState:
        try:
            return self._requests[req_id]
        except KeyError:
            raise UnknownRequestError("not a live request", req_id=req_id) from None

    # ------------------------------------------------------------------ diagnostics

    def replace_output_token(self, req_id: str, index_from_end: int, token: int) -> None:
        """Adopt another token for an output (a tie with the runner): later steps see it.

        ``index_from_end = 0`` is the latest output.  Tokens the oracle produced after it in the same
        step were computed from the old prefix; replace them as well if they differ.
        """
        st = self._state(req_id)
        num_outputs = len(st.tokens) - st.prompt_len
        if not isinstance(index_from_end, int) or isinstance(index_from_end, bool) or not 0 <= index_from_end < num_outputs:
            raise ReferenceRunnerError(
                f"request {req_id!r}: index_from_end {index_from_end!r} outside [0, {num_outputs})"
            )
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < self.limits.vocab_size:
            raise TokenOutOfVocabError(f"token {token!r} outside [0, {self.limits.vocab_size})", req_id=req_id, field="token")
        st.tokens[len(st.tokens) - 1 - index_from_end] = token

    # ------------------------------------------------------------------ the step

    def execute_model_async(self, sched: SchedulerOutput) -> ReadyOutput:
        return ReadyOutput(self.execute_model(sched))

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step synchronously.  A bad `sched` raises a `SchedulerOutputError`; nothing changes."""
        if self._draft is not None:
            check_draft_model_schedule(sched)
        device_drafts = check_device_drafts(
            sched, self.limits, self.proposer,
            lambda rid: rid in self._requests and self._requests[rid].sampled_since_admission)
        proposals: dict[str, DraftProposal] = {}
        if sched.num_device_drafts and self._draft is not None:
            for rid, k in device_drafts.items():
                st = self._requests[rid]
                proposals[rid] = self._draft.propose(st.tokens, k, st.params, st.seed, st.prompt, st.outputs)
            sched = with_device_drafts(sched, {rid: prop.drafts for rid, prop in proposals.items()})
        elif sched.num_device_drafts:
            # The runner's proposer ran after the request's last sampling step; so does this one,
            # on the same tokens (nothing changes a request's tokens between its steps).
            sched = with_device_drafts(sched, {
                rid: propose_ngram(self._requests[rid].tokens, self.proposer)[:k] for rid, k in device_drafts.items()})
        validate_scheduler_output(sched, self.host_mirror(), self.limits)
        # Work on copies and commit at the end, so the step is all-or-nothing even if it fails midway.
        work = {rid: replace(st, tokens=list(st.tokens)) for rid, st in self._requests.items()}
        for rid in sched.finished_req_ids | sched.preempted_req_ids:
            del work[rid]
        seeds: dict[str, int] = {}
        for req in sched.new_requests:
            seed = effective_seed(req.sampling_params, req.req_id, self.base_seed)
            work[req.req_id] = _RequestState(
                tokens=list(req.prefill_token_ids),
                prompt_len=len(req.prompt_token_ids),
                num_computed=req.num_computed_tokens,  # a prefix-cache hit: the math is unchanged (full recompute)
                num_blocks=len(req.block_ids),
                params=req.sampling_params,
                seed=seed,
                first_admission=not req.is_resumed,
            )
            seeds[req.req_id] = seed
        for cached in sched.cached_requests:
            st = work[cached.req_id]
            st.num_computed = cached.num_computed_tokens
            st.num_blocks += len(cached.new_block_ids)

        steps: dict[str, _StepResult] = {}
        for rid, num_tokens in sched.num_scheduled_tokens.items():
            drafts = tuple(sched.draft_token_ids.get(rid, ()))
            steps[rid] = self._run_request(work[rid], num_tokens, drafts, proposals.get(rid))

        self._requests = work
        self.last_results = {rid: step.results for rid, step in steps.items() if step.results}
        req_ids = tuple(sched.num_scheduled_tokens)
        return ModelRunnerOutput(
            step_id=sched.step_id,
            req_ids=req_ids,
            sampled_token_ids=tuple(steps[rid].tokens for rid in req_ids),
            logprobs=tuple(steps[rid].logprobs for rid in req_ids),
            prompt_logprobs={rid: steps[rid].prompt_logprobs for rid in req_ids if steps[rid].prompt_logprobs},
            nan_flags=tuple(steps[rid].nan_flag for rid in req_ids),
            seeds=seeds,
        )

    def _run_request(self, st: _RequestState, num_tokens: int, drafts: tuple[int, ...],
                     proposal: DraftProposal | None = None) -> _StepResult:
        """Compute one request's scheduled positions, sample if they reach the end; updates ``st``.

        ``proposal``: the draft model's drafts with their q; a request with temperature > 0 then
        verifies them by rejection sampling (greedy keeps the exact-match rule, its greedy mode)."""
        start = st.num_computed
        end = start + num_tokens
        sequence = st.tokens + list(drafts)
        logits = self.model.logits(sequence[:end])
        params = st.params
        step = _StepResult()

        if st.first_admission and params.prompt_logprobs is not None:
            step.prompt_logprobs = tuple(
                token_logprobs(logits[i], st.tokens[i + 1], params.prompt_logprobs)
                for i in range(start, end)
                if i + 1 < st.prompt_len
            )

        known = len(st.tokens)
        if end < known + len(drafts):
            st.num_computed = end
            if params.logprobs is not None:
                step.logprobs = ()
            return step

        prompt, outputs = st.prompt, st.outputs
        rows = [logits[known - 1 + j] for j in range(len(drafts) + 1)]
        step.nan_flag = any(is_flagged(row) for row in rows)
        produced: list[int] = []
        if proposal is not None and params.temperature > 0:
            produced, step.results = self._verify_drafts(st, rows, drafts, proposal)
        else:
            for j, row in enumerate(rows):
                result = sample(row, params, st.seed, known + j, prompt, outputs + list(drafts[:j]))
                produced.append(result.token)
                step.results.append(result)
                if j < len(drafts) and result.token == drafts[j]:
                    continue
                break
        if params.logprobs is not None:
            step.logprobs = tuple(request_token_logprobs(rows[j], tok, params, prompt, outputs + list(drafts[:j]))
                                  for j, tok in enumerate(produced))
        st.tokens.extend(produced)
        st.sampled_since_admission = True
        st.num_computed = len(st.tokens) - 1
        step.tokens = tuple(produced)
        return step


    @staticmethod
    def _verify_drafts(st: _RequestState, rows: list, drafts: tuple[int, ...],
                       proposal: DraftProposal) -> tuple[list[int], list[SampleResult]]:
        """Rejection sampling (`runnercheck.reference.spec_verify`) of the draft model's drafts: tokens and their results.

        The target's ``p`` rows count the drafts before each row as outputs, like the sampler.  Every
        emitted token is reported fragile when any decision of the request (a draft's q or choice, a
        p boundary, an accept test or the resample) lay within fp32 reach of flipping."""
        p_rows, fragile = [], any(proposal.fragile)
        for j, row in enumerate(rows):
            p, boundary = distribution(row, st.params, st.prompt, st.outputs + list(drafts[:j]))
            p_rows.append(p)
            fragile |= boundary
        res = verify_rejection(torch.stack(p_rows), list(drafts), proposal.q, st.seed, len(st.tokens))
        last = len(res.tokens) - 1
        results = [SampleResult(token=t, gap=res.resample_gap if j == last else math.inf, fragile=fragile or res.fragile,
                                nan_flag=is_flagged(rows[j])) for j, t in enumerate(res.tokens)]
        return list(res.tokens), results


class AsyncReferenceRunner:
    """Presents a `ReferenceRunner` as an `runnercheck.impl.interface.Runner` (``execute_model`` returns ``.get()``-able)."""

    def __init__(self, oracle: ReferenceRunner) -> None:
        self.oracle = oracle

    def execute_model(self, sched: SchedulerOutput) -> ReadyOutput:
        return self.oracle.execute_model_async(sched)


__all__ = ["ReferenceRunner", "AsyncReferenceRunner", "ReadyOutput", "ReferenceRunnerError"]
