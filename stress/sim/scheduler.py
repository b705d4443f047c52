"""A scheduler simulator that drives runners the way a serving engine's scheduler would.

`SchedulerSim` turns a stream of requests (added, aborted and force-preempted from outside) into
`SchedulerOutput` steps:

* admission under ``limits.max_num_reqs`` live requests and a per-step token budget
  (``limits.max_num_batched_tokens``), running requests first, then the waiting queue (preempted
  requests ahead of requests never admitted);
* KV blocks from a finite pool of ``limits.num_kv_blocks`` blocks of ``limits.block_size`` tokens,
  handed out in a seeded order and reused last-freed-first (the most race-prone reuse);
* prefix caching (on by default, `SchedulerConfig.prefix_caching`; hashes, reference counts and
  LRU eviction live in `runnercheck.stress.sim.prefix_cache.PrefixCache`): an admission's hit goes out as
  ``NewRequest.num_computed_tokens`` with the shared blocks leading its block list (never the
  whole prefill, never for prompt logprobs); ``stats.hit_rate`` is the fraction of prefill tokens
  served from the cache;
* chunked prefill (a prefill longer than the remaining budget is split over steps) and decode;
* preemption when a running request needs a block and none is free: the victim is the most
  recently admitted running request not yet scheduled in this step (possibly the request itself);
  a preempted request is resumed -- re-sent as a `NewRequest` whose ``output_token_ids`` are the
  tokens it already produced -- only after *all* of its in-flight outputs have arrived;
* finishing on ``max_tokens``, a stop token or ``max_model_len``; the finished id goes out in the
  next `SchedulerOutput`; tokens that arrive for a request after it finished are dropped;
* one-step-ahead (async) scheduling: ``schedule()`` may be called up to ``max_inflight_steps``
  times before the oldest step's ``update(output)``.  A request whose in-flight step samples can be
  scheduled for its next decode right away: the runner reads the last sampled token on the device,
  and the scheduler counts it as known;
* optional draft tokens (speculative decoding): with probability ``draft_prob`` a decode gets
  1..``limits.max_num_draft_tokens`` drafts guessed from the request's history.  Until
  that step's output arrives the scheduler does not know how many were accepted, so the request
  is not scheduled again before then; afterwards ``num_computed_tokens`` rolls back to the
  accepted length.  With ``ngram_spec_tokens`` the drafts come from the runner's own proposer
  instead, by count only (`runnercheck.stress.sim.spec_scheduler`).

Ownership: a `SchedulerSim` owns its request records, the block pool and the in-flight step
records; all of it is host-side Python state, written only by its own methods.

`runnercheck.stress.run.runners.RunnerBoundaryMirror` is the runner's view of the same stream; the differential
driver and the tests use it to prove every step the simulator emits is valid.
"""
from __future__ import annotations

import enum
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from runnercheck.impl.interface import (
    CachedRequests,
    ModelRunnerOutput,
    NewRequest,
    RunnerLimits,
    SamplingParams,
    SchedulerOutput,
)
from runnercheck.stress.sim.prefix_cache import PrefixCache, PrefixCacheError
from runnercheck.stress.sim.spec_scheduler import SpecStats, device_draft_count


class SchedulerSimError(RuntimeError):
    """Misuse of the simulator, or a runner output that does not fit the step it answers."""


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # never admitted
    RUNNING = "running"  # live in the runner
    PREEMPTED = "preempted"  # waiting to resume
    FINISHED = "finished"


@dataclass(frozen=True)
class SchedulerConfig:
    """Knobs beyond `RunnerLimits`; recorded in repro files."""

    max_inflight_steps: int = 1
    draft_prob: float = 0.0
    prefix_caching: bool = True
    ngram_spec_tokens: int = 0  # > 0: decodes ask the runner's proposer for drafts (`runnercheck.stress.sim.spec_scheduler`)
    # A draft-model preset: with ngram_spec_tokens > 0 the runner's proposer is that draft model
    # (`runnercheck.impl.draft_proposer`) instead of the n-gram one; it takes no explicit drafts and no prefix hits.
    draft_model: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.max_inflight_steps, int) or self.max_inflight_steps < 0:
            raise SchedulerSimError(f"max_inflight_steps={self.max_inflight_steps!r} must be an int >= 0")
        if not 0.0 <= self.draft_prob <= 1.0:
            raise SchedulerSimError(f"draft_prob={self.draft_prob!r} must lie in [0, 1]")
        if not isinstance(self.prefix_caching, bool):
            raise SchedulerSimError(f"prefix_caching={self.prefix_caching!r} must be a bool")
        if isinstance(self.ngram_spec_tokens, bool) or not isinstance(self.ngram_spec_tokens, int) or self.ngram_spec_tokens < 0:
            raise SchedulerSimError(f"ngram_spec_tokens={self.ngram_spec_tokens!r} must be an int >= 0")
        if not isinstance(self.draft_model, str):
            raise SchedulerSimError(f"draft_model={self.draft_model!r} must be a preset name or ''")
        if self.draft_model and (not self.ngram_spec_tokens or self.prefix_caching or self.draft_prob):
            raise SchedulerSimError("draft_model needs ngram_spec_tokens > 0, prefix_caching off and draft_prob 0 "
                                    "(a draft-model runner refuses explicit drafts and prefix hits)")

    def to_dict(self) -> dict:
        d = {"max_inflight_steps": self.max_inflight_steps, "draft_prob": self.draft_prob,
             "prefix_caching": self.prefix_caching}
        if self.ngram_spec_tokens:  # only when on, so records made before it keep their checksums
            d["ngram_spec_tokens"] = self.ngram_spec_tokens
        if self.draft_model:
            d["draft_model"] = self.draft_model
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "SchedulerConfig":
        """Inverse of `to_dict`.  A record without ``prefix_caching`` predates it: caching off (as it ran)."""
        return cls(int(d["max_inflight_steps"]), float(d["draft_prob"]), bool(d.get("prefix_caching", False)),
                   int(d.get("ngram_spec_tokens", 0)), str(d.get("draft_model", "")))


@dataclass
class _Request:
    req_id: str
    prompt: tuple[int, ...]
    params: SamplingParams
    outputs: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    blocks: list[int] = field(default_factory=list)
    prefill_len: int = 0  # tokens handed to the runner at the current admission
    outputs_at_admission: int = 0
    num_computed: int = 0  # tokens scheduled since admission (rolled back after drafts)
    block_hashes: list[int] = field(default_factory=list)  # of its leading blocks cached (or hit) so far
    pending_samples: int = 0  # in-flight steps that will sample for it
    drafts_in_flight: bool = False
    finish_reason: str | None = None

    def known_tokens(self) -> int:
        """Tokens the runner holds or will hold once in-flight samples land (each counts as one)."""
        return self.prefill_len + len(self.outputs) - self.outputs_at_admission + self.pending_samples


@dataclass(frozen=True)
class _StepRecord:
    step_id: int
    scheduled: tuple[str, ...]
    samplers: Mapping[str, int]  # req_id -> number of draft tokens in that step
    device_drafted: frozenset[str] = frozenset()  # requests whose drafts came from the runner's proposer


@dataclass
class SchedulerStats:
    steps: int = 0
    admitted: int = 0
    resumed: int = 0
    preempted_for_blocks: int = 0
    preempted_forced: int = 0
    aborted: int = 0
    finished: int = 0
    dropped_tokens: int = 0
    draft_steps: int = 0
    prefill_tokens: int = 0  # tokens handed to the runner as prefill, over all admissions
    cached_tokens: int = 0  # of those, served from the prefix cache (the hits)
    prefix_hits: int = 0  # admissions with a hit
    evictions: int = 0  # cached blocks evicted to be reused

    @property
    def hit_rate(self) -> float:
        """Fraction of prefill tokens served from the prefix cache (0 when nothing was admitted)."""
        return self.cached_tokens / self.prefill_tokens if self.prefill_tokens else 0.0


class SchedulerSim:
    """See the module docstring.  Deterministic given ``seed`` and the sequence of calls."""

    def __init__(self, limits: RunnerLimits, *, seed: int = 0, max_inflight_steps: int = 1, draft_prob: float = 0.0,
                 prefix_caching: bool = True, ngram_spec_tokens: int = 0, most_device_drafts: bool = False,
                 draft_model: str = ""):
        self.limits = limits
        self.config = SchedulerConfig(max_inflight_steps, draft_prob, prefix_caching, ngram_spec_tokens, draft_model)
        self.spec_stats = SpecStats()
        self._most_device_drafts = most_device_drafts  # always the largest k allowed (benchmarks; not recorded)
        self.seed = seed
        self._rng = random.Random(seed)
        free_blocks = list(range(limits.num_kv_blocks))
        self._rng.shuffle(free_blocks)
        self.blocks = PrefixCache(free_blocks, limits.block_size, enabled=prefix_caching)
        self._requests: dict[str, _Request] = {}
        self._running: list[_Request] = []  # admission order
        self._waiting: deque[_Request] = deque()
        self._announce_finished: set[str] = set()
        self._force_preempt: set[str] = set()
        self._inflight: deque[_StepRecord] = deque()
        self._next_step_id = 0
        self.stats = SchedulerStats()

    # ---------------------------------------------------------------- requests from outside
    def add_request(self, req_id: str, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Queue a request.  Raises `SchedulerSimError` for a reused id or one that can never fit."""
        lim = self.limits
        if not isinstance(req_id, str) or not req_id:
            raise SchedulerSimError(f"request id must be a non-empty string, got {req_id!r}")
        if req_id in self._requests:
            raise SchedulerSimError(f"request id {req_id!r} was already added")
        prompt = tuple(int(t) for t in prompt_token_ids)
        if not prompt:
            raise SchedulerSimError(f"request {req_id!r}: empty prompt")
        if not 0 <= min(prompt) <= max(prompt) < lim.vocab_size:
            raise SchedulerSimError(f"request {req_id!r}: prompt token outside [0, {lim.vocab_size})")
        if len(prompt) >= lim.max_model_len:
            raise SchedulerSimError(f"request {req_id!r}: prompt of {len(prompt)} tokens leaves no room under max_model_len {lim.max_model_len}")
        params.validate(lim.vocab_size, lim.max_logprobs, req_id)
        longest = min(lim.max_model_len, len(prompt) + params.max_tokens)
        if -(-longest // lim.block_size) > lim.num_kv_blocks:
            raise SchedulerSimError(
                f"request {req_id!r}: up to {longest} tokens need more than the pool's {lim.num_kv_blocks} blocks"
            )
        req = _Request(req_id, prompt, params)
        self._requests[req_id] = req
        self._waiting.append(req)

    def abort(self, req_id: str) -> bool:
        """Finish a request from outside.  False when it had already finished."""
        req = self._get(req_id)
        if req.status is RequestStatus.FINISHED:
            return False
        self.stats.aborted += 1
        self._finish(req, "abort")
        return True

    def preempt(self, req_id: str) -> bool:
        """Force a running request out at the next ``schedule()``.  False when it is not running."""
        req = self._get(req_id)
        if req.status is not RequestStatus.RUNNING:
            return False
        self._force_preempt.add(req_id)
        return True

    # ---------------------------------------------------------------- queries
    def outputs(self, req_id: str) -> tuple[int, ...]:
        return tuple(self._get(req_id).outputs)

    def status(self, req_id: str) -> RequestStatus:
        return self._get(req_id).status

    @property
    def finished(self) -> dict[str, str]:
        """Finished request ids -> reason (``stop``, ``length`` or ``abort``)."""
        return {r.req_id: r.finish_reason for r in self._requests.values() if r.status is RequestStatus.FINISHED}

    @property
    def request_ids(self) -> tuple[str, ...]:
        return tuple(self._requests)

    @property
    def running_ids(self) -> tuple[str, ...]:
        return tuple(r.req_id for r in self._running)

    @property
    def unfinished_ids(self) -> tuple[str, ...]:
        return tuple(r.req_id for r in self._requests.values() if r.status is not RequestStatus.FINISHED)

    @property
    def num_inflight_steps(self) -> int:
        return len(self._inflight)

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can get (free, or cached and unreferenced: evictable)."""
        return self.blocks.num_available

    @property
    def can_schedule(self) -> bool:
        """Whether ``schedule()`` would now emit anything (tokens to compute or ids to announce).

        False while every live request waits for in-flight outputs: the caller should deliver one.
        """
        if self._announce_finished or any(rid in self._force_preempt for rid in self.running_ids):
            return True
        for req in self._running:
            if self._decode_capped(req) or req.drafts_in_flight:
                continue
            if req.known_tokens() > req.num_computed:
                return True
        if len(self._running) >= self.limits.max_num_reqs:
            return False
        for req in self._waiting:
            if req.pending_samples == 0:
                return self._admission_plan(req, self.limits.max_num_batched_tokens) is not None
        return False

    @property
    def has_work(self) -> bool:
        """Anything left to schedule, to hear back about, or to tell the runner."""
        return bool(self._running or self._waiting or self._inflight or self._announce_finished)

    # ---------------------------------------------------------------- one step
    def schedule(self) -> SchedulerOutput:
        """The next step.  Raises `SchedulerSimError` when too many steps are already in flight."""
        if len(self._inflight) > self.config.max_inflight_steps:
            raise SchedulerSimError(
                f"{len(self._inflight)} steps in flight; max_inflight_steps={self.config.max_inflight_steps}: call update() first"
            )
        lim = self.limits
        step_id = self._next_step_id
        finished_ids = frozenset(self._announce_finished)
        self._announce_finished.clear()
        preempted_ids: set[str] = set()
        for req in list(self._running):
            if req.req_id in self._force_preempt:
                self._preempt(req)
                preempted_ids.add(req.req_id)
                self.stats.preempted_forced += 1
        self._force_preempt.clear()

        budget = lim.max_num_batched_tokens
        scheduled: dict[str, int] = {}
        drafts: dict[str, tuple[int, ...]] = {}
        device_drafts: dict[str, int] = {}
        # The cached requests as parallel lists (`CachedRequests`), in batch order.
        cached_ids: list[str] = []
        cached_blocks: list[tuple[int, ...]] = []
        cached_computed: list[int] = []
        samplers: dict[str, int] = {}
        i = 0
        while i < len(self._running) and budget > 0:
            req = self._running[i]
            i += 1
            n, draft = self._plan_running(req, budget)
            if n == 0:
                continue
            device_k = 0
            if self.config.ngram_spec_tokens and not draft and n == 1 and req.num_computed >= req.prefill_len:
                device_k = device_draft_count(self._rng, lim, self.config.ngram_spec_tokens, req.known_tokens(), budget - 1,
                                              always_most=self._most_device_drafts)
                n += device_k
            new_blocks = self._reserve_blocks(req, req.num_computed + n, preempted_ids)
            if new_blocks is None:  # preempted itself: it was the most recent admission
                break
            cached_ids.append(req.req_id)
            cached_blocks.append(tuple(new_blocks))
            cached_computed.append(req.num_computed)
            scheduled[req.req_id] = n
            if draft:
                drafts[req.req_id] = draft
                req.drafts_in_flight = True
                self.stats.draft_steps += 1
            if device_k:
                device_drafts[req.req_id] = device_k
                req.drafts_in_flight = True
                self.spec_stats.draft_steps += 1
                self.spec_stats.draft_tokens += device_k
            if req.num_computed + n == req.known_tokens() + len(draft) + device_k:
                samplers[req.req_id] = len(draft) + device_k
                req.pending_samples += 1
            req.num_computed += n
            budget -= n

        new_requests: list[NewRequest] = []
        live = len(self._running)
        for req in list(self._waiting):
            if budget <= 0 or live >= lim.max_num_reqs:
                break
            if req.req_id in preempted_ids or req.pending_samples > 0:
                continue  # resume only once every output of its last admission has arrived
            plan = self._admission_plan(req, budget)
            if plan is None:
                break
            prefill, hashes, hit_blocks, n = plan
            hit = len(hit_blocks) * lim.block_size
            self._waiting.remove(req)
            if req.status is RequestStatus.PREEMPTED:
                self.stats.resumed += 1
            else:
                self.stats.admitted += 1
            req.status = RequestStatus.RUNNING
            self.blocks.take(hit_blocks)
            req.blocks = hit_blocks + self.blocks.allocate(-(-(hit + n) // lim.block_size) - len(hit_blocks))
            req.block_hashes = hashes[: len(hit_blocks)]
            req.prefill_len = len(prefill)
            req.outputs_at_admission = len(req.outputs)
            req.num_computed = hit + n
            req.drafts_in_flight = False
            self._running.append(req)
            live += 1
            self.stats.prefill_tokens += len(prefill)
            self.stats.cached_tokens += hit
            self.stats.prefix_hits += hit > 0
            new_requests.append(NewRequest(req.req_id, req.prompt, req.params, tuple(req.blocks), tuple(req.outputs), hit))
            scheduled[req.req_id] = n
            if hit + n == len(prefill):
                samplers[req.req_id] = 0
                req.pending_samples += 1
            budget -= n

        # Cached only now: a block computed in this step is hit from the next step on (stream order).
        self._cache_computed_blocks()
        self.stats.evictions = self.blocks.num_evictions
        self._next_step_id += 1
        self.stats.steps += 1
        self._inflight.append(_StepRecord(step_id, tuple(scheduled), samplers, frozenset(device_drafts)))
        return SchedulerOutput(
            step_id=step_id,
            new_requests=tuple(new_requests),
            cached_requests=CachedRequests(tuple(cached_ids), tuple(cached_blocks), tuple(cached_computed)),
            num_scheduled_tokens=scheduled,
            finished_req_ids=finished_ids,
            preempted_req_ids=frozenset(preempted_ids),
            draft_token_ids=drafts,
            num_device_drafts=device_drafts,
        )

    def update(self, out: ModelRunnerOutput) -> None:
        """Take the oldest in-flight step's output.  Tokens for finished requests are dropped."""
        if not self._inflight:
            raise SchedulerSimError(f"output for step {out.step_id} but no step is in flight")
        record = self._inflight[0]
        if out.step_id != record.step_id:
            raise SchedulerSimError(f"output for step {out.step_id}, but the oldest step in flight is {record.step_id}")
        tokens = out.token_dict()
        for rid, toks in tokens.items():
            if rid not in record.scheduled:
                raise SchedulerSimError(f"step {out.step_id}: output for {rid!r}, which was not scheduled")
            if rid not in record.samplers and toks:
                raise SchedulerSimError(f"step {out.step_id}: {rid!r} sampled in a step that computed a partial prefill")
        for rid, num_drafts in record.samplers.items():
            toks = tokens.get(rid, ())
            if not 1 <= len(toks) <= num_drafts + 1:
                raise SchedulerSimError(f"step {out.step_id}: {rid!r} returned {len(toks)} tokens, expected 1..{num_drafts + 1}")
        self._inflight.popleft()
        for rid, num_drafts in record.samplers.items():
            req = self._requests[rid]
            req.pending_samples -= 1
            if num_drafts:
                req.drafts_in_flight = False
            if rid in record.device_drafted:
                self.spec_stats.note_output(num_drafts, len(tokens[rid]))
            self._take_tokens(req, tokens[rid])
            if num_drafts and req.status is RequestStatus.RUNNING:
                req.num_computed = req.known_tokens() - 1  # rejected drafts' positions are recomputed
        self._cache_computed_blocks()

    # ---------------------------------------------------------------- checks
    def check_invariants(self) -> None:
        """Raise `SchedulerSimError` if the block pool or request records are inconsistent."""
        lim = self.limits
        for req in self._running:
            if req.status is not RequestStatus.RUNNING:
                raise SchedulerSimError(f"{req.req_id!r} in the running list with status {req.status}")
            if len(req.blocks) * lim.block_size < req.num_computed:
                raise SchedulerSimError(f"{req.req_id!r}: {len(req.blocks)} blocks for {req.num_computed} computed tokens")
            if len(req.block_hashes) > len(req.blocks):
                raise SchedulerSimError(f"{req.req_id!r}: {len(req.block_hashes)} cached blocks of {len(req.blocks)}")
        try:
            self.blocks.check({req.req_id: req.blocks for req in self._running})
        except PrefixCacheError as e:
            raise SchedulerSimError(f"block pool: {e}") from None
        if len(self._running) > lim.max_num_reqs:
            raise SchedulerSimError(f"{len(self._running)} running requests > max_num_reqs {lim.max_num_reqs}")
        for req in self._waiting:
            if req.blocks or req.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                raise SchedulerSimError(f"waiting request {req.req_id!r} holds blocks or has status {req.status}")

    # ---------------------------------------------------------------- internals
    def _get(self, req_id: str) -> _Request:
        try:
            return self._requests[req_id]
        except KeyError:
            raise SchedulerSimError(f"unknown request {req_id!r}") from None

    def _plan_running(self, req: _Request, budget: int) -> tuple[int, tuple[int, ...]]:
        """How many tokens to schedule for a running request, and its drafts (if any)."""
        lim = self.limits
        if req.drafts_in_flight:
            return 0, ()
        known = req.known_tokens()
        remaining = known - req.num_computed
        if remaining <= 0 or self._decode_capped(req):
            return 0, ()
        prefill_done = req.num_computed >= req.prefill_len
        n = min(remaining, budget)
        if not (prefill_done and remaining == 1) or self.config.draft_prob == 0.0:
            return n, ()
        if self._rng.random() >= self.config.draft_prob:
            return n, ()
        max_k = min(
            lim.max_num_draft_tokens,
            budget - 1,
            lim.max_model_len - known,
            req.params.max_tokens - len(req.outputs) - 1,
        )
        if max_k < 1:
            return n, ()
        k = self._rng.randint(1, max_k)
        history = req.prompt + tuple(req.outputs)
        # Guesses from the request's own history get accepted now and then (random-weight models
        # repeat themselves), so both the accept and the reject paths run.
        draft = tuple(
            self._rng.choice(history) if self._rng.random() < 0.7 else self._rng.randrange(lim.vocab_size)
            for _ in range(k)
        )
        return 1 + k, draft

    def _decode_capped(self, req: _Request) -> bool:
        """A decode would sample past ``max_tokens`` or ``max_model_len`` (counting in-flight samples)."""
        if req.num_computed < req.prefill_len:
            return False
        return (
            len(req.outputs) + req.pending_samples >= req.params.max_tokens
            or req.known_tokens() >= self.limits.max_model_len
        )

    def _reserve_blocks(self, req: _Request, num_tokens: int, preempted_ids: set[str]) -> list[int] | None:
        """Blocks ``req`` needs to hold ``num_tokens``, preempting the newest admissions for them.

        Returns the newly allocated block ids, or None when ``req`` itself was preempted.
        """
        need = -(-num_tokens // self.limits.block_size) - len(req.blocks)
        while need > self.blocks.num_available:
            victim = self._running[-1]
            self._preempt(victim)
            preempted_ids.add(victim.req_id)
            self.stats.preempted_for_blocks += 1
            if victim is req:
                return None
        new = self.blocks.allocate(max(need, 0))
        req.blocks.extend(new)
        return new

    def _admission_plan(self, req: _Request, budget: int) -> tuple[tuple[int, ...], list[int], list[int], int] | None:
        """(prefill, its block hashes, the hit's cached blocks, tokens to schedule), or None when the
        first chunk's blocks are not available.  Pure, so `schedule` and `can_schedule` agree."""
        bs = self.limits.block_size
        prefill = req.prompt + tuple(req.outputs)
        hashes, hit_blocks = self.blocks.lookup_prefix(prefill) if req.params.prompt_logprobs is None else ([], [])
        hit = len(hit_blocks) * bs
        n = min(len(prefill) - hit, budget)
        need = -(-(hit + n) // bs) - len(hit_blocks)
        if need > self.blocks.num_available - self.blocks.num_evictable_among(hit_blocks):
            return None
        return prefill, hashes, hit_blocks, n

    def _cache_computed_blocks(self) -> None:
        """Cache every running request's full blocks whose positions were scheduled and tokens are known."""
        for req in self._running:
            req.block_hashes = self.blocks.cache_computed(req.blocks, req.prompt + tuple(req.outputs), req.num_computed,
                                                          req.block_hashes)

    def _preempt(self, req: _Request) -> None:
        self._running.remove(req)
        self._release_blocks(req)
        req.status = RequestStatus.PREEMPTED
        req.drafts_in_flight = False
        self._waiting.appendleft(req)

    def _release_blocks(self, req: _Request) -> None:
        self.blocks.release(req.blocks)
        req.blocks = []
        req.block_hashes = []

    def _finish(self, req: _Request, reason: str) -> None:
        if req.status is RequestStatus.RUNNING:
            self._running.remove(req)
            self._release_blocks(req)
            self._announce_finished.add(req.req_id)
        elif req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            self._waiting.remove(req)
        self._force_preempt.discard(req.req_id)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        self.stats.finished += 1

    def _take_tokens(self, req: _Request, toks: Sequence[int]) -> None:
        lim = self.limits
        for i, tok in enumerate(toks):
            if req.status is RequestStatus.FINISHED:
                self.stats.dropped_tokens += len(toks) - i
                return
            req.outputs.append(int(tok))
            if tok in req.params.stop_token_ids:
                self._finish(req, "stop")
            elif len(req.outputs) >= req.params.max_tokens or len(req.prompt) + len(req.outputs) >= lim.max_model_len:
                self._finish(req, "length")
