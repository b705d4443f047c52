"""`runnercheck chisq`: chi-square tests of a sampler against the exact float64 distributions.

A *case* (`SamplingCase`) is one logit template (one row, or a target row plus draft rows of one
request), one `SamplingParams`, a token history, and a number of draws.  Draw ``i`` of a case is
one request: its rows are sampled at noise positions ``offset + i * rows + j`` with the case's seed,
so every draw uses an independent ``(seed, position)`` key.  Each row's counts are tested against
`runnercheck.reference.sampler.expected_distribution`; tail cases add an exact binomial tail-mass test; multi-row
cases add a joint independence test.  All tests of a run form one family (Holm by default).

Self-tests of the tests: *calibration* (the chosen sampler over many seeds must reject at the
stated rate) and *power* (each planted-bias sampler of `runnercheck.checks.chisq.samplers.PLANTED_BIASES` must be
rejected in the case built to expose it).  The case catalogue (`build_cases`, `deep_tail_cases`,
`power_cases`, ...) is `runnercheck.checks.chisq.cases`; the numbers behind their sizes are in docs/CHISQ.md.
With the matrix run the speculative-verification cases and their planted biases (`runnercheck.checks.chisq.spec`:
the first two tokens under speculation against the target's joint, the emitted-length law), in
their own correction family; ``--no-spec`` leaves them out.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from runnercheck.checks.chisq import stats
from runnercheck.checks.chisq.spec import SPEC_BIASES, default_spec_verifier, run_spec_cases, run_spec_power
from runnercheck.checks.chisq.case import SamplingCase
from runnercheck.checks.chisq.cases import (
    build_cases,
    calibration_case,
    case_seed,
    deep_tail_cases,
    power_cases,
    power_plan,
)
from runnercheck.checks.chisq.logprobs import check_case_logprobs, returns_logprobs
from runnercheck.checks.chisq.sampler_contract import (
    SamplerContractError, SamplerLimitError, check_sampler_output, contract_failure, declared_unsupported, describe_exception,
    rows_per_call_bound,
)
from runnercheck.checks.child import DEFAULT_TIMEOUT_S
from runnercheck.checks.chisq.isolated import CALIBRATION, CaseOutcome, Isolation, run_units_isolated
from runnercheck.checks.chisq.samplers import (
    PLANTED_BIASES, SamplerSpecError, SamplerUnavailableError, SamplerUnsupportedError, accepts_keyword, has_penalties,
    is_builtin_sampler, load_sampler, planted_sampler, sampler_name,
)

DEFAULT_ALPHA = 0.01
CALIBRATION_ALPHA = 0.05


# --------------------------------------------------------------------------- drawing and testing


def sampler_can_run(sampler: Callable, case: SamplingCase, max_rows_per_call: int | None = None) -> str | None:
    """None if ``sampler`` can run ``case`` (`runnercheck.checks.chisq.sampler_contract`), else why not."""
    if has_penalties(case.params) and not accepts_keyword(sampler, "history"):
        return "penalties need a sampler that takes history="
    if max_rows_per_call is not None and case.rows > max_rows_per_call:
        return f"one request of this case has {case.rows} rows > {max_rows_per_call} rows per call"
    return declared_unsupported(sampler, case.params)


def draw(
    sampler: Callable, case: SamplingCase, *, seed: int, position_offset: int, device: torch.device,
    n_samples: int | None = None, progress: Callable[[int], None] | None = None, max_rows_per_call: int | None = None,
) -> np.ndarray:
    """Sample ``n_samples`` requests of ``case``: int64 ``[n, rows]`` token ids.

    Every call's result is checked at the seam (`check_sampler_output`); a violation raises
    `SamplerContractError` naming the case.  ``max_rows_per_call`` bounds the rows of one call.
    """
    n = case.n_samples if n_samples is None else n_samples
    rows, vocab = case.rows, case.vocab_size
    # Elements of logits per sampler call: a deep tail needs ~1e12 token-draws, so on a GPU the
    # calls must be big enough that Python overhead per call stays well under the kernel time.
    budget = (1 << 27) if device.type == "cuda" else (1 << 20)
    per_call = max(1, min(n, budget // (rows * vocab)))
    if max_rows_per_call is not None:
        per_call = max(1, min(per_call, max_rows_per_call // rows))
    template = case.logits.to(device)
    kwargs: dict[str, Any] = {}
    if accepts_keyword(sampler, "history"):
        kwargs["history"] = [case.history] * (per_call * rows)
    out = np.empty((n, rows), dtype=np.int64)
    for start in range(0, n, per_call):
        m = min(per_call, n - start)
        logits = template.repeat(m, 1)
        positions = position_offset + start * rows + torch.arange(m * rows, dtype=torch.int64, device=device)
        seeds = torch.full((m * rows,), seed, dtype=torch.int64, device=device)
        call_kwargs = dict(kwargs)
        if "history" in call_kwargs:
            call_kwargs["history"] = call_kwargs["history"][: m * rows]
        if rows > 1 and accepts_keyword(sampler, "request_index"):
            call_kwargs["request_index"] = torch.arange(m, device=device).repeat_interleave(rows)
        where = f"case {case.name}, draws {start}..{start + m - 1}"
        try:
            tokens = sampler(logits, [case.params] * (m * rows), seeds, positions, **call_kwargs)
        except SamplerUnsupportedError:
            raise
        except Exception as e:  # a crashing plug-in is a finding about the plug-in, not a harness traceback
            raise SamplerContractError(f"{where}: sampler raised {describe_exception(e)}") from e
        try:
            ids = check_sampler_output(tokens, m * rows, vocab)
        except SamplerContractError as e:
            raise SamplerContractError(f"{where}: sampler {e}") from None
        out[start : start + m] = ids.reshape(m, rows)
        if progress is not None:
            progress(m)
    return out


def expected_rows(case: SamplingCase, convention: str = "contract") -> list[np.ndarray]:
    """The exact float64 distribution of each row: `runnercheck.reference.sampler.expected_distribution` under the
    contract, `runnercheck.checks.chisq.conventions.convention_distribution` under another convention."""
    from runnercheck.reference.sampler import expected_distribution

    if convention != "contract":
        from runnercheck.checks.chisq.conventions import convention_distribution

        return [convention_distribution(case.logits[j], case.params, convention, case.history.prompt_ids,
                                        case.history.output_ids) for j in range(case.rows)]
    return [
        expected_distribution(case.logits[j].to(torch.float64), case.params,
                              case.history.prompt_ids, case.history.output_ids).numpy()
        for j in range(case.rows)
    ]


def _index_bin_test(counts: np.ndarray, probs: np.ndarray, bins: int, **kw) -> stats.TestResult:
    edges = np.linspace(0, counts.size, bins + 1).astype(int)
    grouped_counts = np.add.reduceat(counts, edges[:-1])
    grouped_probs = np.add.reduceat(probs, edges[:-1])
    if np.any((probs == 0) & (counts > 0)):
        return stats.chisquare_test(counts, probs, **kw)  # an impossible token: report it per token
    labels = {i: f"tokens {edges[i]}..{edges[i + 1] - 1}" for i in range(bins)}
    return stats.chisquare_test(grouped_counts, grouped_probs, label_fn=lambda g: labels[int(g[0])] if g.size == 1
                                else f"pooled ({g.size} ranges)", **kw)


def evaluate(case: SamplingCase, tokens: np.ndarray, expected: Sequence[np.ndarray], alpha: float) -> list[stats.TestResult]:
    """All tests of one case's draws (uncorrected)."""
    config = case.describe()
    results = []
    for j in range(case.rows):
        counts = stats.token_counts(tokens[:, j], case.vocab_size)
        suffix = f"/row{j}" if case.rows > 1 else ""
        kw = dict(name=f"{case.name}{suffix}", config=config, alpha=alpha)
        if case.index_bins:
            results.append(_index_bin_test(counts, expected[j], case.index_bins, **kw))
        else:
            results.append(stats.chisquare_test(counts, expected[j], **kw))
        if case.tail_tokens is not None:
            results.append(stats.tail_mass_test(counts, expected[j], tail_tokens=np.arange(
                case.tail_tokens.start, case.tail_tokens.stop), name=f"{case.name}{suffix}/tail", config=config, alpha=alpha))
    if case.rows > 1:
        results.append(stats.independence_test(tokens[:, 0], tokens[:, 1], expected[0], expected[1],
                                               name=f"{case.name}/rows0-1-joint", config=config, alpha=alpha))
    return results


# --------------------------------------------------------------------------- runs


@dataclass
class RunOptions:
    quick: bool = True
    device: str = "auto"
    samples: int | None = None
    seed: int = 0
    alpha: float = DEFAULT_ALPHA
    correction: str = "holm"
    calibration: bool = True
    calibration_runs: int | None = None
    power: bool = True
    deep_tail: bool = False
    case_filter: str | None = None
    matrix: bool = True
    biases: tuple[str, ...] | None = None  # planted biases for the power report (None: the mode's plan)
    power_repeats: int | None = None
    max_rows_per_call: int | None = None  # bound on the logit rows of one sampler call (None: the sampler's own or none)
    spec: bool = True  # the speculative-verification cases (`runnercheck.checks.chisq.spec`), with the matrix
    shard: tuple[int, int] = (0, 1)  # (I, N): every N-th matrix case and planted bias from I; spec cases, calibration in I = 0
    # The sampler is third-party code: run it in a child process (`runnercheck.checks.chisq.isolated.Isolation`).
    isolation: Isolation | None = None
    convention: str = "contract"  # `runnercheck.checks.chisq.conventions.CONVENTIONS` name the expected distributions follow


def resolve_device(kind: str) -> torch.device:
    """The shared device rule (`runnercheck.impl.device.resolve_device_kind`: auto is cuda when present, else sim);
    chisq has no host/device races to simulate, so ``sim`` and ``cpu`` both sample on CPU tensors."""
    from runnercheck.impl.device import DeviceError, resolve_device_kind

    try:
        kind = resolve_device_kind(kind)
    except DeviceError as e:
        raise SamplerUnavailableError(f"--device {kind}: {e}") from None
    return torch.device("cuda" if kind == "cuda" else "cpu")


def default_sampler_spec(device: torch.device) -> str:
    """The runner's sampler on a GPU; on CPU the PyTorch baseline (the interpreted kernel samples
    ~50 rows/s, far too slow for ~1e6 draws; ask for it with ``--sampler impl --samples N``)."""
    if device.type == "cuda":
        from runnercheck.checks.chisq.impl_sampler import impl_sampler_available

        if impl_sampler_available():
            return "impl"
    return "gumbel"


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


def zero_cases_reason(matched: int, selected: int, skipped: Sequence[dict], opts: RunOptions) -> str:
    """Why a run whose matrix was asked for tested no case (such a run fails): ``matched`` cases
    met ``--cases``, ``selected`` of them fell to this shard, the rest of those were ``skipped``."""
    which = f"--cases {opts.case_filter}" if opts.case_filter else "the catalogue"
    if matched == 0:
        return f"0 cases matched {which}"
    if selected == 0:
        return f"0 cases ran: shard {opts.shard[0]}/{opts.shard[1]} got none of the {matched} cases of {which}"
    reasons: dict[str, int] = {}
    for s in skipped:
        reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
    if len(reasons) == 1:
        return f"0 cases ran: {len(skipped)} skipped because {next(iter(reasons))}"
    return f"0 cases ran: {len(skipped)} skipped (" + "; ".join(f"{n} because {why}" for why, n in reasons.items()) + ")"


def _share(items: list, shard: tuple[int, int]) -> list:
    """A shard's items in campaign order: every N-th from I (the shards of N jobs partition ``items``)."""
    index, count = shard
    return items[index::count]


def matching_cases(opts: RunOptions) -> list[SamplingCase]:
    """The matrix cases ``opts`` asks for (catalogue, deep tails, ``--cases``), before sharding."""
    cases = build_cases(opts.quick) + (deep_tail_cases() if opts.deep_tail else [])
    if opts.case_filter:
        cases = [c for c in cases if opts.case_filter in c.name]
    return cases


def run_matrix(sampler: Callable, opts: RunOptions, device: torch.device, tick: Callable[[str, int], None]) -> tuple[list, list]:
    return run_cases(sampler, _share(matching_cases(opts), opts.shard), opts, device, tick)


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
    for bias in _share(list(biases if biases is not None else power_plan(opts.quick, device)), opts.shard):
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


def _named(biases: tuple[str, ...] | None, known) -> tuple[str, ...] | None:
    """The asked-for biases that belong to ``known`` (None: each runner's own plan)."""
    return None if biases is None else tuple(b for b in biases if b in known)


def run_all(sampler: Callable, opts: RunOptions, *, show_progress: bool = True,
            keep_partial: bool = False) -> stats.RunSummary:
    """Matrix, then calibration and power as asked; returns the summary the report is written from.

    ``keep_partial``: an interrupt (`KeyboardInterrupt`) ends the run with the phases that finished,
    in a summary marked incomplete, instead of propagating."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from runnercheck.checks.interrupts import CatchInterrupt

    device = resolve_device(opts.device)
    started = time.perf_counter()
    # Each phase's results are bound once it finished: an interrupt keeps exactly the finished ones.
    results, skipped, calibration, power, not_run, builtin = [], [], None, [], None, []
    stopped = CatchInterrupt(enabled=keep_partial)
    with stopped, single_threaded_on_cpu(device), Progress(TextColumn("{task.description:<40}"), BarColumn(), TextColumn("{task.fields[done]:.3g} token-draws"),
                  TimeElapsedColumn(), disable=not show_progress, transient=True) as bar:
        task = bar.add_task("chisq", total=None, done=0.0)

        def tick(label: str, work: int) -> None:
            bar.update(task, description=label, done=bar.tasks[0].fields["done"] + work)

        first_shard = opts.shard[0] == 0
        matched = matching_cases(opts) if opts.matrix else []
        cases = _share(matched, opts.shard)
        # The sampler's units in one go (with isolation: one child for all of them, unless one crashes).
        outcomes = run_units(sampler, [*cases, *([CALIBRATION] if opts.calibration and first_shard else [])],
                             opts, device, tick)
        results, skipped = collect(outcomes[:len(cases)], opts)
        if opts.matrix and opts.spec and first_shard:
            tick("speculative verification", 0)
            builtin = run_spec_cases(default_spec_verifier(device.type), quick=opts.quick, seed=opts.seed,
                                      alpha=opts.alpha, correction=opts.correction, samples=opts.samples,
                                      case_filter=opts.case_filter)
        not_run = zero_cases_reason(len(matched), len(cases), skipped, opts) if opts.matrix and not (results or builtin) else None
        calibration = None
        for unit in outcomes[len(cases):]:
            calibration = unit.calibration
            results += unit.failures
            skipped += [{"case": unit.case, "reason": unit.skipped}] if unit.skipped is not None else []
        power = run_power(opts, device, tick, biases=_named(opts.biases, power_cases())) if opts.power else []
        if opts.power and opts.spec and first_shard:
            power += run_spec_power(quick=opts.quick, seed=opts.seed, alpha=opts.alpha,
                                    repeats=opts.power_repeats or (1 if opts.quick else 5),
                                    biases=_named(opts.biases, SPEC_BIASES))
    # A power-only run draws from the planted samplers alone: do not name a sampler it never ran.
    used = sampler_name(sampler) if opts.matrix or opts.calibration else "none (planted biases only)"
    return stats.RunSummary(
        sampler=used, device=str(device), quick=opts.quick, seed=opts.seed, alpha=opts.alpha,
        correction=opts.correction, tests=results, skipped=skipped, calibration=calibration, power=power,
        elapsed_s=time.perf_counter() - started, shard=None if opts.shard[1] == 1 else "{}/{}".format(*opts.shard),
        interrupted=stopped.note() and f"{stopped.note()}; only the parts that finished are reported",
        not_run=not_run, convention=opts.convention, builtin_tests=builtin,
    )


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small vocabularies and sample counts (CPU CI)")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu", "sim"],
                        help="where to sample (sim samples on CPU: chisq has no host/device races)")
    parser.add_argument("--samples", type=int, default=None, help="draws per case (default: each case's own)")
    parser.add_argument("--sampler", default=None,
                        help="gumbel | torch | impl | bias-<name> (ours) | package.module:function | path/to/file.py:function "
                             "(default: impl on a GPU, else gumbel). A module is looked up on sys.path, then in the working "
                             "folder (appended: an installed module of the same name wins); a file is loaded as it is named. "
                             "A sampler not of ours runs in a child process: a crash or a timeout fails its case with a "
                             "repro command, and the report is still written")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"fail a case (or the calibration) of an isolated sampler that runs longer, killing its "
                             f"process group (default {DEFAULT_TIMEOUT_S:g}; 0: no limit)")
    parser.add_argument("--no-isolation", action="store_true",
                        help="run a third-party sampler in this process (for a debugger): a crash then ends the run "
                             "with no report, and --timeout does not apply")
    from runnercheck.checks.chisq.conventions import CONVENTIONS

    parser.add_argument("--convention", default="contract", choices=list(CONVENTIONS), metavar="NAME",
                        help="the sampling convention the expected distributions follow: " + ", ".join(CONVENTIONS)
                             + " (default contract: docs/SAMPLING.md; docs/CHISQ.md cites each engine's source)")
    parser.add_argument("--seed", type=int, default=0, help="base seed of the draws (each case derives its own from it)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="family-wise level after correction")
    parser.add_argument("--correction", default="holm", choices=list(stats.CORRECTIONS),
                        help="multiple-testing correction over the run's tests")
    parser.add_argument("--no-calibration", action="store_true",
                        help="skip the calibration self-test (the sampler on fresh seeds must reject at the stated rate)")
    parser.add_argument("--no-power", action="store_true", help="skip the power self-test (planted biased samplers must fail)")
    parser.add_argument("--deep-tail", action="store_true", help="add the 2^17-token 25/30-logit tail cases (GPU-sized)")
    parser.add_argument("--cases", default=None,
                        help="only cases whose name contains this (default: every case; matching no case at all is a usage error, status 2; "
                             "a run whose matching cases were all skipped fails, status 1)")
    parser.add_argument("--no-matrix", action="store_true", help="skip the configuration matrix (calibration/power only)")
    parser.add_argument("--no-spec", action="store_true",
                        help="skip the speculative-verification cases and their planted biases (checks/chisq/spec.py)")
    parser.add_argument("--biases", nargs="+", default=None, metavar="BIAS",
                        help="planted biases for the power report (default: those this mode and device can afford)")
    parser.add_argument("--power-repeats", type=int, default=None, help="repeats per planted bias (default 5; quick 1)")
    parser.add_argument("--max-rows-per-call", type=int, default=None, metavar="N",
                        help="hand the sampler at most N logit rows per call (default: the sampler's max_rows_per_call, else unbounded)")
    parser.add_argument("--junit", type=Path, default=None, metavar="FILE",
                        help="also write JUnit XML: one test case per statistical test, calibration and planted bias "
                             "(default: not written)")
    parser.add_argument("--out", required=True, type=Path, help="report folder")


def unmatched_cases(args: argparse.Namespace) -> str | None:
    """A usage error when ``--cases`` matches no case at all (matrix, deep tail or speculative), else None."""
    if args.cases is None or args.no_matrix:
        return None
    opts = RunOptions(quick=args.quick, deep_tail=args.deep_tail, case_filter=args.cases)
    if matching_cases(opts):
        return None
    if not args.no_spec:
        from runnercheck.checks.chisq.spec import build_spec_cases

        if any(args.cases in c.name for c in build_spec_cases(args.quick)):
            return None
    return f"--cases {args.cases!r} matches no case of the {'quick' if args.quick else 'full'} catalogue " \
           "(`runnercheck chisq --help`; docs/CHISQ.md lists them)"


def isolation_for(spec: str, timeout_s: float, in_process: bool) -> Isolation | None:
    """A third-party sampler runs in a child process (`runnercheck.checks.chisq.isolated`); ours in this one.

    Ours (`is_builtin_sampler`) are tested by this project and a spawn on cuda would cost the
    runner's sampler a second CUDA context and its Triton compile; a user's code is what crashes
    or hangs without warning, and its run must still end in a report."""
    if in_process or is_builtin_sampler(spec):
        return None
    from runnercheck.checks.loader import canonical_spec

    return Isolation(canonical_spec(spec, "sampler"), timeout_s or None)


def run(args: argparse.Namespace) -> int:
    from runnercheck.checks.chisq.report import print_summary, write_report
    from runnercheck.checks.report_folder import run_exit_status, write_command_report

    if args.samples is not None and args.samples < 1:
        print("runnercheck chisq: --samples must be >= 1", file=sys.stderr)
        return 2
    if args.power_repeats is not None and args.power_repeats < 1:
        print("runnercheck chisq: --power-repeats must be >= 1", file=sys.stderr)
        return 2
    unknown = sorted(set(args.biases or ()) - set(power_cases()) - set(SPEC_BIASES))
    if unknown:
        print(f"runnercheck chisq: unknown --biases {', '.join(unknown)} (known: {', '.join([*power_cases(), *SPEC_BIASES])})", file=sys.stderr)
        return 2
    if not 0.0 < args.alpha < 1.0:
        print("runnercheck chisq: --alpha must lie in (0, 1)", file=sys.stderr)
        return 2
    if args.junit is not None and args.junit.is_dir():
        print(f"runnercheck chisq: --junit {args.junit} is a directory; name the XML file to write", file=sys.stderr)
        return 2
    if args.max_rows_per_call is not None and args.max_rows_per_call < 1:
        print("runnercheck chisq: --max-rows-per-call must be >= 1", file=sys.stderr)
        return 2
    if args.timeout < 0 or not math.isfinite(args.timeout):
        print("runnercheck chisq: --timeout must be a number of seconds >= 0 (0: no limit)", file=sys.stderr)
        return 2
    no_case = unmatched_cases(args)
    if no_case:
        print(f"runnercheck chisq: {no_case}", file=sys.stderr)
        return 2
    monitor = None
    if getattr(args, "csan", False):  # armed before the sampler allocates: CSAN must see its init writes
        from runnercheck.checks.detectors.csan import CsanMonitor, CsanUnavailableError

        try:
            monitor = CsanMonitor().arm()
        except CsanUnavailableError as e:
            print(f"runnercheck chisq: {e}", file=sys.stderr)
            return 2
    try:
        spec = args.sampler or default_sampler_spec(resolve_device(args.device))
        sampler = load_sampler(spec)
        rows_per_call_bound(sampler, args.max_rows_per_call)
    except (SamplerSpecError, SamplerUnavailableError, SamplerLimitError) as e:
        if monitor is not None:
            monitor.disarm()
        print(f"runnercheck chisq: {e}", file=sys.stderr)
        return 2
    opts = RunOptions(quick=args.quick, device=args.device, samples=args.samples, seed=args.seed, alpha=args.alpha,
                      correction=args.correction, calibration=not args.no_calibration, power=not args.no_power,
                      deep_tail=args.deep_tail, case_filter=args.cases, matrix=not args.no_matrix, spec=not args.no_spec,
                      biases=tuple(args.biases) if args.biases else None, power_repeats=args.power_repeats,
                      max_rows_per_call=args.max_rows_per_call,
                      shard=(args.shard.index, args.shard.count) if getattr(args, "shard", None) else (0, 1),
                      isolation=isolation_for(spec, args.timeout, args.no_isolation), convention=args.convention)
    try:
        summary = run_all(sampler, opts, keep_partial=True)
    finally:
        if monitor is not None:
            monitor.disarm()
    if monitor is not None:
        summary.csan = {"races": monitor.count, "lines": monitor.lines(), "reports": [r.text for r in monitor.races[:3]]}
    written = write_command_report("chisq", args.out, lambda tmp: write_report(tmp, summary),
                                   force=getattr(args, "force", False))
    if written.exit_status is not None:
        return written.exit_status
    if args.junit is not None:
        from runnercheck.checks.chisq.report import write_chisq_junit

        write_chisq_junit(args.junit, summary)
    print_summary(summary, args.out, junit=args.junit)
    return run_exit_status("chisq", args.out, summary.passed, summary.interrupted)


def run_quick(out_dir: str | Path, sampler: Callable | str | None = None, *, seed: int = 0) -> dict[str, Any]:
    """The quick matrix + calibration + power, report written to ``out_dir``; the JSON summary dict."""
    from runnercheck.checks.chisq.report import write_report

    if sampler is None or isinstance(sampler, str):
        sampler = load_sampler(sampler or default_sampler_spec(resolve_device("auto")))
    summary = run_all(sampler, RunOptions(quick=True, seed=seed), show_progress=False)
    write_report(Path(out_dir), summary)
    return summary.to_dict(include_bins=False)
