"""Where a speculative decode step's time goes: host enqueue vs waiting, and cProfile of both.

    python -m runnercheck.bench.lab.spec_profile [--device cuda] [--reqs 8] [--draft qwen3-0.6b-draft|self|ngram|off] [--steps 16]
        [--kernels]

The `spec_draft` bench's set-up (`runnercheck.bench.case_spec`: Qwen3-0.6B shape on a GPU, micro on CPU, 256-token
prompts, k = 3 device drafts per decode, temperature 1), prefills untimed, then ``--steps`` decode
steps each split into ``execute_model`` (the host enqueueing the step) and ``get()`` (waiting for
its output).  A step whose time is mostly ``get()`` is device-bound; mostly ``execute_model``,
host-bound.  Prints the medians, then the functions with the most own and cumulative time inside
``execute_model``.  With ``--kernels``, torch.profiler over the same steps instead of cProfile: the device
kernels (those a graph replay runs too) with the most device time, per step.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import time


from runnercheck.bench.case_spec import NUM_SPEC_TOKENS, _limits, _model
from runnercheck.bench.common import BenchContext
from runnercheck.impl.device import Device
from runnercheck.impl.interface import DraftModelConfig, NgramConfig, SamplingParams
from runnercheck.impl.model.weights import random_weights


def profile_spec(device: Device, num_reqs: int, draft: str, steps: int, top: int, kernels: bool = False) -> str:
    from runnercheck.impl.runner import ModelRunner
    from runnercheck.stress.sim.scheduler import SchedulerSim

    ctx = BenchContext(device, quick=not device.is_cuda)
    name, config, dtype = _model(ctx)
    weights = random_weights(config, seed=0)
    prompt_len, new_tokens = (256, 128) if device.is_cuda else (8, 6 + steps * (NUM_SPEC_TOKENS + 1))
    limits = _limits(ctx, config, num_reqs, prompt_len, new_tokens)
    preset = {"self": name, "ngram": "", "off": ""}.get(draft, draft)
    k = 0 if draft == "off" else NUM_SPEC_TOKENS
    speculative = None if not k else DraftModelConfig(preset, k, weights_seed=0) if preset else NgramConfig(num_spec_tokens=k)
    runner = ModelRunner(weights, limits, device, base_seed=0, dtype=dtype, speculative=speculative)
    sim = SchedulerSim(limits, seed=0, max_inflight_steps=1, prefix_caching=False, ngram_spec_tokens=k,
                       most_device_drafts=True, draft_model=preset)
    rng = random.Random(0)
    for i in range(num_reqs):
        sim.add_request(f"r{i}", [rng.randrange(config.vocab_size) for _ in range(prompt_len)],
                        SamplingParams(temperature=1.0, max_tokens=new_tokens))
    produced = 0
    while sim.unfinished_ids and produced < num_reqs:  # the prefills, untimed
        out = runner.execute_model(sim.schedule()).get()
        sim.update(out)
        produced += sum(len(t) for t in out.sampled_token_ids)
    device.synchronize()
    enqueue_us, wait_us, tokens = [], [], 0
    profiler = cProfile.Profile()
    if kernels:
        from torch.profiler import ProfilerActivity, profile
        profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] if device.is_cuda
                           else [ProfilerActivity.CPU])
        profiler.__enter__()
    for _ in range(steps):
        if not sim.unfinished_ids:
            break
        sched = sim.schedule()
        start = time.perf_counter()
        if kernels:
            handle = runner.execute_model(sched)
        else:
            with profiler:
                handle = runner.execute_model(sched)
        enqueued = time.perf_counter()
        out = handle.get()
        done = time.perf_counter()
        sim.update(out)
        tokens += sum(len(t) for t in out.sampled_token_ids)
        enqueue_us.append((enqueued - start) * 1e6)
        wait_us.append((done - enqueued) * 1e6)
    lines = [f"{device.kind}, {name}, {num_reqs} reqs, speculation {draft} (k={k}), {len(enqueue_us)} decode steps, "
             f"{tokens} tokens: median execute_model {statistics.median(enqueue_us):.0f} us, "
             f"median get() {statistics.median(wait_us):.0f} us per step"]
    if kernels:
        profiler.__exit__(None, None, None)
        sort = "self_device_time_total" if device.is_cuda else "self_cpu_time_total"
        lines.append(f"--- operators and kernels by {sort}, totals over {len(enqueue_us)} steps")
        lines.append(profiler.key_averages().table(sort_by=sort, row_limit=top, max_name_column_width=90))
        return "\n".join(lines)
    for order in ("tottime", "cumtime"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(top)
        lines.append(f"--- by {order}\n{text.getvalue()}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu", "sim"])
    parser.add_argument("--reqs", type=int, default=8)
    parser.add_argument("--draft", default="qwen3-0.6b-draft", help="a draft preset, 'self', 'ngram' or 'off'")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--kernels", action="store_true", help="device time per kernel (torch.profiler), not cProfile")
    args = parser.parse_args(argv)
    device = Device(args.device)
    if not device.is_cuda and args.draft == "qwen3-0.6b-draft":
        args.draft = "micro-draft"
    print(profile_spec(device, args.reqs, args.draft, args.steps, args.top, args.kernels))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
