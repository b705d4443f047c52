"""A Hypothesis state machine: the runner against the oracle after every rule, detectors armed.

Rules drive a `SchedulerSim` the way clients and a serving engine would: add requests (random
prompts and `SamplingParams`: greedy, temperature, top-k / top-p / min-p, penalties, with or
without seeds, logprobs, prompt logprobs, stop tokens), add requests that share a prefix with an
earlier prompt or a fixed system prompt (so the scheduler's prefix cache hits), evict unreferenced
cached blocks (memory pressure), abort and preempt random live requests (with device drafts in
flight too), add repetitive-pattern prompts (greedy or not, stopping on the pattern's token or not) for
the runner's n-gram proposer (on in a third of the examples: `runnercheck.stress.sim.spec_scheduler`; in about one
example in nine the draft-model proposer instead, `runnercheck.impl.draft_proposer`, no prefix caching),
run scheduler ticks, drain the outputs in flight, and on ``sim`` switch the device's lag policy
(run-immediately, lag-k-steps with k in 1..3, random-drain with a drawn seed).  Ticks follow
`runnercheck.stress.run.driver.DifferentialRun` exactly (its enqueue / deliver steps are reused): step N+1 is
enqueued on the runner before step N's output is read, the oracle computes step N after that
read, and ties are adopted as `runnercheck.checks.compare` defines.  Steps stay in flight across rules, so
aborts, preemptions and lag switches land while device work is pending.

Invariants, checked after every rule (and once more after a final drain in ``teardown``), in
this order:

1. no divergence between runner and oracle (a runner exception counts as one);
2. zero host syncs beyond the runner's own counted back-pressure waits: `runnercheck.checks.detectors.sync.arm_runner`
   counts every host read / wait inside ``execute_model`` (``AsyncOutput.get`` is the allowed
   wait), and the count must equal `runnercheck.checks.detectors.sync.counted_waits(runner)` -- the waits the runner documents and
   counts itself (a freed row still quarantined, no free staging or output slot) when the device
   lags further behind than its rows and slots cover.  Those are designed waits, not failures
   (``error`` mode would raise on the first of them); any other read or wait is a failure;
3. zero staging-lifetime violations: a `runnercheck.checks.detectors.lifetime.LifetimeChecker` on ``runner.staging``;
4. row-table consistency (runners with an `runnercheck.impl.state.RequestStateTable` as ``runner.state``):
   no row held by two requests, the live set equals what the request stream says the runner
   holds, and free + used + quarantined rows = ``max_num_reqs``;
5. the scheduler simulator's own bookkeeping (`SchedulerSim.check_invariants`: block pool,
   reference counts, prefix-cache maps);
6. zero KV provenance violations (`runnercheck.checks.detectors.kv_provenance`, armed on runners with an input batch).

Invariants 2, 3 and 6 are the detector registry (`runnercheck.checks.detectors.registry`), checked together
right after the divergence check in registry order: a detector added there is an invariant here too.

`TestRunnerMachine` is the CI test case (the settings profile decides ``max_examples``; the
step count is kept small because interpreted Triton costs ~0.5 s per step on CPU);
`LongRunnerMachine` is the bigger variant for ``-m stress`` / the nightly profile.  Subclasses
override `RunnerMachine.build_runner` to test another runner (or a planted bug).

Ownership: a machine instance owns one example's device, runner, oracle, scheduler, driver and
detectors (host objects, one Hypothesis example, written by its rules).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Iterable

import hypothesis.strategies as st
from hypothesis import event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from runnercheck.impl.device import Device
from runnercheck.impl.interface import (LOGPROBS_MODES, SAMPLING_FIELDS, DraftModelConfig, NgramConfig, RunnerLimits,
                                        SamplingField, SamplingParams, runner_logprobs_modes)
from runnercheck.impl.model.weights import ModelWeights, preset, random_weights
from runnercheck.stress.run.driver import DifferentialRun, RunResult
from runnercheck.checks.detectors.base import ArmContext
from runnercheck.checks.detectors.registry import ArmedDetectors
from runnercheck.stress.run.harness import load_runner_factory
from runnercheck.stress.run.config import default_limits
from runnercheck.stress.run.runners import DEFAULT_RUNNER_SPEC
from runnercheck.stress.sim.scheduler import SchedulerSim

MACHINE_PRESET = "micro"
_VOCAB = preset(MACHINE_PRESET).vocab_size
MAX_PROMPT_LEN = 12
MAX_NEW_TOKENS = 6
MAX_UNFINISHED = 5
MAX_LOGPROBS = 5
MAX_PROMPT_LOGPROBS = 3
SETTLE_TICKS = 6
SYSTEM_PROMPT = (7, 1, 8, 2, 8, 1, 8, 2)  # two blocks of the machine's block size 4


class MachineInvariantError(AssertionError):
    """An invariant of `RunnerMachine` does not hold (divergence, host sync, lifetime, row table)."""


# --------------------------------------------------------------------------- strategies


def _rounded(lo: float, hi: float) -> st.SearchStrategy[float]:
    # Three decimals keep failing examples readable and exactly reproducible from the printout.
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False).map(lambda x: round(x, 3))


def _field_values(spec: SamplingField, vocab_size: int) -> st.SearchStrategy:
    """A sampling field's "on" values: its table row's ``draw`` range (an int field's capped at the vocabulary when
    it counts tokens)."""
    low, high = spec.draw
    if spec.is_int:
        return st.integers(low, min(high, vocab_size) if spec.counts_tokens else high)
    return _rounded(low, high)


@st.composite
def sampling_params(draw: st.DrawFn, vocab_size: int = _VOCAB, max_new_tokens: int = MAX_NEW_TOKENS) -> SamplingParams:
    """Random `SamplingParams`; each knob is off in its first alternative (what shrinking aims for): every field of
    the interface's table, in its order, off (its neutral value; the temperature's "off" is greedy, 0) or drawn from
    its row's ``draw`` range."""
    knobs = {spec.name: draw(st.one_of(st.just(0.0 if spec.stage == "temperature" else spec.neutral),
                                       _field_values(spec, vocab_size)))
             for spec in SAMPLING_FIELDS}
    return SamplingParams(
        **knobs,
        seed=draw(st.one_of(st.none(), st.integers(0, 2**63 - 1))),
        logprobs=draw(st.one_of(st.none(), st.integers(0, MAX_LOGPROBS))),
        prompt_logprobs=draw(st.one_of(st.none(), st.none(), st.integers(0, MAX_PROMPT_LOGPROBS))),
        max_tokens=draw(st.integers(1, max_new_tokens)),
        stop_token_ids=tuple(draw(st.lists(st.integers(0, vocab_size - 1), max_size=2))),
        # raw first (what shrinking aims for); processed: the log of the distribution the sampler drew from
        logprobs_mode=draw(st.sampled_from(LOGPROBS_MODES)),
    )


def prompts(vocab_size: int = _VOCAB, max_len: int = MAX_PROMPT_LEN) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=max_len)


def lag_policies() -> st.SearchStrategy[dict]:
    """`runnercheck.impl.lag_policies.LagPolicy.describe()` dicts: run-immediately, lag-k-steps (k 1..3), random-drain."""
    return st.one_of(
        st.just({"name": "run-immediately"}),
        st.integers(1, 3).map(lambda k: {"name": "lag-k-steps", "k": k}),
        st.integers(0, 2**32 - 1).map(lambda s: {"name": "random-drain", "seed": s, "p_stall": 0.5}),
    )


# --------------------------------------------------------------------------- row table


def check_row_table(state: Any, expected_live: Iterable[str]) -> None:
    """Raise `MachineInvariantError` unless ``state`` (an `runnercheck.impl.state.RequestStateTable`) is consistent.

    Reads the free list and last-use events directly: `RequestStateTable.is_quarantined` queries
    events, and on ``sim`` a query lets the lag policy run work -- a check must not change the
    interleaving it checks.
    """
    problems: list[str] = []
    n = state.max_num_reqs
    used: dict[int, str] = {}
    for rid, row in state.req_to_row.items():
        if not 0 <= row < n:
            problems.append(f"request {rid!r} holds row {row}, outside [0, {n})")
        elif row in used:
            problems.append(f"row {row} is held by {used[row]!r} and {rid!r}")
        else:
            used[row] = rid
    for row, rid in used.items():
        info = state.rows[row]
        if info is None or info.req_id != rid:
            problems.append(f"row {row} is mapped to {rid!r} but its RowInfo names {None if info is None else info.req_id!r}")
    for row, info in enumerate(state.rows):
        if info is not None and used.get(row) != info.req_id:
            problems.append(f"row {row} carries RowInfo of {info.req_id!r}, which does not hold it")
    free = list(state.free_rows())
    if len(set(free)) != len(free):
        problems.append(f"free list holds a row twice: {free}")
    if set(free) & set(used):
        problems.append(f"rows {sorted(set(free) & set(used))} are both free and held")
    quarantined = list(set(state.quarantined_rows()))
    ready = len(set(free)) - len(quarantined)
    if ready + len(used) + len(quarantined) != n:
        problems.append(
            f"free {ready} + used {len(used)} + quarantined {len(quarantined)} = "
            f"{ready + len(used) + len(quarantined)}, expected max_num_reqs {n}"
        )
    if set(state.live) != set(state.req_to_row):
        problems.append(f"host mirror holds {sorted(state.live)} but rows are held by {sorted(state.req_to_row)}")
    expected = set(expected_live)
    if set(state.req_to_row) != expected:
        problems.append(
            f"rows are held by {sorted(state.req_to_row)} but the request stream leaves {sorted(expected)} live"
        )
    if problems:
        raise MachineInvariantError("row table inconsistent:\n  " + "\n  ".join(problems))


# --------------------------------------------------------------------------- the machine


class RunnerMachine(RuleBasedStateMachine):
    """The runner (by default ``runnercheck.impl.runner:make_runner``) against `runnercheck.reference.runner.ReferenceRunner`."""

    device_kind: ClassVar[str] = "sim"
    runner_spec: ClassVar[str] = DEFAULT_RUNNER_SPEC
    limits_kwargs: ClassVar[dict] = {"max_num_reqs": 3, "block_size": 4, "num_kv_blocks": 12, "max_num_batched_tokens": 16}
    settle_ticks: ClassVar[int] = SETTLE_TICKS
    lag_switching: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.built = False
        self.healthy = True  # False once a rule raised or an invariant failed: teardown then only drains
        self.tick = 0
        self.result = RunResult()

    # ------------------------------------------------------------------ construction
    def build_runner(self, weights: ModelWeights, limits: RunnerLimits, device: Device, seed: int) -> Any:
        """The runner under test.  Override to test another runner or to plant a bug."""
        extra = {"speculative": self.ngram} if self.ngram is not None else {}
        return load_runner_factory(self.runner_spec)(weights, limits, device, seed, **extra)

    @initialize(
        seed=st.integers(0, 2**16 - 1),
        lag=lag_policies(),
        max_inflight=st.sampled_from([1, 2]),
        draft_prob=st.sampled_from([0.0, 0.3]),
        ngram_k=st.sampled_from([0, 0, 3]),
        draft_k=st.sampled_from([0, 0, 0, 0, 0, 2]),  # rare: the draft model costs interpreted launches per step
        first_requests=st.lists(st.tuples(prompts(), sampling_params()), min_size=1, max_size=3),
    )
    def build(self, seed: int, lag: dict, max_inflight: int, draft_prob: float, ngram_k: int, draft_k: int,
              first_requests: list[tuple[list[int], SamplingParams]]) -> None:
        from runnercheck.reference.runner import ReferenceRunner

        self.healthy = False
        config = preset(MACHINE_PRESET)
        self.limits = default_limits(config, **self.limits_kwargs)
        self.weights = random_weights(config, seed=seed)
        self.device = Device(self.device_kind, seed=seed, lag_policy=lag)
        # The runner's proposer (device drafts asked for by count); off for a runner built without one.  The
        # draft model (the machine's own preset drafting with the target's weights, rejection-sampled) takes no
        # explicit drafts and no prefix hits.
        self.ngram = NgramConfig(num_spec_tokens=ngram_k) if ngram_k else None
        draft_model = ""
        if draft_k and not ngram_k:
            draft_model, draft_prob = MACHINE_PRESET, 0.0
            self.ngram = DraftModelConfig(MACHINE_PRESET, draft_k, weights_seed=seed)
        self.runner = self.build_runner(self.weights, self.limits, self.device, seed)
        if getattr(self.runner, "proposer", None) is None:
            self.ngram = None
        self.oracle = ReferenceRunner(self.weights, self.limits, base_seed=seed, proposer=self.ngram)
        self.scheduler = SchedulerSim(self.limits, seed=seed, max_inflight_steps=max_inflight, draft_prob=draft_prob,
                                      ngram_spec_tokens=self.ngram.num_spec_tokens if self.ngram else 0,
                                      prefix_caching=not (draft_model and self.ngram), draft_model=draft_model if self.ngram else "")
        # the harness's detectors (the whole registry), armed the harness's way but raising on a lifetime violation
        self.detectors = ArmedDetectors(self.runner, ArmContext(lifetime_mode="error", scheduler=self.scheduler))
        self.prompts: dict[str, tuple[int, ...]] = {}
        self.driver = DifferentialRun(self.runner, self.oracle, self.scheduler)
        self.next_req = 0
        self.built = True
        for prompt, params in first_requests:  # every example starts with work, so its steps compute something
            self._add(prompt, params)
        self.healthy = True

    # ------------------------------------------------------------------ rules
    @precondition(lambda self: len(self.scheduler.unfinished_ids) < MAX_UNFINISHED)
    @rule(prompt=prompts(), params=sampling_params())
    def add_request(self, prompt: list[int], params: SamplingParams) -> None:
        self.healthy = False
        self._add(prompt, params)
        self.healthy = True

    def _add(self, prompt: list[int], params: SamplingParams) -> None:
        if params.logprobs_mode not in runner_logprobs_modes(self.runner):
            params = replace(params, logprobs_mode="raw")  # a runner that declares no processed logprobs
        self.scheduler.add_request(f"r{self.next_req}", prompt, params)
        self.prompts[f"r{self.next_req}"] = tuple(prompt)
        self.next_req += 1

    @precondition(lambda self: len(self.scheduler.unfinished_ids) < MAX_UNFINISHED)
    @rule(data=st.data(), suffix=prompts(max_len=4), params=sampling_params())
    def add_sharing_request(self, data: st.DataObject, suffix: list[int], params: SamplingParams) -> None:
        """A prompt sharing a prefix (a whole one, or cut anywhere) with an earlier prompt or the system prompt."""
        self.healthy = False
        base = data.draw(st.sampled_from([SYSTEM_PROMPT] + sorted(set(self.prompts.values()))), label="shared prefix")
        cut = data.draw(st.integers(1, len(base)), label="prefix length")
        self._add((list(base[:cut]) + suffix)[: MAX_PROMPT_LEN + 4], params)
        self.healthy = True

    @precondition(lambda self: len(self.scheduler.unfinished_ids) < MAX_UNFINISHED)
    @rule(pattern=prompts(max_len=3), repeats=st.integers(2, 6), params=sampling_params(), greedy=st.booleans(),
          stop_on_pattern=st.booleans())
    def add_repetitive_request(self, pattern: list[int], repeats: int, params: SamplingParams, greedy: bool,
                               stop_on_pattern: bool) -> None:
        """A prompt repeating a short pattern: n-gram drafts match it (accepted when the model continues it);
        with ``stop_on_pattern`` an accepted draft may be a stop token, and short ``max_tokens`` let accepted
        drafts run past the request's end (the scheduler drops them)."""
        self.healthy = False
        if greedy:
            params = replace(params, temperature=0.0)
        if stop_on_pattern:
            params = replace(params, stop_token_ids=(pattern[-1],))
        self._add((pattern * repeats)[: MAX_PROMPT_LEN + 4], params)
        self.healthy = True

    @precondition(lambda self: self.scheduler.blocks.num_evictable > 0)
    @rule(n=st.integers(1, 4))
    def evict_cached_blocks(self, n: int) -> None:
        self.healthy = False
        self.scheduler.blocks.evict(n)
        self.healthy = True

    @precondition(lambda self: bool(self.scheduler.unfinished_ids))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        self.healthy = False
        self.scheduler.abort(data.draw(st.sampled_from(sorted(self.scheduler.unfinished_ids)), label="abort"))
        self.healthy = True

    @precondition(lambda self: bool(self.scheduler.running_ids))
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        self.healthy = False
        self.scheduler.preempt(data.draw(st.sampled_from(sorted(self.scheduler.running_ids)), label="preempt"))
        self.healthy = True

    @rule(ticks=st.integers(1, 3))
    def step(self, ticks: int) -> None:
        self.healthy = False
        for _ in range(ticks):
            self._tick()
        self.healthy = True

    @precondition(lambda self: self.driver.inflight)
    @rule()
    def drain(self) -> None:
        self.healthy = False
        self._deliver_all()
        self.healthy = True

    @precondition(lambda self: self.lag_switching and self.device.kind == "sim")
    @rule(lag=lag_policies())
    def switch_lag_policy(self, lag: dict) -> None:
        self.healthy = False
        self.device.set_lag_policy(lag)
        self.healthy = True

    # ------------------------------------------------------------------ ticks (stress.driver's order)
    def _tick(self) -> None:
        """One scheduler tick, as `DifferentialRun.run` runs it (minus the final drain)."""
        if not self.result.ok:
            return
        sched, driver = self.scheduler, self.driver
        if sched.can_schedule:
            driver.enqueue(self.tick, sched.schedule())
        while driver.inflight and (len(driver.inflight) > sched.config.max_inflight_steps or not sched.can_schedule):
            if not driver.deliver(self.result):
                break
        self.tick += 1

    def _deliver_all(self) -> None:
        while self.driver.inflight and self.result.ok:
            self.driver.deliver(self.result)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def everything_holds(self) -> None:
        if self.built:
            self.verify_invariants()

    def verify_invariants(self) -> None:
        try:
            self._check()
        except MachineInvariantError:
            self.healthy = False
            raise

    def _check(self) -> None:
        result = self.result
        if not result.ok:
            lines = [f"runner and oracle diverge at tick {self.tick}: {result.first_divergence_line()}"]
            lines += [f"  also: {d.line()}" for d in result.divergences[1:5]]
            if result.runner_traceback:
                lines.append(result.runner_traceback.rstrip())
            raise MachineInvariantError("\n".join(lines))
        fired = self.detectors.fired()  # in registry order: host syncs, slot lifetimes, kv provenance, ...
        if fired:
            raise MachineInvariantError(fired)
        state = getattr(self.runner, "state", None)
        if state is not None and hasattr(state, "req_to_row"):
            check_row_table(state, self.driver.mirror.live)
        self.scheduler.check_invariants()

    def teardown(self) -> None:
        if not self.built:
            return
        try:
            if self.healthy:
                for _ in range(self.settle_ticks):  # let the last rules' requests reach the comparison
                    self._tick()
                self._deliver_all()
                self.verify_invariants()
                if self.ngram is not None:  # the acceptance rate, in Hypothesis's statistics
                    spec = self.scheduler.spec_stats
                    event(("draft-model" if self.scheduler.config.draft_model else "n-gram") + " drafts: " + ("none asked" if not spec.draft_tokens else "none accepted"
                          if not spec.accepted_tokens else "all accepted" if spec.accepted_tokens == spec.draft_tokens
                          else "some accepted"))
        finally:
            self.driver.drain_uncompared()
            self.detectors.disarm()


class LongRunnerMachine(RunnerMachine):
    """Roomier limits (more rows to reuse, longer chunked prefills) for long runs."""

    limits_kwargs: ClassVar[dict] = {"max_num_reqs": 4, "block_size": 8, "num_kv_blocks": 16, "max_num_batched_tokens": 32}


TestRunnerMachine = RunnerMachine.TestCase
TestRunnerMachine.settings = settings(stateful_step_count=10)

TestLongRunnerMachine = LongRunnerMachine.TestCase
TestLongRunnerMachine.settings = settings(stateful_step_count=40)

__all__ = ["RunnerMachine", "LongRunnerMachine", "MachineInvariantError", "TestRunnerMachine", "TestLongRunnerMachine",
           "check_row_table", "sampling_params", "lag_policies"]
