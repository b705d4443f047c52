"""An admission's staging into the owners besides the request-state table: the block table and the sampling state.

`runnercheck.impl.state.RequestStateTable.admit_staged` stages a new request's row state, its block list
(`runnercheck.impl.block_table.BlockTable.assign`) and its sampling record
(`runnercheck.impl.sample.state.SamplingState.add_request`) in one C call (``admit_staged`` in impl/native/rows.c)
when the C module is built.  That call writes into those owners' pending diffs and deferred records as their own
methods do; `AdmissionWriters` is the one place that hands them over, made once by the runner.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from runnercheck.impl import native
from runnercheck.impl.interface import SAMPLING_FIELDS
from runnercheck.impl.staged_writes import StagedWriteTensor

if TYPE_CHECKING:
    from runnercheck.impl.block_table import BlockTable
    from runnercheck.impl.sample.state import SamplingState

_rows = native.load("rows")  # the C module whose ``admit_staged`` reads the writers (None: Python only)
_seeds = native.load("seeds")  # `derived_seed`, read by `admit_staged`'s C twin (`AdmissionWriters.derive`)
# The sampling fields as `admit_staged`'s C twin reads them (the interface's table, handed over in the writers once):
# (name, read as an exact int -- else `float(x)`), in `SamplingState.add_request`'s order.
ADMISSION_FIELDS: tuple[tuple[str, bool], ...] = tuple((sys.intern(f.name), f.is_int) for f in SAMPLING_FIELDS)


class RowStateOwner(Protocol):
    """What `AdmissionWriters.of` reads of the request-state table (a protocol: the table's module refers to this
    one, so this one does not import it)."""

    row_state: StagedWriteTensor


@dataclass(frozen=True)
class AdmissionWriters:
    """The other owners an admission stages into (`RequestStateTable.admit_staged`), made once by the runner: the
    block table and the sampling state (in the table's staged-write group, its admissions deferred as records), and
    ``targets``/``derive`` as the C twin reads them (``derive`` None: no C twin, the owners' methods alone).

    Owns no tensor: every tensor, pending-diff list and record list it holds belongs to the table, the block table,
    the sampling state or their staged-write group, which stay their owners and their only writers (the C twin
    writes them as their own methods do)."""

    block_table: BlockTable
    sampling_state: SamplingState
    targets: tuple
    derive: Callable[[int, str], int] | None

    @staticmethod
    def of(state: RowStateOwner, block_table: BlockTable, sampling_state: SamplingState) -> "AdmissionWriters":
        group = state.row_state.group
        records = sampling_state.admission_records
        # The C twin stages into the group's one dirty list and its deferred records: all three in one group.
        shared = records is not None and block_table.table.group is group and sampling_state.temperature.group is group
        derive = None if _rows is None or _seeds is None or not shared else _seeds.derived_seed
        lists = tuple((t, t._pending, t._ragged, t.num_rows, t.num_cols) for t in (state.row_state, block_table.table))
        return AdmissionWriters(block_table, sampling_state, (*lists, group._dirty, sampling_state, records, ADMISSION_FIELDS),
                                derive)
