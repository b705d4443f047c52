"""The runner's Triton sampler (`impl.sample`) behind the `checks.samplers.SamplerFn` contract.

Imported only when asked for (``--sampler impl``): `impl.sample` pulls in Triton kernels, which
must see ``TRITON_INTERPRET`` set on a machine without a GPU.  Interpreted, the kernel runs one
program per row (measured on the dev box: ~50 rows/s plain, ~7 rows/s with penalties and
filters), so CPU runs of this sampler need small ``--samples``.
"""
from __future__ import annotations

import importlib
from typing import Sequence

import torch

from checks.samplers import (
    SamplerUnavailableError, SamplerUnsupportedError, TokenHistory, _check_call,
)
from impl.interface import SamplingParams


class ImplSampler:
    """The runner's Triton sampler (`impl.sample.Sampler`) behind the `SamplerFn` contract.

    Each distinct (params, seed, history) of a call is admitted into its own `SamplingState` row
    (staged through a `StagingWriter`, like the runner does); logit rows point at their state row
    and carry their own noise position.  Owns, per (device, vocabulary), one `Device`, staging pool,
    state and sampler, created on first use and reused by later calls (rows are re-admitted every
    call); the returned tokens are copies.
    """

    name = "impl"

    def __init__(self, rows_per_launch: int | None = None, max_requests: int = 64):
        self.rows_per_launch = rows_per_launch
        self.max_requests = max_requests
        self._parts: dict[tuple[str, int], tuple] = {}
        self._step = 0

    def _get(self, torch_device: torch.device, vocab: int):
        key = (torch_device.type, vocab)
        if key not in self._parts:
            try:
                from impl.buffers import StagingPool
                from impl.device import Device
                from impl.sample import Sampler, SamplingState
            except ImportError as e:
                raise SamplerUnavailableError(f"impl.sample cannot be imported: {e}") from e
            dev = Device("cuda" if torch_device.type == "cuda" else "cpu", seed=0)
            # Interpreted Triton runs programs one after another: fewer rows per launch costs nothing.
            rows = self.rows_per_launch or (8192 if dev.is_cuda else 256)
            self._parts[key] = (dev, StagingPool(dev, num_slots=4, capacity_bytes=1 << 20),
                                SamplingState(dev, self.max_requests, vocab), Sampler(dev, vocab, 0, max_num_rows=rows), rows)
        return self._parts[key]

    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        seeds: torch.Tensor,
        positions: torch.Tensor,
        *,
        history: Sequence[TokenHistory] | None = None,
        request_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        from impl.buffers import StagingWriter

        logits, seeds, positions = _check_call(logits, params, seeds, positions)
        dev, pool, state, sampler, rows_per_launch = self._get(logits.device, logits.shape[1])
        seed_list = seeds.cpu().tolist()
        keys: dict[tuple, int] = {}
        state_rows = []
        for i, p in enumerate(params):
            h = history[i] if history is not None else TokenHistory()
            state_rows.append(keys.setdefault((p, seed_list[i], h), len(keys)))
        if len(keys) > self.max_requests:
            raise SamplerUnsupportedError(f"{len(keys)} distinct requests in one call > {self.max_requests}")
        for (p, seed, h), row in keys.items():
            state.add_request(row, p, seed, h.prompt_ids, h.output_ids)
        writer = StagingWriter(pool, self._step)
        self._step += 1
        state.flush(writer)
        writer.submit()
        state.enqueue_apply()
        rows_map = dev.to_device(torch.tensor(state_rows, dtype=torch.int32))
        logits_dev = dev.to_device(logits.contiguous())
        positions_dev = dev.to_device(positions)
        out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits_dev.device)
        for start in range(0, logits.shape[0], rows_per_launch):
            stop = min(start + rows_per_launch, logits.shape[0])

            def work(start: int = start, stop: int = stop) -> None:
                result = sampler.sample(logits_dev[start:stop], state, rows_map[start:stop], positions_dev[start:stop],
                                        num_rows=stop - start)
                out[start:stop].copy_(result.tokens)

            dev.enqueue(work, "chisq sample")
        dev.synchronize()
        return out.to(logits.device)


def impl_sampler_available() -> bool:
    try:
        module = importlib.import_module("impl.sample")
    except ImportError:
        return False
    return hasattr(module, "Sampler") and hasattr(module, "SamplingState")


# `load_sampler("checks.impl_sampler:impl_sampler")`: one shared adapter (its parts are built lazily).
impl_sampler = ImplSampler()
