"""Benchmarks of the sampler and of top-k logprobs against PyTorch paths and the memory floor."""
from __future__ import annotations

import torch

from bench.common import BenchContext, Row
from bench.timing import copy_bandwidth_bytes_per_s, device_time_us, peak_extra_memory_bytes
from bench.torch_baselines import torch_sample_temperature, torch_sample_top_k_top_p, torch_topk_logprobs
from impl.buffers import StagingPool, StagingWriter
from impl.interface import SamplingParams

SAMPLER_CONFIGS: dict[str, SamplingParams] = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=0.8),
    "temp+top_k50+top_p0.9": SamplingParams(temperature=0.8, top_k=50, top_p=0.9),
    "temp+top_k50+top_p0.9+min_p0.05": SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05),
    "all+penalties": SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                                    frequency_penalty=0.2, presence_penalty=0.1),
}
TARGET_US = {"temperature": "<= 2x memory floor", "temp+top_k50+top_p0.9": "<= 250 us"}


def _shapes(ctx: BenchContext) -> tuple[int, int]:
    return (2, 300) if ctx.quick else (256, 151936)


def _random_logits(ctx: BenchContext, rows: int, vocab: int) -> torch.Tensor:
    gen = torch.Generator(device=ctx.device.torch_device).manual_seed(0)
    return torch.randn(rows, vocab, generator=gen, device=ctx.device.torch_device, dtype=torch.float32) * 3.0


def _prepared_state(ctx: BenchContext, rows: int, vocab: int, params: SamplingParams):
    from impl.sample.state import SamplingState

    dev = ctx.device
    state = SamplingState(dev, rows, vocab)
    gen = torch.Generator().manual_seed(1)
    for r in range(rows):
        prompt = torch.randint(0, vocab, (64,), generator=gen).tolist()
        outputs = torch.randint(0, vocab, (32,), generator=gen).tolist()
        state.add_request(r, params, seed=1000 + r, prompt_token_ids=prompt, output_token_ids=outputs)
    pool = StagingPool(dev, num_slots=2, capacity_bytes=max(1 << 20, rows * (vocab // 32 + 256) * 8))
    writer = StagingWriter(pool, 0)
    state.flush(writer)
    writer.submit()
    state.enqueue_apply()
    dev.synchronize()
    return state


def bench_sampler(ctx: BenchContext) -> list[Row]:
    from impl.sample.sampler import Sampler

    rows, vocab = _shapes(ctx)
    dev = ctx.device
    cuda = dev.is_cuda
    logits = _random_logits(ctx, rows, vocab)
    nbytes = logits.numel() * logits.element_size()
    bw = copy_bandwidth_bytes_per_s(cuda)
    floor_us = nbytes / bw * 1e6
    out: list[Row] = [Row("sampler", f"memory floor [{rows}, {vocab}] fp32", floor_us, "us", note=f"copy bandwidth {bw / 1e12:.2f} TB/s")]
    sampler = Sampler(dev, vocab, max_num_rows=rows)
    rows_map = dev.to_device(torch.arange(rows, dtype=torch.int32))
    positions = dev.to_device(torch.arange(rows, dtype=torch.int64) + 100)
    for name, params in SAMPLER_CONFIGS.items():
        state = _prepared_state(ctx, rows, vocab, params)
        us = device_time_us(lambda: sampler.sample(logits, state, rows_map, positions, num_rows=rows), cuda=cuda)
        target, met = None, None
        if name == "temperature":
            target, met = "<= 2x floor", us <= 2 * floor_us
        elif name == "temp+top_k50+top_p0.9":
            target, met = "<= 250 us", us <= 250
        out.append(Row("sampler", f"runnercheck {name}", us, "us", target=target, met=met if cuda else None,
                       note=f"{us / floor_us:.2f}x floor"))
    temp = torch.full((rows,), 0.8, device=dev.torch_device)
    gen = torch.Generator(device=dev.torch_device).manual_seed(0)
    us = device_time_us(lambda: torch_sample_temperature(logits, temp, gen), cuda=cuda)
    out.append(Row("sampler", "pytorch softmax+multinomial (temperature)", us, "us", note=f"{us / floor_us:.2f}x floor"))
    us = device_time_us(lambda: torch_sample_top_k_top_p(logits, temp, 50, 0.9, gen=gen), cuda=cuda)
    out.append(Row("sampler", "pytorch sort top-k50/top-p0.9 + multinomial", us, "us", note=f"{us / floor_us:.2f}x floor"))
    return out


def bench_logprobs(ctx: BenchContext) -> list[Row]:
    from impl.sample.logprobs import LogprobsComputer

    rows, vocab = _shapes(ctx)
    dev = ctx.device
    cuda = dev.is_cuda
    k = 20
    logits = _random_logits(ctx, rows, vocab)
    nbytes = logits.numel() * logits.element_size()
    floor_us = nbytes / copy_bandwidth_bytes_per_s(cuda) * 1e6
    targets = dev.to_device(torch.randint(0, vocab, (rows,), dtype=torch.int64))
    computer = LogprobsComputer(dev, vocab, k, rows)
    us = device_time_us(lambda: computer.launch(logits, targets, rows, k), cuda=cuda)
    extra = peak_extra_memory_bytes(lambda: computer.launch(logits, targets, rows, k), cuda)
    limit = 0.05 * nbytes
    out = [
        Row("logprobs", f"runnercheck top-{k} logprobs", us, "us", target="<= 2x floor", met=(us <= 2 * floor_us) if cuda else None,
            note=f"{us / floor_us:.2f}x floor ({floor_us:.1f} us)"),
    ]
    if extra is not None:
        out.append(Row("logprobs", f"runnercheck top-{k} peak extra memory", extra / 2**20, "MiB", target="< 5% of logits",
                       met=extra < limit, note=f"logits tensor {nbytes / 2**20:.1f} MiB"))
    us = device_time_us(lambda: torch_topk_logprobs(logits, k), cuda=cuda)
    out.append(Row("logprobs", f"pytorch log_softmax+topk({k})", us, "us", note=f"{us / floor_us:.2f}x floor"))
    extra = peak_extra_memory_bytes(lambda: torch_topk_logprobs(logits, k), cuda)
    if extra is not None:
        out.append(Row("logprobs", f"pytorch log_softmax+topk({k}) peak extra memory", extra / 2**20, "MiB"))
    return out
