"""The scheduler simulator's KV block pool with a prefix cache: hashes, reference counts, LRU eviction.

A block is in exactly one of three places:

* **free** -- holds nothing reusable; handed out last-freed-first (the most race-prone reuse);
* **held** -- referenced by one or more running requests (``refcount > 0``); a cached block may be
  held by several requests at once (a shared system prompt);
* **evictable** -- cached (its KV is the full block of a known token prefix) but unreferenced;
  a later request with the same prefix takes it back (a hit), otherwise it is evicted least
  recently released first once the free list is empty.

A block's hash is `block_hash(parent, tokens)`: the hash of its ``block_size`` tokens chained with
the hash of everything before it, so equal hashes mean equal whole prefixes.  Only full blocks
whose positions were computed and whose tokens are known are cached (`register`), by the
simulator (`runnercheck.stress.sim.scheduler.SchedulerSim`), which also decides that a hit never covers a whole
prefill and that a request asking for prompt logprobs never looks the cache up.

Ownership: a `PrefixCache` owns its free list, LRU, hash maps and reference counts (host Python
state, one scheduler's lifetime), written only by its own methods.  With ``enabled=False`` it is the
plain pool (``register`` and ``lookup`` do nothing).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Mapping, Sequence

ROOT_HASH = 0


class PrefixCacheError(RuntimeError):
    """Misuse of the pool (allocating more than is available, releasing an unheld block) or broken invariants."""


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    """The chained hash of one full block (deterministic across processes: ints and tuples only)."""
    return hash((parent, tuple(tokens)))


def prefix_block_hashes(tokens: Sequence[int], block_size: int, num_blocks: int, known: Sequence[int] = ()) -> list[int]:
    """Chained hashes of the first ``num_blocks`` full blocks of ``tokens``; ``known`` are already-computed leading ones."""
    hashes = list(known[:num_blocks])
    for j in range(len(hashes), num_blocks):
        hashes.append(block_hash(hashes[-1] if hashes else ROOT_HASH, tokens[j * block_size:(j + 1) * block_size]))
    return hashes


class PrefixCache:
    """See the module docstring."""

    def __init__(self, free_blocks: Iterable[int], block_size: int, *, enabled: bool = True):
        self.block_size = block_size
        self.enabled = enabled
        self._free: list[int] = list(free_blocks)  # popped from the end
        self.num_blocks = len(self._free)
        self._refcount: dict[int, int] = {}
        self._hash_of: dict[int, int] = {}  # cached block -> its hash
        self._block_of: dict[int, int] = {}  # hash -> cached block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # least recently released first
        self.num_evictions = 0

    # ---------------------------------------------------------------- queries
    @property
    def num_available(self) -> int:
        """Blocks an allocation can get: free ones plus unreferenced cached ones (by eviction)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self._block_of)

    def refcount(self, block: int) -> int:
        return self._refcount.get(block, 0)

    def is_cached(self, block: int) -> bool:
        return block in self._hash_of

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """The cached blocks of the longest run of leading ``hashes`` (pure)."""
        if not self.enabled:
            return []
        found = []
        for h in hashes:
            block = self._block_of.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def lookup_prefix(self, tokens: Sequence[int]) -> tuple[list[int], list[int]]:
        """(hashes of the full blocks a hit may cover, the cached blocks of its longest matching run).

        A hit covers at most ``(len(tokens) - 1) // block_size`` blocks: the last position is always
        computed (to sample from).  Pure.
        """
        if not self.enabled:
            return [], []
        hashes = prefix_block_hashes(tokens, self.block_size, (len(tokens) - 1) // self.block_size)
        return hashes, self.lookup(hashes)

    def cache_computed(self, blocks: Sequence[int], tokens: Sequence[int], num_computed: int, hashes: list[int]) -> list[int]:
        """Cache a running request's full blocks whose positions were computed and whose tokens are known.

        ``hashes`` are those of its leading blocks already cached (or hit); returns the extended list.
        """
        if not self.enabled:
            return hashes
        full = min(num_computed, len(tokens), len(blocks) * self.block_size) // self.block_size
        if full <= len(hashes):
            return hashes
        extended = prefix_block_hashes(tokens, self.block_size, full, hashes)
        for j in range(len(hashes), full):
            self.register(blocks[j], extended[j])
        return extended

    def num_evictable_among(self, blocks: Iterable[int]) -> int:
        return sum(1 for b in blocks if b in self._evictable)

    # ---------------------------------------------------------------- changes
    def take(self, blocks: Sequence[int]) -> None:
        """Reference cached blocks a hit hands to a new request (unreferenced ones leave the LRU)."""
        for b in blocks:
            if b not in self._hash_of:
                raise PrefixCacheError(f"block {b} taken as a hit but not cached")
            self._evictable.pop(b, None)
            self._refcount[b] = self._refcount.get(b, 0) + 1

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks (refcount 1): free ones first, then evicting the least recently released."""
        if n > self.num_available:
            raise PrefixCacheError(f"{n} blocks asked for, {self.num_available} available")
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.pop()
            else:
                b, _ = self._evictable.popitem(last=False)
                self._evict(b)
            self._refcount[b] = 1
            out.append(b)
        return out

    def _evict(self, block: int) -> None:
        h = self._hash_of.pop(block)
        del self._block_of[h]
        self.num_evictions += 1

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block (a finished or preempted request's list).

        Released in reverse, so a request's tail blocks are evicted (and its leading, most shared
        blocks kept) first, and its first block is the next one a free-list allocation reuses.
        """
        for b in reversed(blocks):
            count = self._refcount.get(b, 0)
            if count <= 0:
                raise PrefixCacheError(f"release of block {b}, which no request holds")
            if count > 1:
                self._refcount[b] = count - 1
                continue
            del self._refcount[b]
            if b in self._hash_of:
                self._evictable[b] = None
            else:
                self._free.append(b)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def evict(self, n: int) -> int:
        """Evict up to ``n`` unreferenced cached blocks (least recently released first) to the free list,
        as memory pressure from outside would; returns how many were evicted."""
        count = 0
        while count < n and self._evictable:
            block, _ = self._evictable.popitem(last=False)
            self._evict(block)
            self._free.append(block)
            count += 1
        return count

    def register(self, block: int, h: int) -> bool:
        """Cache a held block whose full KV is the prefix hashed ``h``.  False when it is not cached:
        caching is off, the block already is, or another block already holds that prefix."""
        if not self.enabled or block in self._hash_of or h in self._block_of:
            return False
        if self._refcount.get(block, 0) <= 0:
            raise PrefixCacheError(f"register of block {block}, which no request holds")
        self._hash_of[block] = h
        self._block_of[h] = block
        return True

    # ---------------------------------------------------------------- checks
    def check(self, held: Mapping[str, Sequence[int]]) -> None:
        """Raise `PrefixCacheError` unless the pool agrees with the block lists of the running requests."""
        counts: dict[int, int] = {}
        for rid, blocks in held.items():
            if len(set(blocks)) != len(blocks):
                raise PrefixCacheError(f"request {rid!r} holds a block twice: {list(blocks)}")
            for b in blocks:
                counts[b] = counts.get(b, 0) + 1
        if counts != self._refcount:
            wrong = sorted(b for b in set(counts) | set(self._refcount) if counts.get(b, 0) != self._refcount.get(b, 0))
            b = wrong[0]
            raise PrefixCacheError(f"block {b}: refcount {self._refcount.get(b, 0)} but held by {counts.get(b, 0)} request(s)")
        free, evictable = set(self._free), set(self._evictable)
        if len(free) != len(self._free) or free & evictable or free & set(counts) or evictable & set(counts):
            raise PrefixCacheError("free, evictable and held blocks overlap")
        if len(free) + len(evictable) + len(counts) != self.num_blocks:
            raise PrefixCacheError("free, evictable and held blocks do not partition the KV blocks")
        if any(b not in self._hash_of for b in evictable):
            raise PrefixCacheError("an evictable block is not cached")
        if any(self._block_of.get(h) != b for b, h in self._hash_of.items()) or len(self._block_of) != len(self._hash_of):
            raise PrefixCacheError("the hash -> block and block -> hash maps disagree")
        if free & set(self._hash_of):
            raise PrefixCacheError("a free block is still cached")
