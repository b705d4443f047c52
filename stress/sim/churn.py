"""Seeded random churn, recorded as an operation trace that replays without the generator.

Each tick, `Churn` adds requests (random prompt lengths within the limits and random
`SamplingParams`: greedy, temperature, top-k / top-p / min-p, penalties, explicit seeds or none,
logprobs, prompt logprobs, stop tokens), aborts random unfinished requests and force-preempts
random running ones.  So that the scheduler's prefix cache hits often, a new prompt may start
with one of a few fixed *system prompts* (``system_prompt_prob``), or continue a finished
request's conversation: its prompt, its outputs, then a few new user tokens
(``conversation_prob``).  Every operation it applies is appended to ``trace`` as a JSON-able dict,
one list per tick::

    {"op": "add", "req_id": "r7", "prompt": [3, 14, ...], "params": {...SamplingParams fields...}}
    {"op": "abort", "req_id": "r2"}
    {"op": "preempt", "req_id": "r5"}

`TraceReplay` applies a recorded trace tick by tick, so a replay depends only on the trace (not on
this module's random code path).  Both are ``before_tick`` callbacks for `runnercheck.stress.run.driver`.

Ownership: a `Churn` owns its RNG and its trace (host lists, appended to only by `__call__`).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Sequence

from runnercheck.impl.interface import SAMPLING_FIELDS, RunnerLimits, SamplingField, SamplingParams
from runnercheck.stress.sim.scheduler import SchedulerSim

OPS = ("add", "abort", "preempt")


class TraceError(ValueError):
    """A malformed operation or SamplingParams dict in a trace."""


def params_to_dict(params: SamplingParams) -> dict:
    d = asdict(params)
    d["stop_token_ids"] = list(params.stop_token_ids)
    return d


def params_from_dict(d: Any) -> SamplingParams:
    """Inverse of `params_to_dict`; `TraceError` on unknown or missing fields or wrong types."""
    if not isinstance(d, dict):
        raise TraceError(f"sampling params must be an object, got {type(d).__name__}")
    names = {f.name for f in fields(SamplingParams)}
    unknown = set(d) - names
    if unknown:
        raise TraceError(f"unknown sampling params {sorted(unknown)}")
    kwargs = dict(d)
    stops = kwargs.get("stop_token_ids", [])
    if not isinstance(stops, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stops):
        raise TraceError(f"stop_token_ids must be a list of ints, got {stops!r}")
    kwargs["stop_token_ids"] = tuple(stops)
    for spec in SAMPLING_FIELDS:
        if spec.name in kwargs and not spec.is_int and (isinstance(kwargs[spec.name], bool)
                                                        or not isinstance(kwargs[spec.name], (int, float))):
            raise TraceError(f"{spec.name} must be a number, got {kwargs[spec.name]!r}")
    for name in (*(f.name for f in SAMPLING_FIELDS if f.is_int), "max_tokens"):
        if name in kwargs and (isinstance(kwargs[name], bool) or not isinstance(kwargs[name], int)):
            raise TraceError(f"{name} must be an int, got {kwargs[name]!r}")
    if "logprobs_mode" in kwargs and not isinstance(kwargs["logprobs_mode"], str):
        raise TraceError(f"logprobs_mode must be a string, got {kwargs['logprobs_mode']!r}")
    for name in ("seed", "logprobs", "prompt_logprobs"):
        v = kwargs.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise TraceError(f"{name} must be an int or null, got {v!r}")
    return SamplingParams(**kwargs)


def validate_operation(op: Any) -> None:
    """Shape check of one trace entry (`TraceError`); values are checked when applied."""
    if not isinstance(op, dict):
        raise TraceError(f"operation must be an object, got {type(op).__name__}")
    kind = op.get("op")
    if kind not in OPS:
        raise TraceError(f"operation kind {kind!r} not one of {OPS}")
    if not isinstance(op.get("req_id"), str) or not op["req_id"]:
        raise TraceError(f"{kind} operation needs a non-empty string req_id")
    expected = {"op", "req_id", "prompt", "params"} if kind == "add" else {"op", "req_id"}
    if set(op) != expected:
        raise TraceError(f"{kind} operation has fields {sorted(op)}, expected {sorted(expected)}")
    if kind == "add":
        prompt = op["prompt"]
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise TraceError(f"add {op['req_id']!r}: prompt must be a non-empty list of ints")
        params_from_dict(op["params"])


def apply_operation(scheduler: SchedulerSim, op: dict) -> None:
    kind = op["op"]
    if kind == "add":
        scheduler.add_request(op["req_id"], op["prompt"], params_from_dict(op["params"]))
    elif kind == "abort":
        scheduler.abort(op["req_id"])
    else:
        scheduler.preempt(op["req_id"])


@dataclass(frozen=True)
class ChurnConfig:
    """Rates and ranges of the random churn (per tick)."""

    add_prob: float = 0.6
    max_adds_per_tick: int = 2
    max_unfinished: int = 12
    abort_prob: float = 0.05
    preempt_prob: float = 0.08
    max_prompt_len: int = 40
    max_new_tokens: int = 24
    greedy_prob: float = 0.25
    top_k_prob: float = 0.3
    top_p_prob: float = 0.3
    min_p_prob: float = 0.2
    penalty_prob: float = 0.2  # each penalty of the table's
    filter_prob: float = 0.3  # each filter of the table's without a rate of its own (``<name>_prob``)
    seed_prob: float = 0.5
    logprobs_prob: float = 0.3
    prompt_logprobs_prob: float = 0.15
    stop_prob: float = 0.3
    system_prompt_prob: float = 0.8  # a new prompt starts with one of the shared system prompts
    num_system_prompts: int = 1
    system_prompt_len: int = 8
    conversation_prob: float = 0.25  # a new prompt continues a finished request's conversation
    # Cycle every request through `PARAM_PLAN` (each entry's knobs forced on, the rest random), so a
    # short campaign still reaches every interacting pair of sampling knobs (`runnercheck.stress.run.coverage`).
    param_plan: bool = False
    # A new prompt is a short pattern repeated (the n-gram proposer's drafts then match); 0: never drawn.
    repetitive_prompt_prob: float = 0.0
    # A request asking for prompt logprobs gets a fresh prompt of exactly one or two token budgets
    # (``max_num_batched_tokens``, when that fits ``max_prompt_len``): a step scheduling it alone fills
    # the budget with prompt-logprob rows (full chunks); 0: never drawn (the draws of older configs stay).
    full_chunk_prob: float = 0.0
    # The run's first request, added at its first tick before any other, asks for prompt logprobs with a fresh
    # prompt of exactly one token budget: admitted first into an empty step, its prompt-logprob rows fill the budget
    # whatever the lag or the timing (verify's cuda chunking run: the coverage gate asks for such a step); its own
    # draws come from a stream of their own, so the rest of the run draws as without it.  False: not made.
    full_chunk_first: bool = False
    # A request asking for logprobs asks for processed ones (`SamplingParams.logprobs_mode`) with this rate, drawn
    # from a stream of its own (``Churn.mode_rng``), so every other draw of a seed stays what it was.
    processed_logprobs_prob: float = 0.3
    # A request with top-k on gets k in 1..3 instead of the table's draw: at or below the width of an exact-tie
    # logit row (`runnercheck.stress.sim.faults`: four entries at the top), so top-k's tie rule at the k-th value
    # is reached; 0: never drawn (the draws of older configs stay).
    tie_top_k_prob: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def draw_value(spec: SamplingField, rng: random.Random, limits: RunnerLimits) -> float | int:
    """One "on" value of a sampling field, from its table row's ``draw`` range: an int field's ``randint`` (capped at
    the vocabulary when it counts tokens), a float field's ``uniform`` rounded to 3 places."""
    low, high = spec.draw
    if spec.is_int:
        return rng.randint(low, min(high, limits.vocab_size) if spec.counts_tokens else high)
    return round(rng.uniform(low, high), 3)


def field_rate(config: ChurnConfig, spec: SamplingField) -> float:
    """How often a request turns ``spec`` on: its own ``<name>_prob`` (top_k_prob, ...), else its stage's rate
    (``penalty_prob``, ``filter_prob``)."""
    own = getattr(config, f"{spec.name}_prob", None)
    return own if own is not None else getattr(config, f"{spec.stage}_prob")


# The knobs of the interface's table (temperature aside: its knob is greedy, temperature 0), by report label.
_KNOB_FIELDS = {f.label: f for f in SAMPLING_FIELDS if f.stage != "temperature"}
_KNOB_SETTERS = {
    **{label: (lambda rng, lim, spec=spec: {spec.name: draw_value(spec, rng, lim)}) for label, spec in _KNOB_FIELDS.items()},
    "greedy": lambda rng, lim: {"temperature": 0.0},
}
_KNOBS = list(_KNOB_FIELDS)
_FILTER_KNOBS = tuple(k for k, f in _KNOB_FIELDS.items() if f.stage == "filter")
_PENALTY_KNOBS = tuple(k for k, f in _KNOB_FIELDS.items() if f.stage == "penalty")
PARAM_PLAN: tuple[tuple[str, ...], ...] = (
    *((a, b) for i, a in enumerate(_KNOBS) for b in _KNOBS[i + 1:]),
    _FILTER_KNOBS,
    _PENALTY_KNOBS,
    ("greedy", _PENALTY_KNOBS[0]),
)


class Churn:
    """Seeded operation generator; call it as ``before_tick``.  ``trace`` records what it applied."""

    def __init__(self, limits: RunnerLimits, seed: int, config: ChurnConfig | None = None):
        self.limits = limits
        self.config = config or ChurnConfig()
        self.rng = random.Random(seed)
        self.mode_rng = random.Random(f"logprobs_mode:{seed}")  # the processed-logprobs coin only
        self.first_rng = random.Random(f"full_chunk_first:{seed}")  # `ChurnConfig.full_chunk_first`'s request only
        self.trace: list[list[dict]] = []
        self._next_id = 0
        # Drawn first, so they depend on the seed alone; the trace records whole prompts anyway.
        self.system_prompts = [[self.rng.randrange(limits.vocab_size) for _ in range(self.config.system_prompt_len)]
                               for _ in range(self.config.num_system_prompts)]
        self._prompts: dict[str, list[int]] = {}  # every added request's prompt, for conversations
        self._planned = seed % len(PARAM_PLAN)  # runs of one campaign start at different plan entries

    def __call__(self, tick: int, scheduler: SchedulerSim) -> None:
        while len(self.trace) < tick:
            self.trace.append([])
        ops = self._operations(scheduler)
        for op in ops:
            apply_operation(scheduler, op)
        self.trace.append(ops)

    def _operations(self, scheduler: SchedulerSim) -> list[dict]:
        cfg, rng = self.config, self.rng
        ops: list[dict] = []
        unfinished = list(scheduler.unfinished_ids)
        if unfinished and rng.random() < cfg.abort_prob:
            victim = rng.choice(unfinished)
            ops.append({"op": "abort", "req_id": victim})
            unfinished.remove(victim)
        running = [r for r in scheduler.running_ids if r in unfinished]
        if running and rng.random() < cfg.preempt_prob:
            ops.append({"op": "preempt", "req_id": rng.choice(running)})
        if cfg.full_chunk_first and self._next_id == 0:
            first = self._first_full_chunk_request()
            if first is not None:
                ops.append(first)
                unfinished.append(first["req_id"])
        for _ in range(cfg.max_adds_per_tick):
            if len(unfinished) >= cfg.max_unfinished or rng.random() >= cfg.add_prob:
                break
            op = self._new_request(scheduler)
            ops.append(op)
            unfinished.append(op["req_id"])
        return ops

    def _new_request(self, scheduler: SchedulerSim) -> dict:
        cfg, rng, lim = self.config, self.rng, self.limits
        req_id = f"r{self._next_id}"
        self._next_id += 1
        pool_tokens = lim.num_kv_blocks * lim.block_size
        longest = min(lim.max_model_len, pool_tokens)
        prompt_len = rng.randint(1, max(1, min(cfg.max_prompt_len, longest - 1)))
        prompt = [rng.randrange(lim.vocab_size) for _ in range(prompt_len)]
        if cfg.repetitive_prompt_prob and rng.random() < cfg.repetitive_prompt_prob:
            period = rng.randint(1, 4)  # a short pattern repeated: n-gram drafts match and get accepted
            prompt = [prompt[i % period] for i in range(prompt_len)]
        prompt = self._shared_prefix(prompt, scheduler)[: max(1, min(longest - 1, 2 * cfg.max_prompt_len + cfg.system_prompt_len))]
        self._prompts[req_id] = prompt
        max_tokens = rng.randint(1, max(1, min(cfg.max_new_tokens, longest - len(prompt))))
        params = self._params(max_tokens)
        if len(prompt) > cfg.max_prompt_len and params.prompt_logprobs is not None:
            # Prompt logprobs only for prompts of at most max_prompt_len tokens: a logits fault
            # (`runnercheck.stress.sim.faults`) placed past that position never reaches a row that feeds them.
            params = replace(params, prompt_logprobs=None)
        if cfg.full_chunk_prob and params.prompt_logprobs is not None and rng.random() < cfg.full_chunk_prob:
            prompt, params = self._full_chunk_prompt(prompt, params, longest)
            self._prompts[req_id] = prompt
        return {"op": "add", "req_id": req_id, "prompt": prompt, "params": params_to_dict(params)}

    def _first_full_chunk_request(self) -> dict | None:
        """`ChurnConfig.full_chunk_first`'s request: a fresh prompt of one token budget, greedy, one prompt logprob
        per position, a few new tokens; None where a budget does not fit ``max_prompt_len`` (prompt-logprob prompts stay
        short: `_new_request`), the model length or the pool."""
        lim, rng = self.limits, self.first_rng
        n = lim.max_num_batched_tokens
        if n > min(self.config.max_prompt_len, lim.max_model_len - 1, lim.num_kv_blocks * lim.block_size - 1):
            return None
        req_id = f"r{self._next_id}"
        self._next_id += 1
        prompt = [rng.randrange(lim.vocab_size) for _ in range(n)]
        self._prompts[req_id] = prompt
        params = SamplingParams(max_tokens=rng.randint(1, 4), temperature=0.0, prompt_logprobs=1)
        return {"op": "add", "req_id": req_id, "prompt": prompt, "params": params_to_dict(params)}

    def _full_chunk_prompt(self, prompt: list[int], params: SamplingParams, longest: int) -> tuple[list[int], SamplingParams]:
        """A fresh prompt of one or two token budgets (no shared prefix: no hit moves its chunk boundaries)."""
        budget, cfg, rng = self.limits.max_num_batched_tokens, self.config, self.rng
        chunks = min(2, cfg.max_prompt_len // budget, (longest - 1) // budget)
        if chunks < 1:
            return prompt, params
        n = budget * rng.randint(1, chunks)
        prompt = [rng.randrange(self.limits.vocab_size) for _ in range(n)]
        return prompt, replace(params, max_tokens=max(1, min(params.max_tokens, longest - n)))

    def _shared_prefix(self, fresh: list[int], scheduler: SchedulerSim) -> list[int]:
        """``fresh`` user tokens behind a finished conversation or a system prompt (or alone)."""
        cfg, rng = self.config, self.rng
        finished = sorted(r for r in scheduler.finished if r in self._prompts)
        if finished and rng.random() < cfg.conversation_prob:
            old = rng.choice(finished)
            return self._prompts[old] + list(scheduler.outputs(old)) + fresh[: max(1, len(fresh) // 4)]
        if self.system_prompts and rng.random() < cfg.system_prompt_prob:
            return rng.choice(self.system_prompts) + fresh[: max(1, len(fresh) // 2)]  # a user turn behind it
        return fresh

    def _params(self, max_tokens: int) -> SamplingParams:
        cfg, rng, lim = self.config, self.rng, self.limits
        kw: dict[str, Any] = {"max_tokens": max_tokens}
        # The table's fields in its order, one coin each (the order existing seeds drew them in): the temperature's
        # coin picks greedy (0) or a drawn temperature; any other field's picks a drawn value or leaves it off.
        for spec in SAMPLING_FIELDS:
            if spec.stage == "temperature":
                kw[spec.name] = 0.0 if rng.random() < cfg.greedy_prob else draw_value(spec, rng, lim)
            elif rng.random() < field_rate(cfg, spec):
                kw[spec.name] = draw_value(spec, rng, lim)
        if rng.random() < cfg.seed_prob:
            kw["seed"] = rng.randrange(2**63)
        if rng.random() < cfg.logprobs_prob:
            kw["logprobs"] = rng.randint(0, min(5, lim.max_logprobs))
            if self.mode_rng.random() < cfg.processed_logprobs_prob:
                kw["logprobs_mode"] = "processed"
        if rng.random() < cfg.prompt_logprobs_prob:
            kw["prompt_logprobs"] = rng.randint(0, min(3, lim.max_logprobs))
        if rng.random() < cfg.stop_prob:
            kw["stop_token_ids"] = tuple(rng.randrange(lim.vocab_size) for _ in range(rng.randint(1, 2)))
        if cfg.param_plan:
            for knob in PARAM_PLAN[self._planned % len(PARAM_PLAN)]:
                kw.update(_KNOB_SETTERS[knob](rng, lim))
            self._planned += 1
        if cfg.tie_top_k_prob and kw.get("top_k", -1) > 0 and rng.random() < cfg.tie_top_k_prob:
            kw["top_k"] = rng.randint(1, min(3, lim.vocab_size))
        return SamplingParams(**kw)


class TraceReplay:
    """Apply a recorded trace as ``before_tick``: tick t gets ``trace[t]`` (nothing past its end)."""

    def __init__(self, trace: Sequence[Sequence[dict]]):
        for ops in trace:
            for op in ops:
                validate_operation(op)
        self.trace = [list(ops) for ops in trace]

    def __call__(self, tick: int, scheduler: SchedulerSim) -> None:
        if tick < len(self.trace):
            for op in self.trace[tick]:
                apply_operation(scheduler, op)
