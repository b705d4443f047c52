"""`OutputSlots.pack_results` with its per-shape cache of pack views: each layout shape gets its own views,
and a step of another shape in between never lets a later step pack through the wrong offsets."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from runnercheck.impl.device import Device
from runnercheck.impl.output import OutputLayout, OutputSlots, StepOutputMeta, decode_output


def _results(num_rows: int, num_top: int, base: int) -> dict:
    top = max(num_top, 0)
    out = SimpleNamespace(
        tokens=torch.arange(base, base + num_rows, dtype=torch.int64),
        nan_flags=torch.zeros(num_rows, dtype=torch.int32),
        logprob=-torch.arange(num_rows, dtype=torch.float32) - base,
        rank=torch.arange(num_rows, dtype=torch.int32) + base,
        top_ids=(torch.arange(num_rows * top, dtype=torch.int32) + base).reshape(num_rows, top),
        top_logprobs=torch.full((num_rows, top), -float(base)),
    )
    return {"out": out}


def _pack_and_decode(slots: OutputSlots, num_reqs: int, num_top: int, base: int):
    layout = OutputLayout.build(num_reqs, num_reqs, num_top, 0, -1)
    slots.num_sampled[:num_reqs] = 1
    slots.pack_results(layout, _results(num_reqs, num_top, base))
    host = torch.zeros(layout.nbytes, dtype=torch.uint8)
    host.copy_(slots.pack[: layout.nbytes])
    meta = StepOutputMeta(1, tuple(f"r{i}" for i in range(num_reqs)), np.arange(num_reqs + 1, dtype=np.int64),
                          (num_top if num_top >= 0 else None,) * num_reqs, (), np.zeros(0, np.int64), {})
    return decode_output(host, layout, meta)


def test_pack_views_follow_the_layout_shape():
    slots = OutputSlots(Device("cpu"), num_slots=2, max_num_reqs=8, max_logit_rows=8, max_prompt_rows=4, max_logprobs=3)
    first = _pack_and_decode(slots, 3, 2, base=10)
    assert first.sampled_token_ids == ((10,), (11,), (12,))
    assert first.logprobs[2][0].top_token_ids == (14, 15)  # rows of 2 top ids: row 2 holds 10 + 4, 10 + 5
    other = _pack_and_decode(slots, 5, -1, base=20)  # another shape: no logprobs, more rows
    assert other.sampled_token_ids == tuple((20 + i,) for i in range(5)) and other.logprobs == (None,) * 5
    again = _pack_and_decode(slots, 3, 2, base=30)
    assert again.sampled_token_ids == ((30,), (31,), (32,)) and again.logprobs[1][0].top_token_ids == (32, 33)
    assert again.logprobs[1][0].rank == 31 and again.logprobs[1][0].logprob == -31.0


def test_equal_shapes_share_views_and_other_shapes_do_not():
    slots = OutputSlots(Device("cpu"), num_slots=1, max_num_reqs=8, max_logit_rows=8, max_prompt_rows=4, max_logprobs=3)
    a = slots.pack_views(OutputLayout.build(3, 3, 2, 0, -1))
    assert slots.pack_views(OutputLayout.build(3, 3, 2, 0, -1)) is a  # made once, not per step
    b = slots.pack_views(OutputLayout.build(3, 3, 1, 0, -1))
    assert b is not a and b["top_ids"].shape == (3, 1) and a["top_ids"].shape == (3, 2)
    assert a["num_sampled_src"].shape == (3,) and slots.pack_views(OutputLayout.build(5, 5, -1, 0, -1))["num_sampled_src"].shape == (5,)
