"""checks/chisq/cases.py and checks/chisq/binding.py: every case's declared filters bind, the matrix
has a binding case for every filter and pair at temperatures below and above 1, the check fails a
case whose filter is slack, and the binding cases reject the planted errors of their own filters."""
from __future__ import annotations

from dataclasses import replace
from itertools import combinations

import numpy as np
import pytest
import torch

from runnercheck.checks.chisq import draws as chisq_draws
from runnercheck.checks.chisq.case import SamplingCase
from runnercheck.checks.chisq import binding as chisq_binding
from runnercheck.checks.chisq import cases as chisq_cases
from runnercheck.checks.chisq import samplers
from runnercheck.checks.chisq import stats
from runnercheck.checks.chisq.binding import FILTERS, active_filters, binding_report, case_problems, detection_power
from runnercheck.impl.interface import SamplingParams


def _catalogue(quick: bool) -> list[SamplingCase]:
    """Every case a run tests for a bias.  Not the calibration case: it is drawn 40-400 times at
    2000 draws to check that p-values are uniform, and detects nothing by itself."""
    cases = chisq_cases.build_cases(quick) + chisq_cases.deep_tail_cases()
    cases += [case for case, _ in chisq_cases.power_cases().values()]
    return list({c.name: c for c in cases}.values())


def test_every_quick_case_declares_filters_that_bind() -> None:
    report = {c.name: chisq_binding.binding_filters(c) for c in _catalogue(quick=True)}
    print("\n".join(f"{name}: binds {', '.join(b) or '-'}" for name, b in report.items()))  # the per-case table
    assert chisq_binding.catalogue_problems(_catalogue(quick=True)) == []


@pytest.mark.stats
def test_every_full_case_declares_filters_that_bind() -> None:
    assert chisq_binding.catalogue_problems(_catalogue(quick=False)) == []


def test_runner_sampler_cases_bind_at_their_own_size_and_level() -> None:
    cases = chisq_cases.runner_sampler_cases()
    assert chisq_binding.catalogue_problems(cases, alpha=chisq_cases.RUNNER_ALPHA) == []
    assert {f for c in cases for f in c.binds} >= {"min_p", "top_p"}
    assert all(c.params.temperature != 1.0 for c in cases)


def test_matrix_has_a_binding_case_for_every_filter_and_pair_below_and_above_temperature_1() -> None:
    cases = chisq_cases.build_cases(quick=True)

    def covered(binder: str, others: tuple[str, ...], below: bool) -> bool:
        return any(binder in c.binds and set(others) <= set(active_filters(c.params))
                   and (c.params.temperature < 1.0) == below and c.params.temperature not in (0.0, 1.0) for c in cases)

    missing = [(f, below) for f in FILTERS for below in (True, False) if not covered(f, (), below)]
    missing += [(a, b, below) for a, b in combinations(FILTERS, 2) for x, y in ((a, b), (b, a))
                for below in (True, False) if not covered(x, (y,), below)]
    assert missing == []


def test_binding_check_fails_a_case_whose_filter_is_slack() -> None:
    """The matrix's old combination case: top-k (30) cuts harder than min-p (57 kept), so no min-p
    threshold near its own decides anything -- declaring min-p binding there must fail."""
    combo = next(c for c in chisq_cases.build_cases(True) if c.name.startswith("combo-"))
    report = binding_report(combo)
    assert report["min_p"].binds is False and all(m.total_variation == 0.0 for m in report["min_p"].moves)
    assert report["top_k"].binds and report["top_p"].binds
    problems = case_problems(replace(combo, binds=("min_p",)))
    assert len(problems) == 1 and "min_p does NOT bind" in problems[0]
    # No declaration at all, and a declaration of a filter that is off, fail too.
    assert "declares no binding filter" in case_problems(replace(combo, binds=()))[0]
    assert "is not on" in case_problems(replace(combo, binds=("top_k", "presence_penalty")))[0]


def test_binding_check_fails_a_penalty_that_touches_no_kept_token() -> None:
    case = next(c for c in chisq_cases.build_cases(True) if c.name == "bind-k+freq-t0.6-v32")
    assert case_problems(case) == []
    ranked = torch.argsort(case.logits[0], descending=True).tolist()
    far = replace(case, history=samplers.TokenHistory(output_ids=(ranked[-1], ranked[-2])))  # filtered out by top-k
    assert any("frequency_penalty does NOT bind" in p for p in case_problems(far))


def test_binding_check_fails_a_case_too_small_to_see_its_filter() -> None:
    case = next(c for c in chisq_cases.build_cases(True) if c.name == "bind-minp-t1.5-v32")
    assert case_problems(case) == [] and case_problems(replace(case, n_samples=50)) != []


def test_detection_power_of_the_chisquare_and_of_impossible_tokens() -> None:
    p = np.full(10, 0.1)
    assert detection_power(p, p, 10_000) < 1e-3  # no move: only the test's own level
    shifted = p.copy()
    shifted[0], shifted[1] = 0.12, 0.08
    assert detection_power(p, shifted, 100) < 0.5 < 0.99 < detection_power(p, shifted, 100_000)
    with_impossible = np.append(p, 0.0)
    moved = with_impossible.copy()
    moved[-1], moved[0] = 0.001, moved[0] - 0.001  # 0.1% of the draws on a token of probability 0
    assert detection_power(with_impossible, moved, 1000) == pytest.approx(1 - 0.999**1000)


def test_moves_are_one_token_at_the_filters_own_boundary() -> None:
    case = next(c for c in chisq_cases.build_cases(True) if c.name == "bind-minp-slack-k-t0.6-v32")
    labels = [label for label, _ in chisq_binding.filter_moves(case, "min_p")]
    kept = chisq_cases.BIND_KEPT
    assert labels == [f"min-p keeps {kept - 1}", f"min-p keeps {kept + 1}"]
    from runnercheck.reference.sampler import expected_distribution

    for _, params in chisq_binding.filter_moves(case, "min_p"):
        support = int((expected_distribution(case.logits[0].double(), params) > 0).sum())
        assert abs(support - kept) == 1


# --------------------------------------------------------------------------- the binding cases reject their filter's errors


def _rejects(bias: str, case: SamplingCase, n: int) -> float:
    seed, offset = chisq_cases.case_seed(0, f"test:{bias}:{case.name}")
    tokens = chisq_draws.draw(samplers.planted_sampler(bias), case, seed=seed, position_offset=offset,
                        device=torch.device("cpu"), n_samples=n)
    return stats.family_min_p(chisq_draws.evaluate(case, tokens, chisq_draws.expected_rows(case), 0.01))


def _min_p_cases_off_temperature_1() -> list[SamplingCase]:
    return [c for c in chisq_cases.build_cases(True) if "min_p" in c.binds and c.params.temperature != 1.0]


def test_min_p_temperature_error_changes_every_min_p_binding_case_and_not_the_slack_one() -> None:
    """Exact: min-p taken before the temperature is min-p ** (1/T) after it."""
    from runnercheck.reference.sampler import expected_distribution

    def moved(case: SamplingCase) -> float:
        p = case.params
        wrong = replace(p, min_p=p.min_p ** (1.0 / p.temperature))
        a = expected_distribution(case.logits[0].double(), p, case.history.prompt_ids, case.history.output_ids)
        b = expected_distribution(case.logits[0].double(), wrong, case.history.prompt_ids, case.history.output_ids)
        return 0.5 * float((a - b).abs().sum())

    cases = _min_p_cases_off_temperature_1()
    assert len(cases) >= 12 and {c.params.temperature < 1 for c in cases} == {True, False}
    assert all(moved(c) > 0.01 for c in cases), {c.name: moved(c) for c in cases}
    combo = next(c for c in chisq_cases.build_cases(True) if c.name.startswith("combo-"))
    assert moved(combo) == 0.0  # why the old matrix could not see it


def test_min_p_temperature_error_is_rejected_by_every_min_p_binding_case() -> None:
    """The planted bias on each min-p binding case at T != 1 (20000 draws each, ~3 s in all)."""
    min_ps = {c.name: _rejects("min-p-before-temperature", c, 20_000) for c in _min_p_cases_off_temperature_1()}
    assert all(p < 1e-6 for p in min_ps.values()), min_ps
    assert _rejects("min-p-before-temperature", chisq_cases.build_cases(True)[0], 5_000) > 0.01  # no min-p: no effect


@pytest.mark.stats
@pytest.mark.parametrize("bias, filters", [
    ("top-k-off-by-one", {"top_k"}),
    ("top-p-extra-token", {"top_p"}),
    ("top-p-drop-boundary", {"top_p"}),
    ("penalty-wrong-sign", {"repetition_penalty", "frequency_penalty", "presence_penalty"}),
    ("min-p-before-temperature", {"min_p"}),
])
def test_every_binding_case_rejects_its_filters_planted_error(bias: str, filters: set[str]) -> None:
    cases = [c for c in chisq_cases.build_cases(True) if set(c.binds) & filters
             and not (bias == "min-p-before-temperature" and c.params.temperature == 1.0)]
    min_ps = {c.name: _rejects(bias, c, c.n_samples) for c in cases}
    assert cases and all(p < 0.01 for p in min_ps.values()), min_ps


def test_params_of_binding_cases_are_valid_and_their_thresholds_sit_between_tokens() -> None:
    from runnercheck.reference.sampler import sample

    for case in chisq_cases.build_cases(True) + chisq_cases.runner_sampler_cases():
        case.params.validate(case.vocab_size, max_logprobs=0)
        result = sample(case.logits[0], case.params, 1, 0, case.history.prompt_ids, case.history.output_ids)
        assert not result.fragile, case.name
    assert SamplingParams().top_k == -1  # "off" is what active_filters compares against


def test_binding_table_command_prints_every_case(capsys) -> None:
    from runnercheck.checks.chisq import binding_cmd as chisq_binding_cmd

    assert chisq_binding_cmd.main(["--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| bind-minp-slack-k-t0.6-v32 | 0.6 | 20000 | minp | minp | k |" in out
    assert "| combo-t0.7-k30-p-minp-v97 | 0.7 | 20000 | k p | k p | minp |" in out
