"""Running a chi-square run's units: matrix cases, the calibration and the planted biases, each drawn and tested.

A unit (a matrix case, or `runnercheck.checks.chisq.isolated.CALIBRATION`) runs here or, with
``RunOptions.isolation``, in a child process where a crash or a hang is the unit's failure
(`runnercheck.checks.chisq.isolated`).  A case the sampler declines is skipped with the reason; a contract violation
becomes a failed result outside the correction family (`collect`).  Self-tests of the tests: *calibration* (the
chosen sampler over many seeds must reject at the stated rate) and *power* (each planted-bias sampler of
`runnercheck.checks.chisq.samplers.PLANTED_BIASES` must be rejected in the case built to expose it).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Sequence

import numpy as np
import torch

from runnercheck.checks.chisq import stats
from runnercheck.checks.chisq.case import SamplingCase
from runnercheck.checks.chisq.cases import calibration_case, case_seed, power_cases, power_plan
from runnercheck.checks.chisq.draws import draw, evaluate, expected_rows, sampler_can_run
from runnercheck.checks.chisq.isolated import CALIBRATION, CaseOutcome, run_units_isolated
from runnercheck.checks.chisq.logprobs import check_case_logprobs, returns_logprobs
from runnercheck.checks.chisq.plan import RunOptions, in_shard, matching_cases
from runnercheck.checks.chisq.sampler_contract import SamplerContractError, contract_failure, rows_per_call_bound
from runnercheck.checks.chisq.samplers import PLANTED_BIASES, SamplerUnsupportedError, planted_sampler, sampler_name

CALIBRATION_ALPHA = 0.05


def run_case(sampler: Callable, case: SamplingCase, opts: RunOptions, device: torch.device,
             tick: Callable[[str, int], None], max_rows: int | None) -> CaseOutcome:
    """Draw and test one case (uncorrected); a decline is a skip, a contract violation a failure."""
    why = sampler_can_run(sampler, case, max_rows)
    if why:
        return CaseOutcome(case.name, skipped=why)
    seed, offset = case_seed(opts.seed, case.name)
    started = time.perf_counter()
    try:
        tokens = draw(sampler, case, seed=seed, position_offset=offset, device=device, n_samples=opts.samples or case.n_samples,
                      progress=lambda m: tick(case.name, m * case.rows * case.vocab_size), max_rows_per_call=max_rows)
    except SamplerUnsupportedError as e:
        return CaseOutcome(case.name, skipped=f"sampler raised SamplerUnsupportedError: {e}")
    except SamplerContractError as e:
        failures = [contract_failure(case.name, {**case.describe(), "seed": seed, "position_offset": offset}, e)]
        stats.share_wall_time(failures, time.perf_counter() - started)
        return CaseOutcome(case.name, failures=failures)
    expected = expected_rows(case, opts.convention)
    results = evaluate(case, tokens, expected, opts.alpha)
    attach_diagnoses(case, tokens, expected, results, opts)
    for result in results:
        result.config.update(seed=seed, position_offset=offset)  # what a rerun of this case needs
    failures: list = []
    if returns_logprobs(sampler):  # a sampler that returns logprobs: they must describe what it drew from
        try:
            more, failures = check_case_logprobs(sampler, case, expected, seed=seed, position_offset=offset + len(tokens) * case.rows,
                                                 device=device, n_samples=len(tokens), alpha=opts.alpha, max_rows_per_call=max_rows)
        except SamplerContractError as e:
            more, failures = [], [contract_failure(case.name, {**case.describe(), "seed": seed, "position_offset": offset}, e)]
        results += more
    stats.share_wall_time(results + failures, time.perf_counter() - started)  # each test's share of its case's time (JUnit)
    return CaseOutcome(case.name, results=results, failures=failures)


def attach_diagnoses(case: SamplingCase, tokens: np.ndarray, expected: Sequence[np.ndarray],
                     results: Sequence[stats.TestResult], opts: RunOptions) -> None:
    """A row test that rejects (uncorrected) gets its diagnosis (`runnercheck.checks.chisq.diagnosis`): cheap, and
    the correction that decides pass/fail comes later, over the whole family."""
    from runnercheck.checks.chisq.diagnosis import diagnose

    for j in range(case.rows):
        name = f"{case.name}/row{j}" if case.rows > 1 else case.name
        for r in results:
            if r.name == name and r.kind == "chisq" and r.p_value < opts.alpha:
                r.diagnosis = diagnose(case, stats.token_counts(tokens[:, j], case.vocab_size), expected[j], opts.convention, j)


def run_calibration_unit(sampler: Callable, opts: RunOptions, device: torch.device,
                         tick: Callable[[str, int], None]) -> CaseOutcome:
    """`run_calibration` as a unit: a decline is a skip, a contract violation a failure."""
    name = calibration_case().name
    try:
        return CaseOutcome(name, calibration=run_calibration(sampler, opts, device, tick))
    except SamplerUnsupportedError as e:
        return CaseOutcome(name, skipped=f"calibration not run: {e}")
    except SamplerContractError as e:
        return CaseOutcome(name, failures=[contract_failure(name, {}, e)])


def run_units(sampler: Callable, units: Sequence[SamplingCase | str], opts: RunOptions, device: torch.device,
              tick: Callable[[str, int], None] = lambda label, work: None) -> list[CaseOutcome]:
    """Each unit (a case, or `CALIBRATION`) on ``sampler``: here, or with ``opts.isolation`` in a
    child process where a crash or a hang is the unit's failure (`runnercheck.checks.chisq.isolated`)."""
    if opts.isolation is not None:
        return run_units_isolated(run_unit, sampler, units, opts, device, tick)
    max_rows = rows_per_call_bound(sampler, opts.max_rows_per_call)
    return [run_unit(sampler, unit, opts, device, tick, max_rows) for unit in units]


def run_unit(sampler: Callable, unit: SamplingCase | str, opts: RunOptions, device: torch.device,
             tick: Callable[[str, int], None], max_rows: int | None) -> CaseOutcome:
    """One unit: a matrix case (`run_case`) or `CALIBRATION` (`run_calibration_unit`)."""
    if unit == CALIBRATION:
        return run_calibration_unit(sampler, opts, device, tick)
    return run_case(sampler, unit, opts, device, tick, max_rows)  # type: ignore[arg-type]


def collect(outcomes: Sequence[CaseOutcome], opts: RunOptions) -> tuple[list, list]:
    """(corrected results + failures, skipped) of the outcomes: the tests form one correction family;
    failures are not p-values and stay outside it."""
    results = [r for o in outcomes for r in o.results]
    stats.apply_correction(results, opts.correction, opts.alpha)
    skipped = [{"case": o.case, "reason": o.skipped} for o in outcomes if o.skipped is not None]
    return results + [f for o in outcomes for f in o.failures], skipped


def run_cases(sampler: Callable, cases: Sequence[SamplingCase], opts: RunOptions, device: torch.device,
              tick: Callable[[str, int], None] = lambda label, work: None) -> tuple[list, list]:
    """Draw and test every case ``sampler`` can run; (corrected results, skipped cases).

    A case the sampler declines (declared, or `SamplerUnsupportedError` from a call) is skipped with
    the reason; a contract violation (or, isolated, a crash or a timeout) becomes a failed result of
    that case outside the correction family (it is not a p-value), and the remaining cases still run.
    """
    return collect(run_units(sampler, cases, opts, device, tick), opts)


def run_matrix(sampler: Callable, opts: RunOptions, device: torch.device, tick: Callable[[str, int], None]) -> tuple[list, list]:
    return run_cases(sampler, in_shard(matching_cases(opts), opts.shard), opts, device, tick)


def run_calibration(sampler: Callable, opts: RunOptions, device: torch.device, tick) -> stats.CalibrationResult:
    """The chosen sampler, assumed correct, on fresh seeds: rejections at 5% must stay in band.

    Raises `SamplerUnsupportedError` when the sampler cannot run the calibration case and
    `SamplerContractError` when a call breaks the output contract (`run_all` reports both)."""
    runs = opts.calibration_runs or (40 if opts.quick else 400)
    case = calibration_case()
    max_rows = rows_per_call_bound(sampler, opts.max_rows_per_call)
    why = sampler_can_run(sampler, case, max_rows)
    if why:
        raise SamplerUnsupportedError(why)
    expected = expected_rows(case)
    p_values = []
    started = time.perf_counter()
    for r in range(runs):
        seed, offset = case_seed(opts.seed, case.name, r)
        tokens = draw(sampler, case, seed=seed, position_offset=offset, device=device, max_rows_per_call=max_rows,
                      progress=lambda m: tick(case.name, m * case.vocab_size))
        p_values.append(evaluate(case, tokens, expected, CALIBRATION_ALPHA)[0].p_value)
    result = stats.calibration_result(p_values, alpha=CALIBRATION_ALPHA, config_name=case.name, sampler=sampler_name(sampler))
    result.elapsed_s = time.perf_counter() - started
    return result


def run_power(opts: RunOptions, device: torch.device, tick, biases: Sequence[str] | None = None) -> list[stats.PowerResult]:
    """Each planted bias on its exposing case; a repeat rejects when its Bonferroni min-p < alpha."""
    repeats = opts.power_repeats or (1 if opts.quick else 5)
    plan = power_cases()
    results = []
    biases = biases if biases is not None else opts.biases
    for bias in in_shard(list(biases if biases is not None else power_plan(opts.quick, device)), opts.shard):
        case, _ = plan[bias]
        sampler = planted_sampler(bias)
        expected = expected_rows(case)
        min_ps = []
        started = time.perf_counter()
        for r in range(repeats):
            seed, offset = case_seed(opts.seed, f"power:{bias}", r)
            tokens = draw(sampler, case, seed=seed, position_offset=offset, device=device,
                          progress=lambda m, c=case: tick(f"power {bias}", m * c.rows * c.vocab_size))
            min_ps.append(stats.family_min_p(evaluate(case, tokens, expected, opts.alpha)))
        results.append(stats.PowerResult(bias=bias, config_name=case.name, repeats=repeats,
                                         rejections=sum(p < opts.alpha for p in min_ps), alpha=opts.alpha,
                                         required_power=1.0 if repeats < 5 else 0.8, min_p_values=min_ps,
                                         description=PLANTED_BIASES[bias].description,
                                         elapsed_s=time.perf_counter() - started))
    return results


@contextmanager
def single_threaded_on_cpu(device: torch.device):
    """Sample with one intra-op thread on CPU: on a shared 2-core box, torch's thread pool spinning
    against other processes made these small [rows, V] ops 7-40x slower than one thread (measured)."""
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
