"""The traffic each mutant of `runnercheck.stress.mutants.catalogue` is exercised with (its `Workload`).

A workload is the slice of traffic -- sampling params, limits, lag policy -- in which a mutant's bug
shows up within a few scheduler ticks.  `runnercheck.stress.mutants.catalogue` names one per mutant; `runnercheck mutants`
also runs every workload unmutated as a control (no check may fire).  Every workload is defined
here, the CUDA-graph and prefix-caching ones too: a run in a spawned child process (cuda) imports
only this module, not the catalogues that use them.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

from runnercheck.impl.interface import SamplingParams
from runnercheck.stress.sim.churn import ChurnConfig


def _params(rng: random.Random, max_tokens: int, **fields: Any) -> SamplingParams:
    fields.setdefault("seed", rng.randrange(2**63) if rng.random() < 0.5 else None)
    return SamplingParams(max_tokens=max_tokens, **fields)


@dataclass(frozen=True)
class Workload:
    """The traffic a mutant is exercised with: churn, sampling params, limits, and how far the device lags.

    ``params(rng, max_tokens)`` draws every added request's `SamplingParams` (None: the churn's own
    random mix).  ``lag_policy`` is the sim device's; on cuda, ``cuda_lag`` makes the GPU trail the
    host with injected delays calibrated on the host's tick (`runnercheck.stress.sim.races`), otherwise the GPU runs
    as fast as it can (ahead of a host that also runs the oracle).  ``ticks`` is the tick budget of
    a ``--quick`` run, ``full_ticks`` of a full run.
    """

    name: str
    description: str
    churn: ChurnConfig
    params: Callable[[random.Random, int], SamplingParams] | None = None
    max_num_reqs: int = 2
    block_size: int = 4
    num_kv_blocks: int = 24
    max_batched_tokens: int = 8
    max_inflight: int = 1
    lag_policy: str = "random-drain"
    cuda_lag: bool = False
    ticks: int = 16
    full_ticks: int = 48
    ngram_spec_tokens: int = 0  # > 0: the runner's proposer on (`runnercheck.stress.sim.spec_scheduler`), n-gram unless draft_model
    draft_model: str = ""  # a draft preset: the runner's draft-model proposer (no prefix caching, no explicit drafts)
    logits_fault: dict | None = None  # `runnercheck.stress.sim.faults.LogitsFault.describe()` planted in runner and oracle
    p_hold: float = 0.0  # sim random-drain: the lag mix's held steps (`runnercheck.stress.sim.lag_mix`)


_QUIET = dict(abort_prob=0.0, preempt_prob=0.0, top_k_prob=0.0, top_p_prob=0.0, min_p_prob=0.0, penalty_prob=0.0,
              filter_prob=0.0, logprobs_prob=0.0, prompt_logprobs_prob=0.0, stop_prob=0.0, max_prompt_len=12, max_new_tokens=8)
_SAMPLING = dict(_QUIET, max_prompt_len=6, max_new_tokens=6, add_prob=0.9)

WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("steady", "greedy and temperature sampling, chunked prefills, random-drain lag",
             ChurnConfig(**dict(_QUIET, add_prob=0.8, greedy_prob=0.5))),
    Workload("decode", "short prompts, long outputs, up to 4 requests: mostly decodes",
             ChurnConfig(**dict(_QUIET, add_prob=0.8, greedy_prob=0.5, max_prompt_len=4, max_new_tokens=16)),
             max_num_reqs=4),
    Workload("prompt-logprobs", "as steady, half the prompts asking for prompt logprobs: their prefill steps run eager",
             ChurnConfig(**dict(_QUIET, add_prob=0.8, greedy_prob=0.5, prompt_logprobs_prob=0.5))),
    Workload("racing", "as steady; random-drain lag on sim, an undelayed GPU running ahead on cuda",
             ChurnConfig(**dict(_QUIET, add_prob=0.8, greedy_prob=0.5))),
    Workload("lagging", "as steady; the device a step behind (lag-1-steps on sim, calibrated delays on cuda)",
             ChurnConfig(**dict(_QUIET, add_prob=0.8, greedy_prob=0.5)), lag_policy="lag-1-steps", cuda_lag=True),
    Workload("row-reuse", "short requests, aborts and preemptions: rows freed and re-admitted in one step",
             ChurnConfig(**dict(_QUIET, add_prob=0.9, abort_prob=0.2, preempt_prob=0.8, max_new_tokens=3,
                                max_prompt_len=6, greedy_prob=0.2)),
             lag_policy="run-immediately", ticks=20),
    Workload("top-k", "temperature 1, top-k 1 or 2", ChurnConfig(**_SAMPLING),
             lambda rng, n: _params(rng, n, top_k=rng.randint(1, 2))),
    Workload("top-p", "temperature 1, top-p 0.25..0.7 (a few tokens kept), up to 4 requests",
             ChurnConfig(**_SAMPLING), lambda rng, n: _params(rng, n, top_p=round(rng.uniform(0.25, 0.7), 3)),
             max_num_reqs=4),
    Workload("temperature", "temperatures far from 1 (0.3..0.6 or 1.5..2)", ChurnConfig(**_SAMPLING),
             lambda rng, n: _params(rng, n, temperature=round(rng.choice((rng.uniform(0.3, 0.6), rng.uniform(1.5, 2.0))), 3))),
    Workload("penalties", "repetition, frequency and presence penalties, temperature 1", ChurnConfig(**_SAMPLING),
             lambda rng, n: _params(rng, n, repetition_penalty=round(rng.uniform(1.3, 2.0), 3),
                                    frequency_penalty=round(rng.uniform(0.5, 1.5), 3),
                                    presence_penalty=round(rng.uniform(0.5, 1.5), 3))),
    Workload("logprobs", "top-0..2 logprobs at temperatures 1.5..2.5", ChurnConfig(**_SAMPLING),
             lambda rng, n: _params(rng, n, temperature=round(rng.uniform(1.5, 2.5), 3), logprobs=rng.randint(0, 2))),
    Workload("noise", "plain temperature-1 sampling", ChurnConfig(**dict(_SAMPLING, greedy_prob=0.0))),
    Workload("greedy-mix", "half the requests greedy, half at temperatures 1.5..2.5 (an argmax is rarely their sample): "
             "greedy and sampling rows in one batch, up to 4 requests", ChurnConfig(**dict(_SAMPLING, max_new_tokens=4)),
             lambda rng, n: _params(rng, n, temperature=0.0 if rng.random() < 0.5 else round(rng.uniform(1.5, 2.5), 3)),
             max_num_reqs=4, max_batched_tokens=16, ticks=24),
    Workload("filter-mix", "half the requests with top-p 0.95 at temperatures 2..3 (many tokens kept: their argmax is "
             "rarely the sample), half unfiltered at the same temperatures: filtered and unfiltered rows in one batch, up "
             "to 4 requests", ChurnConfig(**dict(_SAMPLING, max_new_tokens=4)),
             lambda rng, n: _params(rng, n, temperature=round(rng.uniform(2.0, 3.0), 3),
                                    top_p=0.95 if rng.random() < 0.5 else 1.0),
             max_num_reqs=4, max_batched_tokens=16, ticks=24),
)}


def _penalised(rng: random.Random, max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=round(rng.uniform(0.7, 1.0), 3),
                          seed=rng.randrange(2**63) if rng.random() < 0.5 else None,
                          frequency_penalty=round(rng.uniform(1.0, 2.0), 3), presence_penalty=round(rng.uniform(0.5, 1.5), 3))


# The first steps after init (`runnercheck.stress.mutants.streams`): CSAN slows every op, and a race between
# init-time writes and the first kernels shows up at capture warm-up or the first step.
WORKLOADS["first-steps"] = Workload(
    "first-steps", "as steady, a few ticks: the first steps read what init wrote", WORKLOADS["steady"].churn,
    ticks=4, full_ticks=8)

# The runner's n-gram proposer on (`runnercheck.stress.mutants.spec`): every decode asks for 3 device drafts.
WORKLOADS["ngram"] = Workload(
    "ngram", "greedy requests on repeated-pattern prompts, the n-gram proposer on (3 device drafts a decode)",
    ChurnConfig(add_prob=0.8, abort_prob=0.0, preempt_prob=0.05, top_k_prob=0.0, top_p_prob=0.0, min_p_prob=0.0,
                penalty_prob=0.0, logprobs_prob=0.0, prompt_logprobs_prob=0.0, stop_prob=0.0, greedy_prob=1.0,
                max_prompt_len=10, max_new_tokens=12, repetitive_prompt_prob=1.0),
    max_num_reqs=2, max_batched_tokens=8, ngram_spec_tokens=3, ticks=12, full_ticks=40)

# The runner's draft-model proposer on (`runnercheck.stress.mutants.spec`): temperatures 2.5..4 make the
# micro/micro-draft pair overlap by ~0.3-0.6 (sum min(p, q), measured), so steps accept some,
# all and none of their 3 drafts: every rejection-sampling decision shows up within a few ticks.
WORKLOADS["draft-model"] = Workload(
    "draft-model", "temperature 2.5..4, the micro-draft model drafting 3 tokens a decode, rejection-sampled",
    ChurnConfig(**dict(_SAMPLING, max_new_tokens=12, greedy_prob=0.0)),
    lambda rng, n: _params(rng, n, temperature=round(rng.uniform(2.5, 4.0), 3)),
    max_num_reqs=2, max_batched_tokens=8, ngram_spec_tokens=3, draft_model="micro-draft", ticks=12, full_ticks=40)

# Penalised decodes (`runnercheck.stress.mutants.graphs`): a padding request counted into a live row's output
# counts changes the penalties.
WORKLOADS["decode-penalties"] = Workload(
    "decode-penalties", "as decode, with frequency and presence penalties (output counts matter)",
    WORKLOADS["decode"].churn, _penalised, max_num_reqs=4)

# Prefix caching (`runnercheck.stress.mutants.prefix`).
PREFIX_WORKLOAD = Workload(
    "prefix", "shared system prompts, conversations, short outputs, preemptions, a 12-block pool: hits, sharing, eviction, reuse",
    ChurnConfig(add_prob=0.9, abort_prob=0.0, preempt_prob=0.25, top_k_prob=0.0, top_p_prob=0.0, min_p_prob=0.0,
                penalty_prob=0.0, logprobs_prob=0.0, prompt_logprobs_prob=0.0, stop_prob=0.0, greedy_prob=0.5,
                max_prompt_len=12, max_new_tokens=6, system_prompt_prob=0.9, num_system_prompts=2, system_prompt_len=8,
                conversation_prob=0.35),
    max_num_reqs=3, block_size=4, num_kv_blocks=12, max_batched_tokens=16, lag_policy="random-drain", ticks=24, full_ticks=60,
)
WORKLOADS[PREFIX_WORKLOAD.name] = PREFIX_WORKLOAD

# Traffic issue 60 added to the main job (`runnercheck.stress.mutants.reach`): whole-row logits faults from
# position 4 (no prompt asks for prompt logprobs) and random-drain holding half the steps.
WORKLOADS["reach"] = Workload(
    "reach", "as steady; NaN, +Inf, all-NaN, NaN/-Inf, +Inf/-Inf and exact-tie logit rows; random-drain holding half the steps",
    ChurnConfig(**dict(_QUIET, add_prob=0.8, greedy_prob=0.5)), ticks=24,
    logits_fault={"name": "nan-inf-rows", "min_position": 4, "modulus": 7, "nan_residue": 3, "inf_residue": 5,
                  "row_modulus": 5, "all_nan_residue": 0, "neg_residue": 1, "inf_mix_residue": 2, "tie_residue": 4},
    p_hold=0.5)

# Exact ties at the k-th logit (`runnercheck.stress.mutants.reach`): every request top-k 1..3 at temperature 1, and an
# exact-tie row (four entries at the row's maximum) at every fifth position from 4, as in ``reach``.
WORKLOADS["top-k-ties"] = Workload(
    "top-k-ties", "temperature 1, top-k 1..3; an exact-tie logit row (four entries at the top) every fifth position",
    ChurnConfig(**dict(_QUIET, add_prob=0.8)), lambda rng, n: _params(rng, n, top_k=rng.randint(1, 3)), ticks=24,
    logits_fault=WORKLOADS["reach"].logits_fault)

# Prompt-logprob rows that fill the token budget (`runnercheck.stress.mutants.reach`): every request asks for prompt
# logprobs on a fresh prompt of one or two budgets (8 tokens): a 16-token prompt's first chunk scores 8 rows.
WORKLOADS["full-chunk"] = Workload(
    "full-chunk", "prompt logprobs on fresh prompts of 8 or 16 tokens, a token budget of 8: full prompt-logprob chunks",
    ChurnConfig(**dict(_QUIET, add_prob=0.8, max_prompt_len=16, prompt_logprobs_prob=1.0, full_chunk_prob=1.0,
                       system_prompt_prob=0.0, conversation_prob=0.0)), ticks=16)

# Rows handed from request to request (`runnercheck.stress.mutants.graphs`): short penalised requests, two rows,
# so every few ticks a row whose counts the last request filled is admitted into again.
WORKLOADS["reuse-penalties"] = Workload(
    "reuse-penalties", "short requests with frequency and presence penalties through two rows (counts reset at reuse)",
    ChurnConfig(**dict(_QUIET, add_prob=0.9, max_prompt_len=6, max_new_tokens=4)), _penalised, max_num_reqs=2,
    max_batched_tokens=8, ticks=28)


def _processed_logprobs(rng: random.Random, max_tokens: int) -> SamplingParams:
    """Temperatures far from 1 and one filter each, so that a processed logprob missing the temperature or the
    kept mask is off by far more than the tolerance; ~60% of the requests ask for processed logprobs, the rest
    raw, so rows pass from one mode to the other."""
    filters = rng.choice(({"top_k": rng.randint(2, 6)}, {"top_p": round(rng.uniform(0.4, 0.8), 3)},
                          {"min_p": round(rng.uniform(0.05, 0.2), 3)}))
    return _params(rng, max_tokens, temperature=round(rng.uniform(1.6, 2.5), 3), logprobs=rng.randint(1, 3),
                   logprobs_mode="processed" if rng.random() < 0.6 else "raw", **filters)


# Processed logprobs (`runnercheck.stress.mutants.logprobs`): short filtered requests through two rows, half of them
# asking for processed logprobs, so a row's mode changes at reuse and every step compares some processed rows.
WORKLOADS["processed-logprobs"] = Workload(
    "processed-logprobs", "temperature 1.6..2.5 with top-k, top-p or min-p, top-1..3 logprobs, ~60% processed, two rows",
    ChurnConfig(**dict(_SAMPLING, max_new_tokens=4)), _processed_logprobs, max_num_reqs=2, ticks=16, full_ticks=40)
