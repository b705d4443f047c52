"""The all-or-nothing boundary: every check of one `SchedulerOutput` against the live requests and
the `RunnerLimits`, each raising the typed `runnercheck.impl.interface.SchedulerOutputError` subclass that names
the request and field.

`validate_scheduler_output` is the per-request form (the oracle runs it); the runner checks the same
rules on arrays (`runnercheck.impl.step_reader`), built from the item checks here, and the bad-input tests hold
the two to the same verdicts.  Like `runnercheck.impl.interface`, this module imports nothing else from `impl`.
"""
from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import replace
from typing import Any, Callable, Mapping

from runnercheck.impl.interface import (
    BlockIdError,
    CachedRequests,
    CapacityError,
    DuplicateRequestError,
    FinishedAndScheduledError,
    LiveRequest,
    MaxModelLenError,
    NewRequest,
    PrefixHitAlignmentError,
    PrefixHitBlocksError,
    PrefixHitLengthError,
    PrefixHitPromptLogprobsError,
    RunnerLimits,
    SamplingParams,
    ScheduledTokensError,
    DeviceDraftsError,
    NgramConfig,
    DraftModelConfig,
    SchedulerOutput,
    SchedulerOutputError,
    SchedulerOutputTypeError,
    StepIdError,
    TokenOutOfVocabError,
    UnknownRequestError,
    blocks_per_request,
)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_step_id(step_id: object, last_step_id: int | None) -> None:
    """``step_id`` must be an int >= 0 (not a bool), larger than the last accepted step's."""
    if not _is_int(step_id) or step_id < 0:
        raise StepIdError(f"step_id {step_id!r} must be an int >= 0", field="step_id")
    if last_step_id is not None and step_id <= last_step_id:
        raise StepIdError(f"step_id {step_id} is not larger than the last accepted step {last_step_id}", field="step_id")


_CONTAINERS = (
    ("new_requests", (tuple, list), (tuple, list), "tuple"),
    ("finished_req_ids", (frozenset, set), AbstractSet, "frozenset"),
    ("preempted_req_ids", (frozenset, set), AbstractSet, "frozenset"),
    ("num_scheduled_tokens", (dict,), Mapping, "mapping"),
    ("draft_token_ids", (dict,), Mapping, "mapping"),
    ("num_device_drafts", (dict,), Mapping, "mapping"),
)


def check_containers(sched: object) -> None:
    """The top-level containers of a `SchedulerOutput` (their elements are checked where they are read)."""
    if not isinstance(sched, SchedulerOutput):
        raise SchedulerOutputError(f"expected SchedulerOutput, got {type(sched).__name__}")
    # Exact types first: the abstract-base-class checks cost microseconds each.
    for name, exact, abstract, what in _CONTAINERS:
        value = getattr(sched, name)
        if type(value) not in exact and not isinstance(value, abstract):
            raise SchedulerOutputTypeError(f"{name} must be a {what}, got {type(value).__name__}", field=name)
    check_cached_containers(sched.cached_requests)


_CACHED_FIELDS = ("req_ids", "new_block_ids", "num_computed_tokens")


def check_cached_containers(cached: object) -> None:
    """A `CachedRequests` of three tuples of one length (their entries are checked where they are read).

    Exact types: a subclass could override the equality or iteration the readers rely on.
    """
    if type(cached) is not CachedRequests:
        raise SchedulerOutputTypeError(f"cached_requests must be a CachedRequests, got {type(cached).__name__}",
                                       field="cached_requests")
    n = len(cached.req_ids) if type(cached.req_ids) is tuple else -1
    for name in _CACHED_FIELDS:
        value = getattr(cached, name)
        if type(value) is not tuple:
            raise SchedulerOutputTypeError(f"cached_requests.{name} must be a tuple, got {type(value).__name__}",
                                           field=f"cached_requests.{name}")
        if len(value) != n:
            raise SchedulerOutputTypeError(
                f"cached_requests.{name} holds {len(value)} entries, req_ids {n}: the tuples must be parallel",
                field=f"cached_requests.{name}")


def check_req_id(rid: object, field: str) -> None:
    if not isinstance(rid, str) or not rid:
        raise SchedulerOutputTypeError(f"request id {rid!r} must be a non-empty string", req_id=str(rid), field=field)


def check_tokens(tokens: object, vocab_size: int, req_id: str, name: str) -> None:
    """A tuple (or list) of token ids, each an int in ``[0, vocab_size)``."""
    if not isinstance(tokens, (tuple, list)):
        raise SchedulerOutputTypeError(f"must be a tuple of token ids, got {type(tokens).__name__}", req_id=req_id, field=name)
    if not tokens or (set(map(type, tokens)) == {int} and min(tokens) >= 0 and max(tokens) < vocab_size):
        return  # C-level passes for the usual case; the loop below names the first bad token
    for tok in tokens:
        if not _is_int(tok):
            raise SchedulerOutputTypeError(f"token {tok!r} is not an int", req_id=req_id, field=name)
        if not 0 <= tok < vocab_size:
            raise TokenOutOfVocabError(f"token {tok!r} outside [0, {vocab_size})", req_id=req_id, field=name)


def check_block_ids(block_ids: object, num_kv_blocks: int, req_id: str, name: str) -> None:
    """A tuple (or list) of KV block ids, each an int in ``[0, num_kv_blocks)``."""
    if not isinstance(block_ids, (tuple, list)):
        raise SchedulerOutputTypeError(f"must be a tuple of block ids, got {type(block_ids).__name__}", req_id=req_id, field=name)
    if not block_ids or (set(map(type, block_ids)) == {int} and min(block_ids) >= 0 and max(block_ids) < num_kv_blocks):
        return
    for b in block_ids:
        if not _is_int(b):
            raise SchedulerOutputTypeError(f"block id {b!r} is not an int", req_id=req_id, field=name)
        if not 0 <= b < num_kv_blocks:
            raise BlockIdError(f"block id {b!r} outside [0, {num_kv_blocks})", req_id=req_id, field=name)


def check_new_request(req: object, limits: RunnerLimits) -> int:
    """Everything about one new request that needs no runner state; returns its prefill length."""
    if not isinstance(req, NewRequest):
        raise SchedulerOutputTypeError(f"new_requests holds a {type(req).__name__}, not a NewRequest", field="new_requests")
    rid = req.req_id
    check_req_id(rid, "req_id")
    if not isinstance(req.sampling_params, SamplingParams):
        raise SchedulerOutputTypeError(f"sampling_params must be SamplingParams, got {type(req.sampling_params).__name__}",
                                       req_id=rid, field="sampling_params")
    check_tokens(req.prompt_token_ids, limits.vocab_size, rid, "prompt_token_ids")
    check_tokens(req.output_token_ids, limits.vocab_size, rid, "output_token_ids")
    if len(req.prompt_token_ids) == 0:
        raise ScheduledTokensError("empty prompt", req_id=rid, field="prompt_token_ids")
    req.sampling_params.validate(limits.vocab_size, limits.max_logprobs, rid)
    n = len(req.prompt_token_ids) + len(req.output_token_ids)
    if n > limits.max_model_len:
        raise MaxModelLenError(f"prefill of {n} tokens > max_model_len {limits.max_model_len}", req_id=rid, field="prompt_token_ids")
    check_block_ids(req.block_ids, limits.num_kv_blocks, rid, "block_ids")
    limit = blocks_per_request(limits.max_model_len, limits.block_size)
    if len(req.block_ids) > limit:
        raise BlockIdError(f"{len(req.block_ids)} blocks > {limit} per request", req_id=rid, field="block_ids")
    validate_prefix_hit(req, limits.block_size)
    return n


def check_drafts(rid: object, drafts: object, limits: RunnerLimits) -> int:
    """One ``draft_token_ids`` entry (its request must be scheduled: checked by the caller); returns k."""
    check_req_id(rid, "draft_token_ids")
    check_tokens(drafts, limits.vocab_size, rid, "draft_token_ids")
    if len(drafts) > limits.max_num_draft_tokens:
        raise ScheduledTokensError(f"{len(drafts)} drafts > {limits.max_num_draft_tokens}", req_id=rid, field="draft_token_ids")
    return len(drafts)


def check_scheduled_count(rid: str, n: object, num_tokens: int, start: int, num_blocks: int, num_drafts: int,
                          limits: RunnerLimits) -> None:
    """One scheduled request's count against its state after the step's admissions and cached updates."""
    if not _is_int(n):
        raise SchedulerOutputTypeError(f"scheduled tokens {n!r} must be an int", req_id=rid, field="num_scheduled_tokens")
    if n <= 0:
        raise ScheduledTokensError(f"scheduled tokens {n!r} must be an int >= 1", req_id=rid, field="num_scheduled_tokens")
    known = num_tokens + num_drafts
    if start + n > known:
        raise ScheduledTokensError(
            f"scheduling {n} tokens from {start} runs past the {known} tokens known", req_id=rid, field="num_scheduled_tokens"
        )
    if num_drafts and start + n != known:
        raise ScheduledTokensError("drafts need the whole remainder scheduled", req_id=rid, field="draft_token_ids")
    if start + n > limits.max_model_len:
        raise MaxModelLenError(f"position {start + n} > max_model_len {limits.max_model_len}", req_id=rid, field="num_scheduled_tokens")
    needed_blocks = -(-(start + n) // limits.block_size)
    if num_blocks < needed_blocks:
        raise BlockIdError(f"{num_blocks} blocks < {needed_blocks} needed", req_id=rid, field="block_ids")


def validate_prefix_hit(req: NewRequest, block_size: int) -> None:
    """Raise a `PrefixHitError` subclass if ``req.num_computed_tokens`` is not a usable prefix hit.

    Pure and self-contained (reads only ``req``): a hit is an int, a multiple of ``block_size``,
    below the prefill length, covered by the request's leading block ids, and absent when the
    request asks for prompt logprobs.  Token ids, block-id ranges and sampling params are checked
    by `validate_scheduler_output`, which calls this for every new request.
    """
    hit, rid = req.num_computed_tokens, req.req_id
    if not isinstance(hit, int) or isinstance(hit, bool) or hit < 0:
        raise PrefixHitLengthError(f"num_computed_tokens {hit!r} must be an int >= 0", req_id=rid, field="num_computed_tokens")
    if hit == 0:
        return
    if hit % block_size:
        raise PrefixHitAlignmentError(f"num_computed_tokens {hit} is not a multiple of the block size {block_size}",
                                      req_id=rid, field="num_computed_tokens")
    prefill_len = len(req.prompt_token_ids) + len(req.output_token_ids)
    if hit >= prefill_len:
        raise PrefixHitLengthError(f"num_computed_tokens {hit} must be below the prefill length {prefill_len}",
                                   req_id=rid, field="num_computed_tokens")
    if len(req.block_ids) * block_size < hit:
        raise PrefixHitBlocksError(f"{len(req.block_ids)} blocks of {block_size} cannot hold the {hit} cached tokens",
                                   req_id=rid, field="block_ids")
    if req.sampling_params.prompt_logprobs is not None:
        raise PrefixHitPromptLogprobsError("a request asking for prompt logprobs must not get a prefix-cache hit",
                                           req_id=rid, field="num_computed_tokens")


def check_gone(sched: SchedulerOutput, live: Mapping[str, Any]) -> set[str]:
    """The step's finished and preempted ids, each a live request named once; a typed error otherwise."""
    gone: set[str] = set()
    for name, ids in (("finished_req_ids", sched.finished_req_ids), ("preempted_req_ids", sched.preempted_req_ids)):
        for rid in ids:
            check_req_id(rid, name)
            if rid not in live:
                raise UnknownRequestError("not a live request", req_id=rid, field=name)
            if rid in gone:
                raise DuplicateRequestError("both finished and preempted", req_id=rid, field=name)
            gone.add(rid)
    return gone


def validate_scheduler_output(
    sched: SchedulerOutput, live: Mapping[str, LiveRequest], limits: RunnerLimits, last_step_id: int | None = None
) -> None:
    """Raise a `SchedulerOutputError` subclass if `sched` is not a valid next step.

    Pure: reads ``live`` (the host mirror before the step) and changes nothing.  ``last_step_id``:
    the last step the caller accepted (None: step ids are only type-checked).  The obvious,
    per-request form of the boundary: the oracle uses it; the runner checks the same rules on
    arrays (`runnercheck.impl.step_reader`), and the bad-input tests hold the two to the same verdicts.
    """
    check_containers(sched)
    check_step_id(sched.step_id, last_step_id)
    gone = check_gone(sched, live)
    # The step's view of the live table: ``live`` minus ``gone``, overlaid with what this step
    # changes -- (num_tokens, num_computed_upper, num_blocks) -- so ``live`` is never copied.
    changed: dict[str, tuple[int, int, int]] = {}

    for req in sched.new_requests:
        n = check_new_request(req, limits)
        rid = req.req_id
        if rid in changed or (rid in live and rid not in gone):
            raise DuplicateRequestError("request id already live", req_id=rid, field="req_id")
        if rid in gone:
            raise FinishedAndScheduledError("finished/preempted and re-added in one step", req_id=rid, field="req_id")
        changed[rid] = (n, req.num_computed_tokens, len(req.block_ids))
    num_live_after = len(live) - len(gone) + len(changed)
    if num_live_after > limits.max_num_reqs:
        raise CapacityError(f"{num_live_after} live requests > max_num_reqs {limits.max_num_reqs}", field="new_requests")

    seen_cached: set[str] = set()
    max_blocks = blocks_per_request(limits.max_model_len, limits.block_size)
    for c in sched.cached_requests:  # `CachedRequest` views; the container was checked above
        rid = c.req_id
        check_req_id(rid, "cached_requests")
        if rid in gone:
            raise FinishedAndScheduledError("finished/preempted and cached in one step", req_id=rid, field="cached_requests")
        if rid in seen_cached or rid in changed:
            raise DuplicateRequestError("listed twice (cached twice, or new and cached)", req_id=rid, field="cached_requests")
        if rid not in live:
            raise UnknownRequestError("cached request is not live", req_id=rid, field="cached_requests")
        seen_cached.add(rid)
        check_block_ids(c.new_block_ids, limits.num_kv_blocks, rid, "new_block_ids")
        lr = live[rid]
        computed = c.num_computed_tokens
        if not _is_int(computed):
            raise SchedulerOutputTypeError(f"num_computed_tokens {computed!r} is not an int", req_id=rid, field="num_computed_tokens")
        if not 0 <= computed <= lr.num_tokens:
            raise ScheduledTokensError(
                f"num_computed_tokens {computed!r} outside [0, {lr.num_tokens}]", req_id=rid, field="num_computed_tokens"
            )
        total_blocks = lr.num_blocks + len(c.new_block_ids)
        if total_blocks > max_blocks:
            raise BlockIdError(f"{total_blocks} blocks > {max_blocks} per request", req_id=rid, field="new_block_ids")
        changed[rid] = (lr.num_tokens, computed, total_blocks)

    num_drafts: dict[str, int] = {}
    for rid, drafts in sched.draft_token_ids.items():
        num_drafts[rid] = check_drafts(rid, drafts, limits)
        if rid not in sched.num_scheduled_tokens:
            raise ScheduledTokensError("drafts for an unscheduled request", req_id=rid, field="draft_token_ids")
    for rid, k in sched.num_device_drafts.items():  # their own rules: `check_device_drafts`
        if _is_int(k) and k > 0:
            num_drafts[rid] = num_drafts.get(rid, 0) + k
    total = 0
    for rid, n in sched.num_scheduled_tokens.items():
        check_req_id(rid, "num_scheduled_tokens")
        if rid in gone:
            raise FinishedAndScheduledError("finished/preempted and scheduled in one step", req_id=rid, field="num_scheduled_tokens")
        after = changed.get(rid)
        if after is None:
            lr = live.get(rid)
            if lr is None:
                raise UnknownRequestError("scheduled request is not live", req_id=rid, field="num_scheduled_tokens")
            after = (lr.num_tokens, lr.num_computed_upper, lr.num_blocks)
        check_scheduled_count(rid, n, *after, num_drafts.get(rid, 0), limits)
        total += n
    if total > limits.max_num_batched_tokens:
        raise ScheduledTokensError(
            f"{total} scheduled tokens > max_num_batched_tokens {limits.max_num_batched_tokens}", field="num_scheduled_tokens"
        )


def check_device_drafts(sched: SchedulerOutput, limits: RunnerLimits, proposer: NgramConfig | DraftModelConfig | None,
                        has_proposal: Callable[[str], bool]) -> dict[str, int]:
    """The ``num_device_drafts`` of ``sched`` (request -> k > 0), checked before anything else of the step.

    ``has_proposal(req_id)``: the request is live and sampled since its admission, so the proposer
    holds drafts for it.  Raises `DeviceDraftsError` (or a container/type error); changes nothing.
    The runner and the oracle both call it first, so they reject a bad step with the same error.
    """
    check_containers(sched)
    if not sched.num_device_drafts:
        return {}
    if proposer is None:
        raise DeviceDraftsError("device drafts asked of a runner without a proposer", field="num_device_drafts")
    cap = min(proposer.num_spec_tokens, limits.max_num_draft_tokens)
    counts: dict[str, int] = {}
    for rid, k in sched.num_device_drafts.items():
        check_req_id(rid, "num_device_drafts")
        if not _is_int(k) or k < 0:
            raise DeviceDraftsError(f"draft count {k!r} must be an int >= 0", req_id=rid, field="num_device_drafts")
        if k > cap:
            raise DeviceDraftsError(f"{k} device drafts > {cap} (the proposer's num_spec_tokens and max_num_draft_tokens)",
                                    req_id=rid, field="num_device_drafts")
        if rid not in sched.num_scheduled_tokens:
            raise DeviceDraftsError("device drafts for an unscheduled request", req_id=rid, field="num_device_drafts")
        if rid in sched.draft_token_ids:
            raise DeviceDraftsError("both explicit and device drafts", req_id=rid, field="num_device_drafts")
        if k and not has_proposal(rid):
            raise DeviceDraftsError("no proposal yet: the request has not sampled since its admission",
                                    req_id=rid, field="num_device_drafts")
        if k:
            counts[rid] = k
    return counts


def check_draft_model_schedule(sched: SchedulerOutput) -> None:
    """What a draft-model proposer cannot take, checked before anything else of the step.

    Its drafts carry distributions ``q`` and are verified by rejection sampling; explicit
    ``draft_token_ids`` carry none, so they are refused.  Its KV cache is its own (not the
    target's shared blocks), so a prefix-cache hit (a new request with ``num_computed_tokens > 0``)
    would leave the draft model without the cached prefix: refused too.  Raises `DeviceDraftsError`.
    """
    check_containers(sched)
    for rid in sched.draft_token_ids:
        raise DeviceDraftsError("explicit drafts with a draft-model proposer (its drafts come with q; these have none)",
                                req_id=rid, field="draft_token_ids")
    for req in sched.new_requests:
        if getattr(req, "num_computed_tokens", 0):
            raise DeviceDraftsError("a prefix-cache hit with a draft-model proposer (its own KV holds no cached prefix)",
                                    req_id=getattr(req, "req_id", None), field="new_requests")


def with_device_drafts(sched: SchedulerOutput, drafts: Mapping[str, tuple[int, ...]]) -> SchedulerOutput:
    """``sched`` with its device drafts turned into explicit ``draft_token_ids`` (``drafts``: request -> ids)."""
    return replace(sched, draft_token_ids={**sched.draft_token_ids, **drafts}, num_device_drafts={})
