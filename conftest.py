"""Suite-wide test configuration.

TRITON_INTERPRET must be set before triton is imported anywhere, so this runs first: when no
CUDA device is present, kernels run in Triton's interpreter on CPU tensors.  Before that, an
xdist worker is pinned to one of several visible GPUs (`runnercheck.stress.gpu_workers`).
"""
from __future__ import annotations

import os
import re

# Before anything can initialise CUDA: an xdist worker keeps one of several visible GPUs.
import runnercheck.stress.gpu_workers  # noqa: E402,F401

pytest_plugins = ["runnercheck.stress.gpu_workers"]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from runnercheck.impl.kernels.interpreted_memory import check_interpreted_memory
    from runnercheck.impl.kernels.interpreter import speed_up_interpreter

    # Here, not only in the pytest plugin: the suite runs at the same speed, and with the same memory
    # checks, with `-p no:runnercheck`.
    speed_up_interpreter()
    check_interpreted_memory()

    # xdist already runs one worker per core; intra-op threads on top only oversubscribe
    # (measured: a smoke run took 11-19 s with the default threads vs 0.9 s with one).
    torch.set_num_threads(1)

import pytest  # noqa: E402
from hypothesis import HealthCheck, Verbosity, settings  # noqa: E402

settings.register_profile(
    "dev", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci",
    max_examples=20,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "nightly",
    max_examples=500,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    verbosity=Verbosity.normal,
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_addoption(parser: pytest.Parser) -> None:
    # No "auto" here: that word means "cuda, else sim" everywhere (`resolve_device_kind`), and the
    # device-parametrised unit tests want cpu when there is no GPU (sim is for the race tests).
    parser.addoption(
        "--device",
        action="store",
        default="cuda" if _cuda_available() else "cpu",
        choices=["cuda", "cpu", "sim"],
        help="device kind for device-parametrised tests (default: cuda when present, else cpu)",
    )


# The CPU suite's longest tests: seconds of one `-n 2 --durations` run of `tests` on the 2-core box (a loaded one:
# only their ratios matter).  They start first, spread over the xdist workers, so that the short tests fill the
# end of the run: in collection order they came last (tests/stress) and one worker idled while the other finished
# a three-minute test.  A test missing here only runs in its collection place.
RUN_FIRST: dict[str, float] = {
    "tests/stress/test_mutants.py::test_quick_sim_run_kills_every_cpu_mutant_as_designed": 246,
    "tests/stress/test_machine.py::TestRunnerMachine::runTest": 119,
    "tests/stress/test_verify.py::test_quick_job_on_sim_passes_and_writes_a_valid_report": 81,
    "tests/bench/test_bench_cli.py::test_bench_quick_writes_valid_json": 44,
    "tests/stress/test_targeted_delays.py::test_a_targeted_sim_run_passes_and_reaches_every_target": 41,
    "tests/stress/test_invariance.py::test_the_builtin_runner_passes_on_sim": 32,
    "tests/docs/test_quickstart.py::test_quickstart_example_pytest_file_passes": 31,
    "tests/impl/test_draft_graphs.py::test_recorded_replay_equals_eager_and_the_oracle[3-capture_sizes0-1]": 28,
    "tests/checks/test_chisq.py::test_shards_partition_the_matrix_and_the_biases_and_shard_0_keeps_the_calibration": 27,
    "tests/plugin/test_pytest_plugin.py::test_invariance_fixture_passes_our_runner_and_fails_a_batch_dependent_one": 24,
    "tests/impl/test_draft_proposer.py::test_draft_model_under_lag_matches_the_oracle_with_no_host_sync": 24,
    "tests/impl/test_draft_graphs.py::test_padding_requests_write_no_live_proposer_row_and_no_draft_kv[cpu]": 22,
    "tests/docs/test_quickstart.py::test_quickstart_buggy_sampler_fails_with_its_top_p_case_rejected": 22,
    "tests/checks/test_staging_slots.py::test_a_correct_runner_under_staging_lag_is_clean": 22,
    "tests/stress/test_invariance.py::test_cli_passes_and_reports_a_mutant": 22,
}


def _start_the_longest_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Reorder ``items`` (the same way on every worker, as xdist requires) so each worker's first share holds its
    part of `RUN_FIRST`, longest first to the least loaded worker.

    xdist's ``load`` scheduler first hands each worker a run of consecutive items, ``max(2, min(N // workers // 4,
    maxschedchunk))`` of them; the rest go out as workers drain.  Outside xdist (or another ``--dist``) the longest
    tests only move to the front, which changes nothing but the order.
    """
    heavy = sorted((i for i in items if i.nodeid in RUN_FIRST), key=lambda i: -RUN_FIRST[i.nodeid])
    if not heavy:
        return
    rest = [i for i in items if i.nodeid not in RUN_FIRST]
    workerinput = getattr(config, "workerinput", None)  # a worker's own ``dist`` option reads "no": ask the main argv
    argv = " ".join(workerinput.get("mainargv", [])) if workerinput else ""
    other_dist = "--dist" in argv and not re.search(r"--dist[= ]load(\s|$)", argv)
    workers = int(workerinput["workercount"]) if workerinput and not other_dist else 1
    chunk = max(2, min(len(items) // workers // 4, config.getoption("maxschedchunk", None) or len(items)))
    loads, shares = [0.0] * workers, [[] for _ in range(workers)]
    for item in heavy:
        w = loads.index(min(loads))
        shares[w].append(item)
        loads[w] += RUN_FIRST[item.nodeid]
    order: list[pytest.Item] = []
    for share in shares:
        fill = max(0, chunk - len(share)) if workers > 1 else 0
        order += share + rest[:fill]
        rest = rest[fill:]
    items[:] = order + rest


@pytest.hookimpl(trylast=True)  # after `-m` deselected: xdist's shares are counted on the items that run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _start_the_longest_first(config, items)
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def device_kind(request: pytest.FixtureRequest) -> str:
    kind = request.config.getoption("--device")
    if kind == "cuda" and not _cuda_available():
        pytest.skip("needs a CUDA device")
    return kind


@pytest.fixture
def device(device_kind: str):
    from runnercheck.impl.device import Device

    return Device(device_kind, seed=0)


@pytest.fixture(autouse=True)
def _seed_global_generators() -> None:
    """Every test starts from the same global torch / random / numpy state, whichever tests ran before it on its
    xdist worker: a test that draws unseeded data then sees the same draw on every run (one drew a tie on a
    fresh clone's CI run that the dev box's ordering never drew)."""
    import random

    import numpy
    import torch

    random.seed(0)
    numpy.random.seed(0)
    torch.manual_seed(0)
