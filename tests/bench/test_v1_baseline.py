"""The V1-style baseline must build correct inputs, or the host-cost comparison means nothing."""
from __future__ import annotations

import torch

from runnercheck.bench.v1_baseline import V1HostBatch


def test_v1_baseline_inputs_match_a_plain_loop():
    b = V1HostBatch(max_num_reqs=4, max_model_len=32, max_blocks_per_req=8, block_size=4, max_num_tokens=64, device=torch.device("cpu"))
    b.add("a", list(range(10, 17)), [5, 2])
    b.add("b", list(range(20, 23)), [7])
    b.add("c", [1, 2], [0])
    b.remove("a")  # "c" moves into a's row
    b.append_blocks("b", [3])
    sched = {"b": 3, "c": 2}
    got = b.prepare_inputs(sched)
    assert got["input_ids"].tolist() == [20, 21, 22, 1, 2]
    assert got["positions"].tolist() == [0, 1, 2, 0, 1]
    assert got["slot_mapping"].tolist() == [28, 29, 30, 0, 1]
    assert got["query_start_loc"].tolist() == [0, 3, 5]
    assert got["seq_lens"].tolist() == [3, 2]
    assert got["logits_indices"].tolist() == [2, 4]
    b.append_token("b", 99)
    got = b.prepare_inputs({"b": 1})
    assert got["input_ids"].tolist() == [99] and got["positions"].tolist() == [3] and got["slot_mapping"].tolist() == [31]
    assert b.h2d_bytes_last_step >= b.block_table.nbytes
