"""The Hypothesis state machine: the CI run, the long run, and planted bugs it must catch."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.stateful import run_state_machine_as_test

import runnercheck.stress.run.machine as machine
from runnercheck.impl.device import Device
from runnercheck.impl.interface import NewRequest, SamplingParams
from runnercheck.impl.state import RequestStateTable
from runnercheck.stress.run.machine import MachineInvariantError, RunnerMachine, check_row_table, sampling_params
from runnercheck.stress.run.config import default_limits

# Collected here so the CI run and the long run are part of this module's tests.
TestRunnerMachine = machine.TestRunnerMachine
TestLongRunnerMachine = pytest.mark.stress(machine.TestLongRunnerMachine)


# --------------------------------------------------------------------------- strategies


@settings(max_examples=200, deadline=None)
@given(sampling_params())
def test_drawn_sampling_params_are_valid_for_the_machine_limits(params: SamplingParams) -> None:
    limits = default_limits(machine.preset(machine.MACHINE_PRESET), **RunnerMachine.limits_kwargs)
    params.validate(limits.vocab_size, limits.max_logprobs)
    longest = machine.MAX_PROMPT_LEN + params.max_tokens
    assert -(-longest // limits.block_size) <= limits.num_kv_blocks  # SchedulerSim accepts every drawn request


# --------------------------------------------------------------------------- row-table check


def _table_with_two_requests() -> RequestStateTable:
    table = RequestStateTable(Device("cpu"), max_num_reqs=3, max_model_len=16)
    for rid in ("a", "b"):
        table.admit(NewRequest(rid, (1, 2, 3), SamplingParams(), (0,)), seed=0)
    return table


def test_row_table_check_accepts_a_consistent_table() -> None:
    table = _table_with_two_requests()
    check_row_table(table, {"a", "b"})
    table.release("a")
    check_row_table(table, {"b"})


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda t: t.req_to_row.__setitem__("b", t.req_to_row["a"]), "is held by"),
        (lambda t: t._free.popleft(), "expected max_num_reqs 3"),
        (lambda t: t._free.append(t.req_to_row["a"]), "both free and held"),
        (lambda t: t.rows.__setitem__(t.req_to_row["a"], None), "RowInfo names None"),
    ],
    ids=["shared-row", "lost-row", "free-and-held", "missing-rowinfo"],
)
def test_row_table_check_catches_planted_corruption(corrupt, message: str) -> None:
    table = _table_with_two_requests()
    corrupt(table)
    with pytest.raises(MachineInvariantError, match=message):
        check_row_table(table, {"a", "b"})


def test_row_table_check_catches_a_live_set_the_stream_does_not_explain() -> None:
    with pytest.raises(MachineInvariantError, match="request stream leaves"):
        check_row_table(_table_with_two_requests(), {"a"})


# --------------------------------------------------------------------------- planted bugs


class PlantedMachine(RunnerMachine):
    """The real runner with one deliberate bug, on a sim device that runs work at once.

    Run-immediately keeps freed rows out of quarantine, so the planted bug is the only thing that
    can fail the example.
    """

    lag_switching = False

    def build_runner(self, weights, limits, device, seed):
        device.set_lag_policy("run-immediately")
        runner = super().build_runner(weights, limits, device, seed)
        self.plant(runner)
        return runner

    def plant(self, runner) -> None:
        raise NotImplementedError


class _Output:
    def __init__(self, get):
        self.get = get


class WrongTokenMachine(PlantedMachine):
    """The first sampled token the runner reports is off by one (its device state keeps the right one)."""

    def plant(self, runner) -> None:
        original, flipped = runner.execute_model, []

        def execute_model(sched):
            inner = original(sched)

            def get():
                out = inner.get()
                for i, toks in enumerate(out.sampled_token_ids):
                    if toks and not flipped:
                        flipped.append(out.req_ids[i])
                        sampled = list(out.sampled_token_ids)
                        sampled[i] = ((toks[0] + 1) % runner.limits.vocab_size, *toks[1:])
                        return dataclasses.replace(out, sampled_token_ids=tuple(sampled))
                return out

            return _Output(get)

        runner.execute_model = execute_model


class RowLeakMachine(PlantedMachine):
    """Releasing a request's row forgets to put it back on the free list."""

    def plant(self, runner) -> None:
        state, original = runner.state, runner.state.release

        def release(req_id):
            row = original(req_id)
            state._free.remove(row)
            return row

        state.release = release


class HostReadMachine(PlantedMachine):
    """Every step reads a device count on the host (an `int()` of device memory)."""

    def plant(self, runner) -> None:
        original = runner.execute_model

        def execute_model(sched):
            int(runner.state.base[0, 0])
            return original(sched)

        runner.execute_model = execute_model


class StaleStagingWriteMachine(PlantedMachine):
    """After a step is submitted, the host writes into the staging slot that is still in flight."""

    def plant(self, runner) -> None:
        from runnercheck.impl.buffers import SlotState

        original = runner.execute_model

        def execute_model(sched):
            out = original(sched)
            for slot in runner.staging.slots:
                if slot.state is SlotState.IN_FLIGHT and slot.used_bytes:
                    slot.host[0] = (int(slot.host[0]) + 1) % 256
            return out

        runner.execute_model = execute_model


class CachedBlockRewriteMachine(PlantedMachine):
    """Admission with a prefix hit starts one block early: the prefill re-writes a shared cached block."""

    def plant(self, runner) -> None:
        from runnercheck.impl.state import NUM_COMPUTED

        state, original = runner.state, runner.state.admit

        def admit(req, seed):
            row = original(req, seed)
            if req.num_computed_tokens:
                state.row_state.stage(row, NUM_COMPUTED, [req.num_computed_tokens - runner.limits.block_size])
            return row

        state.admit = admit


FIND_BUG = settings(
    max_examples=8, stateful_step_count=6, derandomize=True, deadline=None, database=None,
    phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow],
)


# A prefix hit takes a prompt computed, its blocks cached and a sharing request admitted: more rules than six
# (since the machine also draws proposers and repetitive prompts, six-rule examples no longer reach one).
FIND_PREFIX_BUG = settings(FIND_BUG, stateful_step_count=15)


@pytest.mark.parametrize(
    "planted, message, find",
    [
        (WrongTokenMachine, r"(?s)runner and oracle diverge .* expected token", FIND_BUG),
        (RowLeakMachine, r"row table inconsistent|no free row for", FIND_BUG),  # or the leak starves the next admission
        (HostReadMachine, r"(?s)host sync.*int\(\) on device memory", FIND_BUG),
        (StaleStagingWriteMachine, r"StagingLifetimeError|staging lifetime", FIND_BUG),
        pytest.param(CachedBlockRewriteMachine, r"(?s)kv provenance: .*write-position|runner and oracle diverge",
                     FIND_PREFIX_BUG, marks=pytest.mark.slow),  # ~30 s on a CPU
    ],
    ids=["wrong-token", "row-leak", "host-read", "stale-staging-write", "cached-block-rewrite"],
)
def test_the_machine_finds_a_planted_bug(planted, message: str, find: settings) -> None:
    with pytest.raises(MachineInvariantError, match=message):
        run_state_machine_as_test(planted, settings=find)


class NoPlantMachine(PlantedMachine):
    def plant(self, runner) -> None:
        pass


@pytest.mark.slow
def test_control_the_prefix_examples_pass_without_a_planted_bug() -> None:
    """The cached-block rewrite's examples (longer ones) pass without the plant (~55 s on a CPU)."""
    run_state_machine_as_test(NoPlantMachine, settings=FIND_PREFIX_BUG)


def test_control_the_same_examples_pass_without_a_planted_bug() -> None:
    """The planted-bug failures above come from the plants: the unplanted runner passes the examples
    they fail on (each is found by the third derandomized example)."""
    run_state_machine_as_test(NoPlantMachine, settings=settings(FIND_BUG, max_examples=3))
