"""Counts the staged-write patterns a runner's steps use (a coverage observer, `runnercheck.stress.run.coverage`).

Every `runnercheck.impl.staged_writes.StagedWriteTensor` reachable from the runner (two attribute levels
deep: row state, block table, sampling parameters) is found; the ``flush`` of each group they
belong to (the runner's one shared `StagedWriteGroup`, which packs all members at once) is wrapped
on the instance, and before the real flush packs the pending diffs (per-item and ragged) the wrapper
classifies each member's (host data only, no device read):

* a single cell, a run of several cells;
* several rows in one flush;
* several diffs to one row in one step;
* one cell written more than once in a step (the apply must keep the last write);
* a row released and admitted into again in the same step (a request finished or preempted and
  another given its row, with the new request's diffs pending in the flush that follows the
  release): counted when the runner's row table (``runner.state.release``) can be watched.  Our
  runner stages nothing at a release, so this is where a runner that does (a row cleared or
  poisoned at release) would write the row's cells twice in one step, and where the staged
  writes' "later write wins" would be what keeps the admission's values.

Ownership: a `StagedWriteObserver` owns its counters (host, one run); the wrappers it installs
live as long as the runner.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

STAGED_FEATURES: tuple[str, ...] = (
    "staged write: single cell", "staged write: run of cells", "staged write: several rows in one flush",
    "staged write: several diffs to one row", "staged write: one cell written twice in a step",
)
# Patterns impl's host code does not produce today (it stages each row once per step): counted and
# shown, but a campaign cannot be failed for a pattern the runner never issues.
UNGATED_STAGED_FEATURES = STAGED_FEATURES[3:]
# Counted (and gated) only for a runner whose row releases can be watched (``runner.state.release``).
READMIT_FEATURE = "staged write: a row released and re-admitted in one step"


def _staged_tensors(runner: Any) -> list[Any]:
    found: dict[int, Any] = {}
    frontier = [runner]
    for _ in range(3):
        nxt = []
        for obj in frontier:
            for value in list(getattr(obj, "__dict__", {}).values()):
                if type(value).__name__ == "StagedWriteTensor" and hasattr(value, "_pending"):
                    found[id(value)] = value
                elif hasattr(value, "__dict__") and type(value).__module__.startswith("runnercheck.impl"):
                    nxt.append(value)
        frontier = nxt
    return list(found.values())


def _pending_diffs(tensor: Any) -> list[tuple[int, int, Any]]:
    """A tensor's pending diffs as (row, start, values): per-item ones, then ragged ones (values as a range)."""
    diffs = list(tensor._pending)
    for rows, starts, lens, _values in getattr(tensor, "_ragged", ()):
        diffs += [(int(r), int(c), range(int(n))) for r, c, n in zip(rows, starts, lens)]
    return diffs


class StagedWriteObserver:
    def __init__(self, runner: Any):
        self.counts: Counter[str] = Counter()
        self.tensors = _staged_tensors(runner)
        # Rows released since the last flush (`_watch_releases`); None: the runner's releases cannot be watched.
        self._released: set[int] | None = None
        groups = {id(t.group): t.group for t in self.tensors if getattr(t, "group", None) is not None}
        for group in groups.values():
            self._wrap_group(group)
        for tensor in self.tensors:
            if getattr(tensor, "group", None) is None:
                self._wrap(tensor)
        if self.tensors:
            self._watch_releases(getattr(runner, "state", None))

    def _watch_releases(self, state: Any) -> None:
        """Wrap ``state.release`` (on the instance: it returns the freed row) to note the rows a step frees."""
        release = getattr(state, "release", None)
        if not callable(release):
            return
        released: set[int] = set()
        self._released = released

        def release_noting_row(req_id: str) -> Any:
            row = release(req_id)
            if isinstance(row, int):
                released.add(row)
            return row

        state.release = release_noting_row

    @property
    def active(self) -> bool:
        return bool(self.tensors)

    def _wrap_group(self, group: Any) -> None:
        """The runner flushes its shared group (one pack for all members), not each tensor."""
        original = group.flush
        observer = self

        def flush(writer: Any) -> None:
            written: set[int] = set()
            for tensor in list(group._dirty):
                diffs = _pending_diffs(tensor)
                observer.classify(diffs)
                written.update(row for row, _, _ in diffs)
            observer.note_flush(written)
            return original(writer)

        group.flush = flush

    def _wrap(self, tensor: Any) -> None:
        original = tensor.flush
        observer = self

        def flush(writer: Any) -> None:
            diffs = _pending_diffs(tensor)
            observer.classify(diffs)
            observer.note_flush({row for row, _, _ in diffs})
            return original(writer)

        tensor.flush = flush

    def note_flush(self, written_rows: set[int]) -> None:
        """One step's flush: the rows it writes that a release of the same step freed were re-admitted."""
        if self._released is None:
            return
        self.counts[READMIT_FEATURE] += len(self._released & written_rows)
        self._released.clear()

    def classify(self, pending: list[tuple[int, int, list]]) -> None:
        c = self.counts
        rows: dict[int, list[tuple[int, int]]] = {}
        for row, start, values in pending:
            c["staged write: single cell" if len(values) == 1 else "staged write: run of cells"] += 1
            rows.setdefault(row, []).append((start, len(values)))
        if len(rows) > 1:
            c["staged write: several rows in one flush"] += 1
        for spans in rows.values():
            if len(spans) > 1:
                c["staged write: several diffs to one row"] += 1
                cells = [col for start, n in spans for col in range(start, start + n)]
                if len(cells) != len(set(cells)):
                    c["staged write: one cell written twice in a step"] += 1

    def totals(self) -> dict[str, int]:
        watched = (READMIT_FEATURE,) if self._released is not None else ()
        return {f: int(self.counts.get(f, 0)) for f in STAGED_FEATURES + watched}


__all__ = ["StagedWriteObserver", "STAGED_FEATURES", "UNGATED_STAGED_FEATURES", "READMIT_FEATURE"]
