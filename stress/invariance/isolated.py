"""The invariance check in a child process: a runner that crashes or hangs ends the child, not the command.

`isolated_invariance` runs `runnercheck.stress.invariance.checker.check_invariance` in a child
(`runnercheck.checks.child`: forked on cpu/sim, spawned on cuda, its own process group), which streams
each finished scenario back.  Past ``timeout_s`` the child's process group is killed; either way the
scenarios that finished are kept and the end of the check is one more failed outcome named
``(check process)`` whose error says how it ended (``killed by signal SIGSEGV``, ``timed out after N s``).
The factory is loaded in the child from its spec, and a mutant installed there by name.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from runnercheck.checks.child import ChildGone, ChildTimeout, describe_timeout, start_child
from runnercheck.stress.invariance.checker import (
    InvarianceConfig,
    InvarianceResult,
    InvarianceSetupError,
    ScenarioOutcome,
    check_invariance,
)

CRASH_SCENARIO = "(check process)"


def _child(conn: Any, spec: str, config: InvarianceConfig, mutant: str | None) -> None:
    from runnercheck.stress.run.config import RunSetupError
    from runnercheck.stress.run.harness import apply_mutant, load_runner_factory

    try:
        factory = load_runner_factory(spec)
        prepare = (lambda runner: apply_mutant(mutant, runner)) if mutant else None
        result = check_invariance(factory, config, runner_name=spec, prepare=prepare,
                                  on_start=lambda r: conn.send(("start", r)),
                                  on_scenario=lambda o, i, n: conn.send(("scenario", o, i, n)))
        conn.send(("done", result))
    except (InvarianceSetupError, RunSetupError) as e:
        conn.send(("setup", str(e)))
    except Exception as e:  # noqa: BLE001 - reported as the check's crash
        conn.send(("error", f"{type(e).__name__}: {e}"))
    conn.close()


def isolated_invariance(spec: str, config: InvarianceConfig, *, mutant: str | None = None, timeout_s: float | None = None,
                        on_scenario: Callable[[ScenarioOutcome, int, int], None] | None = None,
                        partial: list[InvarianceResult] | None = None) -> InvarianceResult:
    """`check_invariance` of the factory ``spec`` in a child (module docstring).  `InvarianceSetupError`
    when the runner cannot be set up; ``partial`` holds the result so far if the caller is interrupted."""
    child = start_child(_child, (spec, config, mutant), spawn=config.device == "cuda")
    deadline = None if timeout_s is None else time.perf_counter() + timeout_s
    result: InvarianceResult | None = None
    ended: str | None = None
    try:
        while True:
            try:
                message = child.receive(deadline)
            except ChildTimeout:
                child.kill()
                ended = describe_timeout(timeout_s or 0.0)
                break
            except ChildGone:
                ended = child.finish()
                break
            kind = message[0]
            if kind == "start":
                result = message[1]
                if partial is not None:
                    partial.append(result)
            elif kind == "scenario":
                assert result is not None
                result.scenarios.append(message[1])
                if on_scenario is not None:
                    on_scenario(*message[1:])
            elif kind == "done":
                child.finish()
                done: InvarianceResult = message[1]
                if result is not None:
                    result.seconds = done.seconds
                return result if result is not None else done
            elif kind == "setup":
                child.finish()
                raise InvarianceSetupError(message[1])
            else:  # "error": the check itself raised
                child.finish()
                ended = message[1]
                break
    except BaseException:
        child.kill()
        raise
    if result is None:
        raise InvarianceSetupError(f"the check process ended before it started: {ended}")
    result.scenarios.append(ScenarioOutcome(CRASH_SCENARIO, "crash", "the check's process ended early", 0, (), 0, [],
                                            ended, time.perf_counter() - child.started))
    return result


__all__ = ["isolated_invariance", "CRASH_SCENARIO"]
