"""runnercheck.checks.compare on crafted outputs: ties vs divergences, logprob tolerance, near-tied ranks."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from runnercheck.checks.compare import compare_step, default_tie_tolerance, first_output_positions
from runnercheck.impl.interface import CachedRequest, CachedRequests, ModelRunnerOutput, NewRequest, SamplingParams, SchedulerOutput, TokenLogprobs

TOL = 1e-3


@dataclass(frozen=True)
class Res:
    token: int
    gap: float
    fragile: bool = False
    nan_flag: bool = False


def out(tokens: dict[str, tuple[int, ...]], *, logprobs=None, nan=None, prompt_logprobs=None, seeds=None, step=3) -> ModelRunnerOutput:
    rids = tuple(tokens)
    return ModelRunnerOutput(
        step_id=step,
        req_ids=rids,
        sampled_token_ids=tuple(tokens[r] for r in rids),
        logprobs=tuple((logprobs or {}).get(r) for r in rids),
        prompt_logprobs=prompt_logprobs or {},
        nan_flags=tuple((nan or {}).get(r, False) for r in rids),
        seeds=seeds or {},
    )


def lp(token: int, logprob: float, rank: int, top: tuple[tuple[int, float], ...] = ()) -> TokenLogprobs:
    return TokenLogprobs(token, logprob, rank, tuple(t for t, _ in top), tuple(v for _, v in top))


def test_identical_outputs_compare_clean() -> None:
    a = out({"r0": (5,), "r1": ()}, logprobs={"r0": (lp(5, -0.5, 1, ((5, -0.5), (7, -1.5))),), "r1": ()})
    cmp = compare_step(a, a, {"r0": [Res(5, 2.0)]}, tie_tolerance=TOL)
    assert cmp.ok and cmp.tokens_compared == 1 and cmp.logprobs_compared == 1
    assert cmp.first_divergence_line() is None


def test_different_token_with_large_gap_is_a_divergence_with_position() -> None:
    exp = out({"r0": (5,), "r1": (9,)})
    got = out({"r0": (5,), "r1": (8,)})
    cmp = compare_step(got, exp, {"r0": [Res(5, 1.0)], "r1": [Res(9, 0.7)]}, positions={"r0": 4, "r1": 17}, tie_tolerance=TOL)
    assert not cmp.ok and not cmp.ties
    d = cmp.divergences[0]
    assert (d.kind, d.req_id, d.position, d.expected, d.got) == ("token", "r1", 17, 9, 8)
    assert cmp.first_divergence_line() == "step 3: request 'r1' position 17: expected token 9, got 8 (oracle gap 0.7)"


@pytest.mark.parametrize("gap,fragile", [(5e-4, False), (3.0, True)])
def test_near_tie_or_fragile_boundary_is_a_tie(gap: float, fragile: bool) -> None:
    exp, got = out({"r0": (9,)}), out({"r0": (8,)})
    cmp = compare_step(got, exp, {"r0": [Res(9, gap, fragile)]}, positions={"r0": 6}, tie_tolerance=TOL)
    assert cmp.ok
    assert [(t.req_id, t.position, t.expected, t.got) for t in cmp.ties] == [("r0", 6, 9, 8)]
    assert "tie" in cmp.ties[0].line()


def test_gap_just_above_tolerance_is_not_a_tie() -> None:
    cmp = compare_step(out({"r0": (8,)}), out({"r0": (9,)}), {"r0": [Res(9, 1.5e-3)]}, tie_tolerance=TOL)
    assert [d.kind for d in cmp.divergences] == ["token"]


def test_draft_rows_tie_that_changes_acceptance_cannot_be_adopted() -> None:
    # drafts (4, 6): oracle accepted 4 then sampled 2; the runner rejected 4 at a near tie.
    exp, got = out({"r0": (4, 2)}), out({"r0": (3,)})
    cmp = compare_step(got, exp, {"r0": [Res(4, 1e-5), Res(2, 1.0)]}, tie_tolerance=TOL)
    assert [d.kind for d in cmp.divergences] == ["tie-length"] and not cmp.ties


def test_length_and_batch_mismatches() -> None:
    cmp = compare_step(out({"r0": (4,)}), out({"r0": (4, 2)}), {"r0": [Res(4, 1.0), Res(2, 1.0)]}, tie_tolerance=TOL)
    assert [d.kind for d in cmp.divergences] == ["length"]
    cmp = compare_step(out({"r1": (4,), "r0": (4,)}), out({"r0": (4,), "r1": (4,)}), {}, tie_tolerance=TOL)
    assert [d.kind for d in cmp.divergences] == ["batch"]


def test_logprob_tolerance_and_ranks() -> None:
    top = ((5, -0.5), (7, -1.5), (2, -2.0))
    exp = out({"r0": (5,)}, logprobs={"r0": (lp(5, -0.5, 1, top),)})
    res = {"r0": [Res(5, 1.0)]}
    within = out({"r0": (5,)}, logprobs={"r0": (lp(5, -0.5004, 1, ((5, -0.5004), (7, -1.5003), (2, -2.0))),)})
    assert compare_step(within, exp, res, tie_tolerance=TOL).ok
    outside = out({"r0": (5,)}, logprobs={"r0": (lp(5, -0.502, 1, top),)})
    assert [d.kind for d in compare_step(outside, exp, res, tie_tolerance=TOL).divergences] == ["logprob"]
    wrong_rank = out({"r0": (5,)}, logprobs={"r0": (lp(5, -0.5, 2, top),)})
    assert [d.kind for d in compare_step(wrong_rank, exp, res, tie_tolerance=TOL).divergences] == ["rank"]
    swapped = out({"r0": (5,)}, logprobs={"r0": (lp(5, -0.5, 1, ((5, -0.5), (2, -2.0), (7, -1.5))),)})
    assert [d.kind for d in compare_step(swapped, exp, res, tie_tolerance=TOL).divergences] == ["top"]
    missing = out({"r0": (5,)}, logprobs={"r0": None})
    assert [d.kind for d in compare_step(missing, exp, res, tie_tolerance=TOL).divergences] == ["presence"]


def test_near_tied_logits_may_swap_rank_and_top_order() -> None:
    top = ((5, -0.9), (7, -0.9002), (2, -2.0))
    exp = out({"r0": (7,)}, logprobs={"r0": (lp(7, -0.9002, 2, top),)})
    got = out({"r0": (7,)}, logprobs={"r0": (lp(7, -0.9001, 1, ((7, -0.9001), (5, -0.9), (2, -2.0))),)})
    assert compare_step(got, exp, {"r0": [Res(7, 1.0)]}, tie_tolerance=TOL).ok


def test_a_deep_rank_moves_only_by_the_oracles_near_tied_neighbours() -> None:
    """H200 run 12's false divergence: a prompt token at rank 185 of 256 with another token 8.9e-7
    logits away (no top-n list reaches it).  The oracle's neighbour gaps allow exactly that move."""
    from runnercheck.reference.sampler import OracleTokenLogprobs, token_logprobs

    exp_lp = OracleTokenLogprobs(170, -6.0, 185, (1,), (-0.5,), neighbour_gaps=(8.9e-7, -0.004))
    exp = out({"r0": ()}, prompt_logprobs={"r0": (exp_lp,)})

    def with_rank(rank: int):
        return out({"r0": ()}, prompt_logprobs={"r0": (lp(170, -6.0, rank, ((1, -0.5),)),)})

    assert compare_step(with_rank(184), exp, {}, tie_tolerance=TOL).ok  # the neighbour above fell below
    for rank in (183, 186):  # one place more than the neighbours within tolerance allow: caught
        kinds = [d.kind for d in compare_step(with_rank(rank), exp, {}, tie_tolerance=TOL).divergences]
        assert kinds == ["prompt rank"], rank
    # Without neighbour gaps (a plain TokenLogprobs) no deep rank moves.
    plain = out({"r0": ()}, prompt_logprobs={"r0": (lp(170, -6.0, 185, ((1, -0.5),)),)})
    assert [d.kind for d in compare_step(with_rank(184), plain, {}, tie_tolerance=TOL).divergences] == ["prompt rank"]
    # The oracle lists the neighbours, signed, closest first; ties count as below (either side may win).
    row = torch.tensor([0.0, 1.0, 1.0 + 5e-7, 1.0, 3.0, 1.0 - 2e-3], dtype=torch.float64)
    got = token_logprobs(row, 1, 2)
    assert got.rank == 3 and got.neighbour_gaps == pytest.approx((0.0, 5e-7, -2e-3))


def test_nan_flags_must_match_and_flagged_rows_skip_logprobs() -> None:
    exp = out({"r0": (0,)}, logprobs={"r0": (lp(0, math.nan, 1),)}, nan={"r0": True})
    got = out({"r0": (0,)}, logprobs={"r0": (lp(0, -3.0, 7),)}, nan={"r0": True})
    res = {"r0": [Res(0, math.inf, nan_flag=True)]}
    assert compare_step(got, exp, res, tie_tolerance=TOL).ok
    unflagged = out({"r0": (0,)}, logprobs={"r0": (lp(0, -3.0, 7),)})
    kinds = [d.kind for d in compare_step(unflagged, exp, res, tie_tolerance=TOL).divergences]
    assert kinds == ["nan_flag"]


def test_prompt_logprobs_and_seeds() -> None:
    p_exp = {"r0": (lp(3, -1.0, 2, ((1, -0.5),)), lp(4, -2.0, 3, ((1, -0.7),)))}
    p_bad = {"r0": (lp(3, -1.0, 2, ((1, -0.5),)), lp(4, -2.5, 3, ((1, -0.7),)))}
    exp = out({"r0": ()}, prompt_logprobs=p_exp, seeds={"r0": 11})
    assert compare_step(out({"r0": ()}, prompt_logprobs=p_exp, seeds={"r0": 11}), exp, {}, tie_tolerance=TOL).ok
    kinds = [d.kind for d in compare_step(out({"r0": ()}, prompt_logprobs=p_bad, seeds={"r0": 12}), exp, {}, tie_tolerance=TOL).divergences]
    assert kinds == ["prompt logprob", "seed"]
    kinds = [d.kind for d in compare_step(out({"r0": ()}), exp, {}, tie_tolerance=TOL).divergences]
    assert kinds == ["presence"]


def test_first_output_positions_from_the_schedule() -> None:
    params = SamplingParams()
    sched = SchedulerOutput(
        step_id=0,
        new_requests=(NewRequest("n", (1, 2, 3), params, (0,)),),
        cached_requests=CachedRequests.of((CachedRequest("c", (), 9), CachedRequest("d", (), 5))),
        num_scheduled_tokens={"n": 3, "c": 1, "d": 3},
        draft_token_ids={"d": (4, 4)},
    )
    assert first_output_positions(sched) == {"n": 3, "c": 10, "d": 6}


def test_default_tie_tolerance_is_the_oracles() -> None:
    sampler = pytest.importorskip("runnercheck.reference.sampler")
    assert default_tie_tolerance() == sampler.TIE_TOLERANCE
