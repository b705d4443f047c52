"""Input prep and post-update kernels against a plain-Python statement of the same rules."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from runnercheck.impl.device import Device
from runnercheck.impl.interface import CachedRequest, CachedRequests, NewRequest, RunnerLimits, SamplingParams, SchedulerOutput
from runnercheck.impl.input_batch import plan_step
from runnercheck.impl.kernels.input_prep import launch_prepare_inputs
from runnercheck.impl.kernels.post_update import launch_post_update
from runnercheck.impl.state import NUM_ROW_FIELDS, RequestStateTable
from runnercheck.impl.step_reader import read_step

BS, MAX_LEN, ROWS, MAX_DRAFTS = 4, 16, 4, 2
MAX_BLOCKS = MAX_LEN // BS


def _world(dev: Device):
    """Row state for four requests in scattered rows (computed, known, prompt, prefill, last)."""
    state = dev.zeros((ROWS, NUM_ROW_FIELDS), torch.int32)
    state[2] = torch.tensor([4, 10, 10, 10, 0])  # prefill chunk in progress
    state[0] = torch.tensor([7, 8, 7, 7, 55])  # decode: last sampled token 55 at position 7
    state[3] = torch.tensor([5, 6, 5, 5, 77])  # decode with two drafts
    state[1] = torch.tensor([0, 6, 4, 6, 9])  # resumed: prompt 4 + 2 outputs, whole prefill now
    prefill = dev.pinned((ROWS, MAX_LEN), torch.int32)
    prefill.copy_(torch.arange(ROWS * MAX_LEN, dtype=torch.int32).view(ROWS, MAX_LEN) + 100)
    table = dev.zeros((ROWS, MAX_BLOCKS), torch.int32)
    table.copy_(torch.tensor([[20, 21, 22, 23], [30, 31, 32, 33], [10, 11, 12, 13], [5, 6, 7, 8]], dtype=torch.int32))
    rows = np.array([2, 0, 3, 1], np.int32)
    query_lens = np.array([3, 1, 3, 6])
    drafts_per_req = [[], [], [8, 9], []]
    return state, prefill, table, rows, query_lens, drafts_per_req


def _expected(state, prefill, table, rows, query_lens, drafts_per_req):
    ids, pos, slots, seq_lens, li, lrows, lpos = [], [], [], [], [], [], []
    cu = 0
    for i, row in enumerate(rows):
        computed, known, _, prefill_len, last = state[row].tolist()
        drafts = drafts_per_req[i]
        for j in range(int(query_lens[i])):
            p = computed + j
            tok = prefill[row, p].item() if p < prefill_len else (last if p < known else drafts[p - known])
            ids.append(tok)
            pos.append(p)
            slots.append(table[row, p // BS].item() * BS + p % BS)
        seq_len = computed + int(query_lens[i])
        seq_lens.append(seq_len)
        k = len(drafts)
        for r in range(k + 1):
            li.append(cu + int(query_lens[i]) - 1 - k + r)
            lrows.append(int(row))
            lpos.append(seq_len - k + r)
        cu += int(query_lens[i])
    return ids, pos, slots, seq_lens, li, lrows, lpos


def _buffers(dev: Device, tokens: int, logit_rows: int):
    return dict(
        input_ids=dev.full(tokens, -7, torch.int64), positions=dev.full(tokens, -7, torch.int64),
        slot_mapping=dev.full(tokens, -7, torch.int64), query_start_loc=dev.full(ROWS + 1, -7, torch.int32),
        seq_lens=dev.full(ROWS, -7, torch.int32), idx_mapping=dev.full(ROWS, -7, torch.int32),
        block_table_out=dev.full((ROWS, MAX_BLOCKS), -7, torch.int32), logits_indices=dev.full(logit_rows, -7, torch.int64),
        logits_rows=dev.full(logit_rows, -7, torch.int32), logits_positions=dev.full(logit_rows, -7, torch.int64),
        draft_prefix=dev.full((logit_rows, MAX_DRAFTS), -7, torch.int32),
    )


def _compact(rows, query_lens, drafts_per_req):
    cu = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    k = np.array([len(d) for d in drafts_per_req])
    draft_start = np.concatenate([[0], np.cumsum(k)]).astype(np.int32)
    logits_start = np.concatenate([[0], np.cumsum(k + 1)]).astype(np.int32)
    drafts = np.array([t for d in drafts_per_req for t in d], np.int32)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return t(rows), t(cu), t(draft_start), t(drafts), t(logits_start)


def test_input_prep_matches_python_rules():
    dev = Device("cpu")
    state, prefill, table, rows, query_lens, drafts_per_req = _world(dev)
    rows_t, cu, draft_start, drafts, logits_start = _compact(rows, query_lens, drafts_per_req)
    num_tokens, pad = int(cu[-1]), 3
    num_sampling = int(logits_start[-1])
    prompt_index = torch.tensor([0, 2], dtype=torch.int32)
    out = _buffers(dev, num_tokens + pad, num_sampling + 2)
    launch_prepare_inputs(
        rows=rows_t, cu=cu, logits_start=logits_start, draft_start=draft_start, drafts=drafts, prompt_token_index=prompt_index,
        row_state=state, prefill_tokens=prefill, block_table=table, **out,
        num_reqs=len(rows), num_tokens=num_tokens, padded_num_tokens=num_tokens + pad,
        num_sampling_rows=num_sampling, num_prompt_rows=2, kv_block_size=BS, max_drafts=MAX_DRAFTS,
    )
    ids, pos, slots, seq_lens, li, lrows, lpos = _expected(state, prefill, table, rows, query_lens, drafts_per_req)
    assert out["input_ids"][:num_tokens].tolist() == ids
    assert ids[4:7] == [77, 8, 9] and ids[3] == 55  # last sampled token, then drafts
    assert out["positions"][:num_tokens].tolist() == pos
    assert out["slot_mapping"][:num_tokens].tolist() == slots
    assert out["slot_mapping"][num_tokens:].tolist() == [-1] * pad  # padding writes no KV
    assert out["query_start_loc"].tolist() == cu.tolist()
    assert out["seq_lens"].tolist() == seq_lens
    assert out["idx_mapping"].tolist() == rows.tolist()
    for i, row in enumerate(rows):
        used = -(-seq_lens[i] // BS)
        assert out["block_table_out"][i, :used].tolist() == table[row, :used].tolist()
    assert out["logits_indices"][:num_sampling].tolist() == li
    assert out["logits_indices"][num_sampling:].tolist() == [0, 2]
    assert out["logits_rows"][:num_sampling].tolist() == lrows
    assert out["logits_positions"][:num_sampling].tolist() == lpos
    # Draft rows count the drafts before them (request 2: rows 2, 3, 4 with drafts 8, 9).
    assert out["draft_prefix"][:num_sampling].tolist() == [[-1, -1], [-1, -1], [-1, -1], [8, -1], [8, 9], [-1, -1]]


@pytest.mark.parametrize("targets,accepted", [([8, 4, 5], 1), ([8, 9, 5], 2), ([1, 9, 5], 0)])
def test_post_update_accepts_drafts_and_advances_counts(targets, accepted):
    dev = Device("cpu")
    state, _, _, rows, query_lens, drafts_per_req = _world(dev)
    before = state.clone()
    rows_t, cu, draft_start, drafts, logits_start = _compact(rows, query_lens, drafts_per_req)
    sampled = torch.tensor([41, 42] + targets + [43], dtype=torch.int64)  # rows: req0, req1, req2 (x3), req3
    num_sampled = dev.full(ROWS, -7, torch.int32)
    valid = dev.full(6, -7, torch.int32)
    launch_post_update(rows=rows_t, cu=cu, logits_start=logits_start, draft_start=draft_start, drafts=drafts, sampled=sampled,
                       row_state=state, num_sampled=num_sampled, row_valid=valid, num_reqs=4, max_drafts=MAX_DRAFTS)
    assert num_sampled.tolist() == [0, 1, accepted + 1, 1]
    assert valid.tolist() == [0, 1] + [int(r <= accepted) for r in range(3)] + [1]
    # Partial chunk: only num_computed moves.
    assert state[2].tolist() == [7] + before[2, 1:].tolist()
    # Decode: the sampled token becomes the last token, one more known.
    assert state[0].tolist() == [8, 9, 7, 7, 42]
    # Drafts: rewind past the rejected ones; the first disagreeing (or bonus) target is the last token.
    assert state[3].tolist() == [5 + 1 + accepted, 5 + 2 + accepted, 5, 5, targets[accepted]]
    # A resumed request's prefill completes and samples.
    assert state[1].tolist() == [6, 7, 4, 6, 43]


def _plan(sched: SchedulerOutput, table: RequestStateTable, last_step_id: int | None):
    """The runner's host path for a step of already-admitted requests: read the output, adopt cached counts, plan."""
    limits = RunnerLimits(vocab_size=64, max_num_reqs=3, max_model_len=16, max_num_batched_tokens=16, num_kv_blocks=8,
                          block_size=4)
    step = read_step(sched, table, limits, last_step_id)
    table.apply_cached(step.cached_rows, step.cached_computed, step.cached_new_blocks)
    return step, plan_step(step, table)


def test_plan_step_prompt_logprob_rows_cover_only_the_prompt_on_first_admission():
    table = RequestStateTable(Device("cpu"), max_num_reqs=3, max_model_len=16)
    asks = SamplingParams(prompt_logprobs=2, logprobs=1)
    table.admit(NewRequest("a", (10, 11, 12, 13, 14, 15), asks, (0, 1)), seed=0)
    table.admit(NewRequest("r", (20, 21), asks, (2,), output_token_ids=(22, 23)), seed=0)  # resumed: none
    sched = SchedulerOutput(0, num_scheduled_tokens={"r": 4, "a": 4})
    step, plan = _plan(sched, table, None)
    assert plan.req_ids == ("r", "a") and plan.num_tokens == 8 and plan.num_sampling_rows == 2
    assert [p.req_id for p in plan.prompt_requests] == ["a"]
    assert plan.prompt_token_index.tolist() == [4, 5, 6, 7]  # a's tokens follow r's four in the batch
    assert plan.prompt_targets.tolist() == [11, 12, 13, 14]
    assert plan.max_num_logprobs == 1 and plan.max_num_prompt_logprobs == 2
    table.advance(plan.req_ids, plan.query_lens, plan.num_drafts)
    sched2 = SchedulerOutput(1, cached_requests=CachedRequests.of((CachedRequest("a", (), 4),)), num_scheduled_tokens={"a": 2})
    _, plan2 = _plan(sched2, table, 0)
    # Positions 4 and 5 are computed; only position 4 has a next prompt token (15).
    assert plan2.prompt_token_index.tolist() == [0] and plan2.prompt_targets.tolist() == [15]


def _plans_equal(a, b) -> bool:
    from dataclasses import fields
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if x.dtype != y.dtype or not np.array_equal(x, y):
                return False
        elif x != y:
            return False
    return True


def test_plain_plan_equals_the_general_plan_and_is_taken_for_plain_steps():
    from runnercheck.impl.input_batch import _general_plan, _plain_plan
    table = RequestStateTable(Device("cpu"), max_num_reqs=3, max_model_len=16)
    plain = SamplingParams()
    table.admit(NewRequest("a", (10, 11, 12, 13, 14, 15), plain, (0, 1)), seed=0)
    table.admit(NewRequest("r", (20, 21), plain, (2,), output_token_ids=(22, 23)), seed=0)
    sched = SchedulerOutput(0, num_scheduled_tokens={"r": 4, "a": 3})  # mixed queries: no uniform length
    step, plan = _plan(sched, table, None)
    assert _plans_equal(plan, _general_plan(step, table)) and _plans_equal(_plain_plan(step), plan)
    table.advance(plan.req_ids, plan.query_lens, plan.num_drafts)
    sched2 = SchedulerOutput(1, cached_requests=CachedRequests.of((CachedRequest("a", (), 3), CachedRequest("r", (3,), 4))),
                             num_scheduled_tokens={"a": 1, "r": 1})
    step2, plan2 = _plan(sched2, table, 0)
    assert plan2.uniform == (1, 0) and _plans_equal(plan2, _general_plan(step2, table))
    # Taken: a request count's shared parts are one set of objects.
    assert plan2.draft_start is plan.draft_start and plan2.logits_start64 is plan.logits_start64


def test_a_live_logprob_request_takes_the_general_plan():
    table = RequestStateTable(Device("cpu"), max_num_reqs=3, max_model_len=16)
    table.admit(NewRequest("a", (10, 11, 12), SamplingParams(logprobs=2), (0,)), seed=0)
    _, plan = _plan(SchedulerOutput(0, num_scheduled_tokens={"a": 3}), table, None)
    assert plan.max_num_logprobs == 2 and plan.num_logprobs == (2,)
