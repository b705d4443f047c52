"""The pytest plugin (`runnercheck.stress.pytest_plugin`) as another project uses it.

Every test runs pytest in a subprocess on a fresh rootdir (`pytester`): no conftest of this
repository, plugin autoload off, the plugin loaded with ``-p`` exactly as its ``pytest11`` entry
point would.  The user test file is docs/examples/test_runnercheck_plugin.py (shown in
docs/PLUGIN.md): the built-in runner against the oracle, and a user-written PyTorch sampler by
chi-square.  Planted bugs (in the user's sampler, in a
user runner, in host-sync and staging code) must fail the user's tests with a named finding.
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]
PLUGIN = "runnercheck.stress.pytest_plugin"

EXAMPLE = REPO / "docs" / "examples" / "test_runnercheck_plugin.py"
USER_TESTS = EXAMPLE.read_text()
# The planted bug: the temperature applied twice (T^2), a classic slip when scaling is refactored.
BUGGY_SAMPLER = USER_TESTS.replace("logits / temperature.clamp(min=1e-6)", "logits / temperature.clamp(min=1e-6) ** 2")


@pytest.fixture
def user_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the plugin must set it itself
    return pytester


def _run(p: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, ET.Element]]:
    junit = p.path / "junit.xml"
    result = p.runpytest_subprocess("-p", PLUGIN, "-p", "no:cacheprovider", f"--junitxml={junit}", *args)
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")} if junit.exists() else {}
    return result, cases


def _props(case: ET.Element) -> dict[str, str]:
    return {p.get("name"): p.get("value") for p in case.iter("property")}


def test_user_file_checks_builtin_runner_and_own_sampler_with_junit(user_project: pytest.Pytester) -> None:
    user_project.makepyfile(test_user=USER_TESTS)
    result, cases = _run(user_project)
    result.assert_outcomes(passed=2)
    assert set(cases) == {"test_builtin_runner_matches_the_oracle", "test_my_sampler_by_chi_square"}
    diff = _props(cases["test_builtin_runner_matches_the_oracle"])
    assert diff["runnercheck.differential.runner"] == "runnercheck.impl.runner:make_runner"
    assert diff["runnercheck.differential.device"] == "sim" and int(diff["runnercheck.differential.tokens_compared"]) > 0
    chi = _props(cases["test_my_sampler_by_chi_square"])
    for name in ("temperature-0.5-v97", "greedy-v97", "top-k-10-v97"):
        assert chi[f"runnercheck.chisq.{name}"].startswith("passed (chisq)")
    assert "no support for top_p" in chi["runnercheck.chisq.skipped.top-p-v97"]


def test_planted_bug_in_the_users_sampler_fails_its_check(user_project: pytest.Pytester) -> None:
    assert BUGGY_SAMPLER != USER_TESTS
    user_project.makepyfile(test_user=BUGGY_SAMPLER)
    result, cases = _run(user_project, "-k", "chi_square", "--runnercheck-report-dir", "reports")
    result.assert_outcomes(failed=1, deselected=1)
    report = Path(_props(cases["test_my_sampler_by_chi_square"])["runnercheck.chisq.report"])
    assert report.name == "report.html" and report.exists() and (report.parent / "chisq.json").exists()
    assert report.parent.parent == user_project.path / "reports"
    failure = cases["test_my_sampler_by_chi_square"].find("failure")
    assert failure is not None and "temperature-0.5-v97 (chisq): adjusted p = 0" in failure.get("message") + failure.text
    assert "REJECTED" in _props(cases["test_my_sampler_by_chi_square"])["runnercheck.chisq.temperature-0.5-v97"]
    result.stdout.no_fnmatch_line("*Traceback*")


BUGGY_RUNNER = '''
import runnercheck.stress.run.runners as runners


def off_by_one_runner(weights, limits, device, base_seed):
    """The simple runner with a planted sampling bug: every sampled token shifted by one."""
    runner = runners.simple_runner(weights, limits, device, base_seed)
    step = runner._step_request

    def shifted(state, n, drafts):
        toks, lps, flag, plps = step(state, n, drafts)
        if toks:
            state.tokens[-len(toks):] = [(t + 1) % limits.vocab_size for t in toks]
            toks = state.tokens[-len(toks):]
        return toks, lps, flag, plps

    runner._step_request = shifted
    return runner
'''


def test_runner_option_and_a_planted_runner_bug_fails_with_divergence_and_repro(user_project: pytest.Pytester) -> None:
    user_project.makepyfile(my_runner=BUGGY_RUNNER, test_runner="""
        def test_runner(runnercheck_differential):
            runnercheck_differential(steps=12)

        def test_simple_runner_is_fine(runnercheck_differential):
            runnercheck_differential("runnercheck.stress.run.runners:simple_runner", steps=12)
    """)
    user_project.syspathinsert()
    result, cases = _run(user_project, "--runnercheck-runner", "my_runner:off_by_one_runner",
                         "--runnercheck-seed", "3")
    result.assert_outcomes(failed=1, passed=1)
    failure = cases["test_runner"].find("failure")
    message = failure.get("message") + (failure.text or "")
    assert "my_runner:off_by_one_runner on sim, seed 3" in message and "first divergence: step" in message
    repro = message.split("repro: ")[1].split(" ")[0]
    assert Path(repro).exists() and '"runner": "my_runner:off_by_one_runner"' in Path(repro).read_text()


def test_bad_runner_spec_is_a_usage_error(user_project: pytest.Pytester) -> None:
    user_project.makepyfile(test_x="def test_x(runnercheck_differential):\n    runnercheck_differential()\n")
    result = user_project.runpytest_subprocess("-p", PLUGIN, "--runnercheck-runner", "no_such_mod:factory")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*--runnercheck-runner*no_such_mod*"])


def test_zero_steps_is_a_usage_error_not_a_passing_run(user_project: pytest.Pytester) -> None:
    user_project.makepyfile(test_x="def test_explicit(runnercheck_differential):\n    runnercheck_differential(steps=0)\n\n"
                                   "def test_from_the_option(runnercheck_differential):\n    runnercheck_differential()\n")
    result = user_project.runpytest_subprocess("-p", PLUGIN, "-p", "no:cacheprovider", "--runnercheck-steps", "0")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*UsageError: runnercheck_differential: steps must be an integer >= 1*got 0*"])
    result.stdout.fnmatch_lines(["*UsageError: runnercheck_differential: --runnercheck-steps must be an integer >= 1*"])


def test_csan_option_off_cuda_is_a_usage_error_before_any_test(user_project: pytest.Pytester) -> None:
    user_project.makepyfile(test_x="def test_x(runnercheck_differential):\n    runnercheck_differential()\n")
    result = user_project.runpytest_subprocess("-p", PLUGIN, "--runnercheck-csan", "--runnercheck-device", "sim")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--runnercheck-csan: --csan needs --device cuda*"])
    result.stdout.no_fnmatch_line("*test_x*PASSED*")


def test_detector_fixtures_catch_planted_bugs(user_project: pytest.Pytester) -> None:
    user_project.makepyfile(test_detectors="""
        import pytest
        import torch
        from runnercheck.checks.detectors.sync import HostSyncError
        from runnercheck.impl.buffers import StagingLifetimeError, StagingPool
        from runnercheck.impl.device import Device

        def test_host_read_in_scope_is_caught(runnercheck_no_host_sync):
            dev = Device("sim", seed=0)
            t = dev.zeros(4, torch.int64)
            with runnercheck_no_host_sync("sim"):
                with runnercheck_no_host_sync.allow("the one legal wait"):
                    t.sum().item()
                with pytest.raises(HostSyncError, match="item"):
                    t.sum().item()

        def test_write_after_submit_is_caught(runnercheck_staging_lifetime):
            dev = Device("sim", seed=0, lag_policy="lag-2-steps")
            pool = StagingPool(dev, num_slots=3, capacity_bytes=512)
            runnercheck_staging_lifetime(pool)
            slot = pool.acquire(step=1)
            host, _ = slot.alloc(4, torch.int64)
            pool.submit(slot)
            host[0] = 99
            with pytest.raises(StagingLifetimeError, match="write after submit"):
                for _ in range(4):
                    dev.begin_step()
                    pool.retire_completed()

        @pytest.mark.gpu
        def test_needs_gpu():
            raise AssertionError("must be skipped without CUDA")

        @pytest.mark.stress
        def test_marked_stress():
            pass
    """)
    result, _ = _run(user_project, "--strict-markers", "-rs")
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA device*"])


def test_markers_registered_only_when_the_host_has_not(user_project: pytest.Pytester) -> None:
    result = user_project.runpytest_subprocess("-p", PLUGIN, "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.gpu: needs a CUDA device*runnercheck?", "@pytest.mark.stress:*runnercheck?"])
    user_project.makeini("[pytest]\nmarkers =\n    gpu: the host project's own gpu marker\n")
    user_project.makepyfile(test_gpu="import pytest\n\n@pytest.mark.gpu\ndef test_mine():\n    pass\n")
    result = user_project.runpytest_subprocess("-p", PLUGIN, "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.gpu: the host project's own gpu marker"])
    result.stdout.no_fnmatch_line("@pytest.mark.gpu: needs a CUDA device*")
    result = user_project.runpytest_subprocess("-p", PLUGIN, "--strict-markers")
    result.assert_outcomes(passed=1)  # the host owns `gpu`: the plugin does not skip its tests


def test_docs_show_the_tested_example() -> None:
    doc = (REPO / "docs" / "PLUGIN.md").read_text()
    shown = doc.split("```python\n")[1].split("```")[0]
    assert shown.strip() in USER_TESTS and len(shown.strip().splitlines()) >= 20


USER_SAMPLERS = '''
import ctypes
import time

from runnercheck.checks.chisq.samplers import GumbelSampler

_gumbel = GumbelSampler()


def good(logits, params, seeds, positions):
    return _gumbel(logits, params, seeds, positions)


def temperature_only(logits, params, seeds, positions):
    return _gumbel(logits, params, seeds, positions)


temperature_only.supported_params = {"temperature"}


def segfaults(logits, params, seeds, positions):
    ctypes.string_at(0)  # a read of address 0: SIGSEGV


def hangs(logits, params, seeds, positions):
    while True:
        time.sleep(1)
'''

HANGING_RUNNER = '''
import time

import runnercheck.stress.run.runners as runners


def hanging_runner(weights, limits, device, base_seed):
    """The simple runner, stuck forever in its third step."""
    runner = runners.simple_runner(weights, limits, device, base_seed)
    execute = runner.execute_model

    def execute_model(sched):
        if sched.step_id == 2:
            while True:
                time.sleep(1)
        return execute(sched)

    runner.execute_model = execute_model
    return runner
'''


def test_crashing_and_hanging_user_code_fails_its_test_and_the_session_goes_on(user_project: pytest.Pytester) -> None:
    """A segfaulting sampler, a hanging sampler and a hanging runner each fail their own test with the
    signal or the timeout; the spec-string samplers pass, a check with every case skipped fails with
    the reason, and junit.xml is written."""
    user_project.makeini("[pytest]\nrunnercheck_timeout = 4\n")
    user_project.mkpydir("lib")
    (user_project.path / "lib" / "user_samplers.py").write_text(USER_SAMPLERS)
    (user_project.path / "my_samplers.py").write_text(USER_SAMPLERS)
    (user_project.path / "my_runner.py").write_text(HANGING_RUNNER)
    user_project.makepyfile(test_user_code="""
        import sys

        sys.path.insert(0, "lib")
        import user_samplers

        CASE = dict(cases=["temperature-0.5-v97"], samples=300)

        def test_segfaulting_sampler(runnercheck_chisq):
            runnercheck_chisq(user_samplers.segfaults, **CASE)

        def test_hanging_sampler(runnercheck_chisq):
            runnercheck_chisq(user_samplers.hangs, **CASE)

        def test_file_spec_string(runnercheck_chisq):
            runnercheck_chisq("./lib/user_samplers.py:good", **CASE)

        def test_module_spec_string_from_the_working_folder(runnercheck_chisq):
            runnercheck_chisq("my_samplers:good", **CASE)

        def test_every_case_skipped(runnercheck_chisq):
            runnercheck_chisq(user_samplers.temperature_only, cases=["top-k-10-v97"], samples=300)

        def test_hanging_runner(runnercheck_differential):
            runnercheck_differential("my_runner:hanging_runner", steps=6)
    """)
    result, cases = _run(user_project, "--runnercheck-timeout", "4")
    result.assert_outcomes(failed=4, passed=2)
    assert set(cases) >= {"test_file_spec_string", "test_module_spec_string_from_the_working_folder"}

    def failure(name: str) -> str:
        element = cases[name].find("failure")
        return element.get("message") + (element.text or "")

    crash = failure("test_segfaulting_sampler")
    assert "temperature-0.5-v97/crash: sampler killed by signal SIGSEGV in temperature-0.5-v97" in crash
    assert "repro: runnercheck chisq --sampler " in crash and "user_samplers.py:segfaults --cases temperature-0.5-v97" in crash
    assert "sampler timed out after 4 s (process group killed)" in failure("test_hanging_sampler")
    assert ("0 cases ran: 1 skipped because sampler declares no support for top_k (supported_params)"
            in failure("test_every_case_skipped"))
    hang = failure("test_hanging_runner")
    assert "timed out after 4 s" in hang and "repro:" in hang
    result.stdout.no_fnmatch_line("*Traceback*")


def test_timeout_option_must_be_seconds(user_project: pytest.Pytester) -> None:
    user_project.makepyfile(test_x="def test_x(runnercheck_differential):\n    runnercheck_differential()\n")
    result = user_project.runpytest_subprocess("-p", PLUGIN, "-o", "runnercheck_timeout=soon")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*runnercheck_timeout (ini): 'soon' is not a number of seconds*"])
    result = user_project.runpytest_subprocess("-p", PLUGIN, "--runnercheck-timeout", "-1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_invariance_fixture_passes_our_runner_and_fails_a_batch_dependent_one(user_project: pytest.Pytester) -> None:
    user_project.makepyfile(test_inv="""
        from runnercheck.impl.runner import make_runner
        from runnercheck.stress.mutants import catalogue

        def slot_keyed_runner(weights, limits, device, base_seed, *, cuda_graphs=True, batch_invariant=False):
            runner = make_runner(weights, limits, device, base_seed, cuda_graphs=cuda_graphs, batch_invariant=batch_invariant)
            runner._bug = catalogue.apply("noise_keyed_by_batch_slot", runner=runner)
            return runner

        def test_ours(runnercheck_invariance):
            assert runnercheck_invariance(probes=2, max_tokens=4, scenarios=["batch"]).passed

        def test_buggy(runnercheck_invariance):
            runnercheck_invariance(slot_keyed_runner, probes=2, max_tokens=6, scenarios=["batch"])
    """)
    result, cases = _run(user_project)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*output depends on the batch*", "*sampler-path: p1 in scenario 'batch'*"])
    assert _props(cases["test_ours"])["runnercheck.invariance.differences"] == "0"
