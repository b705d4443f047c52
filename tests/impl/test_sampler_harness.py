"""Helpers shared by the sampler tests (no tests here): build a SamplingState, run the sampler."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from runnercheck.impl.buffers import StagingPool, StagingWriter
from runnercheck.impl.device import Device
from runnercheck.impl.interface import SamplingParams
from runnercheck.impl.sample import Sampler, SamplingState


@dataclass
class RowRequest:
    """One state row's request: what the reference needs to sample it too."""

    params: SamplingParams
    seed: int
    prompt: tuple[int, ...]
    outputs: tuple[int, ...] = ()


@dataclass
class LogitRow:
    """One logit row: its state row, noise position and draft prefix (tokens counted as outputs)."""

    state_row: int
    position: int
    drafts: tuple[int, ...] = ()


def admit(device: Device, state: SamplingState, requests: dict[int, RowRequest], step: int = 0,
          pool: StagingPool | None = None) -> StagingPool:
    pool = pool or StagingPool(device, num_slots=4, capacity_bytes=1 << 16)
    for row, req in requests.items():
        state.add_request(row, req.params, req.seed, req.prompt, req.outputs)
    writer = StagingWriter(pool, step)
    state.flush(writer)
    writer.submit()
    state.enqueue_apply()
    return pool


def logit_row_tensors(device: Device, rows: Sequence[LogitRow]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    state_rows = device.to_device(torch.tensor([r.state_row for r in rows], dtype=torch.int32))
    positions = device.to_device(torch.tensor([r.position for r in rows], dtype=torch.int64))
    width = max((len(r.drafts) for r in rows), default=0)
    if width == 0:
        return state_rows, positions, None
    prefix = torch.full((len(rows), width), -1, dtype=torch.int32)
    for i, r in enumerate(rows):
        prefix[i, : len(r.drafts)] = torch.tensor(r.drafts, dtype=torch.int32)
    return state_rows, positions, device.to_device(prefix)


def run_sampler(device: Device, sampler: Sampler, state: SamplingState, logits: torch.Tensor,
                rows: Sequence[LogitRow], num_logprobs: int = -1):
    state_rows, positions, prefix = logit_row_tensors(device, rows)
    logits_dev = device.to_device(logits.to(torch.float32))
    box = {}

    def work() -> None:
        box["out"] = sampler.sample(logits_dev, state, state_rows, positions, num_rows=len(rows),
                                    draft_prefix=prefix, max_num_logprobs=num_logprobs)

    device.enqueue(work, "sample")
    device.synchronize()
    return box["out"]


def reference_results(logits: torch.Tensor, requests: dict[int, RowRequest], rows: Sequence[LogitRow]) -> list:
    """`runnercheck.reference.sampler.sample` for every logit row (drafts count as outputs, per docs/SAMPLING.md)."""
    import runnercheck.reference.sampler as ref

    out = []
    for i, lr in enumerate(rows):
        req = requests[lr.state_row]
        out.append(ref.sample(logits[i].to(torch.float32), req.params, req.seed, lr.position, req.prompt,
                              tuple(req.outputs) + tuple(lr.drafts)))
    return out


@dataclass
class Agreement:
    """Runner-vs-oracle token agreement over many rows: exact matches, documented ties, real mismatches."""

    rows: int = 0
    ties: int = 0
    mismatches: list = field(default_factory=list)

    def add(self, runner_token: int, result, context: object = None) -> None:
        import runnercheck.reference.sampler as ref

        self.rows += 1
        if runner_token == result.token:
            return
        if result.gap < ref.TIE_TOLERANCE or result.fragile:
            self.ties += 1
        else:
            self.mismatches.append((runner_token, result, context))
