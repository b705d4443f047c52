"""runnercheck as a pytest plugin: the differential run, the detectors and the sampler chi-square
check as fixtures, for any project that has ``pip install``-ed runnercheck (entry point
``pytest11: runnercheck``; in a checkout without the installed entry point: ``-p runnercheck.stress.pytest_plugin``).

Options (all prefixed, so they never clash with a host project's own):

``--runnercheck-runner package.module:factory``  the runner under test (default the built-in
                                                  ``runnercheck.impl.runner:make_runner``; contract in `runnercheck.stress.run.runners`)
``--runnercheck-device auto|sim|cpu|cuda``        where runs go (auto: cuda when present, else sim)
``--runnercheck-seed N``                          base seed of every run and chi-square draw (default 0)
``--runnercheck-steps N``                         scheduler ticks of a differential run (default 24)
``--runnercheck-report-dir DIR``                  reports and repro files under ``DIR/<test>`` (default: the
                                                  test's ``tmp_path``; chi-square reports only with this option)
``--runnercheck-timeout SECONDS``                 (or ini ``runnercheck_timeout``) limit of a differential run and of
                                                  one chi-square case of a user's sampler (default 600; 0: none)
``--runnercheck-csan``                            PyTorch's CUDA stream sanitizer on for the session, enabled at
                                                  configure time (before any runner is built); needs the device
                                                  to resolve to cuda (``runnercheck.stress.cli.options.resolve_csan``, else a
                                                  usage error).  A differential run records each race as a
                                                  ``csan`` finding; elsewhere CSAN raises at the racing op.

Fixtures:

``runnercheck_runner_factory``   the factory named by ``--runnercheck-runner``
``runnercheck_differential``     ``check(runner=None, *, steps=None, seed=None, model="micro")``: a seeded
                                 churn (adds, aborts, preemptions, drafts) through the runner and the float64
                                 oracle with every detector of `runnercheck.checks.detectors.registry` armed;
                                 fails the test with the first divergence (a repro file is written and named)
                                 or any detector's finding, returns the driver's `RunResult` otherwise
``runnercheck_no_host_sync``     ``with runnercheck_no_host_sync(): ...`` raises `HostSyncError` on any host read
                                 of device data inside (``runnercheck_no_host_sync.allow(name)`` is the legal wait)
``runnercheck_staging_lifetime`` ``watch(runner_or_pool)``: staging-slot lifetime assertions (error mode) until
                                 the test ends
``runnercheck_chisq``            ``check(sampler, cases=None, *, samples=None, ...)``: chi-square tests of a
                                 sampler (a callable or a spec string; `runnercheck.checks.chisq.samplers` contract) against the
                                 exact distributions; fails with every rejection, returns the `RunSummary`
``runnercheck_invariance``       ``check(runner=None, *, seed=None, model="micro", probes=3, ...)``: the same
                                 requests alone and in batches of other sizes and compositions must give
                                 bitwise-equal tokens and logprobs (docs/INVARIANCE.md); fails with every
                                 difference, returns the `InvarianceResult` (runs in the test's process)

The user's runner and sampler run in child processes (`runnercheck.checks.child`): a segfault, an
abort or a hang past the timeout fails that test with the signal or the timeout and a repro, and
the session goes on.

Each check records what it ran as JUnit properties of the test (``pytest --junitxml``): the seed,
the steps and tokens compared, every statistical test and its p-values, every skipped case.
Markers ``gpu`` and ``stress`` are registered unless the host project registers them; when the
plugin owns ``gpu`` it skips those tests without a CUDA device.  Without CUDA, the plugin sets
``TRITON_INTERPRET=1`` (when unset) before any test module imports Triton, so the built-in runner's
kernels run interpreted on CPU, with the interpreter sped up (`runnercheck.impl.kernels.interpreter`;
``RUNNERCHECK_PLAIN_INTERPRETER=1`` leaves it as Triton ships it).  See docs/PLUGIN.md for an
example test file.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

DEFAULT_STEPS = 24
DEFAULT_TIMEOUT_S = 600.0  # `runnercheck.checks.child.DEFAULT_TIMEOUT_S`, spelled here so the plugin imports no torch at load
MARKERS = {
    "gpu": "needs a CUDA device (skipped cleanly without one)",
    "stress": "long stress runs; select with -m stress",
}
_OWNED_MARKERS_KEY = pytest.StashKey[set]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("runnercheck", "runnercheck: differential runs and sampler statistics")
    group.addoption("--runnercheck-runner", default=None, metavar="MODULE:FACTORY",
                    help="runner factory under test (default impl.runner:make_runner, the built-in runner)")
    group.addoption("--runnercheck-device", default="auto", choices=["auto", "sim", "cpu", "cuda"],
                    help="device kind of runs (auto: cuda when present, else sim)")
    group.addoption("--runnercheck-seed", type=int, default=0, help="base seed of runs and chi-square draws")
    group.addoption("--runnercheck-steps", type=int, default=DEFAULT_STEPS, help="scheduler ticks of a differential run")
    group.addoption("--runnercheck-report-dir", default=None, metavar="DIR",
                    help="write each check's report (chi-square JSON/Markdown/HTML, repro.json) under DIR/<test> "
                         "instead of the test's tmp_path (for CI artifacts)")
    group.addoption("--runnercheck-convention", default="contract", metavar="NAME",
                    help="the sampling convention runnercheck_chisq's expected distributions follow "
                         "(runnercheck.checks.chisq.conventions; default contract: docs/SAMPLING.md)")
    group.addoption("--runnercheck-csan", action="store_true", default=False,
                    help="run under PyTorch's CUDA stream sanitizer (needs --runnercheck-device cuda, or auto on a GPU)")
    group.addoption("--runnercheck-timeout", type=float, default=None, metavar="SECONDS",
                    help="a differential run, or one chi-square case of a user's sampler, that runs longer fails its "
                         f"test, its process group killed (default: the runnercheck_timeout ini value, else {DEFAULT_TIMEOUT_S:g}; 0: none)")
    parser.addini("runnercheck_timeout", f"seconds before an isolated run or chi-square case fails (default {DEFAULT_TIMEOUT_S:g}; 0: none)",
                  default=None)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    registered = {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}
    owned = [name for name in MARKERS if name not in registered]
    for name in owned:
        config.addinivalue_line("markers", f"{name}: {MARKERS[name]} [runnercheck]")
    config.stash[_OWNED_MARKERS_KEY] = set(owned)
    _timeout(config)  # a bad --runnercheck-timeout / ini value is a usage error before any test runs
    if config.getoption("runnercheck_device") != "cuda" and "triton" not in sys.modules and not _cuda_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any test module imports the kernels
    from runnercheck.impl.kernels.interpreted_memory import check_interpreted_memory
    from runnercheck.impl.kernels.interpreter import speed_up_interpreter

    speed_up_interpreter()
    check_interpreted_memory()  # an interpreted kernel's stray access is a KernelMemoryError, not a SIGSEGV
    _convention(config)  # an unknown --runnercheck-convention is a usage error too (after TRITON_INTERPRET is set)
    if config.getoption("runnercheck_csan"):
        _enable_csan(config)


def _enable_csan(config: pytest.Config) -> None:
    """``--runnercheck-csan``: the shared rule (cuda only), then CSAN on before any test builds a runner."""
    from runnercheck.checks.detectors.csan import CsanUnavailableError, enable
    from runnercheck.stress.cli.options import CsanDeviceError, resolve_csan

    kind = config.getoption("runnercheck_device")
    if kind == "auto":
        kind = _device_kind(config)
    try:
        resolve_csan(True, kind)
        enable()
    except (CsanDeviceError, CsanUnavailableError) as e:
        raise pytest.UsageError(f"--runnercheck-csan: {e}") from None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "gpu" not in config.stash.get(_OWNED_MARKERS_KEY, set()) or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# --------------------------------------------------------------------------- options -> values


def _device_kind(config: pytest.Config) -> str:
    from runnercheck.impl.device import resolve_device_kind

    kind = config.getoption("runnercheck_device")
    if kind == "auto":
        return resolve_device_kind(kind)
    if kind == "cuda" and not _cuda_available():
        pytest.skip("--runnercheck-device cuda: no CUDA device here")
    return kind


def _convention(config: pytest.Config) -> str:
    """``--runnercheck-convention``: a shipped convention's name (`runnercheck.checks.chisq.conventions`), else a usage error."""
    from runnercheck.checks.chisq.conventions import ConventionError, get_convention

    try:
        return get_convention(config.getoption("runnercheck_convention")).name
    except ConventionError as e:
        raise pytest.UsageError(f"--runnercheck-convention: {e}") from None


def _timeout(config: pytest.Config) -> float | None:
    """``--runnercheck-timeout``, else the ``runnercheck_timeout`` ini value, else the default; 0: None (no limit)."""
    value = config.getoption("runnercheck_timeout")
    source = "--runnercheck-timeout"
    if value is None:
        value, source = config.getini("runnercheck_timeout"), "runnercheck_timeout (ini)"
    if value in (None, ""):
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        raise pytest.UsageError(f"{source}: {value!r} is not a number of seconds") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise pytest.UsageError(f"{source}: {value!r} must be a number of seconds >= 0 (0: no limit)")
    return seconds or None


def _load_factory(spec: str, source: str = "--runnercheck-runner") -> Callable:
    from runnercheck.stress.run.harness import load_runner_factory
    from runnercheck.stress.run.config import RunSetupError

    try:
        return load_runner_factory(spec)
    except RunSetupError as e:
        raise pytest.UsageError(f"{source}: {e}") from None


def _spec_of(fn: Callable) -> str:
    from runnercheck.checks.loader import spec_of

    return spec_of(fn)


def _canonical(spec: str) -> str:
    """``spec`` as a child process loads it (a file spec's path made absolute); as given if it does not parse."""
    from runnercheck.checks.loader import LoaderError, canonical_spec

    try:
        return canonical_spec(spec)
    except LoaderError:
        return spec


@pytest.fixture(scope="session")
def runnercheck_runner_factory(pytestconfig: pytest.Config) -> Callable:
    """The runner factory named by ``--runnercheck-runner`` (default: the built-in runner)."""
    from runnercheck.stress.run.runners import DEFAULT_RUNNER_SPEC

    return _load_factory(_canonical(pytestconfig.getoption("runnercheck_runner") or DEFAULT_RUNNER_SPEC))


def _report_dir(request: pytest.FixtureRequest) -> Path | None:
    """``--runnercheck-report-dir``/<test name as a file name>, created; None without the option."""
    root = request.config.getoption("runnercheck_report_dir")
    if root is None:
        return None
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in request.node.nodeid)
    path = request.config.invocation_params.dir / root / slug  # relative to where pytest was run
    path.mkdir(parents=True, exist_ok=True)
    return path


def _recorder(request: pytest.FixtureRequest) -> Callable[[str, object], None]:
    """Append to the test's ``user_properties`` (what ``--junitxml`` writes as ``<property>``), like
    ``record_property`` but without its warning under the default ``xunit2`` family."""
    return lambda name, value: request.node.user_properties.append((name, value))


# --------------------------------------------------------------------------- the differential run


def checked_differential_run(spec: str, *, kind: str, seed: int, steps: int, model: str, repro_dir: Path,
                             csan: bool = False, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> tuple[Any, list[str]]:
    """The run owner's checked run of a seeded churn, in a child process (`runnercheck.stress.run.isolation`:
    a crash, or a run past ``timeout_s``, is a finding with a repro rather than the end of the session):
    the driver's `RunResult` and the findings as lines; a divergence writes ``repro_dir/repro.json``."""
    from runnercheck.checks.detectors.registry import in_report_order
    from runnercheck.impl.model.weights import preset
    from runnercheck.stress.run.harness import ChurnOps
    from runnercheck.stress.run.isolation import isolated_run
    from runnercheck.stress.run.config import RunConfig, RunSetupError, default_limits
    from runnercheck.stress.sim.scheduler import SchedulerConfig

    model_config = preset(model)
    lag = {"name": "random-drain", "seed": seed} if kind == "sim" else None
    try:
        config = RunConfig(seed, steps, kind, model, model_config, default_limits(model_config), SchedulerConfig(2, 0.2),
                           lag, None, None, spec, csan=csan)
        findings = isolated_run(config, ChurnOps(), name="runnercheck_differential", timeout_s=timeout_s)
    except RunSetupError as e:
        raise pytest.UsageError(f"runnercheck_differential: {e}") from None
    result = findings.result
    lines = [f"first divergence: {findings.first_divergence_line()}"] if findings.diverged else []
    if result.runner_traceback:
        lines.append(result.runner_traceback.rstrip().splitlines()[-1])
    for d in in_report_order(findings.detectors):  # every detector of the registry that found something
        failure = d.failure(findings.detectors[d.name])
        if failure:
            lines.append(f"{d.label}: {failure}")
    if findings.diverged:
        path = findings.repro().save(repro_dir / "repro.json")
        lines.append(f"repro: {path} (runnercheck replay {path})")
    return result, lines


class DifferentialCheck:
    """``check(runner=None, *, steps=None, seed=None, model="micro")`` -> `RunResult`; fails the test on a finding.

    ``runner``: a factory callable or ``package.module:factory`` (default: ``--runnercheck-runner``).
    """

    def __init__(self, request: pytest.FixtureRequest, factory: Callable, record: Callable[[str, object], None]):
        self._request = request
        self._factory = factory
        self._record = record

    def __call__(self, runner: Callable | str | None = None, *, steps: int | None = None, seed: int | None = None,
                 model: str = "micro") -> Any:
        config = self._request.config
        spec = _canonical(runner) if isinstance(runner, str) else _spec_of(runner or self._factory)
        if not isinstance(runner, str) and _load_factory(spec, "runnercheck_differential") is not (runner or self._factory):
            raise pytest.UsageError(f"runnercheck_differential: factory {spec} is not importable by that name; "
                                    "pass it as 'package.module:factory'")
        seed = config.getoption("runnercheck_seed") if seed is None else seed
        source = "--runnercheck-steps" if steps is None else "steps"
        steps = config.getoption("runnercheck_steps") if steps is None else steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:  # checked before any work
            raise pytest.UsageError(f"runnercheck_differential: {source} must be an integer >= 1 "
                                    f"(a run of 0 ticks compares nothing), got {steps!r}")
        kind = _device_kind(config)
        repro_dir = _report_dir(self._request) or self._request.getfixturevalue("tmp_path")
        result, findings = checked_differential_run(spec, kind=kind, seed=seed, steps=steps, model=model, repro_dir=repro_dir,
                                                    csan=bool(config.getoption("runnercheck_csan")), timeout_s=_timeout(config))
        for key, value in (("runner", spec), ("device", kind), ("seed", seed), ("ticks", result.ticks),
                           ("steps_compared", result.steps), ("tokens_compared", result.tokens_compared),
                           ("ties", len(result.ties))):
            self._record(f"runnercheck.differential.{key}", value)
        if findings:
            self._record("runnercheck.differential.finding", findings[0])
            pytest.fail(f"runnercheck differential run ({spec} on {kind}, seed {seed}, {steps} ticks):\n  "
                        + "\n  ".join(findings), pytrace=False)
        return result


@pytest.fixture
def runnercheck_differential(request: pytest.FixtureRequest, runnercheck_runner_factory: Callable) -> DifferentialCheck:
    """A seeded churn through the runner and the float64 oracle, detectors armed (see `DifferentialCheck`)."""
    return DifferentialCheck(request, runnercheck_runner_factory, _recorder(request))


# --------------------------------------------------------------------------- detectors


class NoHostSync:
    """``with scope(): ...`` forbids host reads of device data (`runnercheck.checks.detectors.sync.forbid_host_sync`)."""

    def __init__(self, kind: str | None):
        self.kind = kind

    def __call__(self, device_kind: str | None = None) -> Any:
        from runnercheck.checks.detectors.sync import forbid_host_sync

        return forbid_host_sync(device_kind or self.kind)

    @staticmethod
    def allow(name: str) -> Any:
        """The named legal wait inside a no-sync scope (`runnercheck.checks.detectors.sync.allow_host_sync`)."""
        from runnercheck.checks.detectors.sync import allow_host_sync

        return allow_host_sync(name)


@pytest.fixture
def runnercheck_no_host_sync(pytestconfig: pytest.Config) -> NoHostSync:
    kind = pytestconfig.getoption("runnercheck_device")
    return NoHostSync(None if kind == "auto" else kind)


@pytest.fixture
def runnercheck_staging_lifetime() -> Any:
    """``watch(runner_or_pool, mode="error") -> LifetimeChecker``: detached when the test ends."""
    from runnercheck.checks.detectors.lifetime import LifetimeChecker

    attached: list[tuple[LifetimeChecker, Any]] = []

    def watch(target: Any, mode: str = "error") -> LifetimeChecker:
        pool = getattr(target, "staging", target)
        if not hasattr(pool, "observers"):
            raise TypeError(f"runnercheck_staging_lifetime: {type(target).__name__} is neither a StagingPool "
                            "nor a runner with a .staging pool")
        checker = LifetimeChecker(mode).attach(pool)
        attached.append((checker, pool))
        return checker

    yield watch
    for checker, pool in attached:
        checker.detach(pool)


# --------------------------------------------------------------------------- sampler chi-square


def _select_cases(cases: Any, quick: bool) -> list:
    from runnercheck.checks.chisq.case import SamplingCase
    from runnercheck.checks.chisq.cases import build_cases

    if cases is None or isinstance(cases, str):
        catalogue = build_cases(quick)
        chosen = [c for c in catalogue if cases is None or cases in c.name]
        if not chosen:
            raise pytest.UsageError(f"runnercheck_chisq: no case name contains {cases!r}; "
                                    f"known: {', '.join(c.name for c in catalogue)}")
        return chosen
    cases = list(cases)
    if all(isinstance(c, SamplingCase) for c in cases):
        return cases
    by_name = {c.name: c for c in build_cases(quick)}
    unknown = [c for c in cases if c not in by_name]
    if unknown:
        raise pytest.UsageError(f"runnercheck_chisq: unknown cases {unknown}; known: {', '.join(by_name)}")
    return [by_name[c] for c in cases]


class ChisqCheck:
    """``check(sampler, cases=None, *, samples=None, seed=None, alpha=0.01, max_rows_per_call=None, quick=True)``.

    ``sampler``: a callable, or a spec string as ``runnercheck chisq --sampler`` takes it (a builtin
    name, ``package.module:function`` or ``path/to/file.py:function``).  A sampler that is not one of
    ours runs in a child process (`runnercheck.checks.chisq.isolated`): a crash or a case past
    ``--runnercheck-timeout`` fails the test with the signal or the timeout and a repro command, and
    the session goes on.  ``cases``: None (the quick catalogue), a substring of case names, names, or
    `SamplingCase`s.  Cases the sampler declines are skipped (recorded); any rejection, contract
    violation or crash fails, and so does a check in which no case ran.
    """

    def __init__(self, request: pytest.FixtureRequest, record: Callable[[str, object], None]):
        self._request = request
        self._config = request.config
        self._record = record

    def _sampler(self, sampler: Callable | str, device: Any) -> tuple[Callable, Any]:
        """The callable and its `Isolation` (None for ours); `pytest.fail` for a spec that does not load."""
        from runnercheck.checks.chisq import run as chisq
        from runnercheck.checks.chisq.samplers import SamplerSpecError, SamplerUnavailableError, load_sampler

        if isinstance(sampler, str):
            try:
                fn = load_sampler(sampler)
            except (SamplerSpecError, SamplerUnavailableError) as e:
                pytest.fail(f"runnercheck_chisq: {e}", pytrace=False)
            return fn, chisq.isolation_for(sampler, _timeout(self._config) or 0, False)
        if not callable(sampler):
            pytest.fail(f"runnercheck_chisq: the sampler must be a callable or a spec string, got {type(sampler).__name__}",
                        pytrace=False)
        if _spec_of(sampler).startswith("runnercheck."):  # ours (a file-loaded sampler's spec names its file)
            return sampler, None
        from runnercheck.checks.loader import spec_of

        spec = spec_of(sampler, by_file=True)  # what the repro command (and a spawned child) loads
        named = getattr(sampler, "__qualname__", None)  # a callable object has none: it cannot be loaded by name
        if device.type == "cuda" and not (isinstance(named, str) and named.isidentifier()):
            pytest.fail(f"runnercheck_chisq: sampler {spec} is not a module-level callable, and on cuda it runs in a "
                        "spawned process that loads it by name; define it at module level or pass "
                        "'package.module:function' or 'path/to/file.py:function'", pytrace=False)
        return sampler, chisq.isolation_for(spec, _timeout(self._config) or 0, False)

    def __call__(self, sampler: Callable | str, cases: str | Sequence[Any] | None = None, *, samples: int | None = None,
                 seed: int | None = None, alpha: float = 0.01, max_rows_per_call: int | None = None, quick: bool = True) -> Any:
        import time

        import torch

        from runnercheck.checks.chisq import execute as chisq_execute
        from runnercheck.checks.chisq import plan as chisq_plan
        from runnercheck.checks.chisq import stats
        from runnercheck.checks.chisq.report import SAMPLER_DIED
        from runnercheck.checks.chisq.samplers import sampler_name

        selected = _select_cases(cases, quick)
        seed = self._config.getoption("runnercheck_seed") if seed is None else seed
        device = torch.device("cuda" if _cuda_available() else "cpu")
        fn, isolation = self._sampler(sampler, device)
        convention = _convention(self._config)
        opts = chisq_plan.RunOptions(quick=quick, samples=samples, seed=seed, alpha=alpha, max_rows_per_call=max_rows_per_call,
                                isolation=isolation, convention=convention)
        started = time.perf_counter()
        with chisq_execute.single_threaded_on_cpu(device):
            results, skipped = chisq_execute.run_cases(fn, selected, opts, device)
        summary = stats.RunSummary(sampler=sampler if isinstance(sampler, str) else sampler_name(fn), device=str(device),
                                   quick=quick, seed=seed, alpha=alpha, correction=opts.correction, tests=results,
                                   skipped=skipped, elapsed_s=time.perf_counter() - started,
                                   not_run=None if results else chisq_plan.zero_cases_reason(len(selected), len(selected), skipped, opts),
                                   convention=convention)
        for t in results:
            verdict = "passed" if t.passed else "REJECTED"
            self._record(f"runnercheck.chisq.{t.name}", f"{verdict} ({t.kind}) p={t.p_value:.3g} "
                         f"adjusted={t.adjusted_p_value if t.adjusted_p_value is None else format(t.adjusted_p_value, '.3g')}"
                         + (f" {t.notes}" if t.kind in ("contract", "logprobs") or t.kind in SAMPLER_DIED else ""))
        for s in skipped:
            self._record(f"runnercheck.chisq.skipped.{s['case']}", s["reason"])
        out = _report_dir(self._request)
        if out is not None:
            from runnercheck.checks.chisq.report import write_report

            self._record("runnercheck.chisq.report", str(write_report(out, summary)["html"]))
        failed = summary.failed_tests
        if failed or summary.not_run:
            lines = [f"{t.name}: {t.notes}" if t.kind in ("contract", "logprobs") or t.kind in SAMPLER_DIED else
                     f"{t.name} ({t.kind}): adjusted p = {t.adjusted_p_value:.3g} < {alpha:g}; {t.notes}".rstrip("; ")
                     + (f"\n    {t.diagnosis['verdict']}" if t.diagnosis else "")
                     for t in failed] or [str(summary.not_run)]
            pytest.fail(f"runnercheck chi-square of {summary.sampler} (seed {seed}): {len(failed)} of {len(results)} "
                        "tests rejected\n  " + "\n  ".join(lines), pytrace=False)
        return summary


@pytest.fixture
def runnercheck_chisq(request: pytest.FixtureRequest) -> ChisqCheck:
    """Chi-square tests of a sampler against the exact float64 distributions (see `ChisqCheck`)."""
    return ChisqCheck(request, _recorder(request))


# --------------------------------------------------------------------------- batch invariance


class InvarianceCheck:
    """``check(runner=None, *, seed=None, model="micro", probes=3, max_tokens=6, scenarios=None,
    batch_sizes=None, tolerance=0.0)`` -> `runnercheck.stress.invariance.checker.InvarianceResult`;
    fails the test with every difference (docs/INVARIANCE.md).  ``runner``: a factory callable (used
    as given) or ``package.module:factory`` (default: ``--runnercheck-runner``).  Runs in the test's
    process; with ``--runnercheck-report-dir`` the report's ``summary.json``/``summary.md`` go there.
    """

    def __init__(self, request: pytest.FixtureRequest, factory: Callable, record: Callable[[str, object], None]):
        self._request = request
        self._factory = factory
        self._record = record

    def __call__(self, runner: Callable | str | None = None, *, seed: int | None = None, model: str = "micro",
                 probes: int = 3, max_tokens: int = 6, scenarios: Sequence[str] | None = None,
                 batch_sizes: Sequence[int] | None = None, tolerance: float = 0.0) -> Any:
        from runnercheck.stress.invariance.fixture import FixtureArgumentError, invariance_for_test

        config = self._request.config
        factory = _load_factory(_canonical(runner), "runnercheck_invariance") if isinstance(runner, str) else (runner or self._factory)
        seed = config.getoption("runnercheck_seed") if seed is None else seed
        kind = _device_kind(config)
        name = runner if isinstance(runner, str) else getattr(factory, "__qualname__", repr(factory))
        try:
            result = invariance_for_test(factory, name, kind=kind, seed=seed, model=model, probes=probes,
                                         max_tokens=max_tokens, scenarios=scenarios, batch_sizes=batch_sizes,
                                         tolerance=tolerance, report_dir=_report_dir(self._request))
        except FixtureArgumentError as e:
            raise pytest.UsageError(f"runnercheck_invariance: {e}") from None
        for key, value in (("runner", name), ("device", kind), ("seed", seed), ("scenarios", len(result.scenarios)),
                           ("differences", len(result.differences))):
            self._record(f"runnercheck.invariance.{key}", value)
        lines = result.failure_lines()
        if lines:
            self._record("runnercheck.invariance.first_difference", lines[0])
            pytest.fail(f"runnercheck invariance ({name} on {kind}, seed {seed}): output depends on the batch:\n  "
                        + "\n  ".join(lines), pytrace=False)
        return result


@pytest.fixture
def runnercheck_invariance(request: pytest.FixtureRequest, runnercheck_runner_factory: Callable) -> InvarianceCheck:
    """The same requests alone and in batches must give bitwise-equal tokens and logprobs (see `InvarianceCheck`)."""
    return InvarianceCheck(request, runnercheck_runner_factory, _recorder(request))
