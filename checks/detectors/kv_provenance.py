"""KV provenance: a shadow of the paged KV cache that knows whose tokens every slot holds.

Why: with prefix caching, KV blocks are shared between requests and outlive them, so the worst
bugs are silent KV mix-ups -- a hit one block too long, a shared block rewritten, an evicted block
still read, a block-table row that outlives its request.  The oracle catches their effect on tokens
(sometimes much later, sometimes never: random weights forgive a lot); this check names the cause.

What it records and checks
--------------------------
A shadow table holds, for every KV slot ``block * block_size + offset``, the provenance of the
last write: ``(token id, position, prefix hash)``, where the prefix hash is `prefix_hashes` of the
tokens before that position in the writer's sequence (a polynomial hash, so a step's hashes are a
prefix sum the device computes without the host).  Per request (keyed by the runner's state row)
it keeps the sequence the request *should* see: its prefill tokens (uploaded at its first
scheduled step, hit positions included) and, past the prefill, the token fed at each position.
Every step, from the model inputs the runner's input prep produced (after it, in stream order,
before the forward):

* writes -- each scheduled token's ``positions`` entry must be the position the schedule computes
  (``num_computed`` at the step start + its index: so cached positions are never written again),
  its ``slot_mapping`` entry the slot of that position in the request's own scheduler-given blocks,
  and a prefill token must be the request's prefill token there;  the shadow then records it;
* padding -- a bucketed step (graph replay) pads the batch to its bucket; every padding token
  must write nothing (a slot outside the cache): a padding request that aliases a live row writes
  that row's slot, which on a GPU is invisible in the tokens when both programs store the same
  values at once;
* reads -- for every position ``0 .. seq_len - 1`` of every scheduled request (what the attention
  kernel reads through the gathered block table), the shadow entry of the slot read must equal the
  request's expected ``(token, position, prefix hash)``; ``seq_lens`` must equal the schedule's.

A violation names the step, request, kind, position, block, slot and the expected vs found
provenance.  On ``cpu``/``sim`` every step is checked and violations are collected as they happen
(inside the enqueued work, where reading the CPU "device" is not a host sync).  On ``cuda`` the
shadow lives on the device, writes are shadowed every step and reads are checked on every
``sample_every``-th step; the first violation and a count are kept in device tensors the host reads
only in `KVProvenanceChecker.finish` (no sync in the step), and per-step inputs go up through
a ring of pinned buffers recycled by event query.

How it attaches (from outside ``impl``, like `runnercheck.checks.detectors.sync.arm_runner`): it wraps the runner
instance's ``execute_model`` (to see each `SchedulerOutput`) and ``_enqueue_device_step`` (to
enqueue the check right after the step's device work, eager or a graph replay, so it reads the
inputs the step actually used).  Apply mutants before arming, so the check sees what a mutant's
patched input prep produced.

Ownership: a `KVProvenanceChecker` owns the shadow (``shadow_tok/pos/hash``, ``[num_slots + 1]``
int64, the last entry a sink for invalid slots), the per-row expectations (``hist_tok`` ``[rows,
max_model_len]``, ``hist_hash`` ``[rows, max_model_len + 1]``, ``hist_blocks`` ``[rows,
max_blocks_per_req]``, ``prefill_len`` ``[rows]``) and on cuda the violation record -- all on the
runner's device (plain CPU tensors on cpu/sim), for the checker's lifetime, written only by the
check work it enqueues on the runner's stream -- plus the host-side request tracking and pinned
upload ring, written only by its hooks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

HASH_MODULUS = 8796093022151  # the largest prime below 2**43: (token + 1) * power stays below 2**61
HASH_BASE = 1_000_003
CUDA_SAMPLE_EVERY = 4
MAX_RECORDED = 64  # violations kept in detail on cpu/sim (all are counted)

KINDS = {1: "write-position", 2: "write-slot", 3: "write-token", 4: "read-provenance", 5: "seq-len", 6: "padding-write"}


def _powers(n: int) -> list[int]:
    out, p = [], 1
    for _ in range(n):
        out.append(p)
        p = p * HASH_BASE % HASH_MODULUS
    return out


def prefix_hashes(tokens: Sequence[int]) -> list[int]:
    """``h[p]`` for ``p = 0 .. len(tokens)``: the hash of ``tokens[:p]`` (``h[0] = 0``)."""
    h, out = 0, [0]
    for p, (tok, power) in enumerate(zip(tokens, _powers(len(tokens)))):
        h = (h + (int(tok) + 1) * power) % HASH_MODULUS
        out.append(h)
    return out


@dataclass(frozen=True)
class KVProvenanceViolation:
    """One mismatch.  ``expected``/``found`` are ``(token, position, prefix hash)`` (None: never written)."""

    step: int
    req_id: str
    kind: str
    position: int
    block: int
    slot: int
    expected: tuple[int, int, int] | None
    found: tuple[int, int, int] | None
    note: str = ""

    def line(self) -> str:
        head = f"step {self.step}: {self.kind} -- request {self.req_id!r} position {self.position}"
        if self.kind == "seq-len":
            return f"{head}: {self.note}"
        if self.kind == "padding-write":
            return f"step {self.step}: padding-write -- {self.req_id} wrote block {self.block}, slot {self.slot} ({self.note})"
        text = f"{head}, block {self.block}, slot {self.slot}: expected {_fmt(self.expected)}, found {_fmt(self.found)}"
        return f"{text} ({self.note})" if self.note else text


def _fmt(p: tuple[int, int, int] | None) -> str:
    if p is None or p[0] < 0:
        return "never written"
    return f"(token {p[0]}, position {p[1]}, prefix {p[2]:#x})"


class KVProvenanceError(AssertionError):
    """Raised by `KVProvenanceChecker.assert_clean` when any violation was seen."""


@dataclass
class _Tracked:
    """Host view of one live request: what the schedule told the runner."""

    prefill: tuple[int, ...]
    blocks: list[int]
    computed: int
    uploaded: bool = False


@dataclass
class _UploadRing:
    """Pinned host buffers for per-step inputs on cuda, reused once the event after their copy completed."""

    device: Any
    slots: list[list[Any]] = field(default_factory=list)  # [pinned tensor, torch.cuda.Event | None]

    def upload(self, values: np.ndarray) -> tuple[torch.Tensor, list[Any]]:
        n = max(1, len(values))
        slot = next((s for s in self.slots if s[0].numel() >= n and (s[1] is None or s[1].query())), None)
        if slot is None:
            slot = [self.device.pinned(max(n, 4096), torch.int64), None]
            self.slots.append(slot)
        slot[0][: len(values)].numpy()[:] = values
        return slot[0][:n].to(self.device.torch_device, non_blocking=True), slot


class KVProvenanceChecker:
    """See the module docstring.  ``violations`` (cpu/sim at once, cuda after `finish`) and ``num_violations``."""

    def __init__(self, runner: Any, *, sample_every: int | None = None):
        self.runner = runner
        self.device = runner.device
        self.on_cuda = bool(self.device.is_cuda)
        self.sample_every = sample_every or (CUDA_SAMPLE_EVERY if self.on_cuda else 1)
        lim = runner.limits
        self.block_size = lim.block_size
        self.num_slots = lim.num_kv_blocks * lim.block_size
        rows, length = lim.max_num_reqs, lim.max_model_len

        def full(shape: Any) -> torch.Tensor:
            shape = shape if isinstance(shape, tuple) else (shape,)
            if self.on_cuda:  # the device's helper orders the runner's stream after this fill (CSAN: a race otherwise)
                return self.device.full(shape, -1, torch.int64)
            return torch.full(shape, -1, dtype=torch.int64)

        self.shadow_tok, self.shadow_pos, self.shadow_hash = full(self.num_slots + 1), full(self.num_slots + 1), full(self.num_slots + 1)
        self.hist_tok = full((rows, length))
        self.hist_hash = full((rows, length + 1))
        self.hist_blocks = full((rows, runner.block_table.max_blocks_per_req))
        self.prefill_len = full(rows)
        powers = torch.tensor(_powers(length), dtype=torch.int64)
        self.powers = self.device.to_device(powers) if self.on_cuda else powers
        self.record = full(12)  # cuda: [step, kind, batch index, position, block, slot, expected x3, found x3]
        self.count = self.device.zeros(1, torch.int64) if self.on_cuda else torch.zeros(1, dtype=torch.int64)
        self._ring = _UploadRing(self.device) if self.on_cuda else None
        self._reqs: dict[str, _Tracked] = {}
        self._pending: Any = None
        self._applied = False
        self._bucket_tokens = 0  # the padded token count of the step being enqueued (0: not bucketed)
        self._step_req_ids: dict[int, tuple[str, ...]] = {}
        self.violations: list[KVProvenanceViolation] = []
        self.num_violations = 0
        self.steps_checked = 0
        self.read_steps_checked = 0
        self._undo: list[Any] = []

    # ------------------------------------------------------------------ arming
    def attach(self) -> "KVProvenanceChecker":
        runner = self.runner
        execute_model, enqueue_device_step = runner.execute_model, runner._enqueue_device_step
        graphs = getattr(runner, "graphs", None)

        def execute_model_tracked(sched: Any) -> Any:
            self._pending, self._applied = sched, False
            try:
                out = execute_model(sched)
            finally:
                self._pending = None
            if not self._applied:  # a step without tokens (finishes, preemptions only) is still a step
                self._apply(sched)
            return out

        def device_step_then_check(plan: Any, *args: Any, **kwargs: Any) -> Any:
            # After the whole device step (eager launches or one graph replay, which both fill the input
            # batch's buffers): the check reads those buffers before the next step's input prep overwrites them.
            self._bucket_tokens = 0
            result = enqueue_device_step(plan, *args, **kwargs)
            if self._pending is not None and tuple(plan.req_ids) == tuple(self._pending.num_scheduled_tokens):
                self._enqueue_check(self._pending, plan)
            return result

        patches = [(runner, "execute_model", execute_model_tracked), (runner, "_enqueue_device_step", device_step_then_check)]
        if graphs is not None and hasattr(graphs, "run"):
            run_graph = graphs.run

            def run_bucketed(key: Any, *args: Any, **kwargs: Any) -> Any:
                self._bucket_tokens = key.num_tokens  # the tokens the bucket's launches prepare
                return run_graph(key, *args, **kwargs)

            patches.append((graphs, "run", run_bucketed))

        for owner, name, value in patches:
            had = name in vars(owner)
            old = vars(owner).get(name)
            self._undo.append(lambda owner=owner, name=name, had=had, old=old: setattr(owner, name, old) if had else delattr(owner, name))
            setattr(owner, name, value)
        return self

    def detach(self) -> None:
        while self._undo:
            self._undo.pop()()

    # ------------------------------------------------------------------ host tracking
    def _apply(self, sched: Any) -> None:
        self._applied = True
        for rid in sched.finished_req_ids | sched.preempted_req_ids:
            self._reqs.pop(rid, None)
        for req in sched.new_requests:
            self._reqs[req.req_id] = _Tracked(tuple(req.prefill_token_ids), list(req.block_ids), req.num_computed_tokens)
        for cached in sched.cached_requests:
            tracked = self._reqs.get(cached.req_id)
            if tracked is not None:
                tracked.blocks.extend(cached.new_block_ids)
                tracked.computed = cached.num_computed_tokens

    def _enqueue_check(self, sched: Any, plan: Any) -> None:
        self._apply(sched)
        req_ids, rows = tuple(plan.req_ids), [int(r) for r in plan.rows]
        bs = self.block_size
        read = sched.step_id % self.sample_every == 0
        sections: list[np.ndarray] = []
        blk: list[tuple[int, int, int]] = []
        adm_tok: list[tuple[int, int, int]] = []
        adm_hash: list[tuple[int, int, int]] = []
        plen: list[tuple[int, int]] = []
        tok_row, tok_pos, tok_start, tok_cu, tok_b = [], [], [], [], []
        ends: list[int] = []
        cu = 0
        for rid, row in zip(req_ids, rows):
            tracked = self._reqs[rid]
            n = int(sched.num_scheduled_tokens[rid])
            start = tracked.computed
            blk.extend((row, col, b) for col, b in enumerate(tracked.blocks))
            if not tracked.uploaded:
                tracked.uploaded = True
                adm_tok.extend((row, p, t) for p, t in enumerate(tracked.prefill))
                adm_hash.extend((row, p, h) for p, h in enumerate(prefix_hashes(tracked.prefill)))
                plen.append((row, len(tracked.prefill)))
            tok_row += [row] * n
            tok_pos += range(start, start + n)
            tok_start += [start] * n
            tok_cu += [cu] * n
            tok_b += [len(ends)] * n
            cu += n
            ends.append(start + n)
            tracked.computed = start + n
        reads_b = np.repeat(np.arange(len(ends)), ends) if read else np.zeros(0, np.int64)
        reads_q = (np.concatenate([np.arange(e) for e in ends]) if ends else np.zeros(0, np.int64)) if read else reads_b
        for triples, width in ((blk, 3), (adm_tok, 3), (adm_hash, 3), (plen, 2)):
            arr = np.asarray(triples, dtype=np.int64).reshape(-1, width)
            sections.extend(arr[:, k] for k in range(width))
        sections += [np.asarray(v, dtype=np.int64) for v in (tok_row, tok_pos, tok_start, tok_cu, tok_b, rows, ends)]
        sections += [reads_b.astype(np.int64), reads_q.astype(np.int64)]
        sizes = [len(s) for s in sections]
        values = np.concatenate(sections) if sections else np.zeros(0, np.int64)
        step_id = sched.step_id
        self._step_req_ids[step_id] = req_ids
        ib = self.runner.input_batch
        num_tokens = len(tok_row)  # the scheduled tokens; a bucketed step's padding tokens follow them
        padded_tokens = max(self._bucket_tokens, num_tokens)

        def check() -> None:
            if self._ring is not None:
                meta, slot = self._ring.upload(values)
            else:
                meta, slot = torch.from_numpy(values), None
            parts = torch.split(meta[: sum(sizes)], sizes)
            self._device_check(step_id, req_ids, parts, ib, num_tokens, padded_tokens, read)
            if slot is not None:
                event = torch.cuda.Event()
                event.record(self.device.stream)
                slot[1] = event

        self.device.enqueue(check, "kv provenance check")

    # ------------------------------------------------------------------ device work
    def _device_check(self, step_id: int, req_ids: tuple[str, ...], parts: Sequence[torch.Tensor], ib: Any,
                      num_tokens: int, padded_tokens: int, read: bool) -> None:
        (blk_row, blk_col, blk_val, a_row, a_pos, a_tok, h_row, h_pos, h_val, pl_row, pl_val,
         tok_row, pexp, tok_start, tok_cu, tok_b, b_row, b_end, rd_b, rd_q) = parts
        bs, M = self.block_size, HASH_MODULUS
        self.steps_checked += 1
        self.hist_blocks[blk_row, blk_col] = blk_val
        self.hist_tok[a_row, a_pos] = a_tok
        self.hist_hash[h_row, h_pos] = h_val
        self.prefill_len[pl_row] = pl_val
        if num_tokens:
            tok_a = ib.input_ids[:num_tokens].to(torch.int64)
            pos_a = ib.positions[:num_tokens].to(torch.int64)
            slot_a = ib.slot_mapping[:num_tokens].to(torch.int64)
            exp_slot = self.hist_blocks[tok_row, pexp // bs] * bs + pexp % bs
            in_prefill = pexp < self.prefill_len[tok_row]
            exp_tok = torch.where(in_prefill, self.hist_tok[tok_row, pexp], tok_a)
            kind = torch.where(pos_a != pexp, 1, torch.where(slot_a != exp_slot, 2, torch.where(tok_a != exp_tok, 3, 0)))
            self.hist_tok[tok_row, pexp] = exp_tok
            summed = torch.cumsum((exp_tok + 1) * self.powers[pexp] % M, 0)
            summed = torch.cat((summed.new_zeros(1), summed))
            base = self.hist_hash[tok_row, tok_start]
            self.hist_hash[tok_row, pexp + 1] = (base + summed[1:] - summed[tok_cu]) % M
            exp_hash = self.hist_hash[tok_row, pexp]
            # What the slot now holds: the token at the position actually written, after the writer's own prefix
            # there (equal to exp_hash unless the position is wrong, a violation already).
            held_hash = self.hist_hash[tok_row, pos_a.clamp(0, self.hist_hash.shape[1] - 1)]
            valid = (slot_a >= 0) & (slot_a < self.num_slots)
            sink = torch.where(valid, slot_a, self.num_slots)
            self.shadow_tok[sink] = tok_a
            self.shadow_pos[sink] = pos_a
            self.shadow_hash[sink] = held_hash
            self._note(step_id, req_ids, kind, [kind, tok_b, pexp, slot_a // bs, slot_a, exp_tok, pexp, exp_hash,
                                                tok_a, pos_a, exp_slot])
        if padded_tokens > num_tokens:
            pad_slot = ib.slot_mapping[num_tokens:padded_tokens].to(torch.int64)
            kind = torch.where((pad_slot >= 0) & (pad_slot < self.num_slots), 6, 0)
            index = torch.arange(num_tokens, padded_tokens, device=pad_slot.device)
            none = torch.full_like(pad_slot, -1)
            pad_pos, pad_tok = ib.positions[num_tokens:padded_tokens].to(torch.int64), ib.input_ids[num_tokens:padded_tokens].to(torch.int64)
            self._note(step_id, req_ids, kind, [kind, index, pad_pos, pad_slot // bs, pad_slot, none, none, none,
                                                pad_tok, pad_pos, none])
        if read and len(rd_b):
            self.read_steps_checked += 1
            row = b_row[rd_b]
            table = ib.block_table[rd_b, rd_q // bs].to(torch.int64)
            slot = table * bs + rd_q % bs
            ok = (slot >= 0) & (slot < self.num_slots)
            src = torch.where(ok, slot, self.num_slots)
            f_tok, f_pos, f_hash = self.shadow_tok[src], self.shadow_pos[src], self.shadow_hash[src]
            e_tok, e_hash = self.hist_tok[row, rd_q], self.hist_hash[row, rd_q]
            bad = ~ok | (f_tok != e_tok) | (f_pos != rd_q) | (f_hash != e_hash)
            kind = torch.where(bad, 4, 0)
            self._note(step_id, req_ids, kind, [kind, rd_b, rd_q, table, slot, e_tok, rd_q, e_hash, f_tok, f_pos, f_hash])
        if len(b_row):
            seq = ib.seq_lens[: len(b_row)].to(torch.int64)
            kind = torch.where(seq != b_end, 5, 0)
            index = torch.arange(len(b_row), device=seq.device)
            none = torch.full_like(seq, -1)
            self._note(step_id, req_ids, kind, [kind, index, b_end, none, none, none, b_end, none, none, seq, none])

    def _note(self, step_id: int, req_ids: tuple[str, ...], kind: torch.Tensor, fields: list[torch.Tensor]) -> None:
        """Keep the step's violations: every detail on cpu/sim, the first and a count on cuda (no host read)."""
        bad = kind != 0
        if self.on_cuda:
            first = torch.argmax(bad.to(torch.int32)).view(1)
            new = torch.cat([torch.full((1,), step_id, dtype=torch.int64, device=kind.device)] + [f.index_select(0, first) for f in fields])
            num_bad = bad.sum()
            take = (self.count == 0) & (num_bad > 0)
            self.record.copy_(torch.where(take, new, self.record))
            self.count.add_(num_bad)
            return
        if not bool(bad.any()):
            return
        idx = torch.nonzero(bad).flatten().tolist()
        self.num_violations += len(idx)
        cols = [f.tolist() for f in fields]
        for i in idx[: max(0, MAX_RECORDED - len(self.violations))]:
            self.violations.append(_violation(step_id, req_ids, [c[i] for c in cols]))

    # ------------------------------------------------------------------ results
    def finish(self) -> list[KVProvenanceViolation]:
        """Run the queued checks (a device synchronize), read what cuda recorded; returns ``violations``."""
        self.device.synchronize()
        if self.on_cuda:
            count = int(self.count.item())
            if count and not self.violations:
                rec = self.record.tolist()
                step = rec[0]
                self.violations.append(_violation(step, self._step_req_ids.get(step, ()), rec[1:]))
            self.num_violations = count
        return self.violations

    def summary(self) -> str:
        if not self.num_violations:
            return (f"kv provenance: clean ({self.steps_checked} steps' writes, "
                    f"{self.read_steps_checked} steps' reads checked)")
        lines = [f"kv provenance: {self.num_violations} violation(s); first:"]
        lines += ["  " + v.line() for v in self.violations[:5]]
        return "\n".join(lines)

    def assert_clean(self) -> None:
        self.finish()
        if self.num_violations:
            raise KVProvenanceError(self.summary())


def _violation(step: int, req_ids: Sequence[str], f: Sequence[int]) -> KVProvenanceViolation:
    kind, b, position, block, slot, e_tok, e_pos, e_hash, f_tok, f_pos, f_hash = (int(v) for v in f)
    req_id = req_ids[b] if 0 <= b < len(req_ids) else f"batch {b}"
    name = KINDS.get(kind, str(kind))
    if name == "padding-write":  # b: the padding token's index in the padded batch
        return KVProvenanceViolation(step, f"padding token {b}", name, position, block, slot, None, (f_tok, f_pos, 0),
                                     "the padding of a bucketed step must write nothing")
    if name == "seq-len":
        return KVProvenanceViolation(step, req_id, name, position, -1, -1, None, None,
                                     f"seq_len {f_pos}, the schedule's {e_pos}")
    if name.startswith("write"):  # block/slot: where the runner wrote; found: what it wrote; f_hash: the schedule's slot
        note = f"the schedule's slot for position {position} is {f_hash}" if name == "write-slot" else ""
        return KVProvenanceViolation(step, req_id, name, position, block, slot, (e_tok, e_pos, e_hash),
                                     (f_tok, f_pos, e_hash), note)
    found = None if f_tok < 0 and f_pos < 0 else (f_tok, f_pos, f_hash)
    return KVProvenanceViolation(step, req_id, name, position, block, slot, (e_tok, e_pos, e_hash), found)


def arm_kv_provenance(runner: Any, *, sample_every: int | None = None) -> KVProvenanceChecker:
    """Attach a `KVProvenanceChecker` to a runner with an input batch and block table (after any mutant)."""
    return KVProvenanceChecker(runner, sample_every=sample_every).attach()


__all__ = ["KVProvenanceChecker", "KVProvenanceViolation", "KVProvenanceError", "arm_kv_provenance", "prefix_hashes",
           "HASH_MODULUS", "KINDS"]
