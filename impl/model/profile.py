"""The ``profile`` phase: one dummy forward of the decoder over the largest batch, to measure memory.

It uses its own scratch inputs, so it may run before or after CUDA-graph capture; its padding slots
(-1) keep the KV cache untouched, and nothing it does is needed for correctness.

Ownership: the scratch inputs are this call's own device tensors, dropped when it returns (written only by
its dummy closure); it writes no other tensor.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from runnercheck.impl.device import Device
from runnercheck.impl.model.forward import PagedDecoder


def profile_forward(model: PagedDecoder, device: Device, *, num_tokens: int, max_blocks_per_req: int,
                    max_logit_rows: int) -> dict[str, Any]:
    """A dummy forward of ``num_tokens`` tokens as one request (at most ``max_logit_rows`` logit rows): its tokens,
    seconds and the KV cache's bytes, plus on CUDA the peak of the activations' memory above what was allocated."""
    dev = device
    input_ids = dev.zeros(num_tokens, torch.int64)
    positions = dev.zeros(num_tokens, torch.int64)
    slot_mapping = dev.full(num_tokens, -1, torch.int64)
    query_start_loc = dev.zeros(2, torch.int32)
    seq_lens = dev.zeros(1, torch.int32)
    block_table = dev.zeros((1, max_blocks_per_req), torch.int32)
    logits_indices = dev.zeros(min(num_tokens, max_logit_rows), torch.int64)
    if dev.is_cuda:
        dev.synchronize()
        torch.cuda.reset_peak_memory_stats(dev.torch_device)
        before = torch.cuda.memory_allocated(dev.torch_device)

    def dummy() -> None:
        positions.copy_(torch.arange(num_tokens, device=positions.device))
        query_start_loc[1] = num_tokens
        seq_lens[0] = num_tokens
        model.forward(input_ids, positions, slot_mapping, query_start_loc, seq_lens, block_table, logits_indices,
                      num_reqs=1, num_tokens=num_tokens, max_query_len=num_tokens, max_seq_len=num_tokens)

    started = time.perf_counter()
    dev.enqueue(dummy, "profile forward")
    dev.synchronize()
    report: dict[str, Any] = {"num_tokens": num_tokens, "seconds": time.perf_counter() - started,
                              "kv_cache_bytes": 2 * model.kv_cache.k.numel() * model.kv_cache.k.element_size()}
    if dev.is_cuda:
        report["peak_activation_bytes"] = torch.cuda.max_memory_allocated(dev.torch_device) - before
    return report
