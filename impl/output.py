"""Step results on their way to the host: device result buffers, pinned output slots, `AsyncStepOutput`.

Per step the device packs the sampled tokens, per-request sample counts, non-finite flags and
(when asked) logprobs into one device byte buffer, copies it with ONE async D2H copy into a
pinned output slot, and records an event.  `AsyncStepOutput.get()` is the only host wait: it
synchronizes on that event and builds the `ModelRunnerOutput` from the slot.

Ownership
---------
``num_sampled`` (int32 ``[max_num_reqs]``) and ``row_valid`` (int32 ``[max_logit_rows]``): device,
runner lifetime, contents valid for one step; written only by the post-update kernel.
``pack`` (uint8 device buffer): device, runner lifetime, one step; written only by the step's
pack copies (`OutputSlots.pack_results`: enqueued with the D2H, or the last launch of a bucketed
step's graph), read only by the step's D2H copy (stream order separates steps).
``slots`` (pinned uint8 host buffers, a ring): pinned host, runner lifetime.  A slot is written
only by its D2H copy (a fused steady step's lane copy-out, `runnercheck.impl.lanes`, is that copy) and read
only by the host after its event, by the `AsyncStepOutput` that holds it.  A slot is handed to a new step only after its holder has read it: either ``get()`` was
called, or, when the ring wraps first, the holder materialises its output (waiting on its event
if it is not complete, counted in ``num_backpressure_waits``) before the slot is reused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

import numpy as np
import torch

from runnercheck.impl.device import Device, DeviceEvent
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl.interface import ModelRunnerOutput, TokenLogprobs

_ALIGN = 8


@dataclass(frozen=True)
class PromptLogprobRequest:
    """Prompt-logprob rows of one request in this step: rows ``[offset, offset + count)`` of the prompt block."""

    req_id: str
    offset: int
    count: int
    num_top: int


@dataclass(frozen=True)
class OutputLayout:
    """Where each field sits in the packed output (byte offsets), for one step.  Host-known shapes only."""

    num_reqs: int  # requests packed (a bucketed step packs its padded size; the batch is the first ones)
    num_rows: int  # sampling logit rows
    num_top: int  # top logprobs per sampling row; -1: no logprobs this step
    num_prompt_rows: int
    num_prompt_top: int  # -1: no prompt logprobs this step
    offsets: Mapping[str, tuple[int, torch.dtype, tuple[int, ...]]] = field(default_factory=dict)
    nbytes: int = 0

    @staticmethod
    def build(num_reqs: int, num_rows: int, num_top: int, num_prompt_rows: int, num_prompt_top: int) -> "OutputLayout":
        fields: list[tuple[str, torch.dtype, tuple[int, ...]]] = [
            ("tokens", torch.int64, (num_rows,)),
            ("num_sampled", torch.int32, (num_reqs,)),
            ("nan_flags", torch.int32, (num_rows,)),
        ]
        if num_top >= 0:
            fields += [
                ("logprob", torch.float32, (num_rows,)), ("rank", torch.int32, (num_rows,)),
                ("top_ids", torch.int32, (num_rows, num_top)), ("top_logprobs", torch.float32, (num_rows, num_top)),
            ]
        if num_prompt_rows > 0 and num_prompt_top >= 0:
            fields += [
                ("prompt_logprob", torch.float32, (num_prompt_rows,)), ("prompt_rank", torch.int32, (num_prompt_rows,)),
                ("prompt_top_ids", torch.int32, (num_prompt_rows, num_prompt_top)),
                ("prompt_top_logprobs", torch.float32, (num_prompt_rows, num_prompt_top)),
            ]
        offsets: dict[str, tuple[int, torch.dtype, tuple[int, ...]]] = {}
        cursor = 0
        for name, dtype, shape in fields:
            cursor = -(-cursor // _ALIGN) * _ALIGN
            offsets[name] = (cursor, dtype, shape)
            cursor += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return OutputLayout(num_reqs, num_rows, num_top, num_prompt_rows, num_prompt_top, offsets, cursor)

    def view(self, buf: torch.Tensor, name: str) -> torch.Tensor:
        start, dtype, shape = self.offsets[name]
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return buf[start : start + nbytes].view(dtype).view(shape)


class StepOutputMeta(NamedTuple):
    """Host facts needed to build a step's `ModelRunnerOutput` (captured when the step is enqueued).

    Immutable; a named tuple because one is built every step (a frozen dataclass costs microseconds)."""

    step_id: int
    req_ids: tuple[str, ...]
    logits_start: np.ndarray  # int64 [num_reqs + 1]
    num_logprobs: tuple[int | None, ...]  # per request: top-n asked for, None for no logprobs
    prompt_requests: tuple[PromptLogprobRequest, ...]
    prompt_targets: np.ndarray  # int64 [num_prompt_rows]
    seeds: Mapping[str, int]


class AsyncStepOutput:
    """One step's output: ``get()`` waits on the step's event (the one allowed wait) and decodes its slot."""

    def __init__(self, ring: "OutputSlots", slot: int, event: DeviceEvent, layout: OutputLayout, meta: StepOutputMeta):
        self._ring = ring
        self._slot = slot
        self.event = event  # recorded after the step's copy out: its work is done once this is complete
        self._layout = layout
        self._meta = meta
        self._result: ModelRunnerOutput | None = None

    @property
    def step_id(self) -> int:
        return self._meta.step_id

    def ready(self) -> bool:
        """True once the step's device work is done (never waits)."""
        return self._result is not None or self.event.query()

    def get(self) -> ModelRunnerOutput:
        if self._result is None:
            self.event.synchronize()
            self._materialise()
        return self._result

    def materialise(self) -> None:
        """Decode the slot now, waiting on the event only if the step is not done yet."""
        if self._result is None:
            if not self.event.query():
                self.event.synchronize()
            self._materialise()

    def _materialise(self) -> None:
        self._result = decode_output(self._ring.slots[self._slot], self._layout, self._meta)
        self._ring.release(self._slot, self)


class ReadyOutput:
    """The output of a step that scheduled no tokens (admissions only): complete at once.  Holds no slot."""

    def __init__(self, output: ModelRunnerOutput):
        self._output = output

    def ready(self) -> bool:
        return True

    def get(self) -> ModelRunnerOutput:
        return self._output


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    # Results usually come with exactly the rows the layout packs: slicing them again costs a torch call.
    return t if t.shape[0] == n else t[:n]


def _rows_cols(t: torch.Tensor, n: int, k: int) -> torch.Tensor:
    shape = t.shape
    return t if shape[0] == n and shape[1] == k else t[:n, :k]


def decode_output(buf: torch.Tensor, layout: OutputLayout, meta: StepOutputMeta) -> ModelRunnerOutput:
    """Build the `ModelRunnerOutput` from a completed slot (host data only)."""

    def arr(name: str) -> np.ndarray:
        return layout.view(buf, name).numpy()

    tokens = arr("tokens").tolist()
    starts = meta.logits_start
    # A bucketed step's pack covers its padded rows too: only the first num_reqs counts are the batch's.
    ends = starts[:-1] + arr("num_sampled")[: len(starts) - 1].astype(np.int64)
    # Flagged when any row the request sampled from held a non-finite value (all 1 + k rows,
    # accepted or not); a partial prefill chunk samples nothing and is never flagged.
    flagged_before = np.concatenate(([0], np.cumsum(arr("nan_flags") != 0)))
    flagged = (flagged_before[starts[1:]] > flagged_before[starts[:-1]]) & (ends > starts[:-1])
    sampled = tuple(tuple(tokens[a:b]) for a, b in zip(starts[:-1].tolist(), ends.tolist()))
    logprobs: list[tuple[TokenLogprobs, ...] | None] = [None] * len(meta.req_ids)
    if layout.num_top >= 0:
        lp, rank = arr("logprob").tolist(), arr("rank").tolist()
        top_ids, top_lp = arr("top_ids"), arr("top_logprobs")
        for i, n in enumerate(meta.num_logprobs):
            if n is None:
                continue
            logprobs[i] = tuple(
                TokenLogprobs(tokens[r], lp[r], rank[r], tuple(top_ids[r, :n].tolist()), tuple(top_lp[r, :n].tolist()))
                for r in range(int(starts[i]), int(ends[i]))
            )
    prompt_logprobs: dict[str, tuple[TokenLogprobs, ...]] = {}
    if meta.prompt_requests and layout.num_prompt_top >= 0:
        plp, prank = arr("prompt_logprob"), arr("prompt_rank")
        ptop_ids, ptop_lp = arr("prompt_top_ids"), arr("prompt_top_logprobs")
        for pr in meta.prompt_requests:
            prompt_logprobs[pr.req_id] = tuple(
                TokenLogprobs(int(meta.prompt_targets[r]), float(plp[r]), int(prank[r]),
                              tuple(int(x) for x in ptop_ids[r, : pr.num_top]), tuple(float(x) for x in ptop_lp[r, : pr.num_top]))
                for r in range(pr.offset, pr.offset + pr.count)
            )
    return ModelRunnerOutput(
        step_id=meta.step_id, req_ids=meta.req_ids, sampled_token_ids=sampled, logprobs=tuple(logprobs),
        prompt_logprobs=prompt_logprobs, nan_flags=tuple(flagged.tolist()), seeds=dict(meta.seeds),
    )


class OutputSlots:
    """Device result buffers, the pack buffer and the ring of pinned output slots.  See the module docstring."""

    def __init__(self, device: Device, *, num_slots: int, max_num_reqs: int, max_logit_rows: int, max_prompt_rows: int, max_logprobs: int):
        if num_slots < 1:
            raise ValueError(f"need at least one output slot, got {num_slots}")
        self.device = device
        self.num_sampled = device.zeros(max_num_reqs, torch.int32)
        self.row_valid = device.zeros(max_logit_rows, torch.int32)
        worst = OutputLayout.build(max_num_reqs, max_logit_rows, max_logprobs, max_prompt_rows, max_logprobs)
        self.capacity_bytes = worst.nbytes
        self.pack = device.zeros(self.capacity_bytes, torch.uint8)
        self.slots = [device.pinned(self.capacity_bytes, torch.uint8) for _ in range(num_slots)]
        self._holders: list[AsyncStepOutput | None] = [None] * num_slots
        self._d2h: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # views of slots and pack (host objects)
        # Per layout shape: the pack's field views and the num_sampled slice (host objects over `pack` and
        # `num_sampled`; an eager step would otherwise slice and view ~3 tensors per field every step).
        self._pack_views: dict[tuple[int, int, int, int, int], dict[str, torch.Tensor]] = {}
        # Per batch shape, its eager step's layout (frozen): built once per shape, not per step (`layout`).
        self._layouts: dict[tuple[int, int, int, int, int], OutputLayout] = {}
        self._next = 0
        self.num_backpressure_waits = 0

    @hot_path
    def layout(self, shape: tuple[int, int, int, int, int]) -> OutputLayout:
        """The layout of a batch of ``shape`` (`OutputLayout.build`'s arguments), built on its first step."""
        layout = self._layouts.get(shape)
        if layout is None:
            if len(self._layouts) >= 1024:
                self._layouts.clear()
            layout = self._layouts[shape] = OutputLayout.build(*shape)
        return layout

    @hot_path
    def seek_free(self, slot: int) -> bool:
        """Make ``slot`` the one the next `acquire` hands out, if no output holds it any more (its holder was
        read: nothing to wait for or to decode early).  False (nothing changed) otherwise."""
        if slot >= len(self.slots) or self._holders[slot] is not None:
            return False
        self._next = slot
        return True

    @property
    def next_slot(self) -> int:
        """The slot the next `acquire` hands out."""
        return self._next

    @hot_path
    def acquire(self) -> int:
        """The next slot, read by its previous holder first (materialised, waiting only if unfinished)."""
        slot = self._next
        self._next = (slot + 1) % len(self.slots)
        holder = self._holders[slot]
        if holder is not None:
            if not holder.ready():
                self.num_backpressure_waits += 1
            holder.materialise()
        return slot

    def release(self, slot: int, holder: AsyncStepOutput) -> None:
        if self._holders[slot] is holder:
            self._holders[slot] = None

    @hot_path
    def pack_results(self, layout: OutputLayout, results: dict) -> None:
        """Pack a step's results into ``pack`` at ``layout`` (device work: call inside enqueued work or a capture).

        A bucketed step's graph runs this as its last launch (`runnercheck.impl.graph_step`), so its output
        needs only the D2H; ``results`` then carries ``"packed": layout``.
        """
        views = self.pack_views(layout)
        out, n = results["out"], layout.num_rows
        views["tokens"].copy_(_rows(out.tokens, n))
        views["num_sampled"].copy_(views["num_sampled_src"])
        views["nan_flags"].copy_(_rows(out.nan_flags, n))
        if layout.num_top >= 0:
            k = layout.num_top
            views["logprob"].copy_(_rows(out.logprob, n))
            views["rank"].copy_(_rows(out.rank, n))
            views["top_ids"].copy_(_rows_cols(out.top_ids, n, k))
            views["top_logprobs"].copy_(_rows_cols(out.top_logprobs, n, k))
        if layout.num_prompt_rows > 0 and layout.num_prompt_top >= 0:
            p, k = results["prompt"], layout.num_prompt_top
            n = layout.num_prompt_rows
            views["prompt_logprob"].copy_(_rows(p.logprob, n))
            views["prompt_rank"].copy_(_rows(p.rank, n))
            views["prompt_top_ids"].copy_(_rows_cols(p.top_ids, n, k))
            views["prompt_top_logprobs"].copy_(_rows_cols(p.top_logprobs, n, k))

    def pack_views(self, layout: OutputLayout) -> dict[str, torch.Tensor]:
        """Views of ``pack`` for each field of ``layout`` (plus ``"num_sampled_src"``), made once per layout shape.

        Keyed by the five ints `OutputLayout.build` makes a layout from, so two equal layouts share views
        and a layout of another shape never gets this one's."""
        shape = (layout.num_reqs, layout.num_rows, layout.num_top, layout.num_prompt_rows, layout.num_prompt_top)
        views = self._pack_views.get(shape)
        if views is None:
            if len(self._pack_views) >= 1024:  # eager steps of many shapes: keep the cache bounded
                self._pack_views.clear()
            views = {name: layout.view(self.pack, name) for name in layout.offsets}
            views["num_sampled_src"] = self.num_sampled[: layout.num_reqs]
            self._pack_views[shape] = views
        return views

    def _d2h_views(self, slot: int, nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(slot[:nbytes], pack[:nbytes])``, made once per (slot, size): slicing a device tensor costs host time."""
        views = self._d2h.get((slot, nbytes))
        if views is None:
            if len(self._d2h) >= 4096:  # eager steps of many shapes: keep the cache bounded
                self._d2h.clear()
            views = self._d2h[(slot, nbytes)] = (self.slots[slot][:nbytes], self.pack[:nbytes])
        return views

    @hot_path
    def enqueue_copy_out(self, slot: int, layout: OutputLayout, results: dict, meta: StepOutputMeta) -> AsyncStepOutput:
        """Pack the step's results and copy them into ``slot`` (one D2H), record the event; returns the step's output.

        ``results`` is filled by earlier closures of the same step (``"out"``: the sampler output,
        ``"prompt"``: prompt logprobs); on sim they run later than this call, so it is read only
        when the pack closure runs.  ``results["packed"] is layout``: the step packed itself.
        ``results["copied_out"]``: it copied the pack into ``slot`` too (a fused steady step, `runnercheck.impl.lanes`):
        only the event is recorded here.
        """
        if not results.get("copied_out"):
            host, pack = self._d2h_views(slot, layout.nbytes)
            if results.get("packed") is layout:
                def copy_out() -> None:
                    host.copy_(pack, non_blocking=True)
            else:
                def copy_out() -> None:
                    self.pack_results(layout, results)
                    host.copy_(pack, non_blocking=True)

            self.device.enqueue(copy_out, f"d2h output slot{slot} step{meta.step_id}")
        # The step's output over ``slot``, complete at the event recorded now (after its copy).
        result = AsyncStepOutput(self, slot, self.device.record_event(), layout, meta)
        self._holders[slot] = result
        return result
