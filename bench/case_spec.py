"""Speculative decoding with the runner's proposers: tokens/s and acceptance vs no speculation.

``spec_ngram`` (`bench_ngram`): the n-gram proposer on greedy requests with repetitive prompts.
``spec_draft`` (`bench_draft`): the draft-model proposer (`runnercheck.impl.draft_proposer`, rejection-sampled)
on temperature-1 requests, two draft arms: the model's smaller ``-draft`` preset (random weights of
its own: drafts mostly rejected, so the row measures the proposer's cost) and the target drafting
for itself (its own weights: drafts accepted, the row measures the best case's speedup with a draft
as costly as the target).  Every arm asks for k = 3 drafts on every decode, so its decodes are uniform
and replay the bucket's CUDA graph (a draft-model bucket holds the draft decodes and the rejection
sampling: `runnercheck.impl.draft_proposer`); the rows' notes count the replays.  The rest of this
docstring describes both cases.

Both arms run the same runner class on the same weights and the same greedy requests whose prompts
repeat a short pattern (what prompt lookup is for), driven by `runnercheck.stress.sim.scheduler.SchedulerSim`: the
``ngram`` arm asks for up to ``K`` device drafts per decode (`SchedulerOutput.num_device_drafts`),
the ``off`` arm for none.  Each step's output is read before the next step is scheduled (the
scheduler must learn the accepted count before it schedules that request again), in both arms.
Tokens/s counts the output tokens the scheduler took (accepted drafts plus one per sampling step);
the acceptance rate is accepted drafts / drafts asked for.  With random weights the model continues
a pattern only sometimes, so the rate measures this workload, not a trained model's.
"""
from __future__ import annotations

import gc
import random
import time
from dataclasses import replace

import torch

from runnercheck.bench.common import BenchContext, Row
from runnercheck.impl.interface import DraftModelConfig, NgramConfig, RunnerLimits, SamplingParams
from runnercheck.impl.model.weights import preset, random_weights

NUM_SPEC_TOKENS = 3
WARMUP_DECODE_STEPS = 4  # untimed decode steps after the prefills, in every arm


def _prompts(num_reqs: int, prompt_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(num_reqs):
        pattern = [rng.randrange(vocab_size) for _ in range(rng.randint(2, 6))]
        out.append([pattern[i % len(pattern)] for i in range(prompt_len)])
    return out


def _run_arm(ctx: BenchContext, weights, limits: RunnerLimits, dtype, prompts: list[list[int]], new_tokens: int,
             num_spec_tokens: int, draft_model: str = "", temperature: float = 0.0) -> tuple[float, int, dict, int, dict]:
    """(seconds in the decode phase, output tokens taken, spec stats, steps, the runner's graph stats) for one arm.

    ``draft_model``: the draft-model proposer of that preset (weights from the bench seed) instead of the n-gram one."""
    from runnercheck.impl.runner import ModelRunner
    from runnercheck.stress.sim.scheduler import SchedulerSim

    speculative = None
    if num_spec_tokens:
        speculative = (DraftModelConfig(draft_model, num_spec_tokens, weights_seed=ctx.seed) if draft_model
                       else NgramConfig(num_spec_tokens=num_spec_tokens))
    runner = ModelRunner(weights, limits, ctx.device, base_seed=ctx.seed, dtype=dtype, speculative=speculative)
    # Always k = K (= max_num_draft_tokens): uniform decodes replay the captured 1 + K graph (n-gram).
    sim = SchedulerSim(limits, seed=ctx.seed, max_inflight_steps=1, prefix_caching=False, ngram_spec_tokens=num_spec_tokens,
                       most_device_drafts=True, draft_model=draft_model if num_spec_tokens else "")
    params = SamplingParams(temperature=temperature, max_tokens=new_tokens)
    for i, prompt in enumerate(prompts):
        sim.add_request(f"r{i}", prompt, params)

    def step() -> int:
        out = runner.execute_model(sim.schedule()).get()
        sim.update(out)
        return sum(len(t) for t in out.sampled_token_ids)

    produced = 0
    while sim.unfinished_ids and produced < len(prompts):  # prefills (and the first token) untimed
        produced += step()
    # Eager steps (those no bucket serves) JIT-compile the Triton specializations of their decode
    # shapes on first use (H200 run 18: 7 compiles in the first 16 decode steps, seconds in all);
    # the sequence bounds cycle through their divisibility classes within 4 steps of k = 3.  Bucketed
    # decodes (a draft model's too: its k draft decodes, verification and rejection sampling are in
    # the bucket's graph) replay what capture compiled.
    for _ in range(1 if ctx.quick else WARMUP_DECODE_STEPS):  # a quick run's requests are a few steps long
        if sim.unfinished_ids:
            step()
    if ctx.device.is_cuda:
        torch.cuda.synchronize()
    produced, steps, started = 0, 0, time.perf_counter()
    replays_before = runner.cuda_graph_stats()["replays"]
    while sim.unfinished_ids:
        produced += step()
        steps += 1
    seconds = time.perf_counter() - started
    graph_stats = {"replays": runner.cuda_graph_stats()["replays"] - replays_before}
    spec_stats = sim.spec_stats.to_dict()
    # A runner's graphs and closures form reference cycles: without a collection every arm's runner
    # (weights, KV cache, graph pools) would stay resident until the process ends, and the arms of one
    # bench would hold tens of GiB between them (H200 run 16: three bench processes side by side ran
    # out of the 140 GiB).
    del runner, sim
    gc.collect()
    if ctx.device.is_cuda:
        torch.cuda.empty_cache()
    return seconds, produced, spec_stats, steps, graph_stats


def _limits(ctx: BenchContext, config, num_reqs: int, prompt_len: int, new_tokens: int) -> RunnerLimits:
    block_size = 16
    per_request = prompt_len + new_tokens + NUM_SPEC_TOKENS + 1
    return RunnerLimits(vocab_size=config.vocab_size, max_num_reqs=num_reqs, max_model_len=config.max_model_len,
                        max_num_batched_tokens=max(64, num_reqs * (1 + NUM_SPEC_TOKENS)) if ctx.quick else 8192,
                        num_kv_blocks=num_reqs * -(-per_request // block_size) + 16, block_size=block_size,
                        max_num_draft_tokens=NUM_SPEC_TOKENS)


def _model(ctx: BenchContext) -> tuple[str, object, torch.dtype]:
    if ctx.quick:
        return "micro", replace(preset("micro"), max_model_len=128), torch.float32
    return "qwen3-0.6b", preset("qwen3-0.6b"), torch.bfloat16


def bench_ngram(ctx: BenchContext) -> list[Row]:
    _, config, dtype = _model(ctx)
    cases = [(2, 16, 10)] if ctx.quick else [(8, 256, 128), (64, 256, 128)]
    weights = random_weights(config, seed=ctx.seed)
    rows: list[Row] = []
    for num_reqs, prompt_len, new_tokens in cases:
        limits = _limits(ctx, config, num_reqs, prompt_len, new_tokens)
        prompts = _prompts(num_reqs, prompt_len, config.vocab_size, ctx.seed)
        tag = f"{num_reqs} reqs x {prompt_len} ctx, greedy, repetitive prompts"
        results = {}
        for arm, k in (("off", 0), ("ngram", NUM_SPEC_TOKENS)):
            seconds, produced, spec, steps, runner_stats = _run_arm(ctx, weights, limits, dtype, prompts, new_tokens, k)
            results[arm] = produced / seconds
            graphs = runner_stats.get("replays", 0)
            note = f"{produced} tokens in {steps} steps; graph replays {graphs}"
            rows.append(Row("spec_ngram", f"decode tokens/s, {tag}, {arm}", produced / seconds, "tok/s", note=note))
            if k:
                rows.append(Row("spec_ngram", f"acceptance rate, {tag}, k={k}", spec["acceptance_rate"], "fraction",
                                note=f"{spec['accepted_tokens']} of {spec['draft_tokens']} drafts; all accepted in "
                                     f"{spec['all_accepted_steps']} of {spec['draft_steps']} request-steps"))
                rows.append(Row("spec_ngram", f"tokens per request-step, {tag}, k={k}",
                                1 + spec["accepted_tokens"] / max(1, spec["draft_steps"]), "tokens"))
        rows.append(Row("spec_ngram", f"speedup ngram / off, {tag}", results["ngram"] / results["off"], "x"))
    return rows


def bench_draft(ctx: BenchContext) -> list[Row]:
    """The draft-model proposer: decode tokens/s of each draft arm against no speculation, and acceptance."""
    name, config, dtype = _model(ctx)
    cases = [(2, 8, 6)] if ctx.quick else [(8, 256, 128), (64, 256, 128)]
    weights = random_weights(config, seed=ctx.seed)  # a "self" draft of the same preset and seed has these weights
    rows: list[Row] = []
    for num_reqs, prompt_len, new_tokens in cases:
        limits = _limits(ctx, config, num_reqs, prompt_len, new_tokens)
        rng = random.Random(ctx.seed)
        prompts = [[rng.randrange(config.vocab_size) for _ in range(prompt_len)] for _ in range(num_reqs)]
        tag = f"{num_reqs} reqs x {prompt_len} ctx, temperature 1"
        arms = (("off", 0, ""), (f"draft {name}-draft", NUM_SPEC_TOKENS, f"{name}-draft"), (f"self-draft {name}", NUM_SPEC_TOKENS, name))
        results = {}
        for arm, k, draft in arms:
            seconds, produced, spec, steps, runner_stats = _run_arm(ctx, weights, limits, dtype, prompts, new_tokens, k,
                                                                   draft, 1.0)
            results[arm] = produced / seconds
            rows.append(Row("spec_draft", f"decode tokens/s, {tag}, {arm}", produced / seconds, "tok/s",
                            note=f"{produced} tokens in {steps} steps; graph replays {runner_stats.get('replays', 0)}"))
            if k:
                rows.append(Row("spec_draft", f"acceptance rate, {tag}, {arm}, k={k}", spec["acceptance_rate"], "fraction",
                                note=f"{spec['accepted_tokens']} of {spec['draft_tokens']} drafts; all accepted in "
                                     f"{spec['all_accepted_steps']} of {spec['draft_steps']} request-steps"))
                rows.append(Row("spec_draft", f"speedup {arm} / off, {tag}", results[arm] / results["off"], "x"))
    return rows


__all__ = ["bench_ngram", "bench_draft"]
