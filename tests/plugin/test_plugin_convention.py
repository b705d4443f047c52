"""``--runnercheck-convention NAME``: the runnercheck_chisq fixture tests against that convention's distributions,
a failure names the convention the draws fit, and an unknown name is a usage error listing the names."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
REPO = Path(__file__).resolve().parents[2]
PLUGIN = "runnercheck.stress.pytest_plugin"
USER_TEST = """
def test_baseline_sampler(runnercheck_chisq):
    runnercheck_chisq("gumbel", cases=["bind-p-slack-minp-t0.6-v32"])
"""


@pytest.fixture
def user_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(test_user=USER_TEST)
    return pytester


def test_the_convention_option_reaches_the_fixture(user_project: pytest.Pytester) -> None:
    result = user_project.runpytest_subprocess("-p", PLUGIN, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result = user_project.runpytest_subprocess("-p", PLUGIN, "-p", "no:cacheprovider", "--runnercheck-convention",
                                               "transformers")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*transformers keeps 12 tokens*draws fit contract*"])


def test_an_unknown_convention_is_a_usage_error(user_project: pytest.Pytester) -> None:
    result = user_project.runpytest_subprocess("-p", PLUGIN, "-p", "no:cacheprovider", "--runnercheck-convention", "hf")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--runnercheck-convention: unknown convention 'hf'; known: contract, vllm-v1*"])
