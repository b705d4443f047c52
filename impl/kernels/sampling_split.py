"""Split-row building blocks shared by the sampler and logprobs kernels (Triton device functions).

A logit row is read by ``num_blocks = cdiv(V, CHUNK)`` programs, one per vocabulary chunk, each
writing a few per-(row, chunk) partials; a separate one-program-per-row launch combines them
(stream order is the only synchronisation: no atomics, no last-arrival counters; the logprobs
kernel is the exception, `runnercheck.impl.kernels.sampling_logprobs` says why).

Threshold selection without sorting the vocabulary uses the chunk maxima: the ``k``-th largest of
the per-chunk maxima is ``k`` distinct entries of the row, so it is at most the row's ``k``-th
largest entry.  Every entry at or above it is therefore a superset of the top ``k`` (ties
included), and usually a small one.  A second split pass reads only the chunks whose maximum
reaches that bound, storing each chunk's entries into its own fixed ``SLOT``-entry region;
`compact_block_candidates` concatenates the regions (chunk order = token order) into one
candidate list of at most ``CAND`` entries; selections on it count (``[CAND, COLS]`` comparisons)
instead of sorting it.  A chunk holding more than ``SLOT`` such entries, or a
row with more than ``CAND``, reports overflow, and the caller hands that row to its per-row
fallback kernel (same contract, slower).
"""
from __future__ import annotations

import triton
import triton.language as tl

from runnercheck.impl.kernels.sampling_select import EMPTY_CANDIDATE, pack_candidate, unpack_candidate

# Per-row plan written by a combine launch and read by the later launches of the same step.
MODE_DONE = tl.constexpr(0)       # token (and flag) final after the first combine
MODE_GATHER = tl.constexpr(1)     # candidates >= row bound gathered by the second split pass
MODE_THRESHOLD = tl.constexpr(2)  # split Gumbel-max over scores >= row bound (min-p only)
MODE_FALLBACK = tl.constexpr(3)   # the per-row fallback kernel does the whole row


@triton.jit
def reduce_block_argmax(best_ptr, token_ptr, base, num_blocks, vocab_size, NB_P2: tl.constexpr):
    """Row argmax from per-chunk (best value, lowest token at it); lowest token on ties; 0 if all -inf."""
    blocks = tl.arange(0, NB_P2)
    valid = blocks < num_blocks
    best = tl.load(best_ptr + base + blocks, mask=valid, other=float("-inf"))
    token = tl.load(token_ptr + base + blocks, mask=valid, other=vocab_size)
    top = tl.max(best, axis=0)
    chosen = tl.min(tl.where(valid & (best == top), token, vocab_size), axis=0)
    return tl.where((top == float("-inf")) | (chosen >= vocab_size), 0, chosen)


@triton.jit
def kth_largest_block_max(max_ptr, base, num_blocks, k, NB_P2: tl.constexpr, COLS: tl.constexpr):
    """The ``k``-th largest chunk maximum, counting ties (a lower bound on the row's ``k``-th largest entry).

    By counting, not sorting: entry ``i`` is the answer when ``#{v_j > v_i} < k <= #{v_j >= v_i}``.
    Loads bypass L1 (``.cg``): the logprobs kernel calls this in the same launch that wrote the
    maxima, from whichever SM finishes the row, whose L1 may hold a neighbouring row's older line.
    """
    blocks = tl.arange(0, NB_P2)
    cols = tl.arange(0, COLS)
    value = tl.load(max_ptr + base + blocks, mask=blocks < num_blocks, other=float("-inf"), cache_modifier=".cg")
    greater = tl.zeros((NB_P2,), tl.int32)
    at_least = tl.zeros((NB_P2,), tl.int32)
    for first in range(0, NB_P2, COLS):
        other = tl.load(max_ptr + base + first + cols, mask=first + cols < num_blocks, other=float("-inf"),
                        cache_modifier=".cg")
        greater += tl.sum((other[None, :] > value[:, None]).to(tl.int32), axis=1)
        at_least += tl.sum((other[None, :] >= value[:, None]).to(tl.int32), axis=1)
    return tl.max(tl.where((greater < k) & (at_least >= k), value, float("-inf")), axis=0)


@triton.jit
def store_block_candidates(score, offs, keep, slots_ptr, SLOT: tl.constexpr):
    """Store the kept entries of one chunk (token order) into its ``SLOT`` slots; return how many were kept."""
    slot = tl.cumsum(keep.to(tl.int32), axis=0) - 1
    tl.store(slots_ptr + slot, pack_candidate(score, offs), mask=keep & (slot < SLOT))
    return tl.sum(keep.to(tl.int32), axis=0)


@triton.jit
def compact_block_candidates(count_ptr, slots_ptr, base, num_blocks, scratch_row, CAND: tl.constexpr,
                             SLOT: tl.constexpr, GROUP: tl.constexpr):
    """``(overflow, candidates)``: the row's chunk regions concatenated (token order) in ``scratch_row``.

    ``count_ptr + base`` holds the per-chunk counts, ``slots_ptr`` the regions (``SLOT`` entries per
    chunk, chunk ``b`` of the row at ``(base + b) * SLOT``).  ``overflow`` (int32) is 1 when a chunk
    or the row held more entries than fit: the candidate list is then incomplete.  ``candidates``
    (``[CAND]`` packed keys, unsorted, EMPTY_CANDIDATE past the end) is also left in ``scratch_row``
    for `descending_ranks`.
    """
    group = tl.arange(0, GROUP)
    lanes = tl.arange(0, SLOT)
    total = tl.full((), 0, tl.int32)
    overflow = tl.full((), 0, tl.int32)
    for first in range(0, num_blocks, GROUP):
        blk = first + group
        counts = tl.load(count_ptr + base + blk, mask=blk < num_blocks, other=0)
        starts = total + tl.cumsum(counts, axis=0) - counts
        dest = starts[:, None] + lanes[None, :]
        take = (lanes[None, :] < counts[:, None]) & (dest < CAND)
        packed = tl.load(slots_ptr + (base + blk)[:, None] * SLOT + lanes[None, :], mask=take,
                         other=EMPTY_CANDIDATE)
        tl.store(scratch_row + dest, packed, mask=take)
        overflow = tl.maximum(overflow, (tl.max(counts, axis=0) > SLOT).to(tl.int32))
        total += tl.sum(counts, axis=0)
    overflow = tl.maximum(overflow, (total > CAND).to(tl.int32))
    slots = tl.arange(0, CAND)
    tl.store(scratch_row + slots, tl.full((CAND,), EMPTY_CANDIDATE, tl.int64), mask=slots >= total)
    tl.debug_barrier()  # the scratch row was written by other threads of this program
    return overflow, tl.load(scratch_row + slots)


@triton.jit
def descending_ranks(candidates, scratch_row, CAND: tl.constexpr, COLS: tl.constexpr):
    """Each candidate's position in descending key order (0 = largest), by counting, not sorting.

    Packed keys are distinct (they hold the token id), so the ranks are ``0 .. CAND - 1``; empty
    slots rank last.  ``scratch_row`` holds the same ``CAND`` keys (read in ``COLS``-wide slices).
    """
    cols = tl.arange(0, COLS)
    rank = tl.zeros((CAND,), tl.int32)
    for first in range(0, CAND, COLS):
        other = tl.load(scratch_row + first + cols)
        rank += tl.sum((other[None, :] > candidates[:, None]).to(tl.int32), axis=1)
    return rank


@triton.jit
def mass_at_or_above(candidates, scratch_row, row_max, kept_from, CAND: tl.constexpr, COLS: tl.constexpr):
    """Per candidate: the summed ``exp(s - row_max)`` of the kept candidates (``s >= kept_from``) whose
    key is at or above its own -- the cumulative mass in descending order, without sorting
    (``scratch_row`` holds the same keys, read in ``COLS``-wide slices).
    """
    cols = tl.arange(0, COLS)
    cum = tl.zeros((CAND,), tl.float32)
    for first in range(0, CAND, COLS):
        other = tl.load(scratch_row + first + cols)
        values, ids = unpack_candidate(other)
        kept = (other != EMPTY_CANDIDATE) & (values >= kept_from)
        other_weight = tl.where(kept, tl.exp(values - row_max), 0.0)
        cum += tl.sum(tl.where(other[None, :] >= candidates[:, None], other_weight[None, :], 0.0), axis=1)
    return cum
