"""Staged diff writes into persistent device tensors: one arena, one staging allocation, one launch.

A `StagedWriteTensor` owns a persistent device tensor ``base`` (``[rows]`` or ``[rows, cols]``)
whose only writer is an apply kernel.  The host records diffs ``(row, start, values)`` (or ragged
sets of them as arrays); a flush packs them into staging (`runnercheck.impl.buffers`) and an apply launch
scatters them into ``base``.  Later writes to the same cell win: diffs that overlap within a row
are merged on the host (cell by cell, in order) before packing, so no two kernel programs write
one cell.  Tensors of a `StagedWriteGroup` share one int32 word arena and are applied together,
one launch per step for all of them (more only when a step's diffs do not fit one staging slot:
then they are batched, long diffs cut at even words, one launch per batch).
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from runnercheck.impl import native
from runnercheck.impl.buffers import StagingSlot, StagingWriter
from runnercheck.impl.device import Device
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.kernels.launch import launch


@triton.jit(do_not_specialize=["values_offset"])
def _apply_word_diffs_kernel(arena_ptr, staged_ptr, values_offset, BLOCK: tl.constexpr):
    """Diff ``d``: copy ``staged[values_offset + src : + length]`` to ``arena[dst : + length]`` (32-bit words)."""
    d = tl.program_id(0)
    dst = tl.load(staged_ptr + 3 * d).to(tl.int64)
    length = tl.load(staged_ptr + 3 * d + 1)
    src = tl.load(staged_ptr + 3 * d + 2).to(tl.int64) + values_offset
    for chunk in range(0, length, BLOCK):
        cols = chunk + tl.arange(0, BLOCK)
        mask = cols < length
        tl.store(arena_ptr + dst + cols, tl.load(staged_ptr + src + cols, mask=mask), mask=mask)


@triton.jit(do_not_specialize=["num_programs"])
def _apply_word_diffs_from_header_kernel(arena_ptr, words_ptr, header_ptr, num_programs, BLOCK: tl.constexpr):
    """`_apply_word_diffs_kernel` with its diff count and table offset read from the device.

    ``header[0]`` diffs, their table at word ``header[1]`` of ``words`` and the values right after
    it.  A fixed grid of ``num_programs`` walks the diffs with a stride, so one launch captured in a
    CUDA graph serves every step (0 diffs: every program exits at once).
    """
    n = tl.load(header_ptr)
    table = tl.load(header_ptr + 1).to(tl.int64)
    values = table + 3 * n.to(tl.int64)
    for d in range(tl.program_id(0), n, num_programs):
        dst = tl.load(words_ptr + table + 3 * d).to(tl.int64)
        length = tl.load(words_ptr + table + 3 * d + 1)
        src = tl.load(words_ptr + table + 3 * d + 2).to(tl.int64) + values
        for chunk in range(0, length, BLOCK):
            cols = chunk + tl.arange(0, BLOCK)
            mask = cols < length
            tl.store(arena_ptr + dst + cols, tl.load(words_ptr + src + cols, mask=mask), mask=mask)


def launch_apply_from_header(arena: torch.Tensor, words: torch.Tensor, header: torch.Tensor, num_programs: int) -> None:
    """One launch of the header-driven apply (call inside enqueued device work or a graph capture).

    ``header``: int32 ``[num diffs, table word offset]`` on the device; ``words``: the int32 buffer
    holding the table and values (`StagedWriteGroup.take_single_pack` says where they sit).
    """
    launch(_apply_word_diffs_from_header_kernel, (num_programs,), arena, words, header, num_programs, BLOCK=_APPLY_BLOCK)


_APPLY_BLOCK = 128
_ARANGE = np.arange(4096, dtype=np.int64)
_ARANGE.flags.writeable = False
_META_WORDS = 3  # (destination word, length in words, source word) per diff
_NP_DTYPES = {torch.int32: np.int32, torch.float32: np.float32, torch.int64: np.int64}
# The most one-element members an admission record may fill (`defer_admissions`; impl/native/staging.c's MAX_PARAMS):
# the sampling fields and the seed.
MAX_ADMISSION_SCALARS = 16
_staging = native.load("staging")  # `pack_ragged` and `pack_members`, the C twins of the diff tables; None: numpy only


_CELL_WORDS = {k: np.full(1024, k, np.int64) for k in (1, 2)}  # the lengths of 4- and 8-byte cells (read-only slices)
for _words in _CELL_WORDS.values():
    _words.flags.writeable = False
_CELL_CODES = {torch.int32: 0, torch.float32: 1, torch.int64: 2}  # element codes of impl/native/staging.c
_ARRAY_DIFF_MIN = 64  # elements from which a staged numpy row is flushed as an array, not a list of ints


def _fill_diff_table(words: np.ndarray, dst: np.ndarray, lens: np.ndarray, src: np.ndarray, values: np.ndarray) -> None:
    """Write a diff table into ``words``: ``_META_WORDS`` words (destination, length, source) per diff, then the values."""
    n = len(lens)
    meta = words[: _META_WORDS * n].reshape(n, _META_WORDS)
    meta[:, 0], meta[:, 1], meta[:, 2] = dst, lens, src
    words[_META_WORDS * n :] = values


class StagedWriteGroup:
    """Persistent device tensors that share one int32 word arena, written by ONE apply launch per step.

    Owner: whoever constructs it (the runner for its row state, block table and sampling state;
    a standalone `StagedWriteTensor` owns a private group of its own).  ``arena`` lives on the
    device for the owner's lifetime; each member's ``base`` is a view into it (int32, float32 or
    int64 -- 4- and 8-byte elements as one or two words).  Its one writer is the apply kernel
    enqueued by `enqueue_apply`.  `flush` gathers every member's merged diffs into one staging
    allocation (diff table + values) -- more only when they do not fit one slot.
    The arena is allocated by `seal` (or the first ``base`` access); members join before that.
    """

    def __init__(self, device: Device, name: str):
        self.device = device
        self.name = name
        self.members: list[StagedWriteTensor] = []
        # Members with pending diffs, in the order they got them: one list for the group's lifetime, emptied by each
        # flush (the C twin of an admission appends to it: `runnercheck.impl.admission.AdmissionWriters`).
        self._dirty: list[StagedWriteTensor] = []
        # Single-element writes (`StagedWriteTensor.stage_scalar`) of every member, by element type: destination
        # word -> value, the later write of a cell winning.  Flushed as three arrays, not member by member.
        self._cells: dict[torch.dtype, dict[int, float | int]] = {dtype: {} for dtype in _NP_DTYPES}
        self._cell_members: list[StagedWriteTensor] = []  # members with cells pending
        # The cell tables as `pack_members` in impl/native/staging.c reads them: (table, element code), in `_cells` order.
        self._cell_tables = tuple((self._cells[dtype], _CELL_CODES[dtype]) for dtype in self._cells)
        # Admission records a member owner defers to the flush (`defer_admissions`): (records, layout, reference).
        self._admissions: tuple[dict, tuple, Callable[[], None]] | None = None
        self._list_rows = False  # whether that owner has their rows listed after the table (`listed_rows`)
        # The last listing of the records' rows: (writer, slot, first word, rows), or None.  Taken (and cleared) by the
        # records' owner for its count reset (`SamplingState.flush`) only when it names the writer it flushes into:
        # a flush that lists nothing (no records, or packed by numpy) leaves it, for no other writer takes it.
        self.listed_rows: tuple[StagingWriter, StagingSlot, int, int] | None = None
        self.arena: torch.Tensor | None = None
        self._num_words = 0
        # The last flush's diff tables, each (slot, first word in the slot, diffs, words): applied by `enqueue_apply`,
        # or by a bucketed step's graph (`take_single_pack`).
        self._applies: list[tuple[StagingSlot, int, int, int]] = []
        self.h2d_bytes_last_flush = 0

    def _join(self, tensor: "StagedWriteTensor") -> int:
        if self.arena is not None:
            raise RuntimeError(f"staged-write group {self.name!r} is sealed: {tensor.name!r} cannot join")
        offset = -(-self._num_words // 16) * 16  # 64-byte aligned members (int64 views need 8)
        self._num_words = offset + tensor.num_words
        self.members.append(tensor)
        return offset

    def seal(self) -> None:
        """Allocate the arena and fill each member's view (init time)."""
        if self.arena is not None:
            return
        self.arena = self.device.empty(max(1, self._num_words), torch.int32)
        for t in self.members:
            view = self.arena[t.word_offset : t.word_offset + t.num_words].view(t.dtype).view(t.shape)
            view.fill_(t.fill)
            t._base = view
        self.device._stream_waits_for_current()

    @hot_path
    def flush(self, writer: StagingWriter) -> None:
        """Pack every member's pending diffs into staging and prepare the apply launch (enqueued by `enqueue_apply`).

        The diff table holds (destination word, words, source word) per diff, then the values.  It is written in
        C when `runnercheck.impl.native` built it (`pack_ragged`, `pack_members`); the numpy path below is their reference:
        values gathered per element type (int32, float32, int64) and turned into words with one conversion each.
        """
        self.h2d_bytes_last_flush = 0
        self._applies = []  # `listed_rows` is left: its owner reads it only for the writer that made it
        dirty = self._dirty
        records = self._admissions[0] if self._admissions is not None else None
        if not dirty and not self._cell_members and not records:  # nothing staged (most steady steps): no table
            return
        limit = writer.pool.capacity_bytes // 4 - 4  # words of one slot, less alignment
        if (len(dirty) == 1 and dirty[0]._int32 and not dirty[0]._pending and len(dirty[0]._ragged) == 1
                and not self._cell_members and not records):
            lens, values = dirty[0]._ragged[0][2:]
            if _META_WORDS * len(lens) + len(values) <= limit:
                self._flush_one_ragged(dirty[0], writer)
                return
        if _staging is not None and self._pack_members(dirty, writer, limit, records):
            return
        if records:
            self._admissions[2]()  # the reference: the records staged as cells and mask row diffs
            dirty = self._dirty
        by_dtype: dict[torch.dtype, tuple[list[int], list[int], list]] = {}
        dst_parts: list[np.ndarray] = []  # ragged diffs, already arrays
        len_parts: list[np.ndarray] = []
        word_parts: list[np.ndarray] = []
        dirty = dirty[:]
        self._dirty.clear()  # the one list, kept (`runnercheck.impl.admission.AdmissionWriters` holds it)
        for t in dirty:
            words_per, base, cols = t.words_per_element, t.word_offset, t.num_cols
            if t._pending:
                diffs = t._merged_diffs()
                t._pending.clear()
                dst, lens, values = by_dtype.setdefault(t.dtype, ([], [], []))
                for row, start, vals in diffs:
                    if type(vals) is np.ndarray:  # a whole row staged as an array (a prompt bitmask): no Python ints
                        dst_parts.append(np.array([base + (row * cols + start) * words_per], np.int64))
                        len_parts.append(np.array([len(vals) * words_per], np.int64))
                        word_parts.append(np.ascontiguousarray(vals, _NP_DTYPES[t.dtype]).view(np.int32))
                        continue
                    dst.append(base + (row * cols + start) * words_per)
                    lens.append(len(vals) * words_per)
                    values.extend(vals)
            for rows, starts, lens_r, vals in t._ragged:
                if words_per == 1:  # 4-byte elements (the block table): words are elements
                    dst_parts.append(rows * cols + starts + base)
                    len_parts.append(lens_r)
                else:
                    dst_parts.append(base + (rows * cols + starts) * words_per)
                    len_parts.append(lens_r * words_per)
                word_parts.append(np.asarray(vals, _NP_DTYPES[t.dtype]).view(np.int32))
            t._ragged.clear()
        for dtype, (dst, lens, values) in by_dtype.items():
            dst_parts.append(np.array(dst, np.int64))
            len_parts.append(np.array(lens, np.int64))
            word_parts.append(np.array(values, _NP_DTYPES[dtype]).view(np.int32))
        if self._cell_members:
            self._take_cells(dst_parts, len_parts, word_parts)
        if not dst_parts:
            return
        self.seal()
        dst, lens, src, values = _join_parts(dst_parts, len_parts, word_parts)
        if _META_WORDS * len(lens) + len(values) <= limit:
            self._applies = [self._pack(dst, lens, src, values, writer)]
        else:
            self._applies = [self._pack(*batch, writer) for batch in _word_batches(dst, lens, src, values, limit)]

    @hot_path
    def _pack_members(self, dirty: list["StagedWriteTensor"], writer: StagingWriter, limit: int, records: dict | None) -> bool:
        """`flush` by ``pack_members`` (impl/native/staging.c): the members' diffs, the cells and the deferred admission
        records as one diff table in one slot (the records' rows listed after it when their owner asked:
        `listed_rows`).  False, with nothing taken, when the C twin declines them or they need more than one slot."""
        # A member's one pending diff needs no merging: its list is read as it stands (and emptied below).
        members = [(t.word_offset, t.num_cols, _CELL_CODES[t.dtype], t._pending if len(t._pending) <= 1 else t._merged_diffs(),
                    t._ragged) for t in dirty]
        admissions = (records, self._admissions[1]) if records else None
        # Packed straight into the current slot's free words when they hold the table (one C call), else sized.
        free = writer.free_index()
        size = _staging.pack_members(None if free is None else free[0].host_words, members, self._cell_tables,
                                     admissions, self._list_rows, 0 if free is None else free[1])
        if size is NotImplemented or not size[0]:
            return False
        n, table = size[0], _META_WORDS * size[0] + size[1]
        total = table + size[3]
        if total > limit:
            return False
        if self.arena is None:
            self.seal()
        if size[2]:  # packed in place: the free words it filled become the table's allocation
            slot, start = free
            slot.claim_free_words(start, total)
        else:
            slot, start = writer.reserve_index(total)
            _staging.pack_members(slot.host_words, members, self._cell_tables, admissions, self._list_rows, start)
        if records:
            records.clear()
        for t in dirty:
            t._pending.clear()
            t._ragged.clear()
        dirty.clear()  # `self._dirty` itself
        if self._cell_members:  # a cell is pending only with its member listed here
            self._clear_cells()
        self.h2d_bytes_last_flush += 4 * total  # `_packed`, without its frame
        self._applies = [(slot, start, n, table)]
        if size[3]:
            self.listed_rows = (writer, slot, start + table, size[3])
        return True

    def defer_admissions(self, records: dict, scalars: Sequence["StagedWriteTensor"], mask: "StagedWriteTensor",
                         vocab_size: int, stage: Callable[[], None], list_rows: bool = False) -> None:
        """Let a member owner record its admissions in ``records`` -- row -> (one value for each of the one-element
        members ``scalars``, at most `MAX_ADMISSION_SCALARS`; the prompt's token ids, whose bitmask is ``mask``'s row)
        -- for the flush to pack after
        everything else (`pack_members`).  ``stage`` is the reference: it stages them through the members (called
        when the C twin declines, and before any other write to one of those members, so later writes still
        win).  It must empty ``records`` before it stages through the members.  ``list_rows``: a flush that packs
        the records in C also lists their rows (the dict's keys, in its order) as int32 words right after the diff
        table, noted in `listed_rows` (only the owner reads them; the apply does not)."""
        if self._admissions is not None:
            raise RuntimeError(f"staged-write group {self.name!r} already packs another owner's admissions")
        if not 1 <= len(scalars) <= MAX_ADMISSION_SCALARS or any(t.group is not self or t.num_cols != 1 for t in scalars) \
                or mask.group is not self:
            raise ValueError(f"defer_admissions takes 1 to {MAX_ADMISSION_SCALARS} one-element members and a mask member "
                             "of this group")
        layout = (tuple(t.word_offset for t in scalars), tuple(_CELL_CODES[t.dtype] for t in scalars), mask.word_offset,
                  mask.num_cols, vocab_size, mask.num_rows)
        self._admissions = (records, layout, stage)
        self._list_rows = list_rows
        for member in (*scalars, mask):
            member._deferred = True

    def _stage_deferred(self) -> None:
        """Before another write to a member with deferred admissions: the records are staged first (the reference),
        so the later write wins, as for any two writes of one step."""
        if self._admissions[0]:
            self._admissions[2]()

    def _set_cell(self, dtype: torch.dtype, dst: int, value: float | int) -> None:
        self._cells[dtype][dst] = value  # a cell written twice in one step: the later write wins

    def _take_cells(self, dst_parts: list[np.ndarray], len_parts: list[np.ndarray], word_parts: list[np.ndarray]) -> None:
        """Move the pending cells into the flush's parts: one destination, length and value array per element type."""
        for dtype, cells in self._cells.items():
            if cells:
                n = len(cells)
                dst_parts.append(np.fromiter(cells, np.int64, n))
                words = _CELL_WORDS[dtype.itemsize // 4]
                len_parts.append(words[:n] if n <= len(words) else np.full(n, words[0], np.int64))
                word_parts.append(np.fromiter(cells.values(), _NP_DTYPES[dtype], n).view(np.int32))
        self._clear_cells()

    def _clear_cells(self) -> None:
        for member in self._cell_members:
            member._has_cells = False
        self._cell_members = []
        for cells in self._cells.values():
            cells.clear()

    def _cells_of(self, tensor: "StagedWriteTensor", remove: bool) -> list[tuple[int, float | int]]:
        """``tensor``'s pending cells as (element index, value), in staging order; taken out of the table when ``remove``."""
        cells = self._cells[tensor.dtype]
        first, end = tensor.word_offset, tensor.word_offset + tensor.num_words
        mine = [(dst, v) for dst, v in cells.items() if first <= dst < end]
        if remove:
            for dst, _ in mine:
                del cells[dst]
            tensor._has_cells = False
            self._cell_members.remove(tensor)
        return [((dst - first) // tensor.words_per_element, v) for dst, v in mine]

    def _flush_one_ragged(self, tensor: "StagedWriteTensor", writer: StagingWriter) -> None:
        """`flush` of one int32 member's one ragged set that fits a slot (a steady step's block appends):
        the same diff table as the general path, built without its gathering (in C when `runnercheck.impl.native` built it)."""
        self._dirty.clear()
        rows, starts, lens, values = tensor._ragged.pop()
        n = len(lens)
        total = _META_WORDS * n + len(values)
        slot, start = writer.reserve_index(total)
        if _staging is None or _staging.pack_ragged(slot.host_words, rows, starts, lens, values, tensor.num_cols,
                                                  tensor.word_offset, start) is NotImplemented:
            host = slot.host_words[start : start + total]
            dst = rows * tensor.num_cols
            dst += starts
            dst += tensor.word_offset
            # One element each (a block per appending request): the source offsets are 0..n-1.
            if len(values) == n and n <= len(_ARANGE):
                src = _ARANGE[:n]
            else:
                src = np.zeros(n, np.int64)
                lens[:-1].cumsum(out=src[1:])
            _fill_diff_table(host, dst, lens, src, values)  # int64 values: written as int32
        self.h2d_bytes_last_flush += 4 * total  # `_packed`, without its frame
        self._applies = [(slot, start, n, total)]

    def _pack(self, dst: np.ndarray, lens: np.ndarray, src: np.ndarray, values: np.ndarray,
              writer: StagingWriter) -> tuple[StagingSlot, int, int, int]:
        n = len(lens)
        total = _META_WORDS * n + len(values)
        host, slot, start = writer.reserve_words(total)
        _fill_diff_table(host, dst, lens, src, values)
        return self._packed(slot, start, n, total)

    def _packed(self, slot: StagingSlot, start: int, n: int, total: int) -> tuple[StagingSlot, int, int, int]:
        """Note a diff table of ``n`` diffs (``total`` words) written at word ``start`` of ``slot``: the apply that
        `enqueue_apply` launches (a bucketed step drops it: `take_single_pack`)."""
        self.h2d_bytes_last_flush += 4 * total
        return slot, start, n, total

    @hot_path
    def take_single_pack(self, slot: object) -> tuple[int, int] | None:
        """``(diffs, table word offset in slot)`` when the last flush packed one batch, into ``slot``; else None.

        On a hit the prepared apply is dropped: the caller applies the batch itself from a copy of
        the slot (`launch_apply_from_header`, inside a bucketed step's graph).  No diffs: ``(0, 0)``.
        """
        applies = self._applies
        if not applies:
            return 0, 0
        if len(applies) != 1 or applies[0][0] is not slot:
            return None
        _, offset, n, _ = applies[0]
        self._applies = []
        return n, offset

    @hot_path
    def enqueue_apply(self) -> None:
        """Enqueue the launch(es) prepared by the last `flush` (call after the writer submitted)."""
        applies, self._applies = self._applies, []
        for table in applies:
            self.device.enqueue(partial(self._apply, *table), f"apply {self.name}")

    def _apply(self, slot: StagingSlot, start: int, n: int, total: int) -> None:
        """One diff table's apply launch (device work): the table's device view is made here, not at the flush."""
        launch(_apply_word_diffs_kernel, (n,), self.arena, slot.device_words[start : start + total], _META_WORDS * n,
               BLOCK=_APPLY_BLOCK)


def _join_parts(dst_parts: list[np.ndarray], len_parts: list[np.ndarray],
                word_parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A flush's gathered parts as one diff list: (destinations, lengths, sources, values), the sources counting
    up through the lengths (with `_fill_diff_table`, the layout `pack_members` in impl/native/staging.c writes)."""
    dst = np.concatenate(dst_parts) if len(dst_parts) > 1 else dst_parts[0]
    lens = np.concatenate(len_parts) if len(len_parts) > 1 else len_parts[0]
    values = np.concatenate(word_parts) if len(word_parts) > 1 else word_parts[0]
    src = np.zeros(len(lens), np.int64)
    lens[:-1].cumsum(out=src[1:])
    return dst, lens, src, values


def _word_batches(dst: np.ndarray, lens: np.ndarray, src: np.ndarray, values: np.ndarray, limit: int) -> list[tuple]:
    """Split diffs into batches whose table + values fit ``limit`` words, cutting long diffs at even words.

    Merged diffs never overlap, so the batches may be applied in any order.
    """
    max_piece = max(2, (limit - _META_WORDS) // 2 * 2)
    batches: list[tuple] = []
    cur_dst: list[int] = []
    cur_len: list[int] = []
    cur_vals: list[np.ndarray] = []
    used = 0
    for d, n, s in zip(dst.tolist(), lens.tolist(), src.tolist()):
        for cut in range(0, n, max_piece):
            piece = min(max_piece, n - cut)
            if cur_len and used + _META_WORDS + piece > limit:
                batches.append(_batch(cur_dst, cur_len, cur_vals))
                cur_dst, cur_len, cur_vals, used = [], [], [], 0
            cur_dst.append(d + cut)
            cur_len.append(piece)
            cur_vals.append(values[s + cut : s + cut + piece])
            used += _META_WORDS + piece
    if cur_len:
        batches.append(_batch(cur_dst, cur_len, cur_vals))
    return batches


def _batch(dst: list[int], lens: list[int], vals: list[np.ndarray]) -> tuple:
    lens_arr = np.array(lens, np.int64)
    src = np.zeros(len(lens), np.int64)
    lens_arr[:-1].cumsum(out=src[1:])
    return np.array(dst, np.int64), lens_arr, src, np.concatenate(vals)


class StagedWriteTensor:
    """A persistent device tensor written only through staged diffs.

    Owner: whoever constructs it (the state table, the block table, the sampler state).
    ``base`` lives on the device for the owner's lifetime, a view into its `StagedWriteGroup`'s
    arena (``group``: shared with other tensors, flushed and applied by the group's owner; None:
    a private group, flushed and applied through this tensor).  Its one writer is the group's
    apply kernel.  Pending diffs live on the host until a flush (or `discard_pending`); diffs that
    overlap within a row are merged there, later writes winning.
    """

    def __init__(self, device: Device, shape: int | tuple[int, ...], dtype: torch.dtype, name: str, fill: float | int = 0,
                 group: StagedWriteGroup | None = None):
        self.device = device
        self.name = name
        if dtype not in _NP_DTYPES:
            raise ValueError(f"{name}: StagedWriteTensor holds int32, float32 or int64, got {dtype}")
        self.dtype = dtype
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if len(shape) not in (1, 2):
            raise ValueError(f"{name}: StagedWriteTensor is 1-D or 2-D, got shape {shape}")
        self.shape = shape
        self.num_rows = shape[0]
        self.num_cols = shape[1] if len(shape) == 2 else 1
        self.fill = fill
        self.words_per_element = dtype.itemsize // 4
        self._int32 = dtype == torch.int32  # its values are the words (`StagedWriteGroup.flush`'s short path)
        self.num_words = self.num_rows * self.num_cols * self.words_per_element
        self._private = group is None
        self.group = StagedWriteGroup(device, name) if group is None else group
        self.word_offset = self.group._join(self)
        self._base: torch.Tensor | None = None
        self._pending: list[tuple[int, int, list | np.ndarray]] = []
        self._has_cells = False  # `stage_scalar` cells in the group's table (`StagedWriteGroup._cells`)
        self._deferred = False  # its admissions' writes may wait in the group's records (`defer_admissions`)
        self._ragged: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # from `stage_ragged`
        if self._private:
            self.group.seal()

    @property
    def base(self) -> torch.Tensor:
        if self._base is None:
            self.group.seal()
        return self._base

    @property
    def h2d_bytes_last_flush(self) -> int:
        return self.group.h2d_bytes_last_flush

    @property
    def num_pending(self) -> int:
        if self._deferred:
            self.group._stage_deferred()  # deferred admissions count as what they stage
        cells = len(self.group._cells_of(self, remove=False)) if self._has_cells else 0
        return len(self._pending) + len(self._ragged) + cells

    def pending_writes(self) -> list[tuple[int, int, list]]:
        """What the next flush writes of this tensor, as (row, start, values): merged row diffs, then cells (inspection)."""
        if self._deferred:
            self.group._stage_deferred()
        cells = self.group._cells_of(self, remove=False) if self._has_cells else []
        return [*self._merged_diffs(), *((i // self.num_cols, i % self.num_cols, [v]) for i, v in cells)]

    def _cells_to_diffs(self) -> None:
        """Before a row or ragged diff: this tensor's earlier cells become row diffs, ahead of it (later writes win)."""
        for index, value in self.group._cells_of(self, remove=True):
            if not self._pending and not self._ragged:
                self.group._dirty.append(self)
            self._pending.append((index // self.num_cols, index % self.num_cols, [value]))

    def stage(self, row: int, start: int, values: Sequence[float | int] | np.ndarray) -> None:
        """Record ``base[row, start:start+len(values)] = values`` for the next flush."""
        if self._deferred:
            self.group._stage_deferred()
        # A long array stays one (flushed as a block); short ones and sequences become Python lists (merged by cell).
        if not (isinstance(values, np.ndarray) and values.ndim == 1 and len(values) >= _ARRAY_DIFF_MIN):
            values = list(values.tolist() if isinstance(values, np.ndarray) else values)
        if not 0 <= row < self.num_rows:
            raise IndexError(f"{self.name}: row {row} outside [0, {self.num_rows})")
        if start < 0 or start + len(values) > self.num_cols:
            raise IndexError(f"{self.name}: columns [{start}, {start + len(values)}) outside [0, {self.num_cols})")
        if len(values):
            if self._has_cells:
                self._cells_to_diffs()
            if not self._pending and not self._ragged:
                self.group._dirty.append(self)  # the group flushes only members with diffs
            self._pending.append((row, start, values))

    @hot_path
    def stage_list(self, row: int, values: list) -> None:
        """`stage` of ``base[row, :len(values)]`` from a list the caller hands over: kept as the pending diff, not
        copied (an admission's row-state values, `runnercheck.impl.state.RequestStateTable.admit`)."""
        if (self._deferred or self._has_cells or type(values) is not list or not 0 <= row < self.num_rows
                or len(values) > self.num_cols or not values):
            self.stage(row, 0, values)  # the general path: its conversions, checks and errors
            return
        if not self._pending and not self._ragged:
            self.group._dirty.append(self)
        self._pending.append((row, 0, values))

    def stage_ragged(self, rows: np.ndarray, starts: np.ndarray, lens: np.ndarray, values: np.ndarray, *,
                     checked: bool = False) -> None:
        """Record ``base[rows[i], starts[i]:starts[i]+lens[i]] = `` the next ``lens[i]`` of ``values``, for all i
        at once.  These cells must not be written by the tensor's other diffs of the step (no merge).

        ``checked=True``: the caller's boundary already holds every diff inside the tensor (the block
        table's appends: `runnercheck.impl.step_reader`), so the five reductions of the bounds check are skipped."""
        if len(rows) == 0:
            return
        if self._deferred:
            self.group._stage_deferred()
        if not checked and (rows.min() < 0 or rows.max() >= self.num_rows or starts.min() < 0
                            or (starts + lens).max() > self.num_cols or int(lens.sum()) != len(values)):
            raise IndexError(f"{self.name}: ragged diffs outside [0, {self.num_rows}) x [0, {self.num_cols})")
        if self._has_cells:
            self._cells_to_diffs()
        if not self._pending and not self._ragged:
            self.group._dirty.append(self)
        self._ragged.append((rows, starts, lens, values))

    def stage_scalar(self, row: int, value: float | int) -> None:
        """Record ``base[row, 0] = value``: one entry of the group's cell table (flushed per element type with
        every member's cells), or a row diff when this tensor already has row diffs pending this step."""
        if self._deferred:
            self.group._stage_deferred()
        if self._pending or self._ragged:
            self.stage(row, 0, [value])
            return
        if not 0 <= row < self.num_rows:
            raise IndexError(f"{self.name}: row {row} outside [0, {self.num_rows})")
        if not self._has_cells:
            self._has_cells = True
            self.group._cell_members.append(self)
        self.group._set_cell(self.dtype, self.word_offset + row * self.num_cols * self.words_per_element, value)

    def discard_pending(self) -> None:
        if self._deferred:
            self.group._stage_deferred()  # its share of the deferred admissions is discarded with the rest
        if self._has_cells:
            self.group._cells_of(self, remove=True)
        self._pending.clear()
        self._ragged.clear()

    def _merged_diffs(self) -> list[tuple[int, int, list]]:
        if len(self._pending) <= 1:
            return list(self._pending)
        by_row: dict[int, list[tuple[int, list]]] = {}
        for row, start, values in self._pending:
            by_row.setdefault(row, []).append((start, values))
        merged: list[tuple[int, int, list]] = []
        for row, diffs in by_row.items():
            if len(diffs) == 1:
                merged.append((row, diffs[0][0], diffs[0][1]))
                continue
            cells: dict[int, float | int] = {}
            for start, values in diffs:  # in staging order: later writes overwrite
                for j, v in enumerate(values):
                    cells[start + j] = v
            cols = sorted(cells)
            run_start, run = cols[0], [cells[cols[0]]]
            for c in cols[1:]:
                if c == run_start + len(run):
                    run.append(cells[c])
                else:
                    merged.append((row, run_start, run))
                    run_start, run = c, [cells[c]]
            merged.append((row, run_start, run))
        return merged

    @hot_path
    def flush(self, writer: StagingWriter) -> None:
        """A private group: pack the pending diffs and prepare the apply.  A shared group's owner flushes it instead."""
        if self._private:
            self.group.flush(writer)

    def enqueue_apply(self) -> None:
        """A private group: enqueue the apply prepared by the last `flush` (after the writer submitted)."""
        if self._private:
            self.group.enqueue_apply()
