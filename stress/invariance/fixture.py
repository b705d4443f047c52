"""The body of the pytest fixture ``runnercheck_invariance`` (`runnercheck.stress.pytest_plugin`): the
check for one test, with the plugin's options already resolved.  Kept here so the plugin module
only wires options to checks."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from runnercheck.stress.invariance.checker import InvarianceConfig, InvarianceResult, check_invariance
from runnercheck.stress.invariance.report import build_summary, write_report
from runnercheck.stress.invariance.scenarios import SCENARIO_KINDS


class FixtureArgumentError(ValueError):
    """A fixture argument that names no model preset or scenario kind (the plugin makes it a usage error)."""


def invariance_for_test(factory: Callable, name: str, *, kind: str, seed: int, model: str, probes: int, max_tokens: int,
                        scenarios: Sequence[str] | None, batch_sizes: Sequence[int] | None, tolerance: float,
                        report_dir: Path | None) -> InvarianceResult:
    """Run the check as the fixture's arguments ask; the report goes to ``report_dir`` when given."""
    from runnercheck.impl.model.weights import WeightsError, preset
    from runnercheck.stress.run.config import default_limits

    kinds = tuple(scenarios) if scenarios is not None else SCENARIO_KINDS
    unknown = sorted(set(kinds) - set(SCENARIO_KINDS))
    if unknown or not kinds:
        raise FixtureArgumentError(f"unknown scenario kinds {unknown} (known: {', '.join(SCENARIO_KINDS)})")
    try:
        model_config = preset(model)
    except WeightsError as e:
        raise FixtureArgumentError(str(e)) from None
    config = InvarianceConfig(kind, seed, model_config, default_limits(model_config, num_kv_blocks=64), num_probes=probes,
                              max_tokens=max_tokens, batch_sizes=tuple(batch_sizes) if batch_sizes else None,
                              kinds=kinds, tolerance=tolerance)
    result = check_invariance(factory, config, runner_name=name)
    if report_dir is not None:
        write_report(report_dir, build_summary(result))
    return result


__all__ = ["invariance_for_test", "FixtureArgumentError"]
