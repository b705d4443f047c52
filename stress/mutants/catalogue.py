"""The mutant catalogue: small, realistic bugs planted in a live runner from outside ``impl/``.

A mutant proves that a check fails when it should.  Each one models a bug that real runners have
shipped (one line says which), is installed by monkeypatching *instances* of the runner's parts (or,
for kernel bugs, by launching a private copy of the sampling kernel with one device function
rebound: `runnercheck.stress.mutants.kernels`), and names the check(s) built to kill it:

* ``sync``: the host-sync detector (`runnercheck.checks.detectors.sync.arm_runner`);
* ``lifetime``: the staging-slot lifetime assertions (`runnercheck.checks.detectors.lifetime.LifetimeChecker`);
* ``differential``: runner vs the float64 oracle under stress (`runnercheck.stress.run.driver.DifferentialRun`);
* ``chisq``: chi-square / tail-mass tests of the runner's sampler (`runnercheck.checks.chisq.draws`, `runnercheck.checks.chisq.stats`);
* ``provenance``: the KV provenance shadow (`runnercheck.checks.detectors.kv_provenance.arm_kv_provenance`);
* ``csan``: PyTorch's CUDA stream sanitizer (`runnercheck.checks.detectors.csan`), cuda only: unordered accesses between
  streams (`runnercheck.stress.mutants.streams`: device mutants, installed before the runner is built).

Prefix-caching mutants live in `runnercheck.stress.mutants.prefix` (registered here at import); some of them
are scheduler bugs (``target="scheduler"``): they patch the `runnercheck.stress.sim.scheduler.SchedulerSim`
passed as ``apply(..., scheduler=...)`` rather than the runner.

There are no fault flags in ``impl``: ``apply`` patches attributes of the given runner (or of a
sampler probe exposing ``.sampler``) and returns an `AppliedMutant` whose ``undo()`` (or ``with``
exit) restores them.  A runner that carried a mutant should be discarded afterwards: undo restores
code, not the state the bug already corrupted.

Each mutant also names the `Workload` that exercises it: the slice of traffic (sampling params,
limits, lag policy) in which its bug shows up within a few scheduler ticks.  ``needs_gpu`` marks
mutants whose effect is too rare to see in an interpreted CPU run (deep-tail noise bugs: the
chi-square probes they need draw ~10^8 token noises); `runnercheck mutants` runs those only on CUDA.

Ownership: `runnercheck.stress.mutants.registry` owns the catalogue and `AppliedMutant` the record of what it
patched; `runnercheck.stress.mutants.kernels` owns the cache of private sampling-kernel copies.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
from types import SimpleNamespace
from typing import Any, Callable

import torch

from runnercheck.impl.buffers import SlotState
from runnercheck.impl.state import NUM_COMPUTED, NUM_ROW_FIELDS
from runnercheck.stress.mutants.registry import CATALOGUE, CLASSES, RUN_CHECKS, AppliedMutant, Mutant, UnknownMutantError, _mutant, known_checks
from runnercheck.stress.mutants.workloads import WORKLOADS, Workload
from runnercheck.stress.mutants.kernels import (
    MutantTargetError,
    fp16_chunk_argmax,
    fp16_gumbel_noise,
    launch_variant,
    sampling_kernels_variant,
    strict_top_p_threshold,
    u24_chunk_argmax,
    u24_gumbel_noise,
)

_log = logging.getLogger(__name__)


# ---- races / lifetime


@_mutant("reuse_staging_early", "race", ("lifetime", "differential"), "lagging", ("staging",),
         "staging ring recycled without waiting for the H2D event (one slot deep, the event check skipped)")
def _reuse_staging_early(runner: Any, m: AppliedMutant) -> None:
    pool = runner.staging

    def retire_without_waiting(ask: bool = True) -> None:
        for slot in pool.slots:
            if slot.state is SlotState.IN_FLIGHT:
                pool._retire(slot)

    m.set(pool, "slots", pool.slots[:1])
    m.set(pool, "_next", 0)
    m.set(pool, "retire_completed", retire_without_waiting)


@_mutant("pageable_nonblocking_copy", "race", ("sync", "differential"), "racing", ("staging", "lanes"),
         "H2D copy issued non_blocking from a pageable scratch tensor reused every step instead of the pinned slot")
def _pageable_nonblocking_copy(runner: Any, m: AppliedMutant) -> None:
    pool = runner.staging
    scratch = torch.empty(pool.capacity_bytes, dtype=torch.uint8)  # ordinary (pageable) host memory
    submit = pool.submit

    def submit_from_scratch(slot: Any) -> None:
        scratch[: slot.used_bytes].copy_(slot.host[: slot.used_bytes])
        pinned, slot.host = slot.host, scratch
        try:
            submit(slot)
        finally:
            slot.host = pinned

    m.set(pool, "submit", submit_from_scratch)
    # A step that fits its bucket's lane is copied in by its fused replay, not by `submit`: every step takes the
    # submit path here, so the bug does not hide behind how many steps happen to fit.
    m.set(runner.lanes, "fits", lambda *args: False)


@_mutant("output_slot_overwritten_early", "race", ("differential", "lifetime"), "racing", ("outputs",),
         "pinned output slot handed to the next step's D2H before the previous step's holder read it")
def _output_slot_overwritten_early(runner: Any, m: AppliedMutant) -> None:
    m.set(runner.outputs, "acquire", lambda: 0)


# ---- hidden syncs


@_mutant("item_in_step", "sync", ("sync",), "steady", ("state",),
         "a debug log in the step reads each row's device num_computed with .item()")
def _item_in_step(runner: Any, m: AppliedMutant) -> None:
    state = runner.state
    advance = state.advance

    def advance_with_debug_log(req_ids: Any, num_scheduled: Any, num_drafts: Any) -> None:
        for req_id in req_ids:
            row = state.row_of(req_id)
            _log.debug("row %d num_computed %d", row, state.base[row, NUM_COMPUTED].item())
        advance(req_ids, num_scheduled, num_drafts)

    m.set(state, "advance", advance_with_debug_log)


@_mutant("synchronize_in_step", "sync", ("sync",), "steady", ("device",),
         "torch.cuda.synchronize() before the step timer stops, for 'accurate' host timings")
def _synchronize_in_step(runner: Any, m: AppliedMutant) -> None:
    record_stats = runner._record_stats

    def record_stats_synchronized(*args: Any) -> None:
        if runner.device.is_cuda:
            torch.cuda.synchronize()
        else:
            runner.device.synchronize()
        record_stats(*args)

    m.set(runner, "_record_stats", record_stats_synchronized)


@_mutant("tensor_in_python_if", "sync", ("sync",), "prompt-logprobs", ("sampling_state",),
         "the eager step's penalty-count kernel is skipped with `if not (valid != 0).any():` on a device tensor")
def _tensor_in_python_if(runner: Any, m: AppliedMutant) -> None:
    sampling_state = runner.sampling_state
    enqueue_post_update = sampling_state.enqueue_post_update

    def enqueue_unless_nothing_accepted(rows: Any, tokens: Any, valid: Any, num: int) -> None:
        if valid is not None and not (valid[:num] != 0).any():
            return
        enqueue_post_update(rows, tokens, valid, num)

    m.set(sampling_state, "enqueue_post_update", enqueue_unless_nothing_accepted)


# ---- state


@_mutant("stale_row_after_preempt", "state", ("differential",), "row-reuse",
         ("state", "sampling_state", "_update_rows", "_admission_writers"),
         "preemption frees a row without bumping its generation: the next request admitted there looks like the "
         "old one, so its sampling params, seed and penalty counts are never uploaded")
def _stale_row_after_preempt(runner: Any, m: AppliedMutant) -> None:
    state, sampling_state, update_rows = runner.state, runner.sampling_state, runner._update_rows
    release, add_request = state.release, sampling_state.add_request
    preempting: set[str] = set()
    stale_rows: set[int] = set()

    def update_rows_tracking_preemption(sched: Any) -> Any:
        preempting.clear()
        preempting.update(sched.preempted_req_ids)
        return update_rows(sched)

    def release_keeping_generation(req_id: str) -> int:
        row = release(req_id)
        if req_id in preempting:
            stale_rows.add(row)
        else:
            stale_rows.discard(row)
        return row

    def add_request_unless_row_looks_current(row: int, *args: Any, **kwargs: Any) -> None:
        if row in stale_rows:
            stale_rows.discard(row)
            return
        add_request(row, *args, **kwargs)

    m.set(runner, "_update_rows", update_rows_tracking_preemption)
    m.set(state, "release", release_keeping_generation)
    m.set(sampling_state, "add_request", add_request_unless_row_looks_current)
    # Admissions through the owners' methods (`AdmissionWriters.derive` None: no C twin), where the bug lives.
    m.set(runner, "_admission_writers", dataclasses.replace(runner._admission_writers, derive=None))


@_mutant("staged_writes_wrong_order", "state", ("differential", "provenance"), "row-reuse", ("state",),
         "the staged-diff merge keeps the first write to a cell: a row whose state is poisoned (-1) at release "
         "and re-admitted in the same step keeps the poison")
def _staged_writes_wrong_order(runner: Any, m: AppliedMutant) -> None:
    state = runner.state
    release, row_state = state.release, state.row_state

    def release_poisoning_row(req_id: str) -> int:
        row = release(req_id)
        row_state.stage(row, 0, [-1] * NUM_ROW_FIELDS)  # harmless when later writes win: the admission's follow
        return row

    def first_write_wins() -> list[tuple[int, int, list]]:
        cells: dict[tuple[int, int], Any] = {}
        for row, start, values in row_state._pending:
            for j, v in enumerate(values):
                cells.setdefault((row, start + j), v)
        return [(row, col, [v]) for (row, col), v in sorted(cells.items())]

    m.set(state, "release", release_poisoning_row)
    m.set(row_state, "_merged_diffs", first_write_wins)


def _launch_set_from_first_request(runner: Any, m: AppliedMutant, count: str, counts: Callable[[Any], bool]) -> None:
    """The sampler launch set a host count of the request table chooses (``count``: `RequestStateTable.num_random_rows`
    for `all_greedy`, ``num_filtered_rows`` for `unfiltered`) decided from the batch's first request alone
    (``counts(params)``: whether that request counts), the real count kept across admissions and releases."""
    import runnercheck.impl.runner as runner_module

    state, update_rows, plan_step = runner.state, runner._update_rows, runner_module.plan_step
    true_count = [getattr(state, count)]

    def update_rows_on_the_true_count(sched: Any) -> Any:
        setattr(state, count, true_count[0])  # admissions and releases move the real count
        seeds = update_rows(sched)
        true_count[0] = getattr(state, count)
        return seeds

    def plan_then_decide_from_the_first_request(step: Any, table: Any, previous: Any = None) -> Any:
        plan = plan_step(step, table, previous)
        if table is state and plan.num_reqs:  # what the step then reads as the launch set's flag
            setattr(state, count, int(counts(state.rows[int(plan.rows[0])].params)))
        return plan

    m.set(runner, "_update_rows", update_rows_on_the_true_count)
    m.set(runner_module, "plan_step", plan_then_decide_from_the_first_request)


@_mutant("greedy_from_first_request", "state", ("differential",), "greedy-mix", ("state", "_update_rows"),
         "the all-greedy sampler launch is chosen from the batch's first request alone: when it is greedy, the rows "
         "behind it that sample with a temperature are argmaxed")
def _greedy_from_first_request(runner: Any, m: AppliedMutant) -> None:
    _launch_set_from_first_request(runner, m, "num_random_rows", lambda params: params.temperature != 0)


@_mutant("unfiltered_from_first_request", "state", ("differential",), "filter-mix", ("state", "_update_rows"),
         "the sampler's unfiltered launch set (no filter launches) is chosen from the batch's first request alone: when "
         "it has no filter on, the filtered rows behind it keep the plan's plain argmax")
def _unfiltered_from_first_request(runner: Any, m: AppliedMutant) -> None:
    _launch_set_from_first_request(runner, m, "num_filtered_rows", lambda params: params.filtered)


@_mutant("num_computed_not_advanced", "state", ("differential", "provenance"), "steady", ("state",),
         "post-update stores NUM_TOKENS and LAST_TOKEN but lost the NUM_COMPUTED store")
def _num_computed_not_advanced(runner: Any, m: AppliedMutant) -> None:
    import runnercheck.impl.eager_step as eager_step_module
    import runnercheck.impl.graph_step as graph_step_module
    from runnercheck.stress.mutants.graphs import recapture_graphs

    launch, row_state = eager_step_module.launch_post_update, runner.state.base

    def launch_keeping_num_computed(**kwargs: Any) -> None:
        if kwargs["row_state"] is not row_state:  # another runner in this process: untouched
            return launch(**kwargs)
        kept = row_state[:, NUM_COMPUTED].clone()
        launch(**kwargs)
        row_state[:, NUM_COMPUTED].copy_(kept)

    # The eager step's launch and the bucketed steps' (graphs captured again with it).
    m.set(eager_step_module, "launch_post_update", launch_keeping_num_computed)
    m.set(graph_step_module, "launch_post_update", launch_keeping_num_computed)
    recapture_graphs(runner, m)


def _after_input_prep(runner: Any, m: AppliedMutant, fix: Callable[[Any, Any], None], label: str) -> None:
    """Enqueue ``fix(input_batch, plan)`` as device work right after the step's input-prep kernel."""
    input_batch = runner.input_batch
    enqueue_prepare = input_batch.enqueue_prepare

    def enqueue_prepare_then_fix(plan: Any, staged: Any, state: Any, block_table: Any) -> None:
        enqueue_prepare(plan, staged, state, block_table)
        runner.device.enqueue(lambda: fix(input_batch, plan), label)

    m.set(input_batch, "enqueue_prepare", enqueue_prepare_then_fix)
    from runnercheck.stress.mutants.graphs import after_graph_input_prep  # bucketed steps run input prep inside a graph

    after_graph_input_prep(runner, m, fix, label)


@_mutant("idx_mapping_off_by_one", "state", ("differential",), "decode", ("input_batch", "state", "device"),
         "the sampler's gather through idx_mapping is off by one: each logit row reads the next state row's "
         "params, seed and penalty counts")
def _idx_mapping_off_by_one(runner: Any, m: AppliedMutant) -> None:
    num_rows = runner.state.max_num_reqs

    def shift(ib: Any, plan: Any) -> None:
        ib.logits_state_rows[: plan.num_sampling_rows].add_(1).remainder_(num_rows)

    _after_input_prep(runner, m, shift, "mutant: sampler rows + 1")


def _batch_index(ib: Any, plan: Any) -> torch.Tensor:
    """The batch position of each of the step's tokens, from the device's query_start_loc (no host read).

    A mixed bucket's padding tokens lie past every request's: they get the last (padding, empty) request,
    not an index past the batch (a device-side assert on the GPU, at the capture's warm-up already)."""
    token_index = torch.arange(plan.num_tokens, device=ib.positions.device, dtype=torch.int32)
    index = torch.searchsorted(ib.query_start_loc[1 : plan.num_reqs + 1], token_index, right=True)
    return index.clamp_(max=plan.num_reqs - 1)


@_mutant("positions_off_by_one", "state", ("differential", "provenance"), "decode", ("input_batch", "device"),
         "a decode token's position is NUM_TOKENS instead of NUM_TOKENS - 1 (prefill positions right), so its "
         "RoPE phase is one step off from the cached keys'")
def _positions_off_by_one(runner: Any, m: AppliedMutant) -> None:
    def shift_decodes(ib: Any, plan: Any) -> None:
        query_lens = ib.query_start_loc[1 : plan.num_reqs + 1] - ib.query_start_loc[: plan.num_reqs]
        ib.positions[: plan.num_tokens] += (query_lens[_batch_index(ib, plan)] == 1).to(torch.int64)

    _after_input_prep(runner, m, shift_decodes, "mutant: decode positions + 1")


@_mutant("slot_mapping_wrong_block", "state", ("differential", "provenance"), "steady", ("input_batch", "block_table", "device"),
         "slot mapping looks up the token's block one entry too far: block_table[row][pos // block_size + 1]")
def _slot_mapping_wrong_block(runner: Any, m: AppliedMutant) -> None:
    block_size = runner.block_table.block_size

    def next_block_slots(ib: Any, plan: Any) -> None:
        n, width = plan.num_tokens, ib.block_table.shape[1]
        pos = ib.positions[:n]
        column = torch.clamp(pos // block_size + 1, max=width - 1)
        ib.slot_mapping[:n] = ib.block_table[_batch_index(ib, plan), column].to(torch.int64) * block_size + pos % block_size

    _after_input_prep(runner, m, next_block_slots, "mutant: slot mapping")


# ---- sampler


def _wrap_state(target: Any, m: AppliedMutant, views: Callable[[Any], dict[str, torch.Tensor]]) -> None:
    """Sample with a copy of the state whose parameter tensors are rewritten (on the device, in the launch)."""
    sampler = target.sampler
    sample = sampler.sample

    def sample_with_rewritten_params(logits: Any, state: Any, *args: Any, **kwargs: Any) -> Any:
        bent = copy.copy(state)
        for name, base in views(state).items():  # the launch reads only ``.base`` of each parameter
            setattr(bent, name, SimpleNamespace(base=base))
        return sample(logits, bent, *args, **kwargs)

    m.set(sampler, "sample", sample_with_rewritten_params)


@_mutant("fp16_gumbel_noise", "sampler", ("chisq",), "noise", ("sampler",),
         "Gumbel noise computed in fp16: u < 2^-25 rounds to 0 (+inf noise), noise keeps 11 significant bits",
         needs_gpu=True, chisq_case="fp16-noise")
def _fp16_noise(target: Any, m: AppliedMutant) -> None:
    launch_variant(target, m, sampling_kernels_variant("fp16_noise", gumbel_noise=fp16_gumbel_noise,
                                                       _noisy_chunk_argmax=fp16_chunk_argmax))


@_mutant("u24_uniform", "sampler", ("chisq",), "noise", ("sampler",),
         "uniforms truncated to 24 bits (torch.rand-style): u can be 0 (+inf noise), noise capped near 16.6",
         needs_gpu=True, chisq_case="u24-uniform")
def _u24_uniform(target: Any, m: AppliedMutant) -> None:
    launch_variant(target, m, sampling_kernels_variant("u24_uniform", gumbel_noise=u24_gumbel_noise,
                                                       _noisy_chunk_argmax=u24_chunk_argmax))


@_mutant("top_k_off_by_one", "sampler", ("differential", "chisq"), "top-k", ("sampler",),
         "top-k keeps k + 1 tokens (a `<= k` where `< k` was meant)", chisq_case="top-k-off-by-one")
def _top_k_off_by_one(target: Any, m: AppliedMutant) -> None:
    _wrap_state(target, m, lambda s: {"top_k": torch.where(s.top_k.base > 0, s.top_k.base + 1, s.top_k.base)})


@_mutant("top_p_boundary_dropped", "sampler", ("differential", "chisq"), "top-p", ("sampler",),
         "top-p keeps s > tau instead of s >= tau, dropping the token whose mass crosses top_p",
         chisq_case="top-p-drop-boundary")
def _top_p_boundary_dropped(target: Any, m: AppliedMutant) -> None:
    launch_variant(target, m, sampling_kernels_variant("strict_top_p", _filtered_threshold=strict_top_p_threshold()))


@_mutant("temperature_twice", "sampler", ("differential", "chisq"), "temperature", ("sampler",),
         "temperature applied twice (once in the logits processor, once in the sampler)", chisq_case="temperature-twice")
def _temperature_twice(target: Any, m: AppliedMutant) -> None:
    _wrap_state(target, m, lambda s: {"temperature": s.temperature.base * s.temperature.base})


@_mutant("penalty_sign_flipped", "sampler", ("differential", "chisq"), "penalties", ("sampler",),
         "penalties applied with the wrong sign: repeated tokens are rewarded", chisq_case="penalty-wrong-sign")
def _penalty_sign_flipped(target: Any, m: AppliedMutant) -> None:
    _wrap_state(target, m, lambda s: {"repetition_penalty": 1.0 / s.repetition_penalty.base,
                                      "frequency_penalty": -s.frequency_penalty.base,
                                      "presence_penalty": -s.presence_penalty.base})


@_mutant("logprobs_from_processed", "sampler", ("differential",), "logprobs", ("sampler",),
         "logprobs computed from temperature-scaled logits instead of the raw logits")
def _logprobs_from_processed(target: Any, m: AppliedMutant) -> None:
    from runnercheck.impl.sample import SamplerOutput

    sampler = target.sampler
    sample = sampler.sample

    def sample_then_logprobs_of_scores(logits: Any, state: Any, rows: Any, positions: Any, *, num_rows: int,
                                       draft_prefix: Any = None, max_num_logprobs: int = -1, **flags: Any) -> Any:
        out = sample(logits, state, rows, positions, num_rows=num_rows, draft_prefix=draft_prefix, max_num_logprobs=-1,
                     **flags)
        if max_num_logprobs < 0 or num_rows == 0:
            return out
        temperature = state.temperature.base[rows[:num_rows].long()]
        scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
        scores = (logits[:num_rows] / scale[:, None]).contiguous()
        lp = sampler.logprobs.launch(scores, out.tokens, num_rows, max_num_logprobs)
        return SamplerOutput(out.tokens, out.nan_flags, lp.logprob, lp.rank, lp.top_ids, lp.top_logprobs)

    m.set(sampler, "sample", sample_then_logprobs_of_scores)
    # Bucketed steps with logprobs (mixed prefills, decodes) replay captured launches: capture them with the bug.
    from runnercheck.stress.mutants.graphs import recapture_graphs

    recapture_graphs(target, m)


# --------------------------------------------------------------------------- entry points


def get(name: str) -> Mutant:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise UnknownMutantError(f"unknown mutant {name!r}; known: {', '.join(CATALOGUE)}") from None


def apply(name: str, *, runner: Any = None, device: Any = None, target: Any = None, scheduler: Any = None) -> AppliedMutant:
    """Install mutant ``name`` into ``runner`` (or ``target``: any object with the parts it patches;
    a ``target="scheduler"`` mutant into ``scheduler``, a ``target="device"`` one into ``device``).

    Runner mutants use the runner's own device, not ``device``.
    Raises `UnknownMutantError` or `MutantTargetError` before patching anything.
    """
    mutant = get(name)
    if target is None:
        target = {"scheduler": scheduler, "device": device}.get(mutant.target, runner)
    missing = [part for part in mutant.requires if not hasattr(target, part)]
    if target is None or missing:
        raise MutantTargetError(f"mutant {name!r} patches {', '.join(mutant.requires)}, "
                                f"which {type(target).__name__} lacks ({', '.join(missing) or 'no target'})")
    applied = AppliedMutant(mutant)
    try:
        mutant.install(target, applied)
    except Exception:
        applied.undo()
        raise
    return applied


# The prefix-caching and CUDA-graph mutants live in their own modules and register into the same
# catalogue (`runnercheck.stress.mutants.registry`); imported here, after the core ones, so the catalogue lists
# them last and importing this module gives all of them.
import runnercheck.stress.mutants.graphs  # noqa: E402,F401
import runnercheck.stress.mutants.prefix  # noqa: E402,F401
import runnercheck.stress.mutants.streams  # noqa: E402,F401
import runnercheck.stress.mutants.spec  # noqa: E402,F401
import runnercheck.stress.mutants.reach  # noqa: E402,F401
import runnercheck.stress.mutants.batch  # noqa: E402,F401
import runnercheck.stress.mutants.logprobs  # noqa: E402,F401

__all__ = ["CATALOGUE", "CLASSES", "RUN_CHECKS", "known_checks", "WORKLOADS", "AppliedMutant", "Mutant", "MutantTargetError",
           "UnknownMutantError", "Workload", "apply", "get"]
