"""Prefix-caching mutants: KV-block bugs in the runner's admission and in the scheduler's prefix cache.

Registered into the catalogue (`runnercheck.stress.mutants.registry.CATALOGUE`) when `runnercheck.stress.mutants.catalogue` is imported.  Each is killed by the
KV provenance check (`runnercheck.checks.detectors.kv_provenance`) and/or the differential against the oracle:

* runner bugs (``target="runner"``, patching a `runnercheck.impl.runner.ModelRunner` instance):
  ``prefix_hit_recomputes_cached_block`` (cached positions re-written) and
  ``block_table_tail_kept`` (a new request's row keeps the previous owner's block-table tail);
* scheduler bugs (``target="scheduler"``, patching a `runnercheck.stress.sim.scheduler.SchedulerSim` instance --
  the runner executes what it is told, so the checks must see the KV mix-up the schedule causes):
  ``prefix_hit_one_block_too_long``, ``evicted_block_still_referenced`` and
  ``refcount_dropped_on_preemption``.

All run under the ``prefix`` workload: shared system prompts, short outputs, preemptions and a
small block pool, so hits, sharing, eviction and reuse all happen within a few ticks.  The
scheduler mutants keep the pool's own bookkeeping self-consistent enough not to raise (the bug
is in *which* block is handed out, not a crash of the simulator).
"""
from __future__ import annotations

from typing import Any

from runnercheck.impl.state import NUM_COMPUTED
from runnercheck.stress.mutants.workloads import PREFIX_WORKLOAD
from runnercheck.stress.mutants.registry import AppliedMutant, _mutant
from runnercheck.stress.sim.prefix_cache import PrefixCacheError

# ---- runner bugs


@_mutant("prefix_hit_recomputes_cached_block", "state", ("provenance", "differential"), "prefix", ("state",),
         "admission starts a request with a prefix hit one block early (NUM_COMPUTED = hit - block_size): its "
         "prefill re-writes the last cached block, which other requests share")
def _prefix_hit_recomputes_cached_block(runner: Any, m: AppliedMutant) -> None:
    state, block_size = runner.state, runner.limits.block_size
    admit = state.admit_staged

    def admit_one_block_early(req: Any, base_seed: int, writers: Any, seeds: dict) -> int:
        row = admit(req, base_seed, writers, seeds)
        if req.num_computed_tokens:
            state.row_state.stage(row, NUM_COMPUTED, [req.num_computed_tokens - block_size])  # the later write wins
        return row

    m.set(state, "admit_staged", admit_one_block_early)


@_mutant("block_table_tail_kept", "state", ("provenance", "differential"), "prefix", ("state",),
         "a freed row keeps its block count and admission only grows it (max): a new request's row keeps the "
         "previous owner's block-table tail, and its appended blocks land after that stale tail")
def _block_table_tail_kept(runner: Any, m: AppliedMutant) -> None:
    # The block count of a row is the request state's (`RequestStateTable.num_blocks`, where `append_blocks`
    # places the appends); the release leaves it, the admission here keeps the larger of it and the new list's.
    state = runner.state
    admit = state.admit_staged

    def admit_keeping_count(req: Any, base_seed: int, writers: Any, seeds: dict) -> int:
        before = state.num_blocks.copy()
        row = admit(req, base_seed, writers, seeds)
        state.num_blocks[row] = max(int(before[row]), len(req.block_ids))
        return row

    m.set(state, "admit_staged", admit_keeping_count)


# ---- scheduler (prefix cache) bugs


@_mutant("prefix_hit_one_block_too_long", "state", ("provenance", "differential"), "prefix", ("blocks",),
         "the prefix-cache lookup counts one block past the last match (it takes the least recently used cached "
         "block as the next one): the hit is one block too long and that block holds another prefix's KV",
         target="scheduler")
def _prefix_hit_one_block_too_long(scheduler: Any, m: AppliedMutant) -> None:
    cache = scheduler.blocks
    lookup = cache.lookup

    def lookup_one_too_many(hashes: Any) -> list[int]:
        found = lookup(hashes)
        if len(found) < len(hashes):
            extra = next((b for b in cache._evictable if b not in found), None)
            if extra is not None:
                found = found + [extra]
        return found

    m.set(cache, "lookup", lookup_one_too_many)


@_mutant("evicted_block_still_referenced", "state", ("provenance", "differential"), "prefix", ("blocks",),
         "eviction takes the oldest cached block without checking its reference count: a block still in a "
         "running request's table is handed to another request, which overwrites it", target="scheduler")
def _evicted_block_still_referenced(scheduler: Any, m: AppliedMutant) -> None:
    cache = scheduler.blocks

    def allocate_evicting_oldest_cached(n: int) -> list[int]:
        if n > cache.num_available:
            raise PrefixCacheError(f"{n} blocks asked for, {cache.num_available} available")
        out = []
        for _ in range(n):
            if cache._free:
                block = cache._free.pop()
            else:
                block = next(iter(cache._hash_of))  # oldest registered: referenced or not
                cache._evictable.pop(block, None)
                cache._evict(block)
            cache._refcount[block] = cache._refcount.get(block, 0) + 1
            out.append(block)
        return out

    m.set(cache, "allocate", allocate_evicting_oldest_cached)


@_mutant("refcount_dropped_on_preemption", "state", ("provenance", "differential"), "prefix", ("blocks", "_preempt"),
         "preemption drops every reference to the victim's blocks, shared ones included, and returns them to the "
         "free list: blocks other running requests still read are the next ones handed out", target="scheduler")
def _refcount_dropped_on_preemption(scheduler: Any, m: AppliedMutant) -> None:
    cache = scheduler.blocks
    preempt, release = scheduler._preempt, cache.release

    def preempt_dropping_all_references(req: Any) -> None:
        for block in req.blocks:
            if cache._refcount.get(block, 0) > 1:
                cache._refcount[block] = 1  # the victim's release below takes it to zero ...
                cache._block_of.pop(cache._hash_of.pop(block, None), None)  # ... and, uncached, to the free list
        preempt(req)

    def release_skipping_dropped(blocks: Any) -> None:  # the other holders' later releases find nothing to drop
        release([b for b in blocks if cache._refcount.get(b, 0) > 0])

    m.set(scheduler, "_preempt", preempt_dropping_all_references)
    m.set(cache, "release", release_skipping_dropped)


PREFIX_MUTANTS = ("prefix_hit_recomputes_cached_block", "block_table_tail_kept", "prefix_hit_one_block_too_long",
                  "evicted_block_still_referenced", "refcount_dropped_on_preemption")

__all__ = ["PREFIX_MUTANTS", "PREFIX_WORKLOAD"]
