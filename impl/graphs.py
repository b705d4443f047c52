"""The CUDA-graph manager: capture sizes, buckets, one graph per (size, mode), predicates, replay, fallbacks.

Phase: `CudaGraphManager.capture` runs once, after the runner's ``init`` (and ``profile``, when
the caller runs it) and before the first step; `execute_model` only *selects* and *replays*.
Nothing correctness needs happens only here: every buffer a graph reads is initialised at init
(`runnercheck.impl.graph_step.PaddedInputs`), and the captured launches are the same ones eager execution
runs (`runnercheck.impl.graph_step.build_padded_step`).

Per step the host picks (`select`):

* a graph, when the batch is a uniform decode (every request ``query_len = 1 + k`` tokens with
  exactly ``k`` drafts, ``k`` = 0 or the runner's ``max_num_draft_tokens``; a draft-model runner's
  ``num_spec_tokens``: ``spec_query_len``), asks no prompt
  logprobs, and fits a capture size.  The bucket is the smallest capture size >= the batch; its
  mode is (query_len, top-n logprobs: -1 or ``max_logprobs``).  A (size, mode) whose padded
  tokens ``size * query_len`` exceed ``max_num_batched_tokens`` (the input buffers) has no graph.  The graph's own predicate
  (`StepGraph.admits`) must accept the batch too;
* a *mixed* graph, when the batch has no drafts and no prompt logprobs but its query lengths differ
  (decodes next to admitted prompts and prefill chunks: the steps of a churning batch).  Its bucket
  is the smallest mixed size >= the step's tokens (`default_mixed_sizes`), holding ``min(tokens,
  max_num_reqs)`` requests; mode (`runnercheck.impl.graph_step.MIXED`, top-n).  A step of more tokens -- a long
  prefill, whose device time dwarfs its host time -- runs eager;
* otherwise a fallback reason (`FALLBACK_REASONS`), counted; the step runs eager, unpadded.

Sampler twins: every (size, mode) is captured three times, its sampler as all the split passes, as the split
passes without the filter launches (`GraphMode.unfiltered`) and as the all-greedy launch (`GraphMode.greedy`);
`select` takes the greedy twin when the host knows every live request has temperature 0 (``all_greedy``:
`runnercheck.impl.state.RequestStateTable.all_greedy`), else the unfiltered twin when it knows none has a filter on
(``unfiltered``: `runnercheck.impl.state.RequestStateTable.unfiltered`).  Three times the graphs and the capture time
(fused graphs included; the memory pool is shared, and a twin allocates nothing the sampler does not own from
init), chosen over taking the lighter launches in eager steps only: a steady decode -- the traffic they are for --
is a graph replay, and the choice cannot be made at replay time without the host reading the device.  Measured: docs/CONFIGURATION.md, "CUDA graphs".

A draft-model runner gets uniform decode buckets only (no mixed sizes): its bucket's launches include
the draft model's verification and k draft decodes (`runnercheck.impl.draft_proposer.DraftModelProposer.padded_launches`).

With graphs on, the chosen graph is replayed as ONE enqueue: on ``cuda`` a ``CUDAGraph.replay``;
on ``cpu``/``sim`` the launches recorded at capture run in order, still bound to the buffers they
were recorded with -- so a buffer re-allocated after capture diverges on CPU as on the GPU.  With
graphs off the same bucketed step runs eagerly (launches rebuilt and enqueued one by one), so
eager and replay compute the same shapes and agree bit for bit.

Fused graphs: with `runnercheck.impl.lanes.SteadyLanes` (usable), each single-token and each mixed bucket also
gets a second capture whose replay copies its staging bytes in and its output out itself (`fused`,
`run(key, fused=True)`): a steady step, and a churn step that admits one request, is then one
enqueue.  Its warm-up is the plain capture's.

Ownership: the manager owns the `PaddedInputs` (see `runnercheck.impl.graph_step`), the recorded steps, the
CUDA graphs and their memory pool (device, runner lifetime, written only at capture), and the
replay/fallback counters (host).  The lanes are the runner's; the manager captures with them.
"""
from __future__ import annotations

import bisect
import gc
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from runnercheck.impl.device import Device, GraphLaunch, _run_as_device_work
from runnercheck.impl.graph_step import MIXED, SAMPLER_TWINS, GraphKey, GraphMode, PaddedInputs, PaddedStep
from runnercheck.impl.lanes import SteadyLanes

FALLBACK_REASONS = ("prompt_logprobs", "non_uniform", "batch_above_largest_size", "bucket_above_token_budget",
                    "no_graph_for_mode")


_MAX_VERDICTS = 256  # batch shapes whose `CudaGraphManager.select` verdict is kept (all dropped when full)

# A selected bucket: its key, graph and fused graph (None: not captured) and the fused graph's copy-in bytes.
_Selection = tuple[GraphKey, "StepGraph | None", "StepGraph | None", "int | None"]


class GraphConfigError(ValueError):
    """Capture sizes that cannot be used (raised at construction, naming the value)."""


class GraphCaptureError(RuntimeError):
    """A capture that failed (out of memory, an op that cannot be captured); names the graph and the op."""


def default_capture_sizes(max_num_reqs: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every 8 up to ``max_num_reqs`` (and ``max_num_reqs`` itself, so every batch has a bucket)."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_num_reqs] + list(range(16, max_num_reqs + 1, 8))
    if sizes[-1] != max_num_reqs:
        sizes.append(max_num_reqs)
    return tuple(sizes)


def default_mixed_sizes(max_num_reqs: int, max_num_batched_tokens: int) -> tuple[int, ...]:
    """Token sizes of mixed buckets: 16, 32, then every 64 up to ``max_num_reqs + 512`` tokens (a full batch
    and a prompt chunk; capped at, and ending on, ``max_num_batched_tokens``)."""
    cap = min(max_num_batched_tokens, max_num_reqs + 512)
    sizes = [s for s in (16, 32) if s < cap] + list(range(64, cap + 1, 64))
    if not sizes or sizes[-1] != cap:
        sizes.append(cap)
    return tuple(sizes)


def validate_capture_sizes(sizes: Sequence[int] | None, max_num_reqs: int) -> tuple[int, ...]:
    """The capture sizes to use; a typed error naming the bad value for empty/unsorted/duplicated/non-positive/too large."""
    if sizes is None:
        return default_capture_sizes(max_num_reqs)
    values = _checked_sizes(sizes, max_num_reqs, "max_num_reqs", "capture")
    if not values:
        raise GraphConfigError("capture_sizes=[] is empty: give at least one size (or cuda_graphs=False)")
    return values


def validate_mixed_sizes(sizes: Sequence[int] | None, max_num_reqs: int, max_num_batched_tokens: int) -> tuple[int, ...]:
    """The mixed buckets' token sizes (`default_mixed_sizes` when None; ``()``: no mixed graphs), checked as capture sizes are."""
    if sizes is None:
        return default_mixed_sizes(max_num_reqs, max_num_batched_tokens)
    return _checked_sizes(sizes, max_num_batched_tokens, "max_num_batched_tokens", "mixed")


def _checked_sizes(sizes: Sequence[int], bound: int, bound_name: str, what: str) -> tuple[int, ...]:
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise GraphConfigError(f"{what}_sizes={sizes!r} must be a sequence of ints")
    values = list(sizes)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise GraphConfigError(f"{what} size {value!r} is not an int")
        if value < 1:
            raise GraphConfigError(f"{what} size {value} is not positive")
        if value > bound:
            raise GraphConfigError(f"{what} size {value} is above {bound_name}={bound}")
    for before, after in zip(values, values[1:]):
        if after == before:
            raise GraphConfigError(f"{what} size {after} is duplicated in {values}")
        if after < before:
            raise GraphConfigError(f"{what} sizes are not sorted: {after} after {before} in {values}")
    return tuple(int(v) for v in values)


def _release_intermediates(result: dict[str, Any]) -> None:
    """After a capture: drop the tensors the step allocated for itself and left in ``result`` (its logits), so their
    blocks go back to the shared pool and the next capture reuses them.  The replay still writes those addresses: the
    graphs replay one at a time on one stream, and each reads what it wrote within its own replay.  The host reads
    only the layout, the flags and the sampler's persistent outputs after a replay, never these.  Kept, every
    graph would hold its logits for the runner's lifetime: ~0.6 MiB a row of a 151936 vocabulary, times the rows
    of every bucket, every mode and every launch set."""
    for name in [name for name, value in result.items() if isinstance(value, torch.Tensor)]:
        del result[name]


@dataclass
class StepGraph:
    """One captured (size, mode): its recorded launches, its CUDA graph (cuda only) and its predicate."""

    step: PaddedStep
    cuda_graph: Any = None  # torch.cuda.CUDAGraph on cuda

    @property
    def key(self) -> GraphKey:
        return self.step.key

    def __post_init__(self) -> None:
        self.label = f"graph replay {self.key.describe()}"  # the replay's `Device.enqueue` label, made once
        self.work: Callable[[], None] = self.replay  # what `run` enqueues (`set_cuda_graph`)

    def set_cuda_graph(self, cuda_graph: torch.cuda.CUDAGraph) -> None:
        """The captured graph: its replay is enqueued as a `GraphLaunch` (the device's launch thread may issue it)."""
        self.cuda_graph = cuda_graph
        self.work = GraphLaunch(cuda_graph)

    def replay(self) -> None:
        """One replay (device work): the CUDA graph on cuda, the recorded launches in order on cpu/sim."""
        if self.cuda_graph is not None:
            self.cuda_graph.replay()
            return
        for _, launch in self.step.launches:
            launch()

    def admits(self, num_reqs: int, query_len: int, num_drafts_each: int, num_top: int, num_tokens: int = 0) -> bool:
        """The graph's compatibility predicate: the batch fits its size and matches its mode exactly.

        A mixed graph (``query_len`` `MIXED`) takes a batch without drafts whose ``num_tokens`` fit its tokens."""
        key = self.key
        mode = key.mode
        if mode.query_len == MIXED:
            return (1 <= num_reqs <= key.size and num_reqs <= num_tokens <= key.tokens and query_len == MIXED
                    and num_drafts_each == 0 and num_top == mode.num_top)
        return (1 <= num_reqs <= key.size and query_len == mode.query_len and num_drafts_each == mode.query_len - 1
                and num_top == mode.num_top)


class CudaGraphManager:
    """Buckets, predicates, capture and replay of bucketed steps (uniform decode and mixed).  See the module docstring."""

    def __init__(self, device: Device, *, enabled: bool, capture_sizes: Sequence[int] | None, max_num_reqs: int,
                 max_num_batched_tokens: int, max_num_draft_tokens: int, max_logprobs: int,
                 build_step: Callable[[PaddedInputs, GraphKey], PaddedStep], staging_bytes: int,
                 staging_layout: dict[str, tuple[int, int, torch.dtype]], lanes: SteadyLanes | None = None,
                 mixed_sizes: Sequence[int] | None = None, spec_query_len: int | None = None):
        self.device = device
        self.enabled = bool(enabled)
        self.capture_sizes = validate_capture_sizes(capture_sizes, max_num_reqs)
        self.mixed_sizes = validate_mixed_sizes(mixed_sizes, max_num_reqs, max_num_batched_tokens)
        self.max_num_reqs = max_num_reqs
        # The drafted decode mode: 1 + max_num_draft_tokens, or a proposer's 1 + k (``spec_query_len``; its decodes
        # never carry more drafts than it proposes).
        if spec_query_len is None:
            spec_query_len = 1 + max_num_draft_tokens
        if not 1 <= spec_query_len <= 1 + max_num_draft_tokens:
            raise GraphConfigError(f"spec_query_len {spec_query_len} is outside [1, 1 + max_num_draft_tokens]")
        self.query_lens = (1,) if spec_query_len == 1 else (1, spec_query_len)
        self.max_logprobs = max_logprobs
        self.max_num_batched_tokens = max_num_batched_tokens
        # Every mode thrice, one per sampler launch set (`SAMPLER_TWINS`; see the module docstring).
        self.modes = tuple(GraphMode(q, top, greedy, unfiltered) for q in self.query_lens for top in (-1, max_logprobs)
                           for greedy, unfiltered in SAMPLER_TWINS)
        self.inputs = PaddedInputs(device, max_num_reqs, max_num_draft_tokens, self.query_lens, staging_bytes, staging_layout)
        self._build_step = build_step
        self.graphs: dict[GraphKey, StepGraph] = {}
        # Single-token buckets' fused steps (lane copies in the replay), when ``lanes`` work: see `fused`.
        self.lanes = lanes if lanes is not None and lanes.usable else None
        self.fused_graphs: dict[GraphKey, StepGraph] = {}
        self.fused_in_bytes: dict[GraphKey, int] = {}
        self.fused_replays = 0
        self.mixed_replays = 0
        self.greedy_bucketed = 0  # bucketed steps of a greedy mode: replays (fused ones too) or, graphs off, padded eager
        self.unfiltered_bucketed = 0  # the same for the unfiltered modes
        self.captured = False
        self.replays = 0
        self.padded_eager = 0
        self.fallbacks: Counter[str] = Counter()
        # (size or mixed tokens, query_len, num_top, greedy, unfiltered) -> (the graphs dict it was looked up in, the
        # selection): `select`
        self._keys: dict[tuple[int, int, int, bool, bool], tuple[dict, _Selection]] = {}
        self._selected: _Selection | None = None  # the last `select`'s key, its graphs and fused copy-in bytes
        # batch shape -> (graphs dict, enabled, verdict, selection): `select`'s verdicts, at most `_MAX_VERDICTS`
        self._verdicts: dict[tuple, tuple] = {}
        self._pool = None

    # ------------------------------------------------------------------ capture phase
    def capture(self) -> None:
        """Capture (cuda) or record (cpu/sim) one step per (size, mode), largest first.  Init-phase only."""
        if not self.enabled or self.captured:
            return
        self._keys.clear()  # `select`'s looked-up graphs: this capture fills ``graphs`` anew
        self._verdicts.clear()
        self._selected = None
        # The warm-ups run the launches on the step buffer as it is: a header naming no request, diff or reset.
        self.inputs.header.zero_()
        self.device._stream_waits_for_current()
        if self.device.is_cuda:
            self.device.synchronize()
            self._pool = torch.cuda.graph_pool_handle()
        for key in self._keys_to_capture():
            step = self._build_step(self.inputs, key)
            graph = StepGraph(step)
            if self.device.is_cuda:
                graph.set_cuda_graph(self._capture_cuda(step))
            self.graphs[key] = graph
            if self.lanes is not None and (key.mode.query_len == 1 or key.mixed):
                self._capture_fused(key)
        if self.device.is_cuda:
            self.device.synchronize()
        if self.lanes is not None:
            self.lanes.reset()
        self.captured = True

    def _keys_to_capture(self) -> list[GraphKey]:
        """Every (size, mode) a batch may be bucketed into, most tokens first (later graphs reuse the pool's memory)."""
        keys = [GraphKey(size, mode) for size in self.capture_sizes for mode in self.modes
                if size * mode.query_len <= self.max_num_batched_tokens]  # no batch of a mode pads past the budget
        tops = (-1, self.max_logprobs)
        keys += [GraphKey(min(tokens, self.max_num_reqs), GraphMode(MIXED, top, greedy, unfiltered), tokens)
                 for tokens in self.mixed_sizes for top in tops for greedy, unfiltered in SAMPLER_TWINS]
        return sorted(keys, key=lambda k: (k.num_tokens, k.size), reverse=True)

    def _capture_fused(self, key: GraphKey) -> None:
        """The fused step of ``key``: lane copy in, the bucketed step, lane copy out, advance (`runnercheck.impl.lanes`).
        Captured without a warm-up: the plain capture of ``key`` just warmed its launches, and the lane
        kernels were compiled when the lanes were tried; a warm-up would run the copies on live lanes."""
        step = self._build_step(self.inputs, key)
        in_bytes = self.lanes.in_bytes(key.size, key.mixed)
        head, tail = self.lanes.launches(in_bytes, self.inputs.step_bytes, step.result["packed"].nbytes)
        fused = PaddedStep(key, head + step.launches + tail, step.result)
        fused.result["copied_out"] = True  # `runnercheck.impl.output.OutputSlots.enqueue_copy_out` enqueues no D2H for it
        graph = StepGraph(fused)
        graph.label = f"fused graph replay {key.describe()}"
        if self.device.is_cuda:
            graph.set_cuda_graph(self._capture_cuda(fused, warm_up=False))
        self.fused_graphs[key] = graph
        self.fused_in_bytes[key] = in_bytes

    def recapture(self) -> None:
        """Drop the captured steps and capture them again.

        A CUDA graph replays the launches that ran while it was captured: a hook installed on the
        runner's parts afterwards (a test harness's fault injection) reaches graph-replayed steps
        only once they are captured again.  Init-phase only, like `capture`.
        """
        if not self.captured:
            return
        self.graphs = {}
        self.fused_graphs, self.fused_in_bytes = {}, {}
        self.captured = False
        self.capture()

    def _capture_cuda(self, step: PaddedStep, warm_up: bool = True) -> torch.cuda.CUDAGraph:
        dev, key = self.device, step.key
        label = "warm-up"
        try:
            # Warm-up: Triton compiles, cuBLAS picks its kernels.  The padded rows are all -1 here
            # (init value), so the step changes no row state, KV or penalty count.
            if warm_up:
                for label, launch in step.launches:
                    dev.enqueue(launch, f"graph warm-up {key.describe()} {label}")
            dev.synchronize()
            cuda_graph = torch.cuda.CUDAGraph()
            # No garbage collection inside the capture: a collected object's destructor (a pinned buffer's
            # host-allocator event query, an event's destroy) is a CUDA call a capture may not contain.
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                with torch.cuda.graph(cuda_graph, pool=self._pool, stream=dev.stream):
                    for label, launch in step.launches:
                        _run_as_device_work(launch)
            finally:
                if gc_was_enabled:
                    gc.enable()
        except Exception as exc:
            raise GraphCaptureError(f"capturing the CUDA graph of size {key.size} ({key.mode.describe()}) failed in "
                                    f"op '{label}': {type(exc).__name__}: {exc}") from exc
        _release_intermediates(step.result)
        return cuda_graph

    # ------------------------------------------------------------------ per step (host)
    def bucket_for(self, num_reqs: int) -> int | None:
        """The smallest capture size >= ``num_reqs`` (None: above the largest)."""
        i = bisect.bisect_left(self.capture_sizes, num_reqs)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None

    def mixed_bucket_for(self, num_tokens: int) -> int | None:
        """The smallest mixed size >= ``num_tokens`` (None: above the largest, or no mixed sizes)."""
        i = bisect.bisect_left(self.mixed_sizes, num_tokens)
        return self.mixed_sizes[i] if i < len(self.mixed_sizes) else None

    def select(self, num_reqs: int, uniform: tuple[int, int] | None, num_prompt_rows: int,
               max_num_logprobs: int, num_tokens: int = 0, num_drafts: int = 0,
               all_greedy: bool = False, unfiltered: bool = False) -> tuple[GraphKey | None, str | None]:
        """(key, None) for a bucketed step, or (None, fallback reason).  Host ints only.

        ``uniform``: the (query_len, drafts) every request of the batch shares, None when they differ
        (`runnercheck.impl.input_batch.StepPlan.uniform`); ``num_tokens``, ``num_drafts``: the step's (a batch that is
        not a uniform decode goes to a mixed graph when it has no drafts); ``all_greedy``: the host knows every row
        of the step has temperature 0 -- the bucket's greedy mode (`GraphMode.greedy`) is selected; else
        ``unfiltered``: the host knows no row has a filter on -- its unfiltered mode (`GraphMode.unfiltered`).
        """
        twin = SAMPLER_TWINS[2] if all_greedy else SAMPLER_TWINS[1] if unfiltered else SAMPLER_TWINS[0]
        # A batch shape seen before (the steps of a steady workload repeat a few): its verdict again, while the
        # captured set and the enabled flag it was made under hold.
        shape = (num_reqs, uniform, num_prompt_rows, max_num_logprobs, num_tokens, num_drafts, twin)
        seen = self._verdicts.get(shape)
        if seen is not None and seen[0] is self.graphs and seen[1] == self.enabled:
            if seen[3] is not None:
                self._selected = seen[3]
            return seen[2]
        verdict = self._select(num_reqs, uniform, num_prompt_rows, max_num_logprobs, num_tokens, num_drafts, twin)
        if len(self._verdicts) >= _MAX_VERDICTS:
            self._verdicts.clear()
        self._verdicts[shape] = (self.graphs, self.enabled, verdict, self._selected if verdict[0] is not None else None)
        return verdict

    def _select(self, num_reqs: int, uniform: tuple[int, int] | None, num_prompt_rows: int,
                max_num_logprobs: int, num_tokens: int, num_drafts: int,
                twin: tuple[bool, bool]) -> tuple[GraphKey | None, str | None]:
        if num_prompt_rows:
            return None, "prompt_logprobs"
        if uniform is None or uniform[0] not in self.query_lens or uniform[1] != uniform[0] - 1:
            if num_drafts or not self.mixed_sizes:
                return None, "non_uniform"
            tokens = self.mixed_bucket_for(num_tokens)
            if tokens is None:
                return None, "batch_above_largest_size"
            return self._bucket(tokens, MIXED, num_reqs, 0, max_num_logprobs, num_tokens, twin)
        query_len, num_drafts = uniform
        size = self.bucket_for(num_reqs)
        if size is None:
            return None, "batch_above_largest_size"
        if size * query_len > self.max_num_batched_tokens:
            return None, "bucket_above_token_budget"
        return self._bucket(size, query_len, num_reqs, num_drafts, max_num_logprobs, num_tokens, twin)

    def _bucket(self, size: int, query_len: int, num_reqs: int, num_drafts_each: int, max_num_logprobs: int,
                num_tokens: int, twin: tuple[bool, bool]) -> tuple[GraphKey | None, str | None]:
        """The key of bucket ``size`` (a mixed bucket's: its tokens) in mode (``query_len``, top-n, ``twin``: a row of
        `SAMPLER_TWINS`), if its graph admits the batch."""
        num_top = -1 if max_num_logprobs < 0 else self.max_logprobs
        # The key and its graph, looked up once per (size, mode) and captured set: no per-step dataclass
        # construction or hashing.  A new ``graphs`` dict (a recapture) makes every entry stale.
        entry = self._keys.get((size, query_len, num_top, *twin))
        if entry is None or entry[0] is not self.graphs:
            mode = GraphMode(query_len, num_top, *twin)
            key = GraphKey(min(size, self.max_num_reqs), mode, size) if query_len == MIXED else GraphKey(size, mode)
            selection = (key, self.graphs.get(key), self.fused_graphs.get(key), self.fused_in_bytes.get(key))
            entry = self._keys[(size, query_len, num_top, *twin)] = (self.graphs, selection)
        selection = entry[1]
        graph = selection[1]
        if self.enabled and (graph is None or not graph.admits(num_reqs, query_len, num_drafts_each, num_top, num_tokens)):
            return None, "no_graph_for_mode"
        self._selected = selection  # `fused` and `run` take the graphs from here: the key is not hashed again
        return selection[0], None

    def count_fallback(self, reason: str) -> None:
        self.fallbacks[reason] += 1

    def fused(self, key: GraphKey | None) -> int | None:
        """The bytes the fused step of ``key`` copies in (the most a step may stage to replay it), or None
        when ``key`` has no fused step (lanes off, graphs off, a multi-token decode mode)."""
        selected = self._selected  # usually the key `select` (or, for a steady step, the one before it) returned
        if selected is not None and selected[0] is key:
            return selected[3]
        return self.fused_in_bytes.get(key)  # filled by `capture`, which captures nothing with graphs off

    def run(self, key: GraphKey, fused: bool = False) -> dict[str, Any]:
        """Enqueue the bucketed step (after the H2D of its step buffer); returns the dict its sampler output lands in.

        ``fused``: the fused step of ``key`` instead, for the lane `SteadyLanes.take` names (the caller staged
        the step in that lane's staging slot and holds its output slot: `SteadyLanes.fits`)."""
        selected = self._selected
        if fused:
            graph = selected[2] if selected is not None and selected[0] is key else self.fused_graphs[key]
            self.lanes.take()
            self.replays += 1
            self.fused_replays += 1
            self.mixed_replays += key.mode.query_len == MIXED  # `GraphKey.mixed`, without its call
            self.greedy_bucketed += key.mode.greedy
            self.unfiltered_bucketed += key.mode.unfiltered
            self.device.enqueue(graph.work, graph.label)
            return graph.step.result
        if not self.enabled:
            step = self._build_step(self.inputs, key)
            for label, launch in step.launches:
                self.device.enqueue(launch, label)
            self.padded_eager += 1
            self.greedy_bucketed += key.mode.greedy
            self.unfiltered_bucketed += key.mode.unfiltered
            return step.result
        graph = selected[1] if selected is not None and selected[0] is key else self.graphs[key]
        self.replays += 1
        if key.mode.query_len == MIXED:
            self.mixed_replays += 1
        self.greedy_bucketed += key.mode.greedy
        self.unfiltered_bucketed += key.mode.unfiltered
        self.device.enqueue(graph.work, graph.label)
        return graph.step.result

    def stats(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "replays": self.replays, "fused_replays": self.fused_replays,
                "mixed_replays": self.mixed_replays, "greedy_bucketed": self.greedy_bucketed,
                "unfiltered_bucketed": self.unfiltered_bucketed, "fallbacks": dict(self.fallbacks),
                "padded_eager": self.padded_eager, "num_graphs": len(self.graphs), "capture_sizes": list(self.capture_sizes),
                "mixed_sizes": list(self.mixed_sizes)}


def format_graph_stats(stats: dict[str, Any]) -> str:
    """One line for a summary table: ``graphs on: 120 replays; fallbacks: non_uniform 3`` (from `CudaGraphManager.stats`)."""
    fallbacks = ", ".join(f"{reason} {n}" for reason, n in sorted(stats.get("fallbacks", {}).items())) or "none"
    if stats.get("enabled"):
        return f"graphs on: {stats.get('replays', 0)} replays; fallbacks: {fallbacks}"
    return f"graphs off (eager): {stats.get('padded_eager', 0)} bucketed steps; fallbacks: {fallbacks}"


__all__ = ["CudaGraphManager", "FALLBACK_REASONS", "GraphCaptureError", "GraphConfigError", "StepGraph",
           "default_capture_sizes", "default_mixed_sizes", "format_graph_stats", "validate_capture_sizes",
           "validate_mixed_sizes"]
