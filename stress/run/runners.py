"""Runner factories: the seam through which `runnercheck stress` and the differential driver get a runner.

Factory contract
----------------
A runner factory is any callable ::

    factory(weights: ModelWeights, limits: RunnerLimits, device: impl.device.Device, base_seed: int)
        -> impl.interface.Runner

(factories may also take the keyword ``cuda_graphs: bool``; the harness passes it to those that
do) returning an object with ``execute_model(sched: SchedulerOutput) -> AsyncOutput`` whose
``.get()`` returns the step's `ModelRunnerOutput`.  The runner must sample requests without a
seed with ``runnercheck.impl.interface.effective_seed(params, req_id, base_seed)`` so the oracle (built with
the same base seed) samples the same tokens.  On the command line a factory is named
``package.module:attribute`` (``--runner``, loaded by `runnercheck.checks.loader.load_callable`); the default is ``runnercheck.impl.runner:make_runner``, the GPU
runner.

`RunnerBoundaryMirror` is what a runner keeps of the request stream to validate each step with
`runnercheck.impl.boundary.validate_scheduler_output`; the simple runner and the differential driver use it.

Factories here
--------------
``simple_runner``     a deliberately simple second runner: host-side, recomputes every request's
                      whole sequence every step with a dense float32 PyTorch forward (no KV cache,
                      no paging), and samples with a float32 Gumbel-max pipeline that follows
                      docs/SAMPLING.md using ``runnercheck.reference.rng``'s bits.  It proves that the seam
                      takes any runner, and gives the harness an fp32 runner to test against.
``reference_runner``  the float64 oracle (`runnercheck.reference.runner.ReferenceRunner`) as a runner
                      (`runnercheck.reference.runner.AsyncReferenceRunner`: outputs complete on return).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch
import torch.nn.functional as F

from runnercheck.impl.boundary import validate_scheduler_output
from runnercheck.impl.interface import (
    LOGPROBS_MODES,
    LiveRequest,
    ModelRunnerOutput,
    RunnerLimits,
    SamplingParams,
    SchedulerOutput,
    TokenLogprobs,
    effective_seed,
)
from runnercheck.impl.model.weights import ModelWeights
from runnercheck.checks.chisq.samplers import sample_row

RunnerFactory = Callable[..., object]
DEFAULT_RUNNER_SPEC = "runnercheck.impl.runner:make_runner"


class CompletedOutput:
    """An `AsyncOutput` whose step already ran: ``get()`` returns at once."""

    def __init__(self, output: ModelRunnerOutput):
        self._output = output

    def get(self) -> ModelRunnerOutput:
        return self._output


# --------------------------------------------------------------------------- boundary mirror


class RunnerBoundaryMirror:
    """The runner-side view of a `SchedulerOutput` stream, for `validate_scheduler_output`.

    ``live`` holds one `LiveRequest` per request the runner holds: ``num_tokens`` an upper bound of
    the tokens it will hold (a sampling step adds one, or all drafts plus a bonus),
    ``num_computed_upper`` the tokens scheduled so far.  A step with drafts leaves the upper bound
    too high until its output is read: `observe` lowers it to the accepted length, which the
    boundary check needs (drafts must extend exactly the known tokens).  Owned and written only by
    `check` and `observe`.
    """

    def __init__(self, limits: RunnerLimits):
        self.limits = limits
        self.live: dict[str, LiveRequest] = {}
        self._draft_steps: dict[int, dict[str, int]] = {}  # step id -> {req id: number of drafts}

    def observe(self, out: ModelRunnerOutput) -> None:
        """Learn how many drafts each request of ``out``'s step accepted."""
        tokens = out.token_dict()
        for rid, k in self._draft_steps.pop(out.step_id, {}).items():
            produced = len(tokens.get(rid, ()))
            if rid in self.live and 1 <= produced <= k + 1:
                self.live[rid].num_tokens -= k + 1 - produced

    def check(self, sched: SchedulerOutput) -> None:
        """Validate ``sched`` against the mirror (raises before any change), then advance it."""
        validate_scheduler_output(sched, self.live, self.limits)
        for rid in sched.finished_req_ids | sched.preempted_req_ids:
            del self.live[rid]
        for req in sched.new_requests:
            self.live[req.req_id] = LiveRequest(len(req.prefill_token_ids), req.num_computed_tokens, len(req.block_ids))
        for c in sched.cached_requests:
            lr = self.live[c.req_id]
            lr.num_computed_upper = c.num_computed_tokens
            lr.num_blocks += len(c.new_block_ids)
        for rid, n in sched.num_scheduled_tokens.items():
            lr = self.live[rid]
            drafts = sched.num_drafts(rid)
            end = lr.num_computed_upper + n
            if end == lr.num_tokens + drafts:
                lr.num_tokens = end + 1
                if drafts:
                    self._draft_steps.setdefault(sched.step_id, {})[rid] = drafts
            lr.num_computed_upper = end


# --------------------------------------------------------------------------- dense fp32 model


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DenseModel:
    """The decoder applied to one whole sequence at a time, float32, dense causal attention.

    Owns a float32 CPU copy of the weights (read-only after construction).
    """

    def __init__(self, weights: ModelWeights):
        self.config = weights.config
        self.weights = weights.to("cpu", torch.float32)
        c = self.config
        self.inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))

    @torch.no_grad()
    def logits(self, token_ids: list[int]) -> torch.Tensor:
        """``[len(token_ids), vocab]`` float32 logits; row i predicts token i + 1."""
        c, w = self.config, self.weights
        t = len(token_ids)
        ids = torch.tensor(token_ids, dtype=torch.long)
        angles = torch.arange(t, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        cos = torch.cat((angles.cos(), angles.cos()), -1).to(torch.float32)[:, None, :]
        sin = torch.cat((angles.sin(), angles.sin()), -1).to(torch.float32)[:, None, :]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        group = c.num_heads // c.num_kv_heads
        x = w.embed[ids]
        for lw in w.layers:
            h = _rms_norm(x, lw.input_norm, c.rms_norm_eps)
            q, k, v = h @ lw.q_proj.T, h @ lw.k_proj.T, h @ lw.v_proj.T
            if lw.q_bias is not None:
                q, k, v = q + lw.q_bias, k + lw.k_bias, v + lw.v_bias
            q = q.view(t, c.num_heads, c.head_dim)
            k = k.view(t, c.num_kv_heads, c.head_dim)
            v = v.view(t, c.num_kv_heads, c.head_dim)
            if lw.q_norm is not None:
                q = _rms_norm(q, lw.q_norm, c.rms_norm_eps)
                k = _rms_norm(k, lw.k_norm, c.rms_norm_eps)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(c.head_dim)
            probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
            attn = torch.einsum("hqk,khd->qhd", probs, v).reshape(t, c.num_heads * c.head_dim)
            x = x + attn @ lw.o_proj.T
            h = _rms_norm(x, lw.post_attn_norm, c.rms_norm_eps)
            x = x + (F.silu(h @ lw.gate_proj.T) * (h @ lw.up_proj.T)) @ lw.down_proj.T
        return _rms_norm(x, w.final_norm, c.rms_norm_eps) @ w.lm_head.T


# --------------------------------------------------------------------------- fp32 logprobs


def token_logprobs_fp32(raw: torch.Tensor, token: int, top_n: int) -> TokenLogprobs:
    """Logprob, rank and top-n of ``token`` from raw logits (NaN as -inf; ties by lower index)."""
    logits = raw.masked_fill(torch.isnan(raw), float("-inf"))
    logprobs = logits - torch.logsumexp(logits, 0)
    rank = 1 + int((logits > logits[token]).sum())
    order = torch.sort(logits, descending=True, stable=True).indices[:top_n]
    return TokenLogprobs(
        token_id=token,
        logprob=float(logprobs[token]),
        rank=rank,
        top_token_ids=tuple(int(i) for i in order),
        top_logprobs=tuple(float(logprobs[i]) for i in order),
    )


# --------------------------------------------------------------------------- the simple runner


@dataclass
class _SimpleRequest:
    prompt_len: int
    tokens: list[int]  # prefill + outputs so far
    params: SamplingParams
    seed: int
    resumed: bool
    num_computed: int = 0
    blocks: int = 0


@dataclass
class SimpleRunner:
    """Host-side runner: every step recomputes each scheduled request's sequence from scratch.

    Owns one `_SimpleRequest` per live request (host memory, admitted -> finished/preempted, written
    only by `execute_model`).  Validates each step with `RunnerBoundaryMirror` before any change.
    """

    logprobs_modes: ClassVar[tuple[str, ...]] = LOGPROBS_MODES
    weights: ModelWeights
    limits: RunnerLimits
    base_seed: int = 0
    requests: dict[str, _SimpleRequest] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.model = DenseModel(self.weights)
        self.mirror = RunnerBoundaryMirror(self.limits)

    def execute_model(self, sched: SchedulerOutput) -> CompletedOutput:
        self.mirror.check(sched)
        for rid in sched.finished_req_ids | sched.preempted_req_ids:
            del self.requests[rid]
        for req in sched.new_requests:
            self.requests[req.req_id] = _SimpleRequest(
                prompt_len=len(req.prompt_token_ids),
                tokens=list(req.prefill_token_ids),
                params=req.sampling_params,
                seed=effective_seed(req.sampling_params, req.req_id, self.base_seed),
                resumed=req.is_resumed,
                num_computed=req.num_computed_tokens,
            )
        for c in sched.cached_requests:
            self.requests[c.req_id].num_computed = c.num_computed_tokens
        req_ids, sampled, logprobs, nan_flags = [], [], [], []
        prompt_logprobs: dict[str, tuple[TokenLogprobs, ...]] = {}
        seeds: dict[str, int] = {}
        for rid, n in sched.num_scheduled_tokens.items():
            state = self.requests[rid]
            drafts = list(sched.draft_token_ids.get(rid, ()))
            toks, lps, flag, plps = self._step_request(state, n, drafts)
            req_ids.append(rid)
            sampled.append(tuple(toks))
            logprobs.append(None if state.params.logprobs is None else tuple(lps))
            nan_flags.append(flag)
            seeds[rid] = state.seed
            if plps:
                prompt_logprobs[rid] = tuple(plps)
        out = ModelRunnerOutput(
            step_id=sched.step_id,
            req_ids=tuple(req_ids),
            sampled_token_ids=tuple(sampled),
            logprobs=tuple(logprobs),
            prompt_logprobs=prompt_logprobs,
            nan_flags=tuple(nan_flags),
            seeds=seeds,
        )
        self.mirror.observe(out)
        return CompletedOutput(out)

    def _step_request(self, state: _SimpleRequest, n: int, drafts: list[int]):
        start = state.num_computed
        known = len(state.tokens)
        logits = self.model.logits(state.tokens + drafts)
        params = state.params
        plps: list[TokenLogprobs] = []
        if params.prompt_logprobs is not None and not state.resumed:
            for i in range(start, min(start + n, state.prompt_len - 1)):
                plps.append(token_logprobs_fp32(logits[i], state.tokens[i + 1], params.prompt_logprobs))
        if start + n != known + len(drafts):  # a partial prefill chunk samples nothing
            state.num_computed = start + n
            return [], [], False, plps
        produced: list[int] = []
        lps: list[TokenLogprobs] = []
        prompt = state.tokens[: state.prompt_len]
        rows = logits[known - 1 : known + len(drafts)]
        # The flag covers every row the step computed for the request, sampled or not.
        flagged = bool((torch.isnan(rows) | torch.isposinf(rows)).any())
        for j in range(len(drafts) + 1):
            row = rows[j]
            outputs = state.tokens[state.prompt_len :] + drafts[:j]
            tok = sample_row(row, params, state.seed, known + j, prompt, outputs)
            produced.append(tok)
            if params.logprobs is not None and params.logprobs_mode == "processed":
                # the oracle's construction over this runner's fp32 logits: its sampler is the spec's fp32 twin
                from runnercheck.reference.sampler import request_token_logprobs

                lps.append(request_token_logprobs(row, tok, params, prompt, outputs))
            elif params.logprobs is not None:
                lps.append(token_logprobs_fp32(row, tok, params.logprobs))
            if j == len(drafts) or tok != drafts[j]:
                break
        state.tokens.extend(produced)
        state.num_computed = min(start + n, len(state.tokens) - 1)
        return produced, lps, flagged, plps


def simple_runner(weights: ModelWeights, limits: RunnerLimits, device: object, base_seed: int) -> SimpleRunner:
    """Factory for `SimpleRunner`.  It computes on the host, so ``device`` is accepted and unused."""
    return SimpleRunner(weights, limits, base_seed)


def reference_runner(weights: ModelWeights, limits: RunnerLimits, device: object, base_seed: int) -> object:
    """Factory for the float64 oracle as a runner (host-side; ``device`` is accepted and unused)."""
    from runnercheck.reference.runner import AsyncReferenceRunner, ReferenceRunner

    return AsyncReferenceRunner(ReferenceRunner(weights, limits, base_seed=base_seed))
