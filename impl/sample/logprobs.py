"""Logprobs of chosen tokens (sampled or actual next prompt tokens) and top-n lists, on the device.

No ``[rows, vocab]`` logprob tensor exists: one split pass over vocabulary chunks writes, per
chunk, the log-sum-exp partials, the count above the target and the max of each ``SUB``-token
sub-block; the row's last chunk program turns them into the logprob, the rank and the top-n,
re-reading only the sub-blocks that reach the ``n``-th largest chunk max (from L2).  A row whose
candidates overflow goes to the per-row fallback program (`runnercheck.impl.kernels.sampling_logprobs`).

Ownership: a `LogprobsComputer` owns its output buffers (``logprob`` f32 ``[R]``, ``rank`` i32
``[R]``, ``top_ids`` i32 ``[R, max_logprobs]``, ``top_logprobs`` f32 ``[R, max_logprobs]``), its
per-(row, chunk) partials (``part_max`` f32, ``part_sum`` f32, ``part_above`` i32 ``[R, NB]``,
``sub_max`` f32 ``[R, NB * SUBS]``), its per-row arrival counters (``arrivals`` i32 ``[R]``, zero
between launches: each launch's last program of a row resets its counter), its per-row plan
(``mode`` i32 ``[R]``: DONE or FALLBACK), its candidate lists (``sub_list`` i32 and ``candidates``
i64 ``[R, logprobs_candidates]``) and the fallback's scratch (i64 ``[R, candidates]``), all on the
device for its lifetime, persistent addresses (CUDA graphs), sized at construction, written only by
its kernels; partials, lists and plan mean something only within one launch.  A step's results are
valid from the launch until the next launch, so the caller copies them out (one async D2H) before
reusing the computer.  Extra memory is independent of the call: at [256, 151936] with the GPU
defaults 3.8 MiB (`held_bytes`; 2 MiB of it the fallback's scratch), against 148 MiB of logits.

Prompt logprobs
---------------
For prompt positions ``i`` (``i + 1 < prompt_len``) the target is prompt token ``i + 1``.  The
runner never materialises the logits of a whole long prompt: `prompt_logprobs_chunked` asks a
``compute_logits(start, end)`` callback for ``[end - start, V]`` logits of ``chunk_rows``
positions at a time and runs the kernel on each chunk into the slices of caller-provided output
tensors, so peak memory is ``chunk_rows * V`` floats whatever the prompt length.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch
import triton

from runnercheck.impl.device import Device
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.kernels.launch import launch
from runnercheck.impl.kernels.sampling_logprobs import logprobs_block_kernel, token_logprobs_kernel


class LogprobsError(ValueError):
    """Bad arguments to the logprobs computation (shapes, dtypes, counts)."""


@dataclass(frozen=True)
class LogprobsOutput:
    """Device views for ``num_rows`` rows: ``logprob [N]``, ``rank [N]``, ``top_ids [N, K]``, ``top_logprobs [N, K]``."""

    logprob: torch.Tensor
    rank: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor


@dataclass(frozen=True)
class SelectionConfig:
    """Launch shape shared by the sampler and logprobs kernels (see `default_selection_config`)."""

    block: int
    narrow_block: int
    candidates: int
    pivots: int = 16
    max_passes: int = 16
    num_warps: int = 8
    chunk: int = 0  # vocabulary chunk per program of the split passes (0: ``block``)
    slots: int = 32  # per-chunk candidate slots of the split gather (capped at ``candidates``)
    split_candidates: int = 256  # candidates per row of the split gather (capped at ``candidates``)
    split_warps: int = 4
    block_warps: int = 0  # warps per program of the sampler's first split pass (0: ``split_warps``)
    block_maxnreg: int = 0  # register cap of the sampler's first split pass (0: the compiler's choice)
    logprobs_chunk: int = 0  # vocabulary chunk of the logprobs pass (0: ``split_chunk``, the sampler's)
    logprobs_sub: int = 128  # sub-block whose max the logprobs pass keeps (the finish re-reads these)
    logprobs_candidates: int = 128  # per-row entries (and sub-blocks) >= T the logprobs finish takes
    logprobs_maxnreg: int = 0  # register cap of the logprobs pass (0: the compiler's choice)
    logprobs_warps: int = 0  # warps per program of the logprobs pass (0: ``split_warps``, the sampler's)
    greedy_sub: int = 64  # vocabulary step of the all-greedy launch's programs (`sampling_greedy`)
    greedy_warps: int = 1
    select_programs: int = 0  # about how many programs the sampler's select pass may have (0: one per chunk)
    greedy_programs: int = 4  # programs per all-greedy launch, about (spans per row = programs / rows)
    greedy_stages: int = 1  # software-pipelined steps of the all-greedy launch's loop (1: plain loads)

    @property
    def split_chunk(self) -> int:
        return self.chunk or self.block

    @property
    def logprobs_split_chunk(self) -> int:
        return self.logprobs_chunk or self.split_chunk

    @property
    def block_num_warps(self) -> int:
        return self.block_warps or self.split_warps

    @property
    def logprobs_num_warps(self) -> int:
        return self.logprobs_warps or self.split_warps

    @property
    def chunk_slots(self) -> int:
        return min(self.slots, self.candidates)


@dataclass(frozen=True)
class SplitLayout:
    """How a row of ``vocab_size`` splits across programs: ``num_blocks`` chunks of ``chunk`` entries.

    ``nb_p2``: ``num_blocks`` rounded up to a power of two (the combines' lane count); ``slot``: the
    per-chunk candidate slots; ``cand``: the row's candidate capacity; ``group``: chunks per step of
    the candidate compaction; ``cols``: the column slice of the counting selections.
    """

    chunk: int
    num_blocks: int
    nb_p2: int
    slot: int
    cand: int
    group: int
    cols: int

    @classmethod
    def of(cls, config: SelectionConfig, vocab_size: int, chunk: int | None = None) -> "SplitLayout":
        chunk, slot = chunk or config.split_chunk, config.chunk_slots
        cand = min(config.split_candidates, config.candidates)
        for name, value in (("chunk", chunk), ("slots", slot), ("split_candidates", cand)):
            if value < 1 or value & (value - 1):
                raise LogprobsError(f"SelectionConfig {name} must be a power of two, got {value}")
        for name, least in (("select_programs", 0), ("block_maxnreg", 0), ("greedy_stages", 1)):
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise LogprobsError(f"SelectionConfig {name} must be an int >= {least}, got {value!r}")
        num_blocks = triton.cdiv(vocab_size, chunk)
        nb_p2 = triton.next_power_of_2(num_blocks)
        return cls(chunk, num_blocks, nb_p2, slot, cand, min(nb_p2, max(1, 1024 // slot)), min(32, cand))


def default_selection_config(device: Device, candidate_capacity: int | None = None) -> SelectionConfig:
    """Wide blocks on a GPU; small ones under the Triton interpreter (cost there is per op)."""
    if device.is_cuda:
        # logprobs in 4096-token chunks of 8 warps (16 tokens a thread, as 2048 x 4): H200 run 11's tune
        # (`runnercheck.bench.lab.tune_selection`, one run) gave 84.5 us at 256 rows against 92.8 us for 2048 x 4 and
        # 16.4 / 20.6 us at 1 / 8 rows against 21.4 / 25.9.  128-token sub-blocks keep the finish's
        # re-read at ~1/60 of the row.  The register cap: the row finish (which the last program of a
        # row runs) would otherwise take 128 registers for every program (too few loads in flight);
        # at 64 only the finish spills.
        # The first split pass in 2 warps (16 tokens a thread): H100 lab sweep (`runnercheck.bench.lab.sampler_variants`,
        # one lease) gave the temperature rows' pass 150 us at 256 rows against 179 us in 4 warps (ncu: 92
        # registers, issue slots 67% busy at 31% occupancy), the same at 1 and 8 rows.  The all-greedy launch:
        # 2048-token steps of 16 warps (4 tokens a thread), ~256 programs a launch (two per SM): with its
        # penalty-free loop, at 256 rows one span per row took 78.1 us in an H100 sweep against 81.5 us in 8 warps,
        # 80.4 us for torch.argmax and 65.0 us for a plain max over the logits; 64 rows 32.3 against 33.6 us; 4096-
        # token steps or 4 warps (16 tokens a thread) were 2.5x slower; at 8 rows all within 10%.  Its loop's loads
        # pipelined three deep (`greedy_stages`, where a span has 8 steps or more): H100 run 151, 75.8 us against 78.3
        # at 256 rows (bench_sampler), 31.0 against 32.6 at 64 (lab); two stages were slower than none.  The first
        # split pass capped at 80 registers a thread (`block_maxnreg`; uncapped, Triton's sm_90 compile of it takes
        # 128, so fewer programs fit an SM; its logits path alone needs 84): H100 run 163, temperature at 256 rows
        # 111.5 us at 80 against 117.0 at 88, 117.2 at 96, 127.6 at 112 and 143.4 uncapped, temp+top-k+top-p 173.6
        # against 177.1 at 96, all filters + penalties 234.5 against 237.6 at 96.  The select pass runs one program
        # per chunk: at 256 rows (38,912) they took 24.1 us of the temperature rows' 207.7 us on an H100 (run 150,
        # torch.profiler) doing nothing, those rows exit at once.  Grouped chunks (select_programs=4096, its loop at
        # 102 registers a thread against 64) trade that for the filtered rows' reads: in the same run temperature
        # 187.3 us, temp+top-k+top-p 214.9 us against 205.2 -- not the default.
        config = SelectionConfig(block=1024, narrow_block=256, candidates=1024, chunk=1024, slots=16,
                                 logprobs_chunk=4096, logprobs_warps=8, logprobs_sub=128, logprobs_candidates=128,
                                 logprobs_maxnreg=64, greedy_sub=2048, greedy_warps=16, greedy_programs=256,
                                 greedy_stages=3, block_warps=2, block_maxnreg=80)
    else:
        config = SelectionConfig(block=512, narrow_block=256, candidates=64, num_warps=4, chunk=64, slots=16,
                                 split_warps=1, logprobs_sub=16, logprobs_candidates=32)
    if candidate_capacity is not None:
        if candidate_capacity < 2 or candidate_capacity & (candidate_capacity - 1):
            raise LogprobsError(f"candidate_capacity must be a power of two >= 2, got {candidate_capacity}")
        config = dataclasses.replace(config, candidates=candidate_capacity)
    return config


def _check_logits(logits: torch.Tensor, num_rows: int, vocab_size: int, name: str = "logits") -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise LogprobsError(f"{name} must be a 2-D tensor [rows, {vocab_size}]")
    if logits.dtype != torch.float32:
        raise LogprobsError(f"{name} must be float32, got {logits.dtype}")
    if logits.shape[1] != vocab_size or logits.stride(1) != 1:
        raise LogprobsError(f"{name} must have {vocab_size} contiguous columns, got shape {tuple(logits.shape)}")
    if logits.shape[0] < num_rows:
        raise LogprobsError(f"{name} has {logits.shape[0]} rows, fewer than num_rows={num_rows}")


class LogprobsComputer:
    """Runs the logprobs kernels into persistent buffers (ownership: see the module docstring)."""

    def __init__(self, device: Device, vocab_size: int, max_logprobs: int, max_num_rows: int,
                 config: SelectionConfig | None = None):
        if vocab_size < 1 or max_num_rows < 1 or max_logprobs < 0:
            raise LogprobsError("need vocab_size >= 1, max_num_rows >= 1 and max_logprobs >= 0")
        self.device = device
        self.vocab_size = vocab_size
        self.max_logprobs = max_logprobs
        self.max_num_rows = max_num_rows
        self.max_top = triton.next_power_of_2(max(1, max_logprobs))
        config = config or default_selection_config(device)
        if config.candidates < 2 * self.max_top:
            config = dataclasses.replace(config, candidates=2 * self.max_top)
        self.config = config
        self.layout = layout = SplitLayout.of(config, vocab_size, config.logprobs_split_chunk)
        sub, cand = config.logprobs_sub, config.logprobs_candidates
        for name, value in (("logprobs_sub", sub), ("logprobs_candidates", cand)):
            if value < 2 or value & (value - 1):
                raise LogprobsError(f"SelectionConfig {name} must be a power of two >= 2, got {value}")
        self.sub = min(sub, layout.chunk)  # a sub-block never spans chunks
        self.cand = cand
        self.cols = min(32, cand)
        width = max(1, max_logprobs)
        self.logprob = device.zeros(max_num_rows, torch.float32)
        self.rank = device.zeros(max_num_rows, torch.int32)
        self.top_ids = device.zeros((max_num_rows, width), torch.int32)
        self.top_logprobs = device.zeros((max_num_rows, width), torch.float32)
        self.scratch = device.zeros((max_num_rows, config.candidates), torch.int64)
        per_chunk = (max_num_rows, layout.num_blocks)
        self.part_max = device.zeros(per_chunk, torch.float32)
        self.part_sum = device.zeros(per_chunk, torch.float32)
        self.part_above = device.zeros(per_chunk, torch.int32)
        self.sub_max = device.zeros((max_num_rows, layout.num_blocks * (layout.chunk // self.sub)), torch.float32)
        self.arrivals = device.zeros(max_num_rows, torch.int32)
        self.mode = device.zeros(max_num_rows, torch.int32)
        self.sub_list = device.zeros((max_num_rows, cand), torch.int32)
        self.candidates = device.zeros((max_num_rows, cand), torch.int64)
        # The default outputs per (rows, top-n), made once (host objects over the buffers above): slicing
        # four buffers on every eager step with logprobs costs host time on a GPU host.
        self._outputs: dict[tuple[int, int], LogprobsOutput] = {}

    def held_bytes(self) -> int:
        """Device bytes this computer holds from construction (outputs, partials, counters, lists, scratch)."""
        owned = (self.logprob, self.rank, self.top_ids, self.top_logprobs, self.scratch, self.part_max, self.part_sum,
                 self.part_above, self.sub_max, self.arrivals, self.mode, self.sub_list, self.candidates)
        return sum(t.numel() * t.element_size() for t in owned)

    def check(self, logits: torch.Tensor, target_ids: torch.Tensor, num_rows: int, num_top: int) -> None:
        """Host-side shape checks (metadata only, never device data)."""
        if isinstance(num_rows, bool) or not isinstance(num_rows, int) or not 0 <= num_rows <= self.max_num_rows:
            raise LogprobsError(f"num_rows={num_rows!r} outside [0, {self.max_num_rows}]")
        if isinstance(num_top, bool) or not isinstance(num_top, int) or not 0 <= num_top <= min(self.max_logprobs, self.vocab_size):
            raise LogprobsError(f"num_top={num_top!r} outside [0, {min(self.max_logprobs, self.vocab_size)}]")
        _check_logits(logits, num_rows, self.vocab_size)
        if not isinstance(target_ids, torch.Tensor) or target_ids.dim() != 1 or target_ids.shape[0] < num_rows:
            raise LogprobsError(f"target_ids must be a 1-D tensor of at least {num_rows} ids")
        if target_ids.dtype not in (torch.int32, torch.int64):
            raise LogprobsError(f"target_ids must be int32 or int64, got {target_ids.dtype}")

    @hot_path
    def launch(self, logits: torch.Tensor, target_ids: torch.Tensor, num_rows: int, num_top: int,
               out: LogprobsOutput | None = None) -> LogprobsOutput:
        """Launch the kernels for rows ``[0, num_rows)`` (device work only; call inside an enqueue).

        Results go to this computer's buffers, or to ``out`` (views with the same layout rules:
        ``top_ids``/``top_logprobs`` rows of stride >= ``num_top``, contiguous columns).
        """
        self.check(logits, target_ids, num_rows, num_top)
        if out is None:
            out = self._outputs.get((num_rows, num_top))
            if out is None:
                if len(self._outputs) >= 1024:
                    self._outputs.clear()
                out = self._outputs[(num_rows, num_top)] = LogprobsOutput(
                    self.logprob[:num_rows], self.rank[:num_rows], self.top_ids[:num_rows, :num_top],
                    self.top_logprobs[:num_rows, :num_top])
        if num_rows == 0:
            return out
        c = self.config
        top_stride = out.top_ids.stride(0) if out.top_ids.dim() == 2 else 1
        if out.top_logprobs.stride(0) != top_stride:
            raise LogprobsError("top_ids and top_logprobs must share a row stride")
        lay = self.layout
        # grid (chunk, row): a row's chunks run back to back, so its last one re-reads from L2
        launch(logprobs_block_kernel, (lay.num_blocks, num_rows),
            logits, logits.stride(0), target_ids, self.part_max, self.part_sum, self.part_above, self.sub_max,
            self.arrivals, lay.num_blocks, num_top, self.mode, self.sub_list, self.candidates, out.logprob, out.rank,
            out.top_ids, out.top_logprobs, top_stride, self.vocab_size, CHUNK=lay.chunk, SUB=self.sub,
            NB_P2=lay.nb_p2, CAND=self.cand, COLS=self.cols, num_warps=c.logprobs_num_warps,
            maxnreg=c.logprobs_maxnreg or None)
        if num_top == 0:
            return out
        launch(token_logprobs_kernel, (num_rows,),
            logits, logits.stride(0), target_ids, self.scratch, self.mode, out.logprob, out.rank, out.top_ids,
            out.top_logprobs, top_stride, num_top, self.vocab_size,
            BLOCK=c.block, NARROW_BLOCK=c.narrow_block, CAND=c.candidates, MAX_TOP=self.max_top,
            NPIV=c.pivots, MAX_PASSES=c.max_passes, num_warps=c.num_warps)
        return out


def token_logprobs(logits: torch.Tensor, target_ids: torch.Tensor, num_rows: int, k: int, *,
                   device: Device | None = None) -> LogprobsOutput:
    """Convenience (not for the hot path: it allocates): logprob, rank and top-``k`` of each row's target."""
    device = device or Device("cuda" if logits.is_cuda else "cpu")
    computer = LogprobsComputer(device, logits.shape[1], max(k, 1), max(num_rows, 1))
    return computer.launch(logits, target_ids, num_rows, k)


def prompt_logprobs_chunked(
    compute_logits: Callable[[int, int], torch.Tensor],
    target_ids: torch.Tensor,
    num_positions: int,
    num_top: int,
    computer: LogprobsComputer,
    out: LogprobsOutput,
    chunk_rows: int | None = None,
) -> LogprobsOutput:
    """Prompt logprobs for ``num_positions`` positions, ``chunk_rows`` at a time (device work only).

    ``compute_logits(start, end)`` returns float32 logits ``[end - start, V]`` for positions
    ``start..end-1``; ``target_ids[i]`` is the prompt token after position ``i``; ``out`` holds
    ``[num_positions]`` / ``[num_positions, >= num_top]`` device tensors the results are written to.
    """
    chunk_rows = chunk_rows or computer.max_num_rows
    if not 1 <= chunk_rows <= computer.max_num_rows:
        raise LogprobsError(f"chunk_rows={chunk_rows} outside [1, {computer.max_num_rows}]")
    if out.logprob.shape[0] < num_positions or target_ids.shape[0] < num_positions:
        raise LogprobsError(f"out and target_ids must cover {num_positions} positions")
    for start in range(0, num_positions, chunk_rows):
        end = min(start + chunk_rows, num_positions)
        logits = compute_logits(start, end)
        chunk_out = LogprobsOutput(out.logprob[start:end], out.rank[start:end], out.top_ids[start:end],
                                   out.top_logprobs[start:end])
        computer.launch(logits, target_ids[start:end], end - start, num_top, out=chunk_out)
    return out
