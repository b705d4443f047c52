"""Per-row sampling state on the device: parameters, seeds, prompt bitmask, output-token counts.

Ownership (the four questions)
------------------------------
`SamplingState` owns every tensor below.  All live on the device for the state's lifetime, are
indexed by the request-state row (``[max_num_reqs, ...]``), and are meaningful from a request's
admission into a row until the row is reused.  Their writers:

* one tensor per row of `runnercheck.impl.interface.SAMPLING_FIELDS` (``temperature`` f32, ``top_k`` i32,
  ``top_p`` f32, ...: the table's name, dtype and neutral value; `params` in its order), then ``seed`` i64 --
  `StagedWriteTensor` s, written only by their apply kernels from diffs staged by `add_request` (with
  ``group``, views into that `StagedWriteGroup`'s arena, applied by the group's owner in one launch with its
  others; an admission is then one record, row -> (the fields' values and the seed, the prompt), that the
  group's flush packs with the prompt mask's row in C: `StagedWriteGroup.defer_admissions`);
* ``logprobs_mode`` i32 ``[max_num_reqs]`` -- 1 where the row's request asks for processed logprobs; a
  `StagedWriteTensor` in the same group, staged by `note_logprobs_mode` when a row's mode changes;
* ``prompt_mask`` i32 ``[max_num_reqs, ceil(V / 32)]`` -- bit ``t % 32`` of word ``t // 32`` is set
  when token ``t`` occurs in the user's prompt (a resumed request's re-fed outputs are not
  prompt).  A `StagedWriteTensor`: the host builds the whole row of words at admission;
* ``output_counts`` i32 ``[max_num_reqs, V]`` -- how often each token occurs in the request's
  outputs.  Written only by kernels, in stream order: at admission a row reset (no upload of
  ``V`` zeros), then the counts of a resumed request's earlier outputs added from a staged token
  list; after each step `enqueue_post_update` adds the accepted sampled tokens.  The reset reads the admitted
  rows from staging: where the group's flush packed the admission records in C it listed their rows right after
  its diff table (`StagedWriteGroup.listed_rows`), else `flush` reserves them.

Seeds: the runner passes ``runnercheck.impl.interface.effective_seed(params, req_id, base_seed)`` (asked through
`runnercheck.impl.seeds.request_seed`, which derives it in C when it can): the request's own seed, or for a
request without one a seed derived from the runner's base seed and the request id (which the
runner records and reports in ``ModelRunnerOutput.seeds``).  Noise is
keyed by (seed, position, token id), so a resumed request continues its stream exactly.

Host protocol per step: `add_request` (any number; the latest call for a row wins), then
`flush(writer)` to pack the staged data into the step's staging writer, ``writer.submit()``, then
`enqueue_apply()` to enqueue the applies and the reset/count kernels in that order.
"""
from __future__ import annotations

import operator
from typing import Sequence

import numpy as np
import torch

from runnercheck.impl import native
from runnercheck.impl.buffers import StagingWriter
from runnercheck.impl.staged_writes import StagedWriteGroup, StagedWriteTensor
from runnercheck.impl.device import Device
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.interface import (MAX_SEED, SAMPLING_FIELD_NAMES, SAMPLING_FIELDS, SamplingParams, SamplingParamsError,
                                        TokenOutOfVocabError)
from runnercheck.impl.kernels.launch import cdiv, launch
from runnercheck.impl.kernels.sampling_counts import add_token_counts_kernel, zero_count_rows_from_header_kernel, zero_count_rows_kernel

_COUNT_BLOCK = 1024
_TORCH_DTYPES = {"float32": torch.float32, "int32": torch.int32}
# An admission's values, read in the table's order and converted as its C twin converts them (`admission_layout`).
_read_fields = operator.attrgetter(*SAMPLING_FIELD_NAMES)
_CONVERTERS = tuple(int if f.is_int else float for f in SAMPLING_FIELDS)
# The sampler kernels' parameter groups (`SamplingState.kernel_params`).
_SCALED_NAMES = tuple(f.name for f in SAMPLING_FIELDS if f.stage != "penalty")
_PENALTY_NAMES = tuple(f.name for f in SAMPLING_FIELDS if f.stage == "penalty")


def _convert(to: type, value: float | int) -> float | int:
    return to(value)
_staging = native.load("staging")  # `prompt_bitmask`, the C twin of `_prompt_bitmask_reference`; None: numpy only


class SamplingStateError(ValueError):
    """A row index or argument the sampling state cannot take (no state was changed)."""


def prompt_bitmask_words(prompt_token_ids: Sequence[int], vocab_size: int) -> np.ndarray:
    """The int32 words of one ``prompt_mask`` row for these prompt tokens (in C when `runnercheck.impl.native` built it)."""
    if _staging is not None:
        words = np.empty((vocab_size + 31) // 32, dtype=np.int32)
        if _staging.prompt_bitmask(words, prompt_token_ids, vocab_size) is not NotImplemented:
            return words
    return _prompt_bitmask_reference(prompt_token_ids, vocab_size)


def _prompt_bitmask_reference(prompt_token_ids: Sequence[int], vocab_size: int) -> np.ndarray:
    words = np.zeros((vocab_size + 31) // 32, dtype=np.uint32)
    ids = np.asarray(prompt_token_ids, dtype=np.int64)
    if ids.size:
        np.bitwise_or.at(words, ids >> 5, (np.uint32(1) << (ids & 31).astype(np.uint32)))
    return words.view(np.int32)


def _check_tokens(tokens: Sequence[int], vocab_size: int, name: str) -> list[int]:
    out = list(tokens)
    for tok in out:
        if isinstance(tok, bool) or not isinstance(tok, (int, np.integer)) or not 0 <= int(tok) < vocab_size:
            raise TokenOutOfVocabError(f"token {tok!r} outside [0, {vocab_size})", field=name)
    return [int(t) for t in out]


class SamplingState:
    """Per-row sampling parameters and penalty state (see the module docstring for ownership)."""

    def __init__(self, device: Device, max_num_reqs: int, vocab_size: int, group: StagedWriteGroup | None = None):
        if max_num_reqs < 1 or vocab_size < 1:
            raise SamplingStateError(f"need max_num_reqs >= 1 and vocab_size >= 1, got {max_num_reqs}, {vocab_size}")
        self.device = device
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab_size
        self.num_mask_words = (vocab_size + 31) // 32
        # One tensor per row of the interface's table (`SAMPLING_FIELDS`), named as the field, its neutral value in
        # every row until an admission writes one; then the seed.
        params = tuple(StagedWriteTensor(device, max_num_reqs, _TORCH_DTYPES[f.dtype], f.name, fill=f.neutral, group=group)
                       for f in SAMPLING_FIELDS)
        for spec, tensor in zip(SAMPLING_FIELDS, params):
            setattr(self, spec.name, tensor)
        self.params: tuple[StagedWriteTensor, ...] = params
        self.seed = StagedWriteTensor(device, max_num_reqs, torch.int64, "seed", fill=0, group=group)
        self.prompt_mask = StagedWriteTensor(device, (max_num_reqs, self.num_mask_words), torch.int32, "prompt_mask", fill=0, group=group)
        self.output_counts = device.zeros((max_num_reqs, vocab_size), torch.int32)
        self._counts_stride = self.output_counts.stride(0)
        # 1 where the row's request asks for processed logprobs (`runnercheck.impl.interface.LOGPROBS_MODES`), else 0:
        # staged by `note_logprobs_mode` only when a row's mode changes (the host keeps `_processed_rows`).
        self.logprobs_mode = StagedWriteTensor(device, max_num_reqs, torch.int32, "logprobs_mode", fill=0, group=group)
        self._processed_rows: set[int] = set()  # host mirror: the rows whose ``logprobs_mode`` holds 1
        staged = (*params, self.seed, self.prompt_mask)
        # Flushed and applied here only when they have private groups; a shared group's owner does both.
        self._staged = (*staged, self.logprobs_mode) if group is None else ()
        self._scalars = staged[:-1]  # one element per row, in `add_request`'s order: the table's fields, the seed
        # With a shared group an admission is one record (row -> (the fields' values, the seed; the prompt)), packed by the
        # group's flush in C (`StagedWriteGroup.defer_admissions`; another write to these tensors stages the pending
        # records first, so the later write wins).
        self._admission_records: dict[int, tuple[tuple, Sequence[int]]] | None = None
        if group is not None:
            self._admission_records = {}
            group.defer_admissions(self._admission_records, self._scalars, self.prompt_mask, vocab_size, self._stage_admissions,
                                   list_rows=True)  # their count reset reads the rows the flush lists
        self._group = group
        self._pending_admissions: dict[int, list[int]] = {}  # row -> earlier outputs to count
        # The last flush's kernels, enqueued by `enqueue_apply`: the count reset of the admitted rows (writer, slot,
        # first word, rows) and a resumed request's earlier outputs to count again (rows, tokens, pairs).
        self._reset_rows: tuple[StagingWriter, object, int, int] | None = None
        self._earlier_outputs: tuple[torch.Tensor, torch.Tensor, int] | None = None

    def kernel_params(self) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """The per-row parameter tensors as the sampler's kernels take them, each group in the table's order: the
        temperature and the filters (stages "temperature", "filter"), then the penalties.  Read by name at every call:
        a mutant samples with a copy of the state whose named parameters are rewritten (`runnercheck.stress.mutants.catalogue`)."""
        return (tuple([getattr(self, name).base for name in _SCALED_NAMES]),
                tuple([getattr(self, name).base for name in _PENALTY_NAMES]))

    # ------------------------------------------------------------------ host API
    def add_request(
        self,
        row: int,
        params: SamplingParams,
        seed: int,
        prompt_token_ids: Sequence[int],
        output_token_ids: Sequence[int] = (),
        *,
        checked: bool = False,
    ) -> None:
        """Stage a request's admission into ``row`` (all checks first: a bad argument stages nothing).

        ``checked=True``: the caller already holds every argument to these rules (the runner, after
        `runnercheck.impl.boundary.check_new_request` accepted the request under stricter limits, with its row from
        `RequestStateTable.admit` and its seed from `effective_seed`): they are not run twice per admission.
        """
        if checked:  # a new request brings no outputs: no list comprehension's frame for none
            prompt, outputs = prompt_token_ids, list(map(int, output_token_ids)) if output_token_ids else []
        else:
            prompt, outputs = self._check_request(row, params, seed, prompt_token_ids, output_token_ids)
        values = (*map(_convert, _CONVERTERS, _read_fields(params)), seed)
        if self._admission_records is not None:
            self._admission_records[row] = (values, prompt)  # packed by the group's flush
        else:
            self._stage_admission(row, values, prompt)
        self._pending_admissions[row] = outputs

    def _stage_admission(self, row: int, values: tuple, prompt: Sequence[int]) -> None:
        for tensor, value in zip(self._scalars, values):
            tensor.stage_scalar(row, value)
        self.prompt_mask.stage(row, 0, prompt_bitmask_words(prompt, self.vocab_size))

    def _stage_admissions(self) -> None:
        """The deferred admissions staged through the tensors (the reference of the group's packing in C)."""
        records = list(self._admission_records.items())
        self._admission_records.clear()  # emptied first: the stagings below check for pending records
        for row, (values, prompt) in records:
            self._stage_admission(row, values, prompt)

    def _check_request(self, row: int, params: SamplingParams, seed: int, prompt_token_ids: Sequence[int],
                       output_token_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < self.max_num_reqs:
            raise SamplingStateError(f"row {row!r} outside [0, {self.max_num_reqs})")
        if not isinstance(params, SamplingParams):
            raise SamplingStateError(f"params must be SamplingParams, got {type(params).__name__}")
        params.validate(self.vocab_size, max_logprobs=self.vocab_size)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise SamplingParamsError(f"seed={seed!r}: must be an int in [0, {MAX_SEED}]", field="seed")
        return (_check_tokens(prompt_token_ids, self.vocab_size, "prompt_token_ids"),
                _check_tokens(output_token_ids, self.vocab_size, "output_token_ids"))

    @hot_path
    def note_logprobs_mode(self, row: int, processed: bool) -> None:
        """Stage the row's ``logprobs_mode`` (after its admission) when it changes: a row keeps its last
        request's mode until another request with the other mode is admitted into it."""
        if processed == (row in self._processed_rows):
            return
        if processed:
            self._processed_rows.add(row)
        else:
            self._processed_rows.discard(row)
        self.logprobs_mode.stage_scalar(row, 1 if processed else 0)

    @property
    def num_pending(self) -> int:
        return len(self._pending_admissions)

    @property
    def admission_records(self) -> dict[int, tuple[tuple, Sequence[int]]] | None:
        """The deferred admission records (None: a private group, no records).  `add_request` writes them, and so
        does the C twin of `runnercheck.impl.state.RequestStateTable.admit_staged`, exactly as `add_request` would (with
        ``checked=True``): the record, then the row's entry among the pending admissions."""
        return self._admission_records

    @hot_path
    def flush(self, writer: StagingWriter) -> None:
        """Pack everything staged since the last flush into ``writer`` (before ``writer.submit()``)."""
        for tensor in self._staged:
            tensor.flush(writer)
        pending = self._pending_admissions
        if not pending:
            self._reset_rows = self._earlier_outputs = None
            return
        self._pending_admissions = {}
        listed = None if self._group is None else self._group.listed_rows
        # The group's flush listed the records' rows this step: every pending row has its record there (a record is
        # never written without its pending entry), so the same count means the same rows.
        if listed is not None and listed[0] is writer and listed[3] == len(pending):
            self._reset_rows = listed
            self._group.listed_rows = None  # taken: a later flush into the same writer lists its own or none
            self._earlier_outputs = (self._stage_earlier_outputs(writer, sorted(pending), pending)
                                     if any(pending.values()) else None)
            return
        if len(pending) == 1:  # the usual admission: one word, no sort and no list-to-array conversion
            (row, outputs), = pending.items()
            rows_slot, rows_start = writer.reserve_index(1)
            rows_slot.host_words[rows_start] = row
            self._reset_rows = (writer, rows_slot, rows_start, 1)
            self._earlier_outputs = None if not outputs else self._stage_earlier_outputs(writer, [row], pending)
            return
        rows = sorted(pending)
        rows_host, rows_slot, rows_start = writer.reserve_words(len(rows))
        rows_host[:] = rows
        self._reset_rows = (writer, rows_slot, rows_start, len(rows))
        self._earlier_outputs = self._stage_earlier_outputs(writer, rows, pending) if any(pending.values()) else None

    def _stage_earlier_outputs(self, writer: StagingWriter, rows: list[int],
                               pending: dict[int, list[int]]) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Resumed requests' earlier outputs as (row, token) pairs in staging, counted again after their rows' reset."""
        pair_rows: list[int] = []
        pair_tokens: list[int] = []
        for row in rows:
            tokens = pending[row]
            pair_rows.extend([row] * len(tokens))
            pair_tokens.extend(tokens)
        return (writer.stage_array(np.asarray(pair_rows, dtype=np.int32), torch.int32),
                writer.stage_array(np.asarray(pair_tokens, dtype=np.int32), torch.int32), len(pair_tokens))

    @property
    def num_prepared_kernels(self) -> int:
        """Kernels the last flush prepared for `enqueue_apply` (the count reset, the earlier-output counts)."""
        return (self._reset_rows is not None) + (self._earlier_outputs is not None)

    @hot_path
    def take_resets(self, slot: object) -> tuple[int, int] | None:
        """``(rows, first word in slot)`` when the last flush's only kernel is the count reset and its rows sit in
        ``slot`` (a bucketed step's first slot): the caller names them in the step's header, so its graph zeroes
        them (`launch_reset_from_header`), and the eager reset is dropped.  Else None (the kernels stay eager:
        a resumed request's earlier outputs are counted after the reset, in that order)."""
        pack = self._reset_rows
        if pack is None or self._earlier_outputs is not None or pack[1] is not slot:
            return None
        self._reset_rows = None
        return pack[3], pack[2]

    def launch_reset_from_header(self, step_words: torch.Tensor, header: torch.Tensor) -> None:
        """Launch (inside a bucketed step) the count reset of the rows ``header`` names (`take_resets`):
        ``header[0]`` rows listed from word ``header[1]`` of ``step_words``."""
        launch(zero_count_rows_from_header_kernel, (cdiv(self.vocab_size, _COUNT_BLOCK),), self.output_counts,
               self.output_counts.stride(0), step_words, header, self.vocab_size, BLOCK=_COUNT_BLOCK)

    @hot_path
    def enqueue_apply(self) -> None:
        """Enqueue the staged applies, then the count reset, then the earlier-output counts."""
        for tensor in self._staged:
            tensor.enqueue_apply()
        resets, earlier = self._reset_rows, self._earlier_outputs
        self._reset_rows = self._earlier_outputs = None
        counts, stride, vocab = self.output_counts, self._counts_stride, self.vocab_size
        if resets is not None:
            writer, slot, start, num_rows = resets

            def reset() -> None:
                # The device view is made here: a bucketed step drops this kernel (`take_resets`).
                rows_dev = writer.words_view(slot, start, num_rows)
                launch(zero_count_rows_kernel, (num_rows, cdiv(vocab, _COUNT_BLOCK)), counts, stride, rows_dev, vocab,
                       BLOCK=_COUNT_BLOCK)

            self.device.enqueue(reset, "reset output counts")
        if earlier is not None:
            pair_rows_dev, pair_tokens_dev, num_pairs = earlier

            def add_earlier_outputs() -> None:
                launch(add_token_counts_kernel, (cdiv(num_pairs, _COUNT_BLOCK),),
                    counts, stride, pair_rows_dev, pair_tokens_dev, pair_tokens_dev, num_pairs, vocab,
                    HAS_VALID=False, BLOCK=_COUNT_BLOCK)

            self.device.enqueue(add_earlier_outputs, "count earlier outputs")

    @hot_path
    def launch_post_update(self, rows_dev: torch.Tensor, tokens_dev: torch.Tensor, valid_dev: torch.Tensor | None,
                           num: int) -> None:
        """Launch (from inside enqueued device work) ``counts[rows[i], tokens[i]] += 1`` where valid.

        ``rows_dev`` int32/int64 state rows, ``tokens_dev`` int32/int64 tokens, ``valid_dev`` any
        integer/bool dtype (nonzero = the token was accepted) or None for all; ``num`` a host int.
        """
        if num <= 0:
            return
        has_valid = valid_dev is not None
        launch(add_token_counts_kernel, (cdiv(num, _COUNT_BLOCK),),
            self.output_counts, self.output_counts.stride(0), rows_dev, tokens_dev,
            valid_dev if has_valid else tokens_dev, num, self.vocab_size, HAS_VALID=has_valid, BLOCK=_COUNT_BLOCK)

    @hot_path
    def enqueue_post_update(self, rows_dev: torch.Tensor, tokens_dev: torch.Tensor, valid_dev: torch.Tensor | None,
                            num: int) -> None:
        """Enqueue `launch_post_update` on the device (device inputs only; nothing is read back)."""
        self.device.enqueue(lambda: self.launch_post_update(rows_dev, tokens_dev, valid_dev, num), "count sampled tokens")
