"""The result records of `runnercheck.checks.chisq.stats` and `runnercheck.checks.chisq.execute`: one test, a calibration, a power
estimate and a whole run, each with the ``to_dict`` the JSON report is written from."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


def finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


@dataclass(frozen=True)
class BinCount:
    """One bin of a test: the tokens in it (first few, for the report), observed and expected counts."""

    label: str
    observed: int
    expected: float
    num_tokens: int = 1
    token_ids: tuple[int, ...] = ()


@dataclass
class TestResult:
    """One statistical test of one configuration.

    ``passed`` is decided after multiple-testing correction (`apply_correction`); before that it is
    the uncorrected decision at the alpha given to the test.  ``impossible_tokens`` lists sampled
    tokens whose expected probability is 0 (first few), which force ``p_value = 0``.
    """

    name: str
    kind: str
    config: dict[str, Any]
    statistic: float
    dof: int
    p_value: float
    n_samples: int
    bins: list[BinCount] = field(default_factory=list)
    adjusted_p_value: float | None = None
    passed: bool = True
    impossible_tokens: tuple[int, ...] = ()
    notes: str = ""
    elapsed_s: float = 0.0  # this test's share of its case's wall time (`share_wall_time`)
    diagnosis: dict[str, Any] | None = None  # a failed row test: `runnercheck.checks.chisq.diagnosis.diagnose`

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "config": self.config,
            "statistic": finite_or_none(self.statistic),
            "dof": self.dof,
            "p_value": self.p_value,
            "adjusted_p_value": self.adjusted_p_value,
            "n_samples": self.n_samples,
            "passed": self.passed,
            "impossible_tokens": list(self.impossible_tokens),
            "notes": self.notes,
            "elapsed_s": self.elapsed_s,
            "diagnosis": self.diagnosis,
            "bins": [
                {"label": b.label, "observed": b.observed, "expected": b.expected, "num_tokens": b.num_tokens}
                for b in self.bins
            ],
        }


@dataclass
class CalibrationResult:
    """A correct sampler run ``runs`` times on fresh seeds: how often the test rejected at ``alpha``.

    Passes when the rejection count lies inside the ``coverage`` binomial band of Bin(runs, alpha).
    ``ks_p_value`` (Kolmogorov-Smirnov of the p-values against U(0, 1)) is reported, not gated:
    pooled chi-square p-values are only approximately uniform.
    """

    config_name: str
    sampler: str
    runs: int
    alpha: float
    rejections: int
    band: tuple[int, int]
    coverage: float
    p_values: list[float]
    ks_p_value: float
    passed: bool
    elapsed_s: float = 0.0  # wall time of every calibration run

    @property
    def rejection_rate(self) -> float:
        return self.rejections / self.runs if self.runs else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config_name,
            "sampler": self.sampler,
            "runs": self.runs,
            "alpha": self.alpha,
            "rejections": self.rejections,
            "rejection_rate": self.rejection_rate,
            "band": list(self.band),
            "coverage": self.coverage,
            "ks_p_value": self.ks_p_value,
            "passed": self.passed,
            "p_values": self.p_values,
            "elapsed_s": self.elapsed_s,
        }


@dataclass
class PowerResult:
    """A planted-bias sampler run ``repeats`` times on the configuration built to expose it."""

    bias: str
    config_name: str
    repeats: int
    rejections: int
    alpha: float
    required_power: float
    min_p_values: list[float]
    description: str = ""
    elapsed_s: float = 0.0  # wall time of every repeat

    @property
    def power(self) -> float:
        return self.rejections / self.repeats if self.repeats else math.nan

    @property
    def passed(self) -> bool:
        return self.repeats > 0 and self.power >= self.required_power

    def to_dict(self) -> dict[str, Any]:
        return {
            "bias": self.bias,
            "config": self.config_name,
            "description": self.description,
            "repeats": self.repeats,
            "rejections": self.rejections,
            "power": self.power,
            "alpha": self.alpha,
            "required_power": self.required_power,
            "passed": self.passed,
            "min_p_values": self.min_p_values,
            "elapsed_s": self.elapsed_s,
        }


def share_wall_time(results: list[TestResult], seconds: float) -> None:
    """Give each test of one case an equal share of the case's wall time: its draws serve every one
    of them, and the shares add up to the case's time (a JUnit suite sums its cases)."""
    for r in results:
        r.elapsed_s = seconds / len(results)


@dataclass
class RunSummary:
    """Everything one `runnercheck chisq` run decided; what the report files are written from."""

    sampler: str
    device: str
    quick: bool
    seed: int
    alpha: float
    correction: str
    tests: list[TestResult]
    skipped: list[dict[str, str]] = field(default_factory=list)
    calibration: CalibrationResult | None = None
    power: list[PowerResult] = field(default_factory=list)
    elapsed_s: float = 0.0
    csan: dict[str, Any] | None = None  # ``--csan``: {"races": n, "lines": [...], "reports": [...]} (`runnercheck.checks.detectors.csan`)
    shard: str | None = None  # ``--shard I/N``: this job's share of the campaign (None: the whole campaign)
    interrupted: str | None = None  # where an interrupted run stopped; its report is incomplete and never passes
    not_run: str | None = None  # why the matrix, asked for, tested no case at all (the run then fails)
    convention: str = "contract"  # the sampling convention the expected distributions follow (`conventions`)
    # Tests that ran on the built-in speculative verifier, not on the sampler under test: reported in their own
    # section and never counted as the sampler's result (a failure still fails the run: it is ours).
    builtin_tests: list[TestResult] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "complete" if self.interrupted is None else "incomplete"

    @property
    def failed_tests(self) -> list[TestResult]:
        return [t for t in self.tests if not t.passed]

    @property
    def passed(self) -> bool:
        return (
            bool(self.tests or self.calibration is not None or self.power)  # a run that tested something
            and self.interrupted is None
            and self.not_run is None
            and not self.failed_tests
            and all(t.passed for t in self.builtin_tests)
            and (self.calibration is None or self.calibration.passed)
            and all(p.passed for p in self.power)
            and not (self.csan or {}).get("races")
        )

    def to_dict(self, include_bins: bool = True) -> dict[str, Any]:
        tests = [t.to_dict() for t in self.tests]
        if not include_bins:
            for t in tests:
                t.pop("bins")
        return {
            "sampler": self.sampler,
            "device": self.device,
            "quick": self.quick,
            "seed": self.seed,
            "alpha": self.alpha,
            "correction": self.correction,
            "status": self.status,
            "interrupted": self.interrupted,
            "passed": self.passed,
            "num_tests": len(self.tests),
            "num_failed": len(self.failed_tests),
            "elapsed_s": self.elapsed_s,
            "tests": tests,
            "convention": self.convention,
            "builtin_tests": [t.to_dict() for t in self.builtin_tests],
            "skipped": self.skipped,
            "calibration": self.calibration.to_dict() if self.calibration else None,
            "power": [p.to_dict() for p in self.power],
            "csan": self.csan,
            "shard": self.shard,
            "not_run": self.not_run,
        }
