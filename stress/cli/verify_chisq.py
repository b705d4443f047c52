"""The sampler statistics section of `runnercheck verify` (``summary.json``'s ``chisq``).

`run_statistics` runs the chi-square statistics on the sampler(s) the device calls for and
returns one entry per sampler, each naming it (``sampler``, ``role``, ``scope``) with its verdict,
so a reader of the summary can tell the runner's kernel from the PyTorch baseline.  Plain host
data only; the report files of each run are written by `runnercheck.checks.chisq.report` into ``DIR/chisq`` and
``DIR/chisq-runner``.
"""
from __future__ import annotations

import math
import time
import traceback
from pathlib import Path
from typing import Any, Callable

RUNNER_SAMPLER = "impl"
BASELINE_SAMPLER = "gumbel"
SAMPLER_ROLES = {
    RUNNER_SAMPLER: "the runner's sampler (impl.sample)",
    BASELINE_SAMPLER: "PyTorch baseline, same RNG, not the runner's kernel",
}


def run_statistics(out_dir: Path, skip: bool = False, seed: int = 0, *, device: str | None = None,
                   runner_sampler: Callable | str = RUNNER_SAMPLER) -> dict:
    """The sampler statistics section, one entry per sampler it ran on (``samplers``).

    ``device`` (default: cuda when a GPU is present, else cpu) decides the plan:

    * cuda: the quick matrix + calibration + power (`runnercheck.checks.chisq.run.run_quick`) on the runner's
      sampler, in ``DIR/chisq``;
    * cpu / sim: the quick matrix on the PyTorch baseline in ``DIR/chisq`` (the interpreted kernel
      is far too slow for it), *and* the fixed `runnercheck.checks.chisq.cases.runner_sampler_cases` on the
      runner's sampler, interpreted, in ``DIR/chisq-runner`` (~20 s of CPU: measured 21.5 s CPU,
      59 s wall on the 2-core dev box at load average 8.6).

    The section passes when every sampler's statistics that ran passed; one that is not available
    (e.g. ``runnercheck.impl.sample`` not importable) is named as such and does not fail the job; an error does.
    """
    if skip:
        return {"status": "skipped", "passed": None, "note": "--skip-chisq", "samplers": []}
    import importlib

    try:
        chisq = importlib.import_module("runnercheck.checks.chisq.run")
    except ImportError as e:
        return {"status": "not available", "passed": None, "note": f"checks.chisq does not import ({e})", "samplers": []}
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        entries = [_run_quick_matrix(chisq, out_dir, seed, runner_sampler, "runner")]
    else:
        entries = [_run_quick_matrix(chisq, out_dir, seed, BASELINE_SAMPLER, "baseline"),
                   _run_runner_cases(out_dir, seed, runner_sampler)]
    ran = [e for e in entries if e["status"] in ("ran", "error")]
    if not ran:
        return {"status": "not available", "passed": None, "samplers": entries,
                "note": "; ".join(f"{e['sampler']}: {e.get('note', '')}" for e in entries)}
    passed = all(e["passed"] is True for e in ran)
    section = {"status": "ran" if any(e["status"] == "ran" for e in entries) else "error", "passed": passed,
               "samplers": entries, "summary": "; ".join(_entry_summary(e) for e in entries)}
    if "folder" in entries[0]:
        section["folder"] = entries[0]["folder"]
    if section["status"] == "error":
        section["note"] = "; ".join(e.get("note", "") for e in entries if e["status"] == "error")
    return section


def _entry_summary(entry: dict) -> str:
    verdict = {"ran": "passed" if entry["passed"] else "FAILED", "error": "error", "not available": "not available"}[entry["status"]]
    detail = entry.get("summary") or entry.get("note") or ""
    return f"{entry['sampler']} ({entry['role']}, {entry['scope']}): {verdict}" + (f", {detail}" if detail else "")


def _entry(sampler: str, role: str, scope: str) -> dict:
    return {"sampler": sampler, "role": SAMPLER_ROLES.get(sampler, role), "scope": scope}


def _sampler_label(sampler: Callable | str) -> str:
    if isinstance(sampler, str):
        return sampler
    from runnercheck.checks.chisq.samplers import sampler_name

    return sampler_name(sampler)


def _run_quick_matrix(chisq: Any, out_dir: Path, seed: int, sampler: Callable | str, role: str) -> dict:
    import inspect

    entry = _entry(_sampler_label(sampler), role, "quick matrix, calibration, power")
    run_quick = getattr(chisq, "run_quick", None)
    if not callable(run_quick):
        return dict(entry, status="not available", passed=None, note="runnercheck.checks.chisq.run has no run_quick")
    kwargs = {"seed": seed} if "seed" in inspect.signature(run_quick).parameters else {}
    try:
        result = run_quick(out_dir / "chisq", sampler=sampler, **kwargs)
    except Exception as e:
        return dict(entry, status="error", passed=False, note=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=8))
    if not isinstance(result, dict) or not isinstance(result.get("passed"), bool):
        return dict(entry, status="error", passed=False, note="run_quick did not return a dict with a boolean 'passed'",
                    result=_json_safe(result))
    return dict(entry, status="ran", passed=result["passed"], summary=_result_summary(result),
                result=_json_safe(result), folder=str(out_dir / "chisq"))


def _result_summary(result: dict) -> str:
    if isinstance(result.get("summary"), str):
        return result["summary"]
    parts = []
    if "num_tests" in result:
        parts.append(f"{result.get('num_failed', '?')} of {result['num_tests']} tests failed")
    calibration = result.get("calibration")
    if isinstance(calibration, dict) and "rejections" in calibration:
        parts.append(f"calibration {calibration['rejections']} of {calibration.get('runs', '?')} rejected "
                     f"({'in' if calibration.get('passed') else 'OUT OF'} band)")
    power = result.get("power")
    if isinstance(power, list) and power:
        parts.append(f"{sum(bool(p.get('passed')) for p in power)} of {len(power)} planted biases rejected")
    return ", ".join(parts)


def _run_runner_cases(out_dir: Path, seed: int, sampler: Callable | str) -> dict:
    """`runnercheck.checks.chisq.cases.runner_sampler_cases` on ``sampler`` on CPU, one Holm family, report in DIR/chisq-runner."""
    import torch

    try:
        from runnercheck.checks.chisq import stats
        from runnercheck.checks.chisq.cases import case_seed as seed_of, runner_sampler_cases
        from runnercheck.checks.chisq.draws import draw, evaluate, expected_rows
        from runnercheck.checks.chisq.plan import DEFAULT_ALPHA
        from runnercheck.checks.chisq.report import write_report as write_chisq_report
        from runnercheck.checks.chisq.samplers import SamplerSpecError, SamplerUnavailableError, load_sampler, sampler_name
    except ImportError as e:
        return dict(_entry(_sampler_label(sampler), "runner", "runner cases"), status="not available", passed=None,
                    note=f"the chi-square pieces do not import ({e})")
    cases = runner_sampler_cases()
    entry = _entry(_sampler_label(sampler), "runner", f"{len(cases)} cases x {cases[0].n_samples} draws, interpreted")
    try:
        fn = load_sampler(sampler) if isinstance(sampler, str) else sampler
    except (SamplerSpecError, SamplerUnavailableError) as e:
        return dict(entry, status="not available", passed=None, note=str(e))
    from runnercheck.checks.chisq.impl_sampler import impl_sampler_available

    if sampler == RUNNER_SAMPLER and not impl_sampler_available():
        return dict(entry, status="not available", passed=None, note="runnercheck.impl.sample cannot be imported")
    alpha = DEFAULT_ALPHA
    started = time.perf_counter()
    cpu = torch.device("cpu")
    try:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # small ops on a shared box: one thread is faster (checks.chisq)
        try:
            results = []
            for case in cases:
                case_seed, offset = seed_of(seed, case.name)
                tokens = draw(fn, case, seed=case_seed, position_offset=offset, device=cpu)
                results += evaluate(case, tokens, expected_rows(case), alpha)
        finally:
            torch.set_num_threads(threads)
        stats.apply_correction(results, "holm", alpha)
        summary = stats.RunSummary(sampler=sampler_name(fn), device="cpu", quick=True, seed=seed, alpha=alpha,
                                   correction="holm", tests=results, elapsed_s=time.perf_counter() - started)
        write_chisq_report(out_dir / "chisq-runner", summary)
    except Exception as e:
        return dict(entry, status="error", passed=False, note=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=8))
    result = summary.to_dict(include_bins=False)
    return dict(entry, status="ran", passed=summary.passed, summary=_result_summary(result) + f", {summary.elapsed_s:.0f} s",
                result=_json_safe(result), folder=str(out_dir / "chisq-runner"))


def _json_safe(value: Any) -> Any:
    """JSON-able copy: non-finite floats and unknown objects become strings (summary.json forbids NaN)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)
