"""What the batch-invariance check runs: probe requests, and the batches each is put into.

A *probe* is a request whose outputs are checked: an explicit seed (so its noise never depends on
its request id), top-n logprobs on (so a difference in the logits shows even when the token does
not change) and a fixed ``max_tokens`` with no stop tokens (so every run produces the same number
of tokens).  Each probe runs once **alone** -- the reference -- and then in scenarios that change
only what shares its steps:

``batch``       all probes together, in order
``permuted``    all probes together, in a seeded shuffled order (other rows, other batch slots)
``mixed``       the probes with companion requests of other sampling parameters (greedy, top-k,
                top-p, min-p, penalties, prompt logprobs) interleaved: batchmates that switch paths
``staggered``   probes arriving one every two steps: the batch grows and shrinks, prefills share
                steps with decodes, num_tokens changes every step
``size-N``      one probe with N - 1 companions (N from ``batch_sizes``; by default every size from 2 to
                max_num_reqs, so every CUDA-graph bucket and its edges are crossed; the probes take the
                sizes in turn)
``chunked``     all probes with a step budget of a few tokens: prefills split at other boundaries
``prefix-hit``  each probe after a warm-up request with the same prompt has finished, prefix
                caching on: its leading blocks come from the cache (the alone runs are misses)

Companions and warm-ups are not checked (their ids are not probes); they exist to change the batch.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from runnercheck.impl.interface import SAMPLING_FIELDS, RunnerLimits, SamplingParams

SCENARIO_KINDS = ("batch", "permuted", "mixed", "staggered", "size", "chunked", "prefix-hit")


@dataclass(frozen=True)
class ProbeRequest:
    """One checked request: its prompt and sampling parameters (explicit seed)."""

    name: str
    prompt: tuple[int, ...]
    params: SamplingParams

    def describe(self) -> str:
        p = self.params
        parts = ["greedy" if p.temperature == 0 else f"T={p.temperature:g}"]
        # Every other field of the interface's table that is on, by its short name.
        parts += [f"{f.short}={getattr(p, f.name):g}" for f in SAMPLING_FIELDS
                  if f.name != "temperature" and getattr(p, f.name) != f.neutral]
        if p.prompt_logprobs is not None:
            parts.append(f"prompt_logprobs={p.prompt_logprobs}")
        return f"{self.name} ({len(self.prompt)}-token prompt, {', '.join(parts)})"


@dataclass(frozen=True)
class Arrival:
    """A request entering a scenario at scheduler tick ``tick``; ``probe`` True when it is checked."""

    req_id: str
    request: ProbeRequest
    tick: int = 0
    probe: bool = True


@dataclass(frozen=True)
class Scenario:
    """One run through a fresh runner: who arrives when, and the scheduler knobs of the run."""

    name: str
    kind: str  # "alone" or one of SCENARIO_KINDS
    change: str  # the batch change this scenario makes, in words
    arrivals: tuple[Arrival, ...]
    step_budget: int | None = None  # a smaller per-step token budget than the runner's (chunk boundaries)
    prefix_caching: bool = False

    @property
    def probes(self) -> tuple[Arrival, ...]:
        return tuple(a for a in self.arrivals if a.probe)


@dataclass(frozen=True)
class ScenarioPlan:
    """The probes, their alone runs and every batched scenario, in run order."""

    probes: tuple[ProbeRequest, ...]
    alone: tuple[Scenario, ...]
    batched: tuple[Scenario, ...] = field(default_factory=tuple)


def _probe_params(i: int, rng: random.Random, max_tokens: int, logprobs: int | None) -> SamplingParams:
    # A mix of the paths the sampler takes: greedy, plain sampling, top-k, top-p, min-p, penalties.
    # Sampled probes run hot (flat distributions): a choice that depends on the batch then shows within
    # a few tokens instead of hiding behind a dominant token.
    variants = (
        dict(temperature=0.0),
        dict(temperature=1.5, top_k=20),
        dict(temperature=1.2, top_p=0.95),
        dict(temperature=1.0, min_p=0.02, repetition_penalty=1.2, presence_penalty=0.3),
    )
    return SamplingParams(seed=rng.randrange(2**31), logprobs=logprobs, max_tokens=max_tokens, **variants[i % len(variants)])


def make_probes(limits: RunnerLimits, *, seed: int, num_probes: int, max_tokens: int,
                prompt_logprobs: bool = True) -> tuple[ProbeRequest, ...]:
    """``num_probes`` seeded probes with prompts of different lengths (some longer than a KV block,
    so prefix hits and chunking have something to split); the second asks for prompt logprobs."""
    rng = random.Random(f"invariance-probes-{seed}")
    logprobs = min(5, limits.max_logprobs) or None
    longest = max(2, min(limits.max_model_len - max_tokens - 1, 3 * limits.block_size + 3))
    probes = []
    for i in range(num_probes):
        length = min(longest, 3 + (i * (limits.block_size + 5)) % longest + limits.block_size * (i % 2))
        prompt = tuple(rng.randrange(limits.vocab_size) for _ in range(max(2, length)))
        params = _probe_params(i, rng, max_tokens, logprobs)
        if prompt_logprobs and i == 1 and logprobs:
            params = replace(params, prompt_logprobs=min(3, logprobs))
        probes.append(ProbeRequest(f"p{i}", prompt, params))
    return tuple(probes)


def _companion(index: int, rng: random.Random, limits: RunnerLimits, max_tokens: int) -> ProbeRequest:
    """An unchecked batchmate whose parameters push the batch onto other paths."""
    logprobs = min(5, limits.max_logprobs) or None
    variants = (
        dict(temperature=0.0, logprobs=logprobs),
        dict(temperature=1.0, top_k=1),  # top-k of one: a batchmate on the top-k path
        dict(temperature=0.9, top_p=0.5, frequency_penalty=0.5),
        dict(temperature=1.3, min_p=0.1, prompt_logprobs=min(2, logprobs or 0) or None),
        dict(temperature=0.6, top_k=3, repetition_penalty=1.5),
    )
    length = 2 + rng.randrange(max(1, min(2 * limits.block_size, limits.max_model_len - max_tokens - 3)))
    prompt = tuple(rng.randrange(limits.vocab_size) for _ in range(length))
    return ProbeRequest(f"c{index}", prompt, SamplingParams(seed=rng.randrange(2**31), max_tokens=max_tokens,
                                                            **variants[index % len(variants)]))


def plan_scenarios(probes: tuple[ProbeRequest, ...], limits: RunnerLimits, *, seed: int,
                   batch_sizes: tuple[int, ...] | None = None, kinds: tuple[str, ...] = SCENARIO_KINDS,
                   max_tokens: int = 6) -> ScenarioPlan:
    """The alone runs and the batched scenarios of ``kinds`` for ``probes`` (see the module docstring)."""
    rng = random.Random(f"invariance-scenarios-{seed}")
    alone = tuple(Scenario(f"alone {p.name}", "alone", "alone", (Arrival(p.name, p),)) for p in probes)
    companions = [_companion(i, rng, limits, max_tokens) for i in range(max(limits.max_num_reqs, len(probes)))]
    out: list[Scenario] = []
    names = " ".join(p.name for p in probes)
    if "batch" in kinds and len(probes) > 1:
        out.append(Scenario("batch", "batch", f"all probes in one batch ({names})",
                            tuple(Arrival(p.name, p) for p in probes)))
    if "permuted" in kinds and len(probes) > 1:
        order = list(probes)
        while len(order) > 1 and order == list(probes):
            rng.shuffle(order)
        out.append(Scenario("permuted", "permuted", f"all probes, order {' '.join(p.name for p in order)}",
                            tuple(Arrival(p.name, p) for p in order)))
    if "mixed" in kinds:
        arrivals: list[Arrival] = []
        for i, p in enumerate(probes):
            c = companions[i]
            arrivals += [Arrival(c.name, c, probe=False), Arrival(p.name, p)]
        out.append(Scenario("mixed", "mixed", "each probe behind a companion with other sampling parameters "
                            f"({', '.join(companions[i].describe() for i in range(len(probes)))})", tuple(arrivals)))
    if "staggered" in kinds and len(probes) > 1:
        out.append(Scenario("staggered", "staggered", "probes arriving one every 2 steps (prefills next to decodes)",
                            tuple(Arrival(p.name, p, tick=2 * i) for i, p in enumerate(probes))))
    if "size" in kinds:
        sizes = batch_sizes if batch_sizes is not None else tuple(range(2, limits.max_num_reqs + 1))
        for n in sizes:
            probe = probes[(n - 2) % len(probes)]  # sizes take the probes in turn: each sampling path meets a size
            mates = tuple(Arrival(f"{c.name}", c, probe=False) for c in companions[: n - 1])
            out.append(Scenario(f"size-{n}", "size", f"{probe.name} in a batch of {n} (with {n - 1} companions)",
                                (Arrival(probe.name, probe),) + mates))
    if "chunked" in kinds:
        budget = max(2, min(limits.block_size // 2 + 1, limits.max_num_batched_tokens - 1))
        out.append(Scenario("chunked", "chunked", f"all probes, step budget {budget} tokens (prefills chunked)",
                            tuple(Arrival(p.name, p) for p in probes), step_budget=budget))
    if "prefix-hit" in kinds:
        for p in probes:
            if p.params.prompt_logprobs is not None or len(p.prompt) <= limits.block_size:
                continue  # no hit is possible: prompt logprobs never hit, and a hit is whole blocks short of the prompt
            warm = ProbeRequest(f"w-{p.name}", p.prompt, SamplingParams(seed=rng.randrange(2**31), max_tokens=1))
            wait = 3 + len(p.prompt) // max(1, limits.max_num_batched_tokens)
            out.append(Scenario(f"prefix-hit {p.name}", "prefix-hit",
                                f"{p.name} after a request with the same prompt (its leading blocks from the prefix cache)",
                                (Arrival(warm.name, warm, probe=False), Arrival(p.name, p, tick=wait)),
                                prefix_caching=True))
    return ScenarioPlan(probes, alone, tuple(out))


__all__ = ["ProbeRequest", "Arrival", "Scenario", "ScenarioPlan", "SCENARIO_KINDS", "make_probes", "plan_scenarios"]
