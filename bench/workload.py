"""A decode-heavy scheduling workload with churn, driving both the runner and the V1 baseline.

Requests are admitted with a fixed prompt length, prefilled in token-budget chunks, then decode
one token per step.  Each step, with probability ``churn * num_running``, one running request is
finished and a new one admitted in its place (~``churn`` of the batch per step).  The workload
never reads outputs: a benchmark measures the host cost of issuing steps.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from runnercheck.impl.interface import CachedRequests, NewRequest, SamplingParams, SchedulerOutput


@dataclass
class _Req:
    req_id: str
    prompt: tuple[int, ...]
    blocks: list[int]
    num_computed: int = 0
    num_tokens: int = 0
    new_blocks: list[int] = field(default_factory=list)


class DecodeWorkload:
    def __init__(self, *, num_reqs: int, prompt_len: int, vocab_size: int, block_size: int, num_blocks: int,
                 token_budget: int, churn: float, params: SamplingParams, seed: int = 0):
        self.num_reqs = num_reqs
        self.prompt_len = prompt_len
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.token_budget = token_budget
        self.churn = churn
        self.params = params
        self.rng = random.Random(seed)
        self.free_blocks = list(range(num_blocks))
        self.running: dict[str, _Req] = {}
        self.waiting: list[str] = []
        self.finished_pending: set[str] = set()
        self.step_id = 0
        self.next_id = 0
        self.events: list[tuple[str, str]] = []  # (kind, req_id) per step, for the baseline
        for _ in range(num_reqs):
            self._add()

    def _add(self) -> None:
        rid = f"r{self.next_id}"
        self.next_id += 1
        self.waiting.append(rid)

    def _blocks_for(self, req: _Req, upto: int) -> None:
        need = -(-upto // self.block_size)
        while len(req.blocks) < need:
            b = self.free_blocks.pop()
            req.blocks.append(b)
            req.new_blocks.append(b)

    @property
    def all_decoding(self) -> bool:
        return not self.waiting and all(r.num_computed >= len(r.prompt) for r in self.running.values())

    def next_step(self) -> SchedulerOutput:
        """The next SchedulerOutput; ``self.events`` lists what changed (for the baseline)."""
        self.events = []
        if self.all_decoding and self.running and self.rng.random() < self.churn * len(self.running):
            victim = self.rng.choice(sorted(self.running))
            req = self.running.pop(victim)
            self.free_blocks.extend(req.blocks)
            self.finished_pending.add(victim)
            self.events.append(("finish", victim))
            self._add()
        budget = self.token_budget
        new_reqs, scheduled = [], {}
        cached_ids: list[str] = []
        cached_blocks: list[tuple[int, ...]] = []
        cached_computed: list[int] = []
        for rid, req in self.running.items():
            if budget <= 0:
                break
            n = min(max(1, len(req.prompt) - req.num_computed), budget) if req.num_computed < len(req.prompt) else 1
            self._blocks_for(req, req.num_computed + n)
            cached_ids.append(rid)
            cached_blocks.append(tuple(req.new_blocks))
            cached_computed.append(req.num_computed)
            req.new_blocks = []
            scheduled[rid] = n
            req.num_computed += n
            budget -= n
        while self.waiting and budget > 0:
            rid = self.waiting.pop(0)
            prompt = tuple(self.rng.randrange(self.vocab_size) for _ in range(self.prompt_len))
            req = _Req(rid, prompt, [])
            n = min(len(prompt), budget)
            self._blocks_for(req, n)
            new_reqs.append(NewRequest(rid, prompt, self.params, tuple(req.blocks)))
            req.new_blocks = []
            self.running[rid] = req
            scheduled[rid] = n
            req.num_computed = n
            budget -= n
            self.events.append(("admit", rid))
        sched = SchedulerOutput(
            step_id=self.step_id, new_requests=tuple(new_reqs),
            cached_requests=CachedRequests(tuple(cached_ids), tuple(cached_blocks), tuple(cached_computed)),
            num_scheduled_tokens=scheduled, finished_req_ids=frozenset(self.finished_pending),
        )
        self.finished_pending = set()
        self.step_id += 1
        return sched
