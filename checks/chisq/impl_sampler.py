"""The runner's Triton sampler (`runnercheck.impl.sample`) behind the `runnercheck.checks.chisq.samplers.SamplerFn` contract.

Imported only when asked for (``--sampler impl``): `runnercheck.impl.sample` pulls in Triton kernels, which
must see ``TRITON_INTERPRET`` set on a machine without a GPU.  Interpreted, the kernel runs one
program per row (measured on the dev box: ~50 rows/s plain, ~7 rows/s with penalties and
filters), so CPU runs of this sampler need small ``--samples``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from runnercheck.checks.chisq.samplers import (
    SamplerUnavailableError, SamplerUnsupportedError, TokenHistory, _check_call,
)
from runnercheck.impl.interface import SamplingParams


@dataclass
class _Parts:
    """What one (device, vocabulary) needs: the `Device`, a staging pool, a `SamplingState` with one row
    per distinct (params, seed, history) of a call, and the `Sampler` (all on ``device``)."""

    device: Any
    vocab_size: int
    pool: Any
    state: Any
    sampler: Any
    rows_per_launch: int


class ImplSampler:
    """The runner's Triton sampler (`runnercheck.impl.sample.Sampler`) behind the `SamplerFn` contract.

    ``ImplSampler()`` builds its parts lazily, one set per (device kind, vocabulary), on its own
    `Device` (``runnercheck chisq --sampler impl``).  ``ImplSampler(device, vocab_size)`` builds one set
    now on the caller's `Device`; `sampler` is then the `runnercheck.impl.sample.Sampler` every call launches, so
    a mutant patches it exactly as it patches ``runner.sampler`` (`runnercheck mutants`' chi-square
    probe), and a call with another vocabulary is declined (`SamplerUnsupportedError`).

    Each distinct (params, seed, history) of a call is admitted into its own `SamplingState` row
    (staged through a `StagingWriter`, like the runner does); logit rows point at their state row and
    carry their own noise position.  Owns its parts (on their device, for the adapter's lifetime,
    written only by `__call__`; rows are re-admitted every call); the returned tokens are copies.
    """

    name = "impl"

    def __init__(self, device: Any = None, vocab_size: int | None = None, *, rows_per_launch: int | None = None,
                 max_requests: int = 64):
        if (device is None) != (vocab_size is None):
            raise ValueError("ImplSampler: give both device and vocab_size (one fixed sampler) or neither (lazy)")
        self.rows_per_launch = rows_per_launch
        self.max_requests = max_requests
        self._parts: dict[tuple[str, int], _Parts] = {}
        self._step = 0
        self._fixed = self._build(device, vocab_size) if device is not None else None

    @property
    def sampler(self) -> Any:
        """The one `runnercheck.impl.sample.Sampler` of an adapter built with ``(device, vocab_size)``."""
        if self._fixed is None:
            raise AttributeError("ImplSampler() builds a sampler per (device, vocabulary) on first use; "
                                 "construct it with (device, vocab_size) to patch the one it launches")
        return self._fixed.sampler

    def _build(self, dev: Any, vocab: int) -> _Parts:
        try:
            from runnercheck.impl.buffers import StagingPool
            from runnercheck.impl.sample import Sampler, SamplingState
        except ImportError as e:
            raise SamplerUnavailableError(f"impl.sample cannot be imported: {e}") from e
        # Interpreted Triton runs programs one after another: fewer rows per launch costs nothing.
        rows = self.rows_per_launch or (8192 if dev.is_cuda else 256)
        return _Parts(dev, vocab, StagingPool(dev, num_slots=4, capacity_bytes=1 << 20),
                      SamplingState(dev, self.max_requests, vocab), Sampler(dev, vocab, 0, max_num_rows=rows), rows)

    def _get(self, torch_device: torch.device, vocab: int) -> _Parts:
        if self._fixed is not None:
            if vocab != self._fixed.vocab_size:
                raise SamplerUnsupportedError(f"this adapter was built for vocabulary {self._fixed.vocab_size}, not {vocab}")
            return self._fixed
        key = (torch_device.type, vocab)
        if key not in self._parts:
            try:
                from runnercheck.impl.device import Device
            except ImportError as e:
                raise SamplerUnavailableError(f"impl.device cannot be imported: {e}") from e
            self._parts[key] = self._build(Device("cuda" if torch_device.type == "cuda" else "cpu", seed=0), vocab)
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
        from runnercheck.impl.buffers import StagingWriter

        logits, seeds, positions = _check_call(logits, params, seeds, positions)
        parts = self._get(logits.device, logits.shape[1])
        dev, state, sampler, rows_per_launch = parts.device, parts.state, parts.sampler, parts.rows_per_launch
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
        writer = StagingWriter(parts.pool, self._step)
        self._step += 1
        state.flush(writer)
        writer.submit()
        state.enqueue_apply()
        # to_device makes the sampler's stream wait for the caller's, where the logits were written.
        rows_map = dev.to_device(torch.tensor(state_rows, dtype=torch.int32))
        logits_dev = dev.to_device(logits.contiguous())
        positions_dev = dev.to_device(positions)
        # Allocated through the device, which orders its stream after the caller's: a plain torch.empty is
        # the caller's stream's memory, written here on the sampler's stream (CSAN reported 64 such races).
        out = dev.zeros(logits.shape[0], torch.int64)
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
        module = importlib.import_module("runnercheck.impl.sample")
    except ImportError:
        return False
    return hasattr(module, "Sampler") and hasattr(module, "SamplingState")


# `load_sampler("runnercheck.checks.chisq.impl_sampler:impl_sampler")`: one shared adapter (its parts are built lazily).
impl_sampler = ImplSampler()
